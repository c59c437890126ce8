//! [`Args`]: one job of a kernel, for the bodies of `kernel!` and
//! `table!` kernels (the `k` they name) and the kit's own drivers. The
//! same accessors on both targets; the host adds slices.
//!
//! Slots and parameters are the job's ([`crate::job`]): slot `i <
//! MAX_VECTORS` is the i-th v or io argument, slot `MAX_VECTORS + j` the
//! j-th output ([`Job::out_slot`]); `param(i)` the i-th s or d argument,
//! all in declared order.

use crate::element::Element;
use crate::job::Job;
use crate::manifest::Layout;
use core::marker::PhantomData;

/// The first output's slot.
const OUT0: usize = Job::out_slot(0);

/// One job of a kernel whose type T is `T` (`()` for a kernel with no
/// T), read through its [`Layout`].
pub struct Args<'a, T> {
    job: &'a Job,
    layout: &'a Layout,
    _t: PhantomData<T>,
}

impl<T> Clone for Args<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Args<'_, T> {}

#[allow(clippy::len_without_is_empty)]
impl<'a, T> Args<'a, T> {
    /// # Safety
    /// `job` is a job of a kernel with this layout, run with this T: each
    /// slot's address points to `len` elements of the slot's type, valid
    /// for the whole body (device addresses on the GPU), outputs disjoint
    /// from every other slot.
    #[inline(always)]
    pub unsafe fn new(job: &'a Job, layout: &'a Layout) -> Self {
        Args { job, layout, _t: PhantomData }
    }

    /// The raw job.
    #[inline(always)]
    pub fn job(&self) -> &'a Job {
        self.job
    }

    /// The kernel's layout (how many of each kind of argument).
    #[inline(always)]
    pub fn layout(&self) -> &'a Layout {
        self.layout
    }

    /// Slot `slot`'s length, in elements of its type.
    #[inline(always)]
    pub fn len(&self, slot: usize) -> u64 {
        self.job.len[slot] as u64
    }

    /// Slot `slot`'s address (a device address on the GPU).
    #[inline(always)]
    pub fn addr(&self, slot: usize) -> u64 {
        self.job.addr[slot]
    }

    /// Slot `slot`'s address as a pointer to elements of type `R`.
    #[inline(always)]
    pub fn ptr<R>(&self, slot: usize) -> *mut R {
        self.job.addr[slot] as *mut R
    }

    /// Parameter `i`, raw: the i-th s or d argument (a float as f64 bits,
    /// an integer as an s64, a dimension as a u64).
    #[inline(always)]
    pub fn param(&self, i: usize) -> u64 {
        self.job.param[i]
    }

    /// Scalar parameter `i` (the i-th s or d argument) as an `R`
    /// ([`Element::from_param`]).
    #[inline(always)]
    pub fn param_as<R: Element>(&self, i: usize) -> R {
        R::from_param(self.job.param[i])
    }

    /// Dimension argument `i`, counted among the `d`s from 0.
    #[inline(always)]
    pub fn dim(&self, i: usize) -> u32 {
        assert!(i < self.layout.dims as usize);
        self.job.param[self.layout.dim_at[i] as usize] as u32
    }

    /// The first vector argument's length (every vector's, for the
    /// fixed-shape macros: their `n`).
    #[inline(always)]
    pub fn n(&self) -> u64 {
        self.len(0)
    }

    /// The first output's length.
    #[inline(always)]
    pub fn out_len(&self) -> u64 {
        self.len(OUT0)
    }

    /// Vector argument `i` (slot `i`) as elements of T.
    #[inline(always)]
    pub fn input(&self, i: usize) -> *const T {
        assert!(i < self.layout.vectors as usize);
        self.ptr::<T>(i)
    }

    /// The first output as elements of T.
    #[inline(always)]
    pub fn output(&self) -> *mut T {
        self.ptr::<T>(OUT0)
    }

    /// Slot `slot` as a slice of its `len` elements of `R`.
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    pub fn slice<R>(&self, slot: usize) -> &'a [R] {
        // Untagged: a GPU body run checked (crate::emu) gets tagged
        // addresses, which a slice cannot hold; its accesses go unchecked.
        // SAFETY: `new`'s contract.
        unsafe { slice(crate::emu::untag(self.addr(slot)) as *const R, self.len(slot)) }
    }

    /// Slot `slot` as a mutable slice of its `len` elements of `R`.
    ///
    /// # Safety
    /// At most one slice of the slot is alive at a time, and the slot
    /// overlaps no other one in use.
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    pub unsafe fn slice_mut<R>(&self, slot: usize) -> &'a mut [R] {
        slice_mut(crate::emu::untag(self.addr(slot)) as *mut R, self.len(slot))
    }

    /// Vector argument `i` as a slice of T.
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    pub fn input_slice(&self, i: usize) -> &'a [T] {
        assert!(i < self.layout.vectors as usize);
        self.slice::<T>(i)
    }

    /// The first output as a slice of T.
    ///
    /// # Safety
    /// As [`Args::slice_mut`] (a `kernel!` body already holds its outputs
    /// by name).
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    pub unsafe fn output_slice(&self) -> &'a mut [T] {
        self.slice_mut::<T>(OUT0)
    }
}

impl<T: Element> Args<'_, T> {
    /// Scalar argument `i`, counted among the `s`s from 0, as T.
    #[inline(always)]
    pub fn scalar(&self, i: usize) -> T {
        assert!(i < self.layout.scalars as usize);
        T::from_param(self.job.param[self.layout.scalar_at[i] as usize])
    }
}

/// The `s` arguments of an `elementwise!`/`reduction!` job (which takes
/// no `d`): parameters `0..NS`, as T.
#[inline(always)]
pub(crate) fn scalars<T: Element, const NS: usize>(job: &Job) -> [T; NS] {
    core::array::from_fn(|i| T::from_param(job.param[i]))
}

/// `len` elements at `p`; an empty slice for `len == 0` whatever `p` is
/// (a job's unused or empty slots may be null).
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

/// The jobs of one group launch, for a `kernel!`'s group bodies (the `g`
/// they name): jobs of one kernel and type whose `shared` arguments are
/// the same device buffer and whose `same_d`/`same_s` arguments are equal
/// (gpud formed the group by exactly that). On the GPU, a virtual block's
/// share of the group (at most `jobs_per_block` jobs); on the host, the
/// whole group.
pub struct Group<'a, T> {
    jobs: *const Job,
    n: u32,
    layout: &'a Layout,
    _t: PhantomData<T>,
}

impl<T> Clone for Group<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Group<'_, T> {}

#[allow(clippy::len_without_is_empty)]
impl<'a, T> Group<'a, T> {
    /// # Safety
    /// `jobs[..n]` are jobs as [`Args::new`] takes them (n ≥ 1), valid for
    /// `'a`, whose outputs overlap no slot of any of them.
    #[inline(always)]
    pub unsafe fn new(jobs: *const Job, n: u32, layout: &'a Layout) -> Self {
        Group { jobs, n, layout, _t: PhantomData }
    }

    /// Jobs in the group (at least 1).
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.n
    }

    /// Job `i` (`i < len()`).
    #[inline(always)]
    pub fn job(&self, i: u32) -> Args<'a, T> {
        assert!(i < self.n);
        // SAFETY: `new`'s contract, for each of its jobs.
        unsafe { Args::new(&*self.jobs.add(i as usize), self.layout) }
    }
}
