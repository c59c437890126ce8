//! Completions: answering finished launches (with their timings), refused
//! jobs, and every job in flight when the device fails.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{nanos, CqeTimes, Daemon};
use crate::descriptor::{Job, KernelRef};
use crate::error::Result;
use crate::handshake::peer_closed;
use crate::layout::{Cqe, CqeFault, StallPhase, Status};

impl Daemon {
    /// Collects finished tickets into `self.done`. True when there are some.
    /// On a backend failure answers everything in flight first.
    pub(super) fn poll_backend(&mut self) -> Result<bool> {
        let t = Instant::now();
        let polled = self.backend.poll(&mut self.done);
        self.count_stall(StallPhase::Poll, t);
        if let Err(e) = polled {
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
            // Stamped for small launches only: the VM's split of a small
            // job's wait (a large launch's own run is no stall).
            let times = if f.small { CqeTimes::of(f.drained, started) } else { CqeTimes::NONE };
            let faults = self.backend.take_faults(*t);
            if !faults.is_empty() {
                if !self.answer_faulted(&f.jobs, &faults, times) {
                    return Ok(false);
                }
            } else if !self.answer(&f.jobs, Status::Ok, times) {
                return Ok(false);
            }
            self.ring.cq_publish();
            if f.kernel.is_none() {
                // A copy: not a launch to time. Jobs held back for a put's
                // buffer may go now.
                if let Some(id) = f.lands {
                    self.buffers.landing(id, true);
                    self.parked_ready |= !self.parked.is_empty();
                }
                continue;
            }
            let s = self.ring.stats();
            s.launches_timed.fetch_add(1, Ordering::Relaxed);
            s.launch_drain_ns.fetch_add(nanos(f.submitted - f.drained), Ordering::Relaxed);
            s.launch_run_ns.fetch_add(nanos(started.saturating_duration_since(f.submitted)), Ordering::Relaxed);
            s.launch_answer_ns.fetch_add(nanos(started.elapsed()), Ordering::Relaxed);
            s.launch_backend_ns.fetch_add(nanos(f.backend), Ordering::Relaxed);
            s.launch_enqueue_ns.fetch_add(nanos(f.enqueue), Ordering::Relaxed);
            if let (Some((size, shared)), Some(kernel)) = (f.group, f.kernel) {
                // The VM's telemetry event per group launch
                // (erlcuda_device.erl): kernel id, jobs, the wait from its
                // drain's start to the submit, the pass, shared bytes.
                let id = match kernel {
                    crate::descriptor::KernelRef::User(id) | crate::descriptor::KernelRef::UserGroup(id) => id,
                    crate::descriptor::KernelRef::Builtin(k) => k.id(),
                };
                let wait = (f.submitted - f.drained).saturating_sub(f.backend);
                let pass = started.saturating_duration_since(f.submitted) + f.backend;
                let (wait, pass) = (nanos(wait), nanos(pass));
                super::announce(&format!("group {id} {size} {wait} {pass} {shared}"))?;
            }
        }
        self.done = done;
        self.done.clear();
        self.release_buffers();
        self.count_work(started);
        self.count_stall(StallPhase::Answer, started);
        Ok(true)
    }

    /// Writes one completion per job (by its `user_data`) with `status`;
    /// batch = the launch size.
    pub(super) fn answer(&mut self, jobs: &[u64], status: Status, times: CqeTimes) -> bool {
        let batch = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
        jobs.iter().all(|&u| self.complete(u, status, batch, times))
    }

    /// A finished launch some of whose jobs faulted: each of those gets
    /// `KERNEL_FAULT` with its fault, every other job its usual answer.
    fn answer_faulted(&mut self, jobs: &[u64], faults: &[(u64, crate::kitjob::Fault)], times: CqeTimes) -> bool {
        let batch = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
        jobs.iter().all(|&u| match faults.iter().find(|(fu, _)| *fu == u) {
            Some((_, f)) => {
                log!(Notice, "gpud[{}]: a user's GPU body run on the CPU faulted: {f:?}", self.device);
                let info = CqeFault {
                    index: f.index as i64,
                    block: u32::try_from(f.block).unwrap_or(u32::MAX),
                    thread: u16::try_from(f.thread).unwrap_or(u16::MAX),
                    reason: u8::try_from(f.reason).unwrap_or(u8::MAX),
                    slot: u8::try_from(f.slot).unwrap_or(u8::MAX),
                };
                self.write_cqe(Cqe::fault(u, batch, info))
            }
            None => self.complete(u, Status::Ok, batch, times),
        })
    }

    /// [`Daemon::answer`] for jobs not handed to the backend.
    pub(super) fn answer_jobs(&mut self, jobs: &[Job], status: Status) -> bool {
        let batch = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
        jobs.iter().all(|j| self.complete(j.user_data(), status, batch, CqeTimes::NONE))
    }

    /// The device is gone: every job gpud holds gets DEVICE_ERROR, so the VM
    /// hears about each one even on the way down. Unless a user's kernel
    /// was among them: the fault cannot be pinned on one launch then, and
    /// gpud answers nothing; the VM answers every job `{gpud_exit, _}`.
    pub(super) fn fail_all(&mut self) {
        let held = std::mem::take(&mut self.in_flight);
        if held.iter().any(|f| matches!(f.kernel, Some(KernelRef::User(_)))) {
            log!(Warning, "gpud[{}]: a user's kernel was in flight: leaving the answers to the VM", self.device);
            return;
        }
        // Jobs held for companions never ran: answered as the launches.
        let waiting: Vec<u64> = self.held.drain(..).map(|(j, _)| j.user_data()).collect();
        if !waiting.is_empty() && !self.answer(&waiting, Status::DeviceError, CqeTimes::NONE) {
            return;
        }
        for f in &held {
            log!(
                Warning,
                "gpud[{}]: answering {} {} jobs in flight with DEVICE_ERROR",
                self.device,
                f.jobs.len(),
                f.kernel.map_or("copy".to_string(), |k| format!("{k:?}"))
            );
            if !self.answer(&f.jobs, Status::DeviceError, CqeTimes::NONE) {
                break;
            }
        }
        self.ring.cq_publish();
    }

    /// Runs everything gpud holds to the end: launches and copies in
    /// flight, and the entries held back (once their segments are
    /// registered and their buffers have landed). The main loop does this
    /// as it goes; `make_room` all at once, and so do tests and the fuzz
    /// targets, which drive the daemon drain by drain. Ok(false) when the
    /// VM went away.
    pub fn finish(&mut self) -> Result<bool> {
        if !self.held.is_empty() {
            // Jobs held for companions run now, as they are.
            let mut coalescer = std::mem::take(&mut self.coalescer);
            coalescer.clear();
            for (job, _) in self.held.drain(..) {
                coalescer.push(job);
            }
            let submitted = self.submit_all(&coalescer);
            coalescer.clear();
            self.coalescer = coalescer;
            if !submitted? {
                return Ok(false);
            }
        }
        loop {
            if !self.parked.is_empty() {
                self.adopt_segments(true)?;
                if !self.run_parked()? {
                    return Ok(false);
                }
                self.coalescer.clear();
            }
            if !self.finish_in_flight()? {
                return Ok(false);
            }
            // Nothing registers or lands any more: a second turn runs what
            // waited for a copy, and holds nothing back.
            if self.parked.is_empty() {
                return Ok(true);
            }
        }
    }

    /// Waits for every launch in flight and answers it. Ok(false) when the
    /// VM went away.
    pub(super) fn finish_in_flight(&mut self) -> Result<bool> {
        while !self.in_flight.is_empty() {
            if !self.reap()? {
                return Ok(false);
            }
            std::thread::yield_now();
        }
        Ok(true)
    }

    /// Writes one completion (waiting for room if the VM broke its promise
    /// of never letting the CQ fill). False when the VM went away meanwhile.
    pub(super) fn complete(&mut self, user_data: u64, status: Status, batch: u32, times: CqeTimes) -> bool {
        self.write_cqe(Cqe { user_data, status: status.code(), batch, drained_ns: times.drained_ns, done_ns: times.done_ns })
    }

    /// Writes completion `cqe`, as [`Daemon::complete`].
    fn write_cqe(&mut self, cqe: Cqe) -> bool {
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
        self.ring.cq_write(cqe);
        let stats = self.ring.stats();
        if cqe.status == Status::Ok.code() {
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
