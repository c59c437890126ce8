//! `dot_f32` / `dot_f64`: `*out = Σ a[i]·b[i]`, batched (ABI: `abi.rs`,
//! [`ReduceJob`], the same launch as reduce). The machinery, strategies and
//! accuracy contract are reduce.rs's ([`reduce_impl`] with `DOT = true`);
//! products are fused into the accumulation (`fma`) where LLVM contracts them.

use crate::abi::ReduceJob;
use crate::reduce::reduce_impl;

#[no_mangle]
pub unsafe extern "ptx-kernel" fn dot_f32(jobs: *const ReduceJob, n_small: u32, n_medium: u32, n_large: u32, total_blocks: u32) {
    reduce_impl::<f32, true>(jobs, n_small, n_medium, n_large, total_blocks)
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn dot_f64(jobs: *const ReduceJob, n_small: u32, n_medium: u32, n_large: u32, total_blocks: u32) {
    reduce_impl::<f64, true>(jobs, n_small, n_medium, n_large, total_blocks)
}
