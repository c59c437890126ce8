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
//! Users' jobs are among the entries (half the raw ones become one, of a
//! kernel of the fixed module, its record written into the arena). When an
//! SQ slot names a user's kernel and the arena can hold the module's path,
//! gpud first loads the fixed module (`host.rs`) through a control
//! descriptor in a drain of its own, as the VM loads one, and the fuzzed
//! state is laid over the ring after it.
//!
//! Checks, afterwards:
//! - it returned (a hang is reported by libFuzzer's -timeout);
//! - the SQ head published is the old head plus what was taken, or the
//!   VM's tail after an overrun (tail more than a ring ahead);
//! - when the VM is "alive" (socket open and the CQ has the room the VM
//!   promises): every drained entry has exactly one CQE, no other CQE was
//!   written, no CQ slot outside them was touched; OK entries are exactly
//!   those validation accepts (against the modules gpud has, users' records
//!   read from the arena as laid out), with batch = their (kernel, type,
//!   geometry) group's size; refused ones carry validation's status and
//!   batch 1;
//! - users' jobs: the host code ran exactly the accepted ones, once each,
//!   with the lengths, parameters, options and arena places validation
//!   gave them; each output started zeroed, and the host code read and
//!   wrote every byte of its slots (AddressSanitizer sees any byte outside
//!   the mapping);
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
use gpud::descriptor::{validate_with, ArgsMemory, Geometry, Job, KernelRef, Region, SegmentSizes};
use gpud::handshake::{validate_header, HeaderFields, Mapping};
use gpud::layout::{
    Cqe, ElemType, Header, JobArgs, SegmentMsg, Sqe, Status, EC_ADDR_OFFSET_MASK, EC_ADDR_SEGMENT_SHIFT, EC_CONTROL_FREE,
    EC_CONTROL_LOAD_MODULE, EC_CONTROL_PUT, EC_FLAG_ARGS, EC_FLAG_OUT_BUF, EC_HEADER_BYTES, EC_JOB_ARGS_BYTES, EC_NEED_WAKEUP,
    EC_MAX_VECTORS, EC_SEGMENT_MAGIC, EC_USER_KERNEL_BASE,
};
use gpud::modules::{kernel_id, Registry};
use gpud::ring::Ring;
use gpud::segment::Segments;

use crate::host::{self, Ran, MODULE_DIR};
use crate::module::{MAX_OUTPUTS, MAX_VECTORS};
use crate::userjob::{self, Placement};
use crate::{fds, gen_sqe, Cursor};

/// user_data of SQ slot i: tells the harness which slot a CQE answers.
const TAG: u64 = 0x7a6e_0000_0000_0000;
/// user_data of the control descriptor that loads the fixed module.
const LOAD_TAG: u64 = 0x6c6f_6164;

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
    let cq_end = cq_offset + u64::from(cq_entries) * std::mem::size_of::<Cqe>() as u64;
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

    // Users' jobs go into the arena, and into the queued segment (which
    // gpud may refuse); their records into the arena only.
    let mut segs = vec![(0u64, arena_bytes)];
    if let Some((m, _)) = &seg_msg {
        if m.segment != 0 {
            segs.push((u64::from(m.segment), m.bytes));
        }
    }
    let specs = &userjob::fixed_module().0;
    let mut place = Placement { segs: &segs, at: 0, records_in_seg0: true, new_buffers: false };
    let mut records: Vec<(u64, JobArgs)> = Vec::new();

    // The SQ: every slot (not only the pending ones: gpud must not read the
    // others, and the harness checks it took exactly the right ones).
    let mut slots: Vec<Sqe> = (0..sq_entries)
        .map(|i| {
            let mut user = |c: &mut Cursor<'_>| {
                let k = usize::from(c.u8()) % specs.len();
                // No buffer exists here (see below): io arguments name
                // unknown ones, and no output makes one.
                let (s, mut a) = userjob::gen_job(c, kernel_id(0, k), &specs[k], &mut place, &mut |_, _, _| {});
                // Nor does a record's corruption: an output bit of
                // `buffers` asks for a new buffer, which gpud makes and
                // the reference (no buffer table) refuses. A fuzzed
                // record with one was answered ok against the
                // reference's bad_buffer.
                a.buffers &= (1 << EC_MAX_VECTORS) - 1;
                records.push((s.in0, a));
                s
            };
            let mut s = gen_sqe(&mut c, &mut user);
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
    // The module, when some entry may need it and its path fits the arena.
    let load = slots.iter().any(|s| s.kernel >= EC_USER_KERNEL_BASE) && MODULE_DIR.len() as u64 <= arena_bytes;
    let mut registry = Registry::default();
    if load {
        host::install();
        registry.install(0, userjob::fixed_module().1.clone());
    }

    // Lay it out.
    let fields = HeaderFields::for_geometry(sq_entries, cq_entries, sq_offset, cq_offset, arena_offset, arena_bytes);
    let buf = Buf::new(total as usize);
    let base = buf.ptr.as_ptr();
    let h = base.cast::<Header>();
    let sq_slot = |i: u32| base.wrapping_add(sq_offset as usize).cast::<Sqe>().wrapping_add((i & (sq_entries - 1)) as usize);
    let cq_slot = |i: u32| base.wrapping_add(cq_offset as usize).cast::<Cqe>().wrapping_add((i & (cq_entries - 1)) as usize);
    // SAFETY: the buffer is 4096-aligned and at least EC_HEADER_BYTES long,
    // so the header and every SQ slot (64-aligned) are in bounds and aligned;
    // the module's path fits the arena (`load`); no reference to the memory
    // outlives the statement.
    unsafe {
        fields.write_to(h);
        if load {
            // One entry before the fuzzed head, answered just before the
            // fuzzed CQ tail: afterwards gpud's counters are the fuzzed ones.
            (*h).sq_head.0.store(sq_head.wrapping_sub(1), Ordering::Relaxed);
            (*h).sq_tail.0.store(sq_head, Ordering::Relaxed);
            (*h).cq_head.0.store(cq_tail0.wrapping_sub(1), Ordering::Relaxed);
            (*h).cq_tail.0.store(cq_tail0.wrapping_sub(1), Ordering::Relaxed);
            let dir = MODULE_DIR.as_bytes();
            std::ptr::copy_nonoverlapping(dir.as_ptr(), base.add(arena_offset as usize), dir.len());
            sq_slot(sq_head.wrapping_sub(1)).write(Sqe {
                user_data: LOAD_TAG,
                kernel: EC_CONTROL_LOAD_MODULE,
                in0: 0,
                in0_len: dir.len() as u32,
                out: dir.len() as u64,
                ..Sqe::default()
            });
        } else {
            (*h).sq_head.0.store(sq_head, Ordering::Relaxed);
            (*h).sq_tail.0.store(sq_tail, Ordering::Relaxed);
            (*h).cq_head.0.store(cq_head, Ordering::Relaxed);
            (*h).cq_tail.0.store(cq_tail0, Ordering::Relaxed);
            (*h).cq_flags.0.store(cq_flags, Ordering::Relaxed);
        }
    }
    let geo = validate_header(&fields, total).expect("the harness lays out a valid header");

    let (sock, vm_end) = fds::seqpacket_pair();
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
    let mut d = Daemon::new(0, Duration::ZERO, backend, segments, ring, sock);

    if load {
        assert!(d.process_drain().expect("loading the module"), "gpud quit while loading the module");
        // SAFETY: header fields and a CQ slot, in bounds.
        unsafe {
            let cqe = cq_slot(cq_tail0.wrapping_sub(1)).read();
            assert_eq!((cqe.user_data, cqe.status), (LOAD_TAG, Status::Ok.code()), "the fixed module did not load from {MODULE_DIR}");
            cq_slot(cq_tail0.wrapping_sub(1)).write(Cqe::default());
            assert_eq!((*h).sq_head.0.load(Ordering::Acquire), sq_head);
            assert_eq!((*h).cq_tail.0.load(Ordering::Acquire), cq_tail0);
            (*h).sq_tail.0.store(sq_tail, Ordering::Relaxed);
            (*h).cq_head.0.store(cq_head, Ordering::Relaxed);
            (*h).cq_flags.0.store(cq_flags, Ordering::Relaxed);
        }
    }

    // A user's job parked for a segment still registering is validated
    // again after the jobs before it ran: its record must still be what
    // the harness wrote. Where an output validation may accept covers a
    // record, that job names no module's kernel instead.
    if seg_msg.is_some() && load {
        let mut widest = SegmentSizes::single(arena_bytes);
        for &(seg, bytes) in &segs[1..] {
            widest.set(seg as usize, bytes);
        }
        let arena_now = arena_image(&c, arena_bytes, &records, &slots);
        loop {
            let mem = ArenaRecords(&arena_now);
            let outs: Vec<Region> = slots
                .iter()
                .filter_map(|s| validate_with(s, &widest, &registry, &mem).ok())
                .flat_map(|j| j.outputs().to_vec())
                .filter(|r| r.segment() == 0 && !r.is_empty())
                .collect();
            let covered = slots.iter_mut().find(|s| {
                s.flags & EC_FLAG_ARGS != 0
                    && registry.kernel(s.kernel).is_some()
                    && s.in0 >> EC_ADDR_SEGMENT_SHIFT == 0
                    && outs.iter().any(|o| o.offset() < s.in0 + u64::from(EC_JOB_ARGS_BYTES) && s.in0 < o.end())
            });
            match covered {
                Some(s) => s.kernel = kernel_id(0, 63),
                None => break,
            }
        }
    }

    // The fuzzed state: SQ slots, the arena and the records in it.
    // SAFETY: slots and arena bytes in bounds; records only where a whole
    // one fits the arena.
    unsafe {
        for (i, s) in slots.iter().enumerate() {
            sq_slot(i as u32).write(*s);
        }
        let image = arena_image(&c, arena_bytes, &records, &slots);
        std::ptr::copy_nonoverlapping(image.as_ptr(), base.add(arena_offset as usize), image.len());
    }
    let header_before = buf.snapshot(0, 256);
    let sq_before = buf.snapshot(sq_offset as usize, (cq_offset - sq_offset) as usize);
    let arena_before = buf.snapshot(arena_offset as usize, arena_bytes as usize);

    // The VM's side of the socket, and what it queued there.
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

    host::arm(base.wrapping_add(arena_offset as usize) as usize as u64, arena_bytes);
    let stats0 = stats(d.ring().stats());
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
    let mem = ArenaRecords(&arena_before);
    let validated: Vec<Result<Job, Status>> = drained.iter().map(|s| validate_with(s, &sizes, &registry, &mem)).collect();
    // One launch per (kernel, element type, and a user's: geometry).
    let verdicts: Vec<Result<(KernelRef, ElemType, Geometry), Status>> =
        validated.iter().map(|v| v.as_ref().map(|j| (j.kernel(), j.ty(), j.geometry())).map_err(|s| *s)).collect();
    let mut group: HashMap<(KernelRef, ElemType, Geometry), u32> = HashMap::new();
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

    // The host code ran the accepted users' jobs, each once, as validated.
    let mut want_ran: Vec<Ran> = validated.iter().flatten().filter_map(ran_of).collect();
    want_ran.sort();
    let ran = host::ran();
    if vm_alive {
        assert_eq!(ran, want_ran, "users' jobs run");
    } else {
        let mut left = want_ran;
        for r in &ran {
            let i = left.iter().position(|w| w == r).unwrap_or_else(|| panic!("a user's job ran that validation refused: {r:?}"));
            left.remove(i);
        }
    }

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
        let outs: Vec<(u64, u64)> = validated
            .iter()
            .flatten()
            .flat_map(|j| j.outputs().to_vec())
            .filter(|r| r.segment() == 0)
            .map(|r| (r.offset(), r.end()))
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

/// The arena as the harness lays it out: the input's remaining bytes over
/// and over, then the users' records where a whole one fits, 8-aligned.
fn arena_image(c: &Cursor<'_>, arena_bytes: u64, records: &[(u64, JobArgs)], slots: &[Sqe]) -> Vec<u8> {
    let rest = c.rest();
    let mut image: Vec<u8> = if rest.is_empty() {
        vec![0; arena_bytes as usize]
    } else {
        rest.iter().copied().cycle().take(arena_bytes as usize).collect()
    };
    for (addr, a) in records {
        let off = addr & EC_ADDR_OFFSET_MASK;
        if addr >> EC_ADDR_SEGMENT_SHIFT == 0 && off.is_multiple_of(8) && off + u64::from(EC_JOB_ARGS_BYTES) <= arena_bytes {
            image[off as usize..][..EC_JOB_ARGS_BYTES as usize].copy_from_slice(&a.to_bytes());
        }
    }
    // No record asks for a new output buffer, whatever lies where an entry
    // points: records that overlap, or fuzzed bytes where none was written,
    // once read as a record with an output bit of `buffers` set, which gpud
    // answered ok (it makes the buffer) against the reference's
    // bad_buffer. Clearing bits only, so no record gains one.
    let at = std::mem::offset_of!(JobArgs, buffers) as u64;
    for s in slots.iter().filter(|s| s.flags & EC_FLAG_ARGS != 0 && s.in0 >> EC_ADDR_SEGMENT_SHIFT == 0) {
        let off = s.in0 & EC_ADDR_OFFSET_MASK;
        if off + u64::from(EC_JOB_ARGS_BYTES) <= arena_bytes {
            let field = &mut image[(off + at) as usize..][..4];
            let bits = u32::from_ne_bytes(field.try_into().expect("four bytes")) & ((1 << EC_MAX_VECTORS) - 1);
            field.copy_from_slice(&bits.to_ne_bytes());
        }
    }
    image
}

/// Records as validation reads them, from an image of the arena; other
/// segments are fresh memfds, all zeros.
struct ArenaRecords<'a>(&'a [u8]);

impl ArgsMemory for ArenaRecords<'_> {
    fn copy_args(&self, r: Region) -> JobArgs {
        if r.segment() != 0 {
            return JobArgs::default();
        }
        JobArgs::from_bytes(&self.0[r.offset() as usize..r.end() as usize]).expect("a whole record")
    }
}

/// What the host code of an accepted user's job should see.
fn ran_of(j: &Job) -> Option<Ran> {
    let KernelRef::User(id) = j.kernel() else { return None };
    let mut r = Ran {
        kernel: usize::from(id - kernel_id(0, 0)),
        ty: j.ty().id(),
        len: [0; MAX_VECTORS + MAX_OUTPUTS],
        param: j.params(),
        at: [None; MAX_VECTORS + MAX_OUTPUTS],
        opts: j.launch_opts(),
    };
    let used = (0..j.inputs().len()).chain(MAX_VECTORS..MAX_VECTORS + j.outputs().len());
    for i in used {
        let s = j.slot(i);
        r.len[i] = s.len() as u32;
        r.at[i] = (s.segment() == 0).then_some(s.offset());
    }
    Some(r)
}
