//! The two rings as gpud sees them: consumer of the SQ, producer of the CQ,
//! and its half of the NEED_WAKEUP protocol in both directions.
//!
//! gpud keeps its own copies of the counters it owns (SQ head, CQ tail) and
//! only ever publishes them; it never reads them back from shared memory, so
//! the VM cannot make gpud re-consume or overwrite entries by scribbling on
//! them. The counters the VM owns (SQ tail, CQ head) are untrusted: a tail
//! more than a ring ahead is treated as corruption, never as a loop bound.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

use crate::arena::Arena;
use crate::handshake::{Geometry, Mapping};
use crate::layout::{Cqe, Header, Sqe, Stats, EC_NEED_WAKEUP};

/// Result of one drain of the SQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drain {
    /// Entries copied out.
    pub taken: usize,
    /// `Some(tail - head)` when the VM's tail was more than a ring ahead of
    /// our head: only `sq_entries` entries were read and the rest skipped.
    pub overrun: Option<u32>,
}

pub struct Ring {
    mapping: Mapping,
    geo: Geometry,
    sq_mask: u32,
    cq_mask: u32,
    /// Our SQ head: authoritative, published to shared memory after each drain.
    sq_head: u32,
    /// Entries up to here were looked at by `sq_pending_any` (from
    /// `sq_head`; reset by each drain).
    sq_seen: u32,
    /// Our CQ tail: entries up to here are written; published by `cq_publish`.
    cq_tail: u32,
    cq_published: u32,
    sq_efd: OwnedFd,
    cq_efd: OwnedFd,
}

impl Ring {
    /// Takes over a validated mapping. The counters start where the VM left
    /// them (zero after its ring reset).
    pub fn new(mapping: Mapping, geo: Geometry, sq_efd: OwnedFd, cq_efd: OwnedFd) -> Ring {
        assert!(mapping.len() as u64 == geo.total_bytes);
        let mut r = Ring {
            mapping,
            geo,
            sq_mask: geo.sq_entries - 1,
            cq_mask: geo.cq_entries - 1,
            sq_head: 0,
            sq_seen: 0,
            cq_tail: 0,
            cq_published: 0,
            sq_efd,
            cq_efd,
        };
        r.sq_head = r.sq_head_atomic().load(Ordering::Acquire);
        r.sq_seen = r.sq_head;
        r.cq_tail = r.cq_tail_atomic().load(Ordering::Acquire);
        r.cq_published = r.cq_tail;
        r
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    fn hdr(&self) -> *mut Header {
        self.mapping.header()
    }

    // The accessors below hand out references to atomics inside the mapping.
    // SAFETY (all of them): the mapping is at least EC_HEADER_BYTES long and
    // page-aligned (checked in the handshake), Header fits in it, and it
    // lives as long as `self`. Only the named field is referenced, never
    // the whole Header, whose plain fields the VM may write.
    fn sq_head_atomic(&self) -> &AtomicU32 {
        // SAFETY: see above.
        unsafe { &*ptr::addr_of!((*self.hdr()).sq_head.0) }
    }
    fn sq_tail_atomic(&self) -> &AtomicU32 {
        // SAFETY: see above.
        unsafe { &*ptr::addr_of!((*self.hdr()).sq_tail.0) }
    }
    fn sq_flags_atomic(&self) -> &AtomicU32 {
        // SAFETY: see above.
        unsafe { &*ptr::addr_of!((*self.hdr()).sq_flags.0) }
    }
    fn cq_head_atomic(&self) -> &AtomicU32 {
        // SAFETY: see above.
        unsafe { &*ptr::addr_of!((*self.hdr()).cq_head.0) }
    }
    fn cq_tail_atomic(&self) -> &AtomicU32 {
        // SAFETY: see above.
        unsafe { &*ptr::addr_of!((*self.hdr()).cq_tail.0) }
    }
    fn cq_flags_atomic(&self) -> &AtomicU32 {
        // SAFETY: see above.
        unsafe { &*ptr::addr_of!((*self.hdr()).cq_flags.0) }
    }
    pub fn stats(&self) -> &Stats {
        // SAFETY: see above; Stats is all atomics.
        unsafe { &*ptr::addr_of!((*self.hdr()).stats.0) }
    }

    /// The arena, borrowed from the mapping.
    pub fn arena(&self) -> Arena<'_> {
        // SAFETY: arena_offset + arena_bytes <= total_bytes (validated), the
        // mapping is read-write for as long as the borrow of self, and
        // arena_offset % 4 == 0 on a page-aligned base.
        unsafe {
            let base = self.mapping.base().add(self.geo.arena_offset as usize);
            Arena::from_raw(base, self.geo.arena_bytes)
        }
    }

    /// Cheap check for the spin loop: is there anything past our head?
    pub fn sq_nonempty(&self) -> bool {
        self.sq_tail_atomic().load(Ordering::Relaxed) != self.sq_head
    }

    /// Whether an entry past those looked at before satisfies `f`, without
    /// taking any (`drain_sq` still reads each once, for validation): the
    /// daemon's look for a small job while large launches hold the drain
    /// limit. Entries looked at stay looked at until drained, so each is
    /// judged once; a VM that rewrites one changes only when it is drained.
    pub fn sq_pending_any(&mut self, f: impl Fn(&Sqe) -> bool) -> bool {
        let tail = self.sq_tail_atomic().load(Ordering::Acquire);
        let pending = tail.wrapping_sub(self.sq_head);
        if pending > self.geo.sq_entries {
            return true; // corrupt: drain_sq says so
        }
        let seen = self.sq_seen.wrapping_sub(self.sq_head).min(pending);
        let sq = self.sq_base();
        let mut found = false;
        for i in seen..pending {
            let idx = (self.sq_head.wrapping_add(i) & self.sq_mask) as usize;
            // SAFETY: as in drain_sq; a copy, judged and dropped.
            if f(&unsafe { sq.add(idx).read_volatile() }) {
                found = true;
                break;
            }
            self.sq_seen = self.sq_head.wrapping_add(i + 1);
        }
        found
    }

    /// Copies every pending SQE out of the ring (each exactly once), then
    /// releases the slots to the VM by publishing the new head.
    pub fn drain_sq(&mut self, out: &mut Vec<Sqe>) -> Drain {
        // Acquire pairs with the VM's store-release of the tail: the entries
        // it wrote before that store are visible to the reads below.
        let tail = self.sq_tail_atomic().load(Ordering::Acquire);
        let pending = tail.wrapping_sub(self.sq_head);
        let take = pending.min(self.geo.sq_entries);
        let sq = self.sq_base();
        for i in 0..take {
            let idx = (self.sq_head.wrapping_add(i) & self.sq_mask) as usize;
            // SAFETY: idx < sq_entries and the SQ lies inside the mapping
            // (validated); Sqe is plain data, so any bytes are a valid value;
            // the slot is 64-aligned (sq_offset = 4096, 64-byte entries). The
            // volatile read makes this the one and only read of the slot.
            out.push(unsafe { sq.add(idx).read_volatile() });
        }
        let overrun = (pending > self.geo.sq_entries).then_some(pending);
        // After an overrun, skip to the VM's tail: what lies between is not
        // a ring any more, and waiting for it would never end.
        self.sq_head = if overrun.is_some() { tail } else { self.sq_head.wrapping_add(take) };
        self.sq_seen = self.sq_head;
        // Release: our reads of the slots happen before the VM may reuse them.
        self.sq_head_atomic().store(self.sq_head, Ordering::Release);
        Drain {
            taken: take as usize,
            overrun,
        }
    }

    fn sq_base(&self) -> *const Sqe {
        // In bounds: sq_offset + sq_entries * 64 <= total (validated).
        self.mapping.base().as_ptr().wrapping_add(self.geo.sq_offset as usize).cast()
    }

    fn cq_base(&self) -> *mut Cqe {
        // In bounds: cq_offset + cq_entries * 16 <= arena_offset <= total.
        self.mapping.base().as_ptr().wrapping_add(self.geo.cq_offset as usize).cast()
    }

    /// First half of going to sleep: announce it, then look once more.
    /// Returns true when the SQ is still empty and the caller may block on
    /// the SQ eventfd; false when work arrived (the flag is cleared again).
    pub fn arm_sq_wakeup(&self) -> bool {
        self.sq_flags_atomic().fetch_or(EC_NEED_WAKEUP, Ordering::Relaxed);
        // Dekker: either the VM sees our flag after its tail store, or we see
        // its tail here. Both sides fence seq_cst between store and load.
        fence(Ordering::SeqCst);
        if self.sq_nonempty() {
            self.disarm_sq_wakeup();
            false
        } else {
            true
        }
    }

    pub fn disarm_sq_wakeup(&self) {
        self.sq_flags_atomic().fetch_and(!EC_NEED_WAKEUP, Ordering::Relaxed);
    }

    pub fn sq_eventfd(&self) -> &OwnedFd {
        &self.sq_efd
    }

    /// Empties the SQ eventfd's counter (it is non-blocking, so an empty
    /// counter is EAGAIN, which is fine: the wake-up was already consumed).
    pub fn drain_sq_eventfd(&self) {
        let mut b = [0u8; 8];
        loop {
            match nix::unistd::read(self.sq_efd.as_fd(), &mut b) {
                Err(nix::errno::Errno::EINTR) => continue,
                _ => return,
            }
        }
    }

    /// Free CQ slots. A VM head that makes the ring look more than full is
    /// corrupt; it reads as "no room", so gpud waits instead of overwriting.
    pub fn cq_free(&self) -> u32 {
        // Acquire pairs with the VM's release of its head: its reads of the
        // slots it consumed finish before we overwrite them.
        let used = self.cq_tail.wrapping_sub(self.cq_head_atomic().load(Ordering::Acquire));
        self.geo.cq_entries.saturating_sub(used)
    }

    /// Waits until at least one CQ slot is free. Publishes what is already
    /// written first (the VM can only make room for entries it can see).
    /// `keep_waiting` is consulted every few milliseconds; when it says no,
    /// this gives up and returns false.
    pub fn cq_wait_for_room(&mut self, mut keep_waiting: impl FnMut() -> bool) -> bool {
        if self.cq_free() > 0 {
            return true;
        }
        self.cq_publish();
        let mut rounds = 0u32;
        loop {
            for _ in 0..256 {
                if self.cq_free() > 0 {
                    return true;
                }
                std::hint::spin_loop();
            }
            std::thread::sleep(Duration::from_micros(50));
            rounds += 1;
            if rounds.is_multiple_of(64) && !keep_waiting() {
                return false;
            }
        }
    }

    /// Writes one CQE into the next slot; not visible to the VM until
    /// [`Ring::cq_publish`]. The caller must have made sure there is room.
    pub fn cq_write(&mut self, cqe: Cqe) {
        assert!(self.cq_free() > 0, "cq_write without room");
        let idx = (self.cq_tail & self.cq_mask) as usize;
        // SAFETY: idx < cq_entries, inside the mapping (validated), 16-byte
        // slots at a 64-aligned offset; the VM is not reading this slot (it
        // is free: its head has passed it, acquired in cq_free).
        unsafe { self.cq_base().add(idx).write_volatile(cqe) };
        self.cq_tail = self.cq_tail.wrapping_add(1);
    }

    /// Makes every written CQE visible and wakes the VM if it asked.
    pub fn cq_publish(&mut self) {
        if self.cq_published == self.cq_tail {
            return;
        }
        self.cq_published = self.cq_tail;
        // Release: the CQE writes above happen before the VM sees the tail.
        self.cq_tail_atomic().store(self.cq_tail, Ordering::Release);
        // Dekker's other half: pairs with the VM's flag store + fence.
        fence(Ordering::SeqCst);
        if self.cq_flags_atomic().load(Ordering::Relaxed) & EC_NEED_WAKEUP != 0 {
            signal_eventfd(&self.cq_efd);
        }
    }
}

/// Adds 1 to an eventfd. EAGAIN means the counter is already at its
/// maximum, so the reader will wake anyway.
pub fn signal_eventfd(fd: &OwnedFd) {
    loop {
        match nix::unistd::write(fd.as_fd(), &1u64.to_ne_bytes()) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}
