//! `saxpy`: `out[i] = alpha * x[i] + y[i]`, Args `[Alpha, X, Y]`. Alpha is
//! rounded to the element type first; the GPU fuses the multiply-add (one
//! rounding), the CPU rounds twice: within 2 units of the last place either
//! way (the tests' tolerance).

use super::{abi, elementwise, push_pod, DevPtrs, DeviceLaunch, Float, KernelOp};
use crate::backend::Arena;
use crate::descriptor::Job;
use crate::layout::ElemType;
use crate::with_float;

pub struct Op;

impl KernelOp for Op {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        with_float!(job.ty(), T => {
            let alpha = T::from_f64(job.scalar(0));
            // SAFETY: forwarded from the caller.
            unsafe { elementwise::<T>(arena, job, |x, y| alpha * x + y) }
        })
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        let mut t: Vec<abi::SaxpyJob> = jobs
            .iter()
            .zip(ptrs)
            .map(|(j, p)| abi::SaxpyJob {
                x: p.in0,
                y: p.in1,
                out: p.out,
                len: j.out().len() as u64,
                block_start: 0,
                alpha: j.scalar(0),
            })
            .collect();
        let total = abi::saxpy_prepare(&mut t)?;
        push_pod(table, &t);
        Some(DeviceLaunch::counted(jobs.len(), total, abi::SAXPY_MAX_GRID, 0))
    }

    fn reference(&self, ty: ElemType, ins: &[&[f64]], scalars: &[f64], _dims: &[u32]) -> Vec<(f64, f64)> {
        let alpha = super::rounded(scalars[0], ty);
        ins[0].iter().zip(ins[1]).map(|(&x, &y)| super::dot2([(alpha, x), (y, 1.0)].into_iter())).collect()
    }

    fn blocks(&self, job: &Job) -> u64 {
        abi::div_ceil_u64(job.out().len() as u64, abi::SAXPY_ELEMS_PER_BLOCK)
    }
    // Placement: mapped, like vector_add (the same streaming access).
}
