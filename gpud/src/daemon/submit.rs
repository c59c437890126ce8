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
    /// Submits a drain's launches, holding none (see
    /// [`Daemon::submit_all_holding`]).
    pub(super) fn submit_all(&mut self, coalescer: &Coalescer) -> Result<bool> {
        self.may_hold = false;
        self.submit_all_holding(coalescer, &[])
    }

    /// Submits a drain's launches. Where the drain may hold
    /// (`may_hold`), a group (or a job alone on a device buffer) of a
    /// kernel with group bodies whose members all still have wait left
    /// (`{max_wait_us, W}`; `hold_until`: the ends of the waits of jobs
    /// held before, the others' end W after this drain began) and that is
    /// below the cost bound is held instead, for companions of later
    /// drains. Held jobs are set aside, so other work runs meanwhile.
    pub(super) fn submit_all_holding(&mut self, coalescer: &Coalescer, hold_until: &[(u64, Instant)]) -> Result<bool> {
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
            let Some(k) = self.modules.kernel(key.id).cloned() else { continue };
            let spec = k.group.as_ref().filter(|_| self.groups_for(&k, key.ty));
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
            let (alone, groups) = coalesce::form_groups(&jobs, spec);
            let now = Instant::now();
            let mut alone: Vec<Job> = alone
                .into_iter()
                .filter(|j| !(coalesce::group_key(j, spec).is_some() && self.hold(std::slice::from_ref(j), hold_until, now)))
                .collect();
            alone.extend(own);
            let groups: Vec<Vec<Job>> = groups.into_iter().filter(|g| !self.hold(g, hold_until, now)).collect();
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
    /// Holds `jobs` (one group, or a job alone on a device buffer) when
    /// this drain may hold, each still has wait left and more companions
    /// would fit under the cost bound; true when it did.
    fn hold(&mut self, jobs: &[Job], hold_until: &[(u64, Instant)], now: Instant) -> bool {
        if !self.may_hold {
            return false;
        }
        let until = |j: &Job| {
            let ud = j.user_data();
            hold_until.iter().find(|(u, _)| *u == ud).map_or(self.drain_started + j.max_wait(), |&(_, t)| t)
        };
        let work: u64 = jobs.iter().map(Job::work).sum();
        let widest = jobs.iter().map(Job::work).max().unwrap_or(0);
        let full = jobs.len() >= coalesce::GROUP_MAX_JOBS || work.saturating_add(widest) > coalesce::GROUP_MAX_WORK;
        let ends: Vec<Instant> = jobs.iter().map(until).collect();
        if full || ends.iter().any(|&t| t <= now) {
            return false;
        }
        self.held.extend(jobs.iter().cloned().zip(ends));
        true
    }

    /// True when a held job's wait has ended.
    pub(super) fn held_due(&self) -> bool {
        let now = Instant::now();
        self.held.iter().any(|(_, t)| *t <= now)
    }

    /// How long until the first held job's wait ends (None: none held).
    pub(super) fn hold_left(&self) -> Option<Duration> {
        let now = Instant::now();
        self.held.iter().map(|(_, t)| t.saturating_duration_since(now)).min()
    }

    /// True when jobs of `k` on `ty` form group launches: grouping is on
    /// (`--group-launches`), and on the CPU backend the body it runs for
    /// one job has a group twin.
    fn groups_for(&self, k: &UserKernel, ty: ElemType) -> bool {
        self.group_launches && (self.backend.kind() != "cpu" || k.groups_on_cpu(ty))
    }
}
