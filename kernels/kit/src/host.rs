//! The host (CPU backend) side of the kernel macros: what the
//! `erlcuda_host_NAME[_TY](job)` entries they generate run, one whole job
//! on the calling thread. Addresses in the job are host addresses.

use crate::args::{scalars, slice, slice_mut, Args};
use crate::job::{Job, DEFAULT_THREADS, SERIAL};
use crate::manifest::Layout;
use crate::Float;
use core::array::from_fn;

// The blocks' pool (each_block); the crate is no_std for the GPU.
extern crate std;
use std::{format, vec::Vec};

/// The first output's slot.
const OUT0: usize = Job::out_slot(0);

/// The common length of the first `NV` vectors and the first output:
/// every one has `n` elements (gpud checked it); the minimum keeps a job
/// that says otherwise inside every slot.
#[inline(always)]
fn common_len<const NV: usize>(job: &Job, with_out: bool) -> u64 {
    let mut n = if with_out { job.len[OUT0] } else { u32::MAX };
    for l in &job.len[..NV] {
        n = n.min(*l);
    }
    n as u64
}

/// `elementwise!`: `out[i] = f([vectors at i], scalars)` for i < n.
///
/// # Safety
/// Slots `0..NV` and the output hold their `len` elements of `T`, the
/// output disjoint from the inputs.
pub unsafe fn elementwise<T: Float, const NV: usize, const NS: usize>(job: &Job, f: impl Fn([T; NV], &[T; NS]) -> T) {
    let sc = scalars::<T, NS>(job);
    let n = common_len::<NV>(job, true);
    let ins: [&[T]; NV] = from_fn(|i| slice(job.addr[i] as *const T, n));
    let out = slice_mut(job.addr[OUT0] as *mut T, n);
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: every input has n elements, i < n.
        *o = f(from_fn(|k| *ins[k].get_unchecked(i)), &sc);
    }
}

/// `reduction!`: `out[0] = Σ term([vectors at i], scalars)` in the order
/// of [`sum`].
///
/// # Safety
/// Slots `0..NV` hold their `len` elements of `T`, the output one.
pub unsafe fn reduction<T: Float, const NV: usize, const NS: usize>(job: &Job, term: impl Fn([T; NV], &[T; NS]) -> T) {
    if job.len[OUT0] == 0 {
        return;
    }
    let sc = scalars::<T, NS>(job);
    let n = common_len::<NV>(job, false);
    let ins: [&[T]; NV] = from_fn(|i| slice(job.addr[i] as *const T, n));
    // SAFETY: i < n, the inputs' length.
    let s = sum(n as usize, |i| term(from_fn(|k| *ins[k].get_unchecked(i)), &sc));
    *(job.addr[OUT0] as *mut T) = s;
}

/// `kernel!` and `table!`: the kernel's CPU body, once for the whole job.
///
/// # Safety
/// As [`Args::new`].
pub unsafe fn run<T>(job: &Job, layout: &Layout, body: impl FnOnce(Args<'_, T>)) {
    body(Args::new(job, layout))
}

/// A kernel's GPU code on the CPU: its PTX entry's host twin `entry(jobs,
/// njobs, total_blocks)` run as a launch of this one job, one emulated
/// block per virtual block ([`crate::emu`]), the blocks on the kit's
/// threads as a GPU's run side by side ([`each_block`]): block `b` has
/// `block_idx` b of `grid_dim` n, so the entry's grid-stride loop takes
/// exactly virtual block b. `launch` is the kernel's `(threads, shared)`,
/// which the job's launch options (`{block, B}`, `{shared_bytes, S}`)
/// override as on the GPU; `t_bytes` the size of its T (0: none). The
/// body gets the job's argument addresses tagged with their slots, so
/// that its accesses through the kit are checked against each argument's
/// extent (its length in elements of its declared type); with
/// [`OPT_THREAD_ORDER`](crate::job::OPT_THREAD_ORDER), its threads run in
/// the order the job's seed draws, and its blocks one after another on
/// the calling thread (so that the seed replays the whole run). Returns 0,
/// or 1 with `fault` filled at the lowest faulting block.
///
/// # Safety
/// As [`Args::new`].
pub unsafe fn run_gpu(
    job: &Job,
    sig: &crate::signature::Sig,
    blocks: &crate::job::Blocks,
    launch: (u32, u32),
    t_bytes: u64,
    fault: &mut crate::job::Fault,
    entry: impl Fn(*const Job, u32, u32) + Sync,
) -> u32 {
    use crate::emu::{run_block_checked, tag, Dims, Extent, Extents, Order};
    use crate::job::OPT_BLOCK;
    use crate::job::{OPT_SHARED_BYTES, OPT_THREAD_ORDER};
    use crate::signature::{Kind, Ty};
    let threads = if job.given & OPT_BLOCK != 0 { job.block } else { launch.0 };
    let shared = if job.given & OPT_SHARED_BYTES != 0 { job.shared_bytes.max(launch.1) } else { launch.1 };
    let order = if job.given & OPT_THREAD_ORDER != 0 { Order::Seeded(u64::from(job.seed)) } else { Order::InOrder };
    // gpud counted them by the same rule; a job it refused never gets here.
    let Some(n) = blocks.of(sig, job, threads) else { return 0 };
    let Ok(n) = u32::try_from(n) else { return 0 };
    // Each declared vector and output: its extent, and its address tagged.
    let mut ext: Extents = Default::default();
    let mut one = Job { block_start: 0, ..*job };
    let elem = |t: Ty| if t == Ty::T { t_bytes } else { t.bytes() };
    let vecs = sig.args().iter().filter_map(|a| a.ty.filter(|_| matches!(a.kind, Kind::Vector | Kind::Inout)).map(|t| (a.slot as usize, t)));
    let outs = sig.outs().iter().enumerate().map(|(j, o)| (Job::out_slot(j), o.ty));
    for (slot, t) in vecs.chain(outs) {
        let e = elem(t);
        ext[slot] = Extent { base: job.addr[slot], bytes: u64::from(job.len[slot]) * e, elem: e };
        one.addr[slot] = tag(job.addr[slot], slot);
    }
    let dims = Dims { block: (threads, 1), grid: (n, 1), shared_bytes: shared };
    let one = &one;
    let run = |b: u32| run_block_checked(dims, (b, 0), order, Some(&ext), &|| entry(one, 1, n));
    match each_block(n, order == Order::InOrder, run) {
        Some((b, f)) => {
            *fault = job_fault(&f, b);
            1
        }
        None => 0,
    }
}

/// Threads of the kit's pool: `ERLCUDA_EMU_THREADS` where set (1: every
/// block on the calling thread), else the machine's cores.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let n = std::env::var("ERLCUDA_EMU_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&t| t >= 1)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        (n > 1).then(|| rayon::ThreadPoolBuilder::new().num_threads(n).thread_name(|i| format!("erlcuda-emu-{i}")).build().ok())?
    })
    .as_ref()
}

/// Blocks `0..n`, each by `run(b)`: side by side on the kit's pool where
/// `parallel` and there is more than one block and one thread (atomics and
/// races between blocks then meet as on a GPU; the emulator's state is
/// each OS thread's own), else in order here. Returns the lowest block
/// that faulted and its fault, the same whatever the interleaving: a block
/// above a fault already found is skipped, one below it always runs.
pub(crate) fn each_block(
    n: u32,
    parallel: bool,
    run: impl Fn(u32) -> Result<(), crate::emu::Fault> + Sync,
) -> Option<(u32, crate::emu::Fault)> {
    use core::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use rayon::prelude::*;
    match pool().filter(|_| parallel && n > 1) {
        None => (0..n).find_map(|b| run(b).err().map(|f| (b, f))),
        Some(p) => {
            let first = AtomicU32::new(u32::MAX);
            let faults = std::sync::Mutex::new(Vec::new());
            p.install(|| {
                (0..n).into_par_iter().for_each(|b| {
                    if b > first.load(Relaxed) {
                        return;
                    }
                    if let Err(f) = run(b) {
                        first.fetch_min(b, Relaxed);
                        faults.lock().unwrap_or_else(|e| e.into_inner()).push((b, f));
                    }
                })
            });
            faults.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().min_by_key(|&(b, _)| b)
        }
    }
}

/// An emulated block's fault as the job's answer carries it.
fn job_fault(f: &crate::emu::Fault, block: u32) -> crate::job::Fault {
    use crate::emu::Reason;
    use crate::job::{FAULT_DIVERGENT_BARRIER, FAULT_DIVERGENT_WARP_OP, FAULT_OUT_OF_BOUNDS};
    let (reason, slot, index) = match f.reason {
        Reason::DivergentBarrier => (FAULT_DIVERGENT_BARRIER, 0, 0),
        Reason::DivergentWarpOp => (FAULT_DIVERGENT_WARP_OP, 0, 0),
        Reason::OutOfBounds { slot, index } => (FAULT_OUT_OF_BOUNDS, slot, index as u64),
    };
    crate::job::Fault { reason, thread: f.thread, block: u64::from(block), slot, index, ..Default::default() }
}

/// A kernel's group GPU code on the CPU: its group entry's host twin
/// `entry(jobs, njobs, total_blocks)` run as a launch of the `njobs`
/// jobs, `ceil(njobs / per_block)` emulated blocks, side by side as
/// [`run_gpu`] runs one job's. The jobs share their launch options (gpud
/// groups only jobs of one geometry). Returns 0, or 1 with `fault` filled
/// at the lowest faulting block.
///
/// # Safety
/// As [`crate::Group::new`].
pub unsafe fn run_gpu_group(
    jobs: *const Job,
    njobs: u32,
    launch: (u32, u32),
    per_block: u32,
    fault: &mut crate::job::Fault,
    entry: impl Fn(*const Job, u32, u32) + Sync,
) -> u32 {
    use crate::emu::{run_block_checked, Dims, Order};
    use crate::job::{OPT_BLOCK, OPT_SHARED_BYTES, OPT_THREAD_ORDER};
    if njobs == 0 || per_block == 0 {
        return 0;
    }
    let first = &*jobs;
    let threads = if first.given & OPT_BLOCK != 0 { first.block } else { launch.0 };
    let shared = if first.given & OPT_SHARED_BYTES != 0 { first.shared_bytes.max(launch.1) } else { launch.1 };
    // The first job's order for the whole group. Its accesses are not
    // checked against extents: the jobs' arguments share slot numbers, so
    // a tagged address could not say whose it is (a job alone is checked).
    let order = if first.given & OPT_THREAD_ORDER != 0 { Order::Seeded(u64::from(first.seed)) } else { Order::InOrder };
    let n = njobs.div_ceil(per_block);
    let dims = Dims { block: (threads, 1), grid: (n, 1), shared_bytes: shared };
    // The table's address, to be shared by the pool's threads: the caller
    // keeps the jobs alive and unaliased for the whole call.
    let table = jobs as usize;
    let run = |b: u32| run_block_checked(dims, (b, 0), order, None, &|| entry(table as *const Job, njobs, n));
    match each_block(n, order == Order::InOrder, run) {
        Some((b, f)) => {
            *fault = job_fault(&f, b);
            1
        }
        None => 0,
    }
}

/// Terms per chunk of [`sum`]: one GPU virtual block of a reduction at the
/// default block size (65536, gpud's EC_SUM_CHUNK).
pub const SUM_CHUNK: usize = crate::sum_order::CHUNK;
const _: () = assert!(SUM_CHUNK == (DEFAULT_THREADS as u64 * SERIAL) as usize);

/// `Σ term(i)` for i < len in the element type, in the order every erlcuda
/// CPU sum follows (gpud's `ops::sum`): runs of at most SERIAL (256) terms
/// added serially, their partials combined pairwise within each chunk of
/// [`SUM_CHUNK`] terms, the chunks' partials added in index order in
/// groups (`sum_order::combine`). The GPU's order differs, its error bound
/// is the same.
pub fn sum<T: Float>(len: usize, term: impl Fn(usize) -> T) -> T {
    let chunks = len.div_ceil(SUM_CHUNK);
    let one = |c: usize| chunk_sum(c * SUM_CHUNK, len.min((c + 1) * SUM_CHUNK), &term);
    if chunks == 1 {
        return one(0);
    }
    // From +0.0 as gpud does (the sign of a zero total agrees too).
    crate::sum_order::combine(T::ZERO, chunks, one)
}

/// One chunk, in the order `sum_order.rs` defines (gpud's sums share it).
fn chunk_sum<T: Float>(lo: usize, hi: usize, term: &impl Fn(usize) -> T) -> T {
    crate::sum_order::chunk_sum(T::ZERO, lo, hi, term)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::each_block;
    use crate::emu::{Fault, Reason};
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use std::sync::Mutex;
    use std::vec::Vec;

    fn fault(b: u32) -> Fault {
        Fault { reason: Reason::DivergentBarrier, block: (b, 0), thread: 0 }
    }

    #[test]
    fn every_block_runs_once_on_the_pools_threads() {
        let runs: Vec<AtomicU32> = (0..256).map(|_| AtomicU32::new(0)).collect();
        let threads = Mutex::new(HashSet::new());
        let r = each_block(256, true, |b| {
            runs[b as usize].fetch_add(1, Relaxed);
            threads.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_micros(200));
            Ok(())
        });
        assert!(r.is_none());
        assert!(runs.iter().all(|c| c.load(Relaxed) == 1));
        // Side by side wherever the machine has more than one core.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let used = threads.into_inner().unwrap().len();
        assert!(used > 1 || cores == 1 || std::env::var("ERLCUDA_EMU_THREADS").as_deref() == Ok("1"), "{used} threads");
    }

    #[test]
    fn the_lowest_faulting_block_is_the_answer_and_every_block_below_it_runs() {
        for parallel in [true, false] {
            let ran: Vec<AtomicU32> = (0..500).map(|_| AtomicU32::new(0)).collect();
            let r = each_block(500, parallel, |b| {
                ran[b as usize].fetch_add(1, Relaxed);
                if [37, 120, 499].contains(&b) { Err(fault(b)) } else { Ok(()) }
            });
            assert_eq!(r, Some((37, fault(37))), "parallel {parallel}");
            assert!(ran[..=37].iter().all(|c| c.load(Relaxed) == 1), "parallel {parallel}");
        }
    }

    #[test]
    fn in_order_on_the_calling_thread_when_not_parallel() {
        let order = Mutex::new(Vec::new());
        let me = std::thread::current().id();
        each_block(64, false, |b| {
            assert_eq!(std::thread::current().id(), me);
            order.lock().unwrap().push(b);
            Ok(())
        });
        assert_eq!(order.into_inner().unwrap(), (0..64).collect::<Vec<_>>());
    }
}
