//! `vector_add`: `out[i] = a[i] + b[i]` (one rounding, bit-exact on both
//! backends).

use super::{abi, elementwise, push_pod, DevPtrs, DeviceLaunch, KernelOp};
use crate::arena::Arena;
use crate::descriptor::Job;
use crate::layout::ElemType;
use crate::with_float;

pub struct Op;

impl KernelOp for Op {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        // SAFETY: forwarded from the caller.
        with_float!(job.ty(), T => unsafe { elementwise::<T>(arena, job, |x, y| x + y) })
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        let mut t: Vec<abi::VecAddJob> = jobs
            .iter()
            .zip(ptrs)
            .map(|(j, p)| abi::VecAddJob {
                a: p.in0(),
                b: p.in1(),
                out: p.out(),
                len: j.out().len() as u64,
                block_start: 0,
            })
            .collect();
        let total = abi::vadd_prepare(&mut t)?;
        push_pod(table, &t);
        Some(DeviceLaunch::counted(jobs.len(), total, abi::VADD_MAX_GRID, 0))
    }

    fn reference(&self, _ty: ElemType, ins: &[&[f64]], _scalars: &[f64], _dims: &[u32]) -> Vec<(f64, f64)> {
        ins[0].iter().zip(ins[1]).map(|(&a, &b)| super::dot2([(a, 1.0), (b, 1.0)].into_iter())).collect()
    }

    fn blocks(&self, job: &Job) -> u64 {
        abi::vadd_blocks(job.out().len() as u64)
    }
    // Placement: mapped at every size (the default). The kernel streams at
    // PCIe speed; a copy only adds a step (cuda.rs's table).
}
