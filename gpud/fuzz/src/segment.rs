//! Target `segment`: up to four messages on the handshake socket, each
//! with arbitrary bytes (or a nearly right `ec_segment`) and 0..2 fds of
//! several kinds (sealed memfd, unsealed memfd, pipe), optionally followed
//! by the VM hanging up; then `Segments::receive`, or (as at gpud's start)
//! `Segments::map_queued` and `register_start` first and `receive` after
//! them.
//!
//! Checks: it returns (never blocks, never errors on the CPU backend); it
//! maps exactly the segments a model of the contract accepts, with their
//! sizes; every byte of every mapped segment is really there (written and
//! read back); `Closed` only when the VM hung up or sent an empty message.

use std::os::fd::OwnedFd;

use gpud::backend::cpu::CpuBackend;
use gpud::layout::{SegmentMsg, EC_MAX_SEGMENTS, EC_SEGMENT_MAGIC};
use gpud::segment::{Segments, SockState};

use crate::{fds, Cursor};

pub fn run(data: &[u8]) {
    let mut c = Cursor::new(data);
    let (sock, vm) = fds::seqpacket_pair();
    let nmsgs = c.u8() % 4 + 1;
    // Model: which segment indices end up mapped, and how big.
    let mut want: Vec<Option<u64>> = vec![None; EC_MAX_SEGMENTS as usize];
    let mut want_closed = false;
    let mut keep: Vec<OwnedFd> = Vec::new();
    for _ in 0..nmsgs {
        let kind = c.u8();
        let (payload, msg): (Vec<u8>, Option<SegmentMsg>) = if kind & 1 != 0 {
            let m = SegmentMsg {
                magic: if kind & 2 != 0 { c.u64() } else { EC_SEGMENT_MAGIC },
                segment: match c.u8() {
                    0xff => c.u32(),
                    b => u32::from(b % 70),
                },
                reserved: if kind & 4 != 0 { c.u32() } else { 0 },
                bytes: match c.u8() % 4 {
                    0 => c.u64(),
                    1 => u64::from(c.u16()),
                    _ => u64::from(c.u16()) & !3,
                },
            };
            (m.to_bytes().to_vec(), Some(m))
        } else {
            let n = usize::from(c.u8() % 80);
            let b: Vec<u8> = (0..n).map(|_| c.u8()).collect();
            let m = SegmentMsg::from_bytes(&b);
            (b, m)
        };
        // The fds: none, one or two, each a memfd (sealed or not, of the
        // message's size or another) or a pipe.
        let nfds = [0, 1, 1, 2][usize::from(kind >> 3) % 4];
        let mut sent: Vec<OwnedFd> = Vec::new();
        let mut good_fd = true;
        for _ in 0..nfds {
            let f = c.u8();
            let claimed = msg.map_or(0, |m| m.bytes);
            let size = if f & 1 == 0 && claimed <= 1 << 16 { claimed } else { u64::from(c.u16()) };
            let fd = match f % 6 {
                5 => {
                    good_fd = false;
                    fds::pipe_end()
                }
                4 => {
                    good_fd = false;
                    fds::memfd(size, false)
                }
                _ => {
                    good_fd &= size == claimed;
                    fds::memfd(size, true)
                }
            };
            sent.push(fd);
        }
        let refs: Vec<&OwnedFd> = sent.iter().collect();
        if !fds::send(&vm, &payload, &refs) {
            continue;
        }
        keep.extend(sent);
        if want_closed {
            continue;
        }
        if payload.is_empty() && nfds == 0 {
            // Indistinguishable from EOF: gpud stops reading there.
            want_closed = true;
            continue;
        }
        let Some(m) = msg else { continue };
        let seg = m.segment as usize;
        let ok = payload.len() == 24
            && nfds == 1
            && good_fd
            && m.magic == EC_SEGMENT_MAGIC
            && (1..EC_MAX_SEGMENTS as usize).contains(&seg)
            && want[seg].is_none()
            && m.bytes > 0
            && m.bytes % 4 == 0;
        if ok {
            want[seg] = Some(m.bytes);
        }
    }
    let mode = c.u8();
    let early = mode & 2 != 0;
    if mode & 1 != 0 {
        drop(vm);
        want_closed = true;
    } else {
        keep.push(vm);
    }

    let mut seg0 = vec![0u32; 64];
    let bytes0 = (seg0.len() * 4) as u64;
    let base0 = std::ptr::NonNull::new(seg0.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: seg0 outlives `segs` (dropped at the end of this function,
    // after it) and is not touched meanwhile.
    let mut segs = unsafe { Segments::new(base0, bytes0) };
    let mut backend = CpuBackend::new(0);
    if early {
        // No wait: the messages are all queued already.
        segs.map_queued(&sock, 0, u32::from(nmsgs), std::time::Duration::ZERO);
        segs.register_start(&mut backend, 0).expect("register_start failed on the CPU backend");
    }
    let state = segs.receive(&sock, &mut backend, 0).expect("receive failed on the CPU backend");
    assert_eq!(state == SockState::Closed, want_closed, "socket state");
    // A second look finds nothing new (and must not block).
    if state == SockState::Open {
        assert_eq!(segs.receive(&sock, &mut backend, 0).unwrap(), SockState::Open);
    }

    assert_eq!(segs.sizes().get(0), Some(bytes0));
    for (i, w) in want.iter().enumerate().skip(1) {
        assert_eq!(segs.sizes().get(i), *w, "segment {i}");
        assert_eq!(segs.segment(i).map(|(_, b)| b), *w, "segment {i} mapping");
    }
    let arena = segs.arena();
    for (i, w) in want.iter().enumerate().skip(1) {
        if let (Some(bytes), Some((base, len))) = (w, arena.segment(i)) {
            assert_eq!(*bytes, len);
            // SAFETY: the mapping is `len` bytes, read-write, owned by segs.
            let s = unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), len as usize) };
            s.fill(i as u8);
            assert!(s.iter().all(|&b| b == i as u8));
        }
    }
    drop(segs);
    drop(seg0);
}
