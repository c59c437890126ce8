//! The ring path over a ring in ordinary memory, through the real daemon.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::handshake::{validate_header, HeaderFields, Mapping};
use crate::layout::{
    Cqe, ElemType, Header, Kernel, Params, Sqe, Status, EC_CONTROL_FREE, EC_CONTROL_GET, EC_CONTROL_PUT,
    EC_FLAG_IN0_BUF, EC_FLAG_OUT_BUF,
};

fn eventfd() -> OwnedFd {
    // SAFETY: a fresh fd, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)) }
}

/// A ring in a zeroed heap buffer: an SQ of `sq` entries at 4096, the CQ
/// of `cq` behind it, then `arena_bytes` of arena.
struct HeapRing {
    base: NonNull<u8>,
    layout: Layout,
    total: usize,
    geo: crate::handshake::Geometry,
    sq_off: u64,
    cq_off: u64,
    arena_off: u64,
}

impl HeapRing {
    fn new(sq: u32, cq: u32, arena_bytes: u64) -> HeapRing {
        let (sq_off, cq_off) = (4096u64, 4096 + 64 * sq as u64);
        let arena_off = cq_off + std::mem::size_of::<Cqe>() as u64 * cq as u64;
        let total = (arena_off + arena_bytes) as usize;
        let layout = Layout::from_size_align(total, 4096).unwrap();
        // SAFETY: non-zero size.
        let base = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        let fields = HeaderFields::for_geometry(sq, cq, sq_off, cq_off, arena_off, arena_bytes);
        let geo = validate_header(&fields, total as u64).unwrap();
        HeapRing { base, layout, total, geo, sq_off, cq_off, arena_off }
    }

    /// # Safety
    /// Nothing uses the buffer any more (the daemon over it is dropped).
    unsafe fn free(self) {
        // SAFETY: allocated in `new` with this layout; unused per the caller.
        unsafe { dealloc(self.base.as_ptr(), self.layout) };
    }
}

/// A daemon on the CPU backend over a ring in a heap buffer (`base`,
/// `total` bytes, laid out as `geo`), and the VM's end of its socket.
fn heap_daemon(base: NonNull<u8>, total: usize, geo: crate::handshake::Geometry) -> (Daemon, OwnedFd) {
    // SAFETY: the caller's buffer outlives the daemon (dropped before dealloc).
    let mapping = unsafe { Mapping::from_raw_parts(base, total) };
    let ring = Ring::new(mapping, geo, eventfd(), eventfd());
    let mut backend: Box<dyn Backend> = Box::new(CpuBackend::new(0));
    let (seg0, bytes0) = ring.arena().segment(0).unwrap();
    backend.add_segment(0, seg0, bytes0).unwrap();
    // SAFETY: segment 0 lies in the ring's mapping.
    let segments = unsafe { Segments::new(seg0, bytes0) };
    let (sock, vm) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap();
    (Daemon::new(0, Duration::ZERO, backend, segments, ring, sock), vm)
}

/// The ring path over a ring in ordinary memory (what gpud/fuzz's `ring`
/// target does with hostile contents): good and bad entries, each gets
/// exactly one CQE; bad ones are counted.
#[test]
fn drain_answers_every_entry_once_over_a_heap_ring() {
    const SQ: u32 = 4;
    const CQ: u32 = 8;
    let ring = HeapRing::new(SQ, CQ, 4096u64);
    let (base, total, geo) = (ring.base, ring.total, ring.geo);
    let (sq_off, cq_off) = (ring.sq_off, ring.cq_off);
    let vadd = |user_data, out| Sqe {
        user_data,
        kernel: Kernel::VectorAdd.id(),
        in0: 0,
        in1: 64,
        out,
        in0_len: 16,
        in1_len: 16,
        out_len: 16,
        ..Sqe::default()
    };
    let entries = [
        vadd(1, 128),
        Sqe { kernel: 9, ..vadd(2, 256) },
        vadd(3, 32), // overlaps in0
        vadd(4, 192),
    ];
    let h = base.as_ptr().cast::<Header>();
    // SAFETY: in bounds of the buffer; no references kept.
    unsafe {
        for (i, s) in entries.iter().enumerate() {
            base.as_ptr().add(sq_off as usize).cast::<Sqe>().add(i).write(*s);
        }
        // Free-running counters that wrap while in use.
        (*h).sq_head.0.store(u32::MAX - 1, Ordering::Relaxed);
        (*h).sq_tail.0.store(2, Ordering::Relaxed);
        (*h).cq_tail.0.store(u32::MAX, Ordering::Relaxed);
        (*h).cq_head.0.store(u32::MAX, Ordering::Relaxed);
    }
    let (mut d, _vm) = heap_daemon(base, total, geo);
    assert!(d.process_drain().unwrap());
    assert!(d.finish().unwrap());
    let stats = d.ring().stats();
    assert_eq!(stats.bad_descriptors.load(Ordering::Relaxed), 2);
    assert_eq!(stats.jobs_ok.load(Ordering::Relaxed), 2);
    assert_eq!(stats.jobs_failed.load(Ordering::Relaxed), 2);
    drop(d);
    // SAFETY: as above.
    let cqes: Vec<Cqe> = unsafe {
        assert_eq!((*h).sq_head.0.load(Ordering::Relaxed), 2);
        assert_eq!((*h).cq_tail.0.load(Ordering::Relaxed), 3);
        (0..4u32)
            .map(|i| base.as_ptr().add(cq_off as usize).cast::<Cqe>().add((u32::MAX.wrapping_add(i) & (CQ - 1)) as usize).read())
            .collect()
    };
    let mut got: Vec<(u64, i32, u32)> = cqes.iter().map(|c| (c.user_data, c.status, c.batch)).collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (1, Status::Ok.code(), 2),
            (2, Status::BadKernel.code(), 1),
            (3, Status::Overlap.code(), 1),
            (4, Status::Ok.code(), 2),
        ]
    );
    // SAFETY: the daemon is gone.
    unsafe { ring.free() };
}

/// A pipelined put through the daemon over a heap ring (cpu backend):
/// slices published out of order make one buffer that a get reads back
/// whole; a put that does not fit answers OOM for each of its slices
/// and leaves nothing behind, and its free is harmless.
#[test]
fn put_slices_out_of_order_then_get_and_a_failing_put() {
    const SQ: u32 = 16;
    let ring = HeapRing::new(SQ, SQ, 64u64 << 10);
    let (base, total, geo) = (ring.base, ring.total, ring.geo);
    let (sq_off, cq_off, arena_off) = (ring.sq_off, ring.cq_off, ring.arena_off);
    let arena = |off: u64| (arena_off + off) as usize;
    // 3000 f32 at arena 0, its get at 16384; a second put's input at
    // 32768; free lists at 49152.
    let n = 3000u32;
    let want: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    let put = |user_data, id: u64, at: u64, part: u32, src: u64| {
        let mut p = Params::default();
        p.set_u64(0, at);
        Sqe {
            user_data,
            kernel: EC_CONTROL_PUT,
            ty: ElemType::F32.id(),
            flags: EC_FLAG_OUT_BUF,
            in0: src + at,
            in0_len: part,
            out: id,
            out_len: n,
            p,
            ..Sqe::default()
        }
    };
    let get = |user_data, id| Sqe {
        user_data,
        kernel: EC_CONTROL_GET,
        ty: ElemType::F32.id(),
        flags: EC_FLAG_IN0_BUF,
        in0: id,
        in0_len: n,
        out: 16384,
        out_len: n,
        ..Sqe::default()
    };
    let free = |user_data, at: u64, ids: u32| Sqe {
        user_data,
        kernel: EC_CONTROL_FREE,
        ty: ElemType::S64.id(),
        in0: at,
        in0_len: ids,
        ..Sqe::default()
    };
    let entries = [
        // Buffer 5 in three slices, the last one first; a get before
        // the put is complete is refused.
        put(1, 5, 8192, n - 2048, 0),
        put(2, 5, 0, 1024, 0),
        get(3, 5),
        put(4, 5, 4096, 1024, 0),
        get(5, 5),
        // Buffer 6 does not fit the limit: every slice answers OOM.
        put(6, 6, 4096, 1024, 32768),
        put(7, 6, 0, 1024, 32768),
        put(8, 6, 8192, n - 2048, 32768),
        // Its free (the VM frees a failed put), then a put of the same
        // id is judged afresh: buffer 5 freed first, it fits.
        free(9, 49152, 2),
        put(10, 6, 0, n, 32768),
    ];
    // SAFETY: every write is in bounds of the buffer; no references kept.
    unsafe {
        let b = base.as_ptr();
        for (i, x) in want.iter().enumerate() {
            b.add(arena(0)).cast::<f32>().add(i).write(*x);
            b.add(arena(32768)).cast::<f32>().add(i).write(-*x);
        }
        b.add(arena(49152)).cast::<u64>().write(6);
        b.add(arena(49152)).cast::<u64>().add(1).write(5);
        for (i, s) in entries.iter().enumerate() {
            b.add(sq_off as usize).cast::<Sqe>().add(i).write(*s);
        }
        (*b.cast::<Header>()).sq_tail.0.store(entries.len() as u32, Ordering::Relaxed);
    }
    let (mut d, _vm) = heap_daemon(base, total, geo);
    // Room for one 12 KB buffer (a 12 KiB size class), not two.
    d.set_memory_limit(buffers::MemoryLimit::Bytes(20_000));
    assert!(d.process_drain().unwrap());
    // Puts and gets are answered once their copies are done.
    assert!(d.finish().unwrap());
    assert_eq!(d.buffer_use(), (1, buffers::size_class(12_000)), "buffer 6 alone, counted once");
    let stats = d.ring().stats();
    // The get of a filling buffer is a VM bug: the only bad descriptor.
    assert_eq!(stats.bad_descriptors.load(Ordering::Relaxed), 1);
    // One block from the device: the failed put took none, and buffer 6
    // reuses buffer 5's.
    assert_eq!(stats.buf_device_allocs.load(Ordering::Relaxed), 1);
    drop(d);
    // SAFETY: as above.
    let (cqes, got): (Vec<(u64, i32)>, Vec<f32>) = unsafe {
        let b = base.as_ptr();
        assert_eq!((*b.cast::<Header>()).cq_tail.0.load(Ordering::Relaxed), entries.len() as u32);
        (
            {
                let mut c: Vec<(u64, i32)> = (0..entries.len())
                    .map(|i| b.add(cq_off as usize).cast::<Cqe>().add(i).read())
                    .map(|c| (c.user_data, c.status))
                    .collect();
                // Refusals are answered at once, copies when done.
                c.sort();
                c
            },
            (0..n as usize).map(|i| b.add(arena(16384)).cast::<f32>().add(i).read()).collect(),
        )
    };
    let (ok, oom, bad) = (Status::Ok.code(), Status::Oom.code(), Status::BadBuffer.code());
    assert_eq!(
        cqes,
        vec![(1, ok), (2, ok), (3, bad), (4, ok), (5, ok), (6, oom), (7, oom), (8, oom), (9, ok), (10, ok)]
    );
    assert_eq!(got, want, "the get reads back every slice in its place");
    // SAFETY: the daemon is gone.
    unsafe { ring.free() };
}

/// What the test kernel's host code saw, job by job.
static SEEN: std::sync::Mutex<Vec<crate::kitjob::Job>> = std::sync::Mutex::new(Vec::new());

/// The host code of `scale` (see the test below): adds into its outputs,
/// so it sees whether they started zeroed.
unsafe extern "C" fn host_scale(job: *const crate::kitjob::Job) {
    // SAFETY: gpud hands a live record whose slots hold the lengths the
    // signature states, at host addresses of the right types.
    unsafe {
        let j = *job;
        SEEN.lock().unwrap().push(j);
        let k = j.param[0] as i64 as f32;
        let (x, y) = (j.addr[0] as *const f32, j.addr[8] as *mut f32);
        for i in 0..j.len[0] as usize {
            *y.add(i) += k * *x.add(i);
        }
        *(j.addr[9] as *mut u32) += j.len[0];
        let acc = j.addr[1] as *mut i64;
        for i in 0..j.len[1] as usize {
            *acc.add(i) += 1;
        }
    }
}

/// Users' jobs through the ring on the cpu backend: one entry each, the
/// record copied from the arena, the host code called once per job with
/// host addresses, outputs zeroed first, the io buffer updated in place,
/// and both jobs of one kernel in one launch.
#[test]
fn users_jobs_run_from_their_records() {
    use crate::layout::{JobArgs, EC_FLAG_ARGS, EC_JOB_ARGS_BYTES};
    use crate::modules::{kernel_id, parse_manifest, UserKernel};
    const SQ: u32 = 8;
    let ring = HeapRing::new(SQ, SQ, 16u64 << 10);
    let (base, total, geo) = (ring.base, ring.total, ring.geo);
    let (sq_off, cq_off, arena_off) = (ring.sq_off, ring.cq_off, ring.arena_off);
    let at = |off: u64| base.as_ptr().wrapping_add((arena_off + off) as usize);
    // Arena: x at 0, the jobs' y at 256 and 512, their counts at 768 and
    // 1024, records at 1280 and 1536, acc's put at 2048, its get at 3072.
    let manifest = "erlcuda-module 2\nkernel scale types=f32 args=x:v:T:n,acc:io:s64:m,k:s:s32 outs=y:o:T:n,cnt:s:u32 \
                    blocks=elements(n) threads=256 block_rule=any shared=0\n";
    let mut k = UserKernel::new(kernel_id(0, 0), parse_manifest(manifest).unwrap().remove(0));
    k.host[ElemType::F32 as usize] = Some(host_scale);
    let record = |y: u64, cnt: u64, scale: i64| {
        let mut a = JobArgs::default();
        for (slot, addr, len) in [(0, 0, 4), (1, 42, 3), (8, y, 4), (9, cnt, 1)] {
            (a.addr[slot], a.len[slot]) = (addr, len);
        }
        (a.buffers, a.param[0]) = (1 << 1, scale as u64);
        a
    };
    let job = |user_data, rec: u64| Sqe {
        user_data,
        kernel: kernel_id(0, 0),
        ty: ElemType::F32.id(),
        flags: EC_FLAG_ARGS,
        in0: rec,
        in0_len: EC_JOB_ARGS_BYTES,
        ..Sqe::default()
    };
    let entries = [
        Sqe {
            user_data: 1,
            kernel: EC_CONTROL_PUT,
            ty: ElemType::S64.id(),
            flags: EC_FLAG_OUT_BUF,
            in0: 2048,
            in0_len: 3,
            out: 42,
            out_len: 3,
            ..Sqe::default()
        },
        job(2, 1280),
        job(3, 1536),
        // Read back once the jobs are answered, as the VM would.
        Sqe { user_data: 4, kernel: EC_CONTROL_GET, ty: ElemType::S64.id(), flags: EC_FLAG_IN0_BUF, in0: 42, in0_len: 3, out: 3072, out_len: 3, ..Sqe::default() },
    ];
    // SAFETY: every write is in bounds of the buffer; no references kept.
    unsafe {
        for i in 0..4 {
            at(0).cast::<f32>().add(i).write(i as f32 + 1.0);
            // Garbage the outputs must not keep.
            at(256).cast::<f32>().add(i).write(f32::NAN);
            at(512).cast::<f32>().add(i).write(f32::NAN);
        }
        at(768).cast::<u32>().write(0xdead_beef);
        at(1024).cast::<u32>().write(0xdead_beef);
        at(1280).cast::<JobArgs>().write(record(256, 768, 2));
        at(1536).cast::<JobArgs>().write(record(512, 1024, -3));
        for (i, v) in [10i64, 20, 30].into_iter().enumerate() {
            at(2048).cast::<i64>().add(i).write(v);
        }
        for (i, s) in entries.iter().enumerate() {
            base.as_ptr().add(sq_off as usize).cast::<Sqe>().add(i).write(*s);
        }
        (*base.as_ptr().cast::<Header>()).sq_tail.0.store(3, Ordering::Relaxed);
    }
    let (mut d, _vm) = heap_daemon(base, total, geo);
    d.modules.install(0, vec![std::sync::Arc::new(k)]);
    SEEN.lock().unwrap().clear();
    assert!(d.process_drain().unwrap());
    assert!(d.finish().unwrap());
    // SAFETY: the header's tail, in bounds.
    unsafe { (*base.as_ptr().cast::<Header>()).sq_tail.0.store(4, Ordering::Relaxed) };
    assert!(d.process_drain().unwrap());
    assert!(d.finish().unwrap());
    assert_eq!(d.ring().stats().launches.load(Ordering::Relaxed), 1, "one launch for both jobs");
    drop(d);
    // SAFETY: as above; the daemon is gone.
    unsafe {
        let mut cqes: Vec<(u64, i32, u32)> = (0..entries.len())
            .map(|i| base.as_ptr().add(cq_off as usize).cast::<Cqe>().add(i).read())
            .map(|c| (c.user_data, c.status, c.batch))
            .collect();
        // The put is answered when its copy is done, after the launch.
        cqes.sort();
        let ok = Status::Ok.code();
        assert_eq!(cqes, vec![(1, ok, 1), (2, ok, 2), (3, ok, 2), (4, ok, 1)]);
        let read = |off: u64| (0..4).map(|i| at(off).cast::<f32>().add(i).read()).collect::<Vec<f32>>();
        assert_eq!(read(256), vec![2.0, 4.0, 6.0, 8.0]);
        assert_eq!(read(512), vec![-3.0, -6.0, -9.0, -12.0]);
        assert_eq!((at(768).cast::<u32>().read(), at(1024).cast::<u32>().read()), (4, 4));
        let acc: Vec<i64> = (0..3).map(|i| at(3072).cast::<i64>().add(i).read()).collect();
        assert_eq!(acc, vec![12, 22, 32], "updated in place by each job");
    }
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for (j, y) in seen.iter().zip([256u64, 512]) {
        assert_eq!(j.addr[0], at(0) as u64);
        assert_eq!(j.addr[8], at(y) as u64);
        assert_ne!(j.addr[1], 42, "the io buffer's host address, not its id");
        assert_eq!((&j.len[..2], &j.len[8..10]), (&[4, 3][..], &[4, 1][..]));
        assert_eq!((j.buffers, j.block_start), (0, 0));
        assert_eq!(j.addr[2..8], [0; 6]);
    }
    assert_eq!((seen[0].param[0] as i64, seen[1].param[0] as i64), (2, -3));
    // SAFETY: the daemon is gone.
    unsafe { ring.free() };
}

/// A small job in the SQ is drained at once while large launches hold the
/// drain limit, and only then: not while small launches hold it (their
/// batching is what the limit is for), nor when the SQ holds only large
/// jobs or control descriptors. The SQ is only looked at, never taken.
#[test]
fn a_small_job_is_not_held_behind_large_launches() {
    const SQ: u32 = 8;
    let ring = HeapRing::new(SQ, SQ, 4096u64);
    let (base, total, geo) = (ring.base, ring.total, ring.geo);
    let sq_off = ring.sq_off;
    let vadd = |user_data, n: u32| Sqe {
        user_data,
        kernel: Kernel::VectorAdd.id(),
        in0_len: n,
        in1_len: n,
        out_len: n,
        ..Sqe::default()
    };
    let big = 1u32 << 22;
    let entries = [
        vadd(1, big),
        Sqe { kernel: EC_CONTROL_PUT, in0_len: 16, out_len: 16, ..Sqe::default() },
        vadd(2, big),
        vadd(3, 1000),
    ];
    let h = base.as_ptr().cast::<Header>();
    let publish = |n: u32| {
        // SAFETY: in bounds of the buffer; no references kept.
        unsafe { (*h).sq_tail.0.store(n, Ordering::Release) };
    };
    // SAFETY: as above.
    unsafe {
        for (i, s) in entries.iter().enumerate() {
            base.as_ptr().add(sq_off as usize).cast::<Sqe>().add(i).write(*s);
        }
    }
    let (mut d, _vm) = heap_daemon(base, total, geo);
    let launch = |drain, small| InFlight {
        ticket: 0,
        kernel: Some(KernelRef::Builtin(Kernel::VectorAdd)),
        small,
        jobs: Vec::new(),
        lands: None,
        drain,
        drained: Instant::now(),
        submitted: Instant::now(),
        backend: std::time::Duration::ZERO,
        enqueue: std::time::Duration::ZERO,
                    group: None,
    };
    // The limit open: nothing is held (the loop drains anyway).
    publish(4);
    assert!(!d.small_job_held());
    // Two drains of large launches in flight: the small job is held.
    d.in_flight = vec![launch(1, false), launch(1, false), launch(2, false)];
    assert!(d.small_job_held());
    // Only large jobs and a put in the SQ: nothing to drain early; the
    // small one published after them is found, the others not read again.
    publish(3);
    assert!(!d.small_job_held());
    assert!(!d.small_job_held());
    publish(4);
    assert!(d.small_job_held());
    // A user's job (its lengths in its record) may be small.
    let user = Sqe { flags: crate::layout::EC_FLAG_ARGS, kernel: 1, ..vadd(5, big) };
    assert!(crate::descriptor::may_be_small(&user));
    assert!(!crate::descriptor::may_be_small(&vadd(6, big)));
    // Drains of small launches hold the limit: the small job waits to
    // coalesce, as before.
    d.in_flight = vec![launch(1, true), launch(2, true), launch(3, false)];
    assert!(!d.small_job_held());
    // Nothing was taken from the SQ.
    // SAFETY: as above.
    assert_eq!(unsafe { (*h).sq_head.0.load(Ordering::Relaxed) }, 0);
    d.in_flight.clear();
    drop(d);
    // SAFETY: the daemon is gone.
    unsafe { ring.free() };
}
