//! Block-wide reductions and scans with any [`ReduceOp`], and
//! their host meaning.
//!
//! On the GPU every thread of the block calls them together (uniform
//! control flow; the block size a multiple of 32, at most 1024) with its
//! item; each returns its result to every thread. They use the kit's static
//! scratch array ([`crate::shared::SCRATCH_BYTES`], not the launch's dynamic
//! shared memory) between two barriers of their own, so they may follow
//! one another at once. An item is at most 16 bytes (an element, or
//! ArgMax's pair).
//!
//! On the host the same functions run in a GPU body run on the CPU
//! ([`crate::emu`]), through the same warp steps and barriers, so they
//! combine in the GPU's order; the `_of` forms take the block's items as a
//! slice in thread order: [`reduce_of`] combines them
//! ([`crate::reduce::fold`]), the scans fill an output slice.

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

use crate::reduce::ReduceOp;
use crate::{
    device::{block_dim, sync_threads, thread_idx},
    shared::{scratch, SCRATCH_BYTES},
    warp::{self, Lanes},
};

/// Slot `w` of the scratch as a pointer to an item (16-byte slots).
#[inline(always)]
fn slot<I>(w: u32) -> *mut I {
    const { assert!(core::mem::size_of::<I>() <= 16 && core::mem::align_of::<I>() <= 16) };
    debug_assert!((w as usize) < SCRATCH_BYTES / 16);
    scratch().as_ptr().cast::<u8>().wrapping_add(16 * w as usize).cast()
}

/// Combines, in warp order, the per-warp values each warp's lane
/// `src_lane` holds in `v`; every thread gets the result of the warps
/// before its own (`exclusive`) or of all warps. Two barriers.
#[inline(always)]
fn across_warps<R: ReduceOp>(op: R, v: R::Item, src_lane: u32, exclusive: bool) -> R::Item
where
    R::Item: Lanes,
{
    let (t, nwarps) = (thread_idx(), block_dim() >> 5);
    let (lane, w) = (t & 31, t >> 5);
    if lane == src_lane {
        unsafe { slot::<R::Item>(w).write(v) };
    }
    sync_threads();
    let x = if lane < nwarps { unsafe { slot::<R::Item>(lane).read() } } else { op.identity() };
    let r = if exclusive {
        warp::shfl_idx(warp::exclusive_scan(op, x), w)
    } else {
        warp::reduce(op, x)
    };
    // Nobody overwrites the slots before everyone has read them.
    sync_threads();
    r
}

/// The block's items combined in thread order, returned to every thread.
#[inline(always)]
pub fn reduce<R: ReduceOp>(op: R, v: R::Item) -> R::Item
where
    R::Item: Lanes,
{
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = at_once(op, v, warp::butterfly_all, 0, |x, _, out| {
        // The slots' butterfly, in every warp.
        let r = warp::butterfly_all(op, x);
        for (t, o) in out.iter_mut().enumerate() {
            *o = r[t % 32];
        }
    }) {
        return r;
    }
    across_warps(op, warp::reduce(op, v), 0, false)
}

/// Thread `i` gets the items of threads `0..=i` combined.
#[inline(always)]
pub fn inclusive_scan<R: ReduceOp>(op: R, v: R::Item) -> R::Item
where
    R::Item: Lanes,
{
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = at_once(op, v, warp::hillis_steele_all, 31, |x, incs, out| {
        let before = exclusive_of_slots(op, x);
        for (t, o) in out.iter_mut().enumerate() {
            *o = op.combine(before[t / 32], incs[t / 32][t % 32]);
        }
    }) {
        return r;
    }
    let inc = warp::inclusive_scan(op, v);
    let before = across_warps(op, inc, 31, true);
    op.combine(before, inc)
}

/// Thread `i` gets the items of threads `0..i` combined (thread 0 the
/// identity).
#[inline(always)]
pub fn exclusive_scan<R: ReduceOp>(op: R, v: R::Item) -> R::Item
where
    R::Item: Lanes,
{
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = at_once(op, v, warp::hillis_steele_all, 31, |x, incs, out| {
        let before = exclusive_of_slots(op, x);
        for (t, o) in out.iter_mut().enumerate() {
            let (w, l) = (t / 32, t % 32);
            *o = if l == 0 { before[w] } else { op.combine(before[w], incs[w][l - 1]) };
        }
    }) {
        return r;
    }
    let inc = warp::inclusive_scan(op, v);
    let before = across_warps(op, inc, 31, true);
    let exc = warp::shfl_up(inc, 1);
    if thread_idx() & 31 == 0 {
        before
    } else {
        op.combine(before, exc)
    }
}

// ------------------------------------------- the host: one wait a block

/// A block reduction or scan on the CPU in one wait of the block
/// ([`crate::emu::block_collective`]) instead of its barriers and
/// shuffles: each warp's lanes through `warp_all` (the warp step, every
/// lane's result), lane `src_lane`'s result of warp `w` into slot `w` (the
/// identity past the last warp; the scratch slots written as
/// [`across_warps`] writes them), then `finish(slots, warps' results,
/// results)` computing every thread's result as the shuffles do. None (the
/// barriers and shuffles then) unless the block is whole warps and the
/// item at most 16 bytes.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
fn at_once<R: ReduceOp>(
    op: R,
    v: R::Item,
    warp_all: fn(R, &[R::Item; 32]) -> [R::Item; 32],
    src_lane: usize,
    finish: impl FnOnce(&[R::Item; 32], &[[R::Item; 32]], &mut [R::Item]),
) -> Option<R::Item>
where
    R::Item: Lanes,
{
    let fits = core::mem::size_of::<R::Item>() <= 16 && core::mem::align_of::<R::Item>() <= 16;
    if !(fits && crate::emu::whole_warps()) {
        return None;
    }
    Some(crate::emu::block_collective(v, core::panic::Location::caller(), |items, out| {
        let warps: std::vec::Vec<[R::Item; 32]> =
            items.chunks_exact(32).map(|lanes| warp_all(op, lanes.try_into().expect("32 lanes"))).collect();
        let mut x = [op.identity(); 32];
        for (w, r) in warps.iter().enumerate() {
            x[w] = r[src_lane];
            unsafe { slot::<R::Item>(w as u32).write(x[w]) };
        }
        finish(&x, &warps, out)
    }))
}

/// Slot `w`'s items before it combined, as every warp's exclusive scan of
/// the slots gives them (lane 0 the identity).
#[cfg(not(target_arch = "nvptx64"))]
fn exclusive_of_slots<R: ReduceOp>(op: R, x: &[R::Item; 32]) -> [R::Item; 32] {
    let inc = warp::hillis_steele_all(op, x);
    core::array::from_fn(|l| if l == 0 { op.identity() } else { inc[l - 1] })
}

// ------------------------------------------------------ the host meaning

/// The block's items combined in thread order.
#[cfg(not(target_arch = "nvptx64"))]
pub fn reduce_of<R: ReduceOp>(op: R, items: &[R::Item]) -> R::Item {
    crate::reduce::fold(op, items.iter().copied())
}

/// `out[i]`: items `0..=i` combined ([`crate::reduce::inclusive_scan`]).
#[cfg(not(target_arch = "nvptx64"))]
pub fn inclusive_scan_of<R: ReduceOp>(op: R, items: &[R::Item], out: &mut [R::Item]) {
    crate::reduce::inclusive_scan(op, items, out)
}

/// `out[i]`: items `0..i` combined ([`crate::reduce::exclusive_scan`]).
#[cfg(not(target_arch = "nvptx64"))]
pub fn exclusive_scan_of<R: ReduceOp>(op: R, items: &[R::Item], out: &mut [R::Item]) {
    crate::reduce::exclusive_scan(op, items, out)
}
