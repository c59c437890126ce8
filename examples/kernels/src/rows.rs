//! Kernels over the rows of a row-major matrix, one GPU block per row:
//! `cos_sim`, `argmax_rows`, `topk_rows`, `log_softmax_rows`.
//!
//! Each block reads its row once, coalesced (neighbouring threads,
//! neighbouring 16-byte groups), combines its threads' partial results with
//! the kit's warp and block reductions, and writes the row's result; the
//! grid strides over the rows of every coalesced job.

use crate::math::exp_le0;
use crate::order::{before, First, NONE};
// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
use crate::order::beats_earlier;
use erlcuda_kernel::reduce::ReduceOp;
use erlcuda_kernel::{kernel, Float, Numeric};
// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
use erlcuda_kernel::Element;

/// The most elements `topk_rows` returns per row: its signature refuses a
/// larger K (`k: d(1 ..= cols & 64)`); the bodies, called past it (the
/// host tests do), give "no item" (index 2^32 − 1) after the 64th slot.
pub const TOPK_MAX: u32 = 64;

/// cos(x, q), 0 where either norm is 0 (no direction to compare); also
/// `cos_topk`'s.
#[inline(always)]
pub(crate) fn cosine<T: Float>(dot: T, xx: T, qq: T) -> T {
    if xx == T::ZERO || qq == T::ZERO {
        T::ZERO
    } else {
        // Two roots rather than √(xx·qq): the product of two squared norms
        // overflows (or underflows) long before the norms do.
        dot / (xx.sqrt() * qq.sqrt())
    }
}

kernel! {
    /// sim[r] = x[r]·q / (|x[r]|·|q|), 0 where a norm is 0: Args
    /// [X, Q, Rows, Cols]. One block per row, the three sums in one pass.
    /// 128 threads: a 1024-column row is two groups of four a thread,
    /// both loads in flight at once.
    cos_sim, T: Float in [f32, f64],
    (x: v(T, rows * cols), q: v(T, cols), rows: d, cols: d) -> (sim: w(T, rows)),
    blocks = rows, threads = 128, block_rule = warps, shared = 0,
    gpu(job, row) {
        let (d, xx, qq) = gpu::dot_norms(x.add(row as usize * cols as usize), q, cols);
        if thread_idx() == 0 {
            T::store(sim.add(row as usize), cosine(d, xx, qq));
        }
    }
}

kernel! {
    /// index[r] = the index of the first maximum of row r: Args
    /// [X, Rows, Cols], cols ≥ 1 (a call with cols = 0 is refused: no row
    /// has a maximum; the body, called past the signature, gives 2^32 − 1,
    /// "no element"). NaN never wins (a row of NaN only gives 0, its first).
    /// Written once: the CPU backend runs this GPU body (17× what a `cpu`
    /// body took, within the 30× of a kernel with barriers: bench/EXPERIMENTS.md).
    /// One warp per row, one reduction of (value, index) pairs in the
    /// order of order.rs. A warp, not `cos_sim`'s 128 threads: at
    /// 16384×1024 f32 on an H100 gpud's run took 0.038 ms with 32 threads,
    /// 0.041 with 64, 0.057 with 128 and 0.097 with 256 (every thread has
    /// eight 16-byte loads in flight, and the reduction's barriers cost a
    /// warp least; `erlcuda_examples_bench:blocks/3`).
    argmax_rows, T: Numeric in [u8, s32, u32, s64, f32, f64],
    (x: v(T, rows * cols), rows: d, cols: d(1..)) -> (index: w(u32, rows)),
    blocks = rows, threads = 32, block_rule = warps, shared = 0,
    gpu(job, row) {
        let best = gpu::first_in_row(x.add(row as usize * cols as usize), cols);
        if thread_idx() == 0 {
            u32::store(index.add(row as usize), best.1);
        }
    }
}

kernel! {
    /// The K largest of each row in descending order, and their indices:
    /// Args [X, Rows, Cols, K], result {Values, Indices}, each rows·K.
    /// Ties go to the lower index and NaN never wins: a row's NaNs come
    /// after its numbers, by index. 1 ≤ K ≤ min(cols, 64): a call with
    /// any other K is refused (`{badarg, {arg, 4}}`), never answered with
    /// padding. (Called past the signature, as the host tests do, the
    /// bodies fill slots with no element, K > cols or past the 64th, with
    /// T's lowest and index 2^32 − 1.)
    /// A row of at most 256 columns (one element a thread) is ranked in one
    /// step, each element counting those before it; a longer one by rounds
    /// of block reductions, tile by tile (`gpu::topk_short`,
    /// `gpu::topk_tiles`): K rounds cost a short row far more than its
    /// loads (10×100, K = 8, took 21-22 µs of kernel time on an H100 by
    /// rounds alone).
    topk_rows, T: Numeric in [u8, s32, u32, s64, f32, f64],
    (x: v(T, rows * cols), rows: d, cols: d, k: d(1 ..= cols & 64)) -> (values: w(T, rows * k), indices: w(u32, rows * k)),
    blocks = rows, threads = 256, block_rule = warps, shared = 0,
    gpu(job, row) {
        if k > 0 {
            let (r, kk) = (row as usize, k as usize);
            gpu::topk_row(x.add(r * cols as usize), cols, k, values.add(r * kk), indices.add(r * kk));
        }
    }
    cpu(job) {
        let (c, kk) = (cols as usize, k as usize);
        if kk == 0 {
            return;
        }
        for (r, (vo, io)) in values.chunks_exact_mut(kk).zip(indices.chunks_exact_mut(kk)).enumerate() {
            host::topk_row(&x[r * c..(r + 1) * c], vo, io);
        }
    }
}

kernel! {
    /// Each row's x − max − log Σ exp(x − max): Args [X, Cols], X n
    /// elements in rows of Cols (Cols divides n). One block per row: the
    /// row is read once into registers (up to 16 elements a thread, 4096
    /// a row at 256 threads), its maximum and its sum of exponentials are
    /// each one block reduction, and the results are written from the
    /// registers; a longer row is read a second time to write it.
    log_softmax_rows, T: Float in [f32, f64],
    (x: v(T, n), cols: d) -> (y: w(T, n)),
    blocks = n / cols, threads = 256, block_rule = warps, shared = 0,
    gpu(job, row) {
        let at = row as usize * cols as usize;
        gpu::log_softmax_row(x.add(at), y.add(at), cols);
    }
}

/// The CPU sides that are more than a loop.
#[cfg(not(target_arch = "nvptx64"))]
mod host {
    use super::*;
    use crate::order::TopK;

    /// The first min(K, 64) items of `row` in [`before`]'s order into the
    /// first slots of `vals`/`idxs` (K = their length), "no item" after.
    /// One pass keeping the best so far sorted: an element is looked at
    /// only when it beats the last kept one.
    pub fn topk_row<T: Numeric>(row: &[T], vals: &mut [T], idxs: &mut [u32]) {
        let mut top = TopK::<T, { TOPK_MAX as usize }>::new(vals.len());
        for (j, &v) in row.iter().enumerate() {
            top.push((v, j as u32));
        }
        top.write(vals, idxs);
    }
}

/// The GPU sides: one block per row, every function called by all the
/// block's threads (B a multiple of 32: `block_rule = warps`).
// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
mod gpu {
    use super::*;
    use crate::group::{aligned, for_row, for_row2, load_tile, store_tile, tile_col, tile_slots};
    use erlcuda_kernel::device::{block_dim, sync_threads, thread_idx};
    use erlcuda_kernel::reduce::{Max, Sum};
    use erlcuda_kernel::{block, shared_array, unroll, warp};

    /// (x·q, x·x, q·q) over `cols` elements, in thread 0. Each warp sums
    /// its threads' partials by shuffles; the warps' sums meet in shared
    /// memory behind one barrier, and warp 0 adds them (the barrier after
    /// each virtual block keeps the next row from overwriting them).
    pub unsafe fn dot_norms<T: Float>(x: *const T, q: *const T, cols: u32) -> (T, T, T) {
        let (mut d, mut xx, mut qq) = (T::ZERO, T::ZERO, T::ZERO);
        for_row2(x, q, cols, |a, b| {
            d += a * b;
            xx += a * a;
            qq += b * b;
        });
        let sum = Sum::<T>::new();
        let (d, xx, qq) = (warp::reduce(sum, d), warp::reduce(sum, xx), warp::reduce(sum, qq));
        let parts = shared_array!(cos_sim_parts: [T; 96], room = f64);
        let t = thread_idx();
        let (lane, w, nw) = (t % 32, t / 32, block_dim() / 32);
        if lane == 0 {
            parts.set(w as usize, d);
            parts.set(32 + w as usize, xx);
            parts.set(64 + w as usize, qq);
        }
        sync_threads();
        let mut r = (T::ZERO, T::ZERO, T::ZERO);
        if w == 0 {
            let get = |o: usize| if lane < nw { parts.get(o + lane as usize) } else { T::ZERO };
            r = (warp::reduce(sum, get(0)), warp::reduce(sum, get(32)), warp::reduce(sum, get(64)));
        }
        r
    }

    /// The row's first item in [`before`]'s order, in every thread.
    pub unsafe fn first_in_row<T: Numeric>(row: *const T, cols: u32) -> (T, u32) {
        let op = First::<T>::new();
        let mut best = op.identity();
        // A thread meets its elements in increasing index order.
        for_row(row, cols, |i, v| {
            if beats_earlier(v, best) {
                best = (v, i);
            }
        });
        block::reduce(op, best)
    }

    /// The best live slot of a register tile (see [`topk_row`]).
    #[inline(always)]
    fn tile_best<T: Numeric, const N: usize>(v: &[T; N], live: u32, lo: u32, t: u32, nt: u32) -> (T, u32) {
        let mut b = (T::LOWEST, NONE);
        unroll!(s, 16, {
            if (s as usize) < N {
                let it = (v[s as usize], tile_col(lo, s, t, nt));
                if live >> s & 1 != 0 && before(it, b) {
                    b = it;
                }
            }
        });
        b
    }

    /// How many of the sorted list `(lv, li)[at..at + n]` rank before `x`
    /// (a binary search: those form a prefix).
    #[inline(always)]
    fn count_before<T: Numeric>(
        lv: &erlcuda_kernel::shared::SharedArray<T, 192>,
        li: &erlcuda_kernel::shared::SharedArray<u32, 192>,
        at: u32,
        n: u32,
        x: (T, u32),
    ) -> u32 {
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

    /// The longest row [`topk_short`] takes (its shared array's length;
    /// the signature's 256 threads).
    const SHORT_ROW: u32 = 256;

    /// The row's first min(k, 64) items in order into `vals`/`idxs`[..k]
    /// ("no item" after): rows of at most one element a thread by
    /// [`topk_short`], longer ones by [`topk_tiles`].
    pub unsafe fn topk_row<T: Numeric>(row: *const T, cols: u32, k: u32, vals: *mut T, idxs: *mut u32) {
        if cols <= block_dim().min(SHORT_ROW) {
            if T::BYTES == 1 {
                topk_short::<T, u32>(row, cols, k, vals, idxs)
            } else {
                topk_short::<T, T>(row, cols, k, vals, idxs)
            }
        } else if T::BYTES == 1 {
            // u8 ranked as u32 (the same order): in 16-bit registers the
            // rounds spilled.
            topk_tiles::<T, u32, 16>(row, cols, k, vals, idxs)
        } else if tile_slots::<T>() == 8 {
            topk_tiles::<T, T, 8>(row, cols, k, vals, idxs)
        } else {
            topk_tiles::<T, T, 16>(row, cols, k, vals, idxs)
        }
    }

    /// [`topk_row`] for a row of at most B elements (and [`SHORT_ROW`]),
    /// ranked as W (T itself, or u32 for u8, as in [`topk_tiles`]), with
    /// no rounds: thread t puts element t in shared memory, and after one
    /// barrier each element's place is its rank, the number of the row's
    /// elements that come [`before`] it (read in the same order by every
    /// thread: one broadcast load each). An element of rank < min(k, 64)
    /// writes itself there; slots from min(cols, k, 64) on get "no item".
    ///
    /// Why: [`topk_tiles`] takes up to k rounds of a block reduction (two
    /// barriers each) per tile, and their latency is all a short row's
    /// time goes on: 10 rows of 100 columns, K = 8, took 21-22 µs of
    /// kernel time on an H100 (occupancy 15.8%, memory throughput 1.5%),
    /// against about 8 µs for other small kernels.
    ///
    /// No branch on the thread before the barrier: every thread loads (past
    /// the row, the row's last element again) and stores (past the row,
    /// into a spare slot after the row's). The kit's barrier was once an
    /// `asm!` block, which LLVM copied into both arms of an `if t < cols
    /// { store }` written here before it: a warp split by the row's end
    /// waited at two `bar.sync`, and topk_rows hung in the GPU check on an
    /// H100. It is now LLVM's convergent barrier, which may not be copied
    /// so; this body needs neither.
    ///
    /// Not inlined: inlined beside [`topk_tiles`] it moved that path's
    /// register allocation (ptxas spilled in its tile loop); as a call
    /// neither path spills.
    #[inline(never)]
    unsafe fn topk_short<T: Numeric, W: Numeric>(row: *const T, cols: u32, k: u32, vals: *mut T, idxs: *mut u32) {
        let (t, nt) = (thread_idx(), block_dim());
        let kk = k.min(TOPK_MAX);
        if cols > 0 {
            let sv = shared_array!(topk_short_values: [W; SHORT_ROW as usize + 1], room = f64);
            let mine = t < cols;
            let v = T::load_nc(row.add(t.min(cols - 1) as usize));
            let me = (W::from_bits64(v.to_bits64()), t);
            sv.set(if mine { t } else { SHORT_ROW } as usize, me.0);
            // Every element is in place before any is ranked; the barrier
            // after each row keeps the next row's from overwriting them.
            sync_threads();
            let mut rank = 0u32;
            let mut j = 0u32;
            while j < cols {
                rank += before((sv.get(j as usize), j), me) as u32;
                j += 1;
            }
            if mine && rank < kk {
                T::store(vals.add(rank as usize), v);
                u32::store(idxs.add(rank as usize), t);
            }
        }
        let mut i = cols.min(kk) + t;
        while i < k {
            T::store(vals.add(i as usize), T::LOWEST);
            u32::store(idxs.add(i as usize), NONE);
            i += nt;
        }
    }

    /// [`topk_row`] with N elements a thread in registers, ranked as W
    /// (T itself, or u32 for u8).
    ///
    /// The row goes by tiles of B·N elements (N = 16: 4096 at B = 256).
    /// The best items so far, at most 64, sorted, are a list in shared
    /// memory. A tile's elements that do not beat the list's last (once it
    /// is full) drop out at once; the rest are taken best first, one per
    /// round: each thread offers its best live slot, a block reduction
    /// picks the winner, thread 0 appends it to the tile's list and its
    /// owner retires it and offers its next. Rounds stop after k winners
    /// or when none is left, and the tile's list is merged into the row's
    /// (each item's place is its rank in its own list plus its rank in
    /// the other). For 4096 columns at 256 threads that is one tile, k
    /// rounds and no merge.
    #[inline(always)]
    unsafe fn topk_tiles<T: Numeric, W: Numeric, const N: usize>(
        row: *const T,
        cols: u32,
        k: u32,
        vals: *mut T,
        idxs: *mut u32,
    ) {
        const CAP: u32 = TOPK_MAX;
        let (t, nt) = (thread_idx(), block_dim());
        let kk = k.min(CAP);
        // Three lists of CAP items: the row's (list `l`), the tile's (`s`)
        // and the merge of the two (`m`); the numbers rotate.
        let lv = shared_array!(topk_values: [W; 192], room = f64);
        let li = shared_array!(topk_indices: [u32; 192]);
        let (mut l, mut s, mut m) = (0u32, 1u32, 2u32);
        let mut len = 0u32;
        let op = First::<W>::new();
        let vec = aligned(row);
        let tile = nt * N as u32;
        let mut lo = 0u32;
        while lo < cols {
            let n = (cols - lo).min(tile);
            let (v, mut live) = load_tile::<T, N>(row, lo, n, vec, T::LOWEST);
            let v = v.map(|x| W::from_bits64(x.to_bits64()));
            if len == kk {
                // Only what beats the list's last can enter it.
                let i = (l * CAP + kk - 1) as usize;
                let bar = (lv.get(i), li.get(i));
                unroll!(sl, 16, {
                    if (sl as usize) < N && !before((v[sl as usize], tile_col(lo, sl, t, nt)), bar) {
                        live &= !(1 << sl);
                    }
                });
            }
            let mut best = tile_best(&v, live, lo, t, nt);
            let mut c = 0u32;
            while c < kk {
                let w = block::reduce(op, best);
                if w.1 == NONE {
                    break;
                }
                if t == 0 {
                    lv.set((s * CAP + c) as usize, w.0);
                    li.set((s * CAP + c) as usize, w.1);
                }
                // The winner's slot: tile_col inverted.
                let rel = w.1 - lo;
                let grp = rel / 4;
                let round = grp / nt;
                if grp - round * nt == t {
                    live &= !(1 << (round * 4 + rel % 4));
                    best = tile_best(&v, live, lo, t, nt);
                }
                c += 1;
            }
            // The tile's list, written by thread 0, is read by all.
            sync_threads();
            if len == 0 {
                // The first winners are the row's list as they stand.
                core::mem::swap(&mut l, &mut s);
                len = c;
            } else if c > 0 {
                let mut i = t;
                while i < len + c {
                    // Item j of list `from`; `other` holds `on` items.
                    let (from, j, other, on) = if i < len { (l, i, s, c) } else { (s, i - len, l, len) };
                    let src = (from * CAP + j) as usize;
                    let x = (lv.get(src), li.get(src));
                    let pos = j + count_before(&lv, &li, other * CAP, on, x);
                    if pos < kk {
                        lv.set((m * CAP + pos) as usize, x.0);
                        li.set((m * CAP + pos) as usize, x.1);
                    }
                    i += nt;
                }
                // The merged list is complete before anyone reads it, and
                // the old ones are read before the next tile reuses them.
                sync_threads();
                core::mem::swap(&mut l, &mut m);
                len = (len + c).min(kk);
            }
            lo += n;
        }
        let mut i = t;
        while i < k {
            let x = if i < len {
                let at = (l * CAP + i) as usize;
                (T::from_bits64(lv.get(at).to_bits64()), li.get(at))
            } else {
                (T::LOWEST, NONE)
            };
            T::store(vals.add(i as usize), x.0);
            u32::store(idxs.add(i as usize), x.1);
            i += nt;
        }
    }

    /// y = x − max − log Σ exp(x − max) over one row of `cols`.
    pub unsafe fn log_softmax_row<T: Float>(x: *const T, y: *mut T, cols: u32) {
        if tile_slots::<T>() == 8 {
            log_softmax_tiles::<T, 8>(x, y, cols)
        } else {
            log_softmax_tiles::<T, 16>(x, y, cols)
        }
    }

    /// [`log_softmax_row`] with N elements a thread in registers.
    ///
    /// Each thread keeps a running maximum m and a sum s of exp(x − m)
    /// over its elements, tile by tile (s rescaled when a tile raises m);
    /// the block's maximum M is one reduction, Σ s·exp(m − M) another.
    /// While no number above −∞ has been seen, exponentials are taken
    /// relative to 0: −∞ adds 0 and a NaN still makes the sum NaN, as on
    /// the CPU (any NaN in a row makes the whole row NaN).
    #[inline(always)]
    unsafe fn log_softmax_tiles<T: Float, const N: usize>(x: *const T, y: *mut T, cols: u32) {
        let tile = block_dim() * N as u32;
        let vec = aligned(x) && aligned(y as *const T);
        let (mut m, mut s) = (T::NEG_INFINITY, T::ZERO);
        let mut last = [T::NEG_INFINITY; N];
        let mut lo = 0u32;
        while lo < cols {
            let n = (cols - lo).min(tile);
            // Unused slots hold −∞: no effect on a maximum, 0 to a sum.
            let (v, _) = load_tile::<T, N>(x, lo, n, vec, T::NEG_INFINITY);
            let mut tm = T::NEG_INFINITY;
            for &vi in &v {
                tm = tm.max(vi);
            }
            if tm > m {
                s = s * exp_le0(m - tm);
                m = tm;
            }
            let mref = if m > T::NEG_INFINITY { m } else { T::ZERO };
            for &vi in &v {
                s += exp_le0(vi - mref);
            }
            last = v;
            lo += n;
        }
        let mm = block::reduce(Max::<T>::new(), m);
        let lse = block::reduce(Sum::<T>::new(), s * exp_le0(m - mm)).log();
        let f = |v: T| (v - mm) - lse;
        if cols <= tile {
            store_tile(y, 0, cols, vec, &last, f);
        } else {
            let mut lo = 0u32;
            while lo < cols {
                let n = (cols - lo).min(tile);
                let (v, _) = load_tile::<T, N>(x, lo, n, vec, T::NEG_INFINITY);
                store_tile(y, lo, n, vec, &v, f);
                lo += n;
            }
        }
    }
}
