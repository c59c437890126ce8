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

/// `job` as the kit's record of host addresses, its outputs zeroed but
/// for a `w` output, which the kernel writes in full (every output starts
/// zeroed, as the signature language promises: a kernel may add into it,
/// or leave parts of it alone).
///
/// # Safety
/// As [`KernelOp::cpu`]: nothing else touches the job's outputs.
unsafe fn host_job(k: &UserKernel, arena: &Arena<'_>, job: &Job) -> KitJob {
    let mut ptrs = DevPtrs::default();
    let outs = crate::layout::EC_MAX_VECTORS as usize..;
    for (i, r) in job.inputs().iter().enumerate().chain(outs.zip(job.outputs())) {
        ptrs.addr[i] = arena.host_ptr(*r) as u64;
    }
    let decl = k.sig.outs();
    for (i, r) in job.outputs().iter().enumerate() {
        if decl.get(i).is_some_and(|o| o.whole) {
            continue;
        }
        // SAFETY: the job's own output region (arena or host buffer),
        // r.bytes() long at host_ptr; nothing else touches it while the
        // job runs (the caller's promise).
        unsafe { std::ptr::write_bytes(arena.host_ptr(*r), 0, r.bytes() as usize) };
    }
    super::kit_job(job, &ptrs)
}

/// A group launch of a user's kernel: its group body over jobs whose
/// shared vectors are one device buffer and whose same_ parameters are
/// equal (the daemon groups them, `daemon/submit.rs`), under the kernel's
/// group id ([`UserKernel::group_id`]).
pub struct UserGroupOp(pub Arc<UserKernel>);

impl KernelOp for UserGroupOp {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        // SAFETY: the caller's promise, passed on.
        unsafe { UserOp(self.0.clone()).cpu(arena, job) }
    }

    unsafe fn cpu_together(&self, arena: &Arena<'_>, jobs: &[Job]) -> Option<Vec<(u64, crate::kitjob::Fault)>> {
        let Some(first) = jobs.first() else { return Some(Vec::new()) };
        // SAFETY: the caller's promise, for every job.
        let kjs: Vec<KitJob> = jobs.iter().map(|j| unsafe { host_job(&self.0, arena, j) }).collect();
        let (ty, n) = (first.ty() as usize, kjs.len() as u32);
        // SAFETY (both calls): the module's group code for this kernel and
        // type, over jobs the daemon grouped (shared buffers and same_
        // parameters equal), each holding the lengths its signature
        // states; the rest is the module's trust, as for `UserOp`.
        // Every member runs the kernel's default body (the daemon leaves a
        // job naming the other alone): the first's is the group's.
        if !self.0.runs_gpu_body_for(ty, first.launch_opts()[3]) {
            if let Some(f) = self.0.host_group[ty] {
                unsafe { f(kjs.as_ptr(), n) };
                return Some(Vec::new());
            }
        }
        let f = self.0.host_gpu_group[ty].expect("loading admits only group kernels with both group entries");
        let mut fault = crate::kitjob::Fault::default();
        // A group's GPU body that stopped short left every member's
        // outputs incomplete: each is answered with the fault.
        if unsafe { f(kjs.as_ptr(), n, &mut fault) } != 0 {
            return Some(jobs.iter().map(|j| (j.user_data(), fault)).collect());
        }
        Some(Vec::new())
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        let g = jobs.first()?.geometry();
        let per_block = self.0.group.as_ref()?.jobs_per_block;
        let t: Vec<KitJob> = jobs.iter().zip(ptrs).map(|(j, p)| super::kit_job(j, p)).collect();
        let n = u32::try_from(jobs.len()).ok()?;
        let total = n.div_ceil(per_block);
        super::push_pod(table, &t);
        Some(DeviceLaunch {
            grid: if g.grid > 0 { g.grid.min(total) } else { total.min(super::KIT_MAX_GRID) },
            block: g.threads,
            smem: g.shared_bytes,
            params: [n, total, 0, 0],
            nparams: 2,
        })
    }

    fn blocks(&self, _job: &Job) -> u64 {
        // A virtual block takes up to jobs_per_block jobs: one per job
        // bounds a batch's count from above.
        1
    }

    fn accumulates_into_output(&self, job: &Job) -> bool {
        UserOp(self.0.clone()).accumulates_into_output(job)
    }
}

impl KernelOp for UserOp {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        // SAFETY: the caller's promise, passed on.
        if let Some(f) = unsafe { self.cpu_checked(arena, job) } {
            crate::log!(Warning, "gpud: kernel {}: its GPU body run on the CPU stopped: {f:?}", self.0.name);
        }
    }

    unsafe fn cpu_checked(&self, arena: &Arena<'_>, job: &Job) -> Option<crate::kitjob::Fault> {
        // SAFETY: the caller's promise, passed on.
        let kj = unsafe { host_job(&self.0, arena, job) };
        let ty = job.ty() as usize;
        // SAFETY (both calls): the module's host code for this kernel and
        // type; the job's regions hold the lengths its signature states, and
        // the caller keeps them unaliased (KernelOp::cpu). What the code does
        // beyond that is the module's trust (SECURITY.md): a fault there ends
        // gpud, never the VM.
        if let Some(f) = self.0.host[ty].filter(|_| !self.0.runs_gpu_body_for(ty, job.launch_opts()[3])) {
            unsafe { f(&kj) };
            return None;
        }
        // No CPU body, or `cpu_runs` (the job's, else gpud's) is gpu: the GPU code, each block's
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
