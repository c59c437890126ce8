//! One launch: where each job's data is read from (in place over the
//! mapping, or copied to device scratch first), the descriptor tables, and
//! the work enqueued on a stream behind an event, in a [`Slot`] that is
//! recycled once the event has fired.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use super::handles::{Event, Stream};
use super::memory::CudaMemory;
use super::{ck, driver, CudaBackend, STREAMS_PER_KERNEL};
use crate::arena::Arena;
use crate::backend::{Launch, Ticket};
use crate::descriptor::{Job, KernelRef};
use crate::error::{Error, Result};
use crate::layout::{ElemType, Kernel, EC_MAX_SLOTS, EC_MAX_VECTORS};
use crate::ops::{DevPtrs, DeviceLaunch, KernelOp, Placement};

/// Dynamic shared memory a launch may use without opting in per function.
pub(super) const SMEM_DEFAULT_MAX: u32 = 48 * 1024;


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

/// Everything one in-flight launch needs until its event fires.
pub(super) struct Slot {
    /// 0 when free.
    ticket: Ticket,
    event: Event,
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
        Ok(Slot {
            ticket: 0,
            event: ck(Event::new(), "cuEventCreate")?,
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
    fn reserve_table(&mut self, mem: &mut CudaMemory, bytes: usize) -> Result<()> {
        if bytes > self.host_cap {
            let cap = bytes.next_power_of_two().max(4096);
            if !self.host_table.is_null() {
                // SAFETY: what mem_host_alloc_mapped gave; nothing in flight
                // uses it (the slot is free).
                let _ = unsafe { driver::mem_free_host(self.host_table.cast()) };
                self.host_table = ptr::null_mut();
                self.host_cap = 0;
            }
            let p = ck(driver::mem_host_alloc_mapped(cap), "cuMemHostAlloc")?;
            self.host_table = p.cast();
            // SAFETY: `p` is mapped pinned memory, just allocated.
            self.host_table_dev = ck(unsafe { driver::mem_host_device_pointer(p) }, "cuMemHostGetDevicePointer (table)")?;
            self.host_cap = cap;
        }
        if bytes > self.dev_cap {
            let cap = bytes.next_power_of_two().max(4096);
            if self.dev_table != 0 {
                // SAFETY: as above, device side.
                unsafe { mem.dev_free(self.dev_table) };
                self.dev_table = 0;
                self.dev_cap = 0;
            }
            self.dev_table = ck(mem.dev_alloc(cap), "cuMemAlloc (table)")?;
            self.dev_cap = cap;
        }
        Ok(())
    }

    fn reserve_scratch(&mut self, mem: &mut CudaMemory, bytes: u64) -> Result<()> {
        if bytes <= self.scratch_cap {
            return Ok(());
        }
        let cap = bytes.next_power_of_two().max(1 << 20);
        if self.scratch != 0 {
            // SAFETY: the slot is free, so nothing uses the old buffer.
            unsafe { mem.dev_free(self.scratch) };
            self.scratch = 0;
            self.scratch_cap = 0;
        }
        self.scratch = ck(mem.dev_alloc(cap as usize), "cuMemAlloc (scratch)")?;
        self.scratch_cap = cap;
        Ok(())
    }

    /// Releases the memory this slot allocated (its event goes with the
    /// slot); errors (a dead context) are ignored on the way out.
    pub(super) fn free(&mut self, mem: &mut CudaMemory) {
        // SAFETY (each call): the slot's own allocations, freed once,
        // after the context was synchronized (or died): nothing in flight
        // uses them.
        if !self.host_table.is_null() {
            let _ = unsafe { driver::mem_free_host(self.host_table.cast()) };
        }
        if self.dev_table != 0 {
            unsafe { mem.dev_free(self.dev_table) };
        }
        if self.scratch != 0 {
            unsafe { mem.dev_free(self.scratch) };
        }
        self.host_table = ptr::null_mut();
        (self.dev_table, self.scratch) = (0, 0);
    }
}

/// A copy to enqueue: host arena <-> device scratch.
pub(super) struct Copy {
    host: *mut u8,
    dev: u64,
    bytes: usize,
}

/// One kernel launch of a (possibly split) batch.
pub(super) struct Chunk {
    table_off: usize,
    launch: DeviceLaunch,
}

/// Adds `bytes` at device address `dev` to the ranges to zero before the
/// launch, merged with the last one when they are back to back.
fn zero_range(list: &mut Vec<(u64, usize)>, dev: u64, bytes: usize, merge: bool) {
    if bytes == 0 {
        return;
    }
    match list.last_mut() {
        Some((d, n)) if merge && *d + *n as u64 == dev => *n += bytes,
        _ => list.push((dev, bytes)),
    }
}

fn kidx(k: Kernel) -> usize {
    k.id() as usize - 1
}

impl CudaBackend {
    fn free_slot(&mut self) -> Result<usize> {
        if let Some(i) = self.slots.iter().position(|s| s.ticket == 0) {
            return Ok(i);
        }
        self.slots.push(Slot::new()?);
        Ok(self.slots.len() - 1)
    }

    /// The entry, stream and opened-up shared memory of a launch's kernel;
    /// a built-in kernel's launches take its streams in turn, a small
    /// launch (`small`) the latency lane's where there is one.
    /// Under a reservation, a large launch made while no small job has
    /// come for `SMALL_WINDOW` takes a wide stream (every SM, mod.rs
    /// `Wide`); one made while small jobs run leaves them their SMs.
    fn entry(&mut self, kernel: KernelRef, ty: ElemType, small: bool) -> Result<(sys::CUfunction, sys::CUstream, u32)> {
        let wide = !small && self.wide.is_some() && !self.paced.small_recently(std::time::Instant::now());
        self.last_wide = (!small && self.wide.is_some()).then_some(wide);
        let (f, stream, smem) = self.entry_stream(kernel, ty, wide)?;
        let lane = self.lane.stream.as_ref().filter(|_| small).map(Stream::raw);
        Ok((f, lane.unwrap_or(stream), smem))
    }

    fn entry_stream(&mut self, kernel: KernelRef, ty: ElemType, wide: bool) -> Result<(sys::CUfunction, sys::CUstream, u32)> {
        Ok(match kernel {
            KernelRef::Builtin(k) => {
                let i = kidx(k);
                let t = self.turn[i];
                self.turn[i] = (t + 1) % STREAMS_PER_KERNEL;
                let stream = match &self.wide {
                    Some(w) if wide => w.streams[i][t].raw(),
                    _ => self.streams[i][t].raw(),
                };
                (self.funcs[i][ty as usize], stream, self.smem_max[i][ty as usize])
            }
            KernelRef::User(_) | KernelRef::UserGroup(_) => {
                let key = user_func_key(kernel);
                let f = self
                    .user_mods
                    .values()
                    .find_map(|m| m.funcs.get(&key))
                    .map_or(ptr::null_mut(), |fs| fs[ty as usize]);
                let smem = self.user_smem_max.get(&(key, ty as u8)).copied().unwrap_or(SMEM_DEFAULT_MAX);
                let stream = match &self.wide {
                    Some(w) if wide => w.user.raw(),
                    _ => self.user_stream.raw(),
                };
                if stream != self.user_last {
                    if let Some(w) = &self.wide {
                        // Users' launches run in the order made (an inout
                        // buffer's updates): the new stream waits for the
                        // last launch on the old one.
                        // SAFETY: both streams and the event live as long as the backend.
                        ck(unsafe { driver::event_record(w.switch.raw(), self.user_last) }, "cuEventRecord")?;
                        ck(unsafe { driver::stream_wait_event(stream, w.switch.raw()) }, "cuStreamWaitEvent")?;
                    }
                    self.user_last = stream;
                }
                (f, stream, smem)
            }
        })
    }

    fn set_smem_max(&mut self, kernel: KernelRef, ty: ElemType, bytes: u32) {
        match kernel {
            KernelRef::Builtin(k) => self.smem_max[kidx(k)][ty as usize] = bytes,
            KernelRef::User(_) | KernelRef::UserGroup(_) => {
                self.user_smem_max.insert((user_func_key(kernel), ty as u8), bytes);
            }
        }
    }

    pub(super) fn submit_inner(&mut self, arena: &Arena<'_>, launch: &Launch<'_>) -> Result<Ticket> {
        let kernel = launch.kernel;
        let op = launch.op;
        let jobs = launch.jobs;
        let slot_i = self.free_slot()?;
        // Jobs are coalesced by size (coalesce.rs): a launch of small jobs
        // takes the latency lane however many they are.
        let small = jobs.iter().all(Job::is_small);
        if small {
            // Puts' and gets' copies go paced while small jobs run (pace.rs).
            self.paced.note_small(std::time::Instant::now());
        }
        let (f, stream, smem_max) = self.entry(kernel, launch.ty, small)?;
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
        // Whether the kernel reads inputs from host memory through the
        // mapping (pace.rs, `Pacing::mapped_grid`); not where the caller
        // chose the grid.
        let mut reads_host = false;
        for j in jobs {
            let mode = if j.fault() {
                Placement::Mapped
            } else {
                self.force_mode.unwrap_or_else(|| policy(op, j, jobs.len()))
            };
            modes.push(mode);
            reads_host |= mode == Placement::Mapped
                && j.geometry().grid == 0
                && j.inputs().iter().any(|r| !r.is_empty() && !r.is_buffer());
            if mode != Placement::Mapped {
                for r in j.inputs().iter().filter(|r| !r.is_buffer()) {
                    scratch_need += r.bytes().next_multiple_of(SCRATCH_ALIGN);
                }
            }
            // An output in a device buffer is written (and zeroed) in place.
            if !j.fault() && (mode == Placement::CopyInOut || op.accumulates_into_output(j)) {
                for r in j.outputs().iter().filter(|r| !r.is_buffer()) {
                    scratch_need += r.bytes().next_multiple_of(SCRATCH_ALIGN);
                }
            }
        }
        if scratch_need > 0 {
            self.slots[slot_i].reserve_scratch(&mut self.memory, scratch_need)?;
        }
        let scratch = self.slots[slot_i].scratch;
        let mut at = 0u64;
        // Scratch for `bytes` copied from or to `host`: its device address.
        // Copies between back-to-back host and scratch ranges are merged,
        // one driver call for many small outputs.
        let mut place = |host: *mut u8, bytes: u64, list: &mut Vec<Copy>| -> u64 {
            let dev = scratch + at;
            at += bytes.next_multiple_of(SCRATCH_ALIGN);
            if bytes > 0 {
                match list.last_mut() {
                    Some(c) if c.dev + c.bytes as u64 == dev && c.host.wrapping_add(c.bytes) == host => c.bytes += bytes as usize,
                    _ => list.push(Copy { host, dev, bytes: bytes as usize }),
                }
            }
            dev
        };
        for (j, mode) in jobs.iter().zip(&modes) {
            if j.fault() {
                self.ptrs.push(DevPtrs { addr: [FAULT_PTR; EC_MAX_SLOTS as usize] });
                continue;
            }
            let mut p = DevPtrs::default();
            let outs = EC_MAX_VECTORS as usize..;
            for (i, r) in j.inputs().iter().enumerate().chain(outs.zip(j.outputs())) {
                p.addr[i] = self.dev_ptr(*r)?;
            }
            // Inputs already in device buffers are read where they are.
            if *mode != Placement::Mapped {
                for (i, r) in j.inputs().iter().enumerate() {
                    if !r.is_empty() && !r.is_buffer() {
                        p.addr[i] = place(arena.host_ptr(*r), r.bytes(), &mut self.copies_in);
                    }
                }
            }
            let zeroed = op.accumulates_into_output(j);
            for (i, r) in (EC_MAX_VECTORS as usize..).zip(j.outputs()) {
                if r.is_buffer() {
                    // Never merged with a neighbour: two buffers that sit
                    // end to end are still two allocations, and one memset
                    // across both is refused (CUDA_ERROR_INVALID_VALUE:
                    // topk_rows's two output buffers in the H100 bench).
                    if zeroed {
                        zero_range(&mut self.zero_dev, p.addr[i], r.bytes() as usize, false);
                    }
                } else if *mode == Placement::CopyInOut || zeroed {
                    p.addr[i] = place(arena.host_ptr(*r), r.bytes(), &mut self.copies_out);
                    if zeroed {
                        // Scratch padding is the slot's own: zeroing it
                        // too lets neighbouring outputs share one memset.
                        zero_range(&mut self.zero_dev, p.addr[i], r.bytes().next_multiple_of(SCRATCH_ALIGN) as usize, true);
                    }
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
            // SAFETY: a function of a module this backend holds loaded.
            ck(unsafe { driver::func_set_max_dynamic_smem(f, smem_need as i32) }, "cuFuncSetAttribute")?;
            self.set_smem_max(kernel, launch.ty, smem_need);
        }

        // 3. Enqueue: input copies, table upload, zeroing, launches, output
        //    copies, event.
        let enqueue_started = std::time::Instant::now();
        let slot = &mut self.slots[slot_i];
        slot.reserve_table(&mut self.memory, self.bytes.len().max(64))?;
        for c in &self.copies_in {
            // SAFETY: `c.host` is registered arena memory of a validated
            // input region, which the VM leaves alone until the job is
            // answered; `c.dev` is this slot's scratch, free until its
            // event fires.
            // Cut on the registration grid: a copy may not span two.
            super::memory::copy_on_grid(c.dev, c.host as usize, c.bytes, |dev, host, n| {
                ck(unsafe { driver::memcpy_htod_async(dev, host as *const u8, n, stream) }, "cuMemcpyHtoDAsync (input)")
            })?;
        }
        // SAFETY: the staging buffer holds at least bytes.len() bytes
        // (reserve_table) and is not in use (free slot).
        unsafe { ptr::copy_nonoverlapping(self.bytes.as_ptr(), slot.host_table, self.bytes.len()) };
        let mapped_table = self.bytes.len() <= MAPPED_TABLE_MAX;
        let table_base = if mapped_table { slot.host_table_dev } else { slot.dev_table };
        if !mapped_table {
            // SAFETY: the staging buffer is pinned and the slot's until its
            // event fires; the device table holds as many bytes.
            ck(
                unsafe { driver::memcpy_htod_async(slot.dev_table, slot.host_table, self.bytes.len(), stream) },
                "cuMemcpyHtoDAsync (table)",
            )?;
        }
        for &(d, bytes) in &self.zero_dev {
            // SAFETY: an output of this launch, in slot scratch or in a live
            // device buffer that no other launch in flight uses.
            ck(unsafe { driver::memset_d8_async(d, bytes, stream) }, "cuMemsetD8Async")?;
        }
        // Read once, and only for a launch the cap may concern: small
        // launches are the hot path.
        let now = (!small && reads_host).then(std::time::Instant::now);
        for c in &self.chunks {
            let mut dl = c.launch;
            if dl.grid == 0 {
                continue; // no work: a zero grid is invalid
            }
            if let Some(now) = now {
                dl.grid = self.paced.mapped_grid(dl.grid, now);
            }
            let mut table = table_base + c.table_off as u64;
            let mut vals = dl.params;
            let mut params: [*mut c_void; 5] = [ptr::null_mut(); 5];
            params[0] = (&mut table as *mut u64).cast();
            for (i, v) in vals.iter_mut().enumerate().take(dl.nparams) {
                params[1 + i] = (v as *mut u32).cast();
            }
            // SAFETY: `f` is this kernel's entry, opened up to the chunks'
            // largest shared memory above; `params` points at `table` (a
            // u64) and `dl.nparams` u32s, all live across the call, which
            // is the entry's parameter list (abi.rs, the kit's job ABI);
            // every address in the table is a registered segment, a live
            // buffer or this slot's scratch, all kept until the event fires.
            ck(unsafe { driver::launch_kernel(f, dl.grid, dl.block, dl.smem, stream, &mut params) }, "cuLaunchKernel")?;
        }
        for c in &self.copies_out {
            // SAFETY: `c.host` is registered arena memory of the job's own
            // output region, which nothing else touches until the job is
            // answered; `c.dev` is this slot's scratch.
            super::memory::copy_on_grid(c.dev, c.host as usize, c.bytes, |dev, host, n| {
                ck(unsafe { driver::memcpy_dtoh_async(host as *mut u8, dev, n, stream) }, "cuMemcpyDtoHAsync (output)")
            })?;
        }
        // SAFETY: the slot's event and one of this backend's streams.
        ck(unsafe { driver::event_record(slot.event.raw(), stream) }, "cuEventRecord")?;
        self.last_enqueue = enqueue_started.elapsed();
        let t = self.next_ticket;
        self.next_ticket += 1;
        slot.ticket = t;
        self.busy += 1;
        Ok(t)
    }

    /// Moves the tickets of slots whose event has fired to `done`
    /// (`Backend::poll`).
    pub(super) fn poll_slots(&mut self, done: &mut Vec<Ticket>) -> Result<()> {
        if self.busy == 0 {
            return Ok(());
        }
        for s in &mut self.slots {
            if s.ticket == 0 {
                continue;
            }
            // SAFETY: the event was created by this backend and recorded.
            if ck(unsafe { driver::event_query(s.event.raw()) }, "a launch on the GPU (cuEventQuery)")? {
                done.push(s.ticket);
                s.ticket = 0;
                self.busy -= 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::validate;
    use crate::layout::{Params, Sqe};
    use crate::ops;

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
                p: Params::pack(Kernel::Matmul.plan(), &[], &[m, nn, k]),
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

/// A user's launch's key in `UserModule::funcs` (and `user_smem_max`):
/// the kernel id, or its group entries' key.
fn user_func_key(kernel: KernelRef) -> u32 {
    match kernel {
        KernelRef::UserGroup(id) => super::user_module::group_key(id),
        KernelRef::User(id) => u32::from(id),
        KernelRef::Builtin(k) => u32::from(k.id()),
    }
}
