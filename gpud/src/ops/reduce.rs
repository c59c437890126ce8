//! `reduce`: the sum of one vector, a scalar. Also the reduction machinery
//! `dot_product` shares (the same device ABI and placement).

use super::{abi, push_pod, sum, DevPtrs, DeviceLaunch, KernelOp, Placement};
use crate::arena::Arena;
use crate::descriptor::Job;
use crate::layout::ElemType;
use crate::with_float;

pub struct Op;

impl KernelOp for Op {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        with_float!(job.ty(), T => {
            // SAFETY: forwarded from the caller.
            let (a, out) = unsafe { (arena.input::<T>(job.in0()), arena.output::<T>(job.out())) };
            out[0] = sum::<T>(a.len(), |i| a[i]);
        })
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        reduction_table(jobs, ptrs, false, table)
    }

    fn reference(&self, _ty: ElemType, ins: &[&[f64]], _scalars: &[f64], _dims: &[u32]) -> Vec<(f64, f64)> {
        vec![super::dot2(ins[0].iter().map(|&a| (a, 1.0)))]
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

/// Large jobs add their blocks' partials into the output with
/// `red.global.add`, so it must start at zero.
pub(crate) fn large(job: &Job) -> bool {
    abi::reduce_strategy(job.in0().len() as u64) == abi::ReduceStrategy::Large
}

pub(crate) fn reduction_blocks(job: &Job) -> u64 {
    abi::div_ceil_u64(job.in0().len() as u64, abi::REDUCE_LARGE_CHUNK).max(1)
}

/// The `ReduceJob` table (`b` is 0 unless `dot`), reordered by strategy;
/// each job's result goes to its own `out`, so the order is invisible.
pub(crate) fn reduction_table(jobs: &[Job], ptrs: &[DevPtrs], dot: bool, table: &mut Vec<u8>) -> Option<DeviceLaunch> {
    let mut t: Vec<abi::ReduceJob> = jobs
        .iter()
        .zip(ptrs)
        .map(|(j, p)| abi::ReduceJob {
            a: p.in0(),
            b: if dot { p.in1() } else { 0 },
            out: p.out(),
            len: j.in0().len() as u64,
            block_start: 0,
        })
        .collect();
    let plan = abi::reduce_prepare(&mut t)?;
    push_pod(table, &t);
    Some(DeviceLaunch {
        grid: abi::grid_for(plan.total_blocks, abi::REDUCE_MAX_GRID),
        block: 256,
        smem: abi::REDUCE_SMEM_BYTES,
        params: [plan.n_small, plan.n_medium, plan.n_large, plan.total_blocks],
        nparams: 4,
    })
}

/// Reduce/dot jobs of at least this many elements are always copied.
const SUM_COPY_MIN_LARGE: u64 = 1 << 22;
/// Medium jobs of at least this many elements are copied when the launch
/// has at most `SUM_COPY_MAX_JOBS` jobs.
const SUM_COPY_MIN_MEDIUM: u64 = 1 << 14;
const SUM_COPY_MAX_JOBS: usize = 8;

/// One block per medium job (2049..65536 elements) reads the mapping
/// latency-bound, so a lone medium job of >= 16384 elements is copied
/// (65536 f32: 33-36 µs instead of 60); from 4M elements copying is ~7 %
/// faster (16M measured; 1M was a tie); else mapped (cuda.rs's table).
pub(crate) fn reduction_placement(job: &Job, njobs: usize) -> Placement {
    let n = job.in0().len() as u64;
    let lone_medium = njobs <= SUM_COPY_MAX_JOBS
        && n >= SUM_COPY_MIN_MEDIUM
        && abi::reduce_strategy(n) == abi::ReduceStrategy::Medium;
    if lone_medium || n >= SUM_COPY_MIN_LARGE {
        Placement::CopyIn
    } else {
        Placement::Mapped
    }
}
