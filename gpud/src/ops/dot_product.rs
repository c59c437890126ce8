//! `dot_product`: `Σ a[i]·b[i]` over two equal-length vectors, a scalar. The
//! reduction machinery (device ABI, placement) is `reduce`'s.

use super::reduce::{large, reduction_blocks, reduction_placement, reduction_table};
use super::{sum, DevPtrs, DeviceLaunch, KernelOp, Placement};
use crate::arena::Arena;
use crate::descriptor::Job;
use crate::layout::ElemType;
use crate::with_float;

pub struct Op;

impl KernelOp for Op {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        with_float!(job.ty(), T => {
            // SAFETY: forwarded from the caller.
            let (a, b, out) =
                unsafe { (arena.input::<T>(job.in0()), arena.input::<T>(job.in1()), arena.output::<T>(job.out())) };
            out[0] = sum::<T>(a.len(), |i| a[i] * b[i]);
        })
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        reduction_table(jobs, ptrs, true, table)
    }

    fn reference(&self, _ty: ElemType, ins: &[&[f64]], _scalars: &[f64], _dims: &[u32]) -> Vec<(f64, f64)> {
        vec![super::dot2(ins[0].iter().copied().zip(ins[1].iter().copied()))]
    }

    fn blocks(&self, job: &Job) -> u64 {
        reduction_blocks(job)
    }

    fn placement(&self, job: &Job, njobs: usize) -> Placement {
        reduction_placement(job, njobs)
    }

    fn accumulates_into_output(&self, job: &Job) -> bool {
        large(job)
    }
}
