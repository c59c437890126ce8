//! The arena as host code sees it: every mapped segment's base and size,
//! and typed slices of validated regions. Below the backends and the ops,
//! which both read jobs' data through it.

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::descriptor::{ArgsMemory, Region};
use crate::layout::{JobArgs, EC_MAX_SEGMENTS};

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

impl ArgsMemory for Arena<'_> {
    fn copy_args(&self, r: Region) -> JobArgs {
        assert_eq!(r.bytes(), std::mem::size_of::<JobArgs>() as u64, "a record region is one ec_job_args");
        let p = self.host_ptr(r);
        assert_eq!(p as usize % std::mem::align_of::<JobArgs>(), 0, "record {r:?} misaligned");
        // SAFETY: in bounds (host_ptr) and aligned (asserted); any bytes
        // are a JobArgs (Pod). One volatile read of the whole record: the
        // VM may write the arena meanwhile, and what is validated is this
        // copy, never the memory again.
        unsafe { std::ptr::read_volatile(p.cast::<JobArgs>()) }
    }
}
