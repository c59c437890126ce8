//! `saxpy_f32` / `saxpy_f64`: `out[i] = alpha * x[i] + y[i]` (one fused
//! multiply-add per element), batched (ABI: `abi.rs`, [`SaxpyJob`]). The
//! job's `alpha` is f64; the f32 entry rounds it to f32 first (`alpha as
//! f32`). Streams like vector_add: SAXPY_ELEMS_PER_BLOCK elements per
//! virtual block (256 threads × 4 groups of 4), 16-byte vectors when `x`,
//! `y` and `out` are all 16-byte aligned. `out` may be exactly `x` or `y`
//! (in-place `y = αx + y`), so the loads are the coherent ones.

use crate::abi::{SaxpyJob, SAXPY_ELEMS_PER_BLOCK};
use crate::common::*;

#[inline(always)]
unsafe fn saxpy<T: Float>(jobs: *const SaxpyJob, njobs: u32, total_blocks: u32) {
    let t = tid() as u64;
    let mut vb = bid();
    while vb < total_blocks {
        let j = upper_search(njobs, vb as u64, |i| (*jobs.add(i as usize)).block_start);
        let job = *jobs.add(j as usize);
        let (x, y, out) = (job.x as *const T, job.y as *const T, job.out as *mut T);
        let alpha = T::from_f64(job.alpha);
        let base = (vb as u64 - job.block_start) * SAXPY_ELEMS_PER_BLOCK;
        let len = job.len;
        if (job.x | job.y | job.out) & 15 == 0 {
            let mut vx = [[T::ZERO; 4]; 4];
            let mut vy = [[T::ZERO; 4]; 4];
            let mut ok = [false; 4];
            for i in 0..4 {
                let e = base + (t + 256 * i as u64) * 4;
                ok[i] = e + 4 <= len;
                if ok[i] {
                    vx[i] = T::ldg4(x.add(e as usize));
                    vy[i] = T::ldg4(y.add(e as usize));
                }
            }
            for i in 0..4 {
                let e = base + (t + 256 * i as u64) * 4;
                if ok[i] {
                    let r = [
                        T::fma(alpha, vx[i][0], vy[i][0]),
                        T::fma(alpha, vx[i][1], vy[i][1]),
                        T::fma(alpha, vx[i][2], vy[i][2]),
                        T::fma(alpha, vx[i][3], vy[i][3]),
                    ];
                    T::stg4(out.add(e as usize), r);
                } else {
                    for q in 0..4u64 {
                        if e + q < len {
                            let r = T::fma(alpha, T::ldg(x.add((e + q) as usize)), T::ldg(y.add((e + q) as usize)));
                            T::stg(out.add((e + q) as usize), r);
                        }
                    }
                }
            }
        } else {
            for i in 0..16u64 {
                let e = base + t + 256 * i;
                if e < len {
                    let r = T::fma(alpha, T::ldg(x.add(e as usize)), T::ldg(y.add(e as usize)));
                    T::stg(out.add(e as usize), r);
                }
            }
        }
        vb += gdim();
    }
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn saxpy_f32(jobs: *const SaxpyJob, njobs: u32, total_blocks: u32) {
    saxpy::<f32>(jobs, njobs, total_blocks)
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn saxpy_f64(jobs: *const SaxpyJob, njobs: u32, total_blocks: u32) {
    saxpy::<f64>(jobs, njobs, total_blocks)
}
