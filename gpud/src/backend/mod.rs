//! Backends: what actually runs a launch.
//!
//! A backend gets one call per kernel per drain with every job of that
//! kernel (see [`crate::coalesce`]). The call only *starts* the launch and
//! returns a [`Ticket`]; [`Backend::poll`] reports finished tickets, so the
//! daemon can drain, validate and submit the next batch while one runs on
//! the GPU. The CPU backend (`cpu.rs`) runs the launch inside `submit` and
//! reports it at the next poll; the CUDA backend (`cuda.rs`) returns as soon
//! as the launch is queued on a stream and reports it once its event fires.

pub mod cpu;
pub mod pace;
pub mod cuda;

use std::ptr::NonNull;

use crate::arena::Arena;
use crate::buffers::BufferMemory;
use crate::descriptor::{Job, KernelRef};
use crate::error::Result;
use crate::layout::ElemType;
use crate::modules::ModuleLoader;
use crate::ops::KernelOp;

/// Names one submitted launch until [`Backend::poll`] reports it done.
pub type Ticket = u64;

/// Drains whose launches may be on the backend at once (the daemon's
/// pipeline depth; the cuda backend keeps as many streams per kernel). Two
/// keeps the GPU fed (the next batch is queued behind the running one)
/// without splitting the SQ into many small launches while the GPU is busy
/// anyway.
pub const MAX_DRAINS_IN_FLIGHT: usize = 2;

/// What `--backend` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
    /// CUDA where a driver and a device exist, else CPU.
    Auto,
}

impl BackendKind {
    pub fn parse(s: &str) -> Option<BackendKind> {
        match s {
            "cpu" => Some(BackendKind::Cpu),
            "cuda" => Some(BackendKind::Cuda),
            "auto" => Some(BackendKind::Auto),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Auto => "auto",
        }
    }
}

/// One launch: every job of one kernel and element type (and, for a user's
/// kernel, geometry) from one drain.
pub struct Launch<'j> {
    pub kernel: KernelRef,
    /// The kernel's host side: `ops::op` of a built-in, a `UserOp` of a
    /// user's kernel.
    pub op: &'j (dyn KernelOp + Sync),
    pub ty: ElemType,
    pub jobs: &'j [Job],
    /// True when no job's output overlaps any region of another job in the
    /// launch, so the jobs may run concurrently. Validation only proves this
    /// within a job; [`crate::coalesce::independent`] proves it across them.
    pub independent: bool,
}

impl<'j> Launch<'j> {
    /// A launch of built-in `kernel`.
    pub fn builtin(kernel: crate::layout::Kernel, ty: ElemType, jobs: &'j [Job], independent: bool) -> Launch<'j> {
        Launch { kernel: KernelRef::Builtin(kernel), op: crate::ops::op(kernel), ty, jobs, independent }
    }
}

/// A backend also loads users' modules ([`ModuleLoader`]).
pub trait Backend: ModuleLoader {
    /// `cpu` or `cuda`: the second word of the `ready` line.
    fn kind(&self) -> &'static str;

    /// Human-readable device name: the rest of the `ready` line.
    fn name(&self) -> &str;

    /// Makes arena segment `seg` usable by later launches (the CUDA backend
    /// registers it with the driver). Called once per segment, segment 0
    /// first, before any launch that names it. `Err` is fatal.
    fn add_segment(&mut self, seg: usize, base: NonNull<u8>, bytes: u64) -> Result<()>;

    /// What registers segments on a thread of gpud's own, off its loop
    /// ([`crate::register`]), for segments that arrive while gpud serves.
    fn registrar(&self) -> Box<dyn Registrar>;

    /// Makes segment `seg` usable from a registration the registrar made
    /// (cheap: the slow part is done). Called on gpud's thread, once per
    /// segment, before any launch that names it. `Err` is fatal.
    fn adopt_segment(&mut self, seg: usize, reg: Registered) -> Result<()>;

    /// How long the steps of opening this backend took, in order (the
    /// startup profile, `crate::startup`); none by default.
    fn startup_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
        Vec::new()
    }

    /// Starts every job of `launch` and returns its ticket. The jobs are
    /// finished (outputs written) once [`Backend::poll`] has reported the
    /// ticket; until then gpud must not answer them.
    ///
    /// `Err` means the backend is unusable from now on; gpud then answers
    /// this launch's jobs and everything in flight with `DEVICE_ERROR` and
    /// exits.
    fn submit(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) -> Result<Ticket>;

    /// Of the last `submit`, the time in the driver calls that enqueued
    /// its steps (the stats' `launch_enqueue_ns`); zero where there is no
    /// driver.
    fn last_enqueue(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Where the last `submit`'s launch ran under an SM reservation: on
    /// every SM (`Some(true)`), on the SMs the lane leaves (`Some(false)`);
    /// None for a small launch, a copy, or no reservation.
    fn last_wide(&self) -> Option<bool> {
        None
    }

    /// The jobs of the finished launch `ticket` that faulted (by their
    /// `user_data`), taken: each is answered `KERNEL_FAULT` with its fault,
    /// the launch's other jobs as usual. Only the CPU backend runs GPU
    /// bodies checked; none by default.
    fn take_faults(&mut self, _ticket: Ticket) -> Vec<(u64, crate::kitjob::Fault)> {
        Vec::new()
    }

    /// Appends the tickets of launches and copies that have finished since
    /// the last call to `done` (in any order), and moves paced copies on.
    /// `Err` as for `submit`.
    fn poll(&mut self, done: &mut Vec<Ticket>) -> Result<()>;

    /// Launches and copies started and not yet reported by `poll`.
    fn in_flight(&self) -> usize;

    /// The raw memory of device buffers (the caching allocator in
    /// `buffers.rs` sits on it).
    fn buffer_memory(&mut self) -> &mut dyn BufferMemory;

    /// True when buffers live in host memory (see `Arena::with_host_buffers`).
    fn host_buffers(&self) -> bool;

    /// Starts copying `bytes` at host address `src` (arena memory, the
    /// put's own until it is answered) into the buffer block at `addr`,
    /// paced ([`pace`]); [`Backend::poll`] reports the ticket once the copy
    /// is done. Nothing in flight writes `addr`.
    fn copy_in(&mut self, addr: u64, src: *const u8, bytes: usize) -> Result<Ticket>;

    /// Starts copying `bytes` of the buffer block at `addr` into host
    /// address `dst` (arena memory, the get's own until it is answered),
    /// paced; reported by [`Backend::poll`] as for `copy_in`.
    fn copy_out(&mut self, addr: u64, dst: *mut u8, bytes: usize) -> Result<Ticket>;

    /// Copies started and not yet reported done (part of [`Backend::in_flight`]).
    fn copies_in_flight(&self) -> usize;

    /// Sets the copies' piece size and pieces in flight per direction.
    fn set_pacing(&mut self, pacing: pace::Pacing);

    /// How small launches are kept from waiting behind large ones: `none`,
    /// `priority` (a stream of the greatest priority), or `green <lane SMs>
    /// <other SMs>` (SMs of their own, and that priority). gpud says it
    /// before `ready`; `erlcuda:devices()` shows it.
    fn lane(&self) -> String {
        "none".into()
    }
}

/// Registers arena segments away from gpud's loop. Registered inline, a
/// segment the arena grew by held every other job for as long as its
/// registration took: small jobs' maxima of 123-176 ms beside large ones
/// matched registrations of 84-178 ms (H200; `bench/EXPERIMENTS.md`,
/// "Registration of segments the arena grows by while jobs run").
pub trait Registrar: Send {
    /// Registers `bytes` at `base` (mapped read-write until the daemon
    /// ends, page tables already populated); the result goes to
    /// [`Backend::adopt_segment`] on gpud's thread.
    fn register(&mut self, base: NonNull<u8>, bytes: u64) -> Result<Registered>;
}

/// A segment's registration, made by a [`Registrar`], not yet adopted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    pub base: NonNull<u8>,
    pub bytes: u64,
    /// The device's address of `base` (0 where the backend has none).
    pub dev: u64,
    /// The start of the range the backend registered (page-aligned around
    /// `base`; unregistered when the backend closes).
    pub reg_base: usize,
    /// The range's length, and the grid it was registered in pieces on
    /// (CUDA: a registration per piece of `REGISTER_PIECE`, cuda/memory.rs), or 0
    /// where it was registered whole.
    pub reg_bytes: usize,
    pub piece: usize,
    /// How long the registration took.
    pub took: std::time::Duration,
}

// SAFETY: addresses only; whoever dereferences `base` holds the mapping.
unsafe impl Send for Registered {}

/// Submits `launch` and waits until it is done: for tests and benchmarks.
pub fn run_to_completion(b: &mut dyn Backend, arena: &Arena<'_>, launch: &Launch<'_>) -> Result<()> {
    let t = b.submit(arena, launch)?;
    let mut done = Vec::new();
    loop {
        b.poll(&mut done)?;
        if done.contains(&t) {
            return Ok(());
        }
        std::hint::spin_loop();
    }
}

/// `gpud --probe`: which backend `kind` resolves to, and its device count.
pub fn probe(kind: BackendKind) -> Result<(&'static str, u32)> {
    match kind {
        BackendKind::Cpu => Ok(("cpu", 1)),
        BackendKind::Cuda => cuda::probe().map(|n| ("cuda", n)),
        BackendKind::Auto => match cuda::probe() {
            Ok(n) => Ok(("cuda", n)),
            Err(e) => {
                log!(Notice, "gpud: backend auto: {e}; using the CPU");
                Ok(("cpu", 1))
            }
        },
    }
}

/// SMs reserved for small launches unless told otherwise (`--lane-sms`):
/// the latency lane's share of the device, where the driver has green
/// contexts. 8, the H100's granularity (4 gave 8): in the lane sweep
/// (`run.sh lanes`, 20,000 small jobs a row, H100) the small jobs' p99
/// beside matmul 4096^3 from buffers fell from 773 us (off) to 34 us (8)
/// and 33 us (16), and no large kind lost more beside them than alone;
/// large launches take every SM while no small job runs (cuda/mod.rs
/// `Wide`), so the reservation costs nothing without small jobs.
pub const DEFAULT_LANE_SMS: Option<u32> = Some(8);

/// Opens the backend for device `device`, with `lane_sms` SMs reserved for
/// small launches where it can (None: none reserved). `Auto` tries CUDA
/// first (driver loadable, kernels built in, `device` present) and falls
/// back to the CPU.
pub fn open(kind: BackendKind, device: u32, lane_sms: Option<u32>) -> Result<Box<dyn Backend>> {
    match kind {
        BackendKind::Cpu => Ok(Box::new(cpu::CpuBackend::new(device))),
        BackendKind::Cuda => Ok(Box::new(cuda::CudaBackend::open(device, lane_sms)?)),
        BackendKind::Auto => match cuda::CudaBackend::open(device, lane_sms) {
            Ok(b) => Ok(Box::new(b)),
            Err(e) => {
                log!(Notice, "gpud[{device}]: backend auto: {e}; using the CPU");
                // The failed open dropped whatever it had made; a handle
                // still counted here is one it leaked.
                let held: Vec<_> = cuda::live_handles().into_iter().filter(|&(_, n)| n != 0).collect();
                if !held.is_empty() {
                    log!(Warning, "gpud[{device}]: backend auto: CUDA handles held after the failed open: {held:?}");
                }
                Ok(Box::new(cpu::CpuBackend::new(device)))
            }
        },
    }
}
