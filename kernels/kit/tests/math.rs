//! The accuracy of the kit's math (`Float`'s libm functions) against a
//! float64 reference, glibc's (the test binary links it): for f64
//! arguments the distance in ulps to glibc's result; for f32 the distance,
//! in f32 ulps, of the f32 result to glibc's f64 result of the same
//! argument (unrounded, so the table's 0.5 is correct rounding). Random
//! arguments over each function's range (a fresh seed each run, printed),
//! then its edges. Fails above `MATH_ULPS`; prints the worst per function
//! (`cargo +nightly test --test math -- --nocapture`), the figures the
//! kit's docs state. Then IEEE's special cases as fixed arguments
//! ([`IEEE_ARGS`], every pair of them for a two-argument function): where
//! C's result is ±0, ±∞ or NaN the kit's must be the same, sign included
//! (pow(−0, −1) is −∞); elsewhere a finite number of C's sign (its accuracy
//! is what the random arguments measure). `gpu_tests/run.py` holds the GPU
//! to the same grid.

// Edges near π/2 and π are meant to be approximate.
#![allow(clippy::approx_constant)]

use erlcuda_kernel::{Float, MATH_ULPS};

mod glibc {
    extern "C" {
        pub fn exp(x: f64) -> f64;
        pub fn exp2(x: f64) -> f64;
        pub fn exp10(x: f64) -> f64;
        pub fn expm1(x: f64) -> f64;
        pub fn log(x: f64) -> f64;
        pub fn log1p(x: f64) -> f64;
        pub fn log2(x: f64) -> f64;
        pub fn log10(x: f64) -> f64;
        pub fn pow(x: f64, y: f64) -> f64;
        pub fn cbrt(x: f64) -> f64;
        pub fn hypot(x: f64, y: f64) -> f64;
        pub fn sin(x: f64) -> f64;
        pub fn cos(x: f64) -> f64;
        pub fn tan(x: f64) -> f64;
        pub fn asin(x: f64) -> f64;
        pub fn acos(x: f64) -> f64;
        pub fn atan(x: f64) -> f64;
        pub fn atan2(y: f64, x: f64) -> f64;
        pub fn sinh(x: f64) -> f64;
        pub fn cosh(x: f64) -> f64;
        pub fn tanh(x: f64) -> f64;
        pub fn asinh(x: f64) -> f64;
        pub fn acosh(x: f64) -> f64;
        pub fn atanh(x: f64) -> f64;
        pub fn erf(x: f64) -> f64;
        pub fn erfc(x: f64) -> f64;
        pub fn tgamma(x: f64) -> f64;
        pub fn lgamma(x: f64) -> f64;
        pub fn floor(x: f64) -> f64;
        pub fn ceil(x: f64) -> f64;
        pub fn round(x: f64) -> f64;
        pub fn trunc(x: f64) -> f64;
        pub fn fmod(x: f64, y: f64) -> f64;
    }
}

mod common;
use common::Rng;

/// Where arguments are drawn: uniform in [lo, hi), or with a log-uniform
/// magnitude in [lo, hi) (lo > 0) and a random sign when `signed`.
#[derive(Clone, Copy)]
enum Dist {
    Uni(f64, f64),
    Log(f64, f64, bool),
}

impl Dist {
    fn draw(self, r: &mut Rng) -> f64 {
        match self {
            Dist::Uni(lo, hi) => lo + (hi - lo) * r.unit(),
            Dist::Log(lo, hi, signed) => {
                let m = (lo.ln() + (hi.ln() - lo.ln()) * r.unit()).exp();
                if signed && r.next() & 1 == 1 { -m } else { m }
            }
        }
    }
}

/// Ulps of f64 between `got` and `want`: 0 when both are NaN or equal
/// (±0 alike); infinite when only one is NaN.
fn ulps64(got: f64, want: f64) -> f64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() { 0.0 } else { f64::INFINITY };
    }
    if got == want {
        return 0.0;
    }
    let key = |x: f64| {
        let b = x.to_bits() as i64;
        if b < 0 { i64::MIN - b } else { b }
    };
    key(got).abs_diff(key(want)) as f64
}

/// f32 ulps between the f32 `got` and the exact-ish f64 `want`: the
/// distance over the spacing of f32 at `want` (subnormal spacing below
/// f32::MIN_POSITIVE).
fn ulps32(got: f32, want: f64) -> f64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() { 0.0 } else { f64::INFINITY };
    }
    if got as f64 == want {
        return 0.0;
    }
    if want.abs() > f32::MAX as f64 {
        // The reference overflows f32: the result must be inf or MAX.
        return if got.is_infinite() && got.signum() as f64 == want.signum() || got.abs() == f32::MAX {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if got.is_infinite() {
        return f64::INFINITY;
    }
    let e = (want.abs().max(f32::MIN_POSITIVE as f64)).log2().floor();
    let ulp = 2f64.powf(e - 23.0);
    (got as f64 - want).abs() / ulp
}

type F32 = fn(f32, f32) -> f32;
type F64 = fn(f64, f64) -> f64;

struct Case {
    name: &'static str,
    f32: F32,
    f64: F64,
    reference: F64,
    /// Arguments for f32 and for f64 (second argument ignored by unary
    /// functions): each a (first, second) pair of distributions.
    args32: &'static [(Dist, Dist)],
    args64: &'static [(Dist, Dist)],
    /// Edge arguments, for both types.
    edges: &'static [(f64, f64)],
}

const NONE: Dist = Dist::Uni(0.0, 0.0);
const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

macro_rules! unary {
    ($name:ident, $a32:expr, $a64:expr, $edges:expr) => {
        Case {
            name: stringify!($name),
            f32: |x, _| Float::$name(x),
            f64: |x, _| Float::$name(x),
            reference: |x, _| unsafe { glibc::$name(x) },
            args32: $a32,
            args64: $a64,
            edges: $edges,
        }
    };
}

macro_rules! binary {
    ($name:ident, $args:expr, $edges:expr) => {
        Case {
            name: stringify!($name),
            f32: |x, y| Float::$name(x, y),
            f64: |x, y| Float::$name(x, y),
            reference: |x, y| unsafe { glibc::$name(x, y) },
            args32: $args,
            args64: $args,
            edges: $edges,
        }
    };
}

/// Halves, and the last non-integers below 0.5 and 2^52.
const ROUNDING: &[(f64, f64)] = &[(0.5, 0.0), (-0.5, 0.0), (1.5, 0.0), (2.5, 0.0), (-2.5, 0.0), (0.49999999999999994, 0.0), (4503599627370495.5, 0.0), (8388607.5, 0.0)];

const SPECIAL: &[(f64, f64)] = &[(0.0, 1.0), (-0.0, 1.0), (INF, 1.0), (-INF, 1.0), (NAN, 1.0), (1.0, 1.0), (-1.0, 1.0)];

fn cases() -> Vec<Case> {
    use Dist::*;
    vec![
        // 1/x, its reference the float64 division (exact for an f32 x).
        Case {
            name: "recip",
            f32: |x, _| Float::recip(x),
            f64: |x, _| Float::recip(x),
            reference: |x, _| 1.0 / x,
            args32: &[(Log(1e-45, 3e38, true), NONE), (Uni(0.5, 2.0), NONE)],
            args64: &[(Log(1e-320, 1e308, true), NONE), (Uni(0.5, 2.0), NONE)],
            edges: &[(f32::MAX as f64, 0.0), (f32::MIN_POSITIVE as f64, 0.0), (3.0, 0.0), (-7.0, 0.0), (1e-40, 0.0), (5e-324, 0.0)],
        },
        unary!(exp, &[(Uni(-104.0, 89.0), NONE), (Uni(-1.0, 1.0), NONE)], &[(Uni(-746.0, 710.0), NONE), (Uni(-1.0, 1.0), NONE)],
            &[(88.72283, 0.0), (-87.33655, 0.0), (-103.97, 0.0), (709.782712893384, 0.0), (-708.4, 0.0), (-745.13, 0.0), (1e-300, 0.0)]),
        unary!(exp2, &[(Uni(-150.0, 128.0), NONE)], &[(Uni(-1075.0, 1024.0), NONE)], &[(127.99, 0.0), (-149.5, 0.0), (1023.99, 0.0), (-1074.5, 0.0)]),
        unary!(exp10, &[(Uni(-45.0, 38.5), NONE)], &[(Uni(-323.0, 308.2), NONE)], &[(38.0, 0.0), (-44.0, 0.0), (308.0, 0.0), (2.0, 0.0)]),
        unary!(expm1, &[(Uni(-20.0, 88.0), NONE), (Log(1e-10, 1e-2, true), NONE)], &[(Uni(-40.0, 709.0), NONE), (Log(1e-20, 1e-2, true), NONE)], &[(1e-30, 0.0)]),
        unary!(log, &[(Log(1e-45, 3e38, false), NONE), (Uni(0.5, 2.0), NONE)], &[(Log(1e-320, 1e308, false), NONE), (Uni(0.5, 2.0), NONE)], &[(1e-40, 0.0), (5e-324, 0.0), (0.9999999, 0.0)]),
        unary!(log1p, &[(Log(1e-10, 1e30, false), NONE), (Uni(-0.999, 1.0), NONE)], &[(Log(1e-20, 1e300, false), NONE), (Uni(-0.999, 1.0), NONE)], &[(-0.5, 0.0), (1e-30, 0.0)]),
        unary!(log2, &[(Log(1e-45, 3e38, false), NONE), (Uni(0.5, 2.0), NONE)], &[(Log(1e-320, 1e308, false), NONE), (Uni(0.5, 2.0), NONE)], &[(1024.0, 0.0), (3.0, 0.0)]),
        unary!(log10, &[(Log(1e-45, 3e38, false), NONE), (Uni(0.5, 2.0), NONE)], &[(Log(1e-320, 1e308, false), NONE), (Uni(0.5, 2.0), NONE)], &[(1000.0, 0.0), (3.0, 0.0)]),
        binary!(pow, &[(Uni(0.0, 100.0), Uni(-20.0, 20.0)), (Log(1e-3, 1e3, false), Uni(-5.0, 5.0)), (Uni(0.9, 1.1), Uni(-300.0, 300.0))],
            &[(-2.0, 3.0), (-2.0, 0.5), (0.0, -1.0), (2.0, 0.5), (10.0, 20.0), (1.0, NAN), (NAN, 0.0)]),
        unary!(cbrt, &[(Log(1e-40, 3e38, true), NONE)], &[(Log(1e-300, 1e300, true), NONE)], &[(27.0, 0.0), (-8.0, 0.0)]),
        binary!(hypot, &[(Uni(-1e3, 1e3), Uni(-1e3, 1e3)), (Log(1e-30, 1e30, true), Log(1e-30, 1e30, true))], &[(3.0, 4.0), (INF, NAN), (1e30, 1e30)]),
        unary!(sin, &[(Uni(-10.0, 10.0), NONE), (Log(1e-6, 1e6, true), NONE)], &[(Uni(-10.0, 10.0), NONE), (Log(1e-10, 1e10, true), NONE)], &[(3.14159265, 0.0), (1e22, 0.0)]),
        unary!(cos, &[(Uni(-10.0, 10.0), NONE), (Log(1e-6, 1e6, true), NONE)], &[(Uni(-10.0, 10.0), NONE), (Log(1e-10, 1e10, true), NONE)], &[(1.5707963, 0.0), (1e22, 0.0)]),
        unary!(tan, &[(Uni(-10.0, 10.0), NONE), (Log(1e-6, 1e6, true), NONE)], &[(Uni(-10.0, 10.0), NONE), (Log(1e-10, 1e10, true), NONE)], &[(1.5707963, 0.0)]),
        unary!(asin, &[(Uni(-1.0, 1.0), NONE)], &[(Uni(-1.0, 1.0), NONE)], &[(1.5, 0.0), (0.5, 0.0)]),
        unary!(acos, &[(Uni(-1.0, 1.0), NONE)], &[(Uni(-1.0, 1.0), NONE)], &[(1.5, 0.0), (0.5, 0.0)]),
        unary!(atan, &[(Log(1e-10, 1e10, true), NONE)], &[(Log(1e-20, 1e20, true), NONE)], &[]),
        binary!(atan2, &[(Uni(-10.0, 10.0), Uni(-10.0, 10.0)), (Log(1e-10, 1e10, true), Log(1e-10, 1e10, true))],
            &[(0.0, -0.0), (-0.0, -1.0), (1.0, 0.0), (INF, INF), (-INF, -INF)]),
        unary!(sinh, &[(Uni(-89.0, 89.0), NONE), (Uni(-1.0, 1.0), NONE)], &[(Uni(-710.0, 710.0), NONE), (Uni(-1.0, 1.0), NONE)], &[]),
        unary!(cosh, &[(Uni(-89.0, 89.0), NONE), (Uni(-1.0, 1.0), NONE)], &[(Uni(-710.0, 710.0), NONE), (Uni(-1.0, 1.0), NONE)], &[]),
        unary!(tanh, &[(Uni(-20.0, 20.0), NONE), (Log(1e-10, 1.0, true), NONE)], &[(Uni(-40.0, 40.0), NONE), (Log(1e-20, 1.0, true), NONE)], &[]),
        unary!(asinh, &[(Log(1e-10, 1e30, true), NONE)], &[(Log(1e-20, 1e300, true), NONE)], &[]),
        unary!(acosh, &[(Log(1.0, 1e30, false), NONE), (Uni(1.0, 2.0), NONE)], &[(Log(1.0, 1e300, false), NONE), (Uni(1.0, 2.0), NONE)], &[(0.5, 0.0)]),
        unary!(atanh, &[(Uni(-1.0, 1.0), NONE), (Log(1e-10, 1.0, true), NONE)], &[(Uni(-1.0, 1.0), NONE), (Log(1e-20, 1.0, true), NONE)], &[(2.0, 0.0)]),
        unary!(erf, &[(Uni(-6.0, 6.0), NONE), (Log(1e-10, 1.0, true), NONE)], &[(Uni(-6.0, 6.0), NONE), (Log(1e-20, 1.0, true), NONE)], &[]),
        unary!(erfc, &[(Uni(-6.0, 10.0), NONE)], &[(Uni(-6.0, 27.0), NONE)], &[(26.5, 0.0)]),
        unary!(lgamma, &[(Uni(0.01, 100.0), NONE), (Log(1.0, 1e30, false), NONE)], &[(Uni(0.01, 100.0), NONE), (Log(1.0, 1e300, false), NONE)], &[(1.0, 0.0), (2.0, 0.0)]),
        unary!(tgamma, &[(Uni(0.01, 35.0), NONE)], &[(Uni(0.01, 171.0), NONE)], &[(0.5, 0.0), (5.0, 0.0)]),
        unary!(floor, &[(Uni(-1e3, 1e3), NONE), (Log(1e-3, 1e30, true), NONE)], &[(Uni(-1e3, 1e3), NONE), (Log(1e-3, 1e300, true), NONE)], ROUNDING),
        unary!(ceil, &[(Uni(-1e3, 1e3), NONE), (Log(1e-3, 1e30, true), NONE)], &[(Uni(-1e3, 1e3), NONE), (Log(1e-3, 1e300, true), NONE)], ROUNDING),
        unary!(round, &[(Uni(-1e3, 1e3), NONE), (Log(1e-3, 1e30, true), NONE)], &[(Uni(-1e3, 1e3), NONE), (Log(1e-3, 1e300, true), NONE)], ROUNDING),
        unary!(trunc, &[(Uni(-1e3, 1e3), NONE), (Log(1e-3, 1e30, true), NONE)], &[(Uni(-1e3, 1e3), NONE), (Log(1e-3, 1e300, true), NONE)], ROUNDING),
        binary!(fmod, &[(Uni(-1e3, 1e3), Uni(-10.0, 10.0)), (Log(1e-10, 1e30, true), Log(1e-10, 1e10, true))], &[(5.5, 0.0), (-7.5, 2.0), (1e30, 3.0)]),
    ]
}

const SAMPLES: usize = 100_000;

/// IEEE's special cases, fixed (not left to random draws, which find a
/// pair such as (−0, −1) only sometimes): signed zeros, infinities, NaN,
/// odd and even integers of both signs (pow's exponents), halves, a
/// subnormal and a large even integer, for both types. `gpu_tests/run.py`
/// has the same list (IEEE_ARGS).
const IEEE_ARGS: &[f64] = &[
    0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 2.5, -2.5, 1e-40, -1e-40, 1e30, -1e30, INF, -INF, NAN,
];

/// The functions of two arguments (every pair of [`IEEE_ARGS`]).
const BINARY: &[&str] = &["pow", "hypot", "atan2", "fmod"];

/// `got` against C's (float64) `want` on a fixed special argument: where
/// `want` is ±0, ±∞ or NaN, exactly that (the sign of a zero and of an
/// infinity included); where it is beyond the range of `got`'s type
/// (`max`, and half its least subnormal `tiny`), within `ulps <= bound`;
/// elsewhere a finite, non-zero number of its sign.
fn special_ok(got: f64, want: f64, ulps: f64, bound: f64, max: f64, tiny: f64) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else if want == 0.0 || want.is_infinite() {
        got == want && got.is_sign_negative() == want.is_sign_negative()
    } else if want.abs() > max || want.abs() < tiny {
        ulps <= bound
    } else {
        got.is_finite() && got != 0.0 && got.is_sign_negative() == want.is_sign_negative()
    }
}

#[test]
fn ieee_special_cases_are_cs() {
    let mut failures = Vec::new();
    for c in cases() {
        let &(_, b32, b64) = MATH_ULPS.iter().find(|e| e.0 == c.name).unwrap();
        let ys: &[f64] = if BINARY.contains(&c.name) { IEEE_ARGS } else { &[1.0] };
        for &x in IEEE_ARGS {
            for &y in ys {
                let (x32, y32) = (x as f32, y as f32);
                let want32 = (c.reference)(x32 as f64, y32 as f64);
                let got32 = (c.f32)(x32, y32);
                let f32_tiny = f32::from_bits(1) as f64 / 2.0;
                if !special_ok(got32 as f64, want32, ulps32(got32, want32), b32, f32::MAX as f64, f32_tiny) {
                    failures.push(format!("{}(f32 {x32:?}, {y32:?}) = {got32:?}, C says {want32:?}", c.name));
                }
                let (want64, got64) = ((c.reference)(x, y), (c.f64)(x, y));
                if !special_ok(got64, want64, ulps64(got64, want64), b64, f64::MAX, 0.0) {
                    failures.push(format!("{}(f64 {x:?}, {y:?}) = {got64:?}, C says {want64:?}", c.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} special cases differ from C:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn libm_is_within_the_stated_ulps_of_a_float64_reference() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    eprintln!("seed {seed:#x}; worst error in ulps (f32, f64):");
    for c in cases() {
        let &(_, b32, b64) = MATH_ULPS.iter().find(|e| e.0 == c.name).unwrap_or_else(|| panic!("{} not in MATH_ULPS", c.name));
        let (mut w32, mut w64) = ((0.0f64, 0.0f32, 0.0f32), (0.0f64, 0.0f64, 0.0f64));
        let mut one32 = |x: f32, y: f32| {
            let d = ulps32((c.f32)(x, y), (c.reference)(x as f64, y as f64));
            if d > w32.0 {
                w32 = (d, x, y);
            }
        };
        for &(dx, dy) in c.args32 {
            for _ in 0..SAMPLES {
                one32(dx.draw(&mut rng) as f32, dy.draw(&mut rng) as f32);
            }
        }
        for &(x, y) in c.edges.iter().chain(SPECIAL) {
            one32(x as f32, y as f32);
        }
        let mut one64 = |x: f64, y: f64| {
            let d = ulps64((c.f64)(x, y), (c.reference)(x, y));
            if d > w64.0 {
                w64 = (d, x, y);
            }
        };
        for &(dx, dy) in c.args64 {
            for _ in 0..SAMPLES {
                one64(dx.draw(&mut rng), dy.draw(&mut rng));
            }
        }
        for &(x, y) in c.edges.iter().chain(SPECIAL) {
            one64(x, y);
        }
        eprintln!("{:>7}: {:6.3} {:6.3}", c.name, w32.0, w64.0);
        if w32.0 > b32 {
            failures.push(format!("{}(f32 {:e}, {:e}): {} ulps > {b32}", c.name, w32.1, w32.2, w32.0));
        }
        if w64.0 > b64 {
            failures.push(format!("{}(f64 {:e}, {:e}): {} ulps > {b64}", c.name, w64.1, w64.2, w64.0));
        }
    }
    assert!(failures.is_empty(), "seed {seed:#x}:\n{}", failures.join("\n"));
}

#[test]
fn every_float_function_is_in_the_table_and_tested() {
    let tested: Vec<&str> = cases().iter().map(|c| c.name).collect();
    for (name, _, _) in MATH_ULPS {
        assert!(tested.contains(name), "{name} has a bound but no test");
    }
}

#[test]
fn exp_special_values() {
    for (x, want) in [(f64::NEG_INFINITY, 0.0), (-746.0, 0.0), (-1e300, 0.0), (710.0, f64::INFINITY), (1e300, f64::INFINITY), (f64::INFINITY, f64::INFINITY), (0.0, 1.0)] {
        assert_eq!(Float::exp(x), want, "exp({x})");
    }
    assert!(Float::exp(709.8f64).is_infinite());
    assert!(Float::exp(709.78f64).is_finite());
    assert!(Float::exp(f64::NAN).is_nan());
    for (x, want) in [(f32::NEG_INFINITY, 0.0), (-105.0, 0.0), (89.0, f32::INFINITY), (f32::INFINITY, f32::INFINITY), (0.0, 1.0)] {
        assert_eq!(Float::exp(x), want, "exp({x})");
    }
    assert!(Float::exp(88.73f32).is_infinite());
    assert!(Float::exp(88.72f32).is_finite());
    assert!(Float::exp(f32::NAN).is_nan());
    // Subnormal results are not flushed.
    assert!(Float::exp(-100.0f32) > 0.0 && Float::exp(-740.0f64) > 0.0);
}

#[test]
fn rounding_goes_half_away_from_zero() {
    for (x, fl, ce, ro, tr) in [(2.5f64, 2.0, 3.0, 3.0, 2.0), (-2.5, -3.0, -2.0, -3.0, -2.0), (-0.2, -1.0, -0.0, -0.0, -0.0)] {
        assert_eq!((Float::floor(x), Float::ceil(x), Float::round(x), Float::trunc(x)), (fl, ce, ro, tr));
        let x = x as f32;
        assert_eq!((Float::floor(x), Float::ceil(x), Float::round(x), Float::trunc(x)), (fl as f32, ce as f32, ro as f32, tr as f32));
    }
    assert_eq!(Float::fmod(7.5f64, 2.0), 1.5);
    assert_eq!(Float::fmod(-7.5f32, 2.0), -1.5);
}
