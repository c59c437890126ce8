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
//! Entries: every kernel file `kernels/src/<kernel>.rs` defines one entry
//! per element type, named `<kernel>_<type>` ([`ENTRY_VECTOR_ADD`] etc. are
//! the `<kernel>` prefixes; append [`Dtype::suffix`]):
//!
//! | entry | element type |
//! |---|---|
//! | `vector_add_f32`, `vector_add_f64` | f32 / f64 |
//! | `reduce_f32`, `reduce_f64` | f32 / f64 |
//! | `dot_f32`, `dot_f64` | f32 / f64 |
//! | `saxpy_f32`, `saxpy_f64` | f32 / f64 (the kit's job ABI, see below) |
//! | `matmul_f32` | f32 |
//!
//! The two entries of a kernel share its descriptor struct, launch shape
//! and host prep: only the element type behind the pointers differs (and
//! with it the size of `out` for reduce/dot). `len`, `m`, `n`, `k` count
//! elements, never bytes.
//!
//! Conventions for every kernel:
//! * device pointers are `u64` (a device address, or a device-mapped host
//!   address from `cuMemHostRegister`), pointing to elements of the entry's
//!   type;
//! * the descriptor table itself lives in device memory (or device-mapped host
//!   memory) and is passed as the first kernel parameter (a pointer);
//! * scalar kernel parameters are `u32` and follow the table pointer in the
//!   order documented per kernel;
//! * every kernel is *grid-stride* over "virtual blocks": any `grid.x` in
//!   `1..=total` is correct; [`grid_for`] gives the recommended one.
//!   `grid.y = grid.z = 1`, `block = (THREADS, 1, 1)`;
//! * a launch with `total == 0` must be skipped (grid.x = 0 is invalid);
//! * inputs must not overlap outputs (except `vector_add`, where `out` may
//!   be exactly one of the inputs); outputs of different jobs must not
//!   overlap;
//! * alignment is not required: 16-byte aligned pointers (and, for matmul,
//!   `k % 4 == 0` / `n % 4 == 0`) take the vectorised paths (for both
//!   types: 4 consecutive elements, one `v4.f32` or two `v2.f64` accesses).
//!
//! # `vector_add_{f32,f64}`  — `out[i] = a[i] + b[i]`
//! * params: `(jobs: u64 -> [VecAddJob; njobs], njobs: u32, total_blocks: u32)`
//! * block `(VADD_THREADS,1,1)`, grid `(grid_for(total_blocks, VADD_MAX_GRID),1,1)`,
//!   dynamic shared memory 0.
//! * host prep: [`vadd_prepare`] fills `block_start` (an exclusive prefix of
//!   `ceil(len / VADD_ELEMS_PER_BLOCK)`, the same for both types) and
//!   returns `total_blocks`.
//!
//! # `saxpy_{f32,f64}`  — `out[i] = alpha · x[i] + y[i]`
//! * declared with the helper crate (`saxpy.rs`, `elementwise!`): the job
//!   ABI is kernels/kit/src/job.rs (`Job`, signature `svv`: `alpha` is the
//!   f64 at byte 0 of `params`, `vec = [x, y]`), not a struct of this file;
//! * block `(job::DEFAULT_THREADS,1,1)`, dynamic shared memory 0, virtual
//!   blocks `job::blocks_of(Blocks::Elements, n, 256, &[])` per job;
//! * one fused multiply-add per element (one rounding); `saxpy_f32` rounds
//!   `alpha` to f32 first. `out` never overlaps `x` or `y`.
//!
//! # `reduce_{f32,f64}` / `dot_{f32,f64}`  — `*out = Σ a[i]` / `*out = Σ a[i]·b[i]`
//! * params: `(jobs: u64 -> [ReduceJob; n_small+n_medium+n_large], n_small: u32,
//!   n_medium: u32, n_large: u32, total_blocks: u32)`
//! * block `(REDUCE_THREADS,1,1)`, grid `(grid_for(total_blocks, REDUCE_MAX_GRID),1,1)`,
//!   dynamic shared memory [`REDUCE_SMEM_BYTES`].
//! * host prep: [`reduce_prepare`] reorders the table into small | medium |
//!   large (by [`reduce_strategy`]), fills `block_start` of the large jobs and
//!   returns the [`ReducePlan`] (the four scalar params). Each job's result
//!   goes to its own `out` (one element of the entry's type), so the
//!   reordering is invisible to the caller.
//! * **the `out` of every Large job must hold `0.0` before the launch**: its
//!   blocks add their partial sums into it with `red.global.add.f32`/`.f64`
//!   (order, hence the last bits, may vary from run to run). Small and
//!   medium jobs overwrite `out`. Zeroing all outputs is always fine.
//! * strategies: Small (`len <= REDUCE_SMALL_MAX`): one warp per job, 8 jobs
//!   per block; Medium (`len <= REDUCE_MEDIUM_MAX`): one block per job;
//!   Large: `ceil(len / REDUCE_LARGE_CHUNK)` blocks per job.
//! * accuracy (both types, accumulated in the element type): each
//!   accumulator sums at most [`SUM_SERIAL`] (256) terms serially, then a
//!   pairwise tree of depth ≤ 16, then (Large) one atomic addition per
//!   [`REDUCE_LARGE_CHUNK`] (65536) elements: |error| ≤ (256 + 16 +
//!   ceil(len/65536) + 1) · u · Σ|terms|, u = 2^-24 (f32) / 2^-53 (f64).
//! * `b` is ignored by `reduce_*` (set it to 0).
//!
//! # `matmul_f32` — `C(m×n) = A(m×k) · B(k×n)`, row-major f32
//! * params: `(jobs: u64 -> [MatmulJob; njobs], njobs: u32, total_tiles: u32,
//!   tile_rows: u32)`
//! * block `(MATMUL_THREADS,1,1)`, grid `(grid_for(total_tiles, MATMUL_MAX_GRID),1,1)`,
//!   dynamic shared memory [`matmul_smem`]`(tile_rows)` (below the 48 KiB
//!   default, so no `cuFuncSetAttribute` needed).
//! * host prep: [`matmul_prepare`] chooses `tile_rows` (256 for a launch
//!   of at least [`MATMUL_WIDE_MIN_TILES`] such tiles, 64 for one of at
//!   most [`MATMUL_NARROW_MAX_TILES`] 128-row tiles, else 128), fills
//!   `tiles_n` and `tile_start` (exclusive prefix of
//!   `ceil(m/tile_rows)·ceil(n/128)`) and returns `(total_tiles, tile_rows)`.
//! * any `m, n, k` (`k == 0` writes zeros; `m == 0` or `n == 0` does nothing).
//! * tiles 64×128×16 or 128×128×16 (`MATMUL_BK`), or 256×128×8
//!   (`MATMUL_WIDE_BK`); on an H200 at 4096^3 (2026-12-03) the launch
//!   runs on the wide tiles at 48.7 TFLOP/s, 0.956 × cuBLAS SGEMM with TF32
//!   off (128×128 alone: 0.912); at 1024^3 on the narrow ones (2026-12-04)
//!   at 1.03 × (128×128: 0.72).
//! * every kernel is assembled with `.maxntid 256,1,1`: a launch with more
//!   than 256 threads per block fails (`CUDA_ERROR_INVALID_VALUE`).

#![allow(dead_code)]

/// Kernel entry-name prefixes in the PTX module: the entry is the prefix
/// followed by [`Dtype::suffix`] (`matmul` exists for f32 only).
pub const ENTRY_VECTOR_ADD: &str = "vector_add";
pub const ENTRY_REDUCE: &str = "reduce";
pub const ENTRY_DOT: &str = "dot";
pub const ENTRY_SAXPY: &str = "saxpy";
pub const ENTRY_MATMUL: &str = "matmul";

/// Element type of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
}

impl Dtype {
    /// `"_f32"` / `"_f64"`: entry name = prefix + suffix.
    pub const fn suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "_f32",
            Dtype::F64 => "_f64",
        }
    }
    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
        }
    }
}

/// Summation contract of reduce/dot (both types): at most this many terms
/// summed serially per accumulator ...
pub const SUM_SERIAL: u64 = 256;
/// ... then a pairwise tree of at most this depth ...
pub const SUM_TREE_DEPTH: u64 = 16;
/// ... then one atomic addition per chunk of this many elements (=
/// REDUCE_LARGE_CHUNK).
pub const SUM_CHUNK: u64 = 65536;

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
    /// Number of elements.
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
/// Dynamic shared memory for reduce/dot (one partial per warp: 8 × 8 bytes
/// for f64).
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
    /// Second operand for `dot_*`; ignored by `reduce_*`.
    pub b: u64,
    /// Device pointer to ONE result element (f32 or f64, as the entry).
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

/// The scalar kernel parameters of `reduce_*` / `dot_*`.
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
/// K depth of a tile.
pub const MATMUL_BK: u32 = 16;
/// Dynamic shared memory of `matmul_f32` on `bm`-row tiles of depth `bk`:
/// two stages of A^T[bk][bm+4] and B[bk][BN] f32.
pub const fn matmul_tile_smem(bm: u32, bk: u32) -> u32 {
    2 * bk * (bm + 4 + MATMUL_LDB_S) * 4
}
/// ... on 128-row tiles (33,280 bytes).
pub const MATMUL_SMEM_BYTES: u32 = matmul_tile_smem(MATMUL_BM, MATMUL_BK);
/// The wide tile: 256×128×8, 16×8 outputs per thread (two stages, 24,832
/// bytes of shared memory). 0.949-0.960 × cuBLAS SGEMM at 2048-8192 on an
/// H200 against 0.904-0.920 for 128×128×16, but 0.38 × at 1024, where its
/// 32 tiles leave most SMs idle (H200, 2026-12-03; `bench/EXPERIMENTS.md`).
pub const MATMUL_WIDE_BM: u32 = 256;
pub const MATMUL_WIDE_BK: u32 = 8;
pub const MATMUL_WIDE_SMEM_BYTES: u32 = matmul_tile_smem(MATMUL_WIDE_BM, MATMUL_WIDE_BK);
/// A launch takes the wide tile when it makes at least this many of them
/// (half an H200's SMs: 2048^2 makes 128 and gains, 1024^2 32 and loses).
pub const MATMUL_WIDE_MIN_TILES: u32 = 64;
/// The narrow tile: 64×128×16 (4×8 outputs per thread), for launches too
/// small to fill the GPU with 128×128 tiles: at 1024^2 those are 64 tiles,
/// one block each on an H200's 132 SMs, half of them idle; 64-row tiles
/// make 128.
pub const MATMUL_NARROW_BM: u32 = 64;
pub const MATMUL_NARROW_SMEM_BYTES: u32 = matmul_tile_smem(MATMUL_NARROW_BM, MATMUL_BK);
/// A launch of at most this many 128×128 tiles (half an H200's SMs) takes
/// the narrow tile: twice as many then still run at once.
pub const MATMUL_NARROW_MAX_TILES: u32 = 66;
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
    tiles_of(m, n, MATMUL_BM, MATMUL_BN)
}

/// Tiles of `bm`×`bn` covering an m×n output.
pub const fn tiles_of(m: u32, n: u32, bm: u32, bn: u32) -> u64 {
    div_ceil_u64(m as u64, bm as u64) * div_ceil_u64(n as u64, bn as u64)
}

/// Chooses the tile height of a launch ([`MATMUL_WIDE_BM`] where it makes at
/// least [`MATMUL_WIDE_MIN_TILES`] tiles, [`MATMUL_NARROW_BM`] where
/// [`MATMUL_BM`] would make at most [`MATMUL_NARROW_MAX_TILES`], else
/// [`MATMUL_BM`]), fills
/// `tiles_n` / `tile_start` for it and returns `(total_tiles, tile_rows)`
/// (`tile_rows` is the kernel's 4th parameter; [`matmul_smem`] its shared
/// memory), or `None` if the tiles do not fit `u32`.
pub fn matmul_prepare(jobs: &mut [MatmulJob]) -> Option<(u32, u32)> {
    let wide: u64 = jobs.iter().map(|j| tiles_of(j.m, j.n, MATMUL_WIDE_BM, MATMUL_BN)).sum();
    let square: u64 = jobs.iter().map(|j| tiles_of(j.m, j.n, MATMUL_BM, MATMUL_BN)).sum();
    let rows = if wide >= MATMUL_WIDE_MIN_TILES as u64 {
        MATMUL_WIDE_BM
    } else if square <= MATMUL_NARROW_MAX_TILES as u64 {
        MATMUL_NARROW_BM
    } else {
        MATMUL_BM
    };
    Some((prepare_tiles(jobs, rows, MATMUL_BN)?, rows))
}

/// Dynamic shared memory of a `matmul_f32` launch of `tile_rows`-high tiles.
pub const fn matmul_smem(tile_rows: u32) -> u32 {
    match tile_rows {
        MATMUL_WIDE_BM => MATMUL_WIDE_SMEM_BYTES,
        MATMUL_NARROW_BM => MATMUL_NARROW_SMEM_BYTES,
        _ => MATMUL_SMEM_BYTES,
    }
}

/// `matmul_prepare` for a kernel of `bm`×`bn` tiles: fills `tiles_n`
/// (ceil(n / bn)) and `tile_start` (exclusive prefix of the tile counts),
/// returns the total, or `None` if it does not fit `u32`.
pub fn prepare_tiles(jobs: &mut [MatmulJob], bm: u32, bn: u32) -> Option<u32> {
    let mut acc: u64 = 0;
    for j in jobs.iter_mut() {
        j.tiles_n = div_ceil_u64(j.n as u64, bn as u64) as u32;
        j.tile_start = acc;
        acc = acc.checked_add(tiles_of(j.m, j.n, bm, bn))?;
    }
    u32::try_from(acc).ok()
}

// Layout checks (compile-time, on both sides).
const _: () = assert!(core::mem::size_of::<VecAddJob>() == 40);
const _: () = assert!(core::mem::size_of::<ReduceJob>() == 40);
const _: () = assert!(core::mem::size_of::<MatmulJob>() == 48);
const _: () = assert!(MATMUL_SMEM_BYTES == 33_280);
const _: () = assert!(MATMUL_WIDE_SMEM_BYTES == 24_832);
const _: () = assert!(MATMUL_NARROW_SMEM_BYTES == 25_088);
const _: () = assert!(REDUCE_LARGE_CHUNK % 4 == 0 && REDUCE_SMEM_BYTES >= 8 * REDUCE_WARPS);
const _: () = assert!(SUM_CHUNK == REDUCE_LARGE_CHUNK && REDUCE_LARGE_CHUNK / REDUCE_THREADS as u64 <= SUM_SERIAL);
const _: () = assert!(REDUCE_MEDIUM_MAX <= REDUCE_LARGE_CHUNK);

#[path = "matmul_f64_abi.rs"]
pub mod matmul_f64_abi;

