//! Memory the GPU reads and writes: the arena's segments, registered with
//! the driver and read in place over the mapping, and the raw device
//! memory under device buffers.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::driver::DResult;
use super::handles::{Event, Stream};
use super::{ck, driver, CudaBackend};
use crate::backend::pace::Dir;
use crate::backend::{Registered, Registrar, Ticket};
use std::cell::RefCell;
use cudarc::driver::sys;
use crate::buffers::BufferMemory;
use crate::descriptor::Region;
use crate::error::{Error, Result};

/// Arena memory is registered with the driver in pieces of at most this
/// many bytes, cut on a grid of absolute addresses. cuMemHostRegister
/// holds a driver-wide lock for as long as one call takes, and the driver
/// calls of gpud's loop (launches, copies, event queries) wait on it, off
/// the loop's thread or not: in the project's probe (H200), registering
/// 512 MiB pre-faulted in one call on another thread stalled the launching
/// thread up to 29 ms, and 1.6 ms with at most 32 MiB a call; small jobs
/// beside arena growth (a 768 MiB segment) waited up to 47 ms on an H100.
/// With 32 MiB pieces, small jobs beside arena growth still waited up to
/// 5.5 ms (H100, `ERLCUDA_BENCH_MIXED_SCALE=4`, bench/EXPERIMENTS.md):
/// 16 MiB, by the figure above about 0.8 ms a call, is meant to keep one
/// piece under the 2 ms a small job may wait at most. Making the
/// registration thread wait while the loop was in the driver (a flag the
/// loop raised around its launches and copies) made it worse on an H100:
/// 49-50 submit stalls of 1.8 ms in that row against 16, as a piece then
/// started right when the loop left the driver, just before its next call.
/// A copy across two registrations fails, so every copy between the arena
/// and the device is cut on the same grid ([`grid_pieces`]); a kernel
/// reads across them as one range (the device address of registered
/// memory is its host address, checked at registration).
pub const REGISTER_PIECE: usize = 16 << 20;

/// The registration thread's pause between two pieces of one segment.
/// The driver's lock is not fair: a thread that lets it go and takes it
/// again at once wins over one that waits, so back-to-back pieces kept
/// gpud's loop waiting across several: beside arena growth on an H100,
/// 114 submits stalled 1.5 ms on average behind registrations whose pieces
/// took 0.6-0.9 ms each (small-job max 7.8 ms; bench/EXPERIMENTS.md, the
/// small jobs' stall split). The pause lets a waiting launch, copy or
/// event query in between pieces; it makes a 512 MiB segment (32 pieces)
/// about 6 ms slower to register, off the loop. Measured against none,
/// interleaved on an H100: slow small jobs 73 and 87 against 151 and 144,
/// stalled submits 174-187 ms against 268-269, p99 and max unchanged
/// (single pieces of 3-9 ms remain). The environment variable
/// ERLCUDA_GPUD_REGISTER_GAP_US sets another (0: none), for measuring.
const REGISTER_GAP: Duration = Duration::from_micros(200);

/// [`REGISTER_GAP`], or the environment's.
pub(super) fn register_gap() -> Duration {
    std::env::var("ERLCUDA_GPUD_REGISTER_GAP_US")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map_or(REGISTER_GAP, Duration::from_micros)
}

/// `[at, at + bytes)` cut where it crosses a multiple of `piece` (absolute
/// addresses): each piece's offset from `at` and length, in order; one
/// piece where `piece` is 0, none where `bytes` is 0.
pub(super) fn grid_pieces(at: usize, bytes: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut off = 0;
    std::iter::from_fn(move || {
        if off >= bytes {
            return None;
        }
        let here = at + off;
        let n = if piece == 0 { bytes - off } else { (piece - here % piece).min(bytes - off) };
        let r = (off, n);
        off += n;
        Some(r)
    })
}

/// Issues `copy(dev, host, n)` for each piece of `[host, host + bytes)` on
/// the registration grid, the device side moved along with it: a copy
/// between the arena and the device never spans two registrations.
pub(super) fn copy_on_grid(
    dev: u64,
    host: usize,
    bytes: usize,
    mut copy: impl FnMut(u64, usize, usize) -> Result<()>,
) -> Result<()> {
    for (off, n) in grid_pieces(host, bytes, REGISTER_PIECE) {
        copy(dev + off as u64, host + off, n)?;
    }
    Ok(())
}

/// An arena segment as the device sees it.
pub(super) struct Segment {
    /// Registered range (page-aligned around the segment), and the grid of
    /// its registrations (0: one registration).
    pub(super) reg_base: *mut c_void,
    pub(super) reg_bytes: usize,
    pub(super) piece: usize,
    /// Device address of the segment's first byte.
    pub(super) dev: u64,
    pub(super) bytes: u64,
}

impl Segment {
    /// Gives the segment's registrations back to the driver (the backend's
    /// Drop; errors after a fault are ignored).
    pub(super) fn unregister(&self) {
        if !self.reg_base.is_null() {
            unregister_pieces(self.reg_base as usize, self.reg_bytes, self.piece);
        }
    }
}

/// Raw device memory for buffers (the cache over it is buffers.rs's), in
/// the backend's context (current on gpud's one thread since `open`).
///
/// Where the device has memory pools, blocks come from the default pool
/// and go back to it in stream order on a stream of their own, which
/// holds nothing else: cuMemFree synchronizes the whole device, so every
/// eviction under memory pressure stalled every job in flight. A block is
/// freed only once no launch or copy uses it (buffers.rs defers frees), so
/// the free needs no ordering against other streams; and as the pool's
/// stream carries only allocations and frees, a block allocated on it is
/// ready at once for any stream (the stream is waited for after each
/// allocation all the same, which costs nothing when it is idle). Without
/// pools, cuMemAlloc / cuMemFree.
pub(super) struct CudaMemory {
    pub(super) capacity: u64,
    pub(super) pool: Option<(sys::CUmemoryPool, Stream)>,
}

impl CudaMemory {
    /// `bytes` of device memory, ready for any stream: for buffers, and for
    /// launches' own tables and scratch (which grow, rarely, while gpud
    /// serves: cuMemFree there stalled every job in flight too).
    pub(super) fn dev_alloc(&mut self, bytes: usize) -> DResult<u64> {
        let Some((pool, stream)) = self.pool.as_ref().map(|(p, s)| (*p, s.raw())) else {
            return driver::mem_alloc(bytes);
        };
        // SAFETY: the pool and its stream live as long as the backend.
        let p = match unsafe { driver::mem_alloc_from_pool_async(bytes, pool, stream) } {
            Ok(p) => p,
            Err(_) => {
                // The pool's unused memory, kept for reuse in other sizes,
                // may be what the device lacks: give it back, try again.
                // SAFETY: as above.
                unsafe { driver::mem_pool_trim(pool, 0) }?;
                unsafe { driver::mem_alloc_from_pool_async(bytes, pool, stream) }?
            }
        };
        // SAFETY: the backend's stream.
        if let Err(e) = unsafe { driver::stream_synchronize(stream) } {
            // SAFETY: just allocated, used by nothing.
            let _ = unsafe { driver::mem_free_async(p, stream) };
            return Err(e);
        }
        Ok(p)
    }

    /// Gives back a block of [`CudaMemory::dev_alloc`].
    ///
    /// # Safety
    /// `p` came from `dev_alloc`, is freed once, and nothing in flight or
    /// later uses it.
    pub(super) unsafe fn dev_free(&mut self, p: u64) {
        let _ = match &self.pool {
            Some((_, stream)) => unsafe { driver::mem_free_async(p, stream.raw()) },
            None => unsafe { driver::mem_free(p) },
        };
    }
}

impl BufferMemory for CudaMemory {
    fn buf_alloc(&mut self, bytes: u64) -> Option<u64> {
        // Out of memory (or anything else): no block; the allocator gives
        // cached blocks back and tries again, or answers OOM. A context
        // that is truly broken fails the next launch and gpud exits.
        self.dev_alloc(usize::try_from(bytes).ok()?).ok()
    }

    fn buf_free(&mut self, addr: u64, _bytes: u64) {
        // SAFETY: a block of buf_alloc, given back once (buffers.rs), and
        // no launch in flight uses it (frees are deferred until then).
        unsafe { self.dev_free(addr) }
    }

    fn buf_capacity(&self) -> u64 {
        self.capacity
    }
}

impl CudaBackend {
    /// Registers arena segment `seg` (`Backend::add_segment`).
    pub(super) fn register_segment(&mut self, seg: usize, base: NonNull<u8>, bytes: u64) -> Result<()> {
        // gpud's own thread: nothing of the loop's runs meanwhile.
        let reg = register_range(base, bytes, Duration::ZERO)?;
        self.adopt_registered(seg, reg)
    }

    /// Installs a registration of segment `seg` (made here or by the
    /// registrar's thread).
    pub(super) fn adopt_registered(&mut self, seg: usize, reg: Registered) -> Result<()> {
        if seg >= self.segs.len() || self.segs[seg].is_some() {
            return Err(Error::Device(format!("segment {seg} registered twice")));
        }
        self.segs[seg] = Some(Segment {
            reg_base: reg.reg_base as *mut c_void,
            reg_bytes: reg.reg_bytes,
            piece: reg.piece,
            dev: reg.dev,
            bytes: reg.bytes,
        });
        log!(
            Info,
            "gpud[{}]: cuda: registered segment {seg} ({} bytes) in {:.1} ms, {:.1} ms after gpud started",
            self.device,
            reg.bytes,
            reg.took.as_secs_f64() * 1e3,
            crate::startup::since_start().as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// A new ticket, for a launch or a copy.
    pub(super) fn take_ticket(&mut self) -> Ticket {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    /// Reports finished puts' and gets' copies and issues their next
    /// pieces (`pace`): each piece an async copy on its direction's stream
    /// and an event behind it.
    pub(super) fn poll_copies(&mut self, done: &mut Vec<Ticket>) -> Result<()> {
        if self.paced.open() == 0 {
            return Ok(());
        }
        let streams = [self.copy_streams[0].raw(), self.copy_streams[1].raw()];
        let spare = RefCell::new(std::mem::take(&mut self.spare_events));
        let r = self.paced.advance(
            done,
            |dir, dev, host, n| {
                let e = match spare.borrow_mut().pop() {
                    Some(e) => e,
                    None => ck(Event::new(), "cuEventCreate")?,
                };
                let s = streams[dir as usize];
                // SAFETY: `dev..+n` lies in a live buffer block and
                // `host..+n` in the copy's own region of registered arena
                // memory, untouched until its job is answered (copy_in,
                // copy_out); both streams are this backend's.
                copy_on_grid(dev, host, n, |dev, host, n| match dir {
                    Dir::ToDevice => {
                        ck(unsafe { driver::memcpy_htod_async(dev, host as *const u8, n, s) }, "cuMemcpyHtoDAsync (put)")
                    }
                    Dir::ToHost => {
                        ck(unsafe { driver::memcpy_dtoh_async(host as *mut u8, dev, n, s) }, "cuMemcpyDtoHAsync (get)")
                    }
                })?;
                // SAFETY: an event of this backend's, on its stream.
                ck(unsafe { driver::event_record(e.raw(), s) }, "cuEventRecord (copy)")?;
                Ok(e)
            },
            // SAFETY: events created by this backend and recorded.
            |e| ck(unsafe { driver::event_query(e.raw()) }, "a copy on the GPU (cuEventQuery)"),
            |e| spare.borrow_mut().push(e),
        );
        self.spare_events = spare.into_inner();
        r
    }

    /// The device address of `r`: a buffer's own, or its segment's mapping.
    pub(super) fn dev_ptr(&self, r: Region) -> Result<u64> {
        if r.is_buffer() {
            // A live device buffer: its block's device address.
            return Ok(r.offset());
        }
        if r.is_empty() {
            // Never dereferenced; any valid-looking address will do.
            return Ok(self.segs[r.segment()].as_ref().map_or(0, |s| s.dev));
        }
        let s = self.segs[r.segment()]
            .as_ref()
            .ok_or_else(|| Error::Device(format!("segment {} is not registered", r.segment())))?;
        if r.end() > s.bytes {
            return Err(Error::Device(format!("region {r:?} beyond segment of {} bytes", s.bytes)));
        }
        Ok(s.dev + r.offset())
    }
}

/// Registers `bytes` at `base` with the driver (cuMemHostRegister of the
/// whole pages around it, a call per piece of REGISTER_PIECE's grid) in
/// the context current on this thread. Where the pieces' device addresses
/// do not line up as one range (a driver without host-pointer identity
/// for registered memory), the range is registered again in one call.
fn register_range(base: NonNull<u8>, bytes: u64, gap: Duration) -> Result<Registered> {
    let t = Instant::now();
    if bytes == 0 {
        return Ok(Registered { base, bytes, dev: 0, reg_base: 0, reg_bytes: 0, piece: 0, took: t.elapsed() });
    }
    // Register whole pages: the mapping covers them (mmap maps whole
    // pages; segment 0 sits inside the ring's mapping).
    let page = 4096usize;
    let start = base.as_ptr() as usize;
    let reg_start = start & !(page - 1);
    let reg_end = (start + bytes as usize).next_multiple_of(page);
    let reg_bytes = reg_end - reg_start;
    let mut piece = REGISTER_PIECE;
    register_pieces(reg_start, reg_bytes, piece, gap)?;
    // SAFETY: `base` lies in the range just registered.
    let mut dev = ck(unsafe { driver::mem_host_device_pointer(base.as_ptr().cast()) }, "cuMemHostGetDevicePointer")?;
    let mut one_range = true;
    for (off, _) in grid_pieces(reg_start, reg_bytes, piece).skip(1) {
        let at = reg_start + off;
        // SAFETY: `at` starts a piece registered above.
        let d = ck(unsafe { driver::mem_host_device_pointer(at as *mut c_void) }, "cuMemHostGetDevicePointer")?;
        one_range &= d == dev.wrapping_add((at - start) as u64);
    }
    if !one_range {
        unregister_pieces(reg_start, reg_bytes, piece);
        piece = 0;
        register_pieces(reg_start, reg_bytes, piece, Duration::ZERO)?;
        // SAFETY: as above.
        dev = ck(unsafe { driver::mem_host_device_pointer(base.as_ptr().cast()) }, "cuMemHostGetDevicePointer")?;
        log!(Info, "cuda: registered pieces map apart on the device: a segment is registered whole");
    }
    Ok(Registered { base, bytes, dev, reg_base: reg_start, reg_bytes, piece, took: t.elapsed() })
}

/// cuMemHostRegister of each piece of `[start, start + bytes)` on the grid
/// of `piece` (0: the whole range at once); on a failure, the pieces
/// registered so far are given back.
fn register_pieces(start: usize, bytes: usize, piece: usize, gap: Duration) -> Result<()> {
    let mut done = 0;
    for (off, n) in grid_pieces(start, bytes, piece) {
        if off > 0 && !gap.is_zero() {
            std::thread::sleep(gap);
        }
        // SAFETY: the range is mapped read-write for as long as the
        // backend lives (the daemon drops the backend before the
        // mappings), and is unregistered in the backend's Drop once
        // adopted.
        let r = ck(unsafe { driver::mem_host_register((start + off) as *mut c_void, n) }, "cuMemHostRegister");
        if let Err(e) = r {
            unregister_pieces(start, done, piece);
            return Err(e);
        }
        done = off + n;
    }
    Ok(())
}

/// Gives back the registrations of [`register_pieces`] over `bytes` (a
/// failed registration's, or a segment's once every stream is synchronized).
fn unregister_pieces(start: usize, bytes: usize, piece: usize) {
    for (off, _) in grid_pieces(start, bytes, piece) {
        // SAFETY: the start of a registration made by register_pieces.
        let _ = unsafe { driver::mem_host_unregister((start + off) as *mut c_void) };
    }
}

/// Registers segments on the daemon's registration thread, in the
/// backend's context (made current there on first use).
pub(super) struct CudaRegistrar {
    pub(super) ctx: sys::CUcontext,
    pub(super) current: bool,
    /// Between pieces ([`REGISTER_GAP`]).
    pub(super) gap: Duration,
}

// SAFETY: a context handle may be made current on any thread; the daemon
// ends the registrar's thread before the backend releases the context
// (`Backend::registrar`).
unsafe impl Send for CudaRegistrar {}

impl Registrar for CudaRegistrar {
    fn register(&mut self, base: NonNull<u8>, bytes: u64) -> Result<Registered> {
        if !self.current {
            // SAFETY: retained by the backend until after this thread ends.
            ck(unsafe { driver::ctx_set_current(self.ctx) }, "cuCtxSetCurrent (registrar)")?;
            self.current = true;
        }
        register_range(base, bytes, self.gap)
    }
}

#[cfg(test)]
mod tests {
    use super::grid_pieces;

    fn pieces(at: usize, bytes: usize, piece: usize) -> Vec<(usize, usize)> {
        grid_pieces(at, bytes, piece).collect()
    }

    /// Cut only where the range crosses the grid; contiguous, covering.
    #[test]
    fn copies_and_registrations_are_cut_on_the_grid() {
        assert_eq!(pieces(0, 0, 32), vec![]);
        assert_eq!(pieces(5, 10, 32), vec![(0, 10)]);
        assert_eq!(pieces(30, 10, 32), vec![(0, 2), (2, 8)]);
        assert_eq!(pieces(32, 64, 32), vec![(0, 32), (32, 32)]);
        assert_eq!(pieces(31, 66, 32), vec![(0, 1), (1, 32), (33, 32), (65, 1)]);
        assert_eq!(pieces(30, 10, 0), vec![(0, 10)]);
        for (at, bytes) in [(4096, 100 << 20), (12345, (64 << 20) + 7), ((32 << 20) - 1, 2)] {
            let p = pieces(at, bytes, 32 << 20);
            assert_eq!(p.iter().map(|x| x.1).sum::<usize>(), bytes);
            for w in p.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0);
                assert_eq!((at + w[1].0) % (32 << 20), 0);
            }
        }
    }
}
