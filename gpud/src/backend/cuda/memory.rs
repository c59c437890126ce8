//! Memory the GPU reads and writes: the arena's segments, registered with
//! the driver and read in place over the mapping, and the raw device
//! memory under device buffers.

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::time::Instant;

use super::{ck, driver, CudaBackend};
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

/// cuMemAlloc / cuMemFree for device buffers, in the backend's context
/// (current on gpud's one thread since `open`).
pub(super) struct CudaMemory {
    pub(super) capacity: u64,
}

impl BufferMemory for CudaMemory {
    fn buf_alloc(&mut self, bytes: u64) -> Option<u64> {
        // Out of memory (or anything else): no block; the allocator gives
        // cached blocks back and tries again, or answers OOM. A context
        // that is truly broken fails the next launch and gpud exits.
        driver::mem_alloc(usize::try_from(bytes).ok()?).ok()
    }

    fn buf_free(&mut self, addr: u64, _bytes: u64) {
        // SAFETY: a block of buf_alloc, given back once (buffers.rs), and
        // no launch in flight uses it (frees are deferred until then).
        let _ = unsafe { driver::mem_free(addr) };
    }

    fn buf_capacity(&self) -> u64 {
        self.capacity
    }
}

impl CudaBackend {
    /// Registers arena segment `seg` (`Backend::add_segment`).
    pub(super) fn register_segment(&mut self, seg: usize, base: NonNull<u8>, bytes: u64) -> Result<()> {
        if seg >= self.segs.len() || self.segs[seg].is_some() {
            return Err(Error::Device(format!("segment {seg} registered twice")));
        }
        if bytes == 0 {
            self.segs[seg] = Some(Segment {
                reg_base: ptr::null_mut(),
                dev: 0,
                bytes: 0,
            });
            return Ok(());
        }
        // Register whole pages: the mapping covers them (mmap maps whole
        // pages; segment 0 sits inside the ring's mapping).
        let page = 4096usize;
        let start = base.as_ptr() as usize;
        let reg_start = start & !(page - 1);
        let reg_end = (start + bytes as usize).next_multiple_of(page);
        let t = Instant::now();
        // SAFETY: the range is mapped read-write for as long as the backend
        // lives (the daemon drops the backend before the mappings), and is
        // unregistered in Drop.
        ck(unsafe { driver::mem_host_register(reg_start as *mut c_void, reg_end - reg_start) }, "cuMemHostRegister")?;
        // SAFETY: `base` lies in the range just registered.
        let dev = ck(unsafe { driver::mem_host_device_pointer(base.as_ptr().cast()) }, "cuMemHostGetDevicePointer")?;
        self.segs[seg] = Some(Segment {
            reg_base: reg_start as *mut c_void,
            dev,
            bytes,
        });
        log!(
            Info,
            "gpud[{}]: cuda: registered segment {seg} ({bytes} bytes) in {:.1} ms, {:.1} ms after gpud started",
            self.device,
            t.elapsed().as_secs_f64() * 1e3,
            crate::startup::since_start().as_secs_f64() * 1e3
        );
        Ok(())
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
