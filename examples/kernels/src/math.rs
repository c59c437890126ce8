//! Math shared by both backends: the f32 `exp` of a non-positive argument
//! and GELU, written once so the GPU and the CPU compute the same thing
//! (up to the multiply-adds the PTX link step fuses), and `u8 / 255`.
//!
//! Why not the kit's `Float::exp`/`erf` (libm) for f32: musl's `expf` works
//! in f64 with a table in global memory, and its `erff` picks one of four
//! rational functions (divisions) by |x|, two of them with two `expf`
//! calls, so a warp of mixed inputs runs several paths. At the H200's
//! bandwidth (4.1 TB/s) and issue rate (132 SMs × 128 lanes × 1.98 GHz) a
//! map of f32 affords about 60 instructions an element before arithmetic,
//! not memory, sets its time; [`gelu_f32`] takes about 60 (its PTX),
//! libm's path several times that (estimated from its source). The
//! functions below use f32 arithmetic only (one division, polynomials
//! whose coefficients were fitted for this file, Chebyshev nodes against
//! libm's f64 `erfc`/`expm1`), no branches that diverge within a warp, and
//! are checked against f64 by `tests.rs`. f64 keeps libm.

use erlcuda_kernel::Float;

/// 2^-64: the scale that [`exp_le0_parts`] keeps out of its power of two,
/// so that results down to the smallest subnormal are rounded once.
const TWO_M64: f32 = 5.421011e-20;

/// e^y = (1 + pm1) · s · 2^-64 for y ≤ 0 (or NaN): `(pm1, s)`, `s` a power
/// of two (0 once e^y is below half the smallest subnormal f32).
///
/// y = j·ln2 + r with |r| ≤ ln2/2 (Cody–Waite: ln2 in two parts, the first
/// with 15 significant bits so j·LN2_HI is exact), e^r − 1 = r + r²·P(r)
/// (P of degree 4, 1.1e-8 relative to e^r on |r| ≤ 0.35). j comes out of
/// the bits of y·log2e + 1.5·2^23, which is j + 1.5·2^23 exactly.
#[inline(always)]
fn exp_le0_parts(y: f32) -> (f32, f32) {
    const SHIFT: f32 = 12582912.0;
    const LN2_HI: f32 = 0.69314575;
    const LN2_LO: f32 = 1.4286068e-6;
    const P: [f32; 5] = [
        0.5,
        1.6666573e-1,
        4.1666456e-2,
        8.363769e-3,
        1.3934535e-3,
    ];
    // e^-104 < 2^-150: rounds to 0. The clamp keeps -inf out of the
    // arithmetic (it would give NaN); NaN passes (a comparison with it is
    // false) and comes out NaN.
    let under = y < -104.0;
    let y = if under { -104.0 } else { y };
    let t = y * core::f32::consts::LOG2_E + SHIFT;
    let j = t - SHIFT;
    let r = (y - j * LN2_HI) - j * LN2_LO;
    let p = (((P[4] * r + P[3]) * r + P[2]) * r + P[1]) * r + P[0];
    let pm1 = (r * r) * p + r;
    // j in [-150, 0]: 2^(j + 64) is a normal f32.
    let j = (t.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    let s = f32::from_bits(((j + 64 + 127) as u32) << 23);
    (pm1, if under { 0.0 } else { s })
}

/// e^y for y ≤ 0, within about 1 ulp (subnormal results included); NaN
/// gives NaN, −∞ gives 0. (For y > 0 the result is meaningless: callers
/// pass x − max.)
#[inline(always)]
pub fn exp_le0_f32(y: f32) -> f32 {
    let (pm1, s) = exp_le0_parts(y);
    (1.0 + pm1) * s * TWO_M64
}

/// e^y for y ≤ 0 in T: the f32 form above, libm's for f64.
#[inline(always)]
pub fn exp_le0<T: Float>(y: T) -> T {
    if T::BYTES == 4 {
        T::from_bits64(exp_le0_f32(f32::from_bits(y.to_bits64() as u32)).to_bits() as u64)
    } else {
        y.exp()
    }
}

/// GELU, x·Φ(x) = x·(1 + erf(x/√2))/2, in T.
#[inline(always)]
pub fn gelu<T: Float>(x: T) -> T {
    if T::BYTES == 4 {
        T::from_bits64(gelu_f32(f32::from_bits(x.to_bits64() as u32)).to_bits() as u64)
    } else {
        T::from_bits64(gelu_f64(f64::from_bits(x.to_bits64())).to_bits())
    }
}

/// R(q) = ((1 + 2a)·erfcx(a) − 1) / (1 + q), a = 2(1 + q)/(1 − q), on
/// q ∈ [−1, 0.7] (a ∈ [0, 11.33]): Shepherd and Laframboise's variable
/// (Math. Comp. 36, 1981) for erfcx(a) = e^(a²)·erfc(a), divided by 1 + q
/// so that the product is accurate where it is small (a → 0). Degree 10,
/// 5e-9 absolute in (1 + 2a)·erfcx(a) − 1.
const ERFCX_R: [f32; 11] = [
    2.7697837e-1,
    -3.6974224e-1,
    2.0371152e-1,
    -3.965984e-2,
    -1.4555161e-2,
    6.5206895e-3,
    2.1733718e-3,
    -9.158225e-4,
    -4.717544e-4,
    7.811189e-5,
    6.538214e-5,
];

/// GELU in f32, within 3.5 ulp of x·Φ(x) for every x, with or without the
/// GPU's fused multiply-adds (tests.rs checks the host's against f64 over
/// every 97th f32 below 16 in magnitude; the fused form was checked the
/// same way when the coefficients were fitted). On an H100 the GPU's,
/// with its reciprocal ([`Float::recip`]), was within 3.38 ulp of an f64
/// reference over 2^26 random arguments, the same bits as with a division.
///
/// Φ comes from erfc, not from 1 + erf: for x < 0 the formula's 1 + erf
/// cancels (at x = −5 it keeps two bits), while x·erfc(|x|/√2)/2 keeps
/// all of them. erfc(a) = erfcx(a)·e^(−a²) with a² = x²/2 taken from x
/// itself (e^(−a²) amplifies an error in a² by a² ≈ 100 near the end of
/// the range, so a's rounding must not reach it): x·x is split exactly
/// into a sum by one fused multiply-add, and the exponential scaled last,
/// so results near and below the smallest normal are rounded once.
/// ±∞ and NaN follow the formula: gelu(∞) = ∞, gelu(−∞) = NaN (−∞·0),
/// gelu(NaN) = NaN.
#[inline(always)]
pub fn gelu_f32(x: f32) -> f32 {
    // Past |x| = 16, e^(−x²/2) is 0 in f32: clamping keeps ∞ out of the
    // arithmetic (minNum sends NaN to 16; x itself carries NaN through the
    // last product).
    let xa = Float::min(Float::abs(x), 16.0);
    let a = xa * core::f32::consts::FRAC_1_SQRT_2;
    // One reciprocal gives both 1/(a + 2) and 1/(2a + 1).
    let p2 = a + 2.0;
    let h = a + 0.5;
    let rr = Float::recip(p2 * h);
    let t = (2.0 * a) * (rr * h); // q + 1 = 2a/(a + 2), accurate as a → 0
    let q = t - 1.0;
    let r = (rr * p2) * 0.5; // 1/(2a + 1)
    let c = &ERFCX_R;
    let mut rq = c[10];
    let mut i = 10;
    while i > 0 {
        i -= 1;
        rq = rq * q + c[i];
    }
    let p = t * rq; // (1 + 2a)·erfcx(a) − 1
    // g = (1 + p)/(1 + 2a), corrected once against the exact residual.
    let g0 = p * r + r;
    let e = (p - g0) + Float::fma(-2.0 * g0, a, 1.0);
    let g = e * r + g0; // erfcx(a)
    // x²/2 = s + s_lo exactly; e^(−s)(1 − s_lo) = (1 + u)·sc·2^-64.
    let xx = xa * xa;
    let s_lo = Float::fma(xa, xa, -xx) * 0.5;
    let (pm1, sc) = exp_le0_parts(xx * -0.5);
    let u = Float::fma(-s_lo, pm1, pm1 - s_lo);
    let m = g * u + g; // erfc(a) = m·sc·2^-64
    // z = x·erfc(a)/2; gelu(x) = z for x < 0, x − z for x ≥ 0 (z ≤ x/2:
    // no cancellation). x ≥ 0 enters z clamped, so that +∞ gives ∞ − 0,
    // while −∞ gives −∞·0 = NaN, as the formula does.
    let xz = if x < 0.0 { x } else { xa };
    let z = ((0.5 * xz) * m) * sc * TWO_M64;
    if x < 0.0 {
        z
    } else {
        x - z
    }
}

/// GELU in f64 with libm's erfc: Φ(x) = erfc(−x/√2)/2, with the rounding
/// of x/√2 (relative 2^-53, amplified by 2a² in erfc: 60 ulp at x = −10)
/// put back by one term of Taylor's series.
#[inline(always)]
pub fn gelu_f64(x: f64) -> f64 {
    const S: f64 = core::f64::consts::FRAC_1_SQRT_2;
    // 1/√2 − S
    const S_LO: f64 = -4.833646656726457e-17;
    let th = x * S;
    let tl = if Float::is_finite(x) { Float::fma(x, S, -th) + x * S_LO } else { 0.0 };
    // erfc(−th − tl) = erfc(−th) + tl·(2/√π)·e^(−th²) + O(tl²)
    let c = Float::erfc(-th) + tl * core::f64::consts::FRAC_2_SQRT_PI * Float::exp(-(th * th));
    x * (0.5 * c)
}

/// p / 255 correctly rounded, without a division: p as f32 through the
/// bits (2^23 + p is exact), then the product with 1/255 and one
/// correction from its exact residual. tests.rs checks all 256 values
/// against `p as f32 / 255.0`.
#[inline(always)]
pub fn unit_u8(p: u32) -> f32 {
    const INV: f32 = 1.0 / 255.0;
    let x = f32::from_bits(0x4b00_0000 | (p & 0xff)) - 8388608.0;
    let q = x * INV;
    Float::fma(Float::fma(-q, 255.0, x), INV, q)
}
