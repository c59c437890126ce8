//! Host-side tests of the kit: the job record and block math, the host
//! entries of macro-declared kernels run on real jobs (the fixed shapes and
//! `kernel!`: typed inputs, several outputs, io arguments, no T), the
//! reduction order, the manifest lines the macros store, and the rules a
//! declaration is checked against.

use erlcuda_kernel::job::{owner, prepare, BlockRule, Blocks, Job, ELEMS_PER_THREAD, SERIAL};
use erlcuda_kernel::manifest::{self, Decl, Item, Shape};
use erlcuda_kernel::signature::{Sig, MAX_VECTORS};
use erlcuda_kernel::{elementwise, host, reduction, table, Element, Float, Numeric};

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
    out = n / d0, blocks = n / cols, threads = 128, shared = erlcuda_kernel::BLOCK_SHARED_BYTES,
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
    scaled_copy, [f32], (x: v, a: s, rows: d, b: s),
    out = n, blocks = elements, threads = 256, shared = 0,
    gpu(k, block) {
        let _ = (k, block, x, a, b, rows);
    }
    cpu(k) {
        // The accessors agree with the bound names: s and d share the
        // parameters in declared order, each counted among its own kind.
        assert_eq!(k.scalar(0), a);
        assert_eq!(k.scalar(1), b);
        assert_eq!(k.dim(0), rows);
        assert_eq!(k.param(1), rows as u64);
        assert_eq!(k.input(0), x.as_ptr());
        assert_eq!((k.n(), k.out_len()), (x.len() as u64, x.len() as u64));
        let out = k.output_slice();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = a * v + b;
        }
    }
}
table! {
    total, [f64], (x: v),
    out = 1, blocks = chunks, threads = 64, shared = erlcuda_kernel::BLOCK_SHARED_BYTES,
    gpu(k, block) {
        let _ = (k, block, x);
    }
    cpu(k) {
        k.output_slice()[0] = erlcuda_kernel::sum(x.len(), |i| x[i]);
    }
}

// The kernels the GPU tests launch, the same declarations on the host.
#[path = "../gpu_tests/src/jobs.rs"]
mod jobs;

erlcuda_kernel::kernel! {
    /// Every kind of binding, checked against the raw job.
    bindings, T: Element in [u8, s64],
    (a: v(T, n), b: io(s32, m), c: s(f32), d: d(1 ..= m & 64), e: s(T), f: v(f64, d * 2)) -> (g: o(T, n), h: s(u32)),
    blocks = chunks(n / 1), threads = 32 * 3, block_rule = any, shared = 16,
    gpu(k, block) {
        let _ = (k, block, a, b, c, d, e, f, g, h);
    }
    cpu(k) {
        let j = k.job();
        let _: (&[T], &mut [i32], f32, u32, T, &[f64], &mut [T], &mut [u32]) = (a, b, c, d, e, f, g, h);
        assert_eq!((a.as_ptr() as u64, a.len()), (j.addr[0], j.len[0] as usize));
        assert_eq!((b.as_ptr() as u64, b.len()), (j.addr[1], j.len[1] as usize));
        assert_eq!((f.as_ptr() as u64, f.len()), (j.addr[2], j.len[2] as usize));
        assert_eq!(g.as_ptr() as u64, j.addr[MAX_VECTORS]);
        assert_eq!((h.as_ptr() as u64, h.len()), (j.addr[MAX_VECTORS + 1], 1));
        assert_eq!(c, f64::from_bits(j.param[0]) as f32);
        assert_eq!((d, k.dim(0)), (j.param[1] as u32, j.param[1] as u32));
        assert_eq!(e, T::from_param(j.param[2]));
        assert_eq!(k.scalar(1), e);
        assert_eq!(k.len(MAX_VECTORS), g.len() as u64);
        for i in 0..a.len() {
            g[i] = a[i];
        }
        b[0] += 1;
        h[0] = 7;
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
    fn erlcuda_host_total_f64(job: *const Job);
    fn erlcuda_host_job_axpy_f64(job: *const Job);
    fn erlcuda_host_job_sumsq_f32(job: *const Job);
    fn erlcuda_host_job_row_max_f64(job: *const Job);
    fn erlcuda_host_masked_dot_f32(job: *const Job);
    fn erlcuda_host_masked_dot_f64(job: *const Job);
    fn erlcuda_host_scale_add_s32(job: *const Job);
    fn erlcuda_host_scale_add_u32(job: *const Job);
    fn erlcuda_host_scale_add_f64(job: *const Job);
    fn erlcuda_host_byte_hist(job: *const Job);
    fn erlcuda_host_bindings_u8(job: *const Job);
    fn erlcuda_host_bindings_s64(job: *const Job);
    // The section's bounds, from the linker (a section named like a C
    // identifier gets them).
    static __start_erlcuda_manifest: u8;
    static __stop_erlcuda_manifest: u8;
}

mod common;
use common::{fp, ip, job, o, v, Rng};

// ---------------------------------------------------------- job record

#[test]
fn the_job_record_is_ec_job_args() {
    assert_eq!(std::mem::size_of::<Job>(), 256);
    let j = Job::default();
    let at = |p: *const u8| p as usize - &raw const j as usize;
    assert_eq!(at(j.addr.as_ptr().cast()), 0);
    assert_eq!(at(j.len.as_ptr().cast()), 96);
    assert_eq!(at(j.param.as_ptr().cast()), 144);
    assert_eq!(at((&raw const j.block_start).cast()), 208);
    assert_eq!(at((&raw const j.buffers).cast()), 216);
    assert_eq!(at((&raw const j.given).cast()), 232);
    assert_eq!(Job::out_slot(1), 9);
}

#[test]
fn block_rules_and_owner() {
    let sig = Sig::parse("x:v:T:n,rows:d,cols:d", "y:o:T:rows").unwrap();
    let blocks = |rule: &str, n: u32, threads: u32, dims: &[u64]| {
        let mut j = Job::default();
        j.len[0] = n;
        j.param[..dims.len()].copy_from_slice(dims);
        Blocks::parse(&sig, rule).unwrap().of(&sig, &j, threads).unwrap()
    };
    let per = 256 * ELEMS_PER_THREAD as u32;
    assert_eq!(blocks("elements(n)", 0, 256, &[]), 0);
    assert_eq!(blocks("elements(n)", 1, 256, &[]), 1);
    assert_eq!(blocks("elements(n)", per, 256, &[]), 1);
    assert_eq!(blocks("elements(n)", per + 1, 256, &[]), 2);
    assert_eq!(blocks("elements(n)", per + 1, 512, &[]), 1);
    assert_eq!(blocks("chunks(n)", 256 * SERIAL as u32, 256, &[]), 1);
    assert_eq!(blocks("chunks(n)", 256 * SERIAL as u32 + 1, 256, &[]), 2);
    assert_eq!(blocks("1", 12345, 256, &[]), 1);
    assert_eq!(blocks("n/cols", 60, 256, &[3, 5]), 12);
    assert_eq!(blocks("rows", 60, 256, &[3, 5]), 3);
    assert_eq!(blocks("elements(rows*cols)", 0, 32, &[30, 10]), 3);
    assert_eq!(Blocks::parse(&sig, "rows/cols/2").unwrap_err(), "a length has one divisor at most");
    assert!(Blocks::parse(&sig, "pieces(n)").is_err());
    assert!(BlockRule::Pow2.allows(64) && !BlockRule::Pow2.allows(96) && BlockRule::Warps.allows(96));
    assert!(BlockRule::Any.allows(1) && !BlockRule::Any.allows(1025) && !BlockRule::Warps.allows(16));

    // Jobs of 3, 0, 2 and 1 blocks: starts 0, 3, 3, 5; total 6.
    let mut jobs = vec![Job::default(); 4];
    for (j, n) in jobs.iter_mut().zip([3u32, 0, 2, 1]) {
        j.len[0] = n;
    }
    assert_eq!(prepare(&mut jobs, |j| j.len[0] as u64), Some(6));
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

#[test]
fn scalar_parameters_by_type() {
    // Floats: f64 bits, rounded to nearest for f32; integers: an s64,
    // wrapped to the type.
    assert_eq!(f32::from_param(fp(0.1)), 0.1f32);
    assert_eq!(f64::from_param(fp(-2.5)), -2.5);
    assert_eq!(i32::from_param(ip(-7)), -7);
    assert_eq!(u32::from_param(ip(4_000_000_000)), 4_000_000_000u32);
    assert_eq!(i64::from_param(ip(i64::MIN)), i64::MIN);
    assert_eq!(u8::from_param(ip(255)), 255u8);
}

// --------------------------------------------------------- host entries

#[test]
fn clamp_host_entries() {
    let x: Vec<f32> = (0..1000).map(|i| i as f32 / 100.0 - 5.0).collect();
    let mut out = vec![f32::NAN; x.len()];
    unsafe { erlcuda_host_clamp_f32(&job(&[v(&x)], &[o(&mut out)], &[fp(-1.5), fp(2.25)])) };
    for (o, v) in out.iter().zip(&x) {
        assert_eq!(*o, v.clamp(-1.5, 2.25));
    }
    let x: Vec<f64> = x.iter().map(|&v| v as f64).chain([f64::NAN]).collect();
    let mut out = vec![0.0; x.len()];
    unsafe { erlcuda_host_clamp_f64(&job(&[v(&x)], &[o(&mut out)], &[fp(0.0), fp(1.0)])) };
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
    // saxpy's layout: alpha param 0, x slot 0, y slot 1, out slot 8.
    unsafe { erlcuda_host_axpy_f32(&job(&[v(&x), v(&y)], &[o(&mut out)], &[fp(0.1)])) };
    for i in 0..77 {
        assert_eq!(out[i], 0.1f32.mul_add(x[i], y[i]));
    }
    let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let y64: Vec<f64> = y.iter().map(|&v| v as f64).collect();
    let mut out = vec![0.0f64; 77];
    unsafe { erlcuda_host_axpy_f64(&job(&[v(&x64), v(&y64)], &[o(&mut out)], &[fp(0.1)])) };
    for i in 0..77 {
        assert_eq!(out[i], 0.1f64.mul_add(x64[i], y64[i]));
    }
    let mut out2 = vec![0.0f64; 77];
    unsafe { erlcuda_host_job_axpy_f64(&job(&[v(&x64), v(&y64)], &[o(&mut out2)], &[fp(0.1)])) };
    assert_eq!(out, out2);
}

#[test]
fn expression_bodies_use_the_kits_exp() {
    let x = [-1.0, 0.0, 1e-3, 3.0];
    let mut out = [0.0; 4];
    unsafe { erlcuda_host_expm1ish_f64(&job(&[v(&x)], &[o(&mut out)], &[])) };
    for i in 0..4 {
        assert_eq!(out[i], erlcuda_kernel::Float::exp(x[i]) - 1.0);
    }
}

#[test]
fn reductions_on_the_host() {
    for n in [0usize, 1, 255, 256, 257, 65536, 65537, 200_000] {
        let x: Vec<f64> = (0..n).map(|i| (i % 7) as f64).collect();
        let mut out = [f64::NAN];
        unsafe { erlcuda_host_sumsq_f64(&job(&[v(&x)], &[o(&mut out)], &[])) };
        let exact: f64 = x.iter().map(|v| v * v).sum();
        // Integers below 2^53 throughout: exact.
        assert_eq!(out[0], exact, "n {n}");
        let x32: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
        let mut out32 = [f32::NAN];
        unsafe { erlcuda_host_sumsq_f32(&job(&[v(&x32)], &[o(&mut out32)], &[])) };
        // Every partial is an integer below 2^24: exact in f32 too.
        assert_eq!(out32[0] as f64, x32.iter().map(|&v| (v * v) as f64).sum::<f64>(), "n {n}");
        let mut again = [0.0f32];
        unsafe { erlcuda_host_job_sumsq_f32(&job(&[v(&x32)], &[o(&mut again)], &[])) };
        assert_eq!(again, out32);
    }
    let x: Vec<f64> = (0..1000).map(|i| i as f64).collect();
    let y: Vec<f64> = (0..1000).map(|i| (i % 5) as f64).collect();
    let mut out = [0.0];
    unsafe { erlcuda_host_wdot_f64(&job(&[v(&x), v(&y)], &[o(&mut out)], &[fp(0.5)])) };
    assert_eq!(out[0], 0.5 * x.iter().zip(&y).map(|(a, b)| a * b).sum::<f64>());
    // A reduction's output slot of length 0 (never from gpud): untouched.
    unsafe { erlcuda_host_wdot_f64(&job(&[v(&x), v(&y)], &[(0, 0)], &[fp(0.5)])) };
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
    unsafe { erlcuda_host_row_max_f32(&job(&[v(&x)], &[o(&mut out)], &[cols as u64])) };
    for r in 0..rows {
        assert_eq!(out[r], x[r * cols..(r + 1) * cols].iter().cloned().fold(f32::MIN, f32::max));
    }
    let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut out64 = vec![0.0f64; rows];
    unsafe { erlcuda_host_row_max_f64(&job(&[v(&x64)], &[o(&mut out64)], &[cols as u64])) };
    assert_eq!(out64, out.iter().map(|&v| v as f64).collect::<Vec<_>>());
    let mut again = vec![0.0f64; rows];
    unsafe { erlcuda_host_job_row_max_f64(&job(&[v(&x64)], &[o(&mut again)], &[cols as u64])) };
    assert_eq!(again, out64);

    let mut out = vec![0.0f32; x.len()];
    unsafe { erlcuda_host_scaled_copy_f32(&job(&[v(&x)], &[o(&mut out)], &[fp(2.0), 9, fp(0.5)])) };
    assert_eq!(out, x.iter().map(|v| 2.0 * v + 0.5).collect::<Vec<_>>());

    let mut t = [0.0f64];
    unsafe { erlcuda_host_total_f64(&job(&[v(&x64)], &[o(&mut t)], &[])) };
    assert_eq!(t[0], x64.iter().sum::<f64>());
}

#[test]
fn kernel_with_typed_inputs_and_two_outputs() {
    let (rows, cols) = (9usize, 13usize);
    let mut rng = Rng(7);
    let x: Vec<f64> = (0..rows * cols).map(|_| (rng.next() % 9) as f64 - 4.0).collect();
    let w: Vec<f64> = (0..cols).map(|_| (rng.next() % 7) as f64 - 3.0).collect();
    let mask: Vec<u8> = (0..rows).map(|r| if r % 3 == 1 { 0 } else { r as u8 + 1 }).collect();
    let want = |r: usize| -> f64 {
        if mask[r] == 0 {
            return 0.0;
        }
        1.5 * (0..cols).map(|j| x[r * cols + j] * w[j]).sum::<f64>() - 7.0
    };
    let params = [fp(1.5), ip(-7), rows as u64, cols as u64];
    let (mut y, mut hits) = (vec![0.0f64; rows], [0u32]);
    unsafe { erlcuda_host_masked_dot_f64(&job(&[v(&x), v(&w), v(&mask)], &[o(&mut y), o(&mut hits)], &params)) };
    // Small integers throughout: exact whatever the order.
    assert_eq!(y, (0..rows).map(want).collect::<Vec<_>>());
    assert_eq!(hits[0], 6);
    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let (mut y32, mut hits) = (vec![0.0f32; rows], [0u32]);
    unsafe { erlcuda_host_masked_dot_f32(&job(&[v(&x32), v(&w), v(&mask)], &[o(&mut y32), o(&mut hits)], &params)) };
    assert_eq!(y32, (0..rows).map(|r| want(r) as f32).collect::<Vec<_>>());
    assert_eq!(hits[0], 6);
}

#[test]
fn kernel_with_an_io_argument_over_integers_and_floats() {
    let x: Vec<i32> = (0..1000).map(|i| i % 17 - 8).collect();
    let mut acc: Vec<i32> = (0..1000).collect();
    unsafe { erlcuda_host_scale_add_s32(&job(&[o(&mut acc), v(&x)], &[], &[ip(-3)])) };
    assert!(acc.iter().enumerate().all(|(i, &a)| a == i as i32 - 3 * x[i]));
    let xu: Vec<u32> = (0..100).collect();
    let mut accu = vec![4_000_000_000u32; 100];
    unsafe { erlcuda_host_scale_add_u32(&job(&[o(&mut accu), v(&xu)], &[], &[ip(2)])) };
    assert!(accu.iter().enumerate().all(|(i, &a)| a == 4_000_000_000 + 2 * i as u32));
    let xf: Vec<f64> = (0..10).map(|i| i as f64 / 4.0).collect();
    let mut accf = vec![1.0f64; 10];
    unsafe { erlcuda_host_scale_add_f64(&job(&[o(&mut accf), v(&xf)], &[], &[fp(0.5)])) };
    assert_eq!(accf, xf.iter().map(|&x| 1.0 + 0.5 * x).collect::<Vec<_>>());
}

#[test]
fn kernel_with_no_t() {
    let x: Vec<u8> = (0..5000u32).map(|i| (i * i % 251) as u8).collect();
    let (mut counts, mut total) = (vec![0u32; 256], [0i64]);
    unsafe { erlcuda_host_byte_hist(&job(&[v(&x)], &[o(&mut counts), o(&mut total)], &[])) };
    let mut want = vec![0u32; 256];
    for &b in &x {
        want[b as usize] += 1;
    }
    assert_eq!(counts, want);
    assert_eq!(total[0], x.iter().map(|&b| b as i64).sum::<i64>());
}

#[test]
fn kernel_bindings_are_the_jobs_slots_and_params() {
    let (a, f) = (vec![3u8, 1, 4, 1, 5], vec![0.5f64; 6]);
    let (mut b, mut g, mut h) = (vec![10i32, 20], vec![0u8; 5], [0u32]);
    let j = job(&[v(&a), o(&mut b), v(&f)], &[o(&mut g), o(&mut h)], &[fp(0.1), 3, ip(200)]);
    unsafe { erlcuda_host_bindings_u8(&j) };
    assert_eq!((g, b, h), (a.clone(), vec![11, 20], [7]));
    let a: Vec<i64> = vec![-1, i64::MAX];
    let (mut b, mut g, mut h) = (vec![0i32], vec![0i64; 2], [0u32]);
    let j = job(&[v(&a), o(&mut b), v(&f)], &[o(&mut g), o(&mut h)], &[fp(0.1), 3, ip(-5)]);
    unsafe { erlcuda_host_bindings_s64(&j) };
    assert_eq!((g, b, h), (a, vec![1], [7]));
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
    // As priv/erlcuda-build reads it: zero bytes dropped, then lines.
    let text: String = String::from_utf8(bytes.iter().copied().filter(|&b| b != 0).collect()).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "kernel axpy types=f32,f64 args=alpha:s:T,x:v:T:n,y:v:T:n outs=out:w:T:n blocks=elements(n) threads=256 block_rule=any shared=0",
            "kernel bindings types=u8,s64 args=a:v:T:n,b:io:s32:m,c:s:f32,d:d:1..=m&64,e:s:T,f:v:f64:d*2 outs=g:o:T:n,h:s:u32 blocks=chunks(n/1) threads=96 block_rule=any shared=16",
            "kernel byte_hist types=- args=x:v:u8:n outs=counts:o:u32:256,total:s:s64 blocks=elements(n) threads=256 block_rule=any shared=0",
            "kernel clamp types=f32,f64 args=x:v:T:n,lo:s:T,hi:s:T outs=out:w:T:n blocks=elements(n) threads=256 block_rule=any shared=0",
            "kernel expm1ish types=f64 args=x:v:T:n outs=out:w:T:n blocks=elements(n) threads=256 block_rule=any shared=0",
            "kernel job_axpy types=f32,f64 args=alpha:s:T,x:v:T:n,y:v:T:n outs=out:w:T:n blocks=elements(n) threads=256 block_rule=any shared=0",
            "kernel job_row_max types=f32,f64 args=x:v:T:n,cols:d outs=out:o:T:n/cols blocks=n/cols threads=128 block_rule=warps shared=264",
            "kernel job_sumsq types=f32,f64 args=x:v:T:n outs=sum:s:T blocks=chunks(n) threads=256 block_rule=pow2 shared=264",
            "kernel masked_dot types=f32,f64 args=x:v:T:rows*cols,w:v:f64:cols,mask:v:u8:rows,scale:s:T,shift:s:s32,rows:d,cols:d outs=y:o:T:rows,hits:s:u32 blocks=rows threads=256 block_rule=warps shared=264",
            "kernel row_max types=f32,f64 args=x:v:T:n,cols:d outs=out:o:T:n/cols blocks=n/cols threads=128 block_rule=warps shared=264",
            "kernel scale_add types=s32,u32,f64 args=acc:io:T:n,x:v:T:n,a:s:T outs=- blocks=elements(n) threads=256 block_rule=any shared=0",
            "kernel scaled_copy types=f32 args=x:v:T:n,a:s:T,rows:d,b:s:T outs=out:o:T:n blocks=elements(n) threads=256 block_rule=warps shared=0",
            "kernel sumsq types=f32,f64 args=x:v:T:n outs=sum:s:T blocks=chunks(n) threads=256 block_rule=pow2 shared=264",
            "kernel total types=f64 args=x:v:T:n outs=out:s:T blocks=chunks(n) threads=64 block_rule=warps shared=264",
            "kernel wdot types=f64 args=w:s:T,x:v:T:n,y:v:T:n outs=sum:s:T blocks=chunks(n) threads=256 block_rule=pow2 shared=264",
        ]
    );
    // Every line reads back with gpud's parser.
    for l in &lines {
        let field = |k: &str| l.split(' ').find_map(|f| f.strip_prefix(k)).unwrap();
        let sig = Sig::parse(field("args="), field("outs=")).unwrap();
        Blocks::parse(&sig, field("blocks=")).unwrap();
        BlockRule::parse(field("block_rule=")).unwrap();
    }
}

fn item<'a>(name: &'a str, kind: &'a str, ty: &'a str, len: &'a str) -> Item<'a> {
    Item { name, kind, ty, len }
}

const ARGS: &[Item] = &[
    Item { name: "x", kind: "v", ty: "T", len: "rows * cols" },
    Item { name: "q", kind: "v", ty: "T", len: "cols" },
    Item { name: "rows", kind: "d", ty: "", len: "" },
    Item { name: "cols", kind: "d", ty: "", len: "" },
];
const OUTS: &[Item] = &[Item { name: "sim", kind: "o", ty: "T", len: "rows" }];

fn decl() -> Decl<'static> {
    Decl {
        name: "cos_sim",
        bound: "Float",
        types: &["f32", "f64"],
        args: ARGS,
        outs: OUTS,
        blocks: "rows",
        threads: 256,
        block_rule: "warps",
        shared: 264,
        group: 0,
    }
}

fn line_of(d: &Decl) -> Result<String, String> {
    manifest::kernel(d).map(|k| k.line.as_str().to_string()).map_err(|e| e.as_str().to_string())
}

#[test]
fn kernel_declarations_are_written_canonically_and_bad_ones_refused() {
    assert_eq!(
        line_of(&decl()).unwrap(),
        "kernel cos_sim types=f32,f64 args=x:v:T:rows*cols,q:v:T:cols,rows:d,cols:d outs=sim:o:T:rows \
         blocks=rows threads=256 block_rule=warps shared=264\n"
    );
    // Evaluated at compile time, as the macros do.
    const K: manifest::Kernel = match manifest::kernel(&Decl {
        name: "k",
        bound: "",
        types: &[],
        args: &[Item { name: "acc", kind: "io", ty: "u32", len: "n" }],
        outs: &[],
        blocks: "elements( n )",
        threads: 100,
        block_rule: "any",
        shared: 0,
        group: 0,
    }) {
        Ok(k) => k,
        Err(_) => panic!(),
    };
    assert_eq!(
        K.line.as_str(),
        "kernel k types=- args=acc:io:u32:n outs=- blocks=elements(n) threads=100 block_rule=any shared=0\n"
    );
    assert_eq!((K.layout.vectors, K.layout.outputs, K.layout.scalars, K.layout.dims), (1, 0, 0, 0));

    let bad = |f: &dyn Fn(&mut Decl)| {
        let mut d = decl();
        f(&mut d);
        line_of(&d).unwrap_err()
    };
    let is = |e: String, rule: &str| assert_eq!(e, format!("erlcuda_kernel: cos_sim: {rule}"));
    is(bad(&|d| d.name = "cos-sim").replace("cos-sim", "cos_sim"), "a kernel name has only ASCII letters, digits and _");
    is(bad(&|d| d.bound = "Real"), "T's bound is Element, Numeric, Int or Float");
    is(bad(&|d| d.types = &["f32", "s32"]), "T: Float takes f32, f64");
    is(bad(&|d| d.types = &["f64", "f64"]), "a type is listed twice");
    is(bad(&|d| d.types = &["u64"]), "T's types are among u8, s32, u32, s64, f32, f64");
    is(bad(&|d| d.types = &[]), "T: BOUND in [TYPES] lists at least one type (or declare the kernel with [] for no T)");
    is(bad(&|d| (d.bound, d.types) = ("", &[])), "a kernel declared with [] (no T) has no argument or output of type T");
    is(bad(&|d| d.blocks = "rows / q"), "a length names an argument that is no d");
    is(bad(&|d| d.blocks = "lanes(rows)"), "blocks is elements(LEN), chunks(LEN) or LEN");
    is(bad(&|d| d.block_rule = "halfwarps"), "block_rule is any, warps or pow2");
    is(bad(&|d| d.threads = 100), "threads is a multiple of 32 from 32 to 1024 (block_rule = warps)");
    is(bad(&|d| (d.threads, d.block_rule) = (96, "pow2")), "threads is a power of two from 32 to 1024 (block_rule = pow2)");
    is(bad(&|d| (d.threads, d.block_rule) = (2048, "any")), "threads is 1 to 1024");
    is(bad(&|d| d.shared = 49153), "shared is at most 49152 bytes");
    is(bad(&|d| d.outs = &[]), "a kernel has an output or an io argument");
    const BAD_OUT: &[Item] = &[Item { name: "sim", kind: "o", ty: "T", len: "m" }];
    is(bad(&|d| d.outs = BAD_OUT), "an output's length names no dimension and no input's free length");
    const NOT_AN_OUT: &[Item] = &[Item { name: "sim", kind: "v", ty: "T", len: "rows" }];
    is(bad(&|d| d.outs = NOT_AN_OUT), "an output is `NAME: o(TYPE, LEN)` or `NAME: s(TYPE)`");
    const NO_LEN: &[Item] = &[Item { name: "x", kind: "v", ty: "T", len: "" }];
    is(
        bad(&|d| d.args = NO_LEN),
        "an argument is `NAME: v(TYPE, LEN)`, `NAME: io(TYPE, LEN)`, `NAME: s(TYPE)`, `NAME: d` or `NAME: d(RANGE)`",
    );
    // A dimension's range, as kernel! passes `d(1 ..= cols & 64)`, and
    // ranges the language refuses.
    const RANGED: &[Item] = &[
        Item { name: "x", kind: "v", ty: "T", len: "rows * cols" },
        Item { name: "q", kind: "v", ty: "T", len: "cols" },
        Item { name: "rows", kind: "d", ty: "", len: "" },
        Item { name: "cols", kind: "d", ty: "1 ..= 64 & rows", len: "" },
    ];
    let mut d = decl();
    d.args = RANGED;
    assert!(line_of(&d).unwrap().contains(" args=x:v:T:rows*cols,q:v:T:cols,rows:d,cols:d:1..=64&rows outs="));
    for (range, rule) in [("1 .. 64", "a range is LO.., ..=HI or LO..=HI"), ("..", "a range is LO.., ..=HI or LO..=HI"),
                          ("1 ..= m", "an output's length names no dimension and no input's free length")] {
        let args = [ARGS[0], ARGS[1], ARGS[2], Item { name: "cols", kind: "d", ty: range, len: "" }];
        let mut d = decl();
        d.args = &args;
        is(line_of(&d).unwrap_err(), rule);
    }
    const U8_SCALAR: &[Item] = &[
        Item { name: "x", kind: "v", ty: "T", len: "n" },
        Item { name: "k", kind: "s", ty: "u8", len: "" },
    ];
    is(bad(&|d| (d.args, d.blocks) = (U8_SCALAR, "n")), "a scalar is never u8");
    let long = "x".repeat(31);
    let many: Vec<Item> = (0..8).map(|_| item(&long, "v", "T", "n")).collect();
    let mut d = decl();
    d.args = &many;
    assert!(line_of(&d).unwrap_err().ends_with("two arguments have one name"));
}

fn legacy(shape: Shape, args: &[(&str, &str)], out: manifest::RuleTokens, blocks: manifest::RuleTokens) -> Result<String, String> {
    manifest::legacy("k", shape, &["f64"], args, out, blocks, 256, 264)
        .map(|k| k.line.as_str().to_string())
        .map_err(|e| e.as_str().to_string())
}

#[test]
fn fixed_shapes_are_written_canonically_and_bad_ones_refused() {
    let vdd: &[(&str, &str)] = &[("x", "v"), ("rows", "d"), ("cols", "d")];
    assert_eq!(
        legacy(Shape::Table, vdd, ("n", &["cols"]), ("n", &["d0"])).unwrap(),
        "kernel k types=f64 args=x:v:T:n,rows:d,cols:d outs=out:o:T:n/cols blocks=n/rows threads=256 block_rule=warps shared=264\n"
    );
    assert_eq!(
        legacy(Shape::Table, vdd, ("1", &[]), ("one", &[])).unwrap(),
        "kernel k types=f64 args=x:v:T:n,rows:d,cols:d outs=out:s:T blocks=1 threads=256 block_rule=warps shared=264\n"
    );
    let bad = |r: Result<String, String>, rule: &str| assert_eq!(r.unwrap_err(), format!("erlcuda_kernel: k: {rule}"));
    bad(legacy(Shape::Table, vdd, ("n", &["x"]), ("one", &[])), "in n / D, D names no d argument of the kernel");
    bad(legacy(Shape::Table, vdd, ("n", &["d2"]), ("one", &[])), "in n / D, D names no d argument of the kernel");
    bad(legacy(Shape::Table, vdd, ("2", &[]), ("one", &[])), "out is n, 1 or n / D (D a d argument's name, or d0, d1, ...)");
    bad(
        legacy(Shape::Table, vdd, ("n", &[]), ("rows", &[])),
        "blocks is elements, chunks, one or n / D (D a d argument's name, or d0, d1, ...)",
    );
    bad(
        legacy(Shape::Elementwise, vdd, ("n", &[]), ("elements", &[])),
        "elementwise! and reduction! take v and s arguments only (d is for table!)",
    );
    bad(legacy(Shape::Table, &[("x", "s")], ("n", &[]), ("one", &[])), "a kernel takes at least one vector (v) argument");
    bad(
        legacy(Shape::Table, &[("x", "w")], ("n", &[]), ("one", &[])),
        "an argument is `name: v` (vector), `name: s` (scalar) or `name: d` (dimension)",
    );
    bad(legacy(Shape::Table, &[("n", "v")], ("n", &[]), ("one", &[])), "an argument is never named n (n is the vectors' length)");
    bad(legacy(Shape::Elementwise, &[("x", "v"), ("out", "s")], ("n", &[]), ("elements", &[])), "an output's name is taken");
    let nine: Vec<(&str, &str)> = ["a", "b", "c", "d", "e", "f", "g", "h", "i"].iter().map(|n| (*n, "s")).collect();
    let mut nine_s = vec![("x", "v")];
    nine_s.extend(nine);
    bad(legacy(Shape::Elementwise, &nine_s, ("n", &[]), ("elements", &[])), "more than 8 scalar and dimension arguments");
    let r = manifest::legacy("k", Shape::Table, &["f64"], vdd, ("n", &[]), ("one", &[]), 100, 0);
    assert_eq!(r.unwrap_err().as_str(), "erlcuda_kernel: k: threads is a multiple of 32 from 32 to 1024");
    let r = manifest::legacy("k", Shape::Table, &["f16"], vdd, ("n", &[]), ("one", &[]), 64, 0);
    assert_eq!(r.unwrap_err().as_str(), "erlcuda_kernel: k: the element types are f32 and f64");
    let r = manifest::legacy("k", Shape::Table, &[], vdd, ("n", &[]), ("one", &[]), 64, 0);
    assert_eq!(r.unwrap_err().as_str(), "erlcuda_kernel: k: list at least one element type: [f32], [f64] or [f32, f64]");
}

/// A kernel with group bodies: its shared and same_ arguments are the
/// signature's v and d, named again in `group=`; a group kind without
/// group bodies, group bodies without a shared argument, and more jobs
/// per block than warps are refused.
#[test]
fn group_declarations_are_written_and_checked() {
    const GROUPED: &[Item] = &[
        Item { name: "x", kind: "shared", ty: "T", len: "rows * cols" },
        Item { name: "q", kind: "v", ty: "T", len: "cols" },
        Item { name: "rows", kind: "same_d", ty: "", len: "" },
        Item { name: "cols", kind: "same_d", ty: "1 ..= 64", len: "" },
    ];
    let mut d = decl();
    (d.args, d.group) = (GROUPED, 32);
    assert_eq!(
        line_of(&d).unwrap(),
        "kernel cos_sim types=f32,f64 args=x:v:T:rows*cols,q:v:T:cols,rows:d,cols:d:1..=64 outs=sim:o:T:rows \
         blocks=rows threads=256 block_rule=warps shared=264 group=x;rows,cols;32\n"
    );
    let is = |e: String, rule: &str| assert_eq!(e, format!("erlcuda_kernel: cos_sim: {rule}"));
    d.group = 0;
    is(
        line_of(&d).unwrap_err(),
        "a kernel with shared or same_ arguments has group bodies (group_gpu(g, job, block, jobs_per_block = N), group_cpu(g, job))",
    );
    d.group = 33;
    is(line_of(&d).unwrap_err(), "jobs_per_block is 1 to 32");
    let mut d = decl();
    d.group = 1;
    is(line_of(&d).unwrap_err(), "a kernel with group bodies has at least one shared argument (NAME: shared(TYPE, LEN))");
    const SAME_ONLY: &[Item] = &[ARGS[0], ARGS[1], Item { name: "rows", kind: "same_d", ty: "", len: "" }, ARGS[3]];
    let mut d = decl();
    d.args = SAME_ONLY;
    is(
        line_of(&d).unwrap_err(),
        "a kernel with shared or same_ arguments has group bodies (group_gpu(g, job, block, jobs_per_block = N), group_cpu(g, job))",
    );
}
