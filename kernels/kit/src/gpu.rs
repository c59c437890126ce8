//! The device side of the kernel macros (nvptx64): what the entries they
//! generate run. Every entry is grid-stride over the launch's virtual
//! blocks (stride `gridDim.x`), finds each block's job by binary search
//! over `block_start` ([`owner`]), and works with `blockDim.x` threads,
//! so any grid and any `{block, B}` the kernel's block rule allows are
//! correct. Jobs are read in place in the launch's job table (256 bytes
//! each; only the fields a kernel uses are loaded).

use crate::args::scalars;
use crate::device::{block_dim, block_idx, block_sum_first, grid_dim, smem_base, sync_threads, thread_idx};
use crate::job::{owner, Job, ELEMS_PER_THREAD, SERIAL};
use crate::Float;
use core::array::from_fn;

/// The first output's slot.
const OUT0: usize = Job::out_slot(0);

/// Groups of 4 consecutive elements (one 16-byte vector of f32, two of
/// f64) each thread of an elementwise kernel handles per virtual block.
const GROUPS: usize = (ELEMS_PER_THREAD / 4) as usize;
const _: () = assert!(ELEMS_PER_THREAD.is_multiple_of(4) && GROUPS > 0);

/// The job owning virtual block `vb`.
#[inline(always)]
pub unsafe fn job_at<'a>(jobs: *const Job, njobs: u32, vb: u64) -> &'a Job {
    let j = owner(njobs, vb, |i| (*jobs.add(i as usize)).block_start);
    &*jobs.add(j as usize)
}

/// The common length of the first `NV` vectors (and the first output,
/// with `with_out`): gpud checked they agree; the minimum keeps a job that
/// says otherwise inside every slot.
#[inline(always)]
fn common_len<const NV: usize>(job: &Job, with_out: bool) -> u64 {
    let mut n = if with_out { job.len[OUT0] } else { u32::MAX };
    for l in &job.len[..NV] {
        n = n.min(*l);
    }
    n as u64
}

/// `elementwise!`: `out[i] = f([vectors at i], scalars)`. Virtual block `b`
/// of a job covers elements `[b·B·4, (b+1)·B·4)` (B = blockDim.x).
#[inline(always)]
pub unsafe fn elementwise<T: Float, const NV: usize, const NS: usize>(
    jobs: *const Job,
    njobs: u32,
    total_blocks: u32,
    f: impl Fn([T; NV], &[T; NS]) -> T,
) {
    let (t, bd) = (thread_idx() as u64, block_dim() as u64);
    let mut vb = block_idx();
    while vb < total_blocks {
        let job = job_at(jobs, njobs, vb as u64);
        let sc = scalars::<T, NS>(job);
        let base = (vb as u64 - job.block_start) * bd * ELEMS_PER_THREAD;
        elementwise_block(job, base, t, bd, |v| f(v, &sc));
        vb += grid_dim();
    }
}

/// One virtual block of an elementwise job from element `base`. When every
/// pointer is 16-byte aligned, thread `t` takes groups of 4 consecutive
/// elements at `base + 4(t + B·g)` as vectors, all groups' loads issued
/// before any store (read-only loads: inputs never overlap the output);
/// otherwise elements `base + t + B·i` (coalesced).
#[inline(always)]
unsafe fn elementwise_block<T: Float, const NV: usize>(job: &Job, base: u64, t: u64, bd: u64, f: impl Fn([T; NV]) -> T) {
    let ins: [*const T; NV] = from_fn(|i| job.addr[i] as *const T);
    let out = job.addr[OUT0] as *mut T;
    let n = common_len::<NV>(job, true);
    let one = |e: u64| f(from_fn(|i| T::ldg_nc(ins[i].add(e as usize))));
    if ins.iter().fold(out as u64, |a, &p| a | p as u64) & 15 == 0 {
        let e: [u64; GROUPS] = from_fn(|g| base + 4 * (t + bd * g as u64));
        let xs: [Option<[[T; 4]; NV]>; GROUPS] =
            from_fn(|g| (e[g] + 4 <= n).then(|| from_fn(|i| T::ldg4_nc(ins[i].add(e[g] as usize)))));
        for g in 0..GROUPS {
            match xs[g] {
                Some(x) => T::stg4(out.add(e[g] as usize), from_fn(|q| f(from_fn(|i| x[i][q])))),
                None => {
                    for e in e[g]..n.min(e[g] + 4) {
                        T::stg(out.add(e as usize), one(e));
                    }
                }
            }
        }
    } else {
        for i in 0..ELEMS_PER_THREAD {
            let e = base + t + bd * i;
            if e < n {
                T::stg(out.add(e as usize), one(e));
            }
        }
    }
}

/// `reduction!`: `out[0] = Σ term([vectors at i], scalars)`. Virtual block
/// `b` of a job sums elements `[b·B·SERIAL, (b+1)·B·SERIAL)`: each thread
/// at most SERIAL terms ([`partial`]), then the block tree
/// ([`block_sum_first`], depth 5 + 5), then one `red.global.add` into the
/// job's output, which gpud zeroed.
#[inline(always)]
pub unsafe fn reduction<T: Float, const NV: usize, const NS: usize>(
    jobs: *const Job,
    njobs: u32,
    total_blocks: u32,
    term: impl Fn([T; NV], &[T; NS]) -> T,
) {
    let smem = smem_base();
    let (t, bd) = (thread_idx() as u64, block_dim() as u64);
    let mut vb = block_idx();
    while vb < total_blocks {
        let job = job_at(jobs, njobs, vb as u64);
        // Every field before the loop (the output's address too): kept in
        // registers, not the job's address to reload them after the barrier
        // (which cost a reduction! over f32 an 8-byte spill on sm_90).
        let out = job.addr[OUT0] as *mut T;
        let sc = scalars::<T, NS>(job);
        // A multiple of 4 elements: chunks keep the base's 16-byte alignment.
        let lo = (vb as u64 - job.block_start) * bd * SERIAL;
        let hi = common_len::<NV>(job, false).min(lo + bd * SERIAL);
        let ins: [*const T; NV] = from_fn(|i| job.addr[i] as *const T);
        let s = partial(ins, lo, hi, t, bd, |v| term(v, &sc));
        let s = block_sum_first(s, smem, (bd >> 5) as u32);
        if t == 0 {
            T::red_add(out, s);
        }
        vb += grid_dim();
    }
}

/// This thread's partial sum of `term` over elements `lo..hi` of the
/// vectors `ins`, threads `t` of `nt` (even) striding through them. A
/// thread sees at most `(hi - lo) / nt` elements; when every vector is
/// 16-byte aligned at `lo` they are loaded 2 groups of 4 at a time into 8
/// accumulators, otherwise one at a time into one accumulator (f32: `acc[e
/// & 1]` with an even stride is one accumulator too). The built-in
/// reduce/dot use it as well.
#[inline(always)]
pub unsafe fn partial<T: Float, const NV: usize>(
    ins: [*const T; NV],
    lo: u64,
    hi: u64,
    t: u64,
    nt: u64,
    term: impl Fn([T; NV]) -> T,
) -> T {
    let p: [*const T; NV] = from_fn(|i| ins[i].add(lo as usize));
    let n = hi - lo;
    let mut acc = [T::ZERO; 8];
    let mut tail_from = 0u64;
    if p.iter().fold(0u64, |a, &q| a | q as u64) & 15 == 0 {
        let n4 = n / 4;
        let mut i = t;
        while i + nt < n4 {
            let x0: [[T; 4]; NV] = from_fn(|k| T::ldg4_nc(p[k].add(4 * i as usize)));
            let x1: [[T; 4]; NV] = from_fn(|k| T::ldg4_nc(p[k].add(4 * (i + nt) as usize)));
            for q in 0..4 {
                acc[q] += term(from_fn(|k| x0[k][q]));
                acc[4 + q] += term(from_fn(|k| x1[k][q]));
            }
            i += 2 * nt;
        }
        if i < n4 {
            let x0: [[T; 4]; NV] = from_fn(|k| T::ldg4_nc(p[k].add(4 * i as usize)));
            for q in 0..4 {
                acc[q] += term(from_fn(|k| x0[k][q]));
            }
        }
        tail_from = n4 * 4;
    }
    let mut e = tail_from + t;
    while e < n {
        let v = term(from_fn(|k| T::ldg_nc(p[k].add(e as usize))));
        // f64 names its accumulator statically (a select between two f64
        // accumulators cost reduce_f64 an 8-byte ptxas spill on sm_90).
        if T::BYTES == 8 {
            acc[0] += v;
        } else {
            acc[(e & 1) as usize] += v;
        }
        e += nt;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

/// `kernel!` and `table!`: `body(job, block)` for every virtual block,
/// `block` counted within its job. A barrier after each, so a body may use
/// shared memory freely without racing the next virtual block's body
/// (`next_block`).
#[inline(always)]
pub unsafe fn each_block(jobs: *const Job, njobs: u32, total_blocks: u32, body: impl Fn(&Job, u64)) {
    let mut vb = block_idx();
    while vb < total_blocks {
        let job = job_at(jobs, njobs, vb as u64);
        body(job, vb as u64 - job.block_start);
        vb = next_block(vb, total_blocks);
    }
}

/// The next virtual block of this thread after `vb`'s, behind the barrier
/// that ends `vb`'s body. The GPU waits after the last one too (its PTX is
/// as it was). On the host (the emulator) the last one's is left out: no
/// shared memory use follows it (another virtual block follows in every
/// thread of the block or in none: `vb` and `gridDim.x` are the block's),
/// and without it a body that has no barrier of its own runs without a
/// coroutine per thread (crate::emu, the runner). A thread whose body
/// waits at a barrier the others do not reach is a divergent barrier
/// either way: they return instead of waiting here.
#[inline(always)]
fn next_block(vb: u32, total_blocks: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let _ = total_blocks;
        sync_threads();
        vb + grid_dim()
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let next = vb + grid_dim();
        if next < total_blocks {
            sync_threads();
        }
        next
    }
}

/// A `kernel!`'s group entry: `body(first, n, block)` for every virtual
/// block of a group launch, block `b` taking jobs `b * per_block ..` (at
/// most `per_block` of them, `n`), `total_blocks` being
/// `ceil(njobs / per_block)`. A barrier after each, as [`each_block`].
#[inline(always)]
pub unsafe fn each_group(jobs: *const Job, njobs: u32, total_blocks: u32, per_block: u32, body: impl Fn(*const Job, u32, u64)) {
    let mut vb = block_idx();
    while vb < total_blocks {
        let first = vb * per_block;
        if first < njobs {
            body(jobs.add(first as usize), (njobs - first).min(per_block), vb as u64);
        }
        vb = next_block(vb, total_blocks);
    }
}
