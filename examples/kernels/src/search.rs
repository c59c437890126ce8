//! `cos_topk`: the K rows of a matrix most cosine-similar to a query, in
//! one pass over the matrix and with no rows-long score vector anywhere.
//!
//! Both bodies compute every similarity in the same order, so they give the
//! same bits: a row's dot product x·q and its squared norm x·x are each 32
//! partial sums, partial l taking the columns j ≡ l (mod 32) in increasing
//! order with one fused multiply-add per term (written out: the GPU build
//! fuses a multiply and an add anyway, `llc --fp-contract=fast`, the host
//! build never does, so only an explicit `fma` means one thing on both),
//! then a butterfly of 5 additions (16, 8, 4, 2, 1 apart). The order does
//! not depend on where a row starts in memory, so equal rows give equal
//! similarities and their tie goes to the lower index on both backends.
//! |q|² is summed the same way, and [`cosine`] is `cos_sim`'s. The K best
//! of the similarities in [`before`]'s order (larger first, ties to the
//! lower index, NaN after every number) are then one definite answer
//! whatever order the rows are met in.

use crate::order::{before, NONE};
use crate::rows::{cosine, TOPK_MAX};
use erlcuda_kernel::{kernel, Float};

kernel! {
    /// The K rows of X with the greatest cosine similarity to Q, most
    /// similar first: Args [X, Q, Rows, Cols, K], X T rows·cols, Q T cols,
    /// 1 ≤ K ≤ min(rows, 64); result {Values, Indices}, T and u32 K.
    /// Similarity 0 where a norm is 0 (as `cos_sim`), ties to the lower
    /// row index, a NaN similarity (a NaN or an infinity in a row) after
    /// every number. A K outside its range is refused (`{badarg, {arg,
    /// 5}}`). (Called past the signature, as the host tests do, the bodies
    /// fill slots past the rows and past the 64th with T's lowest and
    /// index 2^32 − 1.)
    ///
    /// One block per job, one warp per row at a time (warp w takes rows w,
    /// w + W, ...), each warp keeping its own best K in registers; the
    /// warps' lists then meet in shared memory, where each candidate's
    /// place in the answer is the number of candidates of every list that
    /// rank before it. One block, because the kit gives a job no memory
    /// that outlives a block but its outputs (a multi-block pass needs a
    /// per-job scratch to merge blocks' lists in); 1024 threads by default
    /// so that the block alone keeps enough loads in flight (eight a
    /// thread) for a job that is alone on the GPU.
    ///
    /// X is `shared`, rows and cols `same_d`: jobs on one device buffer X
    /// run as a group, X read once for the group. The group bodies compute
    /// every similarity as the job's own bodies do (the same sums in the
    /// same order), so each job's answer has the same bits in any group.
    /// On the GPU, a group's virtual block takes 32 jobs, one warp each
    /// (at 1024 threads), every warp walking all the rows in step, so
    /// each row is fetched from memory once for the block's 32 queries;
    /// on the CPU, the rows go by in tiles that stay in cache while every
    /// query of the group meets them.
    cos_topk, T: Float in [f32, f64],
    (x: shared(T, rows * cols), q: v(T, cols), rows: same_d, cols: same_d, k: d(1 ..= rows & 64))
        -> (values: w(T, k), indices: w(u32, k)),
    blocks = 1, threads = 1024, block_rule = warps, shared = 0,
    gpu(job, blk) {
        gpu::cos_topk(x, q, rows, cols, k, values, indices);
    }
    cpu(job) {
        host::cos_topk(x, q, rows, cols, values, indices);
    }
    group_gpu(g, job, blk, jobs_per_block = 32) {
        gpu::cos_topk_group(x, rows, cols, g.len(), |i| {
            let (_, q, _, _, k, values, indices) = job(i);
            (q, k, values, indices)
        });
    }
    group_cpu(g, job) {
        host::cos_topk_group(x, rows, cols, g.len(), |i| {
            let (_, q, _, _, _, values, indices) = job(i);
            (q, values, indices)
        });
    }
}

/// The CPU side: the GPU's 32 lanes as arrays.
#[cfg(not(target_arch = "nvptx64"))]
mod host {
    use super::*;
    use crate::order::TopK;
    use core::array::from_fn;

    /// (a·b, a·a) in the order of the module's doc.
    pub fn lane_sums<T: Float>(a: &[T], b: &[T]) -> (T, T) {
        let (mut d, mut aa) = ([T::ZERO; 32], [T::ZERO; 32]);
        for (j, (&x, &y)) in a.iter().zip(b).enumerate() {
            let l = j % 32;
            d[l] = x.fma(y, d[l]);
            aa[l] = x.fma(x, aa[l]);
        }
        (butterfly(d), butterfly(aa))
    }

    /// a·b alone, then a·a alone: each the same bits as [`lane_sums`]'s
    /// (each lane's chain of fused multiply-adds is its own).
    fn lane_dot<T: Float>(a: &[T], b: &[T]) -> T {
        let mut d = [T::ZERO; 32];
        for (j, (&x, &y)) in a.iter().zip(b).enumerate() {
            d[j % 32] = x.fma(y, d[j % 32]);
        }
        butterfly(d)
    }

    /// Rows met per tile of the group body: 64 rows of 384 f32 are 96 KiB,
    /// which stay in a core's L2 while every query of the group meets them.
    const TILE: usize = 64;

    /// The whole group: per tile of rows, the rows' squared norms once,
    /// then each query's similarities to them into its own best K. Each
    /// similarity is the job's own body's bits, and the K best of a set in
    /// [`before`]'s order do not depend on the order the set is met in.
    pub fn cos_topk_group<'a, T: Float + 'a>(
        x: &[T],
        rows: u32,
        cols: u32,
        n: u32,
        job: impl Fn(u32) -> (&'a [T], &'a mut [T], &'a mut [u32]),
    ) {
        let c = cols as usize;
        let mut jobs: Vec<_> = (0..n).map(job).collect();
        let mut tops: Vec<TopK<T, { TOPK_MAX as usize }>> = jobs.iter().map(|j| TopK::new(j.1.len())).collect();
        let qq: Vec<T> = jobs.iter().map(|j| lane_dot(j.0, j.0)).collect();
        let mut xx = [T::ZERO; TILE];
        let mut r0 = 0;
        while r0 < rows as usize {
            let r1 = (r0 + TILE).min(rows as usize);
            for r in r0..r1 {
                let row = &x[r * c..(r + 1) * c];
                xx[r - r0] = lane_dot(row, row);
            }
            for (i, (q, vals, _)) in jobs.iter().enumerate() {
                if vals.is_empty() {
                    continue;
                }
                for r in r0..r1 {
                    let d = lane_dot(&x[r * c..(r + 1) * c], q);
                    tops[i].push((cosine(d, xx[r - r0], qq[i]), r as u32));
                }
            }
            r0 = r1;
        }
        for (top, (_, vals, idxs)) in tops.iter().zip(jobs.iter_mut()) {
            top.write(vals, idxs);
        }
    }

    /// The GPU's `v + shfl_xor(v, m)` for m = 16, 8, 4, 2, 1: every lane
    /// ends with the same sum (a + b and b + a are the same bits).
    fn butterfly<T: Float>(mut p: [T; 32]) -> T {
        let mut m = 16;
        while m > 0 {
            p = from_fn(|l| p[l] + p[l ^ m]);
            m >>= 1;
        }
        p[0]
    }

    /// The whole job: rows met in order, the best min(K, 64) so far kept
    /// sorted (a row is looked at only when it beats the last kept one).
    pub fn cos_topk<T: Float>(x: &[T], q: &[T], rows: u32, cols: u32, vals: &mut [T], idxs: &mut [u32]) {
        let c = cols as usize;
        let mut top = TopK::<T, { TOPK_MAX as usize }>::new(vals.len());
        if !vals.is_empty() {
            let qq = lane_sums(q, q).0;
            for r in 0..rows as usize {
                let (d, xx) = lane_sums(&x[r * c..(r + 1) * c], q);
                top.push((cosine(d, xx, qq), r as u32));
            }
        }
        top.write(vals, idxs);
    }
}

/// The GPU side: every function called by all the block's threads
/// (B a multiple of 32: `block_rule = warps`).
// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
mod gpu {
    use super::*;
    use core::array::from_fn;
    use erlcuda_kernel::device::{block_dim, sync_threads, thread_idx};
    use erlcuda_kernel::shared::SharedArray;
    use erlcuda_kernel::{shared_array, warp, Element};

    /// Lists in shared memory: 64 slots for each of at most 32 warps.
    const SLOTS: usize = 32 * TOPK_MAX as usize;

    /// (a·b, a·a) over `len` elements in the order of the module's doc, in
    /// every lane of the warp. Eight terms a lane per step, all loads
    /// issued before the first is used; the additions stay in column order.
    #[inline(always)]
    unsafe fn lane_sums<T: Float>(a: *const T, b: *const T, len: u32, lane: u32) -> (T, T) {
        let (mut d, mut aa) = (T::ZERO, T::ZERO);
        let mut j = lane as usize;
        let len = len as usize;
        while j + 7 * 32 < len {
            let xa: [T; 8] = from_fn(|u| T::load_nc(a.add(j + 32 * u)));
            let xb: [T; 8] = from_fn(|u| T::load_nc(b.add(j + 32 * u)));
            for u in 0..8 {
                d = xa[u].fma(xb[u], d);
                aa = xa[u].fma(xa[u], aa);
            }
            j += 8 * 32;
        }
        while j < len {
            let (u, v) = (T::load_nc(a.add(j)), T::load_nc(b.add(j)));
            d = u.fma(v, d);
            aa = u.fma(u, aa);
            j += 32;
        }
        (butterfly(d), butterfly(aa))
    }

    #[inline(always)]
    fn butterfly<T: Float>(mut v: T) -> T {
        let mut m = 16;
        while m > 0 {
            v = v + warp::shfl_xor(v, m);
            m >>= 1;
        }
        v
    }

    /// How many of the sorted list `(lv, li)[at..at + n]` rank before `x`
    /// (a binary search: they form a prefix).
    #[inline(always)]
    fn count_before<T: Float>(lv: &SharedArray<T, SLOTS>, li: &SharedArray<u32, SLOTS>, at: u32, n: u32, x: (T, u32)) -> u32 {
        let (mut lo, mut hi) = (0u32, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let i = (at + mid) as usize;
            if before((lv.get(i), li.get(i)), x) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Puts `it` into a warp's sorted list (below), when it beats the
    /// list's last slot `last`, `kk` slots kept. Called by the whole warp
    /// with the same `it` and `last` in every lane.
    #[inline(always)]
    fn insert<T: Float>(it: (T, u32), a: &mut (T, u32), b: &mut (T, u32), last: &mut (T, u32), lane: u32, kk: u32) {
        if !before(it, *last) {
            return;
        }
        let none = (T::LOWEST, NONE);
        let pos = warp::ballot(before(*a, it)).count_ones() + warp::ballot(before(*b, it)).count_ones();
        let up_a = warp::shfl_up(*a, 1);
        let up_b = warp::shfl_up(*b, 1);
        // Slot 31 moves to slot 32: lane 31's `a` to lane 0's `b`.
        let a31 = warp::shfl_idx(*a, 31);
        let from_b = if lane == 0 { a31 } else { up_b };
        let (sa, sb) = (lane, lane + 32);
        *a = if sa < pos { *a } else if sa == pos { it } else { up_a };
        *b = if sb < pos { *b } else if sb == pos { it } else { from_b };
        if sa >= kk {
            *a = none;
        }
        if sb >= kk {
            *b = none;
        }
        *last = if kk <= 32 { warp::shfl_idx(*a, kk - 1) } else { warp::shfl_idx(*b, kk - 33) };
    }

    /// A group's virtual block: `n` jobs, job i's (q, k, values, indices)
    /// from `job(i)`. Warp w takes jobs w, w + W, ..., each over every
    /// row in order with the list of [`cos_topk`] in its registers; with a
    /// warp per job (32 jobs at 1024 threads) the warps walk the rows in
    /// step, so a row comes from memory once and from L1 to the others. A
    /// warp's list then holds its job's whole answer: slot s in lane s %
    /// 32, as the single body ranks them.
    pub unsafe fn cos_topk_group<T: Float>(
        x: *const T,
        rows: u32,
        cols: u32,
        n: u32,
        job: impl Fn(u32) -> (*const T, u32, *mut T, *mut u32),
    ) {
        let (t, nt) = (thread_idx(), block_dim());
        let (lane, w, nw) = (t % 32, t / 32, nt / 32);
        let none = (T::LOWEST, NONE);
        let mut i = w;
        while i < n {
            let (q, k, vals, idxs) = job(i);
            let kk = k.min(TOPK_MAX);
            let (mut a, mut b) = (none, none);
            if kk > 0 {
                let qq = lane_sums(q, q, cols, lane).0;
                let mut last = none;
                let mut r = 0;
                while r < rows {
                    let (d, xx) = lane_sums(x.add(r as usize * cols as usize), q, cols, lane);
                    insert((cosine(d, xx, qq), r), &mut a, &mut b, &mut last, lane, kk);
                    r += 1;
                }
            }
            if lane < kk {
                T::store(vals.add(lane as usize), a.0);
                u32::store(idxs.add(lane as usize), a.1);
            }
            if lane + 32 < kk {
                T::store(vals.add(lane as usize + 32), b.0);
                u32::store(idxs.add(lane as usize + 32), b.1);
            }
            // Slots past the 64th (only past the signature).
            let mut s = kk + lane;
            while s < k {
                T::store(vals.add(s as usize), none.0);
                u32::store(idxs.add(s as usize), none.1);
                s += 32;
            }
            i += nw;
        }
    }

    /// The job's answer into `vals`/`idxs`[..k].
    ///
    /// A warp's list is sorted across its lanes: lane l holds slots l and
    /// l + 32 (`a`, `b`). A row whose item beats the list's last slot
    /// (every row while the list is not full: an empty slot is "no item",
    /// which every item beats) goes in at its place, the number of slots
    /// that rank before it (two ballots), and the slots after it move down
    /// one by shuffles; the last drops out. Every lane has the row's item
    /// and the last slot (the same bits), so the branch is the warp's.
    pub unsafe fn cos_topk<T: Float>(x: *const T, q: *const T, rows: u32, cols: u32, k: u32, vals: *mut T, idxs: *mut u32) {
        let (t, nt) = (thread_idx(), block_dim());
        let (lane, w, nw) = (t % 32, t / 32, nt / 32);
        let kk = k.min(TOPK_MAX);
        let none = (T::LOWEST, NONE);
        let (mut a, mut b) = (none, none);
        if kk > 0 {
            let qq = lane_sums(q, q, cols, lane).0;
            let mut last = none;
            let mut r = w;
            while r < rows {
                let (d, xx) = lane_sums(x.add(r as usize * cols as usize), q, cols, lane);
                insert((cosine(d, xx, qq), r), &mut a, &mut b, &mut last, lane, kk);
                r += nw;
            }
        }
        let lv = shared_array!(cos_topk_values: [T; SLOTS], room = f64);
        let li = shared_array!(cos_topk_indices: [u32; SLOTS]);
        let at = (w * TOPK_MAX) as usize;
        lv.set(at + lane as usize, a.0);
        li.set(at + lane as usize, a.1);
        lv.set(at + 32 + lane as usize, b.0);
        li.set(at + 32 + lane as usize, b.1);
        // Every list is in place before any is read; the barrier after the
        // virtual block keeps the next job's lists from overwriting them.
        sync_threads();
        let mut c = t;
        while c < nw * TOPK_MAX {
            let (own, slot) = (c / TOPK_MAX, c % TOPK_MAX);
            let it = (lv.get(c as usize), li.get(c as usize));
            if slot < kk && it.1 != NONE {
                // Its own list ranks `slot` items before it.
                let mut rank = slot;
                let mut o = 0;
                while o < nw {
                    if o != own {
                        rank += count_before(&lv, &li, o * TOPK_MAX, kk, it);
                    }
                    o += 1;
                }
                if rank < kk {
                    T::store(vals.add(rank as usize), it.0);
                    u32::store(idxs.add(rank as usize), it.1);
                }
            }
            c += nt;
        }
        // Slots no row fills (K > rows or past the 64th: only past the
        // signature).
        let mut i = rows.min(kk) + t;
        while i < k {
            T::store(vals.add(i as usize), none.0);
            u32::store(idxs.add(i as usize), none.1);
            i += nt;
        }
    }
}
