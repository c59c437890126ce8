//! Kernels written once: a GPU body and no CPU body. The CPU backend runs
//! the GPU body itself, each block's threads emulated with their barriers,
//! shared memory and warp operations (`erlcuda_kernel::emu`), so one body
//! serves both and a machine without a GPU tests it.
//! * `tree_row_sums`: a row reduction through shared memory and barriers;
//! * `segment_scan`: prefix sums within segments of 4 · threads elements,
//!   through the kit's block scan (warp shuffles, then the warps' totals);
//! * `transpose`: a 2-D tiled transpose through a shared 32 × 33 tile.

use erlcuda_kernel::kernel;

kernel! {
    /// sums[r] = Σ x[r, ..] (x row-major, rows × cols): Args [X, Rows,
    /// Cols]. One block of 128 threads per row: each thread's strided
    /// partial sum into shared memory, then a tree of halving strides with
    /// a barrier at each (the classic one, written out: no shuffle).
    tree_row_sums, T: Numeric in [s32, u32, s64, f32, f64],
    (x: v(T, rows * cols), rows: d, cols: d) -> (sums: w(T, rows)),
    blocks = rows, threads = 128, block_rule = pow2, shared = 0,
    gpu(job, row) {
        let parts = erlcuda_kernel::shared_array!(tree_parts: [T; 1024], room = f64);
        let (t, nt) = (thread_idx() as usize, block_dim() as usize);
        let x = x.add(row as usize * cols as usize);
        let mut s = T::ZERO;
        for j in (t..cols as usize).step_by(nt) {
            s = s + T::load_nc(x.add(j));
        }
        parts.set(t, s);
        sync_threads();
        let mut half = nt / 2;
        while half > 0 {
            if t < half {
                parts.set(t, parts.get(t) + parts.get(t + half));
            }
            sync_threads();
            half /= 2;
        }
        if t == 0 {
            T::store(sums.add(row as usize), parts.get(0));
        }
    }
}

kernel! {
    /// y = the inclusive prefix sums of x within each segment of 4 ·
    /// threads elements (1024 at the default 256), wrapping: Args [X].
    /// Thread t of a block sums its 4 consecutive elements, the block's
    /// exclusive scan of those sums (warp shuffles up, then the warps'
    /// totals through shared memory) gives what comes before them.
    segment_scan, T: Int in [u32, s64],
    (x: v(T, n)) -> (y: w(T, n)),
    blocks = elements(n), threads = 256, block_rule = warps, shared = 0,
    gpu(job, b) {
        use erlcuda_kernel::reduce::Op;
        let n = job.len(0) as usize;
        let base = (b as usize * block_dim() as usize + thread_idx() as usize) * 4;
        let at = |i: usize| if base + i < n { T::load_nc(x.add(base + i)) } else { T::ZERO };
        let v = [at(0), at(1), at(2), at(3)];
        let own = v[0] + v[1] + v[2] + v[3];
        let add = Op { identity: T::ZERO, f: |a: T, c: T| a + c };
        let mut acc = erlcuda_kernel::block::exclusive_scan(add, own);
        for (i, e) in v.into_iter().enumerate() {
            acc = acc + e;
            if base + i < n {
                T::store(y.add(base + i), acc);
            }
        }
    }
}

/// Tile edge of `transpose`.
const TILE: usize = 32;

kernel! {
    /// y = xᵀ (x row-major rows × cols, y cols × rows): Args [X, Rows,
    /// Cols]. 32 × 32 tiles, each read coalesced into a shared tile of 32 ×
    /// 33 (the pad keeps a column's elements in distinct banks), then,
    /// after a barrier, written coalesced. 256 threads as 32 × 8: each
    /// moves 4 rows of the tile. The job's blocks stride over the tiles.
    transpose, T: Element in [u8, s32, f64],
    (x: v(T, rows * cols), rows: d, cols: d) -> (y: w(T, rows * cols)),
    blocks = elements(rows * cols), threads = 256, block_rule = warps, shared = 0,
    gpu(job, b) {
        use erlcuda_kernel::launch::{div_ceil, thread_2d, Tiles};
        let tile = erlcuda_kernel::shared_array!(transpose_tile: [T; TILE * (TILE + 1)], room = f64);
        let (r, c) = (rows as u64, cols as u64);
        let tiles = Tiles::new(r, c, TILE as u64, TILE as u64);
        let (tx, ty) = thread_2d(thread_idx(), TILE as u32);
        let (tx, ty, rows_per) = (tx as usize, ty as usize, block_dim() as usize / TILE);
        // Every virtual block of the job (the `blocks` rule's count).
        let nb = div_ceil(r * c, block_dim() as u64 * 4).max(1);
        let mut k = b;
        while k < tiles.count() {
            let ((r0, r1), (c0, c1)) = tiles.bounds(k);
            for i in (ty..TILE).step_by(rows_per) {
                let (gr, gc) = (r0 as usize + i, c0 as usize + tx);
                if gr < r1 as usize && gc < c1 as usize {
                    tile.set(i * (TILE + 1) + tx, T::load_nc(x.add(gr * c as usize + gc)));
                }
            }
            sync_threads();
            for i in (ty..TILE).step_by(rows_per) {
                // Row c0 + i of y, column r0 + tx.
                let (gr, gc) = (c0 as usize + i, r0 as usize + tx);
                if gr < c1 as usize && gc < r1 as usize {
                    T::store(y.add(gr * r as usize + gc), tile.get(tx * (TILE + 1) + i));
                }
            }
            // Nobody refills the tile before everyone has read it.
            sync_threads();
            k += nb;
        }
    }
}
