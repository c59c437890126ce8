//! The daemon: handshake, `ready`, then the loop that spins on the SQ,
//! sleeps when it is idle, and turns each drain into launches and
//! completions. Exits cleanly when stdin or the socket closes.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::backend::{self, Backend, Launch};
use crate::cli::DaemonOpts;
use crate::coalesce::{self, Coalescer};
use crate::descriptor::validate;
use crate::error::{Error, Result};
use crate::handshake::{self, peer_closed};
use crate::layout::{Cqe, Sqe, Stats, Status};
use crate::ring::Ring;

/// How often a busy daemon (one that never sleeps) still looks at stdin and
/// the socket, so that it notices the VM going away.
const QUIT_CHECK_EVERY: Duration = Duration::from_millis(10);

/// Why the loop stopped without an error.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// Something may be in the SQ (or the poll timed out): look again.
    Look,
    /// stdin reached EOF or the VM hung up: exit 0.
    Quit,
}

/// Runs the daemon until the VM goes away (Ok) or something fails (Err).
pub fn run(opts: &DaemonOpts) -> Result<()> {
    let session = handshake::handshake(&opts.socket, opts.device)?;
    let backend = backend::open(opts.backend, opts.device)?;
    let name = backend.name().replace(['\n', '\r'], " ");
    announce(&format!("ready {} {name}", backend.kind()))?;
    eprintln!(
        "gpud[{}]: ready: backend {} ({name}), sq {} cq {} entries, arena {} bytes",
        opts.device,
        backend.kind(),
        session.geometry.sq_entries,
        session.geometry.cq_entries,
        session.geometry.arena_bytes
    );
    let ring = Ring::new(session.mapping, session.geometry, session.sq_efd, session.cq_efd);
    let mut d = Daemon {
        device: opts.device,
        spin: Duration::from_micros(opts.spin_us),
        ring,
        sock: session.sock,
        backend,
        sqes: Vec::new(),
        coalescer: Coalescer::new(),
        status: Vec::new(),
    };
    d.main_loop()
}

/// Prints one protocol line on stdout and flushes it: the VM reads stdout
/// line by line, and nothing else ever goes there.
pub fn announce(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .map_err(|e| Error::Sys {
            what: "write stdout",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })
}

struct Daemon {
    device: u32,
    spin: Duration,
    ring: Ring,
    sock: OwnedFd,
    backend: Box<dyn Backend>,
    sqes: Vec<Sqe>,
    coalescer: Coalescer,
    status: Vec<Status>,
}

impl Daemon {
    fn main_loop(&mut self) -> Result<()> {
        let mut last_check = Instant::now();
        loop {
            if !self.ring.sq_nonempty() && !self.spin_for_work() {
                if self.ring.arm_sq_wakeup() {
                    self.ring.stats().sleeps.fetch_add(1, Ordering::Relaxed);
                    let w = self.wait(PollTimeout::NONE);
                    self.ring.disarm_sq_wakeup();
                    if w == Wake::Quit {
                        return Ok(());
                    }
                    last_check = Instant::now();
                }
                continue;
            }
            if !self.process_drain()? {
                return Ok(());
            }
            if last_check.elapsed() >= QUIT_CHECK_EVERY {
                if self.wait(PollTimeout::ZERO) == Wake::Quit {
                    return Ok(());
                }
                last_check = Instant::now();
            }
        }
    }

    /// Polls the SQ tail for up to `spin`. True when work showed up.
    fn spin_for_work(&self) -> bool {
        if self.spin.is_zero() {
            return false;
        }
        let start = Instant::now();
        loop {
            // Reading the clock costs more than a load; look at it rarely.
            for _ in 0..64 {
                if self.ring.sq_nonempty() {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= self.spin {
                return false;
            }
        }
    }

    /// Blocks (or just looks, with a zero timeout) on the SQ eventfd, stdin
    /// and the socket.
    fn wait(&self, timeout: PollTimeout) -> Wake {
        let stdin = std::io::stdin();
        let mut fds = [
            PollFd::new(self.ring.sq_eventfd().as_fd(), PollFlags::POLLIN),
            PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.sock.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            // A signal: the caller looks at the ring again and comes back.
            Err(nix::errno::Errno::EINTR) => return Wake::Look,
            Err(e) => {
                eprintln!("gpud[{}]: poll: {}; exiting", self.device, e.desc());
                return Wake::Quit;
            }
        }
        let rev = |i: usize| fds[i].revents().unwrap_or(PollFlags::empty());
        let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
        let (efd, input, sock) = (rev(0), rev(1), rev(2));
        if input.contains(PollFlags::POLLIN) {
            // The VM never writes to stdin; anything there is read and
            // dropped. Only EOF matters.
            let mut buf = [0u8; 256];
            match nix::unistd::read(stdin.as_fd(), &mut buf) {
                Ok(0) => return self.quit("stdin closed"),
                Ok(_) | Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
                Err(_) => return self.quit("stdin failed"),
            }
        } else if input.intersects(gone) {
            return self.quit("stdin closed");
        }
        if sock.intersects(gone) || (sock.contains(PollFlags::POLLIN) && peer_closed(&self.sock)) {
            return self.quit("the VM closed the socket");
        }
        if efd.contains(PollFlags::POLLIN) {
            self.ring.drain_sq_eventfd();
        }
        Wake::Look
    }

    fn quit(&self, why: &str) -> Wake {
        eprintln!("gpud[{}]: {why}; exiting", self.device);
        Wake::Quit
    }

    /// One drain: copy, validate, coalesce, launch, complete. Ok(false) when
    /// the VM went away while gpud waited for CQ room.
    fn process_drain(&mut self) -> Result<bool> {
        self.sqes.clear();
        let drain = self.ring.drain_sq(&mut self.sqes);
        if let Some(pending) = drain.overrun {
            self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "gpud[{}]: SQ tail is {pending} entries ahead of head (ring of {}): \
                 corrupt; answered {} and skipped the rest",
                self.device,
                self.ring.geometry().sq_entries,
                drain.taken
            );
        }
        if self.sqes.is_empty() {
            return Ok(true);
        }
        record_batch(self.ring.stats(), self.sqes.len() as u64);

        // Validate everything first; refusals are answered at once.
        self.coalescer.clear();
        let arena_bytes = self.ring.geometry().arena_bytes;
        let sqes = std::mem::take(&mut self.sqes);
        for sqe in &sqes {
            match validate(sqe, arena_bytes) {
                Ok(job) => self.coalescer.push(job),
                Err(status) => {
                    self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
                    if !self.complete(sqe.user_data, status, 1) {
                        return Ok(false);
                    }
                }
            }
        }
        self.sqes = sqes;
        self.ring.cq_publish();

        // One launch per kernel.
        let coalescer = std::mem::take(&mut self.coalescer);
        let result = self.launch_all(&coalescer);
        self.coalescer = coalescer;
        result
    }

    fn launch_all(&mut self, coalescer: &Coalescer) -> Result<bool> {
        let mut fatal = None;
        for (kernel, jobs) in coalescer.groups() {
            let batch = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
            self.status.clear();
            self.status.resize(jobs.len(), Status::Ok);
            if fatal.is_none() {
                self.ring.stats().launches.fetch_add(1, Ordering::Relaxed);
                let launch = Launch {
                    kernel,
                    jobs,
                    independent: coalesce::independent(jobs),
                };
                let arena = self.ring.arena();
                if let Err(e) = self.backend.launch(&arena, &launch, &mut self.status) {
                    eprintln!("gpud[{}]: {kernel:?} launch failed: {e}", self.device);
                    fatal = Some(e);
                }
            }
            if fatal.is_some() {
                // Everything still held is answered before gpud exits, so
                // the VM hears about each job even on the way down.
                self.status.fill(Status::DeviceError);
            }
            for (job, i) in jobs.iter().zip(0..) {
                if !self.complete(job.user_data(), self.status[i], batch) {
                    return Ok(false);
                }
            }
            self.ring.cq_publish();
        }
        match fatal {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }

    /// Writes one completion (waiting for room if the VM broke its promise
    /// of never letting the CQ fill). False when the VM went away meanwhile.
    fn complete(&mut self, user_data: u64, status: Status, batch: u32) -> bool {
        let device = self.device;
        let sock = &self.sock;
        let mut warned = false;
        let room = self.ring.cq_wait_for_room(|| {
            if !warned {
                eprintln!("gpud[{device}]: CQ full; waiting for the VM");
                warned = true;
            }
            !stdin_or_socket_closed(sock)
        });
        if !room {
            eprintln!("gpud[{device}]: the VM went away while the CQ was full; exiting");
            return false;
        }
        self.ring.cq_write(Cqe {
            user_data,
            status: status.code(),
            batch,
        });
        let stats = self.ring.stats();
        if status == Status::Ok {
            stats.jobs_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.jobs_failed.fetch_add(1, Ordering::Relaxed);
        }
        true
    }
}

/// Non-blocking look at stdin and the socket, for the CQ-full wait.
fn stdin_or_socket_closed(sock: &OwnedFd) -> bool {
    let stdin = std::io::stdin();
    let mut fds = [
        PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
        PollFd::new(sock.as_fd(), PollFlags::POLLIN),
    ];
    if poll(&mut fds, PollTimeout::ZERO).is_err() {
        return false;
    }
    let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
    let input = fds[0].revents().unwrap_or(PollFlags::empty());
    let s = fds[1].revents().unwrap_or(PollFlags::empty());
    if input.contains(PollFlags::POLLIN) {
        let mut buf = [0u8; 256];
        if matches!(nix::unistd::read(stdin.as_fd(), &mut buf), Ok(0)) {
            return true;
        }
    } else if input.intersects(gone) {
        return true;
    }
    s.intersects(gone) || (s.contains(PollFlags::POLLIN) && peer_closed(sock))
}

/// Stats for one non-empty drain of `size` entries. gpud is the only
/// writer, so a relaxed load-then-store max is exact.
fn record_batch(stats: &Stats, size: u64) {
    stats.batches.fetch_add(1, Ordering::Relaxed);
    if size > stats.max_batch.load(Ordering::Relaxed) {
        stats.max_batch.store(size, Ordering::Relaxed);
    }
    stats.batch_hist[coalesce::hist_bucket(size)].fetch_add(1, Ordering::Relaxed);
}
