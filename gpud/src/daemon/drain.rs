//! One drain: the SQ copied out, every entry validated (refusals answered at
//! once, control descriptors run in SQ order), the jobs coalesced and
//! submitted.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Daemon, Wake};
use crate::buffers::{self, Buffers};
use crate::coalesce;
use crate::descriptor::{names_unknown_segment, validate_bufs, BufferTable, Job, Region};
use crate::error::Result;
use crate::layout::{
    ElemType, Sqe, Stats, Status, EC_CONTROL_FREE, EC_CONTROL_GET, EC_CONTROL_LOAD_MODULE, EC_CONTROL_PUT,
    EC_CONTROL_UNLOAD_MODULE, EC_FLAG_ARGS, EC_FLAG_OUT_BUF,
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
            return Ok(true);
        }
        record_batch(self.ring.stats(), self.sqes.len() as u64);

        // Validate everything first; refusals are answered at once. A
        // control descriptor first runs every job before it to the end.
        self.coalescer.clear();
        let sqes = std::mem::take(&mut self.sqes);
        let mut looked_for_segments = false;
        for sqe in &sqes {
            if matches!(sqe.kernel, EC_CONTROL_LOAD_MODULE | EC_CONTROL_UNLOAD_MODULE) {
                if !self.control(sqe)? {
                    return Ok(false);
                }
                continue;
            }
            if matches!(sqe.kernel, EC_CONTROL_PUT | EC_CONTROL_GET | EC_CONTROL_FREE) {
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
            if v == Err(Status::OutOfBounds)
                && !looked_for_segments
                && names_unknown_segment(sqe, self.segments.sizes(), &self.segments)
            {
                // The VM sends a segment before naming it: it is queued on
                // the socket. Read once per drain, then judge again.
                looked_for_segments = true;
                if self.read_segments()? == Wake::Quit {
                    return Ok(false);
                }
                v = self.validate(sqe);
            }
            match v {
                Ok(job) => self.coalescer.push(job),
                Err(status) => {
                    if !matches!(status, Status::Oom | Status::TooLarge) {
                        self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
                    }
                    if !self.complete(sqe.user_data, status, 1) {
                        return Ok(false);
                    }
                }
            }
        }
        self.sqes = sqes;
        self.ring.cq_publish();

        // One launch per kernel and element type.
        let coalescer = std::mem::take(&mut self.coalescer);
        let result = self.submit_all(&coalescer);
        self.coalescer = coalescer;
        self.release_buffers();
        result
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
        let coalescer = std::mem::take(&mut self.coalescer);
        let submitted = self.submit_all(&coalescer);
        self.coalescer = coalescer;
        self.coalescer.clear();
        if !submitted? || !self.finish_in_flight()? {
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

/// Stats for one non-empty drain of `size` jobs. gpud is the only
/// writer, so a relaxed load-then-store max is exact.
fn record_batch(stats: &Stats, size: u64) {
    stats.batches.fetch_add(1, Ordering::Relaxed);
    if size > stats.max_batch.load(Ordering::Relaxed) {
        stats.max_batch.store(size, Ordering::Relaxed);
    }
    stats.batch_hist[coalesce::hist_bucket(size)].fetch_add(1, Ordering::Relaxed);
}
