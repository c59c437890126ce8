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
//! - per launch a slot: the kernel's descriptor table (built with the
//!   host-side helpers of `kernels/src/abi.rs`) is written into pinned
//!   staging memory, copied to a device buffer on the stream, the kernel is
//!   launched with the grid and shared memory abi.rs documents, and an event
//!   is recorded; [`Backend::poll`] queries the events (`cuEventQuery`).
//!   Slots are recycled once their event has fired;
//! - inputs are read straight from the mapped arena (zero-copy over PCIe) or
//!   copied to device scratch first, per kernel and size ([`policy`]; the
//!   numbers behind it are there).
//!
//! Any CUDA error is fatal: after an illegal address every later call on the
//! context fails, so gpud answers what it holds with DEVICE_ERROR and exits 3.
//!
//! Files, bottom to top: `driver` (the only caller of the raw driver API:
//! one checked function per call), `handles` (owners of the context,
//! green contexts, streams, events and modules, each freeing itself), `image` (the built-in module: PTX or
//! cubin), `memory` (segments and device buffers), `user_module` (users'
//! modules, their entries checked), `launch` (placement, slots, one launch
//! enqueued), and this file (the device opened, the [`Backend`] trait).
//!
//! # Mapped vs copied inputs: measured
//!
//! See [`policy`] for the table measured on the H200 with `gpud-bench
//! --bench-backend` and the decision taken from it: streaming kernels read
//! the mapped arena in place; matmuls with tile reuse (>= 2^25 MACs), lone
//! medium reduce/dot jobs and reduce/dot jobs of >= 4M elements copy their
//! inputs to the device first; outputs are written through the mapping.

#![allow(clippy::too_many_arguments)]

mod driver;
mod handles;
mod image;
mod lane;
mod launch;
mod memory;
mod user_module;

use std::collections::HashMap;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys;

pub use handles::live as live_handles;
pub use image::{cubin_for, Cubin};
pub use launch::policy;

use super::pace::{Dir, Pacer, Pacing, AHEAD_BYTES};
use super::{Backend, Launch, Registered, Registrar, Ticket};
use crate::arena::Arena;
use crate::buffers::BufferMemory;
use crate::error::{Error, Result};
use crate::layout::{EC_MAX_SEGMENTS, EC_TYPE_COUNT, KERNEL_ROWS};
use crate::modules::{ModuleLoader, UserKernel};
use crate::ops::{DevPtrs, Placement};
use driver::DResult;
use handles::{Event, Module, PrimaryCtx, Stream};
use image::{PTX, PTX_SM80};
use lane::Lane;
use launch::{Chunk, Copy, Slot, SMEM_DEFAULT_MAX};
use memory::{CudaMemory, Segment};
use user_module::UserModule;

/// Streams per built-in kernel. On one stream a launch's input copies wait
/// for the launch before it, so a pipelined matmul (pipeline.c: bands of A,
/// each copied in, multiplied, written out) left the copy engine idle while
/// the kernel ran and the kernel idle while the band copied. Two streams
/// in turn overlap one drain's copies with the other's kernel: as many as
/// the drains gpud keeps in flight.
const STREAMS_PER_KERNEL: usize = super::MAX_DRAINS_IN_FLIGHT;

fn no_cuda(reason: &'static str, detail: impl Into<String>) -> Error {
    Error::NoCuda {
        reason,
        detail: detail.into(),
    }
}

/// A driver call's failure as a fatal device error, named by the call.
fn ck<T>(r: DResult<T>, what: &'static str) -> Result<T> {
    r.map_err(|err| Error::Driver { what, err })
}

/// A driver call's failure while opening the device: no CUDA backend.
fn setup<T>(what: &str, r: DResult<T>) -> Result<T> {
    r.map_err(|e| no_cuda("cuda_setup_failed", format!("{what}: {:?}", e.0)))
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
    if !driver::load_library() {
        return Err(no_cuda("no_cuda_driver", "libcuda.so could not be loaded"));
    }
    let t_load = t.elapsed();
    match driver::init() {
        Ok(()) => {}
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => {
            return Err(no_cuda("no_cuda_device", "cuInit: no CUDA device"));
        }
        Err(e) => return Err(no_cuda("no_cuda_driver", format!("cuInit: {:?}", e.0))),
    }
    let n = driver::device_count().map_err(|e| no_cuda("no_cuda_driver", format!("cuDeviceGetCount: {:?}", e.0)))?;
    if n <= 0 {
        return Err(no_cuda("no_cuda_device", "the driver sees no device"));
    }
    Ok((t_load, n as u32))
}

/// `--probe`: the number of CUDA devices, or why there is no CUDA backend.
pub fn probe() -> Result<u32> {
    driver_devices().map(|(_, n)| n)
}

/// The CUDA backend. Its handles are owned ([`handles`]) and dropped in
/// the order the fields are declared: every stream, event and module
/// before the green contexts of the lane and the primary context last.
pub struct CudaBackend {
    device: u32,
    name: String,
    /// `funcs[kernel id - 1][type id]`: the entry `<entry>_<type>` of every
    /// type the kernel's row lists (null for the others), of `_module`.
    funcs: Vec<[sys::CUfunction; EC_TYPE_COUNT as usize]>,
    /// Dynamic shared memory each function was opened up to (beyond 48 KiB).
    smem_max: Vec<[u32; EC_TYPE_COUNT as usize]>,
    turn: Vec<usize>,
    /// The stream the last user launch went on (its order is kept across a
    /// change to or from `wide`): an alias of `user_stream` or of the wide
    /// one, which own it.
    user_last: sys::CUstream,
    user_smem_max: HashMap<(u32, u8), u32>,
    segs: Vec<Option<Segment>>,
    /// How long `open`'s steps took (the startup profile).
    open_phases: Vec<(&'static str, Duration)>,
    next_ticket: Ticket,
    busy: usize,
    /// The last submit's driver calls (`Backend::last_enqueue`).
    last_enqueue: Duration,
    /// Where the last submit's launch ran (`Backend::last_wide`).
    last_wide: Option<bool>,
    /// Benchmarks force a placement for every job.
    force_mode: Option<Placement>,
    // Reused per launch.
    bytes: Vec<u8>,
    ptrs: Vec<DevPtrs>,
    copies_in: Vec<Copy>,
    copies_out: Vec<Copy>,
    chunks: Vec<Chunk>,
    zero_dev: Vec<(u64, usize)>,
    // Owned handles from here on, in the order they are dropped.
    slots: Vec<Slot>,
    /// Puts' and gets' copies, paced (`pace`), on a stream per direction;
    /// events of finished pieces kept for the next ones.
    paced: Pacer<Event>,
    spare_events: Vec<Event>,
    /// [`STREAMS_PER_KERNEL`] streams per kernel, taken in turn by its
    /// launches (`turn`).
    streams: Vec<[Stream; STREAMS_PER_KERNEL]>,
    /// Users' kernels: one stream for all of them, their modules by slot,
    /// and the dynamic shared memory each entry was opened up to.
    user_stream: Stream,
    /// Under a reservation, the streams large launches take while no small
    /// job runs (lane.rs, `Lane::wide_stream`).
    wide: Option<Wide>,
    copy_streams: [Stream; 2],
    /// Device buffers' raw memory (the caching allocator, buffers.rs,
    /// sits on it).
    memory: CudaMemory,
    /// Small launches' stream, and the SMs they may have to themselves
    /// (`lane`): after every stream made in its green contexts.
    lane: Lane,
    user_mods: HashMap<u16, UserModule>,
    /// The built-in kernels' module, held for `funcs` (unloaded on drop).
    _module: Module,
    /// Last: released once everything made in it is gone.
    ctx: PrimaryCtx,
}

impl CudaBackend {
    /// Opens device `device`, with `lane_sms` SMs reserved for small
    /// launches where the driver can (None: no reservation).
    pub fn open(device: u32, lane_sms: Option<u32>) -> Result<CudaBackend> {
        Self::open_failing_at(device, lane_sms, injected_open_fault().as_deref())
    }

    /// [`CudaBackend::open`], failing at step `fail_at` (one of
    /// [`OPEN_STEPS`]) as if the driver had refused it there: what the
    /// steps before it made must all be freed (the fault injection of the
    /// tests; `open` passes None outside `fault-injection` builds).
    pub fn open_failing_at(device: u32, lane_sms: Option<u32>, fail_at: Option<&str>) -> Result<CudaBackend> {
        let step = |at: &'static str| -> Result<()> {
            debug_assert!(OPEN_STEPS.contains(&at));
            match fail_at {
                Some(f) if f == at => Err(no_cuda("cuda_setup_failed", format!("{at}: a fault injected there"))),
                _ => Ok(()),
            }
        };
        let t_open = Instant::now();
        let (t_load, n) = driver_devices()?;
        let t_init = t_open.elapsed().saturating_sub(t_load);
        if device >= n {
            return Err(no_cuda(
                "no_cuda_device",
                format!("device {device} requested, the driver sees {n}"),
            ));
        }
        step("device")?;
        let dev = setup("cuDeviceGet", driver::device_get(device as i32))?;
        // An attribute the driver does not give reads as 0.
        let attr = |a: sys::CUdevice_attribute| driver::device_attribute(dev, a).unwrap_or(0);
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
        let dname = driver::device_name(dev).unwrap_or_default();
        let drv = driver::driver_version().unwrap_or(0);
        let t = Instant::now();
        // From here on every handle has an owner: a `?` drops what was made.
        let ctx = setup("cuDevicePrimaryCtxRetain", PrimaryCtx::retain(dev))?;
        step("context")?;
        let t_ctx = t.elapsed();
        let sm80 = major >= 8 && PTX_SM80.is_some();
        let src = if sm80 { PTX_SM80 } else { PTX };
        let ptx = CString::new(src.unwrap_or_default()).map_err(|_| no_cuda("no_cuda_backend", "PTX holds a NUL"))?;
        let t = Instant::now();
        let (module, loaded) = image::load_builtin_module(major, minor, sm80, &ptx)?;
        step("module")?;
        let load_ms = t.elapsed().as_secs_f64() * 1e3;
        let funcs = image::builtin_entries(&module)?;
        // The PTX load (t started above it) and the entry lookups.
        let t_module = t.elapsed();
        // Every kernel stream is the lane's or one of the lane's work
        // streams: under a reservation, none may run in the primary context.
        let lane = Lane::open(device, dev, lane_sms)?;
        step("lane")?;
        let streams = (0..KERNEL_ROWS.len())
            .map(|_| {
                let s = (0..STREAMS_PER_KERNEL).map(|_| lane.work_stream()).collect::<Result<Vec<_>>>()?;
                Ok(s.try_into().unwrap_or_else(|_| unreachable!("STREAMS_PER_KERNEL streams")))
            })
            .collect::<Result<Vec<[Stream; STREAMS_PER_KERNEL]>>>()?;
        let (free_b, _total_b) = setup("cuMemGetInfo", driver::mem_get_info())?;
        let user_stream = lane.work_stream()?;
        let wide = Wide::open(&lane, streams.len())?;
        let copy_streams = [
            setup("cuStreamCreate", Stream::non_blocking())?,
            setup("cuStreamCreate", Stream::non_blocking())?,
        ];
        step("streams")?;
        // Device buffers' memory from the stream-ordered pool (memory.rs),
        // which keeps what buffers may hold in all (never more than the
        // device had free) rather than trimming it at each synchronization.
        let pool = match driver::default_mem_pool(dev, free_b as u64) {
            Ok(Some(pool)) => Some((pool, setup("cuStreamCreate", Stream::non_blocking())?)),
            Ok(None) => None,
            Err(e) => {
                log!(Warning, "gpud[{device}]: cuda: no memory pool ({e:?}): buffers use cuMemAlloc / cuMemFree");
                None
            }
        };
        step("pool")?;
        log!(
            Info,
            "gpud[{device}]: cuda: {dname}, cc {major}.{minor}, driver {}.{}, kernels: {loaded}, loaded in {load_ms:.1} ms",
            drv / 1000,
            drv % 1000 / 10,
        );
        let backend = CudaBackend {
            device,
            name: format!("{dname} (cc {major}.{minor}, driver {}.{})", drv / 1000, drv % 1000 / 10),
            smem_max: vec![[SMEM_DEFAULT_MAX; EC_TYPE_COUNT as usize]; funcs.len()],
            funcs,
            turn: vec![0; streams.len()],
            user_last: user_stream.raw(),
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
            next_ticket: 1,
            busy: 0,
            last_enqueue: Duration::ZERO,
            last_wide: None,
            force_mode: None,
            bytes: Vec::new(),
            ptrs: Vec::new(),
            copies_in: Vec::new(),
            copies_out: Vec::new(),
            chunks: Vec::new(),
            zero_dev: Vec::new(),
            slots: Vec::new(),
            paced: Pacer::new(Pacing::default(), AHEAD_BYTES),
            spare_events: Vec::new(),
            streams,
            user_stream,
            wide,
            copy_streams,
            // The device's memory as the context found it: what is
            // already taken (the context, other processes) is not
            // ours to hand out.
            memory: CudaMemory { capacity: free_b as u64, pool },
            lane,
            user_mods: HashMap::new(),
            _module: module,
            ctx,
        };
        // The last step: everything made, dropped whole.
        step("ready")?;
        Ok(backend)
    }

    /// Benchmarks: place every job's data this way (None: [`policy`]).
    pub fn force_mode(&mut self, mode: Option<Placement>) {
        self.force_mode = mode;
    }
}

impl ModuleLoader for CudaBackend {
    fn load_module(&mut self, slot: u16, ptx: &str, kernels: &[Arc<UserKernel>]) -> std::result::Result<(), String> {
        self.load_user_module(slot, ptx, kernels)
    }

    fn unload_module(&mut self, slot: u16) {
        self.unload_user_module(slot)
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
        self.register_segment(seg, base, bytes)
    }

    fn registrar(&self) -> Box<dyn Registrar> {
        Box::new(memory::CudaRegistrar { ctx: self.ctx.raw(), current: false, gap: memory::register_gap() })
    }

    fn adopt_segment(&mut self, seg: usize, reg: Registered) -> Result<()> {
        self.adopt_registered(seg, reg)
    }

    fn startup_phases(&self) -> Vec<(&'static str, Duration)> {
        self.open_phases.clone()
    }

    fn submit(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) -> Result<Ticket> {
        self.submit_inner(arena, launch)
    }

    fn last_enqueue(&self) -> std::time::Duration {
        self.last_enqueue
    }

    fn last_wide(&self) -> Option<bool> {
        self.last_wide
    }

    fn poll(&mut self, done: &mut Vec<Ticket>) -> Result<()> {
        self.poll_slots(done)?;
        self.poll_copies(done)
    }

    fn in_flight(&self) -> usize {
        self.busy + self.paced.open()
    }

    fn buffer_memory(&mut self) -> &mut dyn BufferMemory {
        &mut self.memory
    }

    fn host_buffers(&self) -> bool {
        false
    }

    fn copy_in(&mut self, addr: u64, src: *const u8, bytes: usize) -> Result<Ticket> {
        let t = self.take_ticket();
        // Its first piece is issued by the next poll (the loop's next turn).
        self.paced.push(Dir::ToDevice, t, addr, src as usize, bytes);
        Ok(t)
    }

    fn copy_out(&mut self, addr: u64, dst: *mut u8, bytes: usize) -> Result<Ticket> {
        let t = self.take_ticket();
        self.paced.push(Dir::ToHost, t, addr, dst as usize, bytes);
        Ok(t)
    }

    fn copies_in_flight(&self) -> usize {
        self.paced.open()
    }

    fn lane(&self) -> String {
        self.lane.describe()
    }

    fn set_pacing(&mut self, pacing: Pacing) {
        self.paced.set_pacing(pacing);
    }
}

/// Under a reservation (lane.rs), the streams large launches take while no
/// small job runs: in the primary context, so every SM. Measured on an H100
/// with 8 SMs reserved: matmul 4096^3 from buffers alone ran at 0.80x of
/// its speed without a reservation (its tiles make one more wave on 124
/// SMs than on 132), for a small-job p99 beside it of 34 us against 773.
struct Wide {
    /// `streams[kernel id - 1]`, taken in the same turns as the work streams.
    streams: Vec<[Stream; STREAMS_PER_KERNEL]>,
    /// Users' kernels' (see `CudaBackend::user_last`).
    user: Stream,
    /// Recorded on the users' stream a launch leaves, waited for on the one
    /// it takes.
    switch: Event,
}

impl Wide {
    fn open(lane: &Lane, kernels: usize) -> Result<Option<Wide>> {
        let Some(user) = lane.wide_stream()? else { return Ok(None) };
        let streams = (0..kernels)
            .map(|_| {
                let s = (0..STREAMS_PER_KERNEL)
                    .map(|_| lane.wide_stream().map(|w| w.expect("a reservation has wide streams")))
                    .collect::<Result<Vec<_>>>()?;
                Ok(s.try_into().unwrap_or_else(|_| unreachable!("STREAMS_PER_KERNEL streams")))
            })
            .collect::<Result<Vec<[Stream; STREAMS_PER_KERNEL]>>>()?;
        let switch = setup("cuEventCreate", Event::new())?;
        Ok(Some(Wide { streams, user, switch }))
    }

    fn all_streams(&self) -> impl Iterator<Item = &Stream> {
        self.streams.iter().flatten().chain([&self.user])
    }
}

/// Whether device `device`'s primary context is held by this process (a
/// backend open, or one that leaked it); None where the driver cannot say.
pub fn primary_context_held(device: u32) -> Option<bool> {
    driver_devices().ok()?;
    driver::primary_ctx_active(driver::device_get(device as i32).ok()?).ok()
}

/// The steps of [`CudaBackend::open`] a fault can be injected at, in order:
/// each after the handles of its name were made.
pub const OPEN_STEPS: [&str; 7] = ["device", "context", "module", "lane", "streams", "pool", "ready"];

/// The step named by ERLCUDA_GPUD_CUDA_OPEN_FAULT, in `fault-injection`
/// builds only: the Erlang tests' way to fail gpud's CUDA open (and see
/// `backend auto` fall back to the CPU with nothing held).
fn injected_open_fault() -> Option<String> {
    if !cfg!(feature = "fault-injection") {
        return None;
    }
    std::env::var("ERLCUDA_GPUD_CUDA_OPEN_FAULT").ok().filter(|s| !s.is_empty())
}

impl Drop for CudaBackend {
    /// Waits for the device, then gives back what is not a handle (slots'
    /// memory, registered segments); the handles go with the fields, in
    /// their declared order. Errors (a dead context after a fault) are
    /// ignored.
    fn drop(&mut self) {
        // Nothing runs past this: every handle is then unused. The
        // context's synchronize misses the green contexts' streams, so
        // each stream is waited for too.
        let _ = driver::ctx_synchronize();
        let wide = self.wide.iter().flat_map(Wide::all_streams);
        let pool_stream = self.memory.pool.as_ref().map(|(_, s)| s);
        let streams = self.streams.iter().flatten().chain([&self.user_stream]).chain(self.lane.stream.as_ref());
        for s in streams.chain(wide).chain(&self.copy_streams).chain(pool_stream) {
            let _ = s.synchronize();
        }
        for s in &mut self.slots {
            s.free(&mut self.memory);
        }
        for s in self.segs.iter().flatten() {
            s.unregister();
        }
    }
}
