//! ABI of `matmul_f64` — `C(m×n) = A(m×k) · B(k×n)`, row-major f64.
//!
//! Included by `abi.rs` as `abi::matmul_f64_abi` (so gpud, which includes
//! abi.rs through `#[path]`, gets it too). Plain Rust, no dependencies;
//! integer constants are literals so `kernels/ptx_launch.py` can read them.
//!
//! * Same job table as `matmul_f32`: [`MatmulJob`] (element type f64
//!   here), params `(jobs: u64 -> [MatmulJob; njobs], njobs: u32,
//!   total_tiles: u32)`, block `(MATMUL_F64_THREADS,1,1)`, grid
//!   `(grid_for(total_tiles, MATMUL_F64_MAX_GRID),1,1)`, dynamic shared
//!   memory [`MATMUL_F64_SMEM_BYTES`] (exactly the 48 KiB default limit, so
//!   no `cuFuncSetAttribute`).
//! * host prep: [`matmul_f64_prepare`] (the tile is 128×64, not 128×128:
//!   `matmul_prepare`'s tables do not fit this kernel).
//! * any `m, n, k` (`k == 0` writes zeros; `m == 0` or `n == 0` does
//!   nothing). Pointers must be 8-byte aligned (f64's natural alignment);
//!   16-byte aligned `a` with even `k`, `b` with even `n`, `c` with even `n`
//!   take the vector paths.
//! * Two PTX modules carry the entry: [`PTX_FILE_NAME`](super::PTX_FILE_NAME)
//!   (sm_70, SIMT f64 FMAs) and [`PTX_SM80_FILE_NAME`] (sm_80, FP64 tensor
//!   cores via `mma.sync.m8n8k4.f64` and `cp.async`; a driver refuses to
//!   load it below compute capability 8.0). Load the sm80 one when the
//!   device's compute capability is at least [`MATMUL_F64_SM80_MIN_CC`]
//!   (major·10 + minor), else the plain one; both have the same entries and
//!   ABI, so one module per device suffices.

use super::{prepare_tiles, tiles_of, MatmulJob};

/// Entry name (in both PTX modules).
pub const ENTRY_MATMUL_F64: &str = "matmul_f64";
/// File name of the sm_80 module `kernels/build.sh OUT_DIR` writes.
pub const PTX_SM80_FILE_NAME: &str = "erlcuda_kernels_sm80.ptx";
/// Lowest compute capability (major·10 + minor) that loads the sm80 module.
pub const MATMUL_F64_SM80_MIN_CC: u32 = 80;

pub const MATMUL_F64_THREADS: u32 = 256;
/// Tile of C per (virtual) block.
pub const MATMUL_F64_BM: u32 = 128;
pub const MATMUL_F64_BN: u32 = 64;
/// k-slice staged through shared memory per step.
pub const MATMUL_F64_BK: u32 = 16;
/// Dynamic shared memory, both builds: the tensor-core path keeps two
/// stages of A[BM][BK] and B[BK][BN] f64 (2 · 24,576 bytes, XOR-swizzled
/// instead of padded so it stays within 48 KiB); the SIMT path needs less.
pub const MATMUL_F64_SMEM_BYTES: u32 = 49152;
/// Tile rows grouped together in the launch order (L2 reuse).
pub const MATMUL_F64_GROUP_M: u32 = 8;
pub const MATMUL_F64_MAX_GRID: u32 = 2147483647;

pub const fn matmul_f64_tiles(m: u32, n: u32) -> u64 {
    tiles_of(m, n, MATMUL_F64_BM, MATMUL_F64_BN)
}

/// Fills `tiles_n` (= ceil(n / MATMUL_F64_BN)) and `tile_start` (exclusive
/// prefix of the tile counts) and returns `total_tiles`, or `None` if it
/// does not fit `u32`.
pub fn matmul_f64_prepare(jobs: &mut [MatmulJob]) -> Option<u32> {
    prepare_tiles(jobs, MATMUL_F64_BM, MATMUL_F64_BN)
}

const _: () = assert!(MATMUL_F64_SMEM_BYTES == 2 * (MATMUL_F64_BM + MATMUL_F64_BN) * MATMUL_F64_BK * 8);
const _: () = assert!(MATMUL_F64_MAX_GRID == i32::MAX as u32);
