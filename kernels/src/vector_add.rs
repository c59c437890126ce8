//! `vector_add_f32` / `vector_add_f64`: `out[i] = a[i] + b[i]`, batched
//! (ABI: `abi.rs`, [`VecAddJob`]). VADD_ELEMS_PER_BLOCK elements per virtual
//! block for both types: 256 threads × 4 groups of 4 consecutive elements,
//! loaded as 16-byte vectors when `a`, `b` and `out` are all 16-byte aligned.
//! `out` may be exactly `a` or `b`, so the loads are the coherent ones.

use crate::abi::{VecAddJob, VADD_ELEMS_PER_BLOCK};
use crate::common::*;

#[inline(always)]
unsafe fn vector_add<T: Float>(jobs: *const VecAddJob, njobs: u32, total_blocks: u32) {
    let t = thread_idx() as u64;
    let mut vb = block_idx();
    while vb < total_blocks {
        let j = owner(njobs, vb as u64, |i| (*jobs.add(i as usize)).block_start);
        let job = *jobs.add(j as usize);
        let (a, b, out) = (job.a as *const T, job.b as *const T, job.out as *mut T);
        let base = (vb as u64 - job.block_start) * VADD_ELEMS_PER_BLOCK;
        let len = job.len;
        if (job.a | job.b | job.out) & 15 == 0 {
            let mut va = [[T::ZERO; 4]; 4];
            let mut vbv = [[T::ZERO; 4]; 4];
            let mut ok = [false; 4];
            for i in 0..4 {
                let e = base + (t + 256 * i as u64) * 4;
                ok[i] = e + 4 <= len;
                if ok[i] {
                    va[i] = T::ldg4(a.add(e as usize));
                    vbv[i] = T::ldg4(b.add(e as usize));
                }
            }
            for i in 0..4 {
                let e = base + (t + 256 * i as u64) * 4;
                if ok[i] {
                    let r = [va[i][0] + vbv[i][0], va[i][1] + vbv[i][1], va[i][2] + vbv[i][2], va[i][3] + vbv[i][3]];
                    T::stg4(out.add(e as usize), r);
                } else {
                    for q in 0..4u64 {
                        if e + q < len {
                            let x = T::ldg(a.add((e + q) as usize)) + T::ldg(b.add((e + q) as usize));
                            T::stg(out.add((e + q) as usize), x);
                        }
                    }
                }
            }
        } else {
            for i in 0..16u64 {
                let e = base + t + 256 * i;
                if e < len {
                    let x = T::ldg(a.add(e as usize)) + T::ldg(b.add(e as usize));
                    T::stg(out.add(e as usize), x);
                }
            }
        }
        vb += grid_dim();
    }
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn vector_add_f32(jobs: *const VecAddJob, njobs: u32, total_blocks: u32) {
    vector_add::<f32>(jobs, njobs, total_blocks)
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn vector_add_f64(jobs: *const VecAddJob, njobs: u32, total_blocks: u32) {
    vector_add::<f64>(jobs, njobs, total_blocks)
}
