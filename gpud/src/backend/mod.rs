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
pub mod cuda;

use std::marker::PhantomData;
use std::ptr::NonNull;

use std::sync::Arc;

use crate::buffers::BufferMemory;
use crate::descriptor::{Job, KernelRef, Region};
use crate::error::Result;
use crate::layout::{ElemType, EC_MAX_SEGMENTS};
use crate::modules::UserKernel;
use crate::ops::KernelOp;

/// Names one submitted launch until [`Backend::poll`] reports it done.
pub type Ticket = u64;

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

/// The arena as the backends see it: every mapped segment's base pointer
/// and size, borrowed from the mappings for `'a`.
///
/// Regions handed out here come from validated [`Job`]s; the bounds check
/// is repeated anyway (it costs nothing next to the kernel) so that a region
/// validated against different segments can never reach past these.
#[derive(Clone)]
pub struct Arena<'a> {
    segs: [Option<(NonNull<u8>, u64)>; EC_MAX_SEGMENTS as usize],
    /// Device buffers are host memory (the cpu backend): a buffer region's
    /// offset is then its host address. Off for cuda, whose buffers no
    /// host code may touch.
    host_buffers: bool,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: the arena is plain memory; sharing the handle between rayon
// workers is sound because every access goes through `input`/`output`,
// whose callers guarantee that no two live slices conflict.
unsafe impl Send for Arena<'_> {}
unsafe impl Sync for Arena<'_> {}

impl<'a> Arena<'a> {
    /// An arena of segment 0 only.
    ///
    /// # Safety
    /// `base..base + bytes` must stay mapped readable and writable for `'a`,
    /// and `base` must be 8-byte aligned.
    pub unsafe fn from_raw(base: NonNull<u8>, bytes: u64) -> Arena<'a> {
        let mut a = Arena {
            segs: [None; EC_MAX_SEGMENTS as usize],
            host_buffers: false,
            _borrow: PhantomData,
        };
        // SAFETY: forwarded to the caller.
        unsafe { a.set_segment(0, base, bytes) };
        a
    }

    /// Adds (or replaces) segment `seg`.
    ///
    /// # Safety
    /// As for [`Arena::from_raw`]; `seg < EC_MAX_SEGMENTS`.
    pub unsafe fn set_segment(&mut self, seg: usize, base: NonNull<u8>, bytes: u64) {
        assert_eq!(base.as_ptr() as usize % 8, 0, "arena base must hold any element type");
        assert!(usize::try_from(bytes).is_ok());
        self.segs[seg] = Some((base, bytes));
    }

    /// An arena over ordinary memory, for tests and benchmarks.
    pub fn from_slice(buf: &'a mut [f64]) -> Arena<'a> {
        let bytes = std::mem::size_of_val(buf) as u64;
        // SAFETY: the mutable borrow keeps the buffer alive and unaliased for 'a.
        unsafe { Arena::from_raw(NonNull::from(buf).cast(), bytes) }
    }

    /// This arena's backend keeps device buffers in host memory (see
    /// `host_buffers`).
    pub fn with_host_buffers(mut self, yes: bool) -> Arena<'a> {
        self.host_buffers = yes;
        self
    }

    /// Size of segment 0.
    pub fn bytes(&self) -> u64 {
        self.segment(0).map_or(0, |(_, b)| b)
    }

    /// Base and size of segment `seg`, if it is there.
    pub fn segment(&self, seg: usize) -> Option<(NonNull<u8>, u64)> {
        self.segs.get(seg).copied().flatten()
    }

    /// The host address of `r`'s first byte (checked against its segment).
    pub fn host_ptr(&self, r: Region) -> *mut u8 {
        if r.is_buffer() {
            // A live buffer's block (buffers.rs keeps it until every launch
            // submitted before its free has finished), r.bytes() long.
            assert!(self.host_buffers, "region {r:?} is a device buffer, not host memory");
            return r.offset() as *mut u8;
        }
        let (base, bytes) = self
            .segment(r.segment())
            .unwrap_or_else(|| panic!("region {r:?} in a segment the arena lacks"));
        assert!(r.end() <= bytes, "region {r:?} outside its segment");
        // In bounds by the assert.
        base.as_ptr().wrapping_add(r.offset() as usize)
    }

    /// `r` as elements of `T`, whose size must be the region's element size.
    fn typed<T>(&self, r: Region) -> *mut T {
        assert_eq!(std::mem::size_of::<T>() as u64, r.elem_bytes(), "region {r:?} read as another type");
        let p = self.host_ptr(r);
        // Validation made offset % elem == 0; segment bases are page
        // aligned (mappings), so the pointer is aligned for T.
        assert_eq!(p as usize % std::mem::align_of::<T>(), 0, "region {r:?} misaligned");
        p.cast()
    }

    /// # Safety
    /// No `&mut` slice overlapping `r` may be live while the result is.
    pub unsafe fn input<T>(&self, r: Region) -> &[T] {
        // SAFETY: in bounds and aligned (see `typed`); no conflicting writer
        // per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.typed::<T>(r), r.len()) }
    }

    /// # Safety
    /// No other slice overlapping `r` may be live while the result is.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn output<T>(&self, r: Region) -> &mut [T] {
        // SAFETY: as for `input`, and exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.typed::<T>(r), r.len()) }
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

pub trait Backend {
    /// `cpu` or `cuda`: the second word of the `ready` line.
    fn kind(&self) -> &'static str;

    /// Human-readable device name: the rest of the `ready` line.
    fn name(&self) -> &str;

    /// Makes arena segment `seg` usable by later launches (the CUDA backend
    /// registers it with the driver). Called once per segment, segment 0
    /// first, before any launch that names it. `Err` is fatal.
    fn add_segment(&mut self, seg: usize, base: NonNull<u8>, bytes: u64) -> Result<()>;

    /// How long the steps of opening this backend took, in order (the
    /// startup profile, `crate::startup`); none by default.
    fn startup_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
        Vec::new()
    }

    /// Makes the device code of module `slot` ready for its kernels'
    /// launches (the CUDA backend loads the PTX and checks every declared
    /// entry; the CPU backend runs host code and needs nothing). Replaces
    /// what the slot held; nothing of the slot is in flight. `Err` refuses
    /// the module, with the reason; the backend serves on.
    fn load_module(&mut self, slot: u16, ptx: &str, kernels: &[Arc<UserKernel>]) -> std::result::Result<(), String>;

    /// Drops module `slot`'s device code; nothing of it is in flight.
    fn unload_module(&mut self, slot: u16);

    /// Starts every job of `launch` and returns its ticket. The jobs are
    /// finished (outputs written) once [`Backend::poll`] has reported the
    /// ticket; until then gpud must not answer them.
    ///
    /// `Err` means the backend is unusable from now on; gpud then answers
    /// this launch's jobs and everything in flight with `DEVICE_ERROR` and
    /// exits.
    fn submit(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) -> Result<Ticket>;

    /// Appends the tickets of launches that have finished since the last
    /// call to `done` (in any order). `Err` as for `submit`.
    fn poll(&mut self, done: &mut Vec<Ticket>) -> Result<()>;

    /// Launches submitted and not yet reported by `poll`.
    fn in_flight(&self) -> usize;

    /// The raw memory of device buffers (the caching allocator in
    /// `buffers.rs` sits on it).
    fn buffer_memory(&mut self) -> &mut dyn BufferMemory;

    /// True when buffers live in host memory (see `Arena::with_host_buffers`).
    fn host_buffers(&self) -> bool;

    /// Copies `src` (arena memory) into the buffer block at `addr`, and
    /// returns once the copy is done. Nothing in flight writes `addr`.
    fn buf_write(&mut self, addr: u64, src: &[u8]) -> Result<()>;

    /// Copies the buffer block at `addr` into `dst` (arena memory), and
    /// returns once the copy is done.
    fn buf_read(&mut self, addr: u64, dst: &mut [u8]) -> Result<()>;
}

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

/// Opens the backend for device `device`. `Auto` tries CUDA first (driver
/// loadable, kernels built in, `device` present) and falls back to the CPU.
pub fn open(kind: BackendKind, device: u32) -> Result<Box<dyn Backend>> {
    match kind {
        BackendKind::Cpu => Ok(Box::new(cpu::CpuBackend::new(device))),
        BackendKind::Cuda => Ok(Box::new(cuda::CudaBackend::open(device)?)),
        BackendKind::Auto => match cuda::CudaBackend::open(device) {
            Ok(b) => Ok(Box::new(b)),
            Err(e) => {
                log!(Notice, "gpud[{device}]: backend auto: {e}; using the CPU");
                Ok(Box::new(cpu::CpuBackend::new(device)))
            }
        },
    }
}
