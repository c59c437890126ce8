//! Memory the GPU reads and writes: the arena's segments, registered with
//! the driver and read in place over the mapping, and the raw device
//! memory under device buffers.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::time::Instant;

use super::driver::DResult;
use super::{ck, driver, CudaBackend};
use crate::backend::pace::Dir;
use crate::backend::{Registered, Registrar, Ticket};
use std::cell::RefCell;
use cudarc::driver::sys;
use crate::buffers::BufferMemory;
use crate::descriptor::Region;
use crate::error::{Error, Result};

/// An arena segment as the device sees it.
pub(super) struct Segment {
    /// Registered range (page-aligned around the segment).
    pub(super) reg_base: *mut c_void,
    /// Device address of the segment's first byte.
    pub(super) dev: u64,
    pub(super) bytes: u64,
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
    pub(super) pool: Option<(sys::CUmemoryPool, sys::CUstream)>,
}

impl CudaMemory {
    /// `bytes` of device memory, ready for any stream: for buffers, and for
    /// launches' own tables and scratch (which grow, rarely, while gpud
    /// serves: cuMemFree there stalled every job in flight too).
    pub(super) fn dev_alloc(&mut self, bytes: usize) -> DResult<u64> {
        let Some((pool, stream)) = self.pool else { return driver::mem_alloc(bytes) };
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
        let _ = match self.pool {
            Some((_, stream)) => unsafe { driver::mem_free_async(p, stream) },
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
        let reg = register_range(base, bytes)?;
        self.adopt_registered(seg, reg)
    }

    /// Installs a registration of segment `seg` (made here or by the
    /// registrar's thread).
    pub(super) fn adopt_registered(&mut self, seg: usize, reg: Registered) -> Result<()> {
        if seg >= self.segs.len() || self.segs[seg].is_some() {
            return Err(Error::Device(format!("segment {seg} registered twice")));
        }
        self.segs[seg] = Some(Segment { reg_base: reg.reg_base as *mut c_void, dev: reg.dev, bytes: reg.bytes });
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
        let streams = self.copy_streams;
        let spare = RefCell::new(std::mem::take(&mut self.spare_events));
        let r = self.paced.advance(
            done,
            |dir, dev, host, n| {
                let e = match spare.borrow_mut().pop() {
                    Some(e) => e,
                    None => ck(driver::event_create(), "cuEventCreate")?,
                };
                let s = streams[dir as usize];
                if n > 0 {
                    // SAFETY: `dev..+n` lies in a live buffer block and
                    // `host..+n` in the copy's own region of registered
                    // arena memory, untouched until its job is answered
                    // (copy_in, copy_out); both streams are this backend's.
                    match dir {
                        Dir::ToDevice => {
                            ck(unsafe { driver::memcpy_htod_async(dev, host as *const u8, n, s) }, "cuMemcpyHtoDAsync (put)")?
                        }
                        Dir::ToHost => {
                            ck(unsafe { driver::memcpy_dtoh_async(host as *mut u8, dev, n, s) }, "cuMemcpyDtoHAsync (get)")?
                        }
                    }
                }
                // SAFETY: an event of this backend's, on its stream.
                ck(unsafe { driver::event_record(e, s) }, "cuEventRecord (copy)")?;
                Ok(e)
            },
            // SAFETY: events created by this backend and recorded.
            |e| ck(unsafe { driver::event_query(*e) }, "a copy on the GPU (cuEventQuery)"),
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
/// whole pages around it) in the context current on this thread.
fn register_range(base: NonNull<u8>, bytes: u64) -> Result<Registered> {
    let t = Instant::now();
    if bytes == 0 {
        return Ok(Registered { base, bytes, dev: 0, reg_base: 0, took: t.elapsed() });
    }
    // Register whole pages: the mapping covers them (mmap maps whole
    // pages; segment 0 sits inside the ring's mapping).
    let page = 4096usize;
    let start = base.as_ptr() as usize;
    let reg_start = start & !(page - 1);
    let reg_end = (start + bytes as usize).next_multiple_of(page);
    // SAFETY: the range is mapped read-write for as long as the backend
    // lives (the daemon drops the backend before the mappings), and is
    // unregistered in the backend's Drop once adopted.
    ck(unsafe { driver::mem_host_register(reg_start as *mut c_void, reg_end - reg_start) }, "cuMemHostRegister")?;
    // SAFETY: `base` lies in the range just registered.
    let dev = ck(unsafe { driver::mem_host_device_pointer(base.as_ptr().cast()) }, "cuMemHostGetDevicePointer")?;
    Ok(Registered { base, bytes, dev, reg_base: reg_start, took: t.elapsed() })
}

/// Registers segments on the daemon's registration thread, in the
/// backend's context (made current there on first use).
pub(super) struct CudaRegistrar {
    pub(super) ctx: sys::CUcontext,
    pub(super) current: bool,
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
        register_range(base, bytes)
    }
}
