//! `erlcuda-kernel`: write erlcuda GPU kernels in Rust, in a crate of your
//! own, and build them with `priv/erlcuda-build CRATE_DIR OUT_DIR` (no CUDA
//! toolkit: nightly rustc's nvptx64 target does the work).
//!
//! A kernel is declared once, with [`kernel!`] (any signature) or one of
//! the three fixed shapes written on it ([`elementwise!`], [`reduction!`],
//! [`table!`]); that one declaration yields
//! * the PTX entries `NAME_TY`, one per type of its T (`NAME` for a kernel
//!   with no T), with the job-table ABI of [`job`];
//! * the host (CPU backend) entries `erlcuda_host_NAME_TY` (or
//!   `erlcuda_host_NAME`), `extern "C" fn(job: *const Job)`, each running
//!   one whole job through the CPU body; for a `kernel!` with no CPU body,
//!   `erlcuda_hostgpu_NAME_TY` instead ([`job::HostGpuFn`]), running the
//!   GPU body on the CPU ([`emu`]);
//! * the kernel's line of the module manifest (its signature, in the
//!   language of [`signature`]), checked at compile time, which the build
//!   command reads out of the host library.
//!
//! ```ignore
//! #![cfg_attr(target_arch = "nvptx64", no_std)]
//! use erlcuda_kernel::{elementwise, kernel, reduction};
//!
//! // out[i] = min(max(x[i], lo), hi)
//! elementwise!(clamp, [f32, f64], (x: v, lo: s, hi: s) => x.max(lo).min(hi));
//! // sum = Σ x[i]²
//! reduction!(sumsq, [f32, f64], (x: v) => x * x);
//! // anything else: a GPU body per virtual block, a CPU body per job
//! kernel! {
//!     cos_sim, T: Float in [f32, f64],
//!     (x: v(T, rows * cols), q: v(T, cols), rows: d, cols: d) -> (sim: o(T, rows)),
//!     blocks = rows, threads = 256, block_rule = warps, shared = erlcuda_kernel::BLOCK_SHARED_BYTES,
//!     gpu(k, row) { /* x, q: *const T, rows, cols: u32, sim: *mut T, k: Args<T>, row: u64 */ }
//!     cpu(k) { /* x, q: &[T], rows, cols: u32, sim: &mut [T], k: Args<T> */ }
//! }
//! ```
//!
//! Bodies are generic over T and written once for all its types: only the
//! bound's methods ([`Float`], [`Numeric`], [`Int`], [`Element`]) are
//! visible on `T`, so the same code (the math included: [`Float::exp`],
//! `erf`, `log1p`, ... from the `libm` crate) runs on the GPU and the CPU.
//! Literals are `T::from_f64(0.5)`, `T::ZERO`, `T::ONE`.
//!
//! The kit beyond the macros, one module per concern:
//! * element types: [`Element`] ⊃ [`Numeric`] ⊃ [`Int`] / [`Float`], for
//!   u8, i32 (`s32`), u32, i64 (`s64`), u64, f32, f64, so one body can be
//!   generic over integers and floats;
//! * [`reduce`]: reduction operators ([`reduce::Sum`], `Max`, `Min`,
//!   `ArgMax`, `ArgMin`, a user's [`reduce::Op`]) for a thread's own loop,
//!   a warp ([`warp`]) or a block ([`block`]: reduce, inclusive and
//!   exclusive scan);
//! * [`atomic`]: add, min, max, exch, CAS, each returning the old value;
//! * [`warp`]: votes, ballots, shuffles of any element type;
//! * [`shared`]: static shared arrays (`shared_array!`, nvptx64);
//! * [`launch`]: rows, parts of rows and 2-D tiles over virtual blocks;
//!   [`device`]: thread and block indices (x and y), barriers;
//! * `emu` (host): a GPU body run on the CPU, a coroutine per GPU thread.
//!
//! On the host the atomics are `core::sync::atomic` operations; the device,
//! warp, block and shared functions work inside a GPU body run on the CPU
//! ([`emu`]), and the warp and block `_of` forms take the warp's or block's
//! values as a slice, computing what the GPU forms compute.
//!
//! The crate itself is `no_std`; its one dependency, `libm`, is too. On
//! nvptx64 it also provides the `#[panic_handler]` (a trap), so a kernel
//! crate needs only `#![cfg_attr(target_arch = "nvptx64", no_std)]` and no
//! `#![feature]`. Its GPU tests are `gpu_tests/` (build.sh, run.py).

#![no_std]
// allow_internal_unstable: the macros expand to `extern "ptx-kernel"` fns
// (feature abi_ptx) in crates that enable no feature themselves.
#![feature(allow_internal_unstable, core_intrinsics)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        stdarch_nvptx,
        asm_experimental_arch,
        link_llvm_intrinsics,
        gpu_launch_sized_workgroup_mem,
        gpu_intrinsics
    )
)]
#![allow(internal_features, clippy::missing_safety_doc)]

// The fixed interface with gpud, which includes these very files: kept as
// written there, whatever clippy would prefer.
#[allow(clippy::all)]
pub mod job;
#[allow(clippy::all)]
pub mod signature;
// The CPU sums' order, one definition shared with gpud.
pub mod sum_order;

pub mod element;
pub use element::{Element, Int, Numeric};
mod float;
pub use float::{Float, GPU_F64_ULPS, MATH_ULPS};

pub mod atomic;
pub mod block;
pub mod launch;
pub mod reduce;
pub mod shared;
pub mod warp;

pub mod manifest;

mod args;
pub use args::{Args, Group};

pub mod device;

// A GPU body run on the CPU: the block's threads as coroutines.
#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;

// What the macros expand to on each side; not an API of its own. The GPU
// side is built for the host too: a GPU body run on the CPU runs it.
#[doc(hidden)]
pub mod gpu;
#[cfg(not(target_arch = "nvptx64"))]
#[doc(hidden)]
pub mod host;

mod macros;

/// A sum in erlcuda's stated order (for CPU bodies: runs of 256 serially,
/// pairwise, chunks in order), as the `reduction!` host entries compute.
#[cfg(not(target_arch = "nvptx64"))]
pub use host::sum;

pub use job::Job;

/// Dynamic shared memory bytes the kit's block-wide reductions use
/// ([`device::block_sum`], [`device::block_max`], the `reduction!`
/// kernels): one slot per warp (32 at most) and one for the broadcast
/// result, 8 bytes each. A table kernel that calls them declares at least
/// this much `shared`; its own data goes after it.
pub const BLOCK_SHARED_BYTES: u32 = 33 * 8;

/// GPU code that panics (an index out of bounds, an explicit `panic!`)
/// traps: the launch fails with an illegal-instruction error and gpud
/// exits, as for any device fault.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    device::trap()
}
