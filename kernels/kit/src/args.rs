//! [`Args`]: a job's arguments, typed, for the bodies of `table!` kernels
//! (and the kit's own drivers). The same accessors on both targets; the
//! host adds slices.

use crate::job::Job;
use crate::manifest::Layout;
use crate::Float;
use core::marker::PhantomData;

/// One job of a kernel with element type `T` and argument layout `layout`
/// (its signature's, [`Layout::of`]).
#[derive(Clone, Copy)]
pub struct Args<'a, T> {
    job: &'a Job,
    layout: &'a Layout,
    _t: PhantomData<T>,
}

impl<'a, T: Float> Args<'a, T> {
    /// # Safety
    /// `job` is a job of a kernel with this layout and element type: its
    /// addresses point to `n` (inputs) and `out_len` (output) elements of
    /// `T`, valid for the whole body (device addresses on the GPU).
    #[inline(always)]
    pub unsafe fn new(job: &'a Job, layout: &'a Layout) -> Self {
        Args { job, layout, _t: PhantomData }
    }

    /// The raw job.
    #[inline(always)]
    pub fn job(&self) -> &'a Job {
        self.job
    }

    /// Length of every vector argument, in elements.
    #[inline(always)]
    pub fn n(&self) -> u64 {
        self.job.n
    }

    /// Length of the output, in elements (the kernel's `out` rule).
    #[inline(always)]
    pub fn out_len(&self) -> u64 {
        self.job.out_len
    }

    /// Vector argument `i` (counted among the `v`s from 0).
    #[inline(always)]
    pub fn input(&self, i: usize) -> *const T {
        assert!(i < self.layout.vectors);
        self.job.vec[i] as *const T
    }

    /// The output.
    #[inline(always)]
    pub fn output(&self) -> *mut T {
        self.job.out as *mut T
    }

    /// Scalar argument `i` (counted among the `s`s from 0), rounded to `T`.
    #[inline(always)]
    pub fn scalar(&self, i: usize) -> T {
        assert!(i < self.layout.scalars);
        T::from_f64(param_f64(self.job, self.layout.scalar_at[i]))
    }

    /// Dimension argument `i` (counted among the `d`s from 0).
    #[inline(always)]
    pub fn dim(&self, i: usize) -> u32 {
        assert!(i < self.layout.dims);
        param_u32(self.job, self.layout.dim_at[i])
    }

    /// Vector argument `i` as a slice of `n` elements.
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    pub fn input_slice(&self, i: usize) -> &'a [T] {
        // SAFETY: `new`'s contract.
        unsafe { slice(self.input(i), self.job.n) }
    }

    /// The output as a slice of `out_len` elements.
    ///
    /// # Safety
    /// At most one such slice is alive at a time.
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    pub unsafe fn output_slice(&self) -> &'a mut [T] {
        slice_mut(self.output(), self.job.out_len)
    }
}

/// The f64 at byte `off` of the job's parameter area: one 8-byte load
/// (`Job::param_f64` assembles bytes, which the GPU would do one by one).
#[inline(always)]
pub fn param_f64(job: &Job, off: usize) -> f64 {
    // SAFETY: off + 8 <= PARAM_BYTES (Layout::of checked the signature).
    unsafe { job.params.as_ptr().add(off).cast::<f64>().read_unaligned() }
}

/// The u32 at byte `off` of the job's parameter area.
#[inline(always)]
pub fn param_u32(job: &Job, off: usize) -> u32 {
    // SAFETY: off + 4 <= PARAM_BYTES (Layout::of checked the signature).
    unsafe { job.params.as_ptr().add(off).cast::<u32>().read_unaligned() }
}

/// The scalars at `offs`, rounded to `T`.
#[inline(always)]
pub fn scalars<T: Float, const N: usize>(job: &Job, offs: &[usize; N]) -> [T; N] {
    core::array::from_fn(|i| T::from_f64(param_f64(job, offs[i])))
}

/// `len` elements at `p`; an empty slice for `len == 0` whatever `p` is
/// (a job's unused or empty vectors may be null).
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: u64) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    core::slice::from_raw_parts(p, len as usize)
}

#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub(crate) unsafe fn slice_mut<'a, T>(p: *mut T, len: u64) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    core::slice::from_raw_parts_mut(p, len as usize)
}
