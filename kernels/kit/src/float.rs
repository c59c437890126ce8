//! [`Float`]: the element types (f32, f64) that kernels are written
//! against, with arithmetic that gives the same results on the GPU and the
//! CPU, and (on nvptx64) the memory accesses the device code needs.
//!
//! Global accesses (nvptx64): `p` is a generic pointer into global memory,
//! converted with `cvta.to.global` so the PTX is sure to use `ld.global` /
//! `st.global` (pointers read from a job table are generic, and LLVM cannot
//! infer their address space). `*_nc` loads go through the read-only
//! (non-coherent) path: only for data nobody writes during the kernel (a
//! job's inputs: outputs never overlap inputs). The 4-element group
//! functions need `p` 16-byte aligned (f32: one `v4.f32`; f64: two
//! `v2.f64`).

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;
use core::fmt::Debug;
use core::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

#[cfg(target_arch = "nvptx64")]
unsafe extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.down.f32"]
    fn shfl_down_f32(mask: u32, v: f32, delta: u32, c: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.down.i32"]
    fn shfl_down_i32(mask: u32, v: i32, delta: u32, c: u32) -> i32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn shfl_bfly_f32(mask: u32, v: f32, lanes: u32, c: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn shfl_bfly_i32(mask: u32, v: i32, lanes: u32, c: u32) -> i32;
}

/// An element type of a kernel: f32 or f64.
///
/// Arithmetic is IEEE in the type itself on both targets. `max`/`min` are
/// IEEE maxNum/minNum (a NaN operand is ignored); `sqrt` and `fma` are
/// correctly rounded everywhere; [`Float::exp`] is the kit's own (not the
/// platform's libm), so GPU and CPU results agree bit for bit.
pub trait Float:
    Copy
    + Default
    + Debug
    + PartialEq
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
{
    const ZERO: Self;
    const ONE: Self;
    const INFINITY: Self;
    const NEG_INFINITY: Self;
    const NAN: Self;
    /// Size in bytes.
    const BYTES: u32;
    /// `"f32"` / `"f64"`: the suffix of the entry names.
    const NAME: &'static str;

    /// Rounds to nearest (f32) / the identity (f64): how a scalar argument
    /// (an f64) becomes the element type.
    fn from_f64(x: f64) -> Self;
    /// Exact.
    fn to_f64(self) -> f64;
    /// IEEE maxNum: the larger, a NaN operand ignored.
    fn max(self, other: Self) -> Self;
    /// IEEE minNum: the smaller, a NaN operand ignored.
    fn min(self, other: Self) -> Self;
    fn abs(self) -> Self;
    /// `self * b + c` with one rounding.
    fn fma(self, b: Self, c: Self) -> Self;
    /// Correctly rounded.
    fn sqrt(self) -> Self;
    /// e^self, within 2 units in the last place; the same bits on every
    /// target ([`exp_f32`], [`exp_f64`]). Large negative → 0, overflow →
    /// +inf, NaN → NaN.
    fn exp(self) -> Self;
    fn is_nan(self) -> bool;

    /// Global load (`p` generic, in global memory).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn ldg(p: *const Self) -> Self;
    /// Global load through the read-only path.
    #[cfg(target_arch = "nvptx64")]
    unsafe fn ldg_nc(p: *const Self) -> Self;
    /// 4 consecutive elements (`p` 16-byte aligned).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn ldg4(p: *const Self) -> [Self; 4];
    /// 4 consecutive elements through the read-only path (`p` 16-byte aligned).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn ldg4_nc(p: *const Self) -> [Self; 4];
    #[cfg(target_arch = "nvptx64")]
    unsafe fn stg(p: *mut Self, v: Self);
    /// 4 consecutive elements (`p` 16-byte aligned).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn stg4(p: *mut Self, v: [Self; 4]);
    /// `red.global.add`: atomic `*p += v` (sm_60+ for f64).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn red_add(p: *mut Self, v: Self);
    /// Shared memory at the 32-bit shared-window address `a`.
    #[cfg(target_arch = "nvptx64")]
    unsafe fn lds(a: u32) -> Self;
    #[cfg(target_arch = "nvptx64")]
    unsafe fn sts(a: u32, v: Self);
    /// `v` of lane `lane + delta` (own value past lane 31; full warp).
    #[cfg(target_arch = "nvptx64")]
    fn shfl_down(v: Self, delta: u32) -> Self;
    /// `v` of lane `lane ^ mask` (full warp).
    #[cfg(target_arch = "nvptx64")]
    fn shfl_xor(v: Self, mask: u32) -> Self;
}

// ---------------------------------------------------------------- exp

/// e^x in f64 arithmetic only: x = k·ln2 + r (|r| ≤ ln2/2, Cody–Waite),
/// e^r by its Taylor polynomial to degree 13 (truncation < 5e-18), times
/// 2^k applied as two exact powers of two (one rounding, also into the
/// subnormals). Every multiply-add is an explicit fma, so llc's
/// `--fp-contract=fast` on the GPU finds nothing left to fuse and both
/// targets run exactly the same operations.
pub fn exp_f64(x: f64) -> f64 {
    const LOG2E: f64 = core::f64::consts::LOG2_E;
    // ln 2 split (fdlibm's) so that k·LN2_HI is exact for |k| < 2^11:
    // 6.93147180369123816490e-01 and 1.90821492927058770002e-10.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    // 1.5·2^52: adding it rounds to an integer (round to nearest even).
    const SHIFT: f64 = 6755399441055744.0;
    if x.is_nan() {
        return x;
    }
    // Beyond these the result is inf / 0; inside them k stays in
    // [-1076, 1024], whose halves are normal powers of two.
    if x > 710.0 {
        return f64::INFINITY;
    }
    if x < -746.0 {
        return 0.0;
    }
    let kf = fma64(x, LOG2E, SHIFT) - SHIFT;
    let r = fma64(kf, -LN2_LO, fma64(kf, -LN2_HI, x));
    let mut p = INV_FACT_64[13];
    let mut i = 13;
    while i > 0 {
        i -= 1;
        p = fma64(p, r, INV_FACT_64[i]);
    }
    let k = kf as i32;
    let k1 = k / 2;
    p * pow2_64(k1) * pow2_64(k - k1)
}

/// e^x in f32 arithmetic only, as [`exp_f64`] with a degree-7 polynomial
/// (truncation < 6e-9 relative, a tenth of an f32 ulp).
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    // ln 2 split so that k·LN2_HI is exact for |k| < 2^8:
    // 0.693145751953125 and 1.428606765330187045e-06.
    const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
    const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    // 1.5·2^23
    const SHIFT: f32 = 12582912.0;
    if x.is_nan() {
        return x;
    }
    // k in [-150, 128] inside these bounds.
    if x > 89.0 {
        return f32::INFINITY;
    }
    if x < -104.0 {
        return 0.0;
    }
    let kf = fma32(x, LOG2E, SHIFT) - SHIFT;
    let r = fma32(kf, -LN2_LO, fma32(kf, -LN2_HI, x));
    let mut p = INV_FACT_32[7];
    let mut i = 7;
    while i > 0 {
        i -= 1;
        p = fma32(p, r, INV_FACT_32[i]);
    }
    let k = kf as i32;
    let k1 = k / 2;
    p * pow2_32(k1) * pow2_32(k - k1)
}

/// 1/i! for i = 0..=13, each correctly rounded (const evaluation is IEEE).
const INV_FACT_64: [f64; 14] = {
    let mut t = [1.0f64; 14];
    let mut f = 1.0f64; // i!, exact up to 18!
    let mut i = 1;
    while i < 14 {
        f *= i as f64;
        t[i] = 1.0 / f;
        i += 1;
    }
    t
};

const INV_FACT_32: [f32; 8] = {
    let mut t = [1.0f32; 8];
    let mut i = 0;
    while i < 8 {
        t[i] = INV_FACT_64[i] as f32;
        i += 1;
    }
    t
};

/// 2^k for a normal power (-1022 ≤ k ≤ 1023).
fn pow2_64(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// 2^k for a normal power (-126 ≤ k ≤ 127).
fn pow2_32(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

#[inline(always)]
fn fma64(a: f64, b: f64, c: f64) -> f64 {
    // A call to libm's fma on hosts without the instruction: slow but exact.
    #[allow(unused_unsafe)]
    unsafe {
        core::intrinsics::fmaf64(a, b, c)
    }
}

#[inline(always)]
fn fma32(a: f32, b: f32, c: f32) -> f32 {
    #[allow(unused_unsafe)]
    unsafe {
        core::intrinsics::fmaf32(a, b, c)
    }
}

// ------------------------------------------------------------- the impls

macro_rules! portable_float {
    ($t:ident, $bytes:literal, $fma:ident, $exp:ident, $sqrt:ident) => {
        const ZERO: $t = 0.0;
        const ONE: $t = 1.0;
        const INFINITY: $t = $t::INFINITY;
        const NEG_INFINITY: $t = $t::NEG_INFINITY;
        const NAN: $t = $t::NAN;
        const BYTES: u32 = $bytes;
        const NAME: &'static str = stringify!($t);
        #[inline(always)]
        fn to_f64(self) -> f64 {
            self as f64
        }
        #[inline(always)]
        fn max(self, o: $t) -> $t {
            $t::max(self, o)
        }
        #[inline(always)]
        fn min(self, o: $t) -> $t {
            $t::min(self, o)
        }
        #[inline(always)]
        fn abs(self) -> $t {
            $t::abs(self)
        }
        #[inline(always)]
        fn fma(self, b: $t, c: $t) -> $t {
            $fma(self, b, c)
        }
        #[inline(always)]
        fn sqrt(self) -> $t {
            #[allow(unused_unsafe)]
            unsafe {
                core::intrinsics::$sqrt(self)
            }
        }
        #[inline(always)]
        fn exp(self) -> $t {
            $exp(self)
        }
        #[inline(always)]
        fn is_nan(self) -> bool {
            $t::is_nan(self)
        }
    };
}

impl Float for f32 {
    portable_float!(f32, 4, fma32, exp_f32, sqrtf32);
    #[inline(always)]
    fn from_f64(x: f64) -> f32 {
        x as f32
    }

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn ldg(p: *const f32) -> f32 {
        let v: f32;
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.f32 {v}, [{t}];",
             t = out(reg64) _, p = in(reg64) p, v = out(reg32) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn ldg_nc(p: *const f32) -> f32 {
        let v: f32;
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.nc.f32 {v}, [{t}];",
             t = out(reg64) _, p = in(reg64) p, v = out(reg32) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn ldg4(p: *const f32) -> [f32; 4] {
        let (x, y, z, w): (f32, f32, f32, f32);
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.v4.f32 {{{x}, {y}, {z}, {w}}}, [{t}];",
             t = out(reg64) _, p = in(reg64) p,
             x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
             options(pure, readonly, nostack, preserves_flags));
        [x, y, z, w]
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn ldg4_nc(p: *const f32) -> [f32; 4] {
        let (x, y, z, w): (f32, f32, f32, f32);
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.nc.v4.f32 {{{x}, {y}, {z}, {w}}}, [{t}];",
             t = out(reg64) _, p = in(reg64) p,
             x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
             options(pure, readonly, nostack, preserves_flags));
        [x, y, z, w]
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn stg(p: *mut f32, v: f32) {
        asm!("cvta.to.global.u64 {t}, {p}; st.global.f32 [{t}], {v};",
             t = out(reg64) _, p = in(reg64) p, v = in(reg32) v,
             options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn stg4(p: *mut f32, v: [f32; 4]) {
        asm!("cvta.to.global.u64 {t}, {p}; st.global.v4.f32 [{t}], {{{x}, {y}, {z}, {w}}};",
             t = out(reg64) _, p = in(reg64) p,
             x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
             options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn red_add(p: *mut f32, v: f32) {
        asm!("cvta.to.global.u64 {t}, {p}; red.global.add.f32 [{t}], {v};",
             t = out(reg64) _, p = in(reg64) p, v = in(reg32) v,
             options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn lds(a: u32) -> f32 {
        let v: f32;
        asm!("ld.shared.f32 {v}, [{a}];", a = in(reg32) a, v = out(reg32) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn sts(a: u32, v: f32) {
        asm!("st.shared.f32 [{a}], {v};", a = in(reg32) a, v = in(reg32) v,
             options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn shfl_down(v: f32, delta: u32) -> f32 {
        unsafe { shfl_down_f32(0xffff_ffff, v, delta, 0x1f) }
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn shfl_xor(v: f32, mask: u32) -> f32 {
        unsafe { shfl_bfly_f32(0xffff_ffff, v, mask, 0x1f) }
    }
}

impl Float for f64 {
    portable_float!(f64, 8, fma64, exp_f64, sqrtf64);
    #[inline(always)]
    fn from_f64(x: f64) -> f64 {
        x
    }

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn ldg(p: *const f64) -> f64 {
        let v: f64;
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.f64 {v}, [{t}];",
             t = out(reg64) _, p = in(reg64) p, v = out(reg64) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn ldg_nc(p: *const f64) -> f64 {
        let v: f64;
        asm!("cvta.to.global.u64 {t}, {p}; ld.global.nc.f64 {v}, [{t}];",
             t = out(reg64) _, p = in(reg64) p, v = out(reg64) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[cfg(target_arch = "nvptx64")]
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
    #[cfg(target_arch = "nvptx64")]
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
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn stg(p: *mut f64, v: f64) {
        asm!("cvta.to.global.u64 {t}, {p}; st.global.f64 [{t}], {v};",
             t = out(reg64) _, p = in(reg64) p, v = in(reg64) v,
             options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn stg4(p: *mut f64, v: [f64; 4]) {
        asm!("cvta.to.global.u64 {t}, {p};",
             "st.global.v2.f64 [{t}], {{{x}, {y}}};",
             "st.global.v2.f64 [{t}+16], {{{z}, {w}}};",
             t = out(reg64) _, p = in(reg64) p,
             x = in(reg64) v[0], y = in(reg64) v[1], z = in(reg64) v[2], w = in(reg64) v[3],
             options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn red_add(p: *mut f64, v: f64) {
        asm!("cvta.to.global.u64 {t}, {p}; red.global.add.f64 [{t}], {v};",
             t = out(reg64) _, p = in(reg64) p, v = in(reg64) v,
             options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn lds(a: u32) -> f64 {
        let v: f64;
        asm!("ld.shared.f64 {v}, [{a}];", a = in(reg32) a, v = out(reg64) v,
             options(pure, readonly, nostack, preserves_flags));
        v
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    unsafe fn sts(a: u32, v: f64) {
        asm!("st.shared.f64 [{a}], {v};", a = in(reg32) a, v = in(reg64) v,
             options(nostack, preserves_flags));
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn shfl_down(v: f64, delta: u32) -> f64 {
        // Two 32-bit shuffles: PTX shuffles 32-bit registers only.
        let b = v.to_bits();
        let lo = unsafe { shfl_down_i32(0xffff_ffff, b as u32 as i32, delta, 0x1f) } as u32 as u64;
        let hi = unsafe { shfl_down_i32(0xffff_ffff, (b >> 32) as u32 as i32, delta, 0x1f) } as u32 as u64;
        f64::from_bits(hi << 32 | lo)
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn shfl_xor(v: f64, mask: u32) -> f64 {
        let b = v.to_bits();
        let lo = unsafe { shfl_bfly_i32(0xffff_ffff, b as u32 as i32, mask, 0x1f) } as u32 as u64;
        let hi = unsafe { shfl_bfly_i32(0xffff_ffff, (b >> 32) as u32 as i32, mask, 0x1f) } as u32 as u64;
        f64::from_bits(hi << 32 | lo)
    }
}
