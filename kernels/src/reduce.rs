//! `reduce_f32` / `reduce_f64`: `*out = Σ a[i]`, batched (ABI: `abi.rs`,
//! [`ReduceJob`]), and the machinery `dot.rs` shares ([`reduce_impl`] with
//! `DOT = true`: `Σ a[i]·b[i]`).
//!
//! Strategies (chosen on the host by `abi::reduce_prepare`): Small jobs
//! (len ≤ REDUCE_SMALL_MAX) one warp each, Medium (≤ REDUCE_MEDIUM_MAX) one
//! block each, Large one block per REDUCE_LARGE_CHUNK (65536) elements, each
//! block's partial added atomically (`red.global.add`) into the zeroed `out`.
//!
//! Accuracy contract (c_src/erlcuda_ring.h: EC_SUM_SERIAL = 256,
//! EC_SUM_CHUNK = 65536). Sums accumulate in the element type (f32 jobs in
//! f32, f64 jobs in f64) with this structure, for both types:
//! * serial: each accumulator of a thread sums at most 256 terms one after
//!   the other. A thread sees at most 65536 / 256 = 256 elements of a chunk
//!   or Medium job (64 of a Small one); the aligned path spreads them over 8
//!   accumulators (≤ 34 terms each), the unaligned path puts them all into
//!   one (`acc[e & 1]` with an even stride): up to 256;
//! * pairwise tree of depth ≤ 16 after that: accumulator fold (3), warp
//!   shuffles (5), block (3 more, through shared memory);
//! * Large jobs only: one partial per 65536-element chunk added atomically
//!   (in any order) into `out`, i.e. ceil(len / 65536) further additions.
//! Hence |error| ≲ (256 + 16 + ceil(len / 65536)) · u · Σ|terms| (u = 2^-24
//! for f32, 2^-53 for f64; one more u for the product of dot).

use crate::abi::*;
use crate::common::*;

/// This thread's partial sum of `a[lo..hi]` (times `b[..]` if DOT), threads
/// `t` of `nt` striding through it: the kit's [`partial`] (shared with
/// users' `reduction!` kernels), whose accumulators give the serial depths
/// stated above.
#[inline(always)]
unsafe fn partial_of<T: Float, const DOT: bool>(a: *const T, b: *const T, lo: u64, hi: u64, t: u64, nt: u64) -> T {
    if DOT {
        partial([a, b], lo, hi, t, nt, |v| v[0] * v[1])
    } else {
        partial([a], lo, hi, t, nt, |v| v[0])
    }
}

/// The body of `reduce_*` (DOT = false) and `dot_*` (DOT = true).
#[inline(always)]
pub(crate) unsafe fn reduce_impl<T: Float, const DOT: bool>(
    jobs: *const ReduceJob,
    n_small: u32,
    n_medium: u32,
    n_large: u32,
    total_blocks: u32,
) {
    let smem = smem_base();
    let t = thread_idx();
    let small_blocks = reduce_small_blocks(n_small);
    let medium_end = small_blocks + n_medium;
    let mut vb = block_idx();
    while vb < total_blocks {
        if vb < small_blocks {
            // one warp per job
            let j = vb * REDUCE_WARPS + (t >> 5);
            if j < n_small {
                let job = *jobs.add(j as usize);
                let s = partial_of::<T, DOT>(job.a as *const T, job.b as *const T, 0, job.len, (t & 31) as u64, 32);
                let s = warp_sum(s);
                if t & 31 == 0 {
                    T::stg(job.out as *mut T, s);
                }
            }
        } else if vb < medium_end {
            // one block per job
            let job = *jobs.add((n_small + (vb - small_blocks)) as usize);
            let s = partial_of::<T, DOT>(job.a as *const T, job.b as *const T, 0, job.len, t as u64, REDUCE_THREADS as u64);
            let s = block_sum_first(s, smem, REDUCE_WARPS);
            if t == 0 {
                T::stg(job.out as *mut T, s);
            }
        } else {
            // one block per chunk of a large job
            let large = jobs.add((n_small + n_medium) as usize);
            let lb = (vb - medium_end) as u64;
            let j = owner(n_large, lb, |i| (*large.add(i as usize)).block_start);
            let job = *large.add(j as usize);
            let lo = (lb - job.block_start) * REDUCE_LARGE_CHUNK;
            let hi = if lo + REDUCE_LARGE_CHUNK < job.len { lo + REDUCE_LARGE_CHUNK } else { job.len };
            let s = partial_of::<T, DOT>(job.a as *const T, job.b as *const T, lo, hi, t as u64, REDUCE_THREADS as u64);
            let s = block_sum_first(s, smem, REDUCE_WARPS);
            if t == 0 {
                T::red_add(job.out as *mut T, s);
            }
        }
        vb += grid_dim();
    }
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn reduce_f32(jobs: *const ReduceJob, n_small: u32, n_medium: u32, n_large: u32, total_blocks: u32) {
    reduce_impl::<f32, false>(jobs, n_small, n_medium, n_large, total_blocks)
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn reduce_f64(jobs: *const ReduceJob, n_small: u32, n_medium: u32, n_large: u32, total_blocks: u32) {
    reduce_impl::<f64, false>(jobs, n_small, n_medium, n_large, total_blocks)
}
