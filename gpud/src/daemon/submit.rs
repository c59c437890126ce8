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
use crate::ops::user::UserOp;

impl Daemon {
    pub(super) fn submit_all(&mut self, coalescer: &Coalescer) -> Result<bool> {
        let drained = self.drain_started;
        let drain = self.next_drain;
        self.next_drain += 1;
        let users: Vec<_> = coalescer
            .user_groups()
            .filter_map(|(key, jobs)| {
                // Validated in this drain, and no control descriptor since.
                let k = self.modules.kernel(key.id)?;
                Some((KernelRef::User(key.id), key.ty, jobs, UserOp(k.clone())))
            })
            .collect();
        let mut groups = coalescer
            .groups()
            .map(|(k, ty, jobs)| (KernelRef::Builtin(k), ty, jobs, None))
            .chain(users.iter().map(|(k, ty, jobs, op)| (*k, *ty, *jobs, Some(op))));
        while let Some((kernel, ty, jobs, user_op)) = groups.next() {
            self.ring.stats().launches.fetch_add(1, Ordering::Relaxed);
            let launch = Launch {
                kernel,
                op: match (kernel, user_op) {
                    (KernelRef::Builtin(k), _) => crate::ops::op(k),
                    (KernelRef::User(_), Some(op)) => op,
                    (KernelRef::User(_), None) => unreachable!("users' groups carry their op"),
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
                }),
                Err(e) => {
                    log!(Error, "gpud[{}]: {kernel:?} launch failed: {e}", self.device);
                    // This launch, the rest of the drain and everything in
                    // flight: all answered before gpud exits.
                    // Launches that did finish (the CPU backend's, say)
                    // are answered as done; everything else DEVICE_ERROR.
                    if matches!(kernel, KernelRef::User(_)) {
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
                        });
                        self.fail_all();
                        return Err(e);
                    }
                    let mut ok = self.answer_jobs(jobs, Status::DeviceError);
                    for (_, _, rest, _) in groups.by_ref() {
                        ok = ok && self.answer_jobs(rest, Status::DeviceError);
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
