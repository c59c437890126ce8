//! Warp primitives (cuda_std's `warp`, CubeCL's plane operations): votes,
//! ballots, shuffles of any element type (or an operator's item, such as
//! ArgMax's pair), and reductions and scans with any [`ReduceOp`].
//!
//! Every function is for the full warp: all 32 lanes call it together
//! (member mask `0xffffffff`), as in a block whose size is a multiple of
//! 32. On the host the same functions run in a GPU body run on the CPU
//! ([`crate::emu`]: the lanes meet, then each reads the exchanged values);
//! the `_of` forms take a warp's 32 (or fewer) values as a slice, in lane
//! order, and return what the GPU form returns: [`ballot_of`] the bits,
//! [`all_of`] and [`any_of`] the vote, [`reduce_of`] the combined items.

use crate::reduce::ReduceOp;

/// Threads per warp.
pub const SIZE: u32 = 32;

/// A value the lanes of a warp can exchange: every [`crate::Element`], and
/// pairs of them (an arg-reduction's `(value, index)`). A user's operator
/// over its own type implements it by shuffling the type's fields.
pub trait Lanes: Copy {
    /// The value of the lane `how` and `arg` name (see [`Shfl`]).
    #[cfg(target_arch = "nvptx64")]
    fn shuffle(self, how: Shfl, arg: u32) -> Self;
    /// The same in a GPU body run on the CPU, called from `site`.
    #[cfg(not(target_arch = "nvptx64"))]
    fn shuffle_at(self, how: Shfl, arg: u32, site: &'static core::panic::Location<'static>) -> Self;
}

/// Which lane a shuffle reads (PTX `shfl.sync` modes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Shfl {
    /// Lane `arg`.
    Idx,
    /// Lane `lane - arg`; lanes below `arg` keep their own value.
    Up,
    /// Lane `lane + arg`; lanes past 31 − `arg` keep their own value.
    Down,
    /// Lane `lane ^ arg`.
    Xor,
}

// The shuffles and votes are LLVM's intrinsics, not `asm!`: calls of
// intrinsics are `convergent`, so LLVM never sinks one into a branch only
// some lanes take (an `asm!` it may: a pure shuffle whose result is used in
// one branch only would be moved there, and the lanes outside it would
// never join it).
#[cfg(target_arch = "nvptx64")]
unsafe extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn shfl_idx_i32(mask: u32, v: u32, lane: u32, c: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.up.i32"]
    fn shfl_up_i32(mask: u32, v: u32, delta: u32, c: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.down.i32"]
    fn shfl_down_i32(mask: u32, v: u32, delta: u32, c: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn shfl_bfly_i32(mask: u32, v: u32, mask_: u32, c: u32) -> u32;
    #[link_name = "llvm.nvvm.vote.ballot.sync"]
    fn vote_ballot(mask: u32, pred: bool) -> u32;
    #[link_name = "llvm.nvvm.vote.all.sync"]
    fn vote_all(mask: u32, pred: bool) -> bool;
    #[link_name = "llvm.nvvm.vote.any.sync"]
    fn vote_any(mask: u32, pred: bool) -> bool;
}

/// The full warp.
#[cfg(target_arch = "nvptx64")]
const FULL: u32 = 0xffff_ffff;

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn shfl32(how: Shfl, x: u32, arg: u32) -> u32 {
    // `c` is 0x1f (clamp at lane 31) except for `up`, whose lower bound is
    // lane 0 (c = 0).
    unsafe {
        match how {
            Shfl::Idx => shfl_idx_i32(FULL, x, arg, 0x1f),
            Shfl::Up => shfl_up_i32(FULL, x, arg, 0),
            Shfl::Down => shfl_down_i32(FULL, x, arg, 0x1f),
            Shfl::Xor => shfl_bfly_i32(FULL, x, arg, 0x1f),
        }
    }
}

#[cfg(target_arch = "nvptx64")]
impl<T: crate::element::Element> Lanes for T {
    /// One 32-bit shuffle, two for 8-byte types (PTX shuffles 32-bit
    /// registers only).
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn shuffle(self, how: Shfl, arg: u32) -> T {
        let b = self.to_bits64();
        let lo = shfl32(how, b as u32, arg) as u64;
        if T::BYTES <= 4 {
            return T::from_bits64(lo);
        }
        let hi = shfl32(how, (b >> 32) as u32, arg) as u64;
        T::from_bits64(hi << 32 | lo)
    }
}

#[cfg(target_arch = "nvptx64")]
impl<A: Lanes, B: Lanes> Lanes for (A, B) {
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn shuffle(self, how: Shfl, arg: u32) -> (A, B) {
        (self.0.shuffle(how, arg), self.1.shuffle(how, arg))
    }
}

/// Lane of this thread in its warp (x dimension).
#[inline(always)]
pub fn lane() -> u32 {
    crate::device::thread_idx() & 31
}

/// `v` of lane `src`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn shfl_idx<T: Lanes>(v: T, src: u32) -> T {
    v.shuffle(Shfl::Idx, src)
}

/// `v` of lane `lane - delta` (own value below lane `delta`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn shfl_up<T: Lanes>(v: T, delta: u32) -> T {
    v.shuffle(Shfl::Up, delta)
}

/// `v` of lane `lane + delta` (own value past lane 31 − `delta`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn shfl_down<T: Lanes>(v: T, delta: u32) -> T {
    v.shuffle(Shfl::Down, delta)
}

/// `v` of lane `lane ^ mask`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn shfl_xor<T: Lanes>(v: T, mask: u32) -> T {
    v.shuffle(Shfl::Xor, mask)
}

/// Bit `i` set when lane `i`'s `pred` holds (`vote.sync.ballot`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    unsafe { vote_ballot(FULL, pred) }
}

/// Whether every lane's `pred` holds (`vote.sync.all`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn all(pred: bool) -> bool {
    unsafe { vote_all(FULL, pred) }
}

/// Whether some lane's `pred` holds (`vote.sync.any`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn any(pred: bool) -> bool {
    unsafe { vote_any(FULL, pred) }
}

/// The warp's items combined in lane order, in every lane: a butterfly of
/// depth 5 in which each lane keeps the lower lanes' part on the left, so
/// every lane computes the same operations on the same operands (the same
/// bits) and `op` need not be commutative.
#[inline(always)]
pub fn reduce<R: ReduceOp>(op: R, v: R::Item) -> R::Item
where
    R::Item: Lanes,
{
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = collective(v, |xs| butterfly_all(op, xs)) {
        return r;
    }
    let l = lane();
    // Each item enters through the identity, as in a fold from it: an
    // all-NaN maximum is then -inf whatever the block size (maxNum of two
    // NaN would stay NaN), and -0.0 sums to +0.0, as on the host.
    let mut x = op.combine(op.identity(), v);
    let mut m = 1;
    while m < SIZE {
        let y = shfl_xor(x, m);
        x = if l & m == 0 { op.combine(x, y) } else { op.combine(y, x) };
        m <<= 1;
    }
    x
}

/// Lane `i` gets the items of lanes `0..=i` combined (Hillis–Steele,
/// depth 5).
#[inline(always)]
pub fn inclusive_scan<R: ReduceOp>(op: R, v: R::Item) -> R::Item
where
    R::Item: Lanes,
{
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = collective(v, |xs| hillis_steele_all(op, xs)) {
        return r;
    }
    let l = lane();
    // Through the identity, as in `reduce`.
    let mut x = op.combine(op.identity(), v);
    let mut d = 1;
    while d < SIZE {
        let y = shfl_up(x, d);
        if l >= d {
            x = op.combine(y, x);
        }
        d <<= 1;
    }
    x
}

/// Lane `i` gets the items of lanes `0..i` combined (lane 0 the identity).
#[inline(always)]
pub fn exclusive_scan<R: ReduceOp>(op: R, v: R::Item) -> R::Item
where
    R::Item: Lanes,
{
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = collective(v, |xs| {
        let inc = hillis_steele_all(op, xs);
        core::array::from_fn(|l| if l == 0 { op.identity() } else { inc[l - 1] })
    }) {
        return r;
    }
    let x = shfl_up(inclusive_scan(op, v), 1);
    if lane() == 0 {
        op.identity()
    } else {
        x
    }
}

// ---------------------------------------- the host: a GPU body on the CPU

/// A warp reduction or scan on the CPU in one wait of the warp's lanes
/// rather than one per shuffle ([`crate::emu::warp_collective`]: a lane's
/// switch to the next is what a GPU body run on the CPU spends its time on
/// at warp operations), `all` computing every lane's result as the shuffles
/// do; None (the shuffles then) in a short warp or for an item over 16
/// bytes. The wait's place is the caller's line.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
#[inline(always)]
pub(crate) fn collective<I: Copy>(v: I, all: impl FnOnce(&[I; 32]) -> [I; 32]) -> Option<I> {
    let fits = core::mem::size_of::<I>() <= 16 && core::mem::align_of::<I>() <= 16;
    (fits && crate::emu::full_warp()).then(|| crate::emu::warp_collective(v, core::panic::Location::caller(), all))
}

/// [`reduce`]'s butterfly for every lane at once: the same operations on
/// the same operands, stage by stage.
#[cfg(not(target_arch = "nvptx64"))]
pub(crate) fn butterfly_all<R: ReduceOp>(op: R, xs: &[R::Item; 32]) -> [R::Item; 32] {
    let mut x: [R::Item; 32] = core::array::from_fn(|l| op.combine(op.identity(), xs[l]));
    let mut m = 1;
    while m < SIZE as usize {
        let y = x;
        x = core::array::from_fn(|l| if l & m == 0 { op.combine(y[l], y[l ^ m]) } else { op.combine(y[l ^ m], y[l]) });
        m <<= 1;
    }
    x
}

/// [`inclusive_scan`]'s Hillis–Steele steps for every lane at once.
#[cfg(not(target_arch = "nvptx64"))]
pub(crate) fn hillis_steele_all<R: ReduceOp>(op: R, xs: &[R::Item; 32]) -> [R::Item; 32] {
    let mut x: [R::Item; 32] = core::array::from_fn(|l| op.combine(op.identity(), xs[l]));
    let mut d = 1;
    while d < SIZE as usize {
        let y = x;
        x = core::array::from_fn(|l| if l >= d { op.combine(y[l - d], y[l]) } else { y[l] });
        d <<= 1;
    }
    x
}

/// Where a warp operation is called from: lanes meet at one only when
/// they call it from the same place ([`crate::emu`]).
#[cfg(not(target_arch = "nvptx64"))]
type Site = &'static core::panic::Location<'static>;

#[cfg(not(target_arch = "nvptx64"))]
impl<T: crate::element::Element> Lanes for T {
    fn shuffle_at(self, how: Shfl, arg: u32, site: Site) -> T {
        T::from_bits64(crate::emu::warp_op(crate::emu::WarpOp::Shfl(how), self.to_bits64(), arg, site))
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl<A: Lanes, B: Lanes> Lanes for (A, B) {
    fn shuffle_at(self, how: Shfl, arg: u32, site: Site) -> (A, B) {
        (self.0.shuffle_at(how, arg, site), self.1.shuffle_at(how, arg, site))
    }
}

/// `v` of lane `src`, every lane of the emulated warp here.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub fn shfl_idx<T: Lanes>(v: T, src: u32) -> T {
    v.shuffle_at(Shfl::Idx, src, core::panic::Location::caller())
}

/// `v` of lane `lane - delta` (own value below lane `delta`).
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub fn shfl_up<T: Lanes>(v: T, delta: u32) -> T {
    v.shuffle_at(Shfl::Up, delta, core::panic::Location::caller())
}

/// `v` of lane `lane + delta` (own value past lane 31 − `delta`).
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub fn shfl_down<T: Lanes>(v: T, delta: u32) -> T {
    v.shuffle_at(Shfl::Down, delta, core::panic::Location::caller())
}

/// `v` of lane `lane ^ mask`.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub fn shfl_xor<T: Lanes>(v: T, mask: u32) -> T {
    v.shuffle_at(Shfl::Xor, mask, core::panic::Location::caller())
}

/// Bit `i` set when lane `i`'s `pred` holds.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub fn ballot(pred: bool) -> u32 {
    crate::emu::warp_op(crate::emu::WarpOp::Ballot, pred as u64, 0, core::panic::Location::caller()) as u32
}

/// Whether every lane's `pred` holds.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub fn all(pred: bool) -> bool {
    crate::emu::warp_op(crate::emu::WarpOp::All, pred as u64, 0, core::panic::Location::caller()) != 0
}

/// Whether some lane's `pred` holds.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub fn any(pred: bool) -> bool {
    crate::emu::warp_op(crate::emu::WarpOp::Any, pred as u64, 0, core::panic::Location::caller()) != 0
}

// ------------------------------------------------------ the host meaning
// of a warp's values given at once (for CPU bodies and tests)

/// Bit `i` set when `preds[i]` holds (at most 32 lanes).
#[cfg(not(target_arch = "nvptx64"))]
pub fn ballot_of(preds: &[bool]) -> u32 {
    assert!(preds.len() <= SIZE as usize);
    preds.iter().enumerate().fold(0, |b, (i, &p)| b | (p as u32) << i)
}

/// Whether every lane's predicate holds.
#[cfg(not(target_arch = "nvptx64"))]
pub fn all_of(preds: &[bool]) -> bool {
    preds.iter().all(|&p| p)
}

/// Whether some lane's predicate holds.
#[cfg(not(target_arch = "nvptx64"))]
pub fn any_of(preds: &[bool]) -> bool {
    preds.iter().any(|&p| p)
}

/// The lanes' items combined in lane order ([`crate::reduce::fold`]).
#[cfg(not(target_arch = "nvptx64"))]
pub fn reduce_of<R: ReduceOp>(op: R, items: &[R::Item]) -> R::Item {
    crate::reduce::fold(op, items.iter().copied())
}
