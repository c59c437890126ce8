//! erlcuda GPU kernels: `no_std` Rust for `nvptx64-nvidia-cuda`.
//!
//! Every kernel is batched: one launch serves many jobs described by a table
//! of `#[repr(C)]` descriptors in device memory (see `abi.rs`, shared with
//! gpud). Built by `kernels/build.sh OUT_DIR` into `OUT_DIR/erlcuda_kernels.ptx`.
//! One file per kernel, each defining its `extern "ptx-kernel"` entries
//! `<kernel>_f32` / `<kernel>_f64`, or declaring them with the helper crate
//! `erlcuda-kernel` (kernels/kit) as users' kernels are (`saxpy.rs`);
//! `common.rs` re-exports what they share from that crate, which also
//! provides the panic handler.

#![no_std]
#![feature(abi_ptx, asm_experimental_arch)]
#![allow(internal_features, unused_comparisons, clippy::missing_safety_doc)]

pub mod abi;
mod common;
// matmul's f64 body (tensor cores on sm_80): a file of its own beside matmul.rs.
mod matmul_f64;
// One module per row of the kernel table (build.rs): kernels/src/<entry>.rs.
include!(concat!(env!("OUT_DIR"), "/kernel_mods.rs"));
