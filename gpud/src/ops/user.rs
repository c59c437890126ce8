//! A user's kernel as a [`KernelOp`]: the host code of its module on the
//! CPU, the helper crate's job table (`kitjob`) on the GPU. Validation
//! (`descriptor.rs`) already held the job to the kernel's declaration.

use std::sync::Arc;

use crate::kitjob::{self, Job as KitJob};
use super::{DevPtrs, DeviceLaunch, KernelOp};
use crate::arena::Arena;
use crate::descriptor::Job;
use crate::modules::{OutRule, UserKernel, UserShape};


pub struct UserOp(pub Arc<UserKernel>);


impl KernelOp for UserOp {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        let ptrs = DevPtrs {
            in0: arena.host_ptr(job.in0()) as u64,
            in1: arena.host_ptr(job.in1()) as u64,
            out: arena.host_ptr(job.out()) as u64,
        };
        let kj = super::kit_job(job, &ptrs);
        let f = self.0.host[job.ty() as usize].expect("validation admits only declared types");
        // SAFETY: the module's host code for this kernel and type; the job's
        // regions are in the arena with the lengths the declaration states,
        // and the caller keeps them unaliased (KernelOp::cpu). What the code
        // does beyond that is the module's trust (SECURITY.md): a fault
        // there ends gpud, never the VM.
        unsafe { f(&kj) }
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        let g = jobs[0].geometry();
        let mut t: Vec<KitJob> = jobs.iter().zip(ptrs).map(|(j, p)| super::kit_job(j, p)).collect();
        // Each job's block count needs its dims, which the job holds decoded.
        let mut start = 0u64;
        for (kj, j) in t.iter_mut().zip(jobs) {
            kj.block_start = start;
            start = start.checked_add(self.blocks(j))?;
        }
        let total = u32::try_from(start).ok()?;
        super::push_pod(table, &t);
        Some(DeviceLaunch {
            grid: if g.grid > 0 { g.grid.min(total) } else { total.min(super::KIT_MAX_GRID) },
            block: g.threads,
            smem: g.shared_bytes,
            params: [jobs.len() as u32, total, 0, 0],
            nparams: 2,
        })
    }

    fn blocks(&self, job: &Job) -> u64 {
        kitjob::blocks_of(self.0.blocks, job.in0().len() as u64, job.geometry().threads, job.dim_args())
    }

    /// A reduction adds its blocks' partials into a zeroed output. A table
    /// kernel with a one-element output gets a zeroed one too: with no
    /// rows (n = 0) no block runs, and it must still read 0, not whatever
    /// the arena held.
    fn accumulates_into_output(&self, _job: &Job) -> bool {
        self.0.shape == UserShape::Reduction || (self.0.shape == UserShape::Table && self.0.out == OutRule::One)
    }
}
