//! A user's kernel as a [`KernelOp`]: the host code of its module on the
//! CPU, the helper crate's job table (`kitjob`) on the GPU. Validation
//! (`descriptor.rs`) already held the job to the kernel's signature and
//! counted its virtual blocks.

use std::sync::Arc;

use super::{DevPtrs, DeviceLaunch, KernelOp};
use crate::arena::Arena;
use crate::descriptor::Job;
use crate::kitjob::Job as KitJob;
use crate::modules::UserKernel;

pub struct UserOp(pub Arc<UserKernel>);

impl KernelOp for UserOp {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        // SAFETY: the caller's promise, passed on.
        if let Some(f) = unsafe { self.cpu_checked(arena, job) } {
            crate::log!(Warning, "gpud: kernel {}: its GPU body run on the CPU stopped: {f:?}", self.0.name);
        }
    }

    unsafe fn cpu_checked(&self, arena: &Arena<'_>, job: &Job) -> Option<crate::kitjob::Fault> {
        let mut ptrs = DevPtrs::default();
        let outs = crate::layout::EC_MAX_VECTORS as usize..;
        for (i, r) in job.inputs().iter().enumerate().chain(outs.zip(job.outputs())) {
            ptrs.addr[i] = arena.host_ptr(*r) as u64;
        }
        // Every output starts zeroed, as the signature language promises
        // (a kernel may add into it, or leave parts of it alone), but for
        // a `w` output, which the kernel writes in full.
        let outs = self.0.sig.outs();
        for (k, r) in job.outputs().iter().enumerate() {
            if outs.get(k).is_some_and(|o| o.whole) {
                continue;
            }
            // SAFETY: the job's own output region (arena or host buffer),
            // r.bytes() long at host_ptr; nothing else touches it while the
            // job runs (KernelOp::cpu).
            unsafe { std::ptr::write_bytes(arena.host_ptr(*r), 0, r.bytes() as usize) };
        }
        let kj = super::kit_job(job, &ptrs);
        let ty = job.ty() as usize;
        // SAFETY (both calls): the module's host code for this kernel and
        // type; the job's regions hold the lengths its signature states, and
        // the caller keeps them unaliased (KernelOp::cpu). What the code does
        // beyond that is the module's trust (SECURITY.md): a fault there ends
        // gpud, never the VM.
        if let Some(f) = self.0.host[ty].filter(|_| !self.0.runs_gpu_body) {
            unsafe { f(&kj) };
            return None;
        }
        // No CPU body, or `cpu_runs` is gpu: the GPU code, each block's
        // threads emulated.
        let f = self.0.host_gpu[ty].expect("loading admits only kernels with host code for every type");
        let mut fault = crate::kitjob::Fault::default();
        // The GPU body stopped short (its outputs incomplete): the job is
        // answered with the fault instead of its outputs.
        (unsafe { f(&kj, &mut fault) } != 0).then_some(fault)
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        let g = jobs[0].geometry();
        let mut t: Vec<KitJob> = jobs.iter().zip(ptrs).map(|(j, p)| super::kit_job(j, p)).collect();
        // Validation counted each job's blocks by the kernel's rule.
        let mut blocks = jobs.iter().map(Job::blocks);
        let total = crate::kitjob::prepare(&mut t, |_| u64::from(blocks.next().unwrap_or(0)))?;
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
        u64::from(job.blocks())
    }

    /// Every output of a user's kernel starts zeroed unless its signature
    /// says the kernel writes it in full (`w`): gpud cannot tell which
    /// kernels add into theirs atomically, so a job with an `o` or `s`
    /// output has them all in zeroed device scratch (or zeroed in their
    /// buffers), and one whose outputs are all `w` has them written as a
    /// built-in kernel's are, through the mapping or in place, with no
    /// memset and no copy back.
    fn accumulates_into_output(&self, _job: &Job) -> bool {
        self.0.sig.outs().iter().any(|o| !o.whole)
    }
}
