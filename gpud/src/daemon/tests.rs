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
    let (sq_off, cq_off) = (4096u64, 4096 + 64 * SQ as u64);
    let arena_off = cq_off + 16 * CQ as u64;
    let arena_bytes = 4096u64;
    let total = (arena_off + arena_bytes) as usize;
    let layout = Layout::from_size_align(total, 4096).unwrap();
    // SAFETY: non-zero size.
    let base = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
    let fields = HeaderFields::for_geometry(SQ, CQ, sq_off, cq_off, arena_off, arena_bytes);
    let geo = validate_header(&fields, total as u64).unwrap();
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
    while d.launches_in_flight() > 0 {
        assert!(d.reap().unwrap());
    }
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
    // SAFETY: allocated above with this layout; the daemon is gone.
    unsafe { dealloc(base.as_ptr(), layout) };
}

/// A pipelined put through the daemon over a heap ring (cpu backend):
/// slices published out of order make one buffer that a get reads back
/// whole; a put that does not fit answers OOM for each of its slices
/// and leaves nothing behind, and its free is harmless.
#[test]
fn put_slices_out_of_order_then_get_and_a_failing_put() {
    const SQ: u32 = 16;
    let (sq_off, cq_off) = (4096u64, 4096 + 64 * SQ as u64);
    let arena_off = cq_off + 16 * SQ as u64;
    let arena_bytes = 64u64 << 10;
    let total = (arena_off + arena_bytes) as usize;
    let layout = Layout::from_size_align(total, 4096).unwrap();
    // SAFETY: non-zero size.
    let base = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
    let fields = HeaderFields::for_geometry(SQ, SQ, sq_off, cq_off, arena_off, arena_bytes);
    let geo = validate_header(&fields, total as u64).unwrap();
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
            (0..entries.len()).map(|i| b.add(cq_off as usize).cast::<Cqe>().add(i).read()).map(|c| (c.user_data, c.status)).collect(),
            (0..n as usize).map(|i| b.add(arena(16384)).cast::<f32>().add(i).read()).collect(),
        )
    };
    let (ok, oom, bad) = (Status::Ok.code(), Status::Oom.code(), Status::BadBuffer.code());
    assert_eq!(
        cqes,
        vec![(1, ok), (2, ok), (3, bad), (4, ok), (5, ok), (6, oom), (7, oom), (8, oom), (9, ok), (10, ok)]
    );
    assert_eq!(got, want, "the get reads back every slice in its place");
    // SAFETY: allocated above with this layout; the daemon is gone.
    unsafe { dealloc(base.as_ptr(), layout) };
}
