//! Checked driver calls: the one layer of the cuda backend that calls
//! `cudarc::driver::sys`, in the manner of cudarc's own `result` layer.
//! Each function wraps one driver entry point and turns its status into a
//! `Result`; the rest of the backend calls these and decides what an error
//! means (a setup failure, a fatal launch error, a refused module).
//!
//! A function is `unsafe` where the driver would read or write memory, or
//! use a handle, that only the caller can vouch for; its `# Safety` says
//! what. Calls that take plain values (an ordinal, an attribute, a size)
//! are safe: the driver checks those itself.

use std::ffi::{c_void, CStr, CString};
use std::ptr;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::DriverError;

/// A driver call's outcome: the value, or the status it failed with.
pub(super) type DResult<T> = std::result::Result<T, DriverError>;

fn check(r: CUresult) -> DResult<()> {
    r.result()
}

/// Opens libcuda once for the life of the process. True when it loaded.
///
/// cudarc's `is_culib_present` opens the library and closes it again, and
/// its loader (`culib`, on the first driver call) then opens it anew. Here
/// the first handle is kept, so cudarc's open finds the library loaded (the
/// same candidate names, in cudarc's order), and gpud's start times the
/// load on its own (`driver_load`). Each open measured 1.3-2 ms on the
/// H200 (driver 580.159.04, 2026-12-04): the start's cost is cuInit and the
/// context, not the library.
pub(super) fn load_library() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        for name in ["cuda", "nvcuda"].into_iter().flat_map(cudarc::get_lib_name_candidates) {
            let Ok(c) = CString::new(name) else { continue };
            // SAFETY: dlopen of a NUL-terminated name, the flags libloading
            // uses; the handle is never closed.
            if !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) }.is_null() {
                // SAFETY: cudarc's loader, which now finds the library open.
                let _ = unsafe { sys::culib() };
                return true;
            }
        }
        false
    })
}

pub(super) fn init() -> DResult<()> {
    // SAFETY: no pointers; flags must be 0.
    check(unsafe { sys::cuInit(0) })
}

pub(super) fn device_count() -> DResult<i32> {
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n)
}

pub(super) fn device_get(ordinal: i32) -> DResult<sys::CUdevice> {
    let mut dev = 0;
    // SAFETY: a valid out-pointer; the driver checks the ordinal.
    check(unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
    Ok(dev)
}

pub(super) fn device_attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> DResult<i32> {
    let mut v = 0;
    // SAFETY: a valid out-pointer; the driver checks the device.
    check(unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) })?;
    Ok(v)
}

pub(super) fn device_name(dev: sys::CUdevice) -> DResult<String> {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most 255 bytes and a NUL into the buffer.
    check(unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), 255, dev) })?;
    // SAFETY: NUL-terminated (zeroed, and the driver writes at most 255).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// The driver's CUDA version, as 1000 * major + 10 * minor.
pub(super) fn driver_version() -> DResult<i32> {
    let mut v = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::cuDriverGetVersion(&mut v) })?;
    Ok(v)
}

pub(super) fn primary_ctx_retain(dev: sys::CUdevice) -> DResult<sys::CUcontext> {
    let mut ctx = ptr::null_mut();
    // SAFETY: a valid out-pointer; the driver checks the device.
    check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
    Ok(ctx)
}

/// Whether `dev`'s primary context is active (retained by someone in this
/// process): the tests' check that every retain was released.
pub(super) fn primary_ctx_active(dev: sys::CUdevice) -> DResult<bool> {
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: valid out-pointers; the driver checks the device.
    check(unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) })?;
    Ok(active != 0)
}

/// # Safety
/// `dev`'s primary context was retained by this process and is released
/// once for each retain; nothing uses the context afterwards.
pub(super) unsafe fn primary_ctx_release(dev: sys::CUdevice) -> DResult<()> {
    check(unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) })
}

/// # Safety
/// `ctx` is a live context (retained and not released).
pub(super) unsafe fn ctx_set_current(ctx: sys::CUcontext) -> DResult<()> {
    check(unsafe { sys::cuCtxSetCurrent(ctx) })
}

pub(super) fn ctx_synchronize() -> DResult<()> {
    // SAFETY: no arguments; fails without a current context.
    check(unsafe { sys::cuCtxSynchronize() })
}

/// Waits for everything enqueued on `s`: the context's synchronize does not
/// wait for streams of a green context.
///
/// # Safety
/// `s` is a live stream.
pub(super) unsafe fn stream_synchronize(s: sys::CUstream) -> DResult<()> {
    check(unsafe { sys::cuStreamSynchronize(s) })
}

/// Loads a module from an in-memory image (a cubin, or NUL-terminated PTX).
///
/// # Safety
/// `image` points at a whole image, readable for the call: a cubin (an
/// ELF image, whose size the driver reads from its headers) 8-byte
/// aligned, or PTX text ending in NUL.
pub(super) unsafe fn module_load_data(image: *const c_void) -> DResult<sys::CUmodule> {
    let mut module = ptr::null_mut();
    check(unsafe { sys::cuModuleLoadData(&mut module, image) })?;
    Ok(module)
}

/// Loads PTX text (JIT-compiled by the driver).
pub(super) fn module_load_ptx(ptx: &CStr) -> DResult<sys::CUmodule> {
    // SAFETY: PTX ending in NUL, borrowed for the call.
    unsafe { module_load_data(ptx.as_ptr().cast()) }
}

/// # Safety
/// `module` is loaded, and is not unloaded while the function is used.
pub(super) unsafe fn module_get_function(module: sys::CUmodule, name: &CStr) -> DResult<sys::CUfunction> {
    let mut f = ptr::null_mut();
    check(unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) })?;
    Ok(f)
}

/// # Safety
/// `module` is loaded, once, and nothing of it is in flight or used later.
pub(super) unsafe fn module_unload(module: sys::CUmodule) -> DResult<()> {
    check(unsafe { sys::cuModuleUnload(module) })
}

/// Opens a function up to `bytes` of dynamic shared memory per block.
///
/// # Safety
/// `f` is a function of a loaded module.
pub(super) unsafe fn func_set_max_dynamic_smem(f: sys::CUfunction, bytes: i32) -> DResult<()> {
    check(unsafe {
        sys::cuFuncSetAttribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes)
    })
}

/// Entry point `name` of the driver cudarc loaded, or null where it has
/// none.
fn driver_symbol(name: &str) -> *mut c_void {
    let (Ok(lib), Ok(sym)) = (CString::new("libcuda.so.1"), CString::new(name)) else { return ptr::null_mut() };
    // SAFETY: RTLD_NOLOAD only finds the driver cudarc already loaded (its
    // reference stays for the process's life, as cudarc's own does).
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return ptr::null_mut();
        }
        libc::dlsym(h, sym.as_ptr())
    }
}

/// Whether the loaded driver exports `name`. cudarc's loader panics on a
/// missing entry point, so one newer than the oldest driver gpud runs on
/// (12.0) is looked for before its first call.
pub(super) fn has_entry(name: &str) -> bool {
    !driver_symbol(name).is_null()
}

/// `cuFuncGetParamInfo` (CUDA 12.4+), looked up in the loaded driver: an
/// older driver has none.
pub(super) struct ParamInfo(ParamInfoFn);

type ParamInfoFn = unsafe extern "C" fn(sys::CUfunction, usize, *mut usize, *mut usize) -> CUresult;

impl ParamInfo {
    /// The driver's entry point, if it has one.
    pub(super) fn lookup() -> Option<ParamInfo> {
        let p = driver_symbol("cuFuncGetParamInfo");
        // SAFETY: the symbol, when present, has the documented signature.
        (!p.is_null()).then(|| ParamInfo(unsafe { std::mem::transmute::<*mut c_void, ParamInfoFn>(p) }))
    }

    /// Parameter `i` of `f` as (offset, size); Err when `f` has no such
    /// parameter.
    ///
    /// # Safety
    /// `f` is a function of a loaded module.
    pub(super) unsafe fn get(&self, f: sys::CUfunction, i: usize) -> DResult<(usize, usize)> {
        let (mut off, mut size) = (0usize, 0usize);
        check(unsafe { (self.0)(f, i, &mut off, &mut size) })?;
        Ok((off, size))
    }
}

pub(super) fn stream_create_non_blocking() -> DResult<sys::CUstream> {
    let mut s = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) })?;
    Ok(s)
}

/// The context's stream priorities: (least, greatest); greatest is the
/// numerically lower (the GPU starts its blocks first).
pub(super) fn stream_priority_range() -> DResult<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: valid out-pointers; needs a current context.
    check(unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) })?;
    Ok((least, greatest))
}

/// A non-blocking stream of the given priority.
pub(super) fn stream_create_with_priority(priority: i32) -> DResult<sys::CUstream> {
    let mut s = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    check(unsafe {
        sys::cuStreamCreateWithPriority(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32, priority)
    })?;
    Ok(s)
}

/// The green-context entry points gpud calls (all there from CUDA 12.5).
pub(super) const GREEN_ENTRIES: [&str; 6] = [
    "cuDeviceGetDevResource",
    "cuDevSmResourceSplitByCount",
    "cuDevResourceGenerateDesc",
    "cuGreenCtxCreate",
    "cuGreenCtxStreamCreate",
    "cuGreenCtxDestroy",
];

/// The device's SMs, as one resource.
pub(super) fn device_sm_resource(dev: sys::CUdevice) -> DResult<sys::CUdevResource> {
    // SAFETY: a plain-data struct the driver fills; zeroes are its "none".
    let mut r: sys::CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer; the caller checked GREEN_ENTRIES.
    check(unsafe { sys::cuDeviceGetDevResource(dev, &mut r, sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM) })?;
    Ok(r)
}

/// How many SMs an SM resource holds.
pub(super) fn sm_count(r: &sys::CUdevResource) -> u32 {
    // SAFETY: an SM resource (the only type gpud makes) has `sm` in its union.
    unsafe { r.__bindgen_anon_1.sm.smCount }
}

/// Splits the SMs of `all` into one group of at least `min` (the driver
/// rounds up to the device's granularity) and the rest.
pub(super) fn sm_split(all: &sys::CUdevResource, min: u32) -> DResult<(sys::CUdevResource, sys::CUdevResource)> {
    // SAFETY: plain-data structs the driver fills.
    let (mut group, mut rest): (sys::CUdevResource, sys::CUdevResource) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    let mut groups = 1u32;
    // SAFETY: room for the one group asked for, valid pointers.
    check(unsafe { sys::cuDevSmResourceSplitByCount(&mut group, &mut groups, all, &mut rest, 0, min) })?;
    if groups != 1 {
        return Err(DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION));
    }
    Ok((group, rest))
}

/// A green context of the SMs of `r`, with the default stream the driver
/// requires.
pub(super) fn green_ctx_create(dev: sys::CUdevice, r: &sys::CUdevResource) -> DResult<sys::CUgreenCtx> {
    let mut desc = ptr::null_mut();
    let mut one = *r;
    // SAFETY: one resource, valid pointers.
    check(unsafe { sys::cuDevResourceGenerateDesc(&mut desc, &mut one, 1) })?;
    let mut g = ptr::null_mut();
    // SAFETY: a descriptor just generated, a valid out-pointer.
    check(unsafe {
        sys::cuGreenCtxCreate(&mut g, desc, dev, sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32)
    })?;
    Ok(g)
}

/// # Safety
/// `g` was created by [`green_ctx_create`], its streams are destroyed, and
/// it is destroyed once.
pub(super) unsafe fn green_ctx_destroy(g: sys::CUgreenCtx) -> DResult<()> {
    check(unsafe { sys::cuGreenCtxDestroy(g) })
}

/// A non-blocking stream whose kernels run on the SMs of green context `g`.
///
/// # Safety
/// `g` was created by [`green_ctx_create`] and is not destroyed yet.
pub(super) unsafe fn green_stream_create(g: sys::CUgreenCtx, priority: i32) -> DResult<sys::CUstream> {
    let mut s = ptr::null_mut();
    // SAFETY: a valid out-pointer; the flag the driver requires.
    check(unsafe {
        sys::cuGreenCtxStreamCreate(&mut s, g, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32, priority)
    })?;
    Ok(s)
}

/// # Safety
/// `s` was created by [`stream_create_non_blocking`] (or with a priority,
/// or in a green context), is destroyed once, and is not used afterwards.
pub(super) unsafe fn stream_destroy(s: sys::CUstream) -> DResult<()> {
    check(unsafe { sys::cuStreamDestroy_v2(s) })
}

/// An event without timing (cheaper to record and query).
pub(super) fn event_create() -> DResult<sys::CUevent> {
    let mut e = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) })?;
    Ok(e)
}

/// # Safety
/// `e` was created by [`event_create`], is destroyed once, and is not used
/// afterwards.
pub(super) unsafe fn event_destroy(e: sys::CUevent) -> DResult<()> {
    check(unsafe { sys::cuEventDestroy_v2(e) })
}

/// # Safety
/// `e` and `stream` are live (created and not destroyed).
pub(super) unsafe fn event_record(e: sys::CUevent, stream: sys::CUstream) -> DResult<()> {
    check(unsafe { sys::cuEventRecord(e, stream) })
}

/// Makes `stream`'s later work wait for the work before `e`'s last record.
///
/// # Safety
/// `e` and `stream` are live (created and not destroyed).
pub(super) unsafe fn stream_wait_event(stream: sys::CUstream, e: sys::CUevent) -> DResult<()> {
    check(unsafe { sys::cuStreamWaitEvent(stream, e, 0) })
}

/// Whether the work before `e`'s record has finished: Ok(false) while it
/// runs (CUDA_ERROR_NOT_READY), Err when it failed.
///
/// # Safety
/// `e` is a live event that has been recorded.
pub(super) unsafe fn event_query(e: sys::CUevent) -> DResult<bool> {
    match unsafe { sys::cuEventQuery(e) } {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => Err(DriverError(r)),
    }
}

/// Free and total device memory, in bytes.
pub(super) fn mem_get_info() -> DResult<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
    Ok((free, total))
}

pub(super) fn mem_alloc(bytes: usize) -> DResult<sys::CUdeviceptr> {
    let mut p = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) })?;
    Ok(p)
}

/// # Safety
/// `p` came from [`mem_alloc`], is freed once, and nothing in flight or
/// later uses it.
pub(super) unsafe fn mem_free(p: sys::CUdeviceptr) -> DResult<()> {
    check(unsafe { sys::cuMemFree_v2(p) })
}

/// Pinned host memory, mapped into the device's address space.
/// The device's default stream-ordered memory pool (CUDA 11.2+), keeping
/// up to `keep` bytes of freed memory instead of giving it back to the
/// device at the next synchronization. None where the device has no
/// pools.
pub(super) fn default_mem_pool(dev: sys::CUdevice, keep: u64) -> DResult<Option<sys::CUmemoryPool>> {
    if device_attribute(dev, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? == 0 {
        return Ok(None);
    }
    let mut pool = ptr::null_mut();
    // SAFETY: a valid out-pointer; the driver checks the device.
    check(unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, dev) })?;
    let mut keep = keep;
    // SAFETY: the attribute takes a u64 (cuuint64_t) by pointer.
    check(unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        )
    })?;
    Ok(Some(pool))
}

/// `bytes` from `pool`, in the order of `stream`: no synchronization of
/// the device (cuMemAlloc may wait for it).
///
/// # Safety
/// `pool` and `stream` are live.
pub(super) unsafe fn mem_alloc_from_pool_async(
    bytes: usize,
    pool: sys::CUmemoryPool,
    stream: sys::CUstream,
) -> DResult<sys::CUdeviceptr> {
    let mut p = 0;
    check(unsafe { sys::cuMemAllocFromPoolAsync(&mut p, bytes, pool, stream) })?;
    Ok(p)
}

/// Gives a pool's block back in the order of `stream`, without waiting
/// for the device (cuMemFree synchronizes it).
///
/// # Safety
/// `p` came from [`mem_alloc_from_pool_async`], is freed once, and nothing
/// in flight or later uses it.
pub(super) unsafe fn mem_free_async(p: sys::CUdeviceptr, stream: sys::CUstream) -> DResult<()> {
    check(unsafe { sys::cuMemFreeAsync(p, stream) })
}

/// Gives the pool's unused memory back to the device, down to `keep` bytes.
///
/// # Safety
/// `pool` is live.
pub(super) unsafe fn mem_pool_trim(pool: sys::CUmemoryPool, keep: usize) -> DResult<()> {
    check(unsafe { sys::cuMemPoolTrimTo(pool, keep) })
}

pub(super) fn mem_host_alloc_mapped(bytes: usize) -> DResult<*mut c_void> {
    let mut p = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    check(unsafe { sys::cuMemHostAlloc(&mut p, bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP) })?;
    Ok(p)
}

/// # Safety
/// `p` came from [`mem_host_alloc_mapped`], is freed once, and nothing in
/// flight or later uses it.
pub(super) unsafe fn mem_free_host(p: *mut c_void) -> DResult<()> {
    check(unsafe { sys::cuMemFreeHost(p) })
}

/// Pins `bytes` of host memory at `base` and maps them for the device
/// (DEVICEMAP | PORTABLE).
///
/// # Safety
/// The range is mapped read-write, page-aligned, and stays mapped until
/// [`mem_host_unregister`].
pub(super) unsafe fn mem_host_register(base: *mut c_void, bytes: usize) -> DResult<()> {
    check(unsafe {
        sys::cuMemHostRegister_v2(base, bytes, sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE)
    })
}

/// # Safety
/// `base` is the start of a range [`mem_host_register`] pinned, and no
/// work in flight reads or writes it.
pub(super) unsafe fn mem_host_unregister(base: *mut c_void) -> DResult<()> {
    check(unsafe { sys::cuMemHostUnregister(base) })
}

/// The device address of host memory that is pinned and mapped (registered
/// or from [`mem_host_alloc_mapped`]).
///
/// # Safety
/// `p` lies in such memory.
pub(super) unsafe fn mem_host_device_pointer(p: *mut c_void) -> DResult<sys::CUdeviceptr> {
    let mut dev = 0;
    check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) })?;
    Ok(dev)
}

/// Enqueues a copy of `bytes` from host `src` to device `dst` on `stream`.
///
/// # Safety
/// Until the stream reaches the copy, `src..src + bytes` stays readable
/// (pinned, for the copy to be asynchronous) and unwritten, and
/// `dst..dst + bytes` is device memory nothing else uses; `stream` is live.
pub(super) unsafe fn memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: *const u8,
    bytes: usize,
    stream: sys::CUstream,
) -> DResult<()> {
    check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream) })
}

/// Enqueues a copy of `bytes` from device `src` to host `dst` on `stream`.
///
/// # Safety
/// Until the stream reaches the copy, `dst..dst + bytes` stays writable
/// (pinned) and nothing else reads or writes it; `src..src + bytes` is
/// device memory; `stream` is live.
pub(super) unsafe fn memcpy_dtoh_async(
    dst: *mut u8,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> DResult<()> {
    check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, stream) })
}

/// Enqueues zeroing `bytes` of device memory at `dst` on `stream`.
///
/// # Safety
/// `dst..dst + bytes` is device memory that only this stream's work uses;
/// `stream` is live.
pub(super) unsafe fn memset_d8_async(dst: sys::CUdeviceptr, bytes: usize, stream: sys::CUstream) -> DResult<()> {
    check(unsafe { sys::cuMemsetD8Async(dst, 0, bytes, stream) })
}

/// Enqueues `f` on `stream` over a 1-D grid of `grid` blocks of `block`
/// threads with `smem` bytes of dynamic shared memory.
///
/// # Safety
/// `f` is a function of a loaded module, opened up to `smem` bytes;
/// `params` holds one pointer per parameter of `f`, each to a value of
/// that parameter's type, live for the call (the driver copies them); every
/// device address the kernel reads or writes stays valid until the stream
/// has run it; `stream` is live.
pub(super) unsafe fn launch_kernel(
    f: sys::CUfunction,
    grid: u32,
    block: u32,
    smem: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> DResult<()> {
    check(unsafe {
        sys::cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, stream, params.as_mut_ptr(), ptr::null_mut())
    })
}
