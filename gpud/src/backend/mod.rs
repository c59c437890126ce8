//! Backends: what actually runs a launch.
//!
//! A backend gets one call per kernel per drain with every job of that
//! kernel (see [`crate::coalesce`]) and answers one [`Status`] per job. The
//! CPU backend lives in `cpu.rs`; a CUDA backend (cudarc with the driver
//! loaded at run time) goes in `cuda.rs` next to it and plugs in through
//! [`open`] and [`probe`] without touching the ring code.

pub mod cpu;

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::descriptor::{Job, Region};
use crate::error::{Error, Result};
use crate::layout::{Kernel, Status};

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

/// The arena as the backends see it: a base pointer and a size, borrowed
/// from the mapping for `'a`.
///
/// Regions handed out here come from validated [`Job`]s; the bounds check
/// is repeated anyway (it costs nothing next to the kernel) so that a region
/// validated against a different arena can never reach past this one.
pub struct Arena<'a> {
    base: NonNull<u8>,
    bytes: u64,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: the arena is plain memory; sharing the handle between rayon
// workers is sound because every access goes through `input`/`output`,
// whose callers guarantee that no two live slices conflict.
unsafe impl Send for Arena<'_> {}
unsafe impl Sync for Arena<'_> {}

impl<'a> Arena<'a> {
    /// # Safety
    /// `base..base + bytes` must stay mapped readable and writable for `'a`,
    /// and `base` must be 4-byte aligned.
    pub unsafe fn from_raw(base: NonNull<u8>, bytes: u64) -> Arena<'a> {
        assert_eq!(base.as_ptr() as usize % 4, 0, "arena base must hold f32");
        assert!(usize::try_from(bytes).is_ok());
        Arena {
            base,
            bytes,
            _borrow: PhantomData,
        }
    }

    /// An arena over ordinary memory, for tests and benchmarks.
    pub fn from_slice(buf: &'a mut [f32]) -> Arena<'a> {
        let bytes = std::mem::size_of_val(buf) as u64;
        // SAFETY: the mutable borrow keeps the buffer alive and unaliased for 'a.
        unsafe { Arena::from_raw(NonNull::from(buf).cast(), bytes) }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn ptr(&self, r: Region) -> *mut f32 {
        assert!(r.end() <= self.bytes, "region {r:?} outside the arena");
        // In bounds by the assert; offset % 4 == 0 by validation and the base
        // is 4-aligned, so the pointer is aligned for f32.
        self.base.as_ptr().wrapping_add(r.offset() as usize).cast()
    }

    /// # Safety
    /// No `&mut` slice overlapping `r` may be live while the result is.
    pub unsafe fn input(&self, r: Region) -> &[f32] {
        // SAFETY: in bounds and aligned (see `ptr`); no conflicting writer
        // per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr(r), r.len()) }
    }

    /// # Safety
    /// No other slice overlapping `r` may be live while the result is.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn output(&self, r: Region) -> &mut [f32] {
        // SAFETY: as for `input`, and exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(r), r.len()) }
    }
}

/// One launch: every job of one kernel from one drain.
pub struct Launch<'j> {
    pub kernel: Kernel,
    pub jobs: &'j [Job],
    /// True when no job's output overlaps any region of another job in the
    /// launch, so the jobs may run concurrently. Validation only proves this
    /// within a job; [`crate::coalesce::independent`] proves it across them.
    pub independent: bool,
}

pub trait Backend {
    /// `cpu` or `cuda`: the second word of the `ready` line.
    fn kind(&self) -> &'static str;

    /// Human-readable device name: the rest of the `ready` line.
    fn name(&self) -> &str;

    /// Runs every job of `launch` and writes one status per job into
    /// `status` (same length as `launch.jobs`, prefilled with `Ok`).
    ///
    /// `Err` means the backend is unusable from now on; gpud then answers
    /// the launch's jobs with `DEVICE_ERROR` and exits.
    fn launch(&mut self, arena: &Arena<'_>, launch: &Launch<'_>, status: &mut [Status])
        -> Result<()>;
}

/// `gpud --probe`: which backend `kind` resolves to, and its device count.
pub fn probe(kind: BackendKind) -> Result<(&'static str, u32)> {
    match kind {
        BackendKind::Cpu | BackendKind::Auto => Ok(("cpu", 1)),
        BackendKind::Cuda => Err(Error::NoCudaBackend),
    }
}

/// Opens the backend for device `device`. When `cuda.rs` lands, `Auto`
/// tries it first (driver loadable and `device` present) and falls back to
/// the CPU; `Cuda` fails with [`Error::NoCudaBackend`] only then.
pub fn open(kind: BackendKind, device: u32) -> Result<Box<dyn Backend>> {
    match kind {
        BackendKind::Cpu | BackendKind::Auto => Ok(Box::new(cpu::CpuBackend::new(device))),
        BackendKind::Cuda => Err(Error::NoCudaBackend),
    }
}
