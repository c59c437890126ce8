//! Device primitives: thread and block indices, barriers,
//! dynamic shared memory, warp shuffles and warp/block reductions, `trap`,
//! and `unroll!`. The built-in kernels (`kernels/`) use these very
//! definitions.
//!
//! erlcuda launches use the x dimension only: `(grid, 1, 1)` × `(threads,
//! 1, 1)`, grid-stride over virtual blocks ([`crate::job`]); rows and tiles
//! over those are [`crate::launch`]'s. The y-dimension indices are here for
//! kernels launched with one (as the kit's GPU tests are).
//!
//! The operator-generic warp and block primitives, atomics and static
//! shared arrays are [`crate::warp`], [`crate::block`], [`crate::atomic`]
//! and [`crate::shared`]; the f32/f64 sums and maxima below stay as the
//! built-in kernels use them.
//!
//! Shared memory is addressed through the 32-bit shared window
//! ([`smem_base`], [`Float::lds`]/[`Float::sts`]); barriers are `asm!`
//! without `nomem`, so LLVM never moves a shared access across them.
//! The warp and block reductions assume full warps: the block size a kernel
//! runs with is a multiple of 32.
//!
//! On the host the same names run a GPU body on the CPU ([`crate::emu`]):
//! the indices are the emulated thread's, a barrier waits for the block's
//! other threads, shared addresses index the block's emulated region.

use crate::Float;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;
#[cfg(target_arch = "nvptx64")]
use core::arch::nvptx::{
    _block_dim_x, _block_dim_y, _block_idx_x, _block_idx_y, _grid_dim_x, _grid_dim_y, _thread_idx_x, _thread_idx_y,
};

/// `unroll!(i, N, body)`: `body` N times (N = 2, 4, 8 or 16) with `i: u32`
/// a literal constant each time, so register arrays indexed by `i` stay in
/// registers whatever LLVM's unroller decides.
#[macro_export]
macro_rules! unroll {
    ($i:ident, 2, $body:expr) => { $crate::unroll!(@ $i, $body, 0 1) };
    ($i:ident, 4, $body:expr) => { $crate::unroll!(@ $i, $body, 0 1 2 3) };
    ($i:ident, 8, $body:expr) => { $crate::unroll!(@ $i, $body, 0 1 2 3 4 5 6 7) };
    ($i:ident, 16, $body:expr) => { $crate::unroll!(@ $i, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15) };
    (@ $i:ident, $body:expr, $($n:literal)*) => { $( { let $i: u32 = $n; $body; } )* };
}

/// This thread's index in its block (`%tid.x`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn thread_idx() -> u32 {
    unsafe { _thread_idx_x() }
}

/// This block's index in the grid (`%ctaid.x`); not the virtual block.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn block_idx() -> u32 {
    unsafe { _block_idx_x() }
}

/// Threads per block (`%ntid.x`): the kernel's `threads` unless the launch
/// said `{block, B}`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn block_dim() -> u32 {
    unsafe { _block_dim_x() }
}

/// Blocks in the grid (`%nctaid.x`): the stride of the grid-stride loop.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn grid_dim() -> u32 {
    unsafe { _grid_dim_x() }
}

/// `%tid.y`: 0 in every erlcuda launch.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn thread_idx_y() -> u32 {
    unsafe { _thread_idx_y() }
}

/// `%ctaid.y`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn block_idx_y() -> u32 {
    unsafe { _block_idx_y() }
}

/// `%ntid.y`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn block_dim_y() -> u32 {
    unsafe { _block_dim_y() }
}

/// `%nctaid.y`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    unsafe { _grid_dim_y() }
}

/// This thread's index in the whole grid along x: `block_idx · block_dim +
/// thread_idx`.
#[inline(always)]
pub fn global_x() -> u32 {
    block_idx() * block_dim() + thread_idx()
}

/// This thread's index in the whole grid along y.
#[inline(always)]
pub fn global_y() -> u32 {
    block_idx_y() * block_dim_y() + thread_idx_y()
}

// ------------------------------------------- the host: a GPU body on the CPU

/// `%tid.x` of the GPU thread being run ([`crate::emu`]).
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub fn thread_idx() -> u32 {
    crate::emu::thread_idx().0
}

/// `%ctaid.x`: the virtual block's index within its job on the host.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub fn block_idx() -> u32 {
    crate::emu::block_idx().0
}

/// `%ntid.x`.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub fn block_dim() -> u32 {
    crate::emu::dims().block.0
}

/// `%nctaid.x`: the job's virtual blocks on the host.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub fn grid_dim() -> u32 {
    crate::emu::dims().grid.0
}

/// `%tid.y`.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub fn thread_idx_y() -> u32 {
    crate::emu::thread_idx().1
}

/// `%ctaid.y`.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub fn block_idx_y() -> u32 {
    crate::emu::block_idx().1
}

/// `%ntid.y`.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub fn block_dim_y() -> u32 {
    crate::emu::dims().block.1
}

/// `%nctaid.y`.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    crate::emu::dims().grid.1
}

/// `bar.sync 0`: waits until every thread of the block arrives at this
/// same call (by its place in the source); a thread that reaches another
/// barrier, or returns, while others wait here is a divergent barrier.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub fn sync_threads() {
    crate::emu::barrier(core::panic::Location::caller())
}

/// Aborts the GPU body run.
#[cfg(not(target_arch = "nvptx64"))]
pub fn trap() -> ! {
    panic!("erlcuda_kernel: trap in a GPU body")
}

/// The dynamic shared memory's address: 0 in the emulated region.
#[cfg(not(target_arch = "nvptx64"))]
pub fn smem_base() -> u32 {
    0
}

/// The dynamic shared memory at byte `offset` as a pointer.
#[cfg(not(target_arch = "nvptx64"))]
pub fn shared<T>(offset: u32) -> *mut T {
    crate::emu::shared_ptr(offset, 0).cast()
}

/// 4 f32 of shared memory at `a`.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub unsafe fn lds4_f32(a: u32) -> [f32; 4] {
    crate::emu::shared_ptr(a, 16).cast::<[f32; 4]>().read_unaligned()
}

/// Stores 4 f32 at shared address `a`.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub unsafe fn sts4_f32(a: u32, v: [f32; 4]) {
    crate::emu::shared_ptr(a, 16).cast::<[f32; 4]>().write_unaligned(v)
}

/// Lane of this thread in its warp.
#[inline(always)]
pub fn lane() -> u32 {
    thread_idx() & 31
}

/// Warp of this thread in its block.
#[inline(always)]
pub fn warp() -> u32 {
    thread_idx() >> 5
}

/// `bar.sync 0`: every thread of the block waits here. Only in control
/// flow that all the block's threads take. LLVM's barrier intrinsic, not
/// an asm block: the intrinsic is `convergent`, so LLVM never copies it
/// into both arms of a branch that depends on the thread. An asm block it
/// did copy so (`topk_rows`'s short rows with a store under `t < cols`
/// before the barrier: a warp split by the row's end waited at two
/// `bar.sync`, and the launch hung on an H100). The intrinsic has memory
/// effects, so it is a compiler barrier for shared memory too.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn sync_threads() {
    unsafe { core::arch::nvptx::_syncthreads() }
}

/// Aborts the kernel (`trap`): the launch fails, gpud exits.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn trap() -> ! {
    unsafe { core::arch::nvptx::trap() }
}

/// Shared-window (32-bit) address of the dynamic shared memory (16-byte
/// aligned), sized by the launch's shared bytes.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
// The asm converts the address only, it touches no memory: `nomem` holds.
#[allow(clippy::pointers_in_nomem_asm_block)]
pub fn smem_base() -> u32 {
    #[repr(C, align(16))]
    struct A16([f32; 4]);
    let p = core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<A16>();
    let r: u32;
    unsafe {
        asm!("cvta.to.shared.u64 {t}, {p}; cvt.u32.u64 {r}, {t};",
             t = out(reg64) _, p = in(reg64) p, r = out(reg32) r,
             options(pure, nomem, nostack, preserves_flags));
    }
    r
}

/// The dynamic shared memory at byte `offset` as a generic pointer (for
/// plain `*p` accesses; [`Float::lds`]/[`Float::sts`] on
/// `smem_base() + offset` are the explicit `ld.shared`/`st.shared`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn shared<T>(offset: u32) -> *mut T {
    let p = core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<u8>();
    p.wrapping_add(offset as usize).cast()
}

/// 16-byte shared-memory load of 4 f32 (`a` 16-byte aligned).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn lds4_f32(a: u32) -> [f32; 4] {
    let (x, y, z, w): (f32, f32, f32, f32);
    asm!("ld.shared.v4.f32 {{{x}, {y}, {z}, {w}}}, [{a}];", a = in(reg32) a,
         x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
         options(pure, readonly, nostack, preserves_flags));
    [x, y, z, w]
}

/// 16-byte shared-memory store of 4 f32 (`a` 16-byte aligned).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn sts4_f32(a: u32, v: [f32; 4]) {
    asm!("st.shared.v4.f32 [{a}], {{{x}, {y}, {z}, {w}}};", a = in(reg32) a,
         x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
         options(nostack, preserves_flags));
}

// ------------------------------------------------------------ warp level

/// Sum over the warp by shuffles down (depth 5); valid in lane 0.
#[inline(always)]
pub fn warp_sum<T: Float>(mut v: T) -> T {
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = crate::warp::collective(v, |xs| down_all(xs, |a, b| a + b)) {
        return r;
    }
    let mut d = 16;
    while d > 0 {
        v += T::shfl_down(v, d);
        d >>= 1;
    }
    v
}

/// Maximum over the warp (IEEE maxNum); valid in lane 0.
#[inline(always)]
pub fn warp_max<T: Float>(mut v: T) -> T {
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = crate::warp::collective(v, |xs| down_all(xs, |a, b| a.max(b))) {
        return r;
    }
    let mut d = 16;
    while d > 0 {
        v = v.max(T::shfl_down(v, d));
        d >>= 1;
    }
    v
}

/// Sum over the warp by a butterfly (depth 5); the same value in every lane.
#[inline(always)]
pub fn warp_sum_all<T: Float>(mut v: T) -> T {
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = crate::warp::collective(v, |xs| xor_all(xs, |a, b| a + b)) {
        return r;
    }
    let mut m = 16;
    while m > 0 {
        v += T::shfl_xor(v, m);
        m >>= 1;
    }
    v
}

/// Maximum over the warp; the same value in every lane.
#[inline(always)]
pub fn warp_max_all<T: Float>(mut v: T) -> T {
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = crate::warp::collective(v, |xs| xor_all(xs, |a, b| a.max(b))) {
        return r;
    }
    let mut m = 16;
    while m > 0 {
        v = v.max(T::shfl_xor(v, m));
        m >>= 1;
    }
    v
}

/// The steps `v = f(v, v of lane partner(l, s))` for s = 16, 8, .. 1, for
/// every lane at once on the CPU, as the shuffles give them.
#[cfg(not(target_arch = "nvptx64"))]
fn steps_all<T: Copy>(xs: &[T; 32], f: impl Fn(T, T) -> T, partner: impl Fn(usize, usize) -> usize) -> [T; 32] {
    let mut v = *xs;
    let mut s = 16;
    while s > 0 {
        let y = v;
        v = core::array::from_fn(|l| f(y[l], y[partner(l, s)]));
        s >>= 1;
    }
    v
}

/// [`warp_sum`]'s and [`warp_max`]'s shuffles down for every lane: a lane
/// past the warp's end reads its own value.
#[cfg(not(target_arch = "nvptx64"))]
fn down_all<T: Copy>(xs: &[T; 32], f: impl Fn(T, T) -> T) -> [T; 32] {
    steps_all(xs, f, |l, d| if l + d < 32 { l + d } else { l })
}

/// [`warp_sum_all`]'s and [`warp_max_all`]'s butterfly for every lane.
#[cfg(not(target_arch = "nvptx64"))]
fn xor_all<T: Copy>(xs: &[T; 32], f: impl Fn(T, T) -> T) -> [T; 32] {
    steps_all(xs, f, |l, m| l ^ m)
}

// ----------------------------------------------------------- block level

/// Sum over the block, valid in thread 0 (depth 5 + 5): one partial per
/// warp through shared memory at `smem` (`nwarps` ≤ 32 slots of
/// `T::BYTES`), then warp 0 sums them. Two barriers; ends with one, so the
/// caller may call it again at once. `reduction!` kernels and the built-in
/// reduce/dot use it.
#[inline(always)]
pub fn block_sum_first<T: Float>(v: T, smem: u32, nwarps: u32) -> T {
    let (lane, warp) = (lane(), warp());
    let v = warp_sum(v);
    if lane == 0 {
        unsafe { T::sts(smem + T::BYTES * warp, v) };
    }
    sync_threads();
    let mut r = T::ZERO;
    if warp == 0 {
        let x = if lane < nwarps { unsafe { T::lds(smem + T::BYTES * lane) } } else { T::ZERO };
        r = warp_sum(x);
    }
    sync_threads();
    r
}

/// Sum over the whole block, returned to every thread. Uses the first
/// [`crate::BLOCK_SHARED_BYTES`] of the dynamic shared memory; every thread
/// of the block must call it (uniform control flow). Two barriers; it may
/// be called again at once.
#[inline(always)]
pub fn block_sum<T: Float>(v: T) -> T {
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = block_all_at_once(v, T::ZERO, |a, b| a + b) {
        return r;
    }
    block_all(warp_sum(v), T::ZERO, warp_sum)
}

/// Maximum (IEEE maxNum) over the whole block, returned to every thread;
/// as [`block_sum`].
#[inline(always)]
pub fn block_max<T: Float>(v: T) -> T {
    #[cfg(not(target_arch = "nvptx64"))]
    if let Some(r) = block_all_at_once(v, T::NEG_INFINITY, |a, b| a.max(b)) {
        return r;
    }
    block_all(warp_max(v), T::NEG_INFINITY, warp_max)
}

/// [`block_all`] of the warps' `f` steps (shuffles down) on the CPU in one
/// wait of the block ([`crate::emu::block_collective`]), with the same
/// operations in the same order and the same shared memory written: each
/// warp's lane 0 into slot `w`, the block's into slot 32. None (the
/// barriers and shuffles then) unless the block is whole warps.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
fn block_all_at_once<T: Float>(v: T, identity: T, f: impl Fn(T, T) -> T + Copy) -> Option<T> {
    if !crate::emu::whole_warps() {
        return None;
    }
    Some(crate::emu::block_collective(v, core::panic::Location::caller(), |items, out| {
        let smem = smem_base();
        let nwarps = items.len() / 32;
        let mut x = [identity; 32];
        for (w, lanes) in items.chunks_exact(32).enumerate() {
            x[w] = down_all(lanes.try_into().expect("32 lanes"), f)[0];
            unsafe { T::sts(smem + T::BYTES * w as u32, x[w]) };
        }
        debug_assert!(nwarps <= 32);
        let r = down_all(&x, f)[0];
        unsafe { T::sts(smem + T::BYTES * 32, r) };
        out.fill(r);
    }))
}

/// The block-wide reduction behind [`block_sum`]/[`block_max`]: `v` is the
/// warp's result (in lane 0). Slots 0..32 hold the warps' results, slot 32
/// the block's. A second call cannot overwrite slot 32 before every thread
/// read it: its writer passes the second call's first barrier, which every
/// reader reaches only after reading.
#[inline(always)]
fn block_all<T: Float>(v: T, identity: T, warp_op: impl Fn(T) -> T) -> T {
    let smem = smem_base();
    let (lane, warp) = (lane(), warp());
    if lane == 0 {
        unsafe { T::sts(smem + T::BYTES * warp, v) };
    }
    sync_threads();
    if warp == 0 {
        let nwarps = block_dim() >> 5;
        let x = if lane < nwarps { unsafe { T::lds(smem + T::BYTES * lane) } } else { identity };
        let r = warp_op(x);
        if lane == 0 {
            unsafe { T::sts(smem + T::BYTES * 32, r) };
        }
    }
    sync_threads();
    unsafe { T::lds(smem + T::BYTES * 32) }
}
