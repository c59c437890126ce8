//! The order in which `argmax_rows` and `topk_rows` rank a row's elements,
//! one definition for both backends (so ties and NaN come out the same):
//! larger values first; every number before every NaN ("NaN never wins":
//! a NaN is taken only when no number is left); equal values, and NaNs
//! among themselves, by lower index. +0.0 and −0.0 are equal. It is a
//! strict total order on (value, index) items, so a row's best item, or its
//! best K in order, is one definite answer whatever order they are
//! combined in (a GPU tree, a CPU loop).
//!
//! Index [`NONE`] marks "no item": it ranks after every item, and it is
//! what an empty row (cols = 0) and the slots past a row's length give.

use core::marker::PhantomData;
use erlcuda_kernel::reduce::ReduceOp;
use erlcuda_kernel::Numeric;

/// The index of "no item".
pub const NONE: u32 = u32::MAX;

/// Whether item `a` ranks strictly before item `b`.
///
/// Written with `&`/`|` on the conditions rather than branches: on the GPU
/// it is a few predicates and no divergence. A comparison with NaN is
/// false, so `a.0 > b.0` and `a.0 == b.0` already leave NaN out.
#[inline(always)]
#[allow(clippy::eq_op, clippy::nonminimal_bool)]
pub fn before<T: Numeric>(a: (T, u32), b: (T, u32)) -> bool {
    // NaN is the only value unequal to itself (never, for integers).
    let (a_nan, b_nan) = (a.0 != a.0, b.0 != b.0);
    let lower = a.1 < b.1;
    (a.1 != NONE) & ((b.1 == NONE) | (a.0 > b.0) | ((a.0 == b.0) & lower) | (b_nan & (!a_nan | lower)))
}

/// The best `keep` items met so far, in [`before`]'s order, one item at a
/// time: the CPU bodies' top-K (`topk_rows`, `cos_topk`), N its room.
pub struct TopK<T, const N: usize> {
    list: [(T, u32); N],
    len: usize,
    keep: usize,
}

impl<T: Numeric, const N: usize> TopK<T, N> {
    pub fn new(keep: usize) -> Self {
        TopK { list: [(T::LOWEST, NONE); N], len: 0, keep: keep.min(N) }
    }

    /// Takes `it` where it ranks; when full, the last one drops out.
    #[inline]
    pub fn push(&mut self, it: (T, u32)) {
        let (keep, len) = (self.keep, self.len);
        if keep == 0 || (len == keep && !before(it, self.list[keep - 1])) {
            return;
        }
        let mut p = if len < keep { len } else { keep - 1 };
        while p > 0 && before(it, self.list[p - 1]) {
            self.list[p] = self.list[p - 1];
            p -= 1;
        }
        self.list[p] = it;
        self.len += (len < keep) as usize;
    }

    /// The items in order into `vals` and `idxs`; the slots past them get
    /// "no item" ([`NONE`], the type's lowest value).
    pub fn write(&self, vals: &mut [T], idxs: &mut [u32]) {
        for (i, (v, ix)) in vals.iter_mut().zip(idxs.iter_mut()).enumerate() {
            (*v, *ix) = if i < self.len { self.list[i] } else { (T::LOWEST, NONE) };
        }
    }
}

/// [`before`]`((v, i), best)` for an index i above `best`'s (a loop
/// meeting a row's elements in increasing order): a tie keeps `best`.
#[inline(always)]
#[allow(clippy::eq_op)]
pub fn beats_earlier<T: Numeric>(v: T, best: (T, u32)) -> bool {
    (best.1 == NONE) | (v > best.0) | ((best.0 != best.0) & (v == v))
}

/// The first item in [`before`]'s order, as a reduction (for the kit's
/// warp and block reductions); the identity is "no item".
pub struct First<T>(PhantomData<T>);

impl<T> First<T> {
    pub const fn new() -> Self {
        First(PhantomData)
    }
}

impl<T> Default for First<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for First<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for First<T> {}

impl<T: Numeric> ReduceOp for First<T> {
    type Item = (T, u32);
    #[inline(always)]
    fn identity(&self) -> (T, u32) {
        (T::LOWEST, NONE)
    }
    #[inline(always)]
    fn combine(&self, a: (T, u32), b: (T, u32)) -> (T, u32) {
        if before(b, a) {
            b
        } else {
            a
        }
    }
}
