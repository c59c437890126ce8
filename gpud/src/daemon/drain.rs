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
    ElemType, LaunchOpts, Sqe, Stats, Status, EC_CONTROL_FREE, EC_CONTROL_GET, EC_CONTROL_LOAD_MODULE,
    EC_CONTROL_PUT, EC_CONTROL_UNLOAD_MODULE, EC_FLAG_OPTS, EC_FLAG_OUT_BUF,
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
        record_batch(self.ring.stats(), count_jobs(&self.sqes));

        // Validate everything first; refusals are answered at once. A
        // control descriptor first runs every job before it to the end.
        self.coalescer.clear();
        let sqes = std::mem::take(&mut self.sqes);
        let mut looked_for_segments = false;
        let mut i = 0;
        while i < sqes.len() {
            let sqe = &sqes[i];
            i += 1;
            // A job's launch options ride in the entry after it.
            let opts = if sqe.flags & EC_FLAG_OPTS != 0 && i < sqes.len() {
                i += 1;
                Some(LaunchOpts::from_sqe(&sqes[i - 1]))
            } else {
                None
            };
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
            let mut v = self.validate(sqe, opts.as_ref());
            if v == Err(Status::Oom) && self.buffers.has_pending() {
                // Freed blocks wait for launches: finish them and look again.
                if !self.make_room()? {
                    return Ok(false);
                }
                v = self.validate(sqe, opts.as_ref());
            }
            if v == Err(Status::OutOfBounds)
                && !looked_for_segments
                && names_unknown_segment(sqe, self.segments.sizes())
            {
                // The VM sends a segment before naming it: it is queued on
                // the socket. Read once per drain, then judge again.
                looked_for_segments = true;
                if self.read_segments()? == Wake::Quit {
                    return Ok(false);
                }
                v = self.validate(sqe, opts.as_ref());
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
    /// (creating its output buffer when it asks for one).
    pub(super) fn validate(&mut self, sqe: &Sqe, opts: Option<&LaunchOpts>) -> std::result::Result<Job, Status> {
        let mut table = Table { bufs: &mut self.buffers, mem: self.backend.buffer_memory() };
        let v = validate_bufs(sqe, opts, self.segments.sizes(), &self.modules, &mut table);
        if sqe.flags & EC_FLAG_OUT_BUF != 0 && v.is_ok() {
            self.buffers.publish(self.ring.stats());
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
}

/// Jobs in a drain: entries less the launch options riding after a job
/// with EC_FLAG_OPTS (as `process_drain` pairs them).
fn count_jobs(sqes: &[Sqe]) -> u64 {
    let (mut n, mut i) = (0u64, 0usize);
    while i < sqes.len() {
        i += if sqes[i].flags & EC_FLAG_OPTS != 0 { 2 } else { 1 };
        n += 1;
    }
    n
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
