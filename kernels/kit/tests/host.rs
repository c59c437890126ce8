//! Host-side tests of the kit: parameter offsets, block math, the host
//! entries of macro-declared kernels run on real
//! jobs, the reduction order, and the manifest lines the macros store.

use erlcuda_kernel::job::{blocks_of, owner, param_offsets, prepare, Blocks, Job, ELEMS_PER_THREAD, SERIAL};
use erlcuda_kernel::manifest::{self, Decl, Layout, Shape};
use erlcuda_kernel::{elementwise, host, reduction, table, Float, Numeric};

// ------------------------------------------------------- kernels under test

elementwise!(clamp, [f32, f64], (x: v, lo: s, hi: s) => x.max(lo).min(hi));
elementwise!(axpy, [f32, f64], (alpha: s, x: v, y: v) => alpha.fma(x, y));
elementwise!(
    /// Docs and attributes pass through.
    expm1ish, [f64], (x: v) => x.exp() - T::ONE
);
reduction!(sumsq, [f32, f64], (x: v) => x * x);
reduction!(wdot, [f64], (w: s, x: v, y: v) => w * x * y);
table! {
    row_max, [f32, f64], (x: v, cols: d),
    out = n / cols, blocks = n / cols, threads = 128, shared = erlcuda_kernel::BLOCK_SHARED_BYTES,
    gpu(k, row) {
        let _ = (k, row, x, cols);
    }
    cpu(k) {
        let out = k.output_slice();
        for (o, r) in out.iter_mut().zip(x.chunks(cols as usize)) {
            *o = r.iter().fold(T::NEG_INFINITY, |m, &v| m.max(v));
        }
    }
}
table! {
    scaled_copy, [f32], (x: v, a: s, b: s),
    out = n, blocks = elements, threads = 256, shared = 0,
    gpu(k, block) {
        let _ = (k, block, x, a, b);
    }
    cpu(k) {
        // The accessors agree with the bound names.
        assert_eq!(k.scalar(0), a);
        assert_eq!(k.scalar(1), b);
        assert_eq!(k.input(0), x.as_ptr());
        let out = k.output_slice();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = a * v + b;
        }
    }
}

extern "C" {
    fn erlcuda_host_clamp_f32(job: *const Job);
    fn erlcuda_host_clamp_f64(job: *const Job);
    fn erlcuda_host_axpy_f32(job: *const Job);
    fn erlcuda_host_axpy_f64(job: *const Job);
    fn erlcuda_host_expm1ish_f64(job: *const Job);
    fn erlcuda_host_sumsq_f32(job: *const Job);
    fn erlcuda_host_sumsq_f64(job: *const Job);
    fn erlcuda_host_wdot_f64(job: *const Job);
    fn erlcuda_host_row_max_f32(job: *const Job);
    fn erlcuda_host_row_max_f64(job: *const Job);
    fn erlcuda_host_scaled_copy_f32(job: *const Job);
    // The section's bounds, from the linker (a section named like a C
    // identifier gets them).
    static __start_erlcuda_manifest: u8;
    static __stop_erlcuda_manifest: u8;
}

// ------------------------------------------------------------- helpers

/// A job as gpud builds it: vectors, output, and the scalar/dim arguments
/// packed at `param_offsets(sig)`.
fn job<T>(sig: &str, ins: &[&[T]], out: &mut [T], scalars: &[f64], dims: &[u32]) -> Job {
    let (offs, _, _) = param_offsets(sig.as_bytes()).expect("signature fits");
    let mut j = Job { n: ins[0].len() as u64, out: out.as_mut_ptr() as u64, out_len: out.len() as u64, ..Job::default() };
    for (i, v) in ins.iter().enumerate() {
        j.vec[i] = v.as_ptr() as u64;
    }
    let (mut si, mut di, mut p) = (0, 0, 0);
    for c in sig.bytes() {
        match c {
            b's' => {
                j.params[offs[p]..offs[p] + 8].copy_from_slice(&scalars[si].to_ne_bytes());
                si += 1;
                p += 1;
            }
            b'd' => {
                j.params[offs[p]..offs[p] + 4].copy_from_slice(&dims[di].to_ne_bytes());
                di += 1;
                p += 1;
            }
            _ => {}
        }
    }
    j
}

mod common;
use common::Rng;

// ---------------------------------------------------------- parameters

#[test]
fn param_offsets_follow_the_signature() {
    let offs = |s: &str| param_offsets(s.as_bytes()).map(|(o, c, used)| (o[..c].to_vec(), used));
    assert_eq!(offs("svv"), Some((vec![0], 8)));
    assert_eq!(offs("vss"), Some((vec![0, 8], 16)));
    assert_eq!(offs("vd"), Some((vec![0], 4)));
    assert_eq!(offs("vdd"), Some((vec![0, 4], 8)));
    // An s after a d is 8-aligned.
    assert_eq!(offs("vds"), Some((vec![0, 8], 16)));
    assert_eq!(offs("vdddd"), Some((vec![0, 4, 8, 12], 16)));
    assert_eq!(offs("vssd"), None);
    assert_eq!(offs("vx"), None);

    let l = Layout::of("vsd");
    assert_eq!((l.vectors, l.scalars, l.dims), (1, 1, 1));
    assert_eq!((l.scalar_at[0], l.dim_at[0]), (0, 8));
    let l = Layout::of("vvdds");
    assert_eq!((l.vectors, l.scalars, l.dims), (2, 1, 2));
    assert_eq!((l.scalar_at[0], &l.dim_at[..2]), (8, &[0, 4][..]));
    assert_eq!(l.scalar_offsets::<1>(), [8]);
}

#[test]
fn block_rules_and_owner() {
    let per = 256 * ELEMS_PER_THREAD;
    assert_eq!(blocks_of(Blocks::Elements, 0, 256, &[]), 0);
    assert_eq!(blocks_of(Blocks::Elements, 1, 256, &[]), 1);
    assert_eq!(blocks_of(Blocks::Elements, per, 256, &[]), 1);
    assert_eq!(blocks_of(Blocks::Elements, per + 1, 256, &[]), 2);
    assert_eq!(blocks_of(Blocks::Elements, per + 1, 512, &[]), 1);
    assert_eq!(blocks_of(Blocks::Chunks, 256 * SERIAL, 256, &[]), 1);
    assert_eq!(blocks_of(Blocks::Chunks, 256 * SERIAL + 1, 256, &[]), 2);
    assert_eq!(blocks_of(Blocks::One, 12345, 256, &[]), 1);
    assert_eq!(blocks_of(Blocks::PerDim(1), 60, 256, &[3, 5]), 12);

    // Jobs of 3, 0, 2 and 1 blocks: starts 0, 3, 3, 5; total 6.
    let mut jobs = vec![Job::default(); 4];
    for (j, n) in jobs.iter_mut().zip([3u64, 0, 2, 1]) {
        j.n = n;
    }
    assert_eq!(prepare(&mut jobs, |j| j.n), Some(6));
    let starts: Vec<u64> = jobs.iter().map(|j| j.block_start).collect();
    assert_eq!(starts, [0, 3, 3, 5]);
    let owners: Vec<u32> = (0..6).map(|vb| owner(4, vb, |i| jobs[i as usize].block_start)).collect();
    // The empty job (index 1) owns nothing.
    assert_eq!(owners, [0, 0, 0, 2, 2, 3]);
    // A total past u32 is refused (the caller splits the batch).
    assert_eq!(prepare(&mut jobs, |_| 1 << 31), None);
}

#[test]
fn float_basics() {
    assert_eq!(<f32 as Numeric>::from_f64(0.1), 0.1f32);
    assert_eq!(<f64 as Numeric>::to_f64(2.5), 2.5);
    assert_eq!(Float::max(1.0f64, f64::NAN), 1.0);
    assert_eq!(Float::min(f32::NAN, -1.0f32), -1.0);
    assert_eq!(Float::abs(-0.0f64).to_bits(), 0);
    // One rounding: (1 + 2^-30)^2 - 1 keeps the 2^-60 term.
    let a = 1.0 + 2f64.powi(-30);
    assert_eq!(Float::fma(a, a, -1.0), 2f64.powi(-29) + 2f64.powi(-60));
    assert_eq!(Float::sqrt(2.0f32), 2.0f32.sqrt());
}

// --------------------------------------------------------- host entries

#[test]
fn clamp_host_entries() {
    let x: Vec<f32> = (0..1000).map(|i| i as f32 / 100.0 - 5.0).collect();
    let mut out = vec![f32::NAN; x.len()];
    unsafe { erlcuda_host_clamp_f32(&job("vss", &[&x], &mut out, &[-1.5, 2.25], &[])) };
    for (o, v) in out.iter().zip(&x) {
        assert_eq!(*o, v.clamp(-1.5, 2.25));
    }
    let x: Vec<f64> = x.iter().map(|&v| v as f64).chain([f64::NAN]).collect();
    let mut out = vec![0.0; x.len()];
    unsafe { erlcuda_host_clamp_f64(&job("vss", &[&x], &mut out, &[0.0, 1.0], &[])) };
    for (o, v) in out.iter().zip(&x) {
        assert_eq!(*o, if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) });
    }
    // n = 0: nothing read or written, null pointers allowed.
    unsafe { erlcuda_host_clamp_f64(&Job::default()) };
}

#[test]
fn axpy_rounds_alpha_to_the_type_and_fuses() {
    let x: Vec<f32> = (0..77).map(|i| 1.0 + i as f32 * 1e-3).collect();
    let y: Vec<f32> = (0..77).map(|i| -(i as f32)).collect();
    let mut out = vec![0.0f32; 77];
    unsafe { erlcuda_host_axpy_f32(&job("svv", &[&x, &y], &mut out, &[0.1], &[])) };
    for i in 0..77 {
        assert_eq!(out[i], 0.1f32.mul_add(x[i], y[i]));
    }
    let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let y64: Vec<f64> = y.iter().map(|&v| v as f64).collect();
    let mut out = vec![0.0f64; 77];
    unsafe { erlcuda_host_axpy_f64(&job("svv", &[&x64, &y64], &mut out, &[0.1], &[])) };
    for i in 0..77 {
        assert_eq!(out[i], 0.1f64.mul_add(x64[i], y64[i]));
    }
}

#[test]
fn expression_bodies_use_the_kits_exp() {
    let x = [-1.0, 0.0, 1e-3, 3.0];
    let mut out = [0.0; 4];
    unsafe { erlcuda_host_expm1ish_f64(&job("v", &[&x], &mut out, &[], &[])) };
    for i in 0..4 {
        assert_eq!(out[i], erlcuda_kernel::Float::exp(x[i]) - 1.0);
    }
}

#[test]
fn reductions_on_the_host() {
    for n in [0usize, 1, 255, 256, 257, 65536, 65537, 200_000] {
        let x: Vec<f64> = (0..n).map(|i| (i % 7) as f64).collect();
        let mut out = [f64::NAN];
        unsafe { erlcuda_host_sumsq_f64(&job("v", &[&x], &mut out, &[], &[])) };
        let exact: f64 = x.iter().map(|v| v * v).sum();
        // Integers below 2^53 throughout: exact.
        assert_eq!(out[0], exact, "n {n}");
        let x32: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
        let mut out32 = [f32::NAN];
        unsafe { erlcuda_host_sumsq_f32(&job("v", &[&x32], &mut out32, &[], &[])) };
        // Every partial is an integer below 2^24: exact in f32 too.
        assert_eq!(out32[0] as f64, x32.iter().map(|&v| (v * v) as f64).sum::<f64>(), "n {n}");
    }
    let x: Vec<f64> = (0..1000).map(|i| i as f64).collect();
    let y: Vec<f64> = (0..1000).map(|i| (i % 5) as f64).collect();
    let mut out = [0.0];
    unsafe { erlcuda_host_wdot_f64(&job("svv", &[&x, &y], &mut out, &[0.5], &[])) };
    assert_eq!(out[0], 0.5 * x.iter().zip(&y).map(|(a, b)| a * b).sum::<f64>());
}

/// gpud's `ops::sum` (gpud/src/ops/mod.rs) as written there, serially: the
/// order the kit's host sum must follow bit for bit.
fn gpud_sum(len: usize, term: impl Fn(usize) -> f32) -> f32 {
    let chunk = 65536;
    let chunk_sum = |lo: usize, hi: usize| {
        let mut parts = [0f32; 256];
        let (mut np, mut i) = (0, lo);
        while i < hi {
            let end = (i + 256).min(hi);
            let mut acc = 0f32;
            for j in i..end {
                acc += term(j);
            }
            parts[np] = acc;
            np += 1;
            i = end;
        }
        while np > 1 {
            let half = np.div_ceil(2);
            for j in 0..np / 2 {
                parts[j] = parts[2 * j] + parts[2 * j + 1];
            }
            if np % 2 == 1 {
                parts[np / 2] = parts[np - 1];
            }
            np = half;
        }
        if np == 1 { parts[0] } else { 0.0 }
    };
    let n = len.div_ceil(chunk);
    if n >= 2 {
        let mut total = 0f32;
        for c in 0..n {
            total += chunk_sum(c * chunk, ((c + 1) * chunk).min(len));
        }
        total
    } else if n == 1 {
        chunk_sum(0, len)
    } else {
        0.0
    }
}

#[test]
fn host_sum_order_is_gpuds() {
    let mut rng = Rng(42);
    for n in [0usize, 1, 2, 255, 256, 257, 511, 4097, 65535, 65536, 65537, 3 * 65536 + 5, 400_000] {
        // Wide magnitudes and both signs: any change of order shows.
        let x: Vec<f32> = (0..n).map(|_| (rng.uniform(-1.0, 1.0) * 2f64.powf(rng.uniform(-20.0, 20.0))) as f32).collect();
        let got = host::sum(n, |i| x[i]);
        let want = gpud_sum(n, |i| x[i]);
        assert_eq!(got.to_bits(), want.to_bits(), "n {n}");
    }
    // The sign of a zero total agrees too.
    assert_eq!(host::sum(1, |_| -0.0f32).to_bits(), gpud_sum(1, |_| -0.0).to_bits());
    assert_eq!(host::sum(65537, |_| -0.0f32).to_bits(), gpud_sum(65537, |_| -0.0).to_bits());
}

#[test]
fn table_host_entries() {
    let (rows, cols) = (7usize, 5usize);
    let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
    let mut out = vec![0.0f32; rows];
    unsafe { erlcuda_host_row_max_f32(&job("vd", &[&x], &mut out, &[], &[cols as u32])) };
    for r in 0..rows {
        assert_eq!(out[r], x[r * cols..(r + 1) * cols].iter().cloned().fold(f32::MIN, f32::max));
    }
    let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut out64 = vec![0.0f64; rows];
    unsafe { erlcuda_host_row_max_f64(&job("vd", &[&x64], &mut out64, &[], &[cols as u32])) };
    assert_eq!(out64, out.iter().map(|&v| v as f64).collect::<Vec<_>>());

    let mut out = vec![0.0f32; x.len()];
    unsafe { erlcuda_host_scaled_copy_f32(&job("vss", &[&x], &mut out, &[2.0, 0.5], &[])) };
    assert_eq!(out, x.iter().map(|v| 2.0 * v + 0.5).collect::<Vec<_>>());
}

// ------------------------------------------------------------- manifest

#[test]
fn the_macros_store_their_manifest_lines() {
    // SAFETY: the linker's bounds of the section, start <= stop.
    let bytes = unsafe {
        let start = &raw const __start_erlcuda_manifest;
        let stop = &raw const __stop_erlcuda_manifest;
        std::slice::from_raw_parts(start, stop.offset_from(start) as usize)
    };
    assert_eq!(bytes.len() % manifest::LINE_MAX, 0);
    let text: String = String::from_utf8(bytes.iter().copied().filter(|&b| b != 0).collect()).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "kernel axpy shape=elementwise args=svv types=f32,f64 out=n blocks=elements threads=256 shared=0",
            "kernel clamp shape=elementwise args=vss types=f32,f64 out=n blocks=elements threads=256 shared=0",
            "kernel expm1ish shape=elementwise args=v types=f64 out=n blocks=elements threads=256 shared=0",
            "kernel row_max shape=table args=vd types=f32,f64 out=n/d0 blocks=n/d0 threads=128 shared=264",
            "kernel scaled_copy shape=table args=vss types=f32 out=n blocks=elements threads=256 shared=0",
            "kernel sumsq shape=reduction args=v types=f32,f64 out=1 blocks=chunks threads=256 shared=264",
            "kernel wdot shape=reduction args=svv types=f64 out=1 blocks=chunks threads=256 shared=264",
        ]
    );
}

fn decl<'a>(shape: Shape, args: &'a [(&'a str, &'a str)], out: manifest::RuleTokens<'a>, blocks: manifest::RuleTokens<'a>) -> Decl<'a> {
    Decl { name: "k", shape, args, types: &["f64"], out, blocks, threads: 256, shared: 264 }
}

fn line_of(d: &Decl) -> Result<String, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| String::from_utf8(manifest::line(d).as_bytes().to_vec()).unwrap()))
        .map_err(|e| e.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| e.downcast_ref::<String>().cloned()).unwrap())
}

#[test]
fn rules_are_written_canonically_and_bad_ones_refused() {
    let vdd: &[(&str, &str)] = &[("x", "v"), ("rows", "d"), ("cols", "d")];
    let ok = line_of(&decl(Shape::Table, vdd, ("n", &["cols"]), ("n", &["d0"]))).unwrap();
    assert_eq!(ok, "kernel k shape=table args=vdd types=f64 out=n/d1 blocks=n/d0 threads=256 shared=264\n");
    let bad = |d: Decl| line_of(&d).unwrap_err();
    assert!(bad(decl(Shape::Table, vdd, ("n", &["x"]), ("one", &[]))).contains("names no d argument"));
    assert!(bad(decl(Shape::Table, vdd, ("n", &["d2"]), ("one", &[]))).contains("names no d argument"));
    assert!(bad(decl(Shape::Table, vdd, ("2", &[]), ("one", &[]))).contains("out is n, 1 or n / D"));
    assert!(bad(decl(Shape::Table, vdd, ("n", &[]), ("rows", &[]))).contains("blocks is elements"));
    assert!(bad(decl(Shape::Elementwise, vdd, ("n", &[]), ("elements", &[]))).contains("v and s arguments only"));
    assert!(bad(decl(Shape::Table, &[("x", "s")], ("n", &[]), ("one", &[]))).contains("1 or 2 vector"));
    assert!(bad(decl(Shape::Table, &[("x", "v"), ("a", "s"), ("b", "s"), ("c", "d")], ("n", &[]), ("one", &[]))).contains("16-byte parameter area"));
    assert!(bad(decl(Shape::Table, &[("x", "w")], ("n", &[]), ("one", &[]))).contains("`name: v`"));
    let mut d = decl(Shape::Table, vdd, ("n", &[]), ("one", &[]));
    d.threads = 100;
    assert!(bad(d).contains("multiple of 32"));
    let mut d = decl(Shape::Reduction, &[("x", "v")], ("1", &[]), ("chunks", &[]));
    d.shared = 0;
    assert!(bad(d).contains("BLOCK_SHARED_BYTES"));
    let mut d = decl(Shape::Table, vdd, ("n", &[]), ("one", &[]));
    d.types = &["f16"];
    assert!(bad(d).contains("f32 and f64"));
}
