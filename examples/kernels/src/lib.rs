//! Example kernels written with `erlcuda-kernel`, built by
//! `priv/erlcuda-build examples/kernels OUT_DIR` (see README.md).
//!
//! Each macro invocation is a whole kernel: its GPU entries, its CPU
//! entries and its signature. The four here use the fixed-shape macros
//! (`elementwise!`, `reduction!`, `table!`; bodies generic over f32/f64);
//! the eleven in the modules below use `kernel!`, with typed arguments of
//! their own:
//! * [`rows`]: `cos_sim`, `argmax_rows`, `topk_rows`, `log_softmax_rows`;
//! * [`search`]: `cos_topk`, the best rows by cosine similarity;
//! * [`maps`]: `gather`, `axpbypcz`, `gelu`, `u8_to_unit`;
//! * [`scatter`]: `histogram`, `scatter_add`;
//! * [`onebody`]: `tree_row_sums`, `segment_scan`, `transpose`, written
//!   once: a GPU body only, which the CPU backend runs itself (as it runs
//!   `histogram`'s and `argmax_rows`', whose `cpu` bodies were not faster
//!   by the goal's factor).

// The GPU build has no std; the host build (the CPU backend's library)
// keeps it.
#![cfg_attr(target_arch = "nvptx64", no_std)]

pub mod maps;
pub mod math;
pub mod onebody;
pub mod order;
pub mod rows;
pub mod scatter;
pub mod search;

// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
mod group;

#[cfg(test)]
mod tests;

use erlcuda_kernel::{elementwise, reduction, table, BLOCK_SHARED_BYTES};

// out[i] = min(max(x[i], lo), hi): Args [X, Lo, Hi].
elementwise!(clamp, [f32, f64], (x: v, lo: s, hi: s) => x.max(lo).min(hi));

// out = Σ x[i]²: Args [X].
reduction!(sumsq, [f32, f64], (x: v) => x * x);

table! {
    // Softmax of each row of a row-major matrix X with Cols columns:
    // Args [X, Cols]. One block per row: the row's maximum, then
    // e^(x - max) and its sum, then each divided by the sum (stable for
    // any magnitudes: every exponent is <= 0).
    softmax, [f32, f64], (x: v, cols: d),
    out = n, blocks = n / cols, threads = 256, shared = BLOCK_SHARED_BYTES,
    gpu(k, row) {
        let c = cols as usize;
        let (x, out) = (x.add(row as usize * c), k.output().add(row as usize * c));
        let (t, step) = (thread_idx() as usize, block_dim() as usize);
        let mut m = T::NEG_INFINITY;
        for j in (t..c).step_by(step) {
            m = m.max(T::ldg_nc(x.add(j)));
        }
        let m = block_max(m);
        let mut s = T::ZERO;
        for j in (t..c).step_by(step) {
            let e = (T::ldg_nc(x.add(j)) - m).exp();
            T::stg(out.add(j), e);
            s += e;
        }
        let s = block_sum(s);
        // Each thread reads back only what it wrote itself.
        for j in (t..c).step_by(step) {
            T::stg(out.add(j), T::ldg(out.add(j)) / s);
        }
    }
    cpu(k) {
        let c = cols as usize;
        for (xr, or) in x.chunks_exact(c).zip(k.output_slice().chunks_exact_mut(c)) {
            let m = xr.iter().fold(T::NEG_INFINITY, |m, &v| m.max(v));
            for (o, &v) in or.iter_mut().zip(xr) {
                *o = (v - m).exp();
            }
            let s = erlcuda_kernel::sum(c, |j| or[j]);
            for o in or.iter_mut() {
                *o = *o / s;
            }
        }
    }
}

table! {
    // The sum of each row of a row-major matrix X with Cols columns:
    // Args [X, Cols], one result per row. One block per row.
    row_sums, [f32, f64], (x: v, cols: d),
    out = n / cols, blocks = n / cols, threads = 256, shared = BLOCK_SHARED_BYTES,
    gpu(k, row) {
        let c = cols as usize;
        let x = x.add(row as usize * c);
        let mut s = T::ZERO;
        for j in (thread_idx() as usize..c).step_by(block_dim() as usize) {
            s += T::ldg_nc(x.add(j));
        }
        let s = block_sum(s);
        if thread_idx() == 0 {
            T::stg(k.output().add(row as usize), s);
        }
    }
    cpu(k) {
        let c = cols as usize;
        for (o, r) in k.output_slice().iter_mut().zip(x.chunks_exact(c)) {
            *o = erlcuda_kernel::sum(c, |j| r[j]);
        }
    }
}
