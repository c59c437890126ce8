//! The host (CPU backend) side of the kernel macros: what the
//! `erlcuda_host_NAME[_TY](job)` entries they generate run, one whole job
//! on the calling thread. Addresses in the job are host addresses.

use crate::args::{scalars, slice, slice_mut, Args};
use crate::job::{Job, DEFAULT_THREADS, SERIAL};
use crate::manifest::Layout;
use crate::Float;
use core::array::from_fn;

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
/// block per virtual block ([`crate::emu`]), in order: block `b` has
/// `block_idx` b of `grid_dim` n, so the entry's grid-stride loop takes
/// exactly virtual block b. `launch` is the kernel's `(threads, shared)`,
/// which the job's launch options (`{block, B}`, `{shared_bytes, S}`)
/// override as on the GPU; `t_bytes` the size of its T (0: none). The
/// body gets the job's argument addresses tagged with their slots, so
/// that its accesses through the kit are checked against each argument's
/// extent (its length in elements of its declared type); with
/// [`OPT_THREAD_ORDER`](crate::job::OPT_THREAD_ORDER), its threads run in
/// the order the job's seed draws. Returns 0, or 1 with `fault` filled at
/// the first faulting block (the blocks after it do not run).
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
    entry: impl Fn(*const Job, u32, u32),
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
    for b in 0..n {
        let dims = Dims { block: (threads, 1), grid: (n, 1), shared_bytes: shared };
        if let Err(f) = run_block_checked(dims, (b, 0), order, Some(&ext), &|| entry(&one, 1, n)) {
            *fault = job_fault(&f, b);
            return 1;
        }
    }
    0
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
/// jobs, `ceil(njobs / per_block)` emulated blocks in order, as
/// [`run_gpu`] runs one job's. The jobs share their launch options (gpud
/// groups only jobs of one geometry). Returns 0, or 1 with `fault` filled
/// at the first faulting block.
///
/// # Safety
/// As [`crate::Group::new`].
pub unsafe fn run_gpu_group(
    jobs: *const Job,
    njobs: u32,
    launch: (u32, u32),
    per_block: u32,
    fault: &mut crate::job::Fault,
    entry: impl Fn(*const Job, u32, u32),
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
    for b in 0..n {
        let dims = Dims { block: (threads, 1), grid: (n, 1), shared_bytes: shared };
        if let Err(f) = run_block_checked(dims, (b, 0), order, None, &|| entry(jobs, njobs, n)) {
            *fault = job_fault(&f, b);
            return 1;
        }
    }
    0
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
