//! The job ABI of kernels written with `erlcuda-kernel` (users' kernels,
//! and the built-ins re-expressed with it): the one definition that the
//! device code, the host (CPU) code and gpud agree on.
//!
//! Plain `#[repr(C)]` Rust with no dependencies and nothing target-specific,
//! so gpud includes this very file (`#[path = ".../kernels/kit/src/job.rs"]`).
//!
//! # Entries
//! A kernel `NAME` declared for element type `TY` (`f32`, `f64`) yields
//! * the PTX entry `NAME_TY(jobs: u64 -> [Job; njobs], njobs: u32, total_blocks: u32)`:
//!   parameters of sizes 8, 4, 4 at offsets 0, 8, 12 (gpud checks them with
//!   `cuFuncGetParamInfo` before it runs the module);
//! * the host symbol `erlcuda_host_NAME_TY(job: *const Job)` (C ABI) in the
//!   crate's host library: runs one whole job on the CPU;
//! * one line of the module's manifest (see [`MANIFEST_MAGIC`]).
//!
//! # Launch
//! One launch serves every coalesced job of one kernel, element type and
//! launch options. Virtual blocks are numbered across the launch: job `j`
//! owns `[jobs[j].block_start, jobs[j+1].block_start)` (its count comes from
//! the kernel's `blocks` rule, [`blocks_of`]). Every entry is grid-stride over
//! `0..total_blocks` with stride `gridDim.x`, so any `grid.x >= 1` is correct;
//! `block = (threads, 1, 1)`; a launch with `total_blocks == 0` is skipped.
//! Outputs of different jobs never overlap; an output never overlaps an input.

/// The first line of a manifest: `erlcuda-module 1`. Each further line is
/// `kernel NAME shape=S args=SIG types=T,.. out=O blocks=B threads=N shared=BYTES`:
/// * `shape`: `elementwise` | `reduction` | `table`;
/// * `args`: one letter per Erlang argument, in order: `v` vector, `s` scalar
///   (f64 in the parameter area), `d` dimension (u32); 1 or 2 `v`;
/// * `types`: the element types (`f32`, `f64`), one entry each;
/// * `out`: the output's length: `n` (the vectors' length), `1`, or `n/dI`
///   (n divided by dimension argument I, counted among the `d`s from 0);
/// * `blocks`: virtual blocks per job: `elements` (ceil(n / (threads ·
///   [`ELEMS_PER_THREAD`]))), `chunks` (ceil(n / (threads · [`SERIAL`]))),
///   `one`, or `n/dI`;
/// * `threads`: the block size unless the launch says `{block, B}`;
/// * `shared`: dynamic shared memory bytes unless the launch says
///   `{shared_bytes, S}`.
/// Every vector of a job has the same length `n`; when `out` or `blocks` is
/// `n/dI`, dimension I is at least 1 and divides `n`.
pub const MANIFEST_MAGIC: &str = "erlcuda-module 1";

/// One job of a launch: 64 bytes. On the device the addresses are device
/// addresses; on the host (the CPU backend) host addresses and
/// `block_start == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Job {
    /// Vector arguments in signature order (0 when the kernel takes one).
    pub vec: [u64; 2],
    /// The output: `out_len` elements.
    pub out: u64,
    /// Length of every vector argument, in elements.
    pub n: u64,
    pub out_len: u64,
    /// This job's first virtual block in the launch.
    pub block_start: u64,
    /// The scalar and dimension arguments, packed in signature order exactly
    /// as in the submission's parameter area: an `s` takes the next 8-aligned
    /// f64, a `d` the next u32 ([`param_offsets`]).
    pub params: [u8; PARAM_BYTES],
}

const _: () = assert!(core::mem::size_of::<Job>() == 64);

pub const PARAM_BYTES: usize = 16;
/// Elements per thread per virtual block of an `elementwise` kernel.
pub const ELEMS_PER_THREAD: u64 = 4;
/// Terms each thread of a `reduction` adds serially per virtual block; a
/// block's partial then goes through a tree (depth log2(threads)) and one
/// atomic addition into the job's output, which starts at 0.
pub const SERIAL: u64 = 256;
/// The block size when a kernel declares none.
pub const DEFAULT_THREADS: u32 = 256;
/// Limits on the launch options `{block, B}` and `{shared_bytes, S}`.
pub const MAX_THREADS: u32 = 1024;
pub const MAX_SHARED_BYTES: u32 = 48 * 1024;

/// Byte offsets in [`Job::params`] of the signature's `s` and `d` arguments
/// in order (`v`s take none), and the bytes used; `None` when the signature
/// does not fit [`PARAM_BYTES`] or holds another letter.
pub const fn param_offsets(sig: &[u8]) -> Option<([usize; PARAM_BYTES / 4], usize, usize)> {
    let mut offs = [0usize; PARAM_BYTES / 4];
    let (mut at, mut count, mut i) = (0usize, 0usize, 0usize);
    while i < sig.len() {
        match sig[i] {
            b'v' => {}
            b's' => {
                at = (at + 7) / 8 * 8;
                if at + 8 > PARAM_BYTES {
                    return None;
                }
                offs[count] = at;
                count += 1;
                at += 8;
            }
            b'd' => {
                if at + 4 > PARAM_BYTES {
                    return None;
                }
                offs[count] = at;
                count += 1;
                at += 4;
            }
            _ => return None,
        }
        i += 1;
    }
    Some((offs, count, at))
}

impl Job {
    /// The f64 at byte `off` of the parameter area.
    pub fn param_f64(&self, off: usize) -> f64 {
        let mut b = [0u8; 8];
        let mut i = 0;
        while i < 8 {
            b[i] = self.params[off + i];
            i += 1;
        }
        f64::from_ne_bytes(b)
    }
    /// The u32 at byte `off` of the parameter area.
    pub fn param_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes([self.params[off], self.params[off + 1], self.params[off + 2], self.params[off + 3]])
    }
}

/// `ceil(a / b)` (b > 0).
pub const fn div_ceil(a: u64, b: u64) -> u64 {
    a / b + (a % b != 0) as u64
}

/// How many virtual blocks a job takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocks {
    /// ceil(n / (threads · ELEMS_PER_THREAD))
    Elements,
    /// ceil(n / (threads · SERIAL))
    Chunks,
    /// one per job
    One,
    /// n / dim I (one per row of length dim I)
    PerDim(u8),
}

/// Virtual blocks of one job of length `n` with `threads` per block and
/// dimension arguments `dims`; dims named by the rule are ≥ 1 (validated).
pub const fn blocks_of(rule: Blocks, n: u64, threads: u32, dims: &[u32]) -> u64 {
    match rule {
        Blocks::Elements => div_ceil(n, threads as u64 * ELEMS_PER_THREAD),
        Blocks::Chunks => div_ceil(n, threads as u64 * SERIAL),
        Blocks::One => 1,
        Blocks::PerDim(i) => n / dims[i as usize] as u64,
    }
}

/// Fills `block_start` (an exclusive prefix of each job's block count) and
/// returns the launch's total, or `None` when it would not fit a u32 (the
/// caller splits the batch).
pub fn prepare(jobs: &mut [Job], mut blocks: impl FnMut(&Job) -> u64) -> Option<u32> {
    let mut total = 0u64;
    for j in jobs.iter_mut() {
        j.block_start = total;
        total = total.checked_add(blocks(j))?;
    }
    u32::try_from(total).ok()
}

/// The job owning virtual block `vb`: the last `j` with
/// `block_start(j) <= vb` (jobs with no blocks are skipped over).
#[inline(always)]
pub fn owner(njobs: u32, vb: u64, block_start: impl Fn(u32) -> u64) -> u32 {
    let (mut lo, mut hi) = (0u32, njobs);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if block_start(mid) <= vb {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}
