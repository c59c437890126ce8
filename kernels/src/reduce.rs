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
/// `t` of `nt` striding through it.
#[inline(always)]
unsafe fn partial<T: Float, const DOT: bool>(a: *const T, b: *const T, lo: u64, hi: u64, t: u64, nt: u64) -> T {
    let a = a.add(lo as usize);
    let b = if DOT { b.add(lo as usize) } else { b };
    let n = hi - lo;
    let aligned = if DOT { ((a as u64) | (b as u64)) & 15 == 0 } else { (a as u64) & 15 == 0 };
    let mut acc = [T::ZERO; 8];
    let mut tail_from = 0u64;
    if aligned {
        let n4 = n / 4;
        let mut i = t;
        // 2 groups of 4 per operand in flight per iteration, 8 accumulators.
        while i + nt < n4 {
            let x0 = T::ldg4_nc(a.add(4 * i as usize));
            let x1 = T::ldg4_nc(a.add(4 * (i + nt) as usize));
            if DOT {
                let y0 = T::ldg4_nc(b.add(4 * i as usize));
                let y1 = T::ldg4_nc(b.add(4 * (i + nt) as usize));
                for q in 0..4 {
                    acc[q] += x0[q] * y0[q];
                    acc[4 + q] += x1[q] * y1[q];
                }
            } else {
                for q in 0..4 {
                    acc[q] += x0[q];
                    acc[4 + q] += x1[q];
                }
            }
            i += 2 * nt;
        }
        if i < n4 {
            let x0 = T::ldg4_nc(a.add(4 * i as usize));
            if DOT {
                let y0 = T::ldg4_nc(b.add(4 * i as usize));
                for q in 0..4 {
                    acc[q] += x0[q] * y0[q];
                }
            } else {
                for q in 0..4 {
                    acc[q] += x0[q];
                }
            }
        }
        tail_from = n4 * 4;
    }
    let mut e = tail_from + t;
    while e < n {
        let x = T::ldg_nc(a.add(e as usize));
        let v = if DOT { x * T::ldg_nc(b.add(e as usize)) } else { x };
        // `nt` is even, so all of a thread's tail terms go to one accumulator
        // either way; f64 names it statically (the select between two f64
        // accumulators cost reduce_f64 an 8-byte ptxas spill on sm_90).
        if T::BYTES == 8 {
            acc[0] += v;
        } else {
            acc[(e & 1) as usize] += v;
        }
        e += nt;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
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
    let t = tid();
    let small_blocks = reduce_small_blocks(n_small);
    let medium_end = small_blocks + n_medium;
    let mut vb = bid();
    while vb < total_blocks {
        if vb < small_blocks {
            // one warp per job
            let j = vb * REDUCE_WARPS + (t >> 5);
            if j < n_small {
                let job = *jobs.add(j as usize);
                let s = partial::<T, DOT>(job.a as *const T, job.b as *const T, 0, job.len, (t & 31) as u64, 32);
                let s = warp_sum(s);
                if t & 31 == 0 {
                    T::stg(job.out as *mut T, s);
                }
            }
        } else if vb < medium_end {
            // one block per job
            let job = *jobs.add((n_small + (vb - small_blocks)) as usize);
            let s = partial::<T, DOT>(job.a as *const T, job.b as *const T, 0, job.len, t as u64, REDUCE_THREADS as u64);
            let s = block_sum(s, smem);
            if t == 0 {
                T::stg(job.out as *mut T, s);
            }
        } else {
            // one block per chunk of a large job
            let large = jobs.add((n_small + n_medium) as usize);
            let lb = (vb - medium_end) as u64;
            let j = upper_search(n_large, lb, |i| (*large.add(i as usize)).block_start);
            let job = *large.add(j as usize);
            let lo = (lb - job.block_start) * REDUCE_LARGE_CHUNK;
            let hi = if lo + REDUCE_LARGE_CHUNK < job.len { lo + REDUCE_LARGE_CHUNK } else { job.len };
            let s = partial::<T, DOT>(job.a as *const T, job.b as *const T, lo, hi, t as u64, REDUCE_THREADS as u64);
            let s = block_sum(s, smem);
            if t == 0 {
                T::red_add(job.out as *mut T, s);
            }
        }
        vb += gdim();
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
