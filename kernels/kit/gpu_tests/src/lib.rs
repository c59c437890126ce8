//! GPU tests of the kit's device primitives: plain `extern "ptx-kernel"`
//! entries (raw pointers and sizes, no job table), each exercising one
//! primitive, built to PTX by `build.sh` and launched and checked against
//! NumPy by `run.py`. Entry names and parameter orders are run.py's to
//! match. The bodies are [`prims`] (which the kit's host tests run on the
//! CPU too); the kernels of the macros, with erlcuda's job table, are
//! [`jobs`] (shared with the kit's host tests).

#![no_std]
#![feature(abi_ptx)]

mod jobs;
mod prims;

use prims::*;

macro_rules! int_atomic_entries {
    ($($t:ident),*) => { $(
        const _: () = {
            #[unsafe(export_name = concat!("atomics_global_", stringify!($t)))]
            unsafe extern "ptx-kernel" fn g(vals: *const $t, n: u32, slots: u32, acc: *mut $t, olds: *mut $t) {
                atomics_global(vals, n, slots, acc, olds)
            }
            #[unsafe(export_name = concat!("atomics_shared_", stringify!($t)))]
            unsafe extern "ptx-kernel" fn s(vals: *const $t, n: u32, slots: u32, init: *const $t, acc: *mut $t, olds: *mut $t) {
                atomics_shared(vals, n, slots, init, acc, olds)
            }
        };
    )* };
}
int_atomic_entries!(u32, i32, u64, i64);

macro_rules! shuffle_entries {
    ($($t:ident),*) => { $(
        const _: () = {
            #[unsafe(export_name = concat!("shuffles_", stringify!($t)))]
            unsafe extern "ptx-kernel" fn e(x: *const $t, n: u32, arg: u32, out: *mut $t) {
                shuffles(x, n, arg, out)
            }
        };
    )* };
}
shuffle_entries!(u8, i32, u32, i64, u64, f32, f64);

macro_rules! block_entries {
    ($($t:ident),*) => { $(
        const _: () = {
            #[unsafe(export_name = concat!("block_ops_", stringify!($t)))]
            unsafe extern "ptx-kernel" fn e(x: *const $t, n: u32, red: *mut $t, red_idx: *mut u32, scan: *mut $t, scan_idx: *mut u32) {
                block_ops(x, n, red, red_idx, scan, scan_idx)
            }
        };
    )* };
}
block_entries!(u8, i32, u32, i64, f32, f64);

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn float_atomics_f32(vals: *const f32, n: u32, slots: u32, acc: *mut f32, olds: *mut f32) {
    float_atomics(vals, n, slots, acc, olds)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn float_atomics_f64(vals: *const f64, n: u32, slots: u32, acc: *mut f64, olds: *mut f64) {
    float_atomics(vals, n, slots, acc, olds)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn vote(preds: *const u32, out: *mut u32) {
    prims::vote(preds, out)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn shuffles_pair(x: *const f32, arg: u32, out_v: *mut f32, out_i: *mut u32) {
    prims::shuffles_pair(x, arg, out_v, out_i)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn warp_ops_i32(x: *const i32, n: u32, out: *mut i32) {
    prims::warp_ops_i32(x, n, out)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn shared_reverse(x32: *const f32, x64: *const f64, x8: *const u8, o32: *mut f32, o64: *mut f64, o8: *mut u8) {
    prims::shared_reverse(x32, x64, x8, o32, o64, o8)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn barrier_after_branch(x: *const f32, n: u32, out: *mut u32) {
    prims::barrier_after_branch(x, n, out)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn grid_2d(out: *mut u32, w: u32, h: u32) {
    prims::grid_2d(out, w, h)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn tiles(out: *mut u32, rows: u32, cols: u32, tile_rows: u32, tile_cols: u32) {
    prims::tiles(out, rows, cols, tile_rows, tile_cols)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn row_parts(out: *mut u32, rows: u32, cols: u32, per_block: u32) {
    prims::row_parts(out, rows, cols, per_block)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn math_f32(id: u32, x: *const f32, y: *const f32, out: *mut f32, n: u32) {
    math(id, x, y, out, n)
}

#[unsafe(no_mangle)]
unsafe extern "ptx-kernel" fn math_f64(id: u32, x: *const f64, y: *const f64, out: *mut f64, n: u32) {
    math(id, x, y, out, n)
}
