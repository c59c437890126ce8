//! Host tests: the CPU entries (`erlcuda_host_*`, as gpud calls them, on a
//! hand-made job; for a kernel written once its GPU body run on the CPU,
//! `erlcuda_hostgpu_*`) against plain references, and math.rs against f64.
//! `cargo +nightly test --release` in examples/kernels (integer kernels
//! wrap, as in the release build gpud loads).

use crate::math::{exp_le0_f32, gelu_f32, gelu_f64, unit_u8};
use crate::order::NONE;
use erlcuda_kernel::job::Fault;
use erlcuda_kernel::{Float, Job};

extern "C" {
    fn erlcuda_hostgpu_cos_sim_f32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_cos_sim_f64(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_argmax_rows_f32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_argmax_rows_s32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_argmax_rows_u8(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_histogram(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_host_topk_rows_f32(job: *const Job);
    fn erlcuda_host_topk_rows_s64(job: *const Job);
    fn erlcuda_host_cos_topk_f32(job: *const Job);
    fn erlcuda_host_cos_topk_f64(job: *const Job);
    fn erlcuda_host_gather_f32(job: *const Job);
    fn erlcuda_host_gather_u8(job: *const Job);
    fn erlcuda_host_axpbypcz_f64(job: *const Job);
    fn erlcuda_host_axpbypcz_s32(job: *const Job);
    fn erlcuda_host_gelu_f32(job: *const Job);
    fn erlcuda_host_gelu_f64(job: *const Job);
    fn erlcuda_hostgpu_log_softmax_rows_f32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_host_u8_to_unit(job: *const Job);
    fn erlcuda_host_scatter_add_f32(job: *const Job);
    fn erlcuda_host_scatter_add_u32(job: *const Job);
}

/// A job: vector slots (v, io) in order, outputs, and parameters (s as
/// f64 bits or s64, d as u64), as gpud fills them.
struct J {
    job: Job,
}

impl J {
    fn new() -> J {
        J { job: Job::default() }
    }
    fn vec<R>(mut self, slot: usize, v: &[R]) -> J {
        self.job.addr[slot] = v.as_ptr() as u64;
        self.job.len[slot] = v.len() as u32;
        self
    }
    /// An io slot: the kernel updates `v` in place.
    fn io<R>(mut self, slot: usize, v: &mut [R]) -> J {
        self.job.addr[slot] = v.as_mut_ptr() as u64;
        self.job.len[slot] = v.len() as u32;
        self
    }
    fn out<R>(mut self, j: usize, v: &mut [R]) -> J {
        self.job.addr[Job::out_slot(j)] = v.as_mut_ptr() as u64;
        self.job.len[Job::out_slot(j)] = v.len() as u32;
        self
    }
    fn param(mut self, i: usize, p: u64) -> J {
        self.job.param[i] = p;
        self
    }
    fn run(&self, entry: unsafe extern "C" fn(*const Job)) {
        unsafe { entry(&self.job) }
    }
    /// A kernel written once: its GPU body on the CPU, every block's
    /// threads emulated; a fault fails the test.
    fn run_gpu(&self, entry: unsafe extern "C" fn(*const Job, *mut Fault) -> u32) {
        let mut fault = Fault::default();
        assert_eq!(unsafe { entry(&self.job, &mut fault) }, 0, "the GPU body faulted: {fault:?}");
    }
}

/// xorshift64*: reproducible inputs without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-2, 2).
    fn real(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn ulps_f32(got: f32, want: f64) -> f64 {
    let w = want as f32;
    let ulp = if w.abs() < f32::MIN_POSITIVE {
        2f64.powi(-149)
    } else {
        2f64.powi(((w.abs().to_bits() >> 23) as i32) - 127 - 23)
    };
    (got as f64 - want).abs() / ulp
}

#[test]
fn cos_sim_matches_f64_and_zero_norms_give_0() {
    let mut r = Rng(1);
    let (rows, cols) = (5usize, 300usize);
    let mut x: Vec<f32> = (0..rows * cols).map(|_| r.real() as f32).collect();
    x[cols..2 * cols].fill(0.0);
    let q: Vec<f32> = (0..cols).map(|_| r.real() as f32).collect();
    let mut sim = vec![9.0f32; rows];
    J::new().vec(0, &x).vec(1, &q).param(0, rows as u64).param(1, cols as u64).out(0, &mut sim).run_gpu(erlcuda_hostgpu_cos_sim_f32);
    for (i, s) in sim.iter().enumerate() {
        let xr = &x[i * cols..(i + 1) * cols];
        let d: f64 = xr.iter().zip(&q).map(|(&a, &b)| a as f64 * b as f64).sum();
        let nx: f64 = xr.iter().map(|&a| (a as f64).powi(2)).sum::<f64>().sqrt();
        let nq: f64 = q.iter().map(|&a| (a as f64).powi(2)).sum::<f64>().sqrt();
        let want = if nx == 0.0 { 0.0 } else { d / (nx * nq) };
        assert!((*s as f64 - want).abs() < 1e-5, "row {i}: {s} vs {want}");
    }
    assert_eq!(sim[1], 0.0);
    // A zero query: every result 0; f64 too.
    let x64: Vec<f64> = (0..6).map(|_| r.real()).collect();
    let mut sim64 = vec![9.0f64; 2];
    J::new().vec(0, &x64).vec(1, &[0.0f64; 3]).param(0, 2).param(1, 3).out(0, &mut sim64).run_gpu(erlcuda_hostgpu_cos_sim_f64);
    assert_eq!(sim64, [0.0, 0.0]);
}

/// The reference order: a stable sort, numbers descending, NaN after them.
fn ranked<T: Copy + PartialOrd>(row: &[T]) -> Vec<(T, u32)> {
    let mut v: Vec<(T, u32)> = row.iter().enumerate().map(|(i, &x)| (x, i as u32)).collect();
    #[allow(clippy::eq_op)]
    v.sort_by(|a, b| {
        let (an, bn) = (a.0 != a.0, b.0 != b.0);
        match (an, bn) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            _ => b.0.partial_cmp(&a.0).unwrap(),
        }
    });
    v
}

/// Rows with ties and (floats) NaN: every 4th row all NaN.
fn tie_rows(r: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| if (i / cols) % 4 == 3 || r.below(8) == 0 { f32::NAN } else { (r.below(5) + 1) as f32 })
        .collect()
}

#[test]
fn argmax_rows_first_maximum_nan_never_wins() {
    let mut r = Rng(2);
    let (rows, cols) = (12, 37);
    let x = tie_rows(&mut r, rows, cols);
    let mut idx = vec![7u32; rows];
    J::new().vec(0, &x).param(0, rows as u64).param(1, cols as u64).out(0, &mut idx).run_gpu(erlcuda_hostgpu_argmax_rows_f32);
    for (i, &got) in idx.iter().enumerate() {
        assert_eq!(got, ranked(&x[i * cols..(i + 1) * cols])[0].1, "row {i}");
    }
    assert_eq!(idx[3], 0, "an all-NaN row gives its first index");
    // -inf rows and integers.
    let x = [f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0, f32::NAN];
    let mut idx = [9u32; 2];
    J::new().vec(0, &x).param(0, 2).param(1, 2).out(0, &mut idx).run_gpu(erlcuda_hostgpu_argmax_rows_f32);
    assert_eq!(idx, [0, 0]);
    let xi = [-5i32, 3, 3, i32::MIN, i32::MIN, i32::MIN];
    let mut idx = [9u32; 2];
    J::new().vec(0, &xi).param(0, 2).param(1, 3).out(0, &mut idx).run_gpu(erlcuda_hostgpu_argmax_rows_s32);
    assert_eq!(idx, [1, 0]);
    let xb = [0u8, 255, 255, 7];
    let mut idx = [9u32; 1];
    J::new().vec(0, &xb).param(0, 1).param(1, 4).out(0, &mut idx).run_gpu(erlcuda_hostgpu_argmax_rows_u8);
    assert_eq!(idx, [1]);
    // cols = 0: no element.
    let mut idx = [9u32; 3];
    J::new().vec(0, &[0u8; 0]).param(0, 3).param(1, 0).out(0, &mut idx).run_gpu(erlcuda_hostgpu_argmax_rows_u8);
    assert_eq!(idx, [NONE; 3]);
}

#[test]
fn histogram_counts_every_byte() {
    let mut r = Rng(3);
    let p: Vec<u8> = (0..100_003).map(|_| r.next() as u8).collect();
    let mut counts = vec![0u32; 256];
    J::new().vec(0, &p).out(0, &mut counts).run_gpu(erlcuda_hostgpu_histogram);
    let mut want = vec![0u32; 256];
    for &b in &p {
        want[b as usize] += 1;
    }
    assert_eq!(counts, want);
}

#[test]
fn topk_rows_in_order_with_ties_nan_and_short_rows() {
    let mut r = Rng(4);
    for &(rows, cols, k) in &[(9usize, 50usize, 8usize), (4, 70, 64), (3, 5, 5), (2, 3, 6), (1, 1000, 1)] {
        let x = tie_rows(&mut r, rows, cols);
        let (mut vals, mut idx) = (vec![0.0f32; rows * k], vec![0u32; rows * k]);
        J::new()
            .vec(0, &x)
            .param(0, rows as u64)
            .param(1, cols as u64)
            .param(2, k as u64)
            .out(0, &mut vals)
            .out(1, &mut idx)
            .run(erlcuda_host_topk_rows_f32);
        for i in 0..rows {
            let want = ranked(&x[i * cols..(i + 1) * cols]);
            for j in 0..k {
                let (v, ix) = (vals[i * k + j], idx[i * k + j]);
                if j < cols {
                    assert_eq!(ix, want[j].1, "{rows}x{cols} k {k}: row {i} slot {j}");
                    assert!(v == want[j].0 || (v.is_nan() && want[j].0.is_nan()));
                } else {
                    assert_eq!((v, ix), (f32::NEG_INFINITY, NONE), "a slot past the row");
                }
            }
        }
    }
    // K > 64: the slots past the 64th say "no item"; integers.
    let x: Vec<i64> = (0..100).map(|i| (i * 37 % 101) as i64 - 50).collect();
    let k = 70;
    let (mut vals, mut idx) = (vec![0i64; k], vec![0u32; k]);
    J::new()
        .vec(0, &x)
        .param(0, 1)
        .param(1, 100)
        .param(2, k as u64)
        .out(0, &mut vals)
        .out(1, &mut idx)
        .run(erlcuda_host_topk_rows_s64);
    let want = ranked(&x);
    for j in 0..64 {
        assert_eq!((vals[j], idx[j]), want[j]);
    }
    for j in 64..k {
        assert_eq!((vals[j], idx[j]), (i64::MIN, NONE));
    }
}

/// cos_topk's job on the host: (values, indices), K of each.
fn cos_topk<T: Copy + Default>(entry: unsafe extern "C" fn(*const Job), x: &[T], q: &[T], rows: usize, k: usize) -> (Vec<T>, Vec<u32>) {
    let (mut vals, mut idx) = (vec![T::default(); k], vec![7u32; k]);
    J::new()
        .vec(0, x)
        .vec(1, q)
        .param(0, rows as u64)
        .param(1, q.len() as u64)
        .param(2, k as u64)
        .out(0, &mut vals)
        .out(1, &mut idx)
        .run(entry);
    (vals, idx)
}

/// cos(x, q) in f64, 0 for a zero norm.
fn cos_f64(x: &[f64], q: &[f64]) -> f64 {
    let d: f64 = x.iter().zip(q).map(|(a, b)| a * b).sum();
    let (nx, nq) = (x.iter().map(|a| a * a).sum::<f64>().sqrt(), q.iter().map(|a| a * a).sum::<f64>().sqrt());
    if nx == 0.0 || nq == 0.0 {
        0.0
    } else {
        d / (nx * nq)
    }
}

#[test]
fn cos_topk_is_the_best_k_by_cosine_ties_to_the_lower_row() {
    let mut r = Rng(9);
    let mut exact = 0;
    for &(rows, cols, k) in &[(1usize, 1usize, 1usize), (50, 1023, 10), (70, 33, 64), (200, 300, 1), (64, 5, 64)] {
        // Rows from a pool of 7 (one of them zero): exact ties everywhere.
        let pool: Vec<Vec<f32>> =
            (0..7).map(|p| (0..cols).map(|_| if p == 0 { 0.0 } else { r.real() as f32 }).collect()).collect();
        let pick: Vec<usize> = (0..rows).map(|_| r.below(7) as usize).collect();
        let x: Vec<f32> = pick.iter().flat_map(|&p| pool[p].clone()).collect();
        let q: Vec<f32> = (0..cols).map(|_| r.real() as f32).collect();
        let (vals, idx) = cos_topk(erlcuda_host_cos_topk_f32, &x, &q, rows, k);
        let q64: Vec<f64> = q.iter().map(|&v| v as f64).collect();
        let sim: Vec<f64> =
            pool.iter().map(|p| cos_f64(&p.iter().map(|&v| v as f64).collect::<Vec<_>>(), &q64)).collect();
        // The reference: rows by pool similarity descending, then index.
        let mut want: Vec<u32> = (0..rows as u32).collect();
        want.sort_by(|&a, &b| sim[pick[b as usize]].partial_cmp(&sim[pick[a as usize]]).unwrap().then(a.cmp(&b)));
        // Distinct pool rows' similarities are far apart next to f32's
        // rounding at these sizes (checked), so the order is exact.
        let mut s: Vec<f64> = sim.clone();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        if s.windows(2).all(|w| w[1] - w[0] > 1e-4 || w[1] == w[0]) {
            assert_eq!(idx, want[..k], "{rows}x{cols} k {k}");
            exact += 1;
        }
        for (v, &i) in vals.iter().zip(&idx) {
            assert!((*v as f64 - sim[pick[i as usize]]).abs() < 1e-5, "{rows}x{cols}: {v} for row {i}");
        }
        assert!(vals.windows(2).all(|w| w[0] >= w[1]));
    }
    assert!(exact >= 4, "only {exact} shapes compared exactly");
    // A zero query: every similarity 0, the first K rows; f64.
    let x: Vec<f64> = (0..12).map(|_| r.real()).collect();
    let (vals, idx) = cos_topk(erlcuda_host_cos_topk_f64, &x, &[0.0; 3], 4, 3);
    assert_eq!((vals, idx), (vec![0.0; 3], vec![0, 1, 2]));
    // NaN (a NaN in row 1; inf·0 in row 4) after every number, by index;
    // a K past the rows (only past the signature) says "no item" there.
    let x = [1.0f32, 0.0, f32::NAN, 1.0, -1.0, 0.0, 0.0, 1.0, f32::INFINITY, 0.0];
    let (vals, idx) = cos_topk(erlcuda_host_cos_topk_f32, &x, &[0.0, 1.0], 5, 7);
    assert_eq!(idx, [3, 0, 2, 1, 4, NONE, NONE]);
    assert_eq!(vals[..3], [1.0, 0.0, 0.0]);
    assert!(vals[3].is_nan() && vals[4].is_nan());
    assert_eq!(vals[5..], [f32::NEG_INFINITY; 2]);
}

/// The host body's sums are the GPU's order: 32 lanes of fused
/// multiply-adds by column, then a butterfly (that order written out here
/// with std's `mul_add`, bit for bit).
#[test]
fn cos_topk_sums_in_the_lane_order() {
    let mut r = Rng(10);
    let cols = 1000;
    let q: Vec<f32> = (0..cols).map(|_| r.real() as f32).collect();
    let x: Vec<f32> = (0..3 * cols).map(|_| r.real() as f32).collect();
    let lanes = |a: &[f32], b: &[f32]| {
        let mut p = [0.0f32; 32];
        for j in 0..a.len() {
            p[j % 32] = a[j].mul_add(b[j], p[j % 32]);
        }
        for m in [16, 8, 4, 2, 1] {
            p = std::array::from_fn(|l| p[l] + p[l ^ m]);
        }
        p[0]
    };
    let qq = lanes(&q, &q);
    let want: Vec<f32> = (0..3)
        .map(|i| {
            let xr = &x[i * cols..(i + 1) * cols];
            lanes(xr, &q) / (lanes(xr, xr).sqrt() * qq.sqrt())
        })
        .collect();
    let (vals, idx) = cos_topk(erlcuda_host_cos_topk_f32, &x, &q, 3, 3);
    for (v, &i) in vals.iter().zip(&idx) {
        assert_eq!(v.to_bits(), want[i as usize].to_bits(), "row {i}");
    }
}

#[test]
fn gather_reads_in_range_and_gives_0_outside() {
    let table: Vec<f32> = (0..10).map(|i| i as f32 + 0.5).collect();
    let index = [3i32, -1, 9, 10, i32::MIN, 0];
    let mut out = vec![7.0f32; index.len()];
    J::new().vec(0, &table).vec(1, &index).out(0, &mut out).run(erlcuda_host_gather_f32);
    assert_eq!(out, [3.5, 0.0, 9.5, 0.0, 0.0, 0.5]);
    let tb = [10u8, 20, 30];
    let mut ob = [1u8; 3];
    J::new().vec(0, &tb).vec(1, &[2i32, 3, 0]).out(0, &mut ob).run(erlcuda_host_gather_u8);
    assert_eq!(ob, [30, 0, 10]);
}

#[test]
fn axpbypcz_floats_and_wrapping_integers() {
    let (x, y, z) = ([1.0f64, 2.0], [10.0f64, 20.0], [100.0f64, 200.0]);
    let mut out = [0.0f64; 2];
    J::new()
        .param(0, 2.0f64.to_bits())
        .vec(0, &x)
        .param(1, (-1.0f64).to_bits())
        .vec(1, &y)
        .param(2, 0.5f64.to_bits())
        .vec(2, &z)
        .out(0, &mut out)
        .run(erlcuda_host_axpbypcz_f64);
    assert_eq!(out, [42.0, 84.0]);
    let (x, y, z) = ([i32::MAX, 1], [1i32, 2], [0i32, -3]);
    let mut out = [0i32; 2];
    J::new()
        .param(0, 1u64)
        .vec(0, &x)
        .param(1, 1u64)
        .vec(1, &y)
        .param(2, (-2i64) as u64)
        .vec(2, &z)
        .out(0, &mut out)
        .run(erlcuda_host_axpbypcz_s32);
    assert_eq!(out, [i32::MIN, 9]);
}

#[test]
fn gelu_f32_within_3_5_ulp_of_f64() {
    // Every 97th f32 with |x| < 16, both signs (beyond, the result is x
    // or ±0).
    let mut worst = (0.0f64, 0.0f32);
    let mut b = 0u32;
    while b < 0x4180_0000 {
        for x in [f32::from_bits(b), -f32::from_bits(b)] {
            let xd = x as f64;
            let want = xd * 0.5 * Float::erfc(-xd * std::f64::consts::FRAC_1_SQRT_2);
            let e = ulps_f32(gelu_f32(x), want);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        b += 97;
    }
    assert!(worst.0 <= 3.5, "{} ulp at x = {:e}", worst.0, worst.1);
    assert_eq!(gelu_f32(f32::INFINITY), f32::INFINITY);
    assert!(gelu_f32(f32::NEG_INFINITY).is_nan());
    assert!(gelu_f32(f32::NAN).is_nan());
    assert_eq!(gelu_f32(-30.0), 0.0);
    assert_eq!(gelu_f32(1e30), 1e30);
    assert_eq!(gelu_f32(-1e30), 0.0);
}

#[test]
fn gelu_f64_close_to_the_formula_and_entries_agree() {
    let mut r = Rng(5);
    for _ in 0..10_000 {
        let x = r.real() * 8.0;
        // The formula as written rounds x/√2, which erfc amplifies by
        // 2t²: its own error bounds the comparison.
        let t = x / std::f64::consts::SQRT_2;
        let want = x * 0.5 * Float::erfc(-t);
        let tol = f64::EPSILON * (2.0 * t * t + 8.0) * want.abs();
        assert!((gelu_f64(x) - want).abs() <= tol, "{x}");
    }
    assert_eq!(gelu_f64(f64::INFINITY), f64::INFINITY);
    assert!(gelu_f64(f64::NEG_INFINITY).is_nan());
    let x: Vec<f64> = (0..9).map(|i| i as f64 - 4.0).collect();
    let mut y = vec![0.0f64; 9];
    J::new().vec(0, &x).out(0, &mut y).run(erlcuda_host_gelu_f64);
    assert_eq!(y, x.iter().map(|&v| gelu_f64(v)).collect::<Vec<_>>());
    let xf: Vec<f32> = (0..9).map(|i| i as f32 - 4.0).collect();
    let mut yf = vec![0.0f32; 9];
    J::new().vec(0, &xf).out(0, &mut yf).run(erlcuda_host_gelu_f32);
    assert_eq!(yf, xf.iter().map(|&v| gelu_f32(v)).collect::<Vec<_>>());
}

#[test]
fn exp_le0_f32_within_1_5_ulp() {
    let mut b = 0u32;
    while b < 0x42d0_0000 {
        // 0 down to -104
        let y = -f32::from_bits(b);
        let e = ulps_f32(exp_le0_f32(y), (y as f64).exp());
        assert!(e <= 1.5, "{e} ulp at {y:e}");
        b += 101;
    }
    assert_eq!(exp_le0_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_le0_f32(-200.0), 0.0);
    assert!(exp_le0_f32(f32::NAN).is_nan());
    assert_eq!(exp_le0_f32(0.0), 1.0);
}

#[test]
fn log_softmax_rows_matches_f64_and_nan_spreads_over_its_row() {
    let mut r = Rng(6);
    let (rows, cols) = (3usize, 513usize);
    let mut x: Vec<f32> = (0..rows * cols).map(|_| (r.real() * 8.0) as f32).collect();
    x[2 * cols + 5] = f32::NAN;
    let mut y = vec![0.0f32; rows * cols];
    J::new().vec(0, &x).param(0, cols as u64).out(0, &mut y).run_gpu(erlcuda_hostgpu_log_softmax_rows_f32);
    for i in 0..2 {
        let xr = &x[i * cols..(i + 1) * cols];
        let m = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let l = xr.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        for j in 0..cols {
            let want = xr[j] as f64 - m - l;
            assert!((y[i * cols + j] as f64 - want).abs() < 1e-5 * (want.abs() + 16.0));
        }
    }
    assert!(y[2 * cols..].iter().all(|v| v.is_nan()));
}

#[test]
fn u8_to_unit_exact_and_the_gpu_formula_agrees() {
    for p in 0..256u32 {
        assert_eq!(unit_u8(p).to_bits(), (p as f32 / 255.0).to_bits(), "{p}");
    }
    let p: Vec<u8> = (0..=255).collect();
    let mut u = vec![0.0f32; 256];
    J::new().vec(0, &p).out(0, &mut u).run(erlcuda_host_u8_to_unit);
    assert_eq!(u, (0..256).map(|v| v as f32 / 255.0).collect::<Vec<_>>());
}

#[test]
fn scatter_add_adds_duplicates_and_skips_out_of_range() {
    let mut acc = vec![1.0f32, 2.0, 3.0];
    let index = [0u32, 2, 2, 3, u32::MAX, 0];
    let vals = [0.5f32, 1.0, 1.0, 100.0, 100.0, 0.25];
    J::new().io(0, &mut acc).vec(1, &index).vec(2, &vals).run(erlcuda_host_scatter_add_f32);
    assert_eq!(acc, [1.75, 2.0, 5.0]);
    let mut acc = vec![u32::MAX, 0];
    J::new().io(0, &mut acc).vec(1, &[0u32, 1, 0]).vec(2, &[1u32, 5, 2]).run(erlcuda_host_scatter_add_u32);
    assert_eq!(acc, [2, 5], "u32::MAX + 1 + 2 wraps to 2");
}
