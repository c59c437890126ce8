//! One drain: the SQ copied out, every entry validated (refusals answered at
//! once, control descriptors run in SQ order, entries naming a segment
//! still being registered held back until it is), the jobs coalesced and
//! submitted.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{CqeTimes, Daemon, Wake};
use crate::buffers::{self, Buffers};
use crate::coalesce;
use crate::descriptor::{named_buffers, names_unknown_segment, validate_bufs, BufferTable, Job, Region};
use crate::error::Result;
use crate::layout::{
    ElemType, Sqe, Stats, Status, EC_ADDR_SEGMENT_SHIFT, EC_CONTROL_FREE, EC_CONTROL_GET, EC_CONTROL_LOAD_MODULE,
    EC_CONTROL_PUT, EC_CONTROL_UNLOAD_MODULE, EC_FLAG_ARGS, EC_FLAG_OUT_BUF, EC_MAX_SEGMENTS,
};

impl Daemon {
    /// One drain: copy, validate, coalesce, submit. Ok(false) when the VM
    /// went away (while gpud waited for CQ room, or on the socket).
    pub fn process_drain(&mut self) -> Result<bool> {
        self.drain_started = Instant::now();
        self.sqes.clear();
        let drain = self.ring.drain_sq(&mut self.sqes);
        if let Some(pending) = drain.overrun {
            self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
            log!(
                Error,
                "gpud[{}]: SQ tail is {pending} entries ahead of head (ring of {}): \
                 corrupt; answered {} and skipped the rest",
                self.device,
                self.ring.geometry().sq_entries,
                drain.taken
            );
        }
        if self.sqes.is_empty() {
            // Woken for held jobs whose wait ended: they run now.
            return if self.held.is_empty() { Ok(true) } else { self.handle_entries(&[]) };
        }
        record_batch(self.ring.stats(), self.sqes.len() as u64);
        let sqes = std::mem::take(&mut self.sqes);
        let result = self.handle_entries(&sqes);
        self.sqes = sqes;
        result
    }

    /// The entries held back for segments being registered, once one of
    /// them is registered: handled as a drain of their own, in SQ order
    /// (those that still wait are held back again). Ok(false) when the VM
    /// went away.
    pub(super) fn run_parked(&mut self) -> Result<bool> {
        self.parked_ready = false;
        if self.parked.is_empty() {
            return Ok(true);
        }
        self.drain_started = Instant::now();
        let parked = std::mem::take(&mut self.parked);
        self.handle_entries(&parked)
    }

    /// Validates `sqes` in order (refusals answered at once, control
    /// descriptors run in order, entries naming a segment being registered
    /// held back), then coalesces and submits the jobs.
    ///
    /// Held back: a job, put or get naming a segment under registration,
    /// and a job or get naming a buffer that a put's copy is still filling
    /// (the pipelined matmul publishes its bands right behind B's put).
    /// Nothing else waits: later entries run at once (they cannot depend
    /// on a held-back one, whose answer the VM has not seen), except a free
    /// of a buffer a held-back entry names, which first runs them.
    fn handle_entries(&mut self, sqes: &[Sqe]) -> Result<bool> {
        // A control descriptor first runs every job before it to the end.
        self.coalescer.clear();
        // Held jobs came before this drain's: they lead it.
        let mut hold_until = Vec::with_capacity(self.held.len());
        for (job, until) in self.held.drain(..) {
            hold_until.push((job.user_data(), until));
            self.coalescer.push(job);
        }
        self.may_hold = true;
        let mut looked_for_segments = false;
        for sqe in sqes {
            if matches!(
                sqe.kernel,
                EC_CONTROL_LOAD_MODULE | EC_CONTROL_UNLOAD_MODULE | EC_CONTROL_PUT | EC_CONTROL_GET | EC_CONTROL_FREE
            ) {
                // A held job must not outlive the drain of a free of its
                // buffer (whose block is kept only for that drain's
                // launches) or a module change: this drain holds nothing.
                self.may_hold = false;
            }
            if matches!(sqe.kernel, EC_CONTROL_LOAD_MODULE | EC_CONTROL_UNLOAD_MODULE) {
                if !self.control(sqe)? {
                    return Ok(false);
                }
                continue;
            }
            if matches!(sqe.kernel, EC_CONTROL_PUT | EC_CONTROL_GET | EC_CONTROL_FREE) {
                let seg = (control_arena_addr(sqe) >> EC_ADDR_SEGMENT_SHIFT) as usize;
                if !looked_for_segments && seg < EC_MAX_SEGMENTS as usize && !self.segments.sizes().is_known(seg) {
                    looked_for_segments = true;
                    if self.read_segments()? == Wake::Quit {
                        return Ok(false);
                    }
                }
                if self.segments.is_registering(seg) || (sqe.kernel == EC_CONTROL_GET && self.buffers.is_landing(sqe.in0)) {
                    self.parked.push(*sqe);
                    continue;
                }
                if sqe.kernel == EC_CONTROL_FREE && !self.parked.is_empty() && self.free_names_parked(sqe) {
                    // The held-back entries naming its buffers run first.
                    if !self.make_room()? {
                        return Ok(false);
                    }
                }
                if !self.buffer_control(sqe)? {
                    return Ok(false);
                }
                continue;
            }
            let mut v = self.validate(sqe);
            if v == Err(Status::Oom) && self.buffers.has_pending() {
                // Freed blocks wait for launches: finish them and look again.
                if !self.make_room()? {
                    return Ok(false);
                }
                v = self.validate(sqe);
            }
            if v == Err(Status::OutOfBounds) && names_unknown_segment(sqe, self.segments.sizes(), &self.segments) {
                if !looked_for_segments {
                    // The VM sends a segment before naming it: it is queued
                    // on the socket. Read once per drain, then judge again.
                    looked_for_segments = true;
                    if self.read_segments()? == Wake::Quit {
                        return Ok(false);
                    }
                    v = self.validate(sqe);
                }
                if v == Err(Status::OutOfBounds) && self.segments.registering() {
                    self.parked.push(*sqe);
                    continue;
                }
            }
            if v == Err(Status::BadBuffer)
                && named_buffers(sqe, self.segments.sizes(), &self.segments).iter().any(|&id| self.buffers.is_landing(id))
            {
                self.parked.push(*sqe);
                continue;
            }
            match v {
                Ok(job) => self.coalescer.push(job),
                Err(status) => {
                    if !matches!(status, Status::Oom | Status::TooLarge) {
                        self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
                    }
                    if !self.complete(sqe.user_data, status, 1, CqeTimes::NONE) {
                        return Ok(false);
                    }
                }
            }
        }
        self.ring.cq_publish();

        // One launch per kernel and element type.
        let coalescer = std::mem::take(&mut self.coalescer);
        let result = self.submit_all_holding(&coalescer, &hold_until);
        self.coalescer = coalescer;
        self.release_buffers();
        result
    }

    /// Makes the segments whose registration finished known; with `wait`,
    /// waits for every one being registered. Err when a registration failed:
    /// everything held is answered first.
    pub(super) fn adopt_segments(&mut self, wait: bool) -> Result<()> {
        match self.segments.adopt(&mut *self.backend, self.device, wait) {
            Ok(0) => Ok(()),
            Ok(_) => {
                self.parked_ready = true;
                Ok(())
            }
            Err(e) => {
                log!(Error, "gpud[{}]: registering a segment failed: {e}", self.device);
                self.fail_all();
                Err(e)
            }
        }
    }

    /// Validates a job against the segments, the modules and the buffers
    /// (creating its output buffers when it asks for them); a user's record
    /// is copied out of the segments.
    pub(super) fn validate(&mut self, sqe: &Sqe) -> std::result::Result<Job, Status> {
        let mut table = Table { bufs: &mut self.buffers, mem: self.backend.buffer_memory() };
        let v = validate_bufs(sqe, self.segments.sizes(), &self.modules, &mut table, &self.segments);
        if let Ok(job) = &v {
            if makes_buffers(sqe, job) {
                self.buffers.publish(self.ring.stats());
            }
        }
        v
    }

    /// Runs every job validated so far in this drain and every launch in
    /// flight to the end, so that every freed block is reusable. Ok(false)
    /// when the VM went away.
    pub(super) fn make_room(&mut self) -> Result<bool> {
        self.may_hold = false;
        let coalescer = std::mem::take(&mut self.coalescer);
        let submitted = self.submit_all(&coalescer);
        self.coalescer = coalescer;
        self.coalescer.clear();
        // Entries held back came before this one: they run first.
        if !submitted? || !self.finish()? {
            return Ok(false);
        }
        self.release_buffers();
        Ok(true)
    }
}

/// Validation's view of the buffers: lookups, and new output buffers from
/// the backend's memory.
struct Table<'a> {
    bufs: &'a mut Buffers,
    mem: &'a mut dyn buffers::BufferMemory,
}

impl BufferTable for Table<'_> {
    fn lookup(&self, id: u64, ty: ElemType, len: u32) -> std::result::Result<Region, Status> {
        self.bufs.lookup(id, ty, len)
    }
    fn create(&mut self, id: u64, ty: ElemType, len: u32) -> std::result::Result<Region, Status> {
        self.bufs.create(self.mem, id, ty, len)
    }
    fn discard(&mut self, id: u64) {
        self.bufs.discard(id);
    }
}

/// True when an accepted job made new buffers (the accounting to publish):
/// a built-in's EC_FLAG_OUT_BUF, a user's outputs in buffers.
fn makes_buffers(sqe: &Sqe, job: &Job) -> bool {
    if sqe.flags & EC_FLAG_ARGS == 0 {
        return sqe.flags & EC_FLAG_OUT_BUF != 0;
    }
    job.outputs().iter().any(|r| r.is_buffer())
}

impl Daemon {
    /// True when free descriptor `sqe` names a buffer that an entry held
    /// back names.
    fn free_names_parked(&self, sqe: &Sqe) -> bool {
        let ids = self.free_ids(sqe);
        let sizes = self.segments.sizes();
        ids.iter().any(|id| self.parked.iter().any(|p| named_buffers(p, sizes, &self.segments).contains(id)))
    }
}

/// The arena address a put, get or free names: a put's source, a get's
/// destination, a free's list of ids.
fn control_arena_addr(sqe: &Sqe) -> u64 {
    if sqe.kernel == EC_CONTROL_GET { sqe.out } else { sqe.in0 }
}

/// Stats for one non-empty drain of `size` jobs. gpud is the only
/// writer, so a relaxed load-then-store max is exact.
fn record_batch(stats: &Stats, size: u64) {
    stats.batches.fetch_add(1, Ordering::Relaxed);
    if size > stats.max_batch.load(Ordering::Relaxed) {
        stats.max_batch.store(size, Ordering::Relaxed);
    }
    stats.batch_hist[coalesce::hist_bucket(size)].fetch_add(1, Ordering::Relaxed);
}
