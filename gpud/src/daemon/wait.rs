//! Waiting for work: the main loop, spinning on the SQ, bounded naps while
//! launches are in flight, and the poll on the SQ eventfd, stdin and the
//! socket (which also brings arena segments the VM sent).

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::poll::{poll, ppoll, PollFd, PollFlags, PollTimeout};
use nix::sys::time::TimeSpec;

use super::{Daemon, InFlight, Wake};
use crate::backend::MAX_DRAINS_IN_FLIGHT;
use crate::error::{Error, Result};
use crate::layout::StallPhase;
use crate::segment::SockState;

/// How long the segment messages announced in the hello may take to come.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a busy daemon (one that never sleeps) still looks at stdin and
/// the socket, so that it notices the VM going away.
const QUIT_CHECK_EVERY: Duration = Duration::from_millis(10);

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

impl Daemon {
    /// While busy, gpud never blocks, so stdin EOF and socket hang-up are
    /// polled every QUIT_CHECK_EVERY instead. True when gpud must exit.
    pub(super) fn quit_due(&mut self, last_check: &mut Instant) -> Result<bool> {
        if last_check.elapsed() < QUIT_CHECK_EVERY {
            return Ok(false);
        }
        *last_check = Instant::now();
        Ok(self.wait(Some(Duration::ZERO))? == Wake::Quit)
    }

    pub(super) fn main_loop(&mut self) -> Result<()> {
        let mut last_check = Instant::now();
        loop {
            if !self.reap()? {
                return Ok(());
            }
            if self.segments.has_registered() {
                let t = Instant::now();
                self.adopt_segments(false)?;
                self.count_stall(StallPhase::Segments, t);
            }
            let can_drain = self.drains_in_flight(false) < MAX_DRAINS_IN_FLIGHT;
            if can_drain && self.parked_ready {
                let t = Instant::now();
                let more = self.run_parked()?;
                self.count_work(t);
                self.count_stall(StallPhase::Drain, t);
                if !more {
                    return Ok(());
                }
                continue;
            }
            if (can_drain && (self.ring.sq_nonempty() || self.held_due())) || self.small_job_held() {
                let t = Instant::now();
                let more = self.process_drain()?;
                self.count_work(t);
                self.count_stall(StallPhase::Drain, t);
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
                // Held jobs wake gpud when their wait ends.
                let w = self.wait(self.hold_left());
                self.ring.disarm_sq_wakeup();
                if w? == Wake::Quit {
                    return Ok(());
                }
                last_check = Instant::now();
            }
        }
    }

    /// Drains with a launch in flight (copies do not count: a long get
    /// must not keep the next small jobs from being drained); `small`:
    /// only those with a launch of small jobs only.
    pub(super) fn drains_in_flight(&self, small: bool) -> usize {
        // At most a handful of launches: a quadratic count is cheapest.
        let f = &self.in_flight;
        let counts = |x: &InFlight| x.kernel.is_some() && (!small || x.small);
        (0..f.len())
            .filter(|&i| counts(&f[i]) && f[..i].iter().all(|x| !counts(x) || x.drain != f[i].drain))
            .count()
    }

    /// A small job waits in the SQ while large launches hold the drain
    /// limit: it is drained at once, with whatever came with it. The limit
    /// is there so that small jobs arriving while the GPU is busy coalesce
    /// into one launch; a large launch, milliseconds long, kept the next
    /// small job waiting that long (small-job p99 beside `vector_add` 2^26
    /// from binaries 1-4.5 ms on an H100, 2026-12-06). Drains of small
    /// launches still count against it, as before.
    pub(super) fn small_job_held(&mut self) -> bool {
        self.ring.sq_nonempty()
            && self.drains_in_flight(false) >= MAX_DRAINS_IN_FLIGHT
            && self.drains_in_flight(true) < MAX_DRAINS_IN_FLIGHT
            && self.ring.sq_pending_any(crate::descriptor::may_be_small)
    }

    /// Polls the SQ tail for up to `spin`. True when work showed up.
    pub(super) fn spin_for_work(&self) -> bool {
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
    pub(super) fn wait_busy(&mut self, can_drain: bool) -> Result<Wake> {
        let start = Instant::now();
        loop {
            if self.poll_backend()? || (can_drain && self.segments.has_registered()) {
                return Ok(Wake::Look);
            }
            for _ in 0..32 {
                if can_drain && self.ring.sq_nonempty() {
                    return Ok(Wake::Look);
                }
                std::hint::spin_loop();
            }
            if !can_drain && self.small_job_held() {
                return Ok(Wake::Look);
            }
            // A copy in flight is moved on only by polling: no naps until
            // it is done, or each piece would wait for the end of one.
            if start.elapsed() >= self.spin.max(BUSY_SPIN) && self.backend.copies_in_flight() == 0 {
                break;
            }
        }
        let mut nap = NAP_MIN;
        loop {
            // Ask the VM for a wake-up so that new work cuts the nap short
            // (with the limit held, only while the SQ is empty: a small job
            // coming then wakes gpud; the large ones already there do not
            // keep it from napping).
            let armed = if can_drain {
                if !self.ring.arm_sq_wakeup() {
                    return Ok(Wake::Look);
                }
                true
            } else {
                !self.ring.sq_nonempty() && self.ring.arm_sq_wakeup()
            };
            let w = self.wait(Some(nap));
            if armed {
                self.ring.disarm_sq_wakeup();
            }
            if w? == Wake::Quit {
                return Ok(Wake::Quit);
            }
            if self.poll_backend()?
                || (can_drain && (self.ring.sq_nonempty() || self.segments.has_registered() || self.held_due()))
                || (!can_drain && self.small_job_held())
            {
                return Ok(Wake::Look);
            }
            nap = (nap * 2).min(NAP_MAX);
        }
    }

    /// Blocks (or just looks, with a zero timeout; `None` waits for ever) on
    /// the SQ eventfd, stdin, the socket and, while a segment is being
    /// registered, the registration thread. Reads arena segments the VM
    /// sent; a finished registration wakes it (the loop then adopts it).
    pub(super) fn wait(&mut self, timeout: Option<Duration>) -> Result<Wake> {
        let stdin = std::io::stdin();
        let registered = self.segments.registered_fd().filter(|_| self.segments.registering());
        let mut fds = [
            PollFd::new(self.ring.sq_eventfd().as_fd(), PollFlags::POLLIN),
            PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.sock.as_fd(), PollFlags::POLLIN),
            PollFd::new(registered.unwrap_or(self.sock.as_fd()), PollFlags::POLLIN),
        ];
        let n = if registered.is_some() { 4 } else { 3 };
        let r = match timeout {
            None => poll(&mut fds[..n], PollTimeout::NONE),
            Some(t) => ppoll(&mut fds[..n], Some(TimeSpec::from_duration(t)), None),
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
    pub(super) fn await_segments(&mut self, n: u32) -> Result<Wake> {
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
    pub(super) fn read_segments(&mut self) -> Result<Wake> {
        let t = Instant::now();
        let got = self.segments.receive(&self.sock, &mut *self.backend, self.device);
        self.count_stall(StallPhase::Segments, t);
        match got {
            Ok(SockState::Open) => Ok(Wake::Look),
            Ok(SockState::Closed) => Ok(self.quit("the VM closed the socket")),
            Err(e) => {
                log!(Error, "gpud[{}]: registering a segment failed: {e}", self.device);
                self.fail_all();
                Err(e)
            }
        }
    }

    pub(super) fn quit(&self, why: &str) -> Wake {
        log!(Info, "gpud[{}]: {why}; exiting", self.device);
        // With `fault-injection`, ERLCUDA_GPUD_STUCK_AT_EXIT holds the loop
        // here as a driver call that never returns would: the hang-up
        // thread (hangup.rs) must end gpud.
        #[cfg(feature = "fault-injection")]
        if std::env::var_os("ERLCUDA_GPUD_STUCK_AT_EXIT").is_some() {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Wake::Quit
    }
}
