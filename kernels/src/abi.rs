//! erlcuda kernel ABI: the one definition of what the host (gpud, stable Rust)
//! and the device code (`kernels/`, nvptx64) agree on.
//!
//! This file is plain `#[repr(C)]` Rust with no dependencies and nothing
//! nvptx-specific, so gpud includes the very same file:
//!
//! ```ignore
//! #[path = "../../kernels/src/abi.rs"]
//! mod abi;
//! ```
//!
//! Conventions for every kernel:
//! * device pointers are `u64` (a device address, or a device-mapped host
//!   address from `cuMemHostRegister`); element type is `f32` (`f64` for
//!   `matmul_batch_f64`, whose ABI is [`matmul_f64_abi`]);
//! * the descriptor table itself lives in device memory (or device-mapped host
//!   memory) and is passed as the first kernel parameter (a pointer);
//! * scalar kernel parameters are `u32` and follow the table pointer in the
//!   order documented per kernel;
//! * every kernel is *grid-stride* over "virtual blocks": any `grid.x` in
//!   `1..=total` is correct; [`grid_for`] gives the recommended one.
//!   `grid.y = grid.z = 1`, `block = (THREADS, 1, 1)`;
//! * a launch with `total == 0` must be skipped (grid.x = 0 is invalid);
//! * inputs must not overlap outputs (except `vector_add`, where `out` may be
//!   exactly `a` or `b`); outputs of different jobs must not overlap;
//! * alignment is not required: 16-byte aligned pointers (and, for matmul,
//!   `k % 4 == 0` / `n % 4 == 0`) take the vectorised paths.
//!
//! # `vector_add_batch`  — `out[i] = a[i] + b[i]`
//! * params: `(jobs: u64 -> [VecAddJob; njobs], njobs: u32, total_blocks: u32)`
//! * block `(VADD_THREADS,1,1)`, grid `(grid_for(total_blocks, VADD_MAX_GRID),1,1)`,
//!   dynamic shared memory 0.
//! * host prep: [`vadd_prepare`] fills `block_start` (an exclusive prefix of
//!   `ceil(len / VADD_ELEMS_PER_BLOCK)`) and returns `total_blocks`.
//!
//! # `reduce_batch` / `dot_batch`  — `*out = Σ a[i]` / `*out = Σ a[i]·b[i]`
//! * params: `(jobs: u64 -> [ReduceJob; n_small+n_medium+n_large], n_small: u32,
//!   n_medium: u32, n_large: u32, total_blocks: u32)`
//! * block `(REDUCE_THREADS,1,1)`, grid `(grid_for(total_blocks, REDUCE_MAX_GRID),1,1)`,
//!   dynamic shared memory [`REDUCE_SMEM_BYTES`].
//! * host prep: [`reduce_prepare`] reorders the table into small | medium |
//!   large (by [`reduce_strategy`]), fills `block_start` of the large jobs and
//!   returns the [`ReducePlan`] (the four scalar params). Each job's result
//!   goes to its own `out`, so the reordering is invisible to the caller.
//! * **the `out` of every Large job must hold `0.0` before the launch**: its
//!   blocks add their partial sums into it with `red.global.add.f32` (order,
//!   hence the last bits, may vary from run to run). Small and medium jobs
//!   overwrite `out`. Zeroing all outputs is always fine.
//! * strategies: Small (`len <= REDUCE_SMALL_MAX`): one warp per job, 8 jobs
//!   per block; Medium (`len <= REDUCE_MEDIUM_MAX`): one block per job;
//!   Large: `ceil(len / REDUCE_LARGE_CHUNK)` blocks per job.
//! * `b` is ignored by `reduce_batch` (set it to 0).
//!
//! # `matmul_batch` (and `matmul_batch_bk16`) — `C(m×n) = A(m×k) · B(k×n)`, row-major
//! * params: `(jobs: u64 -> [MatmulJob; njobs], njobs: u32, total_tiles: u32)`
//! * block `(MATMUL_THREADS,1,1)`, grid `(grid_for(total_tiles, MATMUL_MAX_GRID),1,1)`,
//!   dynamic shared memory [`MATMUL_SMEM_BYTES`] (below the 48 KiB default, so
//!   no `cuFuncSetAttribute` needed).
//! * host prep: [`matmul_prepare`] fills `tiles_n` and `tile_start` (exclusive
//!   prefix of `ceil(m/128)·ceil(n/128)`) and returns `total_tiles`.
//! * any `m, n, k` (`k == 0` writes zeros; `m == 0` or `n == 0` does nothing).
//! * `matmul_batch` uses a 128×128×8 tile, `matmul_batch_bk16` 128×128×16;
//!   same ABI, pick by [`MATMUL_ENTRY`] (bk16, the faster on an H200).
//! * every kernel is assembled with `.maxntid 256,1,1`: a launch with more
//!   than 256 threads per block fails (`CUDA_ERROR_INVALID_VALUE`).

#![allow(dead_code)]

/// Kernel entry names in the PTX module.
pub const ENTRY_VECTOR_ADD: &str = "vector_add_batch";
pub const ENTRY_REDUCE: &str = "reduce_batch";
pub const ENTRY_DOT: &str = "dot_batch";
/// The matmul entry the host should use: the faster of the two as measured
/// on an H200 at 4096^3 (bk16 43.9 TFLOP/s, bk8 41.8, cuBLAS SGEMM 49.8;
/// kernels/RESULTS.md). Both are correct on any CC >= 7.0.
pub const MATMUL_ENTRY: &str = ENTRY_MATMUL_BK16;
pub const ENTRY_MATMUL: &str = "matmul_batch";
pub const ENTRY_MATMUL_BK16: &str = "matmul_batch_bk16";

/// File name `kernels/build.sh OUT_DIR` writes.
pub const PTX_FILE_NAME: &str = "erlcuda_kernels.ptx";

// ---------------------------------------------------------------- vector_add

pub const VADD_THREADS: u32 = 256;
/// Elements one (virtual) block handles: 256 threads × 4 float4.
pub const VADD_ELEMS_PER_BLOCK: u64 = 4096;
pub const VADD_MAX_GRID: u32 = 132 * 64;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VecAddJob {
    pub a: u64,
    pub b: u64,
    pub out: u64,
    /// Number of f32 elements.
    pub len: u64,
    /// First virtual block of this job (exclusive prefix over jobs); set by
    /// [`vadd_prepare`].
    pub block_start: u64,
}

pub const fn div_ceil_u64(a: u64, b: u64) -> u64 {
    if a == 0 { 0 } else { 1 + (a - 1) / b }
}

pub const fn vadd_blocks(len: u64) -> u64 {
    div_ceil_u64(len, VADD_ELEMS_PER_BLOCK)
}

/// Fills `block_start` and returns `total_blocks`, or `None` if the total
/// does not fit the kernel's `u32` parameter.
pub fn vadd_prepare(jobs: &mut [VecAddJob]) -> Option<u32> {
    let mut acc: u64 = 0;
    for j in jobs.iter_mut() {
        j.block_start = acc;
        acc = acc.checked_add(vadd_blocks(j.len))?;
    }
    u32::try_from(acc).ok()
}

/// Recommended grid.x for a grid-stride kernel with `total` virtual blocks.
pub fn grid_for(total: u32, max_grid: u32) -> u32 {
    if total < max_grid { total } else { max_grid }
}

// ------------------------------------------------------------ reduce / dot

pub const REDUCE_THREADS: u32 = 256;
pub const REDUCE_WARPS: u32 = REDUCE_THREADS / 32;
/// Dynamic shared memory for reduce/dot (one f32 per warp, rounded up).
pub const REDUCE_SMEM_BYTES: u32 = 64;
/// Up to this length: one warp per job.
pub const REDUCE_SMALL_MAX: u64 = 2048;
/// Up to this length: one block per job.
pub const REDUCE_MEDIUM_MAX: u64 = 65536;
/// Above `REDUCE_MEDIUM_MAX`: one block per chunk of this many elements
/// (a multiple of 4, so chunks keep the base pointer's alignment).
pub const REDUCE_LARGE_CHUNK: u64 = 65536;
pub const REDUCE_MAX_GRID: u32 = 132 * 64;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReduceJob {
    pub a: u64,
    /// Second operand for `dot_batch`; ignored by `reduce_batch`.
    pub b: u64,
    /// Device pointer to ONE f32 result.
    pub out: u64,
    pub len: u64,
    /// Large jobs only: first block of this job counted from the first
    /// large block (exclusive prefix over the large jobs); set by
    /// [`reduce_prepare`]. Unused for small/medium jobs.
    pub block_start: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceStrategy {
    /// one warp per job
    Small,
    /// one block per job
    Medium,
    /// several blocks per job, partials added atomically into `out`
    Large,
}

pub const fn reduce_strategy(len: u64) -> ReduceStrategy {
    if len <= REDUCE_SMALL_MAX {
        ReduceStrategy::Small
    } else if len <= REDUCE_MEDIUM_MAX {
        ReduceStrategy::Medium
    } else {
        ReduceStrategy::Large
    }
}

/// The scalar kernel parameters of `reduce_batch` / `dot_batch`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReducePlan {
    pub n_small: u32,
    pub n_medium: u32,
    pub n_large: u32,
    /// ceil(n_small / REDUCE_WARPS) + n_medium + Σ large blocks
    pub total_blocks: u32,
}

pub const fn reduce_small_blocks(n_small: u32) -> u32 {
    (n_small + REDUCE_WARPS - 1) / REDUCE_WARPS
}

/// Reorders `jobs` in place into small | medium | large (not stable), fills
/// the large jobs' `block_start`, and returns the plan; `None` if a count
/// does not fit `u32`.
pub fn reduce_prepare(jobs: &mut [ReduceJob]) -> Option<ReducePlan> {
    // Dutch-flag partition: [0,lo) small, [lo,mid) medium, [hi,len) large.
    let (mut lo, mut mid, mut hi) = (0usize, 0usize, jobs.len());
    while mid < hi {
        match reduce_strategy(jobs[mid].len) {
            ReduceStrategy::Small => {
                jobs.swap(lo, mid);
                lo += 1;
                mid += 1;
            }
            ReduceStrategy::Medium => mid += 1,
            ReduceStrategy::Large => {
                hi -= 1;
                jobs.swap(mid, hi);
            }
        }
    }
    let mut large_blocks: u64 = 0;
    for j in jobs[hi..].iter_mut() {
        j.block_start = large_blocks;
        large_blocks = large_blocks.checked_add(div_ceil_u64(j.len, REDUCE_LARGE_CHUNK))?;
    }
    for j in jobs[..hi].iter_mut() {
        j.block_start = 0;
    }
    let n_small = u32::try_from(lo).ok()?;
    let n_medium = u32::try_from(hi - lo).ok()?;
    let n_large = u32::try_from(jobs.len() - hi).ok()?;
    let total = (reduce_small_blocks(n_small) as u64)
        .checked_add(n_medium as u64)?
        .checked_add(large_blocks)?;
    Some(ReducePlan { n_small, n_medium, n_large, total_blocks: u32::try_from(total).ok()? })
}

// ------------------------------------------------------------------ matmul

pub const MATMUL_THREADS: u32 = 256;
pub const MATMUL_BM: u32 = 128;
pub const MATMUL_BN: u32 = 128;
/// Shared-memory row stride (floats) of the transposed A tile (BM + 4 pad).
pub const MATMUL_LDA_S: u32 = MATMUL_BM + 4;
pub const MATMUL_LDB_S: u32 = MATMUL_BN;
/// Largest BK among the entries (matmul_batch: 8, matmul_batch_bk16: 16).
pub const MATMUL_BK_MAX: u32 = 16;
/// Dynamic shared memory for either matmul entry: two stages of
/// A^T[BK][BM+4] and B[BK][BN] f32 at the largest BK (33,280 bytes).
pub const MATMUL_SMEM_BYTES: u32 = 2 * MATMUL_BK_MAX * (MATMUL_LDA_S + MATMUL_LDB_S) * 4;
/// Tile rows grouped together in the launch order (L2 reuse).
pub const MATMUL_GROUP_M: u32 = 8;
pub const MATMUL_MAX_GRID: u32 = i32::MAX as u32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulJob {
    /// A: m×k row-major
    pub a: u64,
    /// B: k×n row-major
    pub b: u64,
    /// C: m×n row-major (fully overwritten)
    pub c: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// ceil(n / MATMUL_BN); set by [`matmul_prepare`].
    pub tiles_n: u32,
    /// First tile (block) of this job, exclusive prefix; set by [`matmul_prepare`].
    pub tile_start: u64,
}

pub const fn matmul_tiles(m: u32, n: u32) -> u64 {
    div_ceil_u64(m as u64, MATMUL_BM as u64) * div_ceil_u64(n as u64, MATMUL_BN as u64)
}

/// Fills `tiles_n` / `tile_start` and returns `total_tiles`, or `None` if it
/// does not fit `u32`.
pub fn matmul_prepare(jobs: &mut [MatmulJob]) -> Option<u32> {
    let mut acc: u64 = 0;
    for j in jobs.iter_mut() {
        j.tiles_n = div_ceil_u64(j.n as u64, MATMUL_BN as u64) as u32;
        j.tile_start = acc;
        acc = acc.checked_add(matmul_tiles(j.m, j.n))?;
    }
    u32::try_from(acc).ok()
}

// Layout checks (compile-time, on both sides).
const _: () = assert!(core::mem::size_of::<VecAddJob>() == 40);
const _: () = assert!(core::mem::size_of::<ReduceJob>() == 40);
const _: () = assert!(core::mem::size_of::<MatmulJob>() == 48);
const _: () = assert!(MATMUL_SMEM_BYTES == 33_280);
const _: () = assert!(REDUCE_LARGE_CHUNK % 4 == 0 && REDUCE_SMEM_BYTES >= 4 * REDUCE_WARPS);

// f64 matmul (`matmul_batch_f64`): its own tile size and host prep.
#[path = "matmul_f64_abi.rs"]
pub mod matmul_f64_abi;
