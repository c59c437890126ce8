//! `saxpy`: `out[i] = alpha * x[i] + y[i]`, Args `[Alpha, X, Y]`. Alpha is
//! rounded to the element type first; the GPU fuses the multiply-add (one
//! rounding), the CPU rounds twice: within 2 units of the last place either
//! way (the tests' tolerance).
//!
//! The device kernel is declared with the helper crate, as users' kernels
//! are (kernels/src/saxpy.rs): its table is one `kitjob::Job` per job, the
//! layout of `ec_job_args`: alpha is `param[0]` (f64 bits), x slot 0, y
//! slot 1, out slot `EC_MAX_VECTORS`, with `elements(n)` virtual blocks.
//! The CPU path stays here.

use super::{elementwise, kit_job, push_pod, DevPtrs, DeviceLaunch, Float, KernelOp, KIT_MAX_GRID};
use crate::arena::Arena;
use crate::descriptor::Job;
use crate::kitjob;
use crate::layout::{ElemType, EC_MAX_VECTORS};
use crate::with_float;

pub struct Op;

impl KernelOp for Op {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        with_float!(job.ty(), T => {
            let alpha = T::from_f64(job.param_f64(0));
            // SAFETY: forwarded from the caller.
            unsafe { elementwise::<T>(arena, job, |x, y| alpha * x + y) }
        })
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        let mut t: Vec<kitjob::Job> = jobs.iter().zip(ptrs).map(|(j, p)| kit_job(j, p)).collect();
        let total = kitjob::prepare(&mut t, |j| elements_blocks(u64::from(j.len[EC_MAX_VECTORS as usize])))?;
        push_pod(table, &t);
        Some(DeviceLaunch::counted(jobs.len(), total, KIT_MAX_GRID, 0))
    }

    fn reference(&self, ty: ElemType, ins: &[&[f64]], scalars: &[f64], _dims: &[u32]) -> Vec<(f64, f64)> {
        let alpha = super::rounded(scalars[0], ty);
        ins[0].iter().zip(ins[1]).map(|(&x, &y)| super::dot2([(alpha, x), (y, 1.0)].into_iter())).collect()
    }

    fn blocks(&self, job: &Job) -> u64 {
        elements_blocks(job.out().len() as u64)
    }
    // Placement: mapped, like vector_add (the same streaming access).
}

/// Virtual blocks of an elementwise job of `n` elements at the block size
/// gpud launches with (256, the kit's default): the kit's `elements(n)`
/// rule, ceil(n / (threads · ELEMS_PER_THREAD)).
fn elements_blocks(n: u64) -> u64 {
    kitjob::div_ceil(n, u64::from(kitjob::DEFAULT_THREADS) * kitjob::ELEMS_PER_THREAD)
}
