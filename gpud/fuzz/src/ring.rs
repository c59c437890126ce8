//! Target `ring`: the fuzzer's bytes describe a whole shared ring — ring
//! sizes, arena size and placement, the four counters (SQ head/tail, CQ
//! head/tail), the CQ's NEED_WAKEUP flag, every SQ slot, the arena's
//! contents and optionally an arena-segment message queued on the socket.
//! It is laid out exactly like the memfd (`c_src/erlcuda_ring.h`) in a heap
//! buffer of exactly that size, so AddressSanitizer sees any access past it.
//! Then gpud's real path runs over it: `Ring::new`, `Daemon::process_drain`
//! (drain, validate, segment look-up, coalesce, submit to the CPU backend,
//! error CQEs), `Daemon::reap` (success CQEs), `cq_publish`.
//!
//! Checks, afterwards:
//! - it returned (a hang is reported by libFuzzer's -timeout);
//! - the SQ head published is the old head plus what was taken, or the
//!   VM's tail after an overrun (tail more than a ring ahead);
//! - when the VM is "alive" (socket open and the CQ has the room the VM
//!   promises): every drained entry has exactly one CQE, no other CQE was
//!   written, no CQ slot outside them was touched; OK entries are exactly
//!   those `validate` accepts, with batch = their (kernel, type) group's size;
//!   refused ones carry validate's status and batch 1;
//! - stats: bad_descriptors = refused + 1 per overrun; jobs_ok/failed;
//!   batches; launches = kernels present;
//! - when the VM is "gone" (socket closed or CQ without room): gpud gives up
//!   instead of waiting for ever, and what it did publish is a subset of the
//!   above (each drained entry at most once);
//! - gpud never writes the SQ, the VM's counters, the immutable header, or
//!   any arena byte outside an accepted job's output;
//! - the CQ eventfd is written iff the VM asked (NEED_WAKEUP) and CQEs were
//!   published.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::HashMap;
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;
use std::time::Duration;

use gpud::backend::cpu::CpuBackend;
use gpud::backend::Backend;
use gpud::daemon::Daemon;
use gpud::descriptor::validate;
use gpud::handshake::{validate_header, HeaderFields, Mapping};
use gpud::layout::{EC_CONTROL_FREE, EC_CONTROL_PUT, EC_FLAG_OUT_BUF, 
    Cqe, ElemType, Header, Kernel, SegmentMsg, Sqe, Status, EC_HEADER_BYTES,
    EC_NEED_WAKEUP, EC_SEGMENT_MAGIC,
};
use gpud::ring::Ring;
use gpud::segment::Segments;

use crate::{fds, gen_sqe, Cursor};

/// user_data of SQ slot i: tells the harness which slot a CQE answers.
const TAG: u64 = 0x7a6e_0000_0000_0000;

/// The heap buffer standing in for the memfd; freed on drop.
struct Buf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Buf {
    fn new(len: usize) -> Buf {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: len >= EC_HEADER_BYTES > 0.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).expect("alloc");
        Buf { ptr, layout }
    }
    fn snapshot(&self, from: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: from + len <= layout.size() at every call site; no Rust
        // reference to the buffer exists (gpud uses raw pointers / atomics).
        unsafe { ptr::copy_nonoverlapping(self.ptr.as_ptr().add(from), v.as_mut_ptr(), len) };
        v
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

pub fn run(data: &[u8]) {
    let mut c = Cursor::new(data);

    // Geometry, as the VM would create it (validate_header must accept it).
    let g = c.u8();
    let sq_entries = 1u32 << (g % 7);
    let cq_entries = sq_entries << ((g >> 3) % 3);
    let arena_bytes: u64 = match c.u8() % 4 {
        0 => 0,
        1 => u64::from(c.u8()),
        _ => u64::from(c.u16()),
    };
    let sq_offset = u64::from(EC_HEADER_BYTES);
    let cq_offset = sq_offset + u64::from(sq_entries) * 64;
    let cq_end = cq_offset + u64::from(cq_entries) * 16;
    let slack = c.u8();
    let arena_offset = if slack & 0x80 == 0 {
        cq_end.next_multiple_of(256)
    } else {
        cq_end + u64::from(slack & 0x7f) * 8
    };
    let total = arena_offset + arena_bytes;

    // Counters: the VM's (sq_tail, cq_head) are hostile; the ones gpud owns
    // start wherever the memory says (gpud adopts them once, at Ring::new).
    let sq_head = c.u32();
    let pending = match c.u8() % 8 {
        0 => c.u32(),
        1 => sq_entries + u32::from(c.u8()),
        _ => u32::from(c.u8()) % (sq_entries + 1),
    };
    let sq_tail = sq_head.wrapping_add(pending);
    let cq_tail0 = c.u32();
    let cqmode = c.u8();
    let used = match cqmode % 16 {
        0 => c.u32(),
        1 => cq_entries - u32::from(c.u8()) % (cq_entries + 1),
        _ => u32::from(c.u8()) % (cq_entries - sq_entries + 1),
    };
    let cq_head = cq_tail0.wrapping_sub(used);
    let cq_flags = if cqmode & 0x80 != 0 { EC_NEED_WAKEUP } else { 0 };
    let hang_up = cqmode & 0x40 != 0;

    // Optionally an arena segment message queued on the socket.
    let segsel = c.u8();
    let seg_msg = (segsel & 1 != 0).then(|| {
        let seg = u32::from(segsel >> 1) % 8;
        let bytes = u64::from(c.u16()) & !3;
        let magic = if segsel & 0x80 != 0 { c.u64() } else { EC_SEGMENT_MAGIC };
        (SegmentMsg { magic, segment: seg, reserved: 0, bytes }, c.u8())
    });

    // The SQ: every slot (not only the pending ones: gpud must not read the
    // others, and the harness checks it took exactly the right ones).
    let mut slots: Vec<Sqe> = (0..sq_entries)
        .map(|i| {
            let mut s = gen_sqe(&mut c);
            s.user_data = TAG | u64::from(i);
            // No buffer is ever created here (no EC_FLAG_OUT_BUF, no put),
            // so every buffer id an entry names is unknown: BAD_BUFFER, as
            // `validate` (which knows no buffers) says. The buffer path's
            // own states are the cargo tests' (buffers.rs, daemon).
            s.flags &= !EC_FLAG_OUT_BUF;
            if (EC_CONTROL_PUT..=EC_CONTROL_FREE).contains(&s.kernel) {
                s.kernel = EC_CONTROL_FREE + 1;
            }
            s
        })
        .collect();
    if slots.is_empty() {
        slots.push(Sqe::default());
    }

    // Lay it out.
    let fields = HeaderFields::for_geometry(sq_entries, cq_entries, sq_offset, cq_offset, arena_offset, arena_bytes);
    let buf = Buf::new(total as usize);
    let base = buf.ptr.as_ptr();
    let h = base.cast::<Header>();
    // SAFETY: the buffer is 4096-aligned and at least EC_HEADER_BYTES long,
    // so the header and every SQ slot (64-aligned) are in bounds and aligned;
    // no reference to the memory outlives the statement.
    unsafe {
        fields.write_to(h);
        (*h).sq_head.0.store(sq_head, Ordering::Relaxed);
        (*h).sq_tail.0.store(sq_tail, Ordering::Relaxed);
        (*h).cq_head.0.store(cq_head, Ordering::Relaxed);
        (*h).cq_tail.0.store(cq_tail0, Ordering::Relaxed);
        (*h).cq_flags.0.store(cq_flags, Ordering::Relaxed);
        for (i, s) in slots.iter().enumerate() {
            base.add(sq_offset as usize).cast::<Sqe>().add(i).write(*s);
        }
        let rest = c.rest();
        if !rest.is_empty() {
            for i in 0..arena_bytes as usize {
                *base.add(arena_offset as usize + i) = rest[i % rest.len()];
            }
        }
    }
    let geo = validate_header(&fields, total).expect("the harness lays out a valid header");
    let header_before = buf.snapshot(0, 256);
    let sq_before = buf.snapshot(sq_offset as usize, (cq_offset - sq_offset) as usize);
    let arena_before = buf.snapshot(arena_offset as usize, arena_bytes as usize);

    // The VM's side of the socket, and what it queued there.
    let (sock, vm_end) = fds::seqpacket_pair();
    let mut _seg_fd = None;
    if let Some((msg, how)) = seg_msg {
        let size = if how & 1 == 0 { msg.bytes } else { u64::from(how) * 4 };
        let fd = fds::memfd(size, how & 2 == 0);
        fds::send(&vm_end, &msg.to_bytes(), &[&fd]);
        _seg_fd = Some(fd);
    }
    // What the VM promises: never more jobs in flight than the CQ holds.
    let take = pending.min(sq_entries);
    let room = cq_entries.saturating_sub(used);
    let vm_alive = !hang_up && room >= take;
    // A VM that broke its promise (or left) must not make gpud wait for
    // ever: with the VM gone, gpud gives up on a full CQ.
    let vm_end = vm_alive.then_some(vm_end);

    // SAFETY: the buffer outlives the daemon (dropped first, below), is
    // 4096-aligned and is only reached through raw pointers meanwhile.
    let mapping = unsafe { Mapping::from_raw_parts(buf.ptr, total as usize) };
    let (sq_efd, cq_efd) = (fds::eventfd(), fds::eventfd());
    let cq_efd_probe = cq_efd.try_clone().expect("dup");
    let ring = Ring::new(mapping, geo, sq_efd, cq_efd);
    let mut backend: Box<dyn Backend> = Box::new(CpuBackend::new(0));
    let (seg0, seg0_bytes) = ring.arena().segment(0).expect("segment 0");
    backend.add_segment(0, seg0, seg0_bytes).expect("cpu add_segment");
    // SAFETY: segment 0 lies in the ring's mapping, owned by the daemon.
    let segments = unsafe { Segments::new(seg0, seg0_bytes) };
    let stats0 = stats(ring.stats());
    let mut d = Daemon::new(0, Duration::ZERO, backend, segments, ring, sock);

    let mut alive = d.process_drain().expect("process_drain failed on the CPU backend");
    if alive {
        // Launches, copies and the entries held back behind them.
        alive = d.finish().expect("finish failed on the CPU backend");
    }
    if vm_alive {
        assert!(alive, "gpud quit although the VM is there and the CQ has room");
        assert_eq!(d.launches_in_flight(), 0);
    }
    let sizes = *d.segment_sizes();
    let stats1 = stats(d.ring().stats());
    // SAFETY: the counters' cache lines lie in the header, in bounds.
    let (sq_head1, cq_tail1) = unsafe { ((*h).sq_head.0.load(Ordering::Acquire), (*h).cq_tail.0.load(Ordering::Acquire)) };
    drop(d);
    drop(vm_end);

    // SQ head: everything taken, or skipped to the tail after an overrun.
    let overrun = pending > sq_entries;
    let want_head = if overrun { sq_tail } else { sq_head.wrapping_add(take) };
    assert_eq!(sq_head1, want_head, "SQ head");

    // What each drained slot should get.
    let drained: Vec<Sqe> = (0..take)
        .map(|i| slots[(sq_head.wrapping_add(i) & (sq_entries - 1)) as usize])
        .collect();
    // Every entry is one job (a user's carries its arguments in the arena).
    let jobs = take;
    // One launch per (kernel, element type).
    let verdicts: Vec<Result<(Kernel, ElemType), Status>> = drained
        .iter()
        .map(|s| validate(s, &sizes).map(|j| (j.builtin().expect("no modules are loaded here"), j.ty())))
        .collect();
    let mut group: HashMap<(Kernel, ElemType), u32> = HashMap::new();
    for k in verdicts.iter().flatten() {
        *group.entry(*k).or_default() += 1;
    }
    let refused = verdicts.iter().filter(|v| v.is_err()).count() as u64;
    let accepted = u64::from(jobs) - refused;

    // The CQEs published.
    let published = cq_tail1.wrapping_sub(cq_tail0);
    assert!(published <= take, "{published} CQEs for {take} entries");
    let cq_bytes = buf.snapshot(cq_offset as usize, (cq_end - cq_offset) as usize);
    let cqe_at = |slot: u32| -> Cqe {
        let n = std::mem::size_of::<Cqe>();
        let o = slot as usize * n;
        Cqe::from_bytes(&cq_bytes[o..o + n]).expect("a whole CQE")
    };
    let mut answered = vec![false; take as usize];
    for i in 0..published {
        let cqe = cqe_at(cq_tail0.wrapping_add(i) & (cq_entries - 1));
        assert_eq!(cqe.user_data & !0xffff, TAG, "CQE for something never submitted: {cqe:?}");
        let slot = (cqe.user_data & 0xffff) as u32;
        // Which drained position holds that slot (slots are distinct since take <= sq_entries).
        let pos = (0..take)
            .find(|&p| sq_head.wrapping_add(p) & (sq_entries - 1) == slot)
            .unwrap_or_else(|| panic!("CQE for slot {slot}, which was not drained: {cqe:?}"));
        assert!(!answered[pos as usize], "two CQEs for slot {slot}");
        answered[pos as usize] = true;
        match verdicts[pos as usize] {
            Ok(k) => {
                assert_eq!(cqe.status, Status::Ok.code(), "{:?}", drained[pos as usize]);
                assert_eq!(cqe.batch, group[&k]);
            }
            Err(st) => {
                assert_eq!(cqe.status, st.code(), "{:?}", drained[pos as usize]);
                assert_eq!(cqe.batch, 1);
            }
        }
    }
    let d_stat = |i: usize| stats1[i] - stats0[i];
    if vm_alive {
        assert!(answered.iter().all(|&a| a), "a drained job got no CQE");
        assert_eq!(published, jobs);
        // No CQ slot outside the ones answered was written.
        for s in 0..cq_entries {
            if s.wrapping_sub(cq_tail0) & (cq_entries - 1) >= jobs || jobs == 0 {
                assert_eq!(cqe_at(s & (cq_entries - 1)), Cqe::default(), "stray CQE in slot {s}");
            }
        }
        assert_eq!(d_stat(BAD), refused + u64::from(overrun), "bad_descriptors");
        assert_eq!(d_stat(OK), accepted, "jobs_ok");
        assert_eq!(d_stat(FAILED), refused, "jobs_failed");
        assert_eq!(d_stat(LAUNCHES), group.len() as u64, "launches");
    } else {
        assert!(d_stat(BAD) <= refused + u64::from(overrun));
        assert!(d_stat(OK) <= accepted && d_stat(FAILED) <= refused);
    }
    assert_eq!(d_stat(BATCHES), u64::from(take > 0), "batches");

    // Wake-up: the VM is woken iff it asked and there is something new.
    let woken = fds::eventfd_take(&cq_efd_probe) > 0;
    assert_eq!(woken, cq_flags != 0 && published > 0, "CQ eventfd");

    // gpud never writes what it only reads.
    assert_eq!(buf.snapshot(sq_offset as usize, (cq_offset - sq_offset) as usize), sq_before, "SQ written");
    let header_after = buf.snapshot(0, 256);
    assert_eq!(header_after[..64], header_before[..64], "immutable header written");
    // SAFETY: header fields, in bounds.
    unsafe {
        assert_eq!((*h).sq_tail.0.load(Ordering::Relaxed), sq_tail, "sq_tail written");
        assert_eq!((*h).cq_head.0.load(Ordering::Relaxed), cq_head, "cq_head written");
        assert_eq!((*h).cq_flags.0.load(Ordering::Relaxed), cq_flags, "cq_flags written");
    }
    let arena_after = buf.snapshot(arena_offset as usize, arena_bytes as usize);
    if arena_after != arena_before {
        let outs: Vec<(u64, u64)> = drained
            .iter()
            .filter_map(|s| validate(s, &sizes).ok())
            .filter(|j| j.out().segment() == 0)
            .map(|j| (j.out().offset(), j.out().end()))
            .collect();
        for (i, (a, b)) in arena_before.iter().zip(&arena_after).enumerate() {
            if a != b {
                let i = i as u64;
                assert!(
                    outs.iter().any(|&(lo, hi)| lo <= i && i < hi),
                    "arena byte {i} written outside every accepted output"
                );
            }
        }
    }
}

// Indices into `stats`.
const OK: usize = 0;
const FAILED: usize = 1;
const BATCHES: usize = 2;
const LAUNCHES: usize = 3;
const BAD: usize = 4;

fn stats(s: &gpud::layout::Stats) -> [u64; 5] {
    [
        s.jobs_ok.load(Ordering::Relaxed),
        s.jobs_failed.load(Ordering::Relaxed),
        s.batches.load(Ordering::Relaxed),
        s.launches.load(Ordering::Relaxed),
        s.bad_descriptors.load(Ordering::Relaxed),
    ]
}
