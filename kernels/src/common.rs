//! What the kernels share: thread/block indices, barriers, `unroll!`,
//! `upper_search`, the warp/block sums, and the [`Float`] trait (f32 and f64)
//! that the type-generic kernels are written against.
//!
//! Memory access notes: global loads/stores and all shared-memory accesses of
//! the hot loops go through small `asm!` helpers so the PTX is guaranteed to
//! use `ld.global`/`ld.shared` with 16-byte vectors (pointers read from the
//! descriptor table are generic, and LLVM cannot infer their address space).
//! Barriers are `asm!` without `nomem`, so LLVM never moves a shared access
//! across them.

use crate::abi::REDUCE_WARPS;
use core::arch::asm;
use core::arch::nvptx::{_block_idx_x, _grid_dim_x, _thread_idx_x};
use core::ops::{Add, AddAssign, Mul};

/// `unroll!(i, N, body)`: `body` N times (N = 2, 4, 8 or 16) with `i: u32`
/// a literal constant each time, so register arrays indexed by `i` stay in
/// registers whatever LLVM's unroller decides.
macro_rules! unroll {
    ($i:ident, 2, $body:expr) => { unroll!(@ $i, $body, 0 1) };
    ($i:ident, 4, $body:expr) => { unroll!(@ $i, $body, 0 1 2 3) };
    ($i:ident, 8, $body:expr) => { unroll!(@ $i, $body, 0 1 2 3 4 5 6 7) };
    ($i:ident, 16, $body:expr) => { unroll!(@ $i, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15) };
    (@ $i:ident, $body:expr, $($n:literal)*) => { $( { let $i: u32 = $n; $body; } )* };
}
pub(crate) use unroll;

unsafe extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.down.f32"]
    fn shfl_down_f32(mask: u32, v: f32, delta: u32, c: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.down.i32"]
    fn shfl_down_i32(mask: u32, v: i32, delta: u32, c: u32) -> i32;
}

#[inline(always)]
pub(crate) fn tid() -> u32 {
    unsafe { _thread_idx_x() }
}
#[inline(always)]
pub(crate) fn bid() -> u32 {
    unsafe { _block_idx_x() }
}
#[inline(always)]
pub(crate) fn gdim() -> u32 {
    unsafe { _grid_dim_x() }
}

/// `bar.sync 0` as an asm block with (implicit) memory effects: a compiler
/// barrier too.
#[inline(always)]
pub(crate) unsafe fn sync_threads() {
    asm!("bar.sync 0;", options(nostack));
}

/// Shared-window (32-bit) address of the dynamic shared memory (16-byte
/// aligned).
#[inline(always)]
pub(crate) unsafe fn smem_base() -> u32 {
    #[repr(C, align(16))]
    struct A16([f32; 4]);
    let p = core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<A16>();
    let r: u32;
    asm!("cvta.to.shared.u64 {t}, {p}; cvt.u32.u64 {r}, {t};",
         t = out(reg64) _, p = in(reg64) p, r = out(reg32) r,
         options(pure, nomem, nostack, preserves_flags));
    r
}

/// 16-byte shared-memory load of 4 f32 (`a` 16-byte aligned).
#[inline(always)]
pub(crate) unsafe fn lds4_f32(a: u32) -> [f32; 4] {
    let (x, y, z, w): (f32, f32, f32, f32);
    asm!("ld.shared.v4.f32 {{{x}, {y}, {z}, {w}}}, [{a}];", a = in(reg32) a,
         x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
         options(pure, readonly, nostack, preserves_flags));
    [x, y, z, w]
}

/// 16-byte shared-memory store of 4 f32 (`a` 16-byte aligned).
#[inline(always)]
pub(crate) unsafe fn sts4_f32(a: u32, v: [f32; 4]) {
    asm!("st.shared.v4.f32 [{a}], {{{x}, {y}, {z}, {w}}};", a = in(reg32) a,
         x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
         options(nostack, preserves_flags));
}

/// Index of the last entry `j` in `0..n` with `start(j) <= x` (`start` is
/// non-decreasing, `start(0) <= x`).
#[inline(always)]
pub(crate) fn upper_search(n: u32, x: u64, start: impl Fn(u32) -> u64) -> u32 {
    let (mut lo, mut hi) = (0u32, n); // answer in [lo, hi)
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if start(mid) <= x {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

// ------------------------------------------------------------------ Float

/// An element type of the generic kernels (f32 or f64).
///
/// Global accesses: `p` is a generic pointer into global memory (converted
/// with `cvta.to.global`). `*_nc` loads go through the read-only
/// (non-coherent) path: only for inputs nobody writes during the kernel.
/// The 4-element group functions need `p` 16-byte aligned (for both types:
/// f32 is one `v4.f32`, f64 two `v2.f64`).
pub(crate) trait Float: Copy + Add<Output = Self> + Mul<Output = Self> + AddAssign {
    const ZERO: Self;
    /// Size in bytes.
    const BYTES: u32;
    /// `a * b + c`, one rounding.
    fn fma(a: Self, b: Self, c: Self) -> Self;
    /// Rounds to nearest (f32) / the identity (f64).
    fn from_f64(x: f64) -> Self;
    unsafe fn ldg(p: *const Self) -> Self;
    unsafe fn ldg_nc(p: *const Self) -> Self;
    unsafe fn ldg4(p: *const Self) -> [Self; 4];
    unsafe fn ldg4_nc(p: *const Self) -> [Self; 4];
    unsafe fn stg(p: *mut Self, v: Self);
    unsafe fn stg4(p: *mut Self, v: [Self; 4]);
    /// `red.global.add`: atomic `*p += v` (sm_60+ for f64).
    unsafe fn red_add(p: *mut Self, v: Self);
    /// Shared memory at the 32-bit shared-window address `a`.
    unsafe fn lds(a: u32) -> Self;
    unsafe fn sts(a: u32, v: Self);
    /// `v` of lane `lane + delta` (full warp).
    fn shfl_down(v: Self, delta: u32) -> Self;
}

impl Float for f32 {
    const ZERO: Self = 0.0;
    const BYTES: u32 = 4;
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        core::intrinsics::fmaf32(a, b, c)
    }
    #[inline(always)]
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    #[inline(always)]
    unsafe fn ldg(p: *const f32) -> f32 {
        let v: f32;
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.f32 {v}, [{t}];",
             t = out(reg64) _, p = in(reg64) p, v = out(reg32) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[inline(always)]
    unsafe fn ldg_nc(p: *const f32) -> f32 {
        let v: f32;
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.nc.f32 {v}, [{t}];",
             t = out(reg64) _, p = in(reg64) p, v = out(reg32) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[inline(always)]
    unsafe fn ldg4(p: *const f32) -> [f32; 4] {
        let (x, y, z, w): (f32, f32, f32, f32);
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.v4.f32 {{{x}, {y}, {z}, {w}}}, [{t}];",
             t = out(reg64) _, p = in(reg64) p,
             x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
             options(pure, readonly, nostack, preserves_flags));
        [x, y, z, w]
    }
    #[inline(always)]
    unsafe fn ldg4_nc(p: *const f32) -> [f32; 4] {
        let (x, y, z, w): (f32, f32, f32, f32);
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.nc.v4.f32 {{{x}, {y}, {z}, {w}}}, [{t}];",
             t = out(reg64) _, p = in(reg64) p,
             x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
             options(pure, readonly, nostack, preserves_flags));
        [x, y, z, w]
    }
    #[inline(always)]
    unsafe fn stg(p: *mut f32, v: f32) {
        asm!("cvta.to.global.u64 {t}, {p}; st.global.f32 [{t}], {v};",
             t = out(reg64) _, p = in(reg64) p, v = in(reg32) v,
             options(nostack, preserves_flags));
    }
    #[inline(always)]
    unsafe fn stg4(p: *mut f32, v: [f32; 4]) {
        asm!("cvta.to.global.u64 {t}, {p}; st.global.v4.f32 [{t}], {{{x}, {y}, {z}, {w}}};",
             t = out(reg64) _, p = in(reg64) p,
             x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
             options(nostack, preserves_flags));
    }
    #[inline(always)]
    unsafe fn red_add(p: *mut f32, v: f32) {
        asm!("cvta.to.global.u64 {t}, {p}; red.global.add.f32 [{t}], {v};",
             t = out(reg64) _, p = in(reg64) p, v = in(reg32) v,
             options(nostack, preserves_flags));
    }
    #[inline(always)]
    unsafe fn lds(a: u32) -> f32 {
        let v: f32;
        asm!("ld.shared.f32 {v}, [{a}];", a = in(reg32) a, v = out(reg32) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[inline(always)]
    unsafe fn sts(a: u32, v: f32) {
        asm!("st.shared.f32 [{a}], {v};", a = in(reg32) a, v = in(reg32) v,
             options(nostack, preserves_flags));
    }
    #[inline(always)]
    fn shfl_down(v: f32, delta: u32) -> f32 {
        unsafe { shfl_down_f32(0xffff_ffff, v, delta, 0x1f) }
    }
}

impl Float for f64 {
    const ZERO: Self = 0.0;
    const BYTES: u32 = 8;
    #[inline(always)]
    fn fma(a: f64, b: f64, c: f64) -> f64 {
        core::intrinsics::fmaf64(a, b, c)
    }
    #[inline(always)]
    fn from_f64(x: f64) -> f64 {
        x
    }
    #[inline(always)]
    unsafe fn ldg(p: *const f64) -> f64 {
        let v: f64;
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.f64 {v}, [{t}];",
             t = out(reg64) _, p = in(reg64) p, v = out(reg64) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[inline(always)]
    unsafe fn ldg_nc(p: *const f64) -> f64 {
        let v: f64;
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.nc.f64 {v}, [{t}];",
             t = out(reg64) _, p = in(reg64) p, v = out(reg64) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[inline(always)]
    unsafe fn ldg4(p: *const f64) -> [f64; 4] {
        let (x, y, z, w): (f64, f64, f64, f64);
        asm!("cvta.to.global.u64 {t}, {p};",
             "ld.global.v2.f64 {{{x}, {y}}}, [{t}];",
             "ld.global.v2.f64 {{{z}, {w}}}, [{t}+16];",
             t = out(reg64) _, p = in(reg64) p,
             x = out(reg64) x, y = out(reg64) y, z = out(reg64) z, w = out(reg64) w,
             options(pure, readonly, nostack, preserves_flags));
        [x, y, z, w]
    }
    #[inline(always)]
    unsafe fn ldg4_nc(p: *const f64) -> [f64; 4] {
        let (x, y, z, w): (f64, f64, f64, f64);
        asm!("cvta.to.global.u64 {t}, {p};",
             "ld.global.nc.v2.f64 {{{x}, {y}}}, [{t}];",
             "ld.global.nc.v2.f64 {{{z}, {w}}}, [{t}+16];",
             t = out(reg64) _, p = in(reg64) p,
             x = out(reg64) x, y = out(reg64) y, z = out(reg64) z, w = out(reg64) w,
             options(pure, readonly, nostack, preserves_flags));
        [x, y, z, w]
    }
    #[inline(always)]
    unsafe fn stg(p: *mut f64, v: f64) {
        asm!("cvta.to.global.u64 {t}, {p}; st.global.f64 [{t}], {v};",
             t = out(reg64) _, p = in(reg64) p, v = in(reg64) v,
             options(nostack, preserves_flags));
    }
    #[inline(always)]
    unsafe fn stg4(p: *mut f64, v: [f64; 4]) {
        asm!("cvta.to.global.u64 {t}, {p};",
             "st.global.v2.f64 [{t}], {{{x}, {y}}};",
             "st.global.v2.f64 [{t}+16], {{{z}, {w}}};",
             t = out(reg64) _, p = in(reg64) p,
             x = in(reg64) v[0], y = in(reg64) v[1], z = in(reg64) v[2], w = in(reg64) v[3],
             options(nostack, preserves_flags));
    }
    #[inline(always)]
    unsafe fn red_add(p: *mut f64, v: f64) {
        asm!("cvta.to.global.u64 {t}, {p}; red.global.add.f64 [{t}], {v};",
             t = out(reg64) _, p = in(reg64) p, v = in(reg64) v,
             options(nostack, preserves_flags));
    }
    #[inline(always)]
    unsafe fn lds(a: u32) -> f64 {
        let v: f64;
        asm!("ld.shared.f64 {v}, [{a}];", a = in(reg32) a, v = out(reg64) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[inline(always)]
    unsafe fn sts(a: u32, v: f64) {
        asm!("st.shared.f64 [{a}], {v};", a = in(reg32) a, v = in(reg64) v,
             options(nostack, preserves_flags));
    }
    #[inline(always)]
    fn shfl_down(v: f64, delta: u32) -> f64 {
        let b = v.to_bits();
        let lo = unsafe { shfl_down_i32(0xffff_ffff, b as u32 as i32, delta, 0x1f) } as u32 as u64;
        let hi = unsafe { shfl_down_i32(0xffff_ffff, (b >> 32) as u32 as i32, delta, 0x1f) } as u32 as u64;
        f64::from_bits(hi << 32 | lo)
    }
}

// --------------------------------------------------------- warp/block sums

/// Sum over the warp by shuffles (depth 5); the result is valid in lane 0.
#[inline(always)]
pub(crate) fn warp_sum<T: Float>(mut v: T) -> T {
    let mut d = 16;
    while d > 0 {
        v += T::shfl_down(v, d);
        d >>= 1;
    }
    v
}

/// Sum over the whole block (blockDim = REDUCE_THREADS; depth 5 + 3); the
/// result is valid in thread 0. Uses REDUCE_WARPS elements of dynamic
/// shared memory at `smem`; ends with a barrier so the caller may call it
/// again at once.
#[inline(always)]
pub(crate) unsafe fn block_sum<T: Float>(v: T, smem: u32) -> T {
    let t = tid();
    let (lane, warp) = (t & 31, t >> 5);
    let v = warp_sum(v);
    if lane == 0 {
        T::sts(smem + T::BYTES * warp, v);
    }
    sync_threads();
    let mut r = T::ZERO;
    if warp == 0 {
        let x = if lane < REDUCE_WARPS { T::lds(smem + T::BYTES * lane) } else { T::ZERO };
        r = warp_sum(x);
    }
    sync_threads();
    r
}
