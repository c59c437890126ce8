//! The daemon: handshake, `ready`, then the loop that spins on the SQ,
//! sleeps when it is idle, and turns each drain into launches and
//! completions. Exits cleanly when stdin or the socket closes.
//!
//! Pipelining: a drain's launches are only *submitted* to the backend; their
//! completions are written when the backend reports them done (for CUDA:
//! when the launch's event has fired), in whatever order that happens. While
//! launches run, gpud drains, validates and submits the next batch, up to
//! [`MAX_DRAINS_IN_FLIGHT`] drains at a time: one running and one queued
//! behind it on the GPU, with the SQ filling up meanwhile so that the next
//! drain coalesces more. With work in flight gpud never blocks on the SQ
//! eventfd alone: it polls the backend and the SQ together, spinning first
//! and then napping in bounded, growing steps (20 µs .. 1 ms).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::poll::{poll, ppoll, PollFd, PollFlags, PollTimeout};
use nix::sys::time::TimeSpec;

use crate::backend::{self, Backend, Launch, Ticket};
use crate::cli::DaemonOpts;
use crate::coalesce::{self, Coalescer};
use crate::buffers::{self, Buffers};
use crate::descriptor::{names_unknown_segment, validate_bufs, BufferTable, Job, KernelRef, Region};
use crate::error::{Error, Result};
use crate::handshake::{self, peer_closed};
use crate::layout::{
    Cqe, ElemType, LaunchOpts, Sqe, Stats, Status, EC_ADDR_SEGMENT_SHIFT, EC_CONTROL_FREE, EC_CONTROL_GET,
    EC_CONTROL_LOAD_MODULE, EC_CONTROL_PUT, EC_CONTROL_UNLOAD_MODULE, EC_FLAG_IN0_BUF, EC_FLAG_OPTS, EC_FLAG_OUT_BUF,
    EC_FREE_MAX_IDS, EC_MAX_SEGMENTS,
};
use crate::modules::Registry;
use crate::ops::user::UserOp;
use crate::ring::Ring;
use crate::segment::{Segments, SockState};
use crate::startup::Phases;

/// How often a busy daemon (one that never sleeps) still looks at stdin and
/// the socket, so that it notices the VM going away.
const QUIT_CHECK_EVERY: Duration = Duration::from_millis(10);

/// How long the segment messages announced in the hello may take to come.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long gpud's start waits for the hello's segments before the driver
/// starts (the VM sends them right behind the hello; any later is
/// registered after the driver's start, only without populated page tables).
const EARLY_SEGMENTS_WAIT: Duration = Duration::from_millis(20);

/// Drains whose launches may be on the backend at once. Two keeps the GPU
/// fed (the next batch is queued behind the running one) without splitting
/// the SQ into many small launches while the GPU is busy anyway.
pub const MAX_DRAINS_IN_FLIGHT: usize = 2;

/// Bounded naps while launches are in flight and nothing else happens. A
/// finished launch is seen at the end of the nap it finished in, so the
/// longest nap is the worst delay added to a long job: with 1 ms, matmul
/// 4096^3 on device buffers took 3.97 ms end to end on the H200 against
/// 3.14 ms for the kernel alone (8192^3: 25.6 against 24.5 ms), about the
/// average overshoot of the 1 ms naps. 50 us costs ~20k wake-ups a second,
/// only while long launches are in flight.
const NAP_MIN: Duration = Duration::from_micros(20);
const NAP_MAX: Duration = Duration::from_micros(50);
/// While launches are in flight gpud spins at least this long before its
/// first nap: a job of a few hundred microseconds (vector_add of 2^26
/// elements between device buffers: ~0.2 ms) is then seen finished at
/// once instead of at the end of a nap.
const BUSY_SPIN: Duration = Duration::from_micros(500);

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Why the loop stopped without an error.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// Something may be in the SQ or done on the backend (or the poll
    /// timed out): look again.
    Look,
    /// stdin reached EOF or the VM hung up: exit 0.
    Quit,
}

/// Runs the daemon until the VM goes away (Ok) or something fails (Err).
pub fn run(opts: &DaemonOpts) -> Result<()> {
    // The startup profile: each mark ends a phase (crate::startup).
    let mut phases = Phases::default();
    phases.mark("args");
    let session = handshake::handshake(&opts.socket, opts.device)?;
    phases.mark("handshake");
    let ring = Ring::new(session.mapping, session.geometry, session.sq_efd, session.cq_efd);
    let (seg0, seg0_bytes) = ring.arena().segment(0).expect("segment 0");
    // SAFETY: segment 0 lies in the ring's mapping, which the daemon owns
    // and drops after `segments` (field order below; a start that fails
    // drops `segments` first, the local declared later).
    let mut segments = unsafe { Segments::new(seg0, seg0_bytes) };
    // The segments the hello announced come right behind it: mapped now,
    // and every segment's page tables populated while the driver starts.
    segments.map_queued(&session.sock, opts.device, session.hello.segments, EARLY_SEGMENTS_WAIT);
    let mut backend = backend::open(opts.backend, opts.device)?;
    phases.mark_split("backend", &backend.startup_phases());
    // Waiting for the page tables counts in `segments`.
    segments.register_start(&mut *backend, opts.device)?;
    let name = backend.name().replace(['\n', '\r'], " ");
    let kind = backend.kind();
    let geo = ring.geometry().clone();
    let mut d = Daemon::new(
        opts.device,
        Duration::from_micros(opts.spin_us),
        backend,
        segments,
        ring,
        session.sock,
    );
    d.set_memory_limit(opts.memory_limit);
    // Every segment the hello announced, before ready: jobs queued while
    // gpud was down may name any of them, and the first drain may come
    // before the last segment message would otherwise have been read.
    if d.await_segments(session.hello.segments)? == Wake::Quit {
        return Ok(());
    }
    // Every segment is registered by now (CUDA: cuMemHostRegister of pages
    // gpud populated while the driver started, so this is pinning resident
    // pages, not faulting them in).
    phases.mark("segments");
    // The modules the VM had loaded (a restart brings them back before any
    // job queued for them is drained). One that fails is left out, said
    // here: its jobs are then refused as BAD_KERNEL.
    for (slot, dir) in &opts.modules {
        if let Err(e) = d.modules.load(*slot, dir, &mut *d.backend) {
            log!(Error, "gpud[{}]: module in slot {slot} ({}): {e}", opts.device, dir.display());
        }
    }
    phases.mark("modules");
    announce(&phases.protocol_line())?;
    announce(&format!("ready {kind} {name}"))?;
    log!(
        Info,
        "gpud[{}]: ready: backend {kind} ({name}), sq {} cq {} entries, arena {} bytes, buffers up to {} bytes; \
         started in {}",
        opts.device, geo.sq_entries, geo.cq_entries, geo.arena_bytes, d.buffers.limit(), phases.summary()
    );
    d.main_loop()
}

/// Prints one protocol line on stdout and flushes it: the VM reads stdout
/// line by line, and nothing else ever goes there. The VM reads stderr
/// through the same pipe: the line goes out in one write, as `log` requires.
pub fn announce(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{line}\n").as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| Error::Sys {
            what: "write stdout",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })
}

/// A launch the backend holds: its jobs are answered when it is done.
struct InFlight {
    ticket: Ticket,
    kernel: KernelRef,
    jobs: Vec<Job>,
    drain: u64,
    /// When its drain began, and when the backend took it (the stats'
    /// launch_* timings).
    drained: Instant,
    submitted: Instant,
}

/// The daemon's state once the handshake is done. Public so that tests and
/// the fuzz targets (`gpud/fuzz`) can drive the real ring path (drain,
/// validate, coalesce, submit, answer) over a ring in ordinary memory; the
/// binary only ever goes through [`run`].
// Field order is drop order: the backend (CUDA: host registrations) goes
// before the segment mappings, and those before the ring's mapping.
pub struct Daemon {
    device: u32,
    spin: Duration,
    backend: Box<dyn Backend>,
    segments: Segments,
    ring: Ring,
    sock: OwnedFd,
    sqes: Vec<Sqe>,
    coalescer: Coalescer,
    /// Users' modules, loaded by control descriptors (and `--module`).
    modules: Registry,
    in_flight: Vec<InFlight>,
    /// Tickets the backend reported done and gpud has not answered yet.
    done: Vec<Ticket>,
    next_drain: u64,
    /// When the drain being processed began (InFlight::drained).
    drain_started: Instant,
    /// Device buffers (ids the VM assigned -> blocks of the backend's).
    buffers: Buffers,
}

/// Validation's view of the buffers: lookups, and new output buffers from
/// the backend's memory.
struct Table<'a> {
    bufs: &'a mut Buffers,
    mem: &'a mut dyn buffers::BufferMemory,
}

impl BufferTable for Table<'_> {
    fn lookup(&self, id: u64, ty: ElemType, len: u32) -> std::result::Result<Region, Status> {
        self.bufs.lookup(id, ty, len)
    }
    fn create(&mut self, id: u64, ty: ElemType, len: u32) -> std::result::Result<Region, Status> {
        self.bufs.create(self.mem, id, ty, len)
    }
}

impl Daemon {
    /// Ties the parts together. `segments` must describe `ring`'s arena as
    /// segment 0 (and `backend` must have been given it); `sock` is the
    /// handshake connection, read for segment messages.
    pub fn new(
        device: u32,
        spin: Duration,
        backend: Box<dyn Backend>,
        segments: Segments,
        ring: Ring,
        sock: OwnedFd,
    ) -> Daemon {
        let mut backend = backend;
        let limit = buffers::limit_for(backend.buffer_memory().buf_capacity(), crate::cli::MemoryLimit::Default);
        Daemon {
            device,
            spin,
            backend,
            segments,
            ring,
            sock,
            sqes: Vec::new(),
            coalescer: Coalescer::new(),
            modules: Registry::default(),
            in_flight: Vec::new(),
            done: Vec::new(),
            next_drain: 0,
            drain_started: Instant::now(),
            buffers: Buffers::new(limit),
        }
    }

    /// Sets the buffers' memory limit (`--memory-limit`, `--memory-fraction`).
    pub fn set_memory_limit(&mut self, limit: crate::cli::MemoryLimit) {
        let cap = self.backend.buffer_memory().buf_capacity();
        let mut b = Buffers::new(buffers::limit_for(cap, limit));
        std::mem::swap(&mut self.buffers, &mut b);
        b.clear(self.backend.buffer_memory());
        self.buffers.publish(self.ring.stats());
    }

    /// Live device buffers and the bytes they hold (tests).
    pub fn buffer_use(&self) -> (usize, u64) {
        (self.buffers.count(), self.buffers.used())
    }

    /// Freed buffers' blocks become reusable once no launch that may read
    /// them is in flight: one of a drain up to the free's, or the drain the
    /// free came in, not submitted yet.
    fn release_buffers(&mut self) {
        let next = self.next_drain;
        let oldest = self.in_flight.iter().map(|f| f.drain).min();
        self.buffers.release(|d| d >= next || oldest.is_some_and(|o| o <= d));
        self.buffers.publish(self.ring.stats());
    }

    /// While busy, gpud never blocks, so stdin EOF and socket hang-up are
    /// polled every QUIT_CHECK_EVERY instead. True when gpud must exit.
    fn quit_due(&mut self, last_check: &mut Instant) -> Result<bool> {
        if last_check.elapsed() < QUIT_CHECK_EVERY {
            return Ok(false);
        }
        *last_check = Instant::now();
        Ok(self.wait(Some(Duration::ZERO))? == Wake::Quit)
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The arena segments mapped so far and their sizes.
    pub fn segment_sizes(&self) -> &crate::descriptor::SegmentSizes {
        self.segments.sizes()
    }

    /// Launches submitted to the backend and not answered yet.
    pub fn launches_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn main_loop(&mut self) -> Result<()> {
        let mut last_check = Instant::now();
        loop {
            if !self.reap()? {
                return Ok(());
            }
            let can_drain = self.drains_in_flight() < MAX_DRAINS_IN_FLIGHT;
            if can_drain && self.ring.sq_nonempty() {
                let t = Instant::now();
                let more = self.process_drain()?;
                self.count_work(t);
                if !more || self.quit_due(&mut last_check)? {
                    return Ok(());
                }
                continue;
            }
            if !self.in_flight.is_empty() {
                if self.wait_busy(can_drain)? == Wake::Quit || self.quit_due(&mut last_check)? {
                    return Ok(());
                }
                continue;
            }
            // Idle: nothing in flight, nothing in the SQ.
            if !self.spin_for_work() && self.ring.arm_sq_wakeup() {
                self.ring.stats().sleeps.fetch_add(1, Ordering::Relaxed);
                let w = self.wait(None);
                self.ring.disarm_sq_wakeup();
                if w? == Wake::Quit {
                    return Ok(());
                }
                last_check = Instant::now();
            }
        }
    }

    fn drains_in_flight(&self) -> usize {
        // At most a handful of launches: a quadratic count is cheapest.
        let f = &self.in_flight;
        (0..f.len())
            .filter(|&i| f[..i].iter().all(|x| x.drain != f[i].drain))
            .count()
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

    /// Launches are in flight: waits until one finishes, or (when another
    /// drain may start) the SQ has work, or the VM goes away. Spins for
    /// `spin`, then naps in bounded steps; never blocks for long.
    fn wait_busy(&mut self, can_drain: bool) -> Result<Wake> {
        let start = Instant::now();
        loop {
            if self.poll_backend()? {
                return Ok(Wake::Look);
            }
            for _ in 0..32 {
                if can_drain && self.ring.sq_nonempty() {
                    return Ok(Wake::Look);
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= self.spin.max(BUSY_SPIN) {
                break;
            }
        }
        let mut nap = NAP_MIN;
        loop {
            // Ask the VM for a wake-up so that new work cuts the nap short.
            if can_drain && !self.ring.arm_sq_wakeup() {
                return Ok(Wake::Look);
            }
            let w = self.wait(Some(nap));
            if can_drain {
                self.ring.disarm_sq_wakeup();
            }
            if w? == Wake::Quit {
                return Ok(Wake::Quit);
            }
            if self.poll_backend()? || (can_drain && self.ring.sq_nonempty()) {
                return Ok(Wake::Look);
            }
            nap = (nap * 2).min(NAP_MAX);
        }
    }

    /// Collects finished tickets into `self.done`. True when there are some.
    /// On a backend failure answers everything in flight first.
    fn poll_backend(&mut self) -> Result<bool> {
        if let Err(e) = self.backend.poll(&mut self.done) {
            log!(Error, "gpud[{}]: device failed: {e}", self.device);
            self.fail_all();
            return Err(e);
        }
        Ok(!self.done.is_empty())
    }

    /// Answers every launch the backend has finished. Ok(false) when the VM
    /// went away while gpud waited for CQ room.
    pub fn reap(&mut self) -> Result<bool> {
        if self.in_flight.is_empty() {
            return Ok(true);
        }
        self.poll_backend()?;
        if self.done.is_empty() {
            return Ok(true);
        }
        let started = Instant::now();
        let done = std::mem::take(&mut self.done);
        for t in &done {
            let Some(i) = self.in_flight.iter().position(|f| f.ticket == *t) else {
                log!(Error, "gpud[{}]: backend reported unknown ticket {t}", self.device);
                continue;
            };
            let f = self.in_flight.swap_remove(i);
            if !self.answer(&f.jobs, Status::Ok) {
                return Ok(false);
            }
            self.ring.cq_publish();
            let s = self.ring.stats();
            s.launches_timed.fetch_add(1, Ordering::Relaxed);
            s.launch_drain_ns.fetch_add(nanos(f.submitted - f.drained), Ordering::Relaxed);
            s.launch_run_ns.fetch_add(nanos(started.saturating_duration_since(f.submitted)), Ordering::Relaxed);
            s.launch_answer_ns.fetch_add(nanos(started.elapsed()), Ordering::Relaxed);
        }
        self.done = done;
        self.done.clear();
        self.release_buffers();
        self.count_work(started);
        Ok(true)
    }

    /// Adds the time since `t` to the `work_ns` statistic.
    fn count_work(&self, t: Instant) {
        self.ring.stats().work_ns.fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
    }

    /// Writes one completion per job with `status`; batch = the launch size.
    fn answer(&mut self, jobs: &[Job], status: Status) -> bool {
        let batch = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
        jobs.iter().all(|j| self.complete(j.user_data(), status, batch))
    }

    /// The device is gone: every job gpud holds gets DEVICE_ERROR, so the VM
    /// hears about each one even on the way down. Unless a user's kernel
    /// was among them: the fault cannot be pinned on one launch then, and
    /// gpud answers nothing; the VM answers every job `{gpud_exit, _}`.
    fn fail_all(&mut self) {
        let held = std::mem::take(&mut self.in_flight);
        if held.iter().any(|f| matches!(f.kernel, KernelRef::User(_))) {
            log!(Warning, "gpud[{}]: a user's kernel was in flight: leaving the answers to the VM", self.device);
            return;
        }
        for f in &held {
            log!(
                Warning,
                "gpud[{}]: answering {} {:?} jobs in flight with DEVICE_ERROR",
                self.device,
                f.jobs.len(),
                f.kernel
            );
            if !self.answer(&f.jobs, Status::DeviceError) {
                break;
            }
        }
        self.ring.cq_publish();
    }

    /// Blocks (or just looks, with a zero timeout; `None` waits for ever) on
    /// the SQ eventfd, stdin and the socket. Reads arena segments the VM sent.
    fn wait(&mut self, timeout: Option<Duration>) -> Result<Wake> {
        let stdin = std::io::stdin();
        let mut fds = [
            PollFd::new(self.ring.sq_eventfd().as_fd(), PollFlags::POLLIN),
            PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.sock.as_fd(), PollFlags::POLLIN),
        ];
        let r = match timeout {
            None => poll(&mut fds, PollTimeout::NONE),
            Some(t) => ppoll(&mut fds, Some(TimeSpec::from_duration(t)), None),
        };
        match r {
            Ok(_) => {}
            // A signal: the caller looks at the ring again and comes back.
            Err(nix::errno::Errno::EINTR) => return Ok(Wake::Look),
            Err(e) => {
                log!(Error, "gpud[{}]: poll: {}; exiting", self.device, e.desc());
                return Ok(Wake::Quit);
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
                Ok(0) => return Ok(self.quit("stdin closed")),
                Ok(_) | Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
                Err(_) => return Ok(self.quit("stdin failed")),
            }
        } else if input.intersects(gone) {
            return Ok(self.quit("stdin closed"));
        }
        if sock.contains(PollFlags::POLLIN) {
            // Segment messages first: a hang-up behind them shows up as the
            // end of the queue.
            if self.read_segments()? == Wake::Quit {
                return Ok(Wake::Quit);
            }
        } else if sock.intersects(gone) {
            return Ok(self.quit("the VM closed the socket"));
        }
        if efd.contains(PollFlags::POLLIN) {
            self.ring.drain_sq_eventfd();
        }
        Ok(Wake::Look)
    }

    /// Reads segment messages until `n` segments besides segment 0 are
    /// mapped, waiting for them on the socket (the VM sends them right
    /// after the hello). A VM that does not send them within
    /// HANDOVER_TIMEOUT broke the handshake.
    fn await_segments(&mut self, n: u32) -> Result<Wake> {
        let deadline = Instant::now() + HANDOVER_TIMEOUT;
        loop {
            if self.read_segments()? == Wake::Quit {
                return Ok(Wake::Quit);
            }
            let have = self.segments.sizes().extra();
            if have >= n {
                return Ok(Wake::Look);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Handshake(format!("the hello announced {n} segments, {have} came")));
            }
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            let _ = ppoll(&mut fds, Some(TimeSpec::from_duration(left)), None);
        }
    }

    /// Reads queued arena-segment messages. Quit when the VM hung up.
    fn read_segments(&mut self) -> Result<Wake> {
        match self.segments.receive(&self.sock, &mut *self.backend, self.device) {
            Ok(SockState::Open) => Ok(Wake::Look),
            Ok(SockState::Closed) => Ok(self.quit("the VM closed the socket")),
            Err(e) => {
                log!(Error, "gpud[{}]: registering a segment failed: {e}", self.device);
                self.fail_all();
                Err(e)
            }
        }
    }

    fn quit(&self, why: &str) -> Wake {
        log!(Info, "gpud[{}]: {why}; exiting", self.device);
        Wake::Quit
    }

    /// One drain: copy, validate, coalesce, submit. Ok(false) when the VM
    /// went away (while gpud waited for CQ room, or on the socket).
    pub fn process_drain(&mut self) -> Result<bool> {
        self.drain_started = Instant::now();
        self.sqes.clear();
        let drain = self.ring.drain_sq(&mut self.sqes);
        if let Some(pending) = drain.overrun {
            self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
            log!(
                Error,
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
        record_batch(self.ring.stats(), count_jobs(&self.sqes));

        // Validate everything first; refusals are answered at once. A
        // control descriptor first runs every job before it to the end.
        self.coalescer.clear();
        let sqes = std::mem::take(&mut self.sqes);
        let mut looked_for_segments = false;
        let mut i = 0;
        while i < sqes.len() {
            let sqe = &sqes[i];
            i += 1;
            // A job's launch options ride in the entry after it.
            let opts = if sqe.flags & EC_FLAG_OPTS != 0 && i < sqes.len() {
                i += 1;
                Some(LaunchOpts::from_sqe(&sqes[i - 1]))
            } else {
                None
            };
            if matches!(sqe.kernel, EC_CONTROL_LOAD_MODULE | EC_CONTROL_UNLOAD_MODULE) {
                if !self.control(sqe)? {
                    return Ok(false);
                }
                continue;
            }
            if matches!(sqe.kernel, EC_CONTROL_PUT | EC_CONTROL_GET | EC_CONTROL_FREE) {
                if !self.buffer_control(sqe)? {
                    return Ok(false);
                }
                continue;
            }
            let mut v = self.validate(sqe, opts.as_ref());
            if v == Err(Status::Oom) && self.buffers.has_pending() {
                // Freed blocks wait for launches: finish them and look again.
                if !self.make_room()? {
                    return Ok(false);
                }
                v = self.validate(sqe, opts.as_ref());
            }
            if v == Err(Status::OutOfBounds)
                && !looked_for_segments
                && names_unknown_segment(sqe, self.segments.sizes())
            {
                // The VM sends a segment before naming it: it is queued on
                // the socket. Read once per drain, then judge again.
                looked_for_segments = true;
                if self.read_segments()? == Wake::Quit {
                    return Ok(false);
                }
                v = self.validate(sqe, opts.as_ref());
            }
            match v {
                Ok(job) => self.coalescer.push(job),
                Err(status) => {
                    if !matches!(status, Status::Oom | Status::TooLarge) {
                        self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
                    }
                    if !self.complete(sqe.user_data, status, 1) {
                        return Ok(false);
                    }
                }
            }
        }
        self.sqes = sqes;
        self.ring.cq_publish();

        // One launch per kernel and element type.
        let coalescer = std::mem::take(&mut self.coalescer);
        let result = self.submit_all(&coalescer);
        self.coalescer = coalescer;
        self.release_buffers();
        result
    }

    /// Validates a job against the segments, the modules and the buffers
    /// (creating its output buffer when it asks for one).
    fn validate(&mut self, sqe: &Sqe, opts: Option<&LaunchOpts>) -> std::result::Result<Job, Status> {
        let mut table = Table { bufs: &mut self.buffers, mem: self.backend.buffer_memory() };
        let v = validate_bufs(sqe, opts, self.segments.sizes(), &self.modules, &mut table);
        if sqe.flags & EC_FLAG_OUT_BUF != 0 && v.is_ok() {
            self.buffers.publish(self.ring.stats());
        }
        v
    }

    /// Runs every job validated so far in this drain and every launch in
    /// flight to the end, so that every freed block is reusable. Ok(false)
    /// when the VM went away.
    fn make_room(&mut self) -> Result<bool> {
        let coalescer = std::mem::take(&mut self.coalescer);
        let submitted = self.submit_all(&coalescer);
        self.coalescer = coalescer;
        self.coalescer.clear();
        if !submitted? || !self.finish_in_flight()? {
            return Ok(false);
        }
        self.release_buffers();
        Ok(true)
    }

    /// A put, get or free (see the header), in SQ order with the jobs
    /// around it, answered at once. Ok(false) when the VM went away.
    fn buffer_control(&mut self, sqe: &Sqe) -> Result<bool> {
        let mut status = self.run_buffer_control(sqe)?;
        if status == Status::Oom && self.buffers.has_pending() {
            if !self.make_room()? {
                return Ok(false);
            }
            status = self.run_buffer_control(sqe)?;
        }
        if sqe.kernel == EC_CONTROL_PUT && status != Status::Ok {
            // The other slices of this put fail alike, allocating nothing
            // (until the VM frees the id, which it does for a failed put).
            self.buffers.put_failed(sqe.out, status);
        }
        if !matches!(status, Status::Ok | Status::Oom | Status::TooLarge) {
            self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
        }
        self.buffers.publish(self.ring.stats());
        let ok = self.complete(sqe.user_data, status, 1);
        self.ring.cq_publish();
        Ok(ok)
    }

    /// An arena region of a buffer control descriptor; reads segment
    /// messages once when it names a segment gpud has not mapped yet (as
    /// for jobs). When the VM went away meanwhile the region is refused
    /// (nobody reads that answer) and the main loop notices; Err when
    /// registering a segment failed.
    fn arena_region(&mut self, addr: u64, len: u32, ty: ElemType) -> Result<std::result::Result<Region, Status>> {
        let r = Region::new(addr, len, ty, self.segments.sizes());
        let seg = (addr >> EC_ADDR_SEGMENT_SHIFT) as usize;
        if r == Err(Status::OutOfBounds) && seg < EC_MAX_SEGMENTS as usize && !self.segments.sizes().is_known(seg) {
            if self.read_segments()? == Wake::Quit {
                return Ok(Err(Status::OutOfBounds));
            }
            return Ok(Region::new(addr, len, ty, self.segments.sizes()));
        }
        Ok(r)
    }

    fn run_buffer_control(&mut self, sqe: &Sqe) -> Result<Status> {
        let Some(ty) = ElemType::from_id(sqe.ty) else { return Ok(Status::BadType) };
        macro_rules! region {
            ($addr:expr, $len:expr, $ty:expr) => {
                match self.arena_region($addr, $len, $ty)? {
                    Ok(r) => r,
                    Err(s) => return Ok(s),
                }
            };
        }
        match sqe.kernel {
            EC_CONTROL_PUT => {
                // One slice (the whole buffer, or a part of a pipelined
                // put): in0_len elements at byte p.u64[0] of a buffer of
                // out_len elements.
                if sqe.flags != EC_FLAG_OUT_BUF {
                    return Ok(Status::BadFlags);
                }
                let src = region!(sqe.in0, sqe.in0_len, ty);
                let mem = self.backend.buffer_memory();
                let dst = match self.buffers.put_slice(mem, sqe.out, ty, sqe.out_len, sqe.p.u64_at(0), sqe.in0_len) {
                    Ok(r) => r,
                    Err(s) => return Ok(s),
                };
                let arena = self.segments.arena();
                // SAFETY: a validated arena region, the descriptor's own: the
                // VM does not touch it while the put is in flight.
                let bytes = unsafe { std::slice::from_raw_parts(arena.host_ptr(src), src.bytes() as usize) };
                // dst lies inside the buffer's block (put_slice checked the
                // slice against its length) and is src.bytes() long.
                self.backend.buf_write(dst.offset(), bytes)?;
                Ok(Status::Ok)
            }
            EC_CONTROL_GET => {
                if sqe.flags != EC_FLAG_IN0_BUF {
                    return Ok(Status::BadFlags);
                }
                if sqe.out_len != sqe.in0_len {
                    return Ok(Status::BadShape);
                }
                let buf = match self.buffers.lookup(sqe.in0, ty, sqe.in0_len) {
                    Ok(b) => b,
                    Err(s) => return Ok(s),
                };
                let dst = region!(sqe.out, sqe.out_len, ty);
                let arena = self.segments.arena();
                // SAFETY: as for a put; the output region is the get's own.
                let bytes = unsafe { std::slice::from_raw_parts_mut(arena.host_ptr(dst), dst.bytes() as usize) };
                self.backend.buf_read(buf.offset(), bytes)?;
                Ok(Status::Ok)
            }
            _ => {
                if sqe.flags != 0 {
                    return Ok(Status::BadFlags);
                }
                if ty != ElemType::S64 {
                    return Ok(Status::BadType);
                }
                if sqe.in0_len > EC_FREE_MAX_IDS {
                    return Ok(Status::BadShape);
                }
                let ids = region!(sqe.in0, sqe.in0_len, ty);
                let arena = self.segments.arena();
                // SAFETY: a validated region of 8-byte elements, the
                // descriptor's own.
                let ids: Vec<u64> = unsafe { arena.input::<u64>(ids) }.to_vec();
                let drain = self.next_drain;
                for id in ids {
                    self.buffers.free(id, drain);
                }
                self.release_buffers();
                Ok(Status::Ok)
            }
        }
    }

    /// Runs a control descriptor: the jobs before it in this drain are
    /// submitted and every launch is finished first (a module is never
    /// swapped under a running kernel), then it is answered. Ok(false) when
    /// the VM went away.
    fn control(&mut self, sqe: &Sqe) -> Result<bool> {
        if !self.make_room()? {
            return Ok(false);
        }
        let status = self.run_control(sqe);
        if status != Status::Ok {
            self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
        }
        let ok = self.complete(sqe.user_data, status, 1);
        self.ring.cq_publish();
        Ok(ok)
    }

    /// Waits for every launch in flight and answers it. Ok(false) when the
    /// VM went away.
    fn finish_in_flight(&mut self) -> Result<bool> {
        while !self.in_flight.is_empty() {
            if !self.reap()? {
                return Ok(false);
            }
            std::thread::yield_now();
        }
        Ok(true)
    }

    /// Loads or unloads the module a control descriptor names. Why a load
    /// failed goes into the descriptor's output region (NUL-padded).
    fn run_control(&mut self, sqe: &Sqe) -> Status {
        let sizes = self.segments.sizes();
        let slot = sqe.p.u32_at(0);
        let Ok(slot) = u16::try_from(slot) else { return Status::BadShape };
        if sqe.kernel == EC_CONTROL_UNLOAD_MODULE {
            self.modules.unload(slot, &mut *self.backend);
            log!(Info, "gpud[{}]: module slot {slot} unloaded", self.device);
            return Status::Ok;
        }
        let (path, msg) = match (
            Region::new(sqe.in0, sqe.in0_len, ElemType::U8, sizes),
            Region::new(sqe.out, sqe.out_len, ElemType::U8, sizes),
        ) {
            (Ok(p), Ok(m)) if !p.overlaps(&m) => (p, m),
            (Err(s), _) | (_, Err(s)) => return s,
            _ => return Status::Overlap,
        };
        let arena = self.segments.arena();
        // SAFETY: validated regions of the arena; the VM does not touch a
        // job's regions while it is in flight, and nothing else here does.
        let dir = unsafe { arena.input::<u8>(path) }.to_vec();
        let result = match String::from_utf8(dir) {
            Ok(d) => self.modules.load(slot, std::path::Path::new(&d), &mut *self.backend).map(|()| d),
            Err(_) => Err("the module path is not UTF-8".to_string()),
        };
        match result {
            Ok(d) => {
                log!(Info, "gpud[{}]: module slot {slot} loaded from {d}", self.device);
                Status::Ok
            }
            Err(e) => {
                log!(Warning, "gpud[{}]: module slot {slot} refused: {e}", self.device);
                // SAFETY: as above; the output region is the job's own.
                let out = unsafe { arena.output::<u8>(msg) };
                out.fill(0);
                let n = e.len().min(out.len());
                out[..n].copy_from_slice(&e.as_bytes()[..n]);
                Status::ModuleError
            }
        }
    }

    fn submit_all(&mut self, coalescer: &Coalescer) -> Result<bool> {
        let drained = self.drain_started;
        let drain = self.next_drain;
        self.next_drain += 1;
        let users: Vec<_> = coalescer
            .user_groups()
            .filter_map(|(key, jobs)| {
                // Validated in this drain, and no control descriptor since.
                let k = self.modules.kernel(key.id)?;
                Some((KernelRef::User(key.id), key.ty, jobs, UserOp(k.clone())))
            })
            .collect();
        let mut groups = coalescer
            .groups()
            .map(|(k, ty, jobs)| (KernelRef::Builtin(k), ty, jobs, None))
            .chain(users.iter().map(|(k, ty, jobs, op)| (*k, *ty, *jobs, Some(op))));
        while let Some((kernel, ty, jobs, user_op)) = groups.next() {
            self.ring.stats().launches.fetch_add(1, Ordering::Relaxed);
            let launch = Launch {
                kernel,
                op: match (kernel, user_op) {
                    (KernelRef::Builtin(k), _) => crate::ops::op(k),
                    (KernelRef::User(_), Some(op)) => op,
                    (KernelRef::User(_), None) => unreachable!("users' groups carry their op"),
                },
                ty,
                jobs,
                independent: coalesce::independent(jobs),
            };
            let arena = self.segments.arena().with_host_buffers(self.backend.host_buffers());
            match self.backend.submit(&arena, &launch) {
                Ok(ticket) => self.in_flight.push(InFlight {
                    ticket,
                    kernel,
                    jobs: jobs.to_vec(),
                    drain,
                    drained,
                    submitted: Instant::now(),
                }),
                Err(e) => {
                    log!(Error, "gpud[{}]: {kernel:?} launch failed: {e}", self.device);
                    // This launch, the rest of the drain and everything in
                    // flight: all answered before gpud exits.
                    // Launches that did finish (the CPU backend's, say)
                    // are answered as done; everything else DEVICE_ERROR.
                    if matches!(kernel, KernelRef::User(_)) {
                        // A user's launch failed: the VM answers (fail_all).
                        self.in_flight.push(InFlight {
                            ticket: 0,
                            kernel,
                            jobs: Vec::new(),
                            drain,
                            drained,
                            submitted: Instant::now(),
                        });
                        self.fail_all();
                        return Err(e);
                    }
                    let mut ok = self.answer(jobs, Status::DeviceError);
                    for (_, _, rest, _) in groups.by_ref() {
                        ok = ok && self.answer(rest, Status::DeviceError);
                    }
                    self.ring.cq_publish();
                    if ok && matches!(self.reap(), Ok(true)) {
                        self.fail_all();
                    }
                    return Err(e);
                }
            }
        }
        Ok(true)
    }

    /// Writes one completion (waiting for room if the VM broke its promise
    /// of never letting the CQ fill). False when the VM went away meanwhile.
    fn complete(&mut self, user_data: u64, status: Status, batch: u32) -> bool {
        let device = self.device;
        let sock = &self.sock;
        let mut warned = false;
        let room = self.ring.cq_wait_for_room(|| {
            if !warned {
                log!(Warning, "gpud[{device}]: CQ full; waiting for the VM");
                warned = true;
            }
            !stdin_or_socket_closed(sock)
        });
        if !room {
            log!(Notice, "gpud[{device}]: the VM went away while the CQ was full; exiting");
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
/// Jobs in a drain: entries less the launch options riding after a job
/// with EC_FLAG_OPTS (as `process_drain` pairs them).
fn count_jobs(sqes: &[Sqe]) -> u64 {
    let (mut n, mut i) = (0u64, 0usize);
    while i < sqes.len() {
        i += if sqes[i].flags & EC_FLAG_OPTS != 0 { 2 } else { 1 };
        n += 1;
    }
    n
}

fn record_batch(stats: &Stats, size: u64) {
    stats.batches.fetch_add(1, Ordering::Relaxed);
    if size > stats.max_batch.load(Ordering::Relaxed) {
        stats.max_batch.store(size, Ordering::Relaxed);
    }
    stats.batch_hist[coalesce::hist_bucket(size)].fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::ptr::NonNull;

    use crate::layout::{Kernel, Params};
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::handshake::{validate_header, HeaderFields, Mapping};
    use crate::layout::Header;

    fn eventfd() -> OwnedFd {
        // SAFETY: a fresh fd, owned by nobody else.
        unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)) }
    }

    /// A daemon on the CPU backend over a ring in a heap buffer (`base`,
    /// `total` bytes, laid out as `geo`), and the VM's end of its socket.
    fn heap_daemon(base: NonNull<u8>, total: usize, geo: crate::handshake::Geometry) -> (Daemon, OwnedFd) {
        // SAFETY: the caller's buffer outlives the daemon (dropped before dealloc).
        let mapping = unsafe { Mapping::from_raw_parts(base, total) };
        let ring = Ring::new(mapping, geo, eventfd(), eventfd());
        let mut backend: Box<dyn Backend> = Box::new(CpuBackend::new(0));
        let (seg0, bytes0) = ring.arena().segment(0).unwrap();
        backend.add_segment(0, seg0, bytes0).unwrap();
        // SAFETY: segment 0 lies in the ring's mapping.
        let segments = unsafe { Segments::new(seg0, bytes0) };
        let (sock, vm) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
        (Daemon::new(0, Duration::ZERO, backend, segments, ring, sock), vm)
    }

    /// The ring path over a ring in ordinary memory (what gpud/fuzz's `ring`
    /// target does with hostile contents): good and bad entries, each gets
    /// exactly one CQE; bad ones are counted.
    #[test]
    fn drain_answers_every_entry_once_over_a_heap_ring() {
        const SQ: u32 = 4;
        const CQ: u32 = 8;
        let (sq_off, cq_off) = (4096u64, 4096 + 64 * SQ as u64);
        let arena_off = cq_off + 16 * CQ as u64;
        let arena_bytes = 4096u64;
        let total = (arena_off + arena_bytes) as usize;
        let layout = Layout::from_size_align(total, 4096).unwrap();
        // SAFETY: non-zero size.
        let base = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        let fields = HeaderFields::for_geometry(SQ, CQ, sq_off, cq_off, arena_off, arena_bytes);
        let geo = validate_header(&fields, total as u64).unwrap();
        let vadd = |user_data, out| Sqe {
            user_data,
            kernel: Kernel::VectorAdd.id(),
            in0: 0,
            in1: 64,
            out,
            in0_len: 16,
            in1_len: 16,
            out_len: 16,
            ..Sqe::default()
        };
        let entries = [
            vadd(1, 128),
            Sqe { kernel: 9, ..vadd(2, 256) },
            vadd(3, 32), // overlaps in0
            vadd(4, 192),
        ];
        let h = base.as_ptr().cast::<Header>();
        // SAFETY: in bounds of the buffer; no references kept.
        unsafe {
            for (i, s) in entries.iter().enumerate() {
                base.as_ptr().add(sq_off as usize).cast::<Sqe>().add(i).write(*s);
            }
            // Free-running counters that wrap while in use.
            (*h).sq_head.0.store(u32::MAX - 1, Ordering::Relaxed);
            (*h).sq_tail.0.store(2, Ordering::Relaxed);
            (*h).cq_tail.0.store(u32::MAX, Ordering::Relaxed);
            (*h).cq_head.0.store(u32::MAX, Ordering::Relaxed);
        }
        let (mut d, _vm) = heap_daemon(base, total, geo);
        assert!(d.process_drain().unwrap());
        while d.launches_in_flight() > 0 {
            assert!(d.reap().unwrap());
        }
        let stats = d.ring().stats();
        assert_eq!(stats.bad_descriptors.load(Ordering::Relaxed), 2);
        assert_eq!(stats.jobs_ok.load(Ordering::Relaxed), 2);
        assert_eq!(stats.jobs_failed.load(Ordering::Relaxed), 2);
        drop(d);
        // SAFETY: as above.
        let cqes: Vec<Cqe> = unsafe {
            assert_eq!((*h).sq_head.0.load(Ordering::Relaxed), 2);
            assert_eq!((*h).cq_tail.0.load(Ordering::Relaxed), 3);
            (0..4u32)
                .map(|i| base.as_ptr().add(cq_off as usize).cast::<Cqe>().add((u32::MAX.wrapping_add(i) & (CQ - 1)) as usize).read())
                .collect()
        };
        let mut got: Vec<(u64, i32, u32)> = cqes.iter().map(|c| (c.user_data, c.status, c.batch)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (1, Status::Ok.code(), 2),
                (2, Status::BadKernel.code(), 1),
                (3, Status::Overlap.code(), 1),
                (4, Status::Ok.code(), 2),
            ]
        );
        // SAFETY: allocated above with this layout; the daemon is gone.
        unsafe { dealloc(base.as_ptr(), layout) };
    }

    /// A pipelined put through the daemon over a heap ring (cpu backend):
    /// slices published out of order make one buffer that a get reads back
    /// whole; a put that does not fit answers OOM for each of its slices
    /// and leaves nothing behind, and its free is harmless.
    #[test]
    fn put_slices_out_of_order_then_get_and_a_failing_put() {
        const SQ: u32 = 16;
        let (sq_off, cq_off) = (4096u64, 4096 + 64 * SQ as u64);
        let arena_off = cq_off + 16 * SQ as u64;
        let arena_bytes = 64u64 << 10;
        let total = (arena_off + arena_bytes) as usize;
        let layout = Layout::from_size_align(total, 4096).unwrap();
        // SAFETY: non-zero size.
        let base = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        let fields = HeaderFields::for_geometry(SQ, SQ, sq_off, cq_off, arena_off, arena_bytes);
        let geo = validate_header(&fields, total as u64).unwrap();
        let arena = |off: u64| (arena_off + off) as usize;
        // 3000 f32 at arena 0, its get at 16384; a second put's input at
        // 32768; free lists at 49152.
        let n = 3000u32;
        let want: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let put = |user_data, id: u64, at: u64, part: u32, src: u64| {
            let mut p = Params::default();
            p.set_u64(0, at);
            Sqe {
                user_data,
                kernel: EC_CONTROL_PUT,
                ty: ElemType::F32.id(),
                flags: EC_FLAG_OUT_BUF,
                in0: src + at,
                in0_len: part,
                out: id,
                out_len: n,
                p,
                ..Sqe::default()
            }
        };
        let get = |user_data, id| Sqe {
            user_data,
            kernel: EC_CONTROL_GET,
            ty: ElemType::F32.id(),
            flags: EC_FLAG_IN0_BUF,
            in0: id,
            in0_len: n,
            out: 16384,
            out_len: n,
            ..Sqe::default()
        };
        let free = |user_data, at: u64, ids: u32| Sqe {
            user_data,
            kernel: EC_CONTROL_FREE,
            ty: ElemType::S64.id(),
            in0: at,
            in0_len: ids,
            ..Sqe::default()
        };
        let entries = [
            // Buffer 5 in three slices, the last one first; a get before
            // the put is complete is refused.
            put(1, 5, 8192, n - 2048, 0),
            put(2, 5, 0, 1024, 0),
            get(3, 5),
            put(4, 5, 4096, 1024, 0),
            get(5, 5),
            // Buffer 6 does not fit the limit: every slice answers OOM.
            put(6, 6, 4096, 1024, 32768),
            put(7, 6, 0, 1024, 32768),
            put(8, 6, 8192, n - 2048, 32768),
            // Its free (the VM frees a failed put), then a put of the same
            // id is judged afresh: buffer 5 freed first, it fits.
            free(9, 49152, 2),
            put(10, 6, 0, n, 32768),
        ];
        // SAFETY: every write is in bounds of the buffer; no references kept.
        unsafe {
            let b = base.as_ptr();
            for (i, x) in want.iter().enumerate() {
                b.add(arena(0)).cast::<f32>().add(i).write(*x);
                b.add(arena(32768)).cast::<f32>().add(i).write(-*x);
            }
            b.add(arena(49152)).cast::<u64>().write(6);
            b.add(arena(49152)).cast::<u64>().add(1).write(5);
            for (i, s) in entries.iter().enumerate() {
                b.add(sq_off as usize).cast::<Sqe>().add(i).write(*s);
            }
            (*b.cast::<Header>()).sq_tail.0.store(entries.len() as u32, Ordering::Relaxed);
        }
        let (mut d, _vm) = heap_daemon(base, total, geo);
        // Room for one 12 KB buffer (a 12 KiB size class), not two.
        d.set_memory_limit(crate::cli::MemoryLimit::Bytes(20_000));
        assert!(d.process_drain().unwrap());
        assert_eq!(d.buffer_use(), (1, buffers::size_class(12_000)), "buffer 6 alone, counted once");
        let stats = d.ring().stats();
        // The get of a filling buffer is a VM bug: the only bad descriptor.
        assert_eq!(stats.bad_descriptors.load(Ordering::Relaxed), 1);
        // One block from the device: the failed put took none, and buffer 6
        // reuses buffer 5's.
        assert_eq!(stats.buf_device_allocs.load(Ordering::Relaxed), 1);
        drop(d);
        // SAFETY: as above.
        let (cqes, got): (Vec<(u64, i32)>, Vec<f32>) = unsafe {
            let b = base.as_ptr();
            assert_eq!((*b.cast::<Header>()).cq_tail.0.load(Ordering::Relaxed), entries.len() as u32);
            (
                (0..entries.len()).map(|i| b.add(cq_off as usize).cast::<Cqe>().add(i).read()).map(|c| (c.user_data, c.status)).collect(),
                (0..n as usize).map(|i| b.add(arena(16384)).cast::<f32>().add(i).read()).collect(),
            )
        };
        let (ok, oom, bad) = (Status::Ok.code(), Status::Oom.code(), Status::BadBuffer.code());
        assert_eq!(
            cqes,
            vec![(1, ok), (2, ok), (3, bad), (4, ok), (5, ok), (6, oom), (7, oom), (8, oom), (9, ok), (10, ok)]
        );
        assert_eq!(got, want, "the get reads back every slice in its place");
        // SAFETY: allocated above with this layout; the daemon is gone.
        unsafe { dealloc(base.as_ptr(), layout) };
    }
}
