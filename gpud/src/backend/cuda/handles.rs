//! Owners of the driver's handles: the primary context, green contexts,
//! streams, events and modules, each freed by its own `Drop`, in the
//! manner of cudarc's safe layer (`CudaContext`, `CudaStream`,
//! `CudaEvent`, `CudaModule`). The backend used to keep them as raw values
//! freed by one hand-written `Drop` that had to list each, and `open` leaked
//! what it had made on an early return (the primary context among it, held
//! on while `backend auto` went on with the CPU). Now whatever `open` has
//! made when a step fails is dropped with it.
//!
//! cudarc's own types are not used: they bind their context on every call
//! and know no green contexts, whose streams the latency lane is made of.
//!
//! Drop order is the owners' business: a struct declares its streams and
//! events before the green contexts they were made in, and everything
//! before the [`PrimaryCtx`] (Rust drops fields in declaration order).
//!
//! Every owner counts itself in [`live`], so a test can tell that a failed
//! open left nothing behind.

use std::sync::atomic::{AtomicIsize, Ordering};

use cudarc::driver::sys;

use super::driver::{self, DResult};

/// Handles alive in this process, by kind (indices of [`KINDS`]).
static LIVE: [AtomicIsize; 5] = [const { AtomicIsize::new(0) }; 5];

/// The kinds [`live`] counts, in its order.
pub(super) const KINDS: [&str; 5] = ["primary_context", "green_context", "stream", "event", "module"];

fn made(kind: usize) {
    LIVE[kind].fetch_add(1, Ordering::Relaxed);
}

fn gone(kind: usize) {
    LIVE[kind].fetch_sub(1, Ordering::Relaxed);
}

/// The handles alive now, by kind: all 0 once every backend is dropped and
/// after an open that failed.
pub fn live() -> Vec<(&'static str, isize)> {
    KINDS.iter().zip(&LIVE).map(|(k, n)| (*k, n.load(Ordering::Relaxed))).collect()
}

/// The device's primary context, retained (and made current on this
/// thread); released on drop.
pub(super) struct PrimaryCtx {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl PrimaryCtx {
    /// Retains `dev`'s primary context and makes it current.
    pub(super) fn retain(dev: sys::CUdevice) -> DResult<PrimaryCtx> {
        let ctx = driver::primary_ctx_retain(dev)?;
        made(0);
        let owned = PrimaryCtx { dev, ctx };
        // SAFETY: the context just retained, released by `owned`'s drop.
        unsafe { driver::ctx_set_current(ctx) }?;
        Ok(owned)
    }

    pub(super) fn raw(&self) -> sys::CUcontext {
        self.ctx
    }
}

impl Drop for PrimaryCtx {
    fn drop(&mut self) {
        // SAFETY: retained once by `retain`, released once; every owner
        // made in it is dropped first (declared before it).
        let _ = unsafe { driver::primary_ctx_release(self.dev) };
        gone(0);
    }
}

/// A green context (lane.rs); destroyed on drop, after its streams.
pub(super) struct GreenCtx(sys::CUgreenCtx);

impl GreenCtx {
    pub(super) fn create(dev: sys::CUdevice, r: &sys::CUdevResource) -> DResult<GreenCtx> {
        let g = driver::green_ctx_create(dev, r)?;
        made(1);
        Ok(GreenCtx(g))
    }

    /// A non-blocking stream whose kernels run on this context's SMs.
    pub(super) fn stream(&self, priority: i32) -> DResult<Stream> {
        // SAFETY: the context is live; its owner drops after the stream's
        // (the caller's fields are declared so).
        unsafe { driver::green_stream_create(self.0, priority) }.map(Stream::own)
    }
}

impl Drop for GreenCtx {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once, after its streams.
        let _ = unsafe { driver::green_ctx_destroy(self.0) };
        gone(1);
    }
}

/// A stream; destroyed on drop. The raw handle is handed to the driver's
/// calls by [`Stream::raw`] (a copy for the length of a call, or an alias
/// kept beside its owner, as `CudaBackend::user_last`).
pub(super) struct Stream(sys::CUstream);

impl Stream {
    fn own(s: sys::CUstream) -> Stream {
        made(2);
        Stream(s)
    }

    pub(super) fn non_blocking() -> DResult<Stream> {
        driver::stream_create_non_blocking().map(Stream::own)
    }

    pub(super) fn with_priority(priority: i32) -> DResult<Stream> {
        driver::stream_create_with_priority(priority).map(Stream::own)
    }

    pub(super) fn raw(&self) -> sys::CUstream {
        self.0
    }

    /// Waits for everything enqueued on it.
    pub(super) fn synchronize(&self) -> DResult<()> {
        // SAFETY: the stream is live while its owner is.
        unsafe { driver::stream_synchronize(self.0) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: made once, destroyed once; whoever drops it has waited
        // for its work (CudaBackend's drop synchronizes every stream) or
        // never enqueued any. The driver lets work in flight finish.
        let _ = unsafe { driver::stream_destroy(self.0) };
        gone(2);
    }
}

/// An event without timing; destroyed on drop.
pub(super) struct Event(sys::CUevent);

impl Event {
    pub(super) fn new() -> DResult<Event> {
        let e = driver::event_create()?;
        made(3);
        Ok(Event(e))
    }

    pub(super) fn raw(&self) -> sys::CUevent {
        self.0
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; no stream waits on it any
        // more (its streams were synchronized, or it was never recorded).
        let _ = unsafe { driver::event_destroy(self.0) };
        gone(3);
    }
}

/// A loaded module; unloaded on drop. Its functions (`CUfunction`, plain
/// values) are kept beside it and must not outlive it.
pub(super) struct Module(sys::CUmodule);

impl Module {
    /// Loads a module from an in-memory image.
    ///
    /// # Safety
    /// As [`driver::module_load_data`].
    pub(super) unsafe fn load_data(image: *const std::ffi::c_void) -> DResult<Module> {
        let m = unsafe { driver::module_load_data(image) }?;
        made(4);
        Ok(Module(m))
    }

    /// Loads PTX text (JIT-compiled by the driver).
    pub(super) fn load_ptx(ptx: &std::ffi::CStr) -> DResult<Module> {
        let m = driver::module_load_ptx(ptx)?;
        made(4);
        Ok(Module(m))
    }

    /// Entry point `name`, valid while this module is.
    pub(super) fn function(&self, name: &std::ffi::CStr) -> DResult<sys::CUfunction> {
        // SAFETY: the module is loaded while its owner is.
        unsafe { driver::module_get_function(self.0, name) }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded once, unloaded once; nothing of it is in flight
        // (the daemon waits for every launch before it unloads a module,
        // and the backend synchronizes before it drops).
        let _ = unsafe { driver::module_unload(self.0) };
        gone(4);
    }
}
