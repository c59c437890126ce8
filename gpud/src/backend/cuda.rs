//! The CUDA backend: cudarc's driver API, loaded at run time (`libcuda` is
//! opened on first use; nothing of the toolkit is needed to build), the
//! batched kernels of `kernels/` embedded as PTX, and as cubins for the
//! architectures `kernels/build.sh` assembles ([`Cubin`]); a GPU without
//! one JIT-compiles the PTX.
//!
//! Shape:
//! - the device's primary context, current on the daemon thread; one module
//!   from the embedded cubin or PTX; [`STREAMS_PER_KERNEL`] non-blocking streams per
//!   kernel, taken in turn, so launches overlap and complete in any order
//!   (no launch depends on another in flight: a job that reads a buffer
//!   is sent only once the job that made it was answered);
//! - every arena segment is registered once (`cuMemHostRegister`,
//!   DEVICEMAP | PORTABLE) and its device address taken with
//!   `cuMemHostGetDevicePointer`: a region's device pointer is the segment's
//!   device base + the region's offset;
//! - per launch a [`Slot`]: the kernel's descriptor table (built with the
//!   host-side helpers of `kernels/src/abi.rs`) is written into pinned
//!   staging memory, copied to a device buffer on the stream, the kernel is
//!   launched with the grid and shared memory abi.rs documents, and an event
//!   is recorded; [`Backend::poll`] queries the events (`cuEventQuery`).
//!   Slots are recycled once their event has fired;
//! - inputs are read straight from the mapped arena (zero-copy over PCIe) or
//!   copied to device scratch first, per kernel and size ([`policy`]; the
//!   numbers behind it are below).
//!
//! Any CUDA error is fatal: after an illegal address every later call on the
//! context fails, so gpud answers what it holds with DEVICE_ERROR and exits 3.
//!
//! # Mapped vs copied inputs: measured
//!
//! See [`policy`] for the table measured on the H200 with `gpud-bench
//! --bench-backend` and the decision taken from it: streaming kernels read
//! the mapped arena in place; matmuls with tile reuse (>= 2^25 MACs), lone
//! medium reduce/dot jobs and reduce/dot jobs of >= 4M elements copy their
//! inputs to the device first; outputs are written through the mapping.

#![allow(clippy::too_many_arguments)]

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUresult};

use super::{Arena, Backend, Launch, Ticket};
use crate::buffers::BufferMemory;
use crate::descriptor::{Job, KernelRef, Region};
use crate::error::{Error, Result};
use crate::layout::{ElemType, Kernel, EC_MAX_SEGMENTS, EC_TYPE_COUNT, KERNEL_ROWS};
use crate::modules::UserKernel;
use crate::ops::{DevPtrs, DeviceLaunch, KernelOp, Placement};

/// The kernels built for sm_70 (any GPU of compute capability >= 7.0 JITs
/// them), and the same kernels built for sm_80 with the instructions only
/// sm_80+ has (f64 tensor-core matmul): gpud loads the second where the GPU
/// can run it.
#[cfg(not(erlcuda_no_ptx))]
const PTX: Option<&str> = Some(include_str!(concat!(env!("OUT_DIR"), "/erlcuda_kernels.ptx")));
#[cfg(not(any(erlcuda_no_ptx, erlcuda_no_sm80)))]
const PTX_SM80: Option<&str> = Some(include_str!(concat!(env!("OUT_DIR"), "/erlcuda_kernels_sm80.ptx")));
#[cfg(erlcuda_no_ptx)]
const PTX: Option<&str> = None;

/// Machine code of one of the two modules above for one GPU architecture,
/// assembled by `kernels/build.sh` where ptxas was at hand (none otherwise).
/// Loading it skips the driver's JIT, which on the H200 took 834 ms of a
/// 1,110 ms first start (later starts hit the driver's cache; a fresh
/// container or a new driver does not).
pub struct Cubin {
    /// Runs on compute capability `major`.`minor` up to `major`.9.
    pub major: i32,
    pub minor: i32,
    /// Assembled from the sm_80 module (else from the sm_70 one).
    pub sm80: bool,
    pub image: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/cubins.rs"));

/// The cubin gpud loads on a GPU of CC `major`.`minor` in place of the PTX
/// of the module it chose (`sm80`): the newest one of that major version
/// the GPU can run. None: JIT the PTX.
pub fn cubin_for(cubins: &'static [Cubin], major: i32, minor: i32, sm80: bool) -> Option<&'static Cubin> {
    cubins
        .iter()
        .filter(|c| c.sm80 == sm80 && c.major == major && c.minor <= minor)
        .max_by_key(|c| c.minor)
}

/// Loads the built-in module: its cubin for this GPU where there is one
/// (unless `ERLCUDA_FORCE_PTX=1`), else, or if the driver refuses the cubin
/// (one from a newer toolkit than the driver, say), the PTX. Returns the
/// module and what was loaded, for the log.
///
/// # Safety
/// A current context.
unsafe fn load_builtin_module(major: i32, minor: i32, sm80: bool, ptx: &CString) -> Result<(sys::CUmodule, String)> {
    let mut module = ptr::null_mut();
    let forced = std::env::var("ERLCUDA_FORCE_PTX").is_ok_and(|v| v == "1");
    let mut why = if forced { "ERLCUDA_FORCE_PTX=1" } else { "no cubin for this GPU" }.to_string();
    if let Some(c) = cubin_for(CUBINS, major, minor, sm80).filter(|_| !forced) {
        // An 8-byte aligned copy: include_bytes! promises no alignment.
        let mut img = vec![0u64; c.image.len().div_ceil(8)];
        ptr::copy_nonoverlapping(c.image.as_ptr(), img.as_mut_ptr().cast::<u8>(), c.image.len());
        let r = sys::cuModuleLoadData(&mut module, img.as_ptr().cast());
        if r == CUresult::CUDA_SUCCESS {
            return Ok((module, format!("cubin sm_{}{}", c.major, c.minor)));
        }
        why = format!("the driver refused the sm_{}{} cubin ({r:?})", c.major, c.minor);
        log!(Warning, "gpud: {why}; JIT-compiling the PTX instead");
    }
    let r = sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast());
    if r != CUresult::CUDA_SUCCESS {
        return Err(no_cuda("cuda_setup_failed", format!("cuModuleLoadData: {r:?}")));
    }
    Ok((module, format!("PTX ({}) JIT: {why}", if sm80 { "sm_80" } else { "sm_70" })))
}
#[cfg(any(erlcuda_no_ptx, erlcuda_no_sm80))]
const PTX_SM80: Option<&str> = None;

/// Dynamic shared memory a launch may use without opting in per function.
const SMEM_DEFAULT_MAX: u32 = 48 * 1024;

/// Streams per built-in kernel. On one stream a launch's input copies wait
/// for the launch before it, so a pipelined matmul (pipeline.c: bands of A,
/// each copied in, multiplied, written out) left the copy engine idle while
/// the kernel ran and the kernel idle while the band copied. Two streams
/// in turn overlap one drain's copies with the other's kernel: as many as
/// the drains gpud keeps in flight.
const STREAMS_PER_KERNEL: usize = crate::daemon::MAX_DRAINS_IN_FLIGHT;

/// Where a deliberately faulting job points (fault-injection builds only):
/// nothing is ever mapped at device address 8.
const FAULT_PTR: u64 = 0x8;

/// Largest number of virtual blocks one launch is given; a launch whose jobs
/// need more is split (never happens with real arenas, but the kernels take
/// the totals as u32).
const MAX_CHUNK_BLOCKS: u64 = 1 << 30;

/// Descriptor tables up to this size are read by the kernel straight from
/// the mapped staging buffer: for a launch of a few jobs that saves the
/// table's copy (one more driver call and DMA ahead of the kernel on the
/// stream) for one PCIe read per block. Larger tables, read by many blocks,
/// are copied to the device first.
const MAPPED_TABLE_MAX: usize = 1024;

/// Alignment of buffers in device scratch (and of table chunks).
const SCRATCH_ALIGN: u64 = 256;

fn no_cuda(reason: &'static str, detail: impl Into<String>) -> Error {
    Error::NoCuda {
        reason,
        detail: detail.into(),
    }
}

/// A driver call's result as data (cudarc's `DriverError`), named by the call.
fn ck(r: CUresult, what: &'static str) -> Result<()> {
    r.result().map_err(|err| Error::Driver { what, err })
}

/// Opens libcuda once for the life of the process. True when it loaded.
///
/// cudarc's `is_culib_present` opens the library and closes it again, and
/// its loader (`culib`, on the first driver call) then opens it anew. Here
/// the first handle is kept, so cudarc's open finds the library loaded (the
/// same candidate names, in cudarc's order), and gpud's start times the
/// load on its own (`driver_load`). Each open measured 1.3-2 ms on the
/// H200 (`bench/results/h200-2026-12-04-session8/call2/driver.log`): the
/// start's cost is cuInit and the context, not the library.
fn load_driver() -> bool {
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

/// Loads the driver and counts devices: the time loading libcuda took, and
/// the count. The reasons are the `error <reason>` tokens of `--probe
/// --backend cuda`.
fn driver_devices() -> Result<(Duration, u32)> {
    if PTX.is_none() {
        return Err(no_cuda(
            "no_cuda_backend",
            "gpud was built with ERLCUDA_NO_PTX=1 (no GPU kernels)",
        ));
    }
    let t = Instant::now();
    if !load_driver() {
        return Err(no_cuda("no_cuda_driver", "libcuda.so could not be loaded"));
    }
    let t_load = t.elapsed();
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        let r = sys::cuInit(0);
        if r == CUresult::CUDA_ERROR_NO_DEVICE {
            return Err(no_cuda("no_cuda_device", "cuInit: no CUDA device"));
        }
        if r != CUresult::CUDA_SUCCESS {
            return Err(no_cuda("no_cuda_driver", format!("cuInit: {r:?}")));
        }
        let mut n = 0;
        let r = sys::cuDeviceGetCount(&mut n);
        if r != CUresult::CUDA_SUCCESS {
            return Err(no_cuda("no_cuda_driver", format!("cuDeviceGetCount: {r:?}")));
        }
        if n <= 0 {
            return Err(no_cuda("no_cuda_device", "the driver sees no device"));
        }
        Ok((t_load, n as u32))
    }
}

/// `--probe`: the number of CUDA devices, or why there is no CUDA backend.
pub fn probe() -> Result<u32> {
    driver_devices().map(|(_, n)| n)
}

/// Input placement per kernel, size and batch: each kernel's
/// `KernelOp::placement` (in `ops/`), from these measurements.
///
/// MEASURED on the H200 (driver 580.159.04, PCIe host link), `gpud-bench
/// --bench-backend`: wall time of one launch from `submit` to its event,
/// median of 15 after 3 warm-ups, in µs. "copy-in": inputs copied to device
/// scratch with cuMemcpyHtoDAsync (one call per input), output written
/// through the mapping; "copy-in+out": output also computed on the device
/// and copied back.
///
/// | case                      |  mapped | copy-in | copy-in+out |
/// |---------------------------|--------:|--------:|------------:|
/// | vector_add 1 x 4096       |    16.0 |    22.0 |        31.4 |
/// | vector_add 1 x 65536      |    26.0 |    31.5 |        34.7 |
/// | vector_add 1 x 1048576    |   243.2 |   255.0 |       257.8 |
/// | vector_add 1 x 16777216   |  2931.1 |  3743.2 |      3725.8 |
/// | vector_add 1000 x 1000    |   248.0 |  5326.5 |      7359.9 |
/// | reduce 1 x 4096           |    16.5 |    20.9 |        23.5 |
/// | reduce 1 x 65536          |    60.4 |    32.8 |        41.1 |
/// | reduce 1 x 1048576        |   108.6 |   105.4 |       105.2 |
/// | reduce 1 x 16777216       |  1354.1 |  1266.3 |      1265.2 |
/// | reduce 1000 x 1000        |   140.6 |  2684.0 |      4497.6 |
/// | dot_product 1 x 4096      |    17.3 |    22.6 |        30.8 |
/// | dot_product 1 x 65536     |    61.1 |    35.7 |        39.0 |
/// | dot_product 1 x 1048576   |   185.1 |   189.5 |       189.7 |
/// | dot_product 1 x 16777216  |  2662.3 |  2497.1 |      2502.3 |
/// | dot_product 1000 x 1000   |   218.2 |  5278.5 |      7108.9 |
/// | matmul 1 x 64^3           |    24.3 |    30.9 |        39.4 |
/// | matmul 1 x 128^3          |    32.5 |    39.5 |        46.0 |
/// | matmul 1 x 256^3          |    56.2 |    62.7 |        68.3 |
/// | matmul 1 x 512^3          |   223.7 |   140.3 |       148.3 |
/// | matmul 1 x 1024^3         |  1527.3 |   371.7 |       377.0 |
/// | matmul 1 x 2048^3         | 10490.4 |  1315.7 |      1344.3 |
/// | matmul 200 x 32^3         |    72.4 |  1131.4 |      1487.0 |
/// | matmul 1 x 4096x64x4096   |  2307.1 |  1888.7 |      1907.3 |
///
/// Decision:
/// - copying the output back never pays (writes through the mapping are
///   posted and overlap the kernel), so outputs are always written in place
///   (except large reduce/dot outputs, which take atomics: see submit);
/// - each copy is one driver call (~2.5 µs): batches of many small jobs
///   must stay mapped whatever the kernel (1000-job batches: 20-40x slower
///   copied);
/// - vector_add: mapped at every size (the kernel streams at PCIe speed;
///   a copy only adds a step);
/// - reduce/dot: one block per medium job (2049..65536 elements) reads the
///   mapping latency-bound, so a lone medium job of >= 16384 elements is
///   copied (65536: 33-36 µs instead of 60); from 4M elements copying is
///   ~7 % faster (16M measured; 1M was a tie); else mapped;
/// - matmul: inputs are re-read once per 128-wide tile, so copy once there
///   is reuse and real work: >= 2^25 multiply-adds (512^3: 140 vs 224 µs,
///   2048^3: 8x); up to 256^3 mapped wins (56 vs 63 µs).
pub fn policy(op: &dyn KernelOp, job: &Job, njobs: usize) -> Placement {
    op.placement(job, njobs)
}

/// A user's module on the device: its PTX module and, per kernel id, the
/// entry of each declared type.
struct UserModule {
    module: sys::CUmodule,
    funcs: HashMap<u16, [sys::CUfunction; EC_TYPE_COUNT as usize]>,
}

/// `cuFuncGetParamInfo` (CUDA 12.4+), looked up in the loaded driver:
/// cudarc's bindings for 12.0 lack it, and an older driver simply has none
/// (the entry check then stops at the entry's presence).
type ParamInfoFn = unsafe extern "C" fn(sys::CUfunction, usize, *mut usize, *mut usize) -> CUresult;

fn param_info_fn() -> Option<ParamInfoFn> {
    let lib = CString::new("libcuda.so.1").unwrap();
    let sym = CString::new("cuFuncGetParamInfo").unwrap();
    // SAFETY: RTLD_NOLOAD only finds the driver cudarc already loaded; the
    // symbol, when present, has the documented signature.
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return None;
        }
        let p = libc::dlsym(h, sym.as_ptr());
        (!p.is_null()).then(|| std::mem::transmute::<*mut c_void, ParamInfoFn>(p))
    }
}

/// The parameters every helper-crate entry takes: `(jobs: u64, njobs: u32,
/// total_blocks: u32)` as (offset, size) pairs.
const KIT_PARAMS: [(usize, usize); 3] = [(0, 8), (8, 4), (12, 4)];

/// Checks `f`'s parameter list against [`KIT_PARAMS`].
fn check_params(f: sys::CUfunction, entry: &str) -> std::result::Result<(), String> {
    let Some(info) = param_info_fn() else { return Ok(()) };
    for (i, &(off, size)) in KIT_PARAMS.iter().enumerate() {
        let (mut o, mut sz) = (0usize, 0usize);
        // SAFETY: a function of a loaded module; valid out-pointers.
        let r = unsafe { info(f, i, &mut o, &mut sz) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(format!("entry {entry} takes {i} parameters, the job-table ABI takes 3"));
        }
        if (o, sz) != (off, size) {
            return Err(format!(
                "entry {entry}: parameter {i} is {sz} bytes at offset {o}, the job-table ABI wants {size} at {off}"
            ));
        }
    }
    let (mut o, mut sz) = (0usize, 0usize);
    // SAFETY: as above; a fourth parameter must not exist.
    if unsafe { info(f, 3, &mut o, &mut sz) } == CUresult::CUDA_SUCCESS {
        return Err(format!("entry {entry} takes more than the 3 parameters of the job-table ABI"));
    }
    Ok(())
}

struct Segment {
    /// Registered range (page-aligned around the segment).
    reg_base: *mut c_void,
    /// Device address of the segment's first byte.
    dev: u64,
    bytes: u64,
}

/// Everything one in-flight launch needs until its event fires.
struct Slot {
    /// 0 when free.
    ticket: Ticket,
    event: sys::CUevent,
    host_table: *mut u8,
    /// The staging buffer's device address (it is mapped): small tables are
    /// read from there by the kernel, without a copy (see MAPPED_TABLE_MAX).
    host_table_dev: u64,
    host_cap: usize,
    dev_table: u64,
    dev_cap: usize,
    scratch: u64,
    scratch_cap: u64,
}

impl Slot {
    fn new() -> Result<Slot> {
        let mut event = ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        ck(
            unsafe { sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
            "cuEventCreate",
        )?;
        Ok(Slot {
            ticket: 0,
            event,
            host_table: ptr::null_mut(),
            host_table_dev: 0,
            host_cap: 0,
            dev_table: 0,
            dev_cap: 0,
            scratch: 0,
            scratch_cap: 0,
        })
    }

    /// Grows the table buffers (only while the slot is free).
    fn reserve_table(&mut self, bytes: usize) -> Result<()> {
        if bytes > self.host_cap {
            let cap = bytes.next_power_of_two().max(4096);
            // SAFETY: frees what cuMemHostAlloc gave (nothing in flight uses
            // it: the slot is free), then allocates anew.
            unsafe {
                if !self.host_table.is_null() {
                    sys::cuMemFreeHost(self.host_table.cast());
                    self.host_table = ptr::null_mut();
                    self.host_cap = 0;
                }
                let mut p = ptr::null_mut();
                ck(sys::cuMemHostAlloc(&mut p, cap, sys::CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc")?;
                self.host_table = p.cast();
                ck(
                    sys::cuMemHostGetDevicePointer_v2(&mut self.host_table_dev, p, 0),
                    "cuMemHostGetDevicePointer (table)",
                )?;
            }
            self.host_cap = cap;
        }
        if bytes > self.dev_cap {
            let cap = bytes.next_power_of_two().max(4096);
            // SAFETY: as above, device side.
            unsafe {
                if self.dev_table != 0 {
                    sys::cuMemFree_v2(self.dev_table);
                    self.dev_table = 0;
                    self.dev_cap = 0;
                }
                ck(sys::cuMemAlloc_v2(&mut self.dev_table, cap), "cuMemAlloc (table)")?;
            }
            self.dev_cap = cap;
        }
        Ok(())
    }

    fn reserve_scratch(&mut self, bytes: u64) -> Result<()> {
        if bytes <= self.scratch_cap {
            return Ok(());
        }
        let cap = bytes.next_power_of_two().max(1 << 20);
        // SAFETY: the slot is free, so nothing uses the old buffer.
        unsafe {
            if self.scratch != 0 {
                sys::cuMemFree_v2(self.scratch);
                self.scratch = 0;
                self.scratch_cap = 0;
            }
            ck(sys::cuMemAlloc_v2(&mut self.scratch, cap as usize), "cuMemAlloc (scratch)")?;
        }
        self.scratch_cap = cap;
        Ok(())
    }

    fn free(&mut self) {
        // SAFETY: releases what this slot allocated; errors (a dead context)
        // are ignored on the way out.
        unsafe {
            if !self.host_table.is_null() {
                sys::cuMemFreeHost(self.host_table.cast());
            }
            if self.dev_table != 0 {
                sys::cuMemFree_v2(self.dev_table);
            }
            if self.scratch != 0 {
                sys::cuMemFree_v2(self.scratch);
            }
            sys::cuEventDestroy_v2(self.event);
        }
    }
}

/// A copy to enqueue: host arena <-> device scratch.
struct Copy {
    host: *mut u8,
    dev: u64,
    bytes: usize,
}

/// One kernel launch of a (possibly split) batch.
struct Chunk {
    table_off: usize,
    launch: DeviceLaunch,
}

pub struct CudaBackend {
    device: u32,
    name: String,
    ctx: sys::CUcontext,
    cu_dev: sys::CUdevice,
    module: sys::CUmodule,
    /// `funcs[kernel id - 1][type id]`: the entry `<entry>_<type>` of every
    /// type the kernel's row lists (null for the others).
    funcs: Vec<[sys::CUfunction; EC_TYPE_COUNT as usize]>,
    /// Dynamic shared memory each function was opened up to (beyond 48 KiB).
    smem_max: Vec<[u32; EC_TYPE_COUNT as usize]>,
    /// [`STREAMS_PER_KERNEL`] streams per kernel, taken in turn by its
    /// launches (`turn`).
    streams: Vec<[sys::CUstream; STREAMS_PER_KERNEL]>,
    turn: Vec<usize>,
    /// Users' kernels: one stream for all of them, their modules by slot,
    /// and the dynamic shared memory each entry was opened up to.
    user_stream: sys::CUstream,
    user_mods: HashMap<u16, UserModule>,
    user_smem_max: HashMap<(u16, u8), u32>,
    segs: Vec<Option<Segment>>,
    /// How long `open`'s steps took (the startup profile).
    open_phases: Vec<(&'static str, Duration)>,
    slots: Vec<Slot>,
    next_ticket: Ticket,
    busy: usize,
    /// Benchmarks force a placement for every job.
    force_mode: Option<Placement>,
    // Reused per launch.
    bytes: Vec<u8>,
    ptrs: Vec<DevPtrs>,
    copies_in: Vec<Copy>,
    copies_out: Vec<Copy>,
    chunks: Vec<Chunk>,
    zero_dev: Vec<(u64, usize)>,
    /// Device buffers' raw memory (the caching allocator, buffers.rs,
    /// sits on it).
    memory: CudaMemory,
}

/// cuMemAlloc / cuMemFree for device buffers, in the backend's context
/// (current on gpud's one thread since `open`).
struct CudaMemory {
    capacity: u64,
}

impl BufferMemory for CudaMemory {
    fn buf_alloc(&mut self, bytes: u64) -> Option<u64> {
        let mut p = 0;
        // SAFETY: a valid out-pointer; the context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut p, usize::try_from(bytes).ok()?) };
        // Out of memory (or anything else): no block; the allocator gives
        // cached blocks back and tries again, or answers OOM. A context
        // that is truly broken fails the next launch and gpud exits.
        (r == CUresult::CUDA_SUCCESS).then_some(p)
    }

    fn buf_free(&mut self, addr: u64, _bytes: u64) {
        // SAFETY: a block of buf_alloc, given back once (buffers.rs), and
        // no launch in flight uses it (frees are deferred until then).
        unsafe { sys::cuMemFree_v2(addr) };
    }

    fn buf_capacity(&self) -> u64 {
        self.capacity
    }
}

fn kidx(k: Kernel) -> usize {
    k.id() as usize - 1
}

impl CudaBackend {
    pub fn open(device: u32) -> Result<CudaBackend> {
        let t_open = Instant::now();
        let (t_load, n) = driver_devices()?;
        let t_init = t_open.elapsed().saturating_sub(t_load);
        if device >= n {
            return Err(no_cuda(
                "no_cuda_device",
                format!("device {device} requested, the driver sees {n}"),
            ));
        }
        let setup = |what: &str, r: CUresult| -> Result<()> {
            if r == CUresult::CUDA_SUCCESS {
                Ok(())
            } else {
                Err(no_cuda("cuda_setup_failed", format!("{what}: {r:?}")))
            }
        };
        // SAFETY: driver calls with valid out-pointers; the PTX string is
        // NUL-terminated and outlives cuModuleLoadData.
        unsafe {
            let mut dev = 0;
            setup("cuDeviceGet", sys::cuDeviceGet(&mut dev, device as i32))?;
            let attr = |a: sys::CUdevice_attribute| {
                let mut v = 0;
                sys::cuDeviceGetAttribute(&mut v, a, dev);
                v
            };
            use sys::CUdevice_attribute as A;
            let (major, minor) = (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            );
            if major < 7 {
                return Err(no_cuda(
                    "no_cuda_device",
                    format!("device {device} is compute capability {major}.{minor}; the kernels need 7.0"),
                ));
            }
            if attr(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) == 0 {
                return Err(no_cuda("no_cuda_device", format!("device {device} cannot map host memory")));
            }
            let mut namebuf = [0 as std::ffi::c_char; 256];
            sys::cuDeviceGetName(namebuf.as_mut_ptr(), 255, dev);
            let dname = std::ffi::CStr::from_ptr(namebuf.as_ptr()).to_string_lossy().into_owned();
            let mut drv = 0;
            sys::cuDriverGetVersion(&mut drv);
            let t = Instant::now();
            let mut ctx = ptr::null_mut();
            setup("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
            setup("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            let t_ctx = t.elapsed();
            let sm80 = major >= 8 && PTX_SM80.is_some();
            let src = if sm80 { PTX_SM80 } else { PTX };
            let ptx = CString::new(src.unwrap_or_default()).map_err(|_| no_cuda("no_cuda_backend", "PTX holds a NUL"))?;
            let t = Instant::now();
            let (module, loaded) = load_builtin_module(major, minor, sm80, &ptx)?;
            let load_ms = t.elapsed().as_secs_f64() * 1e3;
            let mut funcs = vec![[ptr::null_mut(); EC_TYPE_COUNT as usize]; KERNEL_ROWS.len()];
            for (row, fs) in KERNEL_ROWS.iter().zip(&mut funcs) {
                for ty in ElemType::ALL.into_iter().filter(|t| row.kernel.runs_on(*t)) {
                    let name = format!("{}_{}", row.entry, ty.atom());
                    let c = CString::new(name.as_str()).unwrap();
                    let r = sys::cuModuleGetFunction(&mut fs[ty as usize], module, c.as_ptr());
                    if r != CUresult::CUDA_SUCCESS {
                        return Err(no_cuda("cuda_setup_failed", format!("kernel entry {name}: {r:?}")));
                    }
                }
            }
            // The PTX load (t started above it) and the entry lookups.
            let t_module = t.elapsed();
            let mut streams = vec![[ptr::null_mut(); STREAMS_PER_KERNEL]; KERNEL_ROWS.len()];
            for s in streams.iter_mut().flatten() {
                setup(
                    "cuStreamCreate",
                    sys::cuStreamCreate(s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
                )?;
            }
            let (mut free_b, mut total_b) = (0usize, 0usize);
            setup("cuMemGetInfo", sys::cuMemGetInfo_v2(&mut free_b, &mut total_b))?;
            let mut user_stream = ptr::null_mut();
            setup(
                "cuStreamCreate",
                sys::cuStreamCreate(&mut user_stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
            )?;
            log!(
                Info,
                "gpud[{device}]: cuda: {dname}, cc {major}.{minor}, driver {}.{}, kernels: {loaded}, loaded in {load_ms:.1} ms",
                drv / 1000,
                drv % 1000 / 10,
            );
            Ok(CudaBackend {
                device,
                name: format!("{dname} (cc {major}.{minor}, driver {}.{})", drv / 1000, drv % 1000 / 10),
                ctx,
                cu_dev: dev,
                module,
                smem_max: vec![[SMEM_DEFAULT_MAX; EC_TYPE_COUNT as usize]; funcs.len()],
                funcs,
                turn: vec![0; streams.len()],
                streams,
                user_stream,
                user_mods: HashMap::new(),
                user_smem_max: HashMap::new(),
                segs: (0..EC_MAX_SEGMENTS).map(|_| None).collect(),
                // driver_load: opening libcuda; cuda_init: cuInit; context: retaining
                // (creating, in a fresh process) the primary context; module:
                // loading the cubin, or the PTX (JIT, or the driver's cache),
                // and looking up the entries. The rest of open (device queries, streams) is
                // the daemon's "backend" remainder.
                open_phases: vec![
                    ("driver_load", t_load),
                    ("cuda_init", t_init),
                    ("context", t_ctx),
                    ("module", t_module),
                ],
                slots: Vec::new(),
                next_ticket: 1,
                busy: 0,
                force_mode: None,
                bytes: Vec::new(),
                ptrs: Vec::new(),
                copies_in: Vec::new(),
                copies_out: Vec::new(),
                chunks: Vec::new(),
                zero_dev: Vec::new(),
                // The device's memory as the context found it: what is
                // already taken (the context, other processes) is not
                // ours to hand out.
                memory: CudaMemory { capacity: free_b as u64 },
            })
        }
    }

    /// Benchmarks: place every job's data this way (None: [`policy`]).
    pub fn force_mode(&mut self, mode: Option<Placement>) {
        self.force_mode = mode;
    }

    fn dev_ptr(&self, r: Region) -> Result<u64> {
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

    fn free_slot(&mut self) -> Result<usize> {
        if let Some(i) = self.slots.iter().position(|s| s.ticket == 0) {
            return Ok(i);
        }
        self.slots.push(Slot::new()?);
        Ok(self.slots.len() - 1)
    }

    /// The entry, stream and opened-up shared memory of a launch's kernel;
    /// a built-in kernel's launches take its streams in turn.
    fn entry(&mut self, kernel: KernelRef, ty: ElemType) -> (sys::CUfunction, sys::CUstream, u32) {
        match kernel {
            KernelRef::Builtin(k) => {
                let i = kidx(k);
                let t = self.turn[i];
                self.turn[i] = (t + 1) % STREAMS_PER_KERNEL;
                (self.funcs[i][ty as usize], self.streams[i][t], self.smem_max[i][ty as usize])
            }
            KernelRef::User(id) => {
                let f = self
                    .user_mods
                    .values()
                    .find_map(|m| m.funcs.get(&id))
                    .map_or(ptr::null_mut(), |fs| fs[ty as usize]);
                let smem = self.user_smem_max.get(&(id, ty as u8)).copied().unwrap_or(SMEM_DEFAULT_MAX);
                (f, self.user_stream, smem)
            }
        }
    }

    fn set_smem_max(&mut self, kernel: KernelRef, ty: ElemType, bytes: u32) {
        match kernel {
            KernelRef::Builtin(k) => self.smem_max[kidx(k)][ty as usize] = bytes,
            KernelRef::User(id) => {
                self.user_smem_max.insert((id, ty as u8), bytes);
            }
        }
    }

    fn submit_inner(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) -> Result<Ticket> {
        let kernel = launch.kernel;
        let op = launch.op;
        let jobs = launch.jobs;
        let slot_i = self.free_slot()?;
        let (f, stream, smem_max) = self.entry(kernel, launch.ty);
        if f.is_null() {
            return Err(Error::Device(format!("no entry for {kernel:?} on {:?}", launch.ty)));
        }

        // 1. Placement: device pointers and the copies they need. Outputs
        //    the kernel accumulates into atomically live in zeroed device
        //    scratch, never in mapped host memory, where atomics over PCIe
        //    are not guaranteed.
        self.ptrs.clear();
        self.copies_in.clear();
        self.copies_out.clear();
        self.zero_dev.clear();
        let mut scratch_need = 0u64;
        let mut modes = Vec::with_capacity(jobs.len());
        for j in jobs {
            let mode = if j.fault() {
                Placement::Mapped
            } else {
                self.force_mode.unwrap_or_else(|| policy(op, j, jobs.len()))
            };
            modes.push(mode);
            if mode != Placement::Mapped {
                for r in j.inputs().into_iter().filter(|r| !r.is_buffer()) {
                    scratch_need += r.bytes().next_multiple_of(SCRATCH_ALIGN);
                }
            }
            // An output in a device buffer is written (and zeroed) in place.
            if !j.fault() && !j.out().is_buffer() && (mode == Placement::CopyInOut || op.accumulates_into_output(j)) {
                scratch_need += j.out().bytes().next_multiple_of(SCRATCH_ALIGN);
            }
        }
        if scratch_need > 0 {
            self.slots[slot_i].reserve_scratch(scratch_need)?;
        }
        let scratch = self.slots[slot_i].scratch;
        let mut at = 0u64;
        let mut place = |host: *mut u8, bytes: u64, list: &mut Vec<Copy>| -> u64 {
            let dev = scratch + at;
            at += bytes.next_multiple_of(SCRATCH_ALIGN);
            if bytes > 0 {
                list.push(Copy {
                    host,
                    dev,
                    bytes: bytes as usize,
                });
            }
            dev
        };
        for (j, mode) in jobs.iter().zip(&modes) {
            if j.fault() {
                self.ptrs.push(DevPtrs {
                    in0: FAULT_PTR,
                    in1: FAULT_PTR,
                    out: FAULT_PTR,
                });
                continue;
            }
            let mut p = DevPtrs {
                in0: self.dev_ptr(j.in0())?,
                in1: self.dev_ptr(j.in1())?,
                out: self.dev_ptr(j.out())?,
            };
            // Inputs already in device buffers are read where they are.
            if *mode != Placement::Mapped {
                if !j.in0().is_buffer() {
                    p.in0 = place(arena.host_ptr(j.in0()), j.in0().bytes(), &mut self.copies_in);
                }
                if !j.in1().is_empty() && !j.in1().is_buffer() {
                    p.in1 = place(arena.host_ptr(j.in1()), j.in1().bytes(), &mut self.copies_in);
                }
            }
            let zeroed = op.accumulates_into_output(j);
            if j.out().is_buffer() {
                if zeroed {
                    self.zero_dev.push((p.out, j.out().bytes() as usize));
                }
            } else if *mode == Placement::CopyInOut || zeroed {
                p.out = place(arena.host_ptr(j.out()), j.out().bytes(), &mut self.copies_out);
                if zeroed {
                    self.zero_dev.push((p.out, j.out().bytes() as usize));
                }
            }
            self.ptrs.push(p);
        }

        // 2. Chunks (one unless the batch is not independent or enormous)
        //    and their descriptor tables, back to back in `bytes`.
        self.bytes.clear();
        self.chunks.clear();
        let mut start = 0;
        while start < jobs.len() {
            let mut end = start + 1;
            if launch.independent {
                let mut blocks = op.blocks(&jobs[start]);
                while end < jobs.len() {
                    let b = op.blocks(&jobs[end]);
                    if blocks + b > MAX_CHUNK_BLOCKS {
                        break;
                    }
                    blocks += b;
                    end += 1;
                }
            }
            let off = self.bytes.len().next_multiple_of(SCRATCH_ALIGN as usize);
            self.bytes.resize(off, 0);
            let dl = op
                .device_table(&jobs[start..end], &self.ptrs[start..end], &mut self.bytes)
                .ok_or_else(|| Error::Device("batch too large for one launch".into()))?;
            self.chunks.push(Chunk {
                table_off: off,
                launch: dl,
            });
            start = end;
        }

        // Functions that need more than the default dynamic shared memory
        // opt in once.
        let smem_need = self.chunks.iter().map(|c| c.launch.smem).max().unwrap_or(0);
        if smem_need > smem_max {
            // SAFETY: a function of this backend's module; the value is a size.
            ck(
                unsafe {
                    sys::cuFuncSetAttribute(
                        f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem_need as i32,
                    )
                },
                "cuFuncSetAttribute",
            )?;
            self.set_smem_max(kernel, launch.ty, smem_need);
        }

        // 3. Enqueue: input copies, table upload, zeroing, launches, output
        //    copies, event.
        let slot = &mut self.slots[slot_i];
        slot.reserve_table(self.bytes.len().max(64))?;
        // SAFETY: the staging buffer holds at least bytes.len() bytes and is
        // not in use (free slot); the copies read registered arena memory of
        // validated regions and write slot-owned device memory; the launch
        // parameters point at locals that live across cuLaunchKernel.
        unsafe {
            for c in &self.copies_in {
                ck(
                    sys::cuMemcpyHtoDAsync_v2(c.dev, c.host.cast(), c.bytes, stream),
                    "cuMemcpyHtoDAsync (input)",
                )?;
            }
            ptr::copy_nonoverlapping(self.bytes.as_ptr(), slot.host_table, self.bytes.len());
            let mapped_table = self.bytes.len() <= MAPPED_TABLE_MAX;
            let table_base = if mapped_table { slot.host_table_dev } else { slot.dev_table };
            if !mapped_table {
                ck(
                    sys::cuMemcpyHtoDAsync_v2(slot.dev_table, slot.host_table.cast(), self.bytes.len(), stream),
                    "cuMemcpyHtoDAsync (table)",
                )?;
            }
            for &(d, bytes) in &self.zero_dev {
                ck(sys::cuMemsetD8Async(d, 0, bytes, stream), "cuMemsetD8Async")?;
            }
            for c in &self.chunks {
                let dl = c.launch;
                if dl.grid == 0 {
                    continue; // no work: a zero grid is invalid
                }
                let mut table = table_base + c.table_off as u64;
                let mut vals = dl.params;
                let mut params: [*mut c_void; 5] = [ptr::null_mut(); 5];
                params[0] = (&mut table as *mut u64).cast();
                for (i, v) in vals.iter_mut().enumerate().take(dl.nparams) {
                    params[1 + i] = (v as *mut u32).cast();
                }
                ck(
                    sys::cuLaunchKernel(f, dl.grid, 1, 1, dl.block, 1, 1, dl.smem, stream, params.as_mut_ptr(), ptr::null_mut()),
                    "cuLaunchKernel",
                )?;
            }
            for c in &self.copies_out {
                ck(
                    sys::cuMemcpyDtoHAsync_v2(c.host.cast(), c.dev, c.bytes, stream),
                    "cuMemcpyDtoHAsync (output)",
                )?;
            }
            ck(sys::cuEventRecord(slot.event, stream), "cuEventRecord")?;
        }
        let t = self.next_ticket;
        self.next_ticket += 1;
        slot.ticket = t;
        self.busy += 1;
        Ok(t)
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> &'static str {
        "cuda"
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn add_segment(&mut self, seg: usize, base: NonNull<u8>, bytes: u64) -> Result<()> {
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
        // lives (the daemon drops the backend before the mappings).
        unsafe {
            ck(
                sys::cuMemHostRegister_v2(
                    reg_start as *mut c_void,
                    reg_end - reg_start,
                    sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE,
                ),
                "cuMemHostRegister",
            )?;
            let mut dev = 0u64;
            ck(
                sys::cuMemHostGetDevicePointer_v2(&mut dev, base.as_ptr().cast(), 0),
                "cuMemHostGetDevicePointer",
            )?;
            self.segs[seg] = Some(Segment {
                reg_base: reg_start as *mut c_void,
                dev,
                bytes,
            });
        }
        log!(
            Info,
            "gpud[{}]: cuda: registered segment {seg} ({bytes} bytes) in {:.1} ms, {:.1} ms after gpud started",
            self.device,
            t.elapsed().as_secs_f64() * 1e3,
            crate::startup::since_start().as_secs_f64() * 1e3
        );
        Ok(())
    }

    fn startup_phases(&self) -> Vec<(&'static str, Duration)> {
        self.open_phases.clone()
    }

    fn load_module(&mut self, slot: u16, ptx: &str, kernels: &[Arc<UserKernel>]) -> std::result::Result<(), String> {
        let src = CString::new(ptx).map_err(|_| "the PTX holds a NUL byte".to_string())?;
        let mut module = ptr::null_mut();
        // SAFETY: a NUL-terminated PTX string that outlives the call.
        let r = unsafe { sys::cuModuleLoadData(&mut module, src.as_ptr().cast()) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(format!("the driver refused it (cuModuleLoadData: {r:?})"));
        }
        let mut funcs = HashMap::new();
        let found = (|| {
            for k in kernels {
                let mut fs = [ptr::null_mut(); EC_TYPE_COUNT as usize];
                for ty in ElemType::ALL.into_iter().filter(|t| k.runs_on(*t)) {
                    let entry = k.entry(ty);
                    let c = CString::new(entry.as_str()).map_err(|_| format!("bad entry name {entry:?}"))?;
                    // SAFETY: a loaded module; valid out-pointer and name.
                    let r = unsafe { sys::cuModuleGetFunction(&mut fs[ty as usize], module, c.as_ptr()) };
                    if r != CUresult::CUDA_SUCCESS {
                        return Err(format!("no entry {entry}, which the manifest declares"));
                    }
                    check_params(fs[ty as usize], &entry)?;
                }
                funcs.insert(k.id, fs);
            }
            Ok(())
        })();
        if let Err(e) = found {
            // SAFETY: the module just loaded, unused.
            unsafe { sys::cuModuleUnload(module) };
            return Err(e);
        }
        self.unload_module(slot);
        self.user_mods.insert(slot, UserModule { module, funcs });
        Ok(())
    }

    fn unload_module(&mut self, slot: u16) {
        if let Some(m) = self.user_mods.remove(&slot) {
            for id in m.funcs.keys() {
                self.user_smem_max.retain(|(i, _), _| i != id);
            }
            // SAFETY: nothing of the module is in flight (the daemon waits
            // for every launch before it unloads).
            unsafe { sys::cuModuleUnload(m.module) };
        }
    }

    fn submit(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) -> Result<Ticket> {
        self.submit_inner(arena, launch)
    }

    fn poll(&mut self, done: &mut Vec<Ticket>) -> Result<()> {
        if self.busy == 0 {
            return Ok(());
        }
        for s in &mut self.slots {
            if s.ticket == 0 {
                continue;
            }
            // SAFETY: the event was created by this backend and recorded.
            match unsafe { sys::cuEventQuery(s.event) } {
                CUresult::CUDA_SUCCESS => {
                    done.push(s.ticket);
                    s.ticket = 0;
                    self.busy -= 1;
                }
                CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(Error::Driver { what: "a launch on the GPU (cuEventQuery)", err: cudarc::driver::DriverError(e) }),
            }
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.busy
    }

    fn buffer_memory(&mut self) -> &mut dyn BufferMemory {
        &mut self.memory
    }

    fn host_buffers(&self) -> bool {
        false
    }

    fn buf_write(&mut self, addr: u64, src: &[u8]) -> Result<()> {
        // SAFETY: `addr` is a live device block of at least src.len() bytes;
        // src is registered (pinned) arena memory, so the copy runs at full
        // PCIe speed and is complete when the call returns.
        ck(unsafe { sys::cuMemcpyHtoD_v2(addr, src.as_ptr().cast(), src.len()) }, "cuMemcpyHtoD (put)")
    }

    fn buf_read(&mut self, addr: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: as for buf_write. Whatever wrote the buffer has finished:
        // the VM learns a buffer's id only from a completed job.
        ck(unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), addr, dst.len()) }, "cuMemcpyDtoH (get)")
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // SAFETY: tears down what `open` and `add_segment` made; errors (a
        // dead context after a fault) are ignored.
        unsafe {
            sys::cuCtxSynchronize();
            for s in &mut self.slots {
                s.free();
            }
            for s in self.segs.iter().flatten() {
                if !s.reg_base.is_null() {
                    sys::cuMemHostUnregister(s.reg_base);
                }
            }
            for &s in self.streams.iter().flatten() {
                sys::cuStreamDestroy_v2(s);
            }
            sys::cuStreamDestroy_v2(self.user_stream);
            for m in self.user_mods.values() {
                sys::cuModuleUnload(m.module);
            }
            sys::cuModuleUnload(self.module);
            sys::cuDevicePrimaryCtxRelease_v2(self.cu_dev);
        }
        let _ = self.ctx;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::descriptor::validate;
    use crate::layout::{Params, Sqe};

    fn job(kernel: Kernel, n: u32, dims: (u32, u32, u32)) -> Job {
        let (m, nn, k) = dims;
        let s = match kernel {
            Kernel::Matmul => Sqe {
                kernel: kernel.id(),
                in1: 1 << 40,
                out: 1 << 41,
                in0_len: m * k,
                in1_len: k * nn,
                out_len: m * nn,
                p: Params::pack("vvddd", &[], &[m, nn, k]),
                ..Sqe::default()
            },
            _ => Sqe {
                kernel: kernel.id(),
                in1: 1 << 40,
                out: 1 << 41,
                in0_len: n,
                in1_len: if kernel == Kernel::Reduce { 0 } else { n },
                out_len: if kernel == Kernel::VectorAdd { n } else { 1 },
                ..Sqe::default()
            },
        };
        validate(&s, 1u64 << 44).unwrap()
    }

    #[test]
    fn the_cubin_chosen_is_the_newest_of_the_gpus_major_version() {
        static T: [Cubin; 3] = [
            Cubin { major: 7, minor: 5, sm80: false, image: b"a" },
            Cubin { major: 8, minor: 0, sm80: true, image: b"b" },
            Cubin { major: 9, minor: 0, sm80: true, image: b"c" },
        ];
        let pick = |ma, mi, sm80| cubin_for(&T, ma, mi, sm80).map(|c| c.image);
        assert_eq!(pick(9, 0, true), Some(&b"c"[..]));
        assert_eq!(pick(8, 0, true), Some(&b"b"[..]));
        assert_eq!(pick(8, 9, true), Some(&b"b"[..]), "sm_80 code runs on Ada (8.9)");
        assert_eq!(pick(7, 5, false), Some(&b"a"[..]));
        assert_eq!(pick(7, 0, false), None, "sm_75 code does not run on Volta");
        assert_eq!(pick(10, 0, true), None, "Blackwell JITs the PTX");
        assert_eq!(pick(9, 0, false), None, "a cubin of the other module never stands in");
    }

    /// Where ptxas was at hand, the three cubins build.sh promises are
    /// embedded, so a Turing, Ampere/Ada or Hopper GPU loads machine code.
    #[test]
    fn the_built_cubins_cover_turing_ampere_and_hopper() {
        if CUBINS.is_empty() {
            // Legitimate only where build.sh found no ptxas, or was told not to.
            let ptxas = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/tools/find-ptxas"))
                .output()
                .is_ok_and(|o| o.status.success());
            let off = cfg!(erlcuda_no_ptx) || std::env::var("ERLCUDA_NO_CUBIN").is_ok_and(|v| v == "1");
            assert!(!ptxas || off, "ptxas is here, but gpud was built without cubins");
            eprintln!("built without ptxas: no cubins (gpud JITs the PTX)");
            return;
        }
        for (ma, mi, sm80) in [(7, 5, false), (8, 0, true), (8, 9, true), (9, 0, true)] {
            let c = cubin_for(CUBINS, ma, mi, sm80).unwrap_or_else(|| panic!("no cubin for {ma}.{mi}"));
            assert_eq!(&c.image[..4], b"\x7fELF", "a cubin is an ELF image");
        }
    }

    #[test]
    fn placement_policy_follows_the_measurements() {
        use Placement::*;
        for n in [0, 4096, 1 << 16, 1 << 24] {
            assert_eq!(policy(ops::op(Kernel::VectorAdd), &job(Kernel::VectorAdd, n, (0, 0, 0)), 1), Mapped);
        }
        for k in [Kernel::Reduce, Kernel::DotProduct] {
            assert_eq!(policy(ops::op(k), &job(k, 4096, (0, 0, 0)), 1), Mapped);
            assert_eq!(policy(ops::op(k), &job(k, 1 << 16, (0, 0, 0)), 1), CopyIn);
            assert_eq!(policy(ops::op(k), &job(k, 1 << 16, (0, 0, 0)), 100), Mapped);
            assert_eq!(policy(ops::op(k), &job(k, 1 << 20, (0, 0, 0)), 1), Mapped);
            assert_eq!(policy(ops::op(k), &job(k, 1 << 24, (0, 0, 0)), 100), CopyIn);
        }
        let mm = |d| policy(ops::op(Kernel::Matmul), &job(Kernel::Matmul, 0, d), 1);
        assert_eq!(mm((256, 256, 256)), Mapped);
        assert_eq!(mm((512, 512, 512)), CopyIn);
        assert_eq!(mm((4096, 64, 4096)), CopyIn);
        assert_eq!(mm((128, 128, 4096)), Mapped, "no tile reuse");
        assert_eq!(mm((32, 32, 32)), Mapped);
    }
}
