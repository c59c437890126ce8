//! A drain's launches, one per kernel and element type, handed to the
//! backend; a launch the backend refuses ends gpud, every job answered.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Daemon, InFlight};
use crate::backend::Launch;
use crate::coalesce::{self, Coalescer};
use crate::descriptor::{Job, KernelRef};
use crate::error::Result;
use crate::layout::{StallPhase, Status};
use crate::layout::ElemType;
use crate::modules::UserKernel;
use crate::ops::user::{UserGroupOp, UserOp};
use crate::ops::KernelOp;
use std::borrow::Cow;

/// One launch a drain makes: a built-in's (`op` None), a user's kernel's,
/// or a group launch (`group`: the bytes of shared input it reads once).
struct Planned<'c> {
    kernel: KernelRef,
    ty: ElemType,
    jobs: Cow<'c, [Job]>,
    op: Option<Box<dyn KernelOp + Sync>>,
    group: Option<u64>,
}

impl Daemon {
    pub(super) fn submit_all(&mut self, coalescer: &Coalescer) -> Result<bool> {
        let drained = self.drain_started;
        let drain = self.next_drain;
        self.next_drain += 1;
        // Built-ins, users' launches, then group launches: a group's pass
        // (the CPU backend runs each in its submit) never holds the
        // drain's other launches back.
        let mut plan: Vec<Planned<'_>> = coalescer
            .groups()
            .map(|(k, ty, jobs)| Planned { kernel: KernelRef::Builtin(k), ty, jobs: Cow::Borrowed(jobs), op: None, group: None })
            .collect();
        let mut grouped = Vec::new();
        for (key, jobs) in coalescer.user_groups() {
            // Validated in this drain, and no control descriptor since.
            let Some(k) = self.modules.kernel(key.id) else { continue };
            let spec = k.group.as_ref().filter(|_| self.groups_for(k, key.ty));
            let Some(spec) = spec else {
                let op: Box<dyn KernelOp + Sync> = Box::new(UserOp(k.clone()));
                plan.push(Planned { kernel: KernelRef::User(key.id), ty: key.ty, jobs: Cow::Borrowed(jobs), op: Some(op), group: None });
                continue;
            };
            // On the CPU backend a job naming the body the group's is not
            // (`EC_OPT_CPU_RUNS_*`) runs alone, through its own.
            let on_cpu = self.backend.kind() == "cpu";
            let (own, jobs): (Vec<Job>, Vec<Job>) =
                jobs.iter().cloned().partition(|j| on_cpu && !k.runs_default_body(key.ty as usize, j.launch_opts()[3]));
            let (mut alone, groups) = coalesce::form_groups(&jobs, spec);
            alone.extend(own);
            if !alone.is_empty() {
                let op: Box<dyn KernelOp + Sync> = Box::new(UserOp(k.clone()));
                plan.push(Planned { kernel: KernelRef::User(key.id), ty: key.ty, jobs: Cow::Owned(alone), op: Some(op), group: None });
            }
            for g in groups {
                let shared = spec.shared.iter().map(|&s| g[0].slot(usize::from(s)).bytes()).sum();
                let op: Box<dyn KernelOp + Sync> = Box::new(UserGroupOp(k.clone()));
                grouped.push(Planned { kernel: KernelRef::UserGroup(key.id), ty: key.ty, jobs: Cow::Owned(g), op: Some(op), group: Some(shared) });
            }
        }
        plan.append(&mut grouped);
        let mut groups = plan.iter();
        while let Some(p) = groups.next() {
            let (kernel, ty, jobs) = (p.kernel, p.ty, &*p.jobs);
            self.ring.stats().launches.fetch_add(1, Ordering::Relaxed);
            if p.group.is_some() {
                let s = self.ring.stats();
                s.group_launches.fetch_add(1, Ordering::Relaxed);
                s.group_jobs.fetch_add(jobs.len() as u64, Ordering::Relaxed);
            }
            let launch = Launch {
                kernel,
                op: match (kernel, &p.op) {
                    (KernelRef::Builtin(k), _) => crate::ops::op(k),
                    (KernelRef::User(_) | KernelRef::UserGroup(_), Some(op)) => &**op,
                    (KernelRef::User(_) | KernelRef::UserGroup(_), None) => unreachable!("users' launches carry their op"),
                },
                ty,
                jobs,
                independent: coalesce::independent(jobs),
            };
            let arena = self.segments.arena().with_host_buffers(self.backend.host_buffers());
            let t = Instant::now();
            let submitted = self.backend.submit(&arena, &launch);
            let backend = t.elapsed();
            self.count_stall(StallPhase::Submit, t);
            if let (Ok(_), Some(wide)) = (&submitted, self.backend.last_wide()) {
                let s = self.ring.stats();
                let placed = if wide { &s.launches_wide } else { &s.launches_beside_lane };
                placed.fetch_add(1, Ordering::Relaxed);
            }
            match submitted {
                Ok(ticket) => self.in_flight.push(InFlight {
                    ticket,
                    kernel: Some(kernel),
                    small: jobs.iter().all(Job::is_small),
                    jobs: jobs.iter().map(Job::user_data).collect(),
                    lands: None,
                    drain,
                    drained,
                    submitted: Instant::now(),
                    backend,
                    enqueue: self.backend.last_enqueue(),
                    group: p.group.map(|shared| (jobs.len() as u32, shared)),
                }),
                Err(e) => {
                    log!(Error, "gpud[{}]: {kernel:?} launch failed: {e}", self.device);
                    // This launch, the rest of the drain and everything in
                    // flight: all answered before gpud exits.
                    // Launches that did finish (the CPU backend's, say)
                    // are answered as done; everything else DEVICE_ERROR.
                    if matches!(kernel, KernelRef::User(_) | KernelRef::UserGroup(_)) {
                        // A user's launch failed: the VM answers (fail_all).
                        self.in_flight.push(InFlight {
                            ticket: 0,
                            kernel: Some(kernel),
                            small: false,
                            jobs: Vec::new(),
                            lands: None,
                            drain,
                            drained,
                            submitted: Instant::now(),
                            backend,
                            enqueue: Duration::ZERO,
                            group: None,
                        });
                        self.fail_all();
                        return Err(e);
                    }
                    let mut ok = self.answer_jobs(jobs, Status::DeviceError);
                    for rest in groups.by_ref() {
                        ok = ok && self.answer_jobs(&rest.jobs, Status::DeviceError);
                    }
                    self.ring.cq_publish();
                    if ok && matches!(self.reap(), Ok(true)) {
                        self.fail_all();
                    }
                    return Err(e);
                }
            }
        }
        Ok(true)
    }
}

impl Daemon {
    /// True when jobs of `k` on `ty` form group launches: grouping is on
    /// (`--group-launches`), and on the CPU backend the body it runs for
    /// one job has a group twin.
    fn groups_for(&self, k: &UserKernel, ty: ElemType) -> bool {
        self.group_launches && (self.backend.kind() != "cpu" || k.groups_on_cpu(ty))
    }
}
