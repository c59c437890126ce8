//! Reductions with an operator (cubek's shape): a [`ReduceOp`] is an
//! identity and an associative `combine`, over an item that is an element
//! ([`Sum`], [`Max`], [`Min`], a user's [`Op`]) or a (value, index) pair
//! ([`ArgMax`], [`ArgMin`]).
//!
//! The same operator serves a thread's own loop ([`fold`]), a warp
//! ([`crate::warp::reduce`], [`crate::warp::inclusive_scan`]) and a block
//! ([`crate::block::reduce`], [`crate::block::inclusive_scan`],
//! [`crate::block::exclusive_scan`]). [`fold`], [`inclusive_scan`] and
//! [`exclusive_scan`] over a slice are the host meaning of the warp and
//! block forms: what they compute over the values of a warp or block, in
//! lane/thread order.
//!
//! `combine(a, b)` always gets the earlier item (lower index) as `a`, so an
//! operator need not be commutative. Floating-point sums are grouped
//! differently on the GPU (a tree) than by [`fold`] (left to right): equal
//! up to rounding.

use crate::element::Numeric;
use core::marker::PhantomData;

/// An associative operator with its identity.
pub trait ReduceOp: Copy {
    type Item: Copy;
    /// `combine(identity(), x) == combine(x, identity()) == x`.
    fn identity(&self) -> Self::Item;
    /// `a` precedes `b` in index order.
    fn combine(&self, a: Self::Item, b: Self::Item) -> Self::Item;
}

macro_rules! unit_op {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        pub struct $name<T>(PhantomData<T>);
        impl<T> $name<T> {
            pub const fn new() -> Self {
                $name(PhantomData)
            }
        }
        impl<T> Default for $name<T> {
            fn default() -> Self {
                Self::new()
            }
        }
        impl<T> Clone for $name<T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for $name<T> {}
    };
}

unit_op!(
    /// `a + b` from zero.
    Sum
);
unit_op!(
    /// The largest, from [`Numeric::LOWEST`]; floats by IEEE maxNum: a NaN
    /// is ignored (all NaN gives `-inf`, the identity).
    Max
);
unit_op!(
    /// The smallest, from [`Numeric::HIGHEST`]; floats by IEEE minNum.
    Min
);
unit_op!(
    /// `(value, index)` of the largest value: ties go to the lower index and
    /// NaN never wins. With no non-NaN item the result is the identity
    /// `(LOWEST, u32::MAX)`.
    ArgMax
);
unit_op!(
    /// `(value, index)` of the smallest value, as [`ArgMax`]; the identity
    /// is `(HIGHEST, u32::MAX)`.
    ArgMin
);

impl<T: Numeric> ReduceOp for Sum<T> {
    type Item = T;
    #[inline(always)]
    fn identity(&self) -> T {
        T::ZERO
    }
    #[inline(always)]
    fn combine(&self, a: T, b: T) -> T {
        a.wrapping_add(b)
    }
}

impl<T: Numeric> ReduceOp for Max<T> {
    type Item = T;
    #[inline(always)]
    fn identity(&self) -> T {
        T::LOWEST
    }
    #[inline(always)]
    fn combine(&self, a: T, b: T) -> T {
        a.maximum(b)
    }
}

impl<T: Numeric> ReduceOp for Min<T> {
    type Item = T;
    #[inline(always)]
    fn identity(&self) -> T {
        T::HIGHEST
    }
    #[inline(always)]
    fn combine(&self, a: T, b: T) -> T {
        a.minimum(b)
    }
}

/// Whether `b` should replace `a` as the arg-extremum: `better(vb, va)`
/// says b's value is strictly better. NaN (the only value unequal to
/// itself) never wins and loses to any other value; equal values go to the
/// lower index.
/// Two NaN give `identity`: a NaN item counts as no item, so every
/// grouping of an all-NaN input gives the identity.
#[inline(always)]
#[allow(clippy::eq_op)]
fn arg_pick<T: Numeric>(a: (T, u32), b: (T, u32), identity: (T, u32), better: impl Fn(T, T) -> bool) -> (T, u32) {
    let ((va, ia), (vb, ib)) = (a, b);
    if vb != vb {
        return if va != va { identity } else { a };
    }
    if va != va || better(vb, va) || (vb == va && ib < ia) {
        b
    } else {
        a
    }
}

impl<T: Numeric> ReduceOp for ArgMax<T> {
    type Item = (T, u32);
    #[inline(always)]
    fn identity(&self) -> (T, u32) {
        (T::LOWEST, u32::MAX)
    }
    #[inline(always)]
    fn combine(&self, a: (T, u32), b: (T, u32)) -> (T, u32) {
        arg_pick(a, b, self.identity(), |x, y| x > y)
    }
}

impl<T: Numeric> ReduceOp for ArgMin<T> {
    type Item = (T, u32);
    #[inline(always)]
    fn identity(&self) -> (T, u32) {
        (T::HIGHEST, u32::MAX)
    }
    #[inline(always)]
    fn combine(&self, a: (T, u32), b: (T, u32)) -> (T, u32) {
        arg_pick(a, b, self.identity(), |x, y| x < y)
    }
}

/// A user's operator: `f` associative, `identity` its identity
/// (CuPy's `ReductionKernel` reduce expression and identity).
///
/// ```
/// use erlcuda_kernel::reduce::{fold, Op};
/// // The product of the items.
/// let prod = Op::new(1.0f64, |a, b| a * b);
/// assert_eq!(fold(prod, [2.0, 3.0, 4.0]), 24.0);
/// ```
#[derive(Clone, Copy)]
pub struct Op<T, F> {
    pub identity: T,
    pub f: F,
}

impl<T: Copy, F: Fn(T, T) -> T + Copy> Op<T, F> {
    pub const fn new(identity: T, f: F) -> Self {
        Op { identity, f }
    }
}

impl<T: Copy, F: Fn(T, T) -> T + Copy> ReduceOp for Op<T, F> {
    type Item = T;
    #[inline(always)]
    fn identity(&self) -> T {
        self.identity
    }
    #[inline(always)]
    fn combine(&self, a: T, b: T) -> T {
        (self.f)(a, b)
    }
}

/// The items combined left to right from the identity: a thread's own
/// loop, and the host meaning of a warp or block reduce.
#[inline(always)]
pub fn fold<R: ReduceOp>(op: R, items: impl IntoIterator<Item = R::Item>) -> R::Item {
    items.into_iter().fold(op.identity(), |a, b| op.combine(a, b))
}

/// `out[i] = items[0] ∘ … ∘ items[i]`: the host meaning of
/// [`crate::block::inclusive_scan`]. `out` as long as `items`.
pub fn inclusive_scan<R: ReduceOp>(op: R, items: &[R::Item], out: &mut [R::Item]) {
    assert_eq!(items.len(), out.len());
    let mut acc = op.identity();
    for (o, &x) in out.iter_mut().zip(items) {
        acc = op.combine(acc, x);
        *o = acc;
    }
}

/// `out[i] = items[0] ∘ … ∘ items[i-1]` (`out[0]` the identity): the host
/// meaning of [`crate::block::exclusive_scan`].
pub fn exclusive_scan<R: ReduceOp>(op: R, items: &[R::Item], out: &mut [R::Item]) {
    assert_eq!(items.len(), out.len());
    let mut acc = op.identity();
    for (o, &x) in out.iter_mut().zip(items) {
        *o = acc;
        acc = op.combine(acc, x);
    }
}
