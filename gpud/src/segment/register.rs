//! The registration thread: segments the arena grows by while gpud serves
//! are populated and registered here, so that gpud's loop (every job in a
//! segment it has already) never waits for them. Registered inline, a new
//! segment held every other job for as long as cuMemHostRegister took:
//! small jobs' maxima of 123-176 ms beside large ones matched registrations
//! of 84-178 ms (H200; `bench/EXPERIMENTS.md`, "Registration of segments
//! the arena grows by while jobs run").
//!
//! One request per segment, done in the order asked; each result comes
//! back on a channel, and an eventfd (in gpud's poll set) says one is
//! there.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::backend::{Registered, Registrar};
use crate::error::{Error, Result};

/// Threads that populate one segment's page tables together, at most.
const POPULATE_THREADS: usize = 8;

/// Pieces of at least this many bytes per populating thread.
const POPULATE_PIECE: usize = 32 << 20;

struct Request {
    seg: usize,
    base: NonNull<u8>,
    bytes: u64,
}

// SAFETY: an address and a length; the segment's mapping outlives the
// thread (`RegisterThread`'s owner joins it before unmapping).
unsafe impl Send for Request {}

/// A finished registration of segment `seg`, or why it failed.
pub type Done = (usize, Result<Registered>);

pub struct RegisterThread {
    requests: Option<Sender<Request>>,
    done: Receiver<Done>,
    /// Results sent and not taken yet: a load, where gpud's loop looks
    /// every turn.
    unread: Arc<AtomicUsize>,
    efd: Arc<OwnedFd>,
    handle: Option<JoinHandle<()>>,
}

impl RegisterThread {
    /// Starts the thread with the backend's registrar.
    pub fn start(mut registrar: Box<dyn Registrar>, device: u32) -> Result<RegisterThread> {
        // SAFETY: eventfd returns a new fd or -1, checked below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(Error::Sys { what: "eventfd (registration)", errno: nix::errno::Errno::last() });
        }
        // SAFETY: just created, owned by nobody else. One fd for both
        // ends (gpud holds no more fds than it needs).
        let efd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let wake = Arc::clone(&efd);
        let (req_tx, req_rx) = mpsc::channel::<Request>();
        let (done_tx, done_rx) = mpsc::channel::<Done>();
        let unread = Arc::new(AtomicUsize::new(0));
        let sent = Arc::clone(&unread);
        let handle = std::thread::Builder::new()
            .name(format!("register-{device}"))
            .spawn(move || {
                for r in req_rx {
                    populate(r.base, r.bytes);
                    let result = registrar.register(r.base, r.bytes);
                    // Counted before it is sent, so the count never
                    // falls below what the channel holds.
                    sent.fetch_add(1, Ordering::Release);
                    if done_tx.send((r.seg, result)).is_err() {
                        return;
                    }
                    // SAFETY: 8 bytes from a live u64 into our own eventfd.
                    let one = 1u64;
                    unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(&*wake), (&one as *const u64).cast(), 8) };
                }
            })
            .map_err(|e| Error::Sys {
                what: "spawn the registration thread",
                errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EAGAIN)),
            })?;
        Ok(RegisterThread { requests: Some(req_tx), done: done_rx, unread, efd, handle: Some(handle) })
    }

    /// Asks for segment `seg` (`bytes` at `base`, mapped until this thread
    /// is joined) to be populated and registered.
    pub fn request(&self, seg: usize, base: NonNull<u8>, bytes: u64) {
        if let Some(tx) = &self.requests {
            // The thread only ends when `requests` is dropped.
            let _ = tx.send(Request { seg, base, bytes });
        }
    }

    /// True when a finished registration is there to take.
    pub fn has_done(&self) -> bool {
        self.unread.load(Ordering::Acquire) > 0
    }

    /// A finished registration, if there is one.
    pub fn try_done(&self) -> Option<Done> {
        let d = self.done.try_recv().ok()?;
        self.unread.fetch_sub(1, Ordering::AcqRel);
        Some(d)
    }

    /// Waits for the next finished registration (None: the thread is gone).
    pub fn wait_done(&self) -> Option<Done> {
        let d = self.done.recv().ok()?;
        self.unread.fetch_sub(1, Ordering::AcqRel);
        Some(d)
    }

    /// Readable once a registration has finished; [`clear`](Self::clear) it
    /// before taking the results.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }

    pub fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&*self.efd), (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for RegisterThread {
    /// Ends the thread after the registration it is doing, if any.
    fn drop(&mut self) {
        self.requests.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Fills in this process's page tables for the segment before it is
/// registered, in pieces on several threads: cuMemHostRegister faults in
/// every page itself otherwise, under a driver-wide lock (a 256 MiB segment
/// registered in 9-14 ms populated against 21-38 ms not: H200,
/// `bench/EXPERIMENTS.md`). Asks for transparent huge pages first, which
/// shortens both where the machine allows them for shared memory (and is
/// refused harmlessly where not). No byte is read or written.
fn populate(base: NonNull<u8>, bytes: u64) {
    let (addr, len) = (base.as_ptr() as usize, bytes as usize);
    // SAFETY (both madvise calls): page tables and advice only, never the memory.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    let threads = len.div_ceil(POPULATE_PIECE).clamp(1, POPULATE_THREADS);
    let piece = len.div_ceil(threads).next_multiple_of(4096);
    std::thread::scope(|s| {
        for i in 0..threads {
            let (from, to) = (i * piece, ((i + 1) * piece).min(len));
            if from >= to {
                continue;
            }
            let work = move || {
                let p = (addr + from) as *mut libc::c_void;
                // SAFETY: as above.
                unsafe {
                    if libc::madvise(p, to - from, libc::MADV_POPULATE_WRITE) != 0 {
                        libc::madvise(p, to - from, libc::MADV_POPULATE_READ);
                    }
                }
            };
            // No thread to be had: this piece on this one.
            if std::thread::Builder::new().spawn_scoped(s, work).is_err() {
                work();
            }
        }
    });
}
