//! Control descriptors: a buffer's put, get and free, and a user's module
//! loaded or unloaded, each in SQ order with the jobs around it.

use std::sync::atomic::Ordering;

use std::time::{Duration, Instant};

use super::{CqeTimes, Daemon, InFlight, Wake};
use crate::descriptor::Region;
use crate::error::Result;
use crate::layout::{
    ElemType, Sqe, StallPhase, Status, EC_ADDR_SEGMENT_SHIFT, EC_CONTROL_GET, EC_CONTROL_PUT, EC_CONTROL_UNLOAD_MODULE,
    EC_FLAG_IN0_BUF, EC_FLAG_OUT_BUF, EC_FREE_MAX_IDS, EC_MAX_SEGMENTS,
};

/// What a buffer control descriptor came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ctl {
    /// Answer it now with this status.
    Answer(Status),
    /// Its copy is under way: the backend reports this ticket.
    Copying(crate::backend::Ticket),
}

impl Daemon {
    /// A put, get or free (see the header), in SQ order with the jobs
    /// around it: answered at once, or (a put's or get's copy) once the
    /// copy is done. Ok(false) when the VM went away.
    pub(super) fn buffer_control(&mut self, sqe: &Sqe) -> Result<bool> {
        let t = Instant::now();
        let r = self.buffer_control_step(sqe);
        self.count_stall(StallPhase::Control, t);
        r
    }

    fn buffer_control_step(&mut self, sqe: &Sqe) -> Result<bool> {
        let mut outcome = self.run_buffer_control(sqe)?;
        if outcome == Ctl::Answer(Status::Oom) && self.buffers.has_pending() {
            if !self.make_room()? {
                return Ok(false);
            }
            outcome = self.run_buffer_control(sqe)?;
        }
        let status = match outcome {
            Ctl::Copying(ticket) => {
                // Answered by `reap`, like a launch; a free after it waits
                // for it (its drain) before its block is reused, and a job
                // naming a put's buffer waits until it has landed.
                let lands = (sqe.kernel == EC_CONTROL_PUT).then_some(sqe.out);
                if let Some(id) = lands {
                    self.buffers.landing(id, false);
                }
                self.in_flight.push(InFlight {
                    ticket,
                    kernel: None,
                    small: false,
                    jobs: vec![sqe.user_data],
                    lands,
                    drain: self.next_drain,
                    drained: self.drain_started,
                    submitted: Instant::now(),
                    backend: Duration::ZERO,
                    enqueue: Duration::ZERO,
                    group: None,
                });
                self.buffers.publish(self.ring.stats());
                return Ok(true);
            }
            Ctl::Answer(s) => s,
        };
        if sqe.kernel == EC_CONTROL_PUT && status != Status::Ok {
            // The other slices of this put fail alike, allocating nothing
            // (until the VM frees the id, which it does for a failed put).
            self.buffers.put_failed(sqe.out, status);
        }
        if !matches!(status, Status::Ok | Status::Oom | Status::TooLarge) {
            self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
        }
        self.buffers.publish(self.ring.stats());
        let ok = self.complete(sqe.user_data, status, 1, CqeTimes::NONE);
        self.ring.cq_publish();
        Ok(ok)
    }

    /// An arena region of a buffer control descriptor; reads segment
    /// messages once when it names a segment gpud has not mapped yet (as
    /// for jobs). When the VM went away meanwhile the region is refused
    /// (nobody reads that answer) and the main loop notices; Err when
    /// registering a segment failed.
    pub(super) fn arena_region(&mut self, addr: u64, len: u32, ty: ElemType) -> Result<std::result::Result<Region, Status>> {
        let r = Region::new(addr, len, ty, self.segments.sizes());
        let seg = (addr >> EC_ADDR_SEGMENT_SHIFT) as usize;
        if r == Err(Status::OutOfBounds) && seg < EC_MAX_SEGMENTS as usize && !self.segments.sizes().is_known(seg) {
            if self.read_segments()? == Wake::Quit {
                return Ok(Err(Status::OutOfBounds));
            }
            return Ok(Region::new(addr, len, ty, self.segments.sizes()));
        }
        Ok(r)
    }

    /// The ids free descriptor `sqe` lists; none when its list is not a
    /// valid region (`run_buffer_control` refuses it then).
    pub(super) fn free_ids(&self, sqe: &Sqe) -> Vec<u64> {
        if sqe.ty != ElemType::S64.id() || sqe.in0_len > EC_FREE_MAX_IDS {
            return Vec::new();
        }
        match Region::new(sqe.in0, sqe.in0_len, ElemType::S64, self.segments.sizes()) {
            Ok(r) => self.ids_in(r),
            Err(_) => Vec::new(),
        }
    }

    /// The buffer ids in `r`, a validated region of a free's 8-byte ids.
    fn ids_in(&self, r: Region) -> Vec<u64> {
        // SAFETY: validated, of 8-byte elements, the descriptor's own.
        unsafe { self.segments.arena().input::<u64>(r) }.to_vec()
    }

    pub(super) fn run_buffer_control(&mut self, sqe: &Sqe) -> Result<Ctl> {
        let Some(ty) = ElemType::from_id(sqe.ty) else { return Ok(Ctl::Answer(Status::BadType)) };
        macro_rules! region {
            ($addr:expr, $len:expr, $ty:expr) => {
                match self.arena_region($addr, $len, $ty)? {
                    Ok(r) => r,
                    Err(s) => return Ok(Ctl::Answer(s)),
                }
            };
        }
        match sqe.kernel {
            EC_CONTROL_PUT => {
                // One slice (the whole buffer, or a part of a pipelined
                // put): in0_len elements at byte p.u64[0] of a buffer of
                // out_len elements.
                if sqe.flags != EC_FLAG_OUT_BUF {
                    return Ok(Ctl::Answer(Status::BadFlags));
                }
                let src = region!(sqe.in0, sqe.in0_len, ty);
                let mem = self.backend.buffer_memory();
                let dst = match self.buffers.put_slice(mem, sqe.out, ty, sqe.out_len, sqe.p.u64_at(0), sqe.in0_len) {
                    Ok(r) => r,
                    Err(s) => return Ok(Ctl::Answer(s)),
                };
                let src = self.segments.arena().host_ptr(src);
                // dst lies inside the buffer's block (put_slice checked the
                // slice against its length); src is the descriptor's own
                // arena region, which the VM leaves alone until the answer.
                Ok(Ctl::Copying(self.backend.copy_in(dst.offset(), src, dst.bytes() as usize)?))
            }
            EC_CONTROL_GET => {
                if sqe.flags != EC_FLAG_IN0_BUF {
                    return Ok(Ctl::Answer(Status::BadFlags));
                }
                // out_len elements from byte p.u64[0] of a buffer of
                // in0_len: all of it, or one piece of a get through the
                // VM's window.
                let buf = match self.buffers.get_slice(sqe.in0, ty, sqe.in0_len, sqe.p.u64_at(0), sqe.out_len) {
                    Ok(b) => b,
                    Err(s) => return Ok(Ctl::Answer(s)),
                };
                let dst = region!(sqe.out, sqe.out_len, ty);
                let bytes = dst.bytes() as usize;
                let dst = self.segments.arena().host_ptr(dst);
                // As for a put; whatever wrote the buffer has finished (the
                // VM learns a buffer's id only from a completed job).
                Ok(Ctl::Copying(self.backend.copy_out(buf.offset(), dst, bytes)?))
            }
            _ => {
                if sqe.flags != 0 {
                    return Ok(Ctl::Answer(Status::BadFlags));
                }
                if ty != ElemType::S64 {
                    return Ok(Ctl::Answer(Status::BadType));
                }
                if sqe.in0_len > EC_FREE_MAX_IDS {
                    return Ok(Ctl::Answer(Status::BadShape));
                }
                let ids = region!(sqe.in0, sqe.in0_len, ty);
                let ids = self.ids_in(ids);
                let drain = self.next_drain;
                for id in ids {
                    self.buffers.free(id, drain);
                }
                self.release_buffers();
                Ok(Ctl::Answer(Status::Ok))
            }
        }
    }

    /// Runs a control descriptor: the jobs before it in this drain are
    /// submitted and every launch is finished first (a module is never
    /// swapped under a running kernel), then it is answered. Ok(false) when
    /// the VM went away.
    pub(super) fn control(&mut self, sqe: &Sqe) -> Result<bool> {
        if !self.make_room()? {
            return Ok(false);
        }
        let status = self.run_control(sqe);
        // A module gpud refused (its PTX, its symbols) is the module's
        // fault, answered with why; the VM counts it (modules_refused). A
        // bad descriptor is one the VM should never have written.
        if !matches!(status, Status::Ok | Status::ModuleError) {
            self.ring.stats().bad_descriptors.fetch_add(1, Ordering::Relaxed);
        }
        let ok = self.complete(sqe.user_data, status, 1, CqeTimes::NONE);
        self.ring.cq_publish();
        Ok(ok)
    }

    /// Loads or unloads the module a control descriptor names. Why a load
    /// failed goes into the descriptor's output region (NUL-padded).
    pub(super) fn run_control(&mut self, sqe: &Sqe) -> Status {
        let sizes = self.segments.sizes();
        let slot = sqe.p.u32_at(0);
        let Ok(slot) = u16::try_from(slot) else { return Status::BadShape };
        if sqe.kernel == EC_CONTROL_UNLOAD_MODULE {
            self.modules.unload(slot, &mut *self.backend);
            log!(Info, "gpud[{}]: module slot {slot} unloaded", self.device);
            return Status::Ok;
        }
        let (path, msg) = match (
            Region::new(sqe.in0, sqe.in0_len, ElemType::U8, sizes),
            Region::new(sqe.out, sqe.out_len, ElemType::U8, sizes),
        ) {
            (Ok(p), Ok(m)) if !p.overlaps(&m) => (p, m),
            (Err(s), _) | (_, Err(s)) => return s,
            _ => return Status::Overlap,
        };
        let arena = self.segments.arena();
        // SAFETY: validated regions of the arena; the VM does not touch a
        // job's regions while it is in flight, and nothing else here does.
        let dir = unsafe { arena.input::<u8>(path) }.to_vec();
        let result = match String::from_utf8(dir) {
            Ok(d) => self.modules.load(slot, std::path::Path::new(&d), &mut *self.backend).map(|()| d),
            Err(_) => Err("the module path is not UTF-8".to_string()),
        };
        match result {
            Ok(d) => {
                log!(Info, "gpud[{}]: module slot {slot} loaded from {d}", self.device);
                Status::Ok
            }
            Err(e) => {
                log!(Warning, "gpud[{}]: module slot {slot} refused: {e}", self.device);
                // SAFETY: as above; the output region is the job's own.
                let out = unsafe { arena.output::<u8>(msg) };
                out.fill(0);
                let n = e.len().min(out.len());
                out[..n].copy_from_slice(&e.as_bytes()[..n]);
                Status::ModuleError
            }
        }
    }
}
