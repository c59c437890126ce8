//! Arena segments after the first (`c_src/erlcuda_ring.h`, "Arena segments
//! (growth)"): each arrives as one `ec_segment` message with its memfd on
//! the handshake connection, before any descriptor names it.
//!
//! gpud reads pending messages without blocking whenever poll says the
//! socket is readable and whenever a descriptor names a segment it does not
//! know yet; each is validated (magic, index, not known yet, fstat size ==
//! bytes, sealed against shrinking, whole f32s), mapped, and handed to the
//! backend (the CUDA backend registers it). A bad message is logged and
//! dropped with its fds: descriptors naming that segment are then answered
//! OUT_OF_BOUNDS, which is what the VM would see from any bad address.
//!
//! Once gpud serves ([`Segments::register_off_loop`]), a new segment is
//! registered on a thread of its own ([`register`]): it is named known
//! (descriptors may name it) only once that is done, and until then the
//! daemon holds back the entries that name it, and only those.
//!
//! At gpud's start the VM sends every segment right after the hello, so they
//! are queued before the driver starts: [`Segments::map_queued`] maps them
//! then, and populates their page tables (and segment 0's) on threads of
//! their own ([`populate_in_background`]); [`Segments::register_start`]
//! registers them all once the backend is open. A restart after the arena
//! grew to 1 GiB took 76-142 ms registering when segments 1 and 2 were
//! mapped only after the driver's start (the registration faulted their
//! pages in), 48-55 ms this way (H200, 2026-12-04; `bench/EXPERIMENTS.md`,
//! "Registration of the arena and pre-fault").

use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use nix::sys::time::TimeSpec;

mod register;

use crate::arena::Arena;
use crate::backend::Backend;
use crate::descriptor::{ArgsMemory, Region, SegmentSizes};
use crate::error::{Error, Result};
use crate::handshake::{check_memfd, Mapping};
use crate::layout::{JobArgs, SegmentMsg, EC_MAX_SEGMENTS, EC_SEGMENT_MAGIC};

/// Fills in this process's page-table entries for `bytes` at `base` on a
/// thread of its own (madvise MADV_POPULATE_WRITE, Linux 5.14; READ where
/// WRITE is refused; nothing on older kernels). The VM pre-faults the arena
/// into its own page tables, not gpud's, so cuMemHostRegister in gpud
/// faulted every page of its mapping in itself: the `segments` phase took
/// 21-38 ms for 256 MiB on the H200, against 9-14 ms for a mapping already
/// populated (H200, 2026-12-03; `bench/EXPERIMENTS.md`).
/// Started before the driver's start (~200 ms), it is done by then. It
/// goes in pieces of [`POPULATE_PIECE`]: a madvise holds the process's
/// mmap lock while it runs, and anything of the start that maps memory
/// meanwhile (a new thread's stack, the driver) waits for it. One madvise
/// of a 256 MiB segment held it ~51 ms, and the CPU backend's first
/// thread waited that long (strace of gpud): the `backend` phase of a
/// restart took 52-56 ms in 20 of 42 restarts (mean 25.7 ms), against 16
/// of 42 over 5 ms with 4 MiB pieces (mean 8.1, at most 32) and 3 of 18
/// with 1 MiB pieces (mean 4.9), interleaved on the 2-core CPU machine
/// (2026-12-07; bench/EXPERIMENTS.md). On the H200, 4 MiB pieces gave
/// the same cold start as one madvise (2026-12-04). No
/// byte of the range is read or written: a range unmapped meanwhile only
/// makes madvise fail. None if no thread could be started.
fn populate_in_background(base: NonNull<u8>, bytes: u64) -> Option<std::thread::JoinHandle<()>> {
    let (addr, len) = (base.as_ptr() as usize, bytes as usize);
    std::thread::Builder::new()
        .name("populate".into())
        .spawn(move || {
            let mut at = 0;
            while at < len {
                let n = POPULATE_PIECE.min(len - at);
                let p = (addr + at) as *mut libc::c_void;
                // SAFETY: madvise touches page tables only, never the memory.
                unsafe {
                    if libc::madvise(p, n, libc::MADV_POPULATE_WRITE) != 0
                        && libc::madvise(p, n, libc::MADV_POPULATE_READ) != 0
                    {
                        return; // an older kernel, or the range is gone
                    }
                }
                at += n;
            }
        })
        .ok()
}

/// The most [`populate_in_background`] populates in one madvise (a multiple
/// of any page size): a mapping made meanwhile waits for one piece at most.
const POPULATE_PIECE: usize = 1 << 20;

/// What reading the socket found.
#[derive(Debug, PartialEq, Eq)]
pub enum SockState {
    /// Still connected; nothing more queued.
    Open,
    /// The VM hung up.
    Closed,
}

/// Every mapped segment: 0 is the arena inside the ring's mapping, the rest
/// are mappings of their own, kept until gpud exits (segments are never
/// removed while the VM lives).
pub struct Segments {
    seg0: (NonNull<u8>, u64),
    maps: Vec<Option<Mapping>>,
    sizes: SegmentSizes,
    /// Mapped by `map_queued` before the backend opened, not registered yet.
    early: Vec<(usize, Mapping)>,
    /// The threads populating page tables (`map_queued`); joined before any
    /// mapping goes (`Drop`).
    populating: Vec<std::thread::JoinHandle<()>>,
    /// The socket said EOF (or an empty message, which reads the same):
    /// nothing after it is read, whichever call saw it.
    closed: bool,
    /// Registers segments off gpud's loop, once it serves: started with
    /// the first segment that comes then (`off_loop`), so a gpud whose
    /// arena never grows holds no thread and no fd for it.
    registrar: Option<register::RegisterThread>,
    off_loop: bool,
    /// Mapped and handed to `registrar`, not registered yet.
    registering: Vec<(usize, Mapping, Instant)>,
}

impl Segments {
    /// # Safety
    /// `base..base + bytes` (segment 0, the arena in the ring's mapping) must
    /// stay mapped read-write for as long as the result lives, `base` 8-aligned.
    pub unsafe fn new(base: NonNull<u8>, bytes: u64) -> Segments {
        Segments {
            seg0: (base, bytes),
            maps: (0..EC_MAX_SEGMENTS).map(|_| None).collect(),
            sizes: SegmentSizes::single(bytes),
            early: Vec::new(),
            populating: Vec::new(),
            closed: false,
            registrar: None,
            off_loop: false,
            registering: Vec::new(),
        }
    }

    pub fn sizes(&self) -> &SegmentSizes {
        &self.sizes
    }

    /// Base and size of segment `seg`, if it is mapped.
    pub fn segment(&self, seg: usize) -> Option<(NonNull<u8>, u64)> {
        if seg == 0 {
            return Some(self.seg0);
        }
        let m = self.maps.get(seg)?.as_ref()?;
        Some((m.base(), m.len() as u64))
    }

    /// Every mapped segment as the backends see them.
    pub fn arena(&self) -> Arena<'_> {
        // SAFETY: segment 0 per `new`'s contract; the others are mappings
        // owned by self, page-aligned, alive as long as the borrow of self.
        unsafe {
            let mut a = Arena::from_raw(self.seg0.0, self.seg0.1);
            for (i, m) in self.maps.iter().enumerate() {
                if let Some(m) = m {
                    a.set_segment(i, m.base(), m.len() as u64);
                }
            }
            a
        }
    }

    /// Reads every segment message queued on `sock` (never blocks) and maps
    /// the good ones; registers them, or (once
    /// [`register_off_loop`](Segments::register_off_loop) was called) asks
    /// the registration thread to. `Err` only when the backend fails.
    pub fn receive(&mut self, sock: &OwnedFd, backend: &mut dyn Backend, device: u32) -> Result<SockState> {
        self.read_queued(sock, device, |me, seg, m| {
            if me.off_loop && me.registrar.is_none() {
                match register::RegisterThread::start(backend.registrar(), device) {
                    Ok(t) => me.registrar = Some(t),
                    Err(e) => {
                        log!(Warning, "gpud[{device}]: segments will be registered inline: {e}");
                        me.off_loop = false;
                    }
                }
            }
            match &me.registrar {
                Some(r) => {
                    r.request(seg, m.base(), m.len() as u64);
                    me.registering.push((seg, m, Instant::now()));
                    Ok(())
                }
                None => me.install(seg, m, backend, device),
            }
        })
    }

    /// From now on, segments are registered on a thread of their own (the
    /// backend's [`Registrar`](crate::backend::Registrar)), and
    /// [`adopt`](Segments::adopt) makes them known. Where no thread can be
    /// started they are registered inline, as before.
    pub fn register_off_loop(&mut self) {
        self.off_loop = true;
    }

    /// Ends the registration thread (after the registration it is doing):
    /// before the backend it registers with goes.
    pub fn stop_registering(&mut self) {
        self.registrar.take();
    }

    /// True while some segment is being registered.
    pub fn registering(&self) -> bool {
        !self.registering.is_empty()
    }

    /// True while segment `seg` is being registered.
    pub fn is_registering(&self, seg: usize) -> bool {
        self.registering.iter().any(|&(s, _, _)| s == seg)
    }

    /// True when a registration has finished and waits for
    /// [`adopt`](Segments::adopt) (one atomic load).
    pub fn has_registered(&self) -> bool {
        self.registrar.as_ref().is_some_and(|r| r.has_done())
    }

    /// Readable when a registration has finished (see [`adopt`](Segments::adopt)).
    pub fn registered_fd(&self) -> Option<BorrowedFd<'_>> {
        self.registrar.as_ref().map(|r| r.event_fd())
    }

    /// Makes the segments whose registration has finished known to the
    /// backend and to validation; with `wait`, first waits until none is
    /// being registered. Returns how many became known. `Err` when a
    /// registration failed (fatal, as inline).
    pub fn adopt(&mut self, backend: &mut dyn Backend, device: u32, wait: bool) -> Result<usize> {
        let Some(r) = &self.registrar else { return Ok(0) };
        r.clear();
        let mut done = Vec::new();
        while let Some(d) = r.try_done() {
            done.push(d);
        }
        while wait && done.len() < self.registering.len() {
            match r.wait_done() {
                Some(d) => done.push(d),
                None => return Err(Error::Device("the registration thread ended".into())),
            }
        }
        let n = done.len();
        for (seg, result) in done {
            let reg = result?;
            let i = self.registering.iter().position(|&(s, _, _)| s == seg).expect("a segment asked for");
            let (_, m, asked) = self.registering.swap_remove(i);
            backend.adopt_segment(seg, reg)?;
            let len = m.len() as u64;
            self.maps[seg] = Some(m);
            self.sizes.set(seg, len);
            log!(
                Info,
                "gpud[{device}]: arena segment {seg}: {len} bytes, registered off the loop in {:.1} ms ({:.1} ms after it came)",
                reg.took.as_secs_f64() * 1e3,
                asked.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(n)
    }

    /// At gpud's start, before the backend opens: starts populating segment
    /// 0's page tables, maps the segment messages on `sock`, waiting up to
    /// `wait` for `want` of them (the hello's count), and starts populating
    /// each one's; [`register_start`](Segments::register_start) registers
    /// them, and [`receive`](Segments::receive) reads any that come later.
    pub fn map_queued(&mut self, sock: &OwnedFd, device: u32, want: u32, wait: Duration) {
        self.populating.extend(populate_in_background(self.seg0.0, self.seg0.1));
        let deadline = Instant::now() + wait;
        loop {
            let r = self.read_queued(sock, device, |me, seg, map| {
                me.populating.extend(populate_in_background(map.base(), map.len() as u64));
                me.early.push((seg, map));
                Ok(())
            });
            let left = deadline.saturating_duration_since(Instant::now());
            if !matches!(r, Ok(SockState::Open)) || self.early.len() >= want as usize || left.is_zero() {
                return;
            }
            let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
            let _ = ppoll(&mut fds, Some(TimeSpec::from_duration(left)), None);
        }
    }

    /// Once the backend is open: registers segment 0 and those
    /// [`map_queued`](Segments::map_queued) mapped. A backend that pins them
    /// (CUDA's cuMemHostRegister) first waits for their page tables, so it
    /// pins resident pages; the cpu backend lets the threads run on.
    pub fn register_start(&mut self, backend: &mut dyn Backend, device: u32) -> Result<()> {
        if backend.kind() == "cuda" {
            for t in self.populating.drain(..) {
                let _ = t.join();
            }
        }
        backend.add_segment(0, self.seg0.0, self.seg0.1)?;
        for (seg, map) in std::mem::take(&mut self.early) {
            self.install(seg, map, backend, device)?;
        }
        Ok(())
    }

    /// Hands a mapped segment to the backend; then descriptors may name it.
    fn install(&mut self, seg: usize, m: Mapping, backend: &mut dyn Backend, device: u32) -> Result<()> {
        let (base, len) = (m.base(), m.len() as u64);
        backend.add_segment(seg, base, len)?;
        self.maps[seg] = Some(m);
        self.sizes.set(seg, len);
        log!(Info, "gpud[{device}]: arena segment {seg}: {len} bytes");
        Ok(())
    }

    /// Reads the queued messages; `take` gets each good one, mapped.
    fn read_queued(
        &mut self,
        sock: &OwnedFd,
        device: u32,
        mut take: impl FnMut(&mut Self, usize, Mapping) -> Result<()>,
    ) -> Result<SockState> {
        while !self.closed {
            let mut buf = [0u8; 64];
            let mut cmsg = nix::cmsg_space!([RawFd; 8]);
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(m) => m,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => return Ok(SockState::Open),
                Err(_) => {
                    self.closed = true;
                    break;
                }
            };
            let mut fds = Vec::new();
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(v) = c {
                        fds.extend(v);
                    }
                }
            }
            // SAFETY: SCM_RIGHTS fds were just installed in this process by
            // the kernel and belong to nobody else; owning them closes them
            // whatever happens below.
            let fds: Vec<OwnedFd> = fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect();
            let (bytes, flags) = (msg.bytes, msg.flags);
            if bytes == 0 && fds.is_empty() {
                self.closed = true;
                break;
            }
            let truncated = flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
            match self.accept(&buf[..bytes], truncated, fds) {
                Ok((seg, m)) => take(self, seg, m)?,
                Err(e) => log!(Error, "gpud[{device}]: refused a segment message: {e}"),
            }
        }
        Ok(SockState::Closed)
    }

    /// Validates one message and maps its memfd.
    fn accept(&self, bytes: &[u8], truncated: bool, fds: Vec<OwnedFd>) -> Result<(usize, Mapping)> {
        let bad = |m: String| Error::Handshake(m);
        if truncated {
            return Err(bad("segment message truncated".into()));
        }
        let msg = SegmentMsg::from_bytes(bytes).ok_or_else(|| {
            bad(format!(
                "segment message of {} bytes, want {}",
                bytes.len(),
                std::mem::size_of::<SegmentMsg>()
            ))
        })?;
        let [fd]: [OwnedFd; 1] = fds
            .try_into()
            .map_err(|v: Vec<OwnedFd>| bad(format!("segment message carried {} fds, want 1", v.len())))?;
        if msg.magic != EC_SEGMENT_MAGIC {
            return Err(bad(format!("segment magic {:#x}, want {EC_SEGMENT_MAGIC:#x}", msg.magic)));
        }
        let seg = msg.segment as usize;
        if !(1..EC_MAX_SEGMENTS as usize).contains(&seg) {
            return Err(bad(format!("segment index {seg} outside 1..{EC_MAX_SEGMENTS}")));
        }
        if self.sizes.is_known(seg) || self.early.iter().any(|&(s, _)| s == seg) || self.is_registering(seg) {
            return Err(bad(format!("segment {seg} is already mapped")));
        }
        if msg.bytes == 0 || !msg.bytes.is_multiple_of(4) {
            return Err(bad(format!("segment {seg} of {} bytes: not a positive number of f32s", msg.bytes)));
        }
        check_memfd(&fd, msg.bytes)?;
        let m = Mapping::new_plain(&fd, msg.bytes)?;
        Ok((seg, m))
    }
}

impl ArgsMemory for Segments {
    /// A user's record, straight from its segment's mapping (no [`Arena`]
    /// is built for it: validation reads one record per job).
    fn copy_args(&self, r: Region) -> JobArgs {
        let (base, bytes) = self.segment(r.segment()).expect("a validated region's segment is mapped");
        assert!(r.end() <= bytes && r.bytes() == std::mem::size_of::<JobArgs>() as u64, "record {r:?}");
        let p = base.as_ptr().wrapping_add(r.offset() as usize);
        assert_eq!(p as usize % std::mem::align_of::<JobArgs>(), 0, "record {r:?} misaligned");
        // SAFETY: in bounds and aligned (asserted; segment bases are page
        // aligned); any bytes are a JobArgs (Pod). One volatile read: the
        // copy is what gets validated and run, whatever the VM writes.
        unsafe { std::ptr::read_volatile(p.cast::<JobArgs>()) }
    }
}

impl Drop for Segments {
    /// No populate or registration thread outlives a mapping it works on
    /// (the fields drop after this).
    fn drop(&mut self) {
        // The registration thread works on mappings of ours too.
        self.registrar.take();
        for t in self.populating.drain(..) {
            let _ = t.join();
        }
    }
}
