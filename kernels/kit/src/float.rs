//! [`Float`]: the float element types (f32, f64) the kernel macros are
//! written against, with arithmetic and math that give the same results on
//! the GPU and the CPU, and (on nvptx64) the memory accesses the device code
//! needs. What floats share with integers ([`Numeric`]: `ZERO`, `ONE`,
//! `NAME`, `BYTES`, `from_f64`, `to_f64`) is inherited from
//! [`crate::element`].
//!
//! # Math
//! Every function beyond `+ - * /`, `sqrt`, `fma`, `abs` and `recip` is the `libm`
//! crate's (musl's algorithms in pure `no_std` Rust), compiled from the same
//! source for the host and for nvptx64 (`-Zbuild-std=core`; ptxas accepts
//! it for sm_90). Accuracy against a float64 reference: for f32, in f32
//! ulps, the distance to glibc's f64 result of the same argument (0.5 is
//! correct rounding); for f64, the distance in ulps to glibc's result
//! (glibc is itself within about 1 ulp, so these bound both libraries'
//! errors together). Host: worst over 7 runs of `tests/math.rs` (100,000
//! random arguments per range and type over each function's range, plus
//! its edges and specials; x86-64). GPU: worst over 2 runs of
//! `gpu_tests/run.py` (32,768 random arguments per type and function plus
//! the specials, against Python's `math`, i.e. glibc) on an H100:
//!
//! | function | host f32 | host f64 | GPU f32 | GPU f64 |
//! |---|---|---|---|---|
//! | recip (one GPU run) | 0.50 | 0 | 0.50 | 0 |
//! | exp | 0.87 | 1 | 0.86 | 1 |
//! | exp2 | 0.50 | 1 | 0.50 | 1 |
//! | exp10 | 3.64 | 4 | 3.50 | 3 |
//! | expm1 | 0.77 | 1 | 0.76 | 1 |
//! | log | 0.82 | 1 | 0.69 | 1 |
//! | log1p | 0.83 | 1 | 0.64 | 1 |
//! | log2 | 0.84 | 1 | 0.73 | 1 |
//! | log10 | 0.83 | 2 | 0.76 | 1 |
//! | pow | 0.82 | 1 | 0.79 | 1 |
//! | cbrt | 0.50 | 0 | 0.50 | 3 |
//! | hypot | 0.84 | 1 | 0.84 | 1 |
//! | sin | 0.50 | 1 | 0.50 | 1 |
//! | cos | 0.50 | 1 | 0.50 | 1 |
//! | tan | 0.80 | 1 | 0.80 | 1 |
//! | asin | 0.71 | 1 | 0.68 | 1 |
//! | acos | 0.90 | 1 | 0.86 | 1 |
//! | atan | 0.81 | 1 | 0.76 | 1 |
//! | atan2 | 1.43 | 1 | 1.47 | 1 |
//! | sinh | 1.78 | 2 | 1.61 | 1 |
//! | cosh | 1.27 | 1 | 1.19 | 2 |
//! | tanh | 2.15 | 3 | 1.95 | 2 |
//! | asinh | 1.44 | 1 | 1.44 | 1 |
//! | acosh | 1.98 | 1 | 1.41 | 1 |
//! | atanh | 1.64 | 1 | 1.61 | 1 |
//! | erf | 0.85 | 1 | 0.79 | 1 |
//! | erfc | 3.11 | 4 | 2.55 | 3 |
//! | lgamma | 2.47 | 4 | 1.89 | 10470 |
//! | tgamma | 0.50 | 9 | 0.50 | 8 |
//! | floor, ceil, round, trunc, fmod | 0 | 0 | 0 | 0 |
//!
//! [`MATH_ULPS`] holds each function's bound, the one `tests/math.rs`
//! (host) and `gpu_tests/run.py` (GPU) enforce, [`GPU_F64_ULPS`] the wider
//! GPU bounds of f64 cbrt and lgamma. The GPU's results may differ from
//! the host's in the last bits: the PTX link step fuses multiplies and adds
//! (`llc --fp-contract=fast`), which the host build does not. lgamma's
//! 10,470 ulps are near its zero at 1 (x = 0.9996, a result of 4e-4): an
//! absolute error of about 3e-16.
//!
//! # Global and shared accesses (nvptx64; on the host a GPU body's, run on the CPU)
//! `ldg`/`ldg_nc`/`stg`/`lds`/`sts` are [`crate::Element`]'s `load`/`load_nc`/
//! `store`/`load_shared`/`store_shared` under the names the built-in
//! kernels use. The 4-element group functions need `p` 16-byte aligned
//! (f32: one `v4.f32`; f64: two `v2.f64`).

use crate::element::Numeric;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;
use core::ops::Neg;

/// A float element type: f32 or f64.
///
/// Arithmetic is IEEE in the type itself on both targets. `max`/`min` are
/// IEEE maxNum/minNum (a NaN operand is ignored); `sqrt` and `fma` are
/// correctly rounded everywhere; the other functions are `libm`'s (see the
/// module's table for their accuracy).
pub trait Float: Numeric + Neg<Output = Self> {
    const INFINITY: Self;
    const NEG_INFINITY: Self;
    const NAN: Self;
    /// π, e, ln 2, 1/√2, √2 rounded to the type.
    const PI: Self;
    const E: Self;
    const LN_2: Self;
    const FRAC_1_SQRT_2: Self;
    const SQRT_2: Self;

    /// IEEE maxNum: the larger, a NaN operand ignored.
    fn max(self, other: Self) -> Self;
    /// IEEE minNum: the smaller, a NaN operand ignored.
    fn min(self, other: Self) -> Self;
    fn abs(self) -> Self;
    /// `self * b + c` with one rounding.
    fn fma(self, b: Self, c: Self) -> Self;
    /// Correctly rounded.
    fn sqrt(self) -> Self;
    /// 1/self within 1 ulp, without a division on the GPU: for f32 the
    /// hardware's approximation refined by one Newton step, a handful of
    /// instructions and no branch, where `1.0 / x` is a correctly rounded
    /// division with a slow path behind a branch (a kernel's elements then
    /// diverge). f64, and the host, divide. ±0 gives ±∞, ±∞ gives ±0, NaN
    /// gives NaN, on both.
    fn recip(self) -> Self;
    fn is_nan(self) -> bool;
    /// Neither infinite nor NaN.
    fn is_finite(self) -> bool;

    // libm's functions (module docs: accuracy).
    /// e^self. Large negative → 0, overflow → +inf, NaN → NaN.
    fn exp(self) -> Self;
    /// 2^self.
    fn exp2(self) -> Self;
    /// 10^self.
    fn exp10(self) -> Self;
    /// e^self − 1, accurate near 0.
    fn expm1(self) -> Self;
    /// Natural logarithm (C's `log`; std's `ln`).
    fn log(self) -> Self;
    /// ln(1 + self), accurate near 0.
    fn log1p(self) -> Self;
    fn log2(self) -> Self;
    fn log10(self) -> Self;
    /// self^y (C's `pow`).
    fn pow(self, y: Self) -> Self;
    fn cbrt(self) -> Self;
    /// √(self² + y²) without overflow in between.
    fn hypot(self, y: Self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tan(self) -> Self;
    fn asin(self) -> Self;
    fn acos(self) -> Self;
    fn atan(self) -> Self;
    /// The angle of (x = `x`, y = `self`), in (−π, π] (C's `atan2(self, x)`).
    fn atan2(self, x: Self) -> Self;
    fn sinh(self) -> Self;
    fn cosh(self) -> Self;
    fn tanh(self) -> Self;
    fn asinh(self) -> Self;
    fn acosh(self) -> Self;
    fn atanh(self) -> Self;
    /// The error function, 2/√π ∫₀ˣ e^(−t²) dt.
    fn erf(self) -> Self;
    /// 1 − erf(self), accurate where erf is near 1.
    fn erfc(self) -> Self;
    /// Γ(self).
    fn tgamma(self) -> Self;
    /// ln |Γ(self)|.
    fn lgamma(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    /// To the nearest integer, halves away from zero.
    fn round(self) -> Self;
    fn trunc(self) -> Self;
    /// The remainder of self / y with the sign of self (C's `fmod`).
    fn fmod(self, y: Self) -> Self;

    /// Global load (`p` generic, in global memory).
    #[inline(always)]
    unsafe fn ldg(p: *const Self) -> Self {
        Self::load(p)
    }
    /// Global load through the read-only path.
    #[inline(always)]
    unsafe fn ldg_nc(p: *const Self) -> Self {
        Self::load_nc(p)
    }
    /// 4 consecutive elements (`p` 16-byte aligned).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn ldg4(p: *const Self) -> [Self; 4];
    /// 4 consecutive elements through the read-only path (`p` 16-byte aligned).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn ldg4_nc(p: *const Self) -> [Self; 4];
    #[inline(always)]
    unsafe fn stg(p: *mut Self, v: Self) {
        Self::store(p, v)
    }
    /// 4 consecutive elements (`p` 16-byte aligned).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn stg4(p: *mut Self, v: [Self; 4]);
    /// `red.global.add`: atomic `*p += v` (sm_60+ for f64); see
    /// [`crate::atomic::add`] for the form that returns the old value.
    #[cfg(target_arch = "nvptx64")]
    unsafe fn red_add(p: *mut Self, v: Self);
    /// 4 consecutive elements (host: a GPU body on the CPU).
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    unsafe fn ldg4(p: *const Self) -> [Self; 4] {
        // One check for the four where they all lie in the argument.
        match crate::emu::checked_span(p as u64, 4 * core::mem::size_of::<Self>()) {
            Some(a) => {
                let q = a as *const Self;
                [q.read(), q.add(1).read(), q.add(2).read(), q.add(3).read()]
            }
            None => core::array::from_fn(|i| Self::load(p.add(i))),
        }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    unsafe fn ldg4_nc(p: *const Self) -> [Self; 4] {
        Self::ldg4(p)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    unsafe fn stg4(p: *mut Self, v: [Self; 4]) {
        match crate::emu::checked_span(p as u64, 4 * core::mem::size_of::<Self>()) {
            Some(a) => (a as *mut [Self; 4]).write_unaligned(v),
            None => {
                for (i, x) in v.into_iter().enumerate() {
                    Self::store(p.add(i), x)
                }
            }
        }
    }
    /// Atomic `*p += v` (a compare-and-swap loop on the bits).
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    unsafe fn red_add(p: *mut Self, v: Self) {
        crate::atomic::add_bits(p, v)
    }
    /// Shared memory at the 32-bit shared-window address `a`.
    #[inline(always)]
    unsafe fn lds(a: u32) -> Self {
        Self::load_shared(a)
    }
    #[inline(always)]
    unsafe fn sts(a: u32, v: Self) {
        Self::store_shared(a, v)
    }
    /// `v` of lane `lane + delta` (own value past lane 31; full warp).
    #[inline(always)]
    fn shfl_down(v: Self, delta: u32) -> Self {
        crate::warp::shfl_down(v, delta)
    }
    /// `v` of lane `lane ^ mask` (full warp).
    #[inline(always)]
    fn shfl_xor(v: Self, mask: u32) -> Self {
        crate::warp::shfl_xor(v, mask)
    }
}

/// Each function's bound in ulps of the result type (libm's, and
/// `recip`'s: the GPU's f32 is within 1 ulp, every other is a division),
/// against a float64 reference: `(name, f32 bound, f64 bound)`. The host test
/// (`tests/math.rs`) and the GPU test (`gpu_tests/run.py`, which reads this
/// table from the source) fail above it. For f64 the reference is glibc's
/// (itself within about 1 ulp, correctly rounded for exp, log, pow, sin,
/// cos), so a bound there covers both libraries' errors.
pub const MATH_ULPS: &[(&str, f64, f64)] = &[
    ("recip", 1.0, 0.5),
    ("exp", 1.0, 2.0),
    ("exp2", 1.0, 2.0),
    ("exp10", 4.5, 6.0),
    ("expm1", 1.0, 2.0),
    ("log", 1.0, 2.0),
    ("log1p", 1.0, 2.0),
    ("log2", 1.0, 2.0),
    ("log10", 1.0, 3.0),
    ("pow", 1.0, 2.0),
    ("cbrt", 1.0, 1.0),
    ("hypot", 1.0, 2.0),
    ("sin", 1.0, 2.0),
    ("cos", 1.0, 2.0),
    ("tan", 1.0, 2.0),
    ("asin", 1.0, 2.0),
    ("acos", 1.0, 2.0),
    ("atan", 1.0, 2.0),
    ("atan2", 2.0, 2.0),
    ("sinh", 2.0, 3.0),
    ("cosh", 1.5, 2.0),
    ("tanh", 2.5, 4.0),
    ("asinh", 2.0, 2.0),
    ("acosh", 2.5, 2.0),
    ("atanh", 2.0, 2.0),
    ("erf", 1.0, 2.0),
    ("erfc", 3.5, 5.0),
    ("lgamma", 3.0, 5.0),
    ("tgamma", 1.0, 12.0),
    ("floor", 0.0, 0.0),
    ("ceil", 0.0, 0.0),
    ("round", 0.0, 0.0),
    ("trunc", 0.0, 0.0),
    ("fmod", 0.0, 0.0),
];

/// Where the GPU's f64 results need a wider bound than [`MATH_ULPS`]:
/// `(name, f64 bound)`, enforced by `gpu_tests/run.py`. The PTX link step
/// fuses multiplies and adds, which upsets the compensated steps of these
/// two: cbrt's last correction (3 ulps), and lgamma near its zeros at 1 and
/// 2, where the result is small and its absolute error (about 3e-16, an ulp
/// of 1.0) is many of its own ulps.
pub const GPU_F64_ULPS: &[(&str, f64)] = &[("cbrt", 4.0), ("lgamma", 1e5)];

// ------------------------------------------------------------- the impls

macro_rules! portable_float {
    ($t:ident, $fma:ident, $sqrt:ident,
     [$($f:ident = $lf:ident),* $(,)?], [$($g:ident($y:ident) = $lg:ident),* $(,)?]) => {
        const INFINITY: $t = $t::INFINITY;
        const NEG_INFINITY: $t = $t::NEG_INFINITY;
        const NAN: $t = $t::NAN;
        const PI: $t = core::$t::consts::PI;
        const E: $t = core::$t::consts::E;
        const LN_2: $t = core::$t::consts::LN_2;
        const FRAC_1_SQRT_2: $t = core::$t::consts::FRAC_1_SQRT_2;
        const SQRT_2: $t = core::$t::consts::SQRT_2;
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
            // One instruction on the GPU; on hosts without it a call to
            // libm's fma, slow but exact.
            #[allow(unused_unsafe)]
            unsafe {
                core::intrinsics::$fma(self, b, c)
            }
        }
        #[inline(always)]
        fn sqrt(self) -> $t {
            #[allow(unused_unsafe)]
            unsafe {
                core::intrinsics::$sqrt(self)
            }
        }
        #[inline(always)]
        fn is_nan(self) -> bool {
            $t::is_nan(self)
        }
        #[inline(always)]
        fn is_finite(self) -> bool {
            $t::is_finite(self)
        }
        $(
            #[inline(always)]
            fn $f(self) -> $t {
                libm::$lf(self)
            }
        )*
        $(
            #[inline(always)]
            fn $g(self, $y: $t) -> $t {
                libm::$lg(self, $y)
            }
        )*
    };
}

impl Float for f32 {
    #[inline(always)]
    fn recip(self) -> f32 {
        #[cfg(target_arch = "nvptx64")]
        {
            // rcp.approx.f32 is within 1 ulp (subnormals kept: no .ftz);
            // one Newton step on its residual halves that. Where the
            // residual is not finite (0, ±inf, NaN, or a reciprocal past
            // the range) the approximation is already the answer.
            let r: f32;
            // SAFETY: a register operation.
            unsafe {
                asm!("rcp.approx.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) self,
                     options(pure, nomem, nostack, preserves_flags))
            };
            let e = Float::fma(-self, r, 1.0);
            if e.is_finite() { Float::fma(r, e, r) } else { r }
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            1.0 / self
        }
    }
    portable_float!(f32, fmaf32, sqrtf32,
        [exp = expf, exp2 = exp2f, exp10 = exp10f, expm1 = expm1f, log = logf, log1p = log1pf,
         log2 = log2f, log10 = log10f, cbrt = cbrtf, sin = sinf, cos = cosf, tan = tanf, asin = asinf,
         acos = acosf, atan = atanf, sinh = sinhf, cosh = coshf, tanh = tanhf, asinh = asinhf,
         acosh = acoshf, atanh = atanhf, erf = erff, erfc = erfcf, tgamma = tgammaf, lgamma = lgammaf,
         floor = floorf, ceil = ceilf, round = roundf, trunc = truncf],
        [pow(y) = powf, hypot(y) = hypotf, atan2(x) = atan2f, fmod(y) = fmodf]);

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
}

impl Float for f64 {
    #[inline(always)]
    fn recip(self) -> f64 {
        1.0 / self
    }
    portable_float!(f64, fmaf64, sqrtf64,
        [exp = exp, exp2 = exp2, exp10 = exp10, expm1 = expm1, log = log, log1p = log1p,
         log2 = log2, log10 = log10, cbrt = cbrt, sin = sin, cos = cos, tan = tan, asin = asin,
         acos = acos, atan = atan, sinh = sinh, cosh = cosh, tanh = tanh, asinh = asinh,
         acosh = acosh, atanh = atanh, erf = erf, erfc = erfc, tgamma = tgamma, lgamma = lgamma,
         floor = floor, ceil = ceil, round = round, trunc = trunc],
        [pow(y) = pow, hypot(y) = hypot, atan2(x) = atan2, fmod(y) = fmod]);

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
}
