//! The daemon: handshake, `ready`, then the loop that spins on the SQ,
//! sleeps when it is idle, and turns each drain into launches and
//! completions. Exits cleanly when stdin or the socket closes.
//!
//! Pipelining: a drain's launches are only *submitted* to the backend; their
//! completions are written when the backend reports them done (for CUDA:
//! when the launch's event has fired), in whatever order that happens. While
//! launches run, gpud drains, validates and submits the next batch, up to
//! [`backend::MAX_DRAINS_IN_FLIGHT`] drains at a time: one running and one queued
//! behind it on the GPU, with the SQ filling up meanwhile so that the next
//! drain coalesces more. With work in flight gpud never blocks on the SQ
//! eventfd alone: it polls the backend and the SQ together, spinning first
//! and then napping in bounded, growing steps (20 .. 50 µs).
//!
//! One [`Daemon`], its methods by concern:
//! - this file: start-up ([`run`]) and the state the others share;
//! - [`wait`]: the main loop, spinning, napping and polling stdin, the
//!   socket and the SQ eventfd;
//! - [`drain`]: one drain of the SQ, validated and coalesced;
//! - [`control`]: buffer and module control descriptors;
//! - [`submit`]: a drain's launches handed to the backend;
//! - [`complete`]: completions: finished launches, refusals, device failure;
//! - [`hangup`]: the thread that ends gpud once the VM closed the port, if
//!   the loop has not.

mod complete;
mod control;
mod drain;
mod hangup;
mod submit;
mod wait;
#[cfg(test)]
mod tests;

use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::backend::{self, Backend, Ticket};
use crate::buffers::{self, Buffers};
use crate::cli::DaemonOpts;
use crate::coalesce::Coalescer;
use crate::descriptor::Job;
use crate::descriptor::KernelRef;
use crate::error::{Error, Result};
use crate::handshake;
use crate::layout::{Sqe, StallPhase, EC_STALL_NS};
use crate::modules::Registry;
use crate::ring::Ring;
use crate::segment::Segments;
use crate::startup::Phases;

/// How long gpud's start waits for the hello's segments before the driver
/// starts (the VM sends them right behind the hello; any later is
/// registered after the driver's start, only without populated page tables).
const EARLY_SEGMENTS_WAIT: Duration = Duration::from_millis(20);

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A completion's stamps (`ec_cqe`'s `drained_ns` and `done_ns`): when the
/// drain that took the job began and when gpud saw it finished, on the
/// host's CLOCK_MONOTONIC, the clock the VM stamps its side with. The VM
/// splits a small job's wait with them (stats/1, `job_stalls_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct CqeTimes {
    drained_ns: u64,
    done_ns: u64,
}

impl CqeTimes {
    /// A job answered without a launch or copy: nothing to split.
    pub(super) const NONE: CqeTimes = CqeTimes { drained_ns: 0, done_ns: 0 };

    /// Rust's Instant is CLOCK_MONOTONIC on Linux but opaque: both are
    /// placed against one reading of the clock taken now.
    pub(super) fn of(drained: Instant, done: Instant) -> CqeTimes {
        let now = Instant::now();
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to write; CLOCK_MONOTONIC always exists.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
            return CqeTimes::NONE;
        }
        let mono = (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64);
        let at = |t: Instant| mono.saturating_sub(nanos(now.saturating_duration_since(t))).max(1);
        CqeTimes { drained_ns: at(drained), done_ns: at(done) }
    }
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
    // Before anything that may block in the driver: gpud ends with its
    // port even if the loop never looks at stdin again.
    hangup::watch(opts.device);
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
    let mut backend = backend::open(opts.backend, opts.device, opts.lane_sms)?;
    backend.set_pacing(opts.pacing);
    phases.mark_split("backend", &backend.startup_phases());
    // Waiting for the page tables counts in `segments`.
    segments.register_start(&mut *backend, opts.device)?;
    let name = backend.name().replace(['\n', '\r'], " ");
    let kind = backend.kind();
    let geo = *ring.geometry();
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
    d.modules.cpu_runs = opts.cpu_runs;
    if let Some(on) = opts.group_launches {
        d.group_launches = on;
    }
    for (slot, dir) in &opts.modules {
        if let Err(e) = d.modules.load(*slot, dir, &mut *d.backend) {
            log!(Error, "gpud[{}]: module in slot {slot} ({}): {e}", opts.device, dir.display());
        }
    }
    phases.mark("modules");
    // Segments the arena grows by from now on are registered off the loop.
    d.segments.register_off_loop();
    announce(&phases.protocol_line())?;
    announce(&format!("lane {}", d.backend.lane()))?;
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

/// A launch (or a put's or get's copy) the backend holds: its jobs are
/// answered when it is done.
struct InFlight {
    ticket: Ticket,
    /// The kernel launched; None for a copy.
    kernel: Option<KernelRef>,
    /// Every job of the launch is small ([`Job::is_small`]): such drains
    /// alone hold back a small job (wait.rs).
    small: bool,
    /// Its jobs' `user_data`, all an answer needs: the backend took what
    /// it runs at submit.
    jobs: Vec<u64>,
    /// A put's copy: the buffer it lands in.
    lands: Option<u64>,
    drain: u64,
    /// When its drain began, and when the backend took it (the stats'
    /// launch_* timings).
    drained: Instant,
    submitted: Instant,
    /// Of `submitted - drained`: the backend's submit call, and its driver
    /// calls that enqueue the launch (`Backend::last_enqueue`).
    backend: Duration,
    enqueue: Duration,
    /// A group launch: its jobs, and the bytes of shared input it reads
    /// once (the `group` line of its telemetry, complete.rs).
    group: Option<(u32, u64)>,
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
    /// Entries held back, in SQ order, until the segments they name are
    /// registered (see `drain`); and whether a segment became known since
    /// they were last looked at.
    parked: Vec<Sqe>,
    parked_ready: bool,
    /// Jobs of a kernel with group bodies form group launches
    /// (`--group-launches`; by default on the CPU backend only).
    group_launches: bool,
    /// Jobs held for companions (`{max_wait_us, W}`, see `submit`), each
    /// with the instant its wait ends; pushed back into the coalescer at
    /// the start of every drain.
    held: Vec<(Job, Instant)>,
    /// False while a drain must launch everything it has: it holds a
    /// control descriptor (a free, a module change) or makes room.
    may_hold: bool,
}

impl Drop for Daemon {
    /// The registration thread ends before the backend it registers with.
    fn drop(&mut self) {
        self.segments.stop_registering();
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
        let group_launches = backend.kind() == "cpu";
        let limit = buffers::limit_for(backend.buffer_memory().buf_capacity(), buffers::MemoryLimit::Default);
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
            parked: Vec::new(),
            parked_ready: false,
            group_launches,
            held: Vec::new(),
            may_hold: true,
        }
    }

    /// Sets the buffers' memory limit (`--memory-limit`, `--memory-fraction`).
    pub fn set_memory_limit(&mut self, limit: buffers::MemoryLimit) {
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

    /// Adds the time since `t` to the `work_ns` statistic.
    fn count_work(&self, t: Instant) {
        self.ring.stats().work_ns.fetch_add(nanos(t.elapsed()), Ordering::Relaxed);
    }

    /// Counts a step of `phase` that began at `t` as a stall if it took
    /// EC_STALL_NS or longer: every job that came meanwhile waited for it,
    /// and the counts per phase say which part of the loop a small job's
    /// tail came from (stats/1, `gpud_stalls_*`).
    fn count_stall(&self, phase: StallPhase, t: Instant) {
        let ns = nanos(t.elapsed());
        if ns < EC_STALL_NS {
            return;
        }
        let (s, i) = (self.ring.stats(), phase as usize);
        s.stalls[i].fetch_add(1, Ordering::Relaxed);
        s.stall_ns[i].fetch_add(ns, Ordering::Relaxed);
        s.stall_max_ns[i].fetch_max(ns, Ordering::Relaxed);
    }
}
