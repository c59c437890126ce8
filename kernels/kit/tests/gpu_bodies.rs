//! The kernels of the kit's GPU tests (`gpu_tests/src/jobs.rs`, which
//! run.py launches on a GPU) through their GPU bodies on the CPU, as gpud's
//! CPU backend runs them with `cpu_runs = gpu` (`erlcuda_hostgpu_*`: every
//! block's threads emulated, every access checked), against their CPU
//! bodies (`erlcuda_host_*`) on the same job: random inputs (the seed
//! printed: `KIT_SEED=N` repeats it), sizes 0, 1, 1023 and 2^20 + 7 (rows ×
//! cols near it for the per-row kernels), outputs poisoned where the kernel
//! writes them whole. Maps, maxima, integers and histograms are
//! bit-identical; a sum, which the GPU body adds as a tree, agrees within
//! the roundings of both orders.

use erlcuda_kernel::job::{Fault, Job};

// The GPU tests' kernels, the same declarations on the host.
#[path = "../gpu_tests/src/jobs.rs"]
mod jobs;

mod common;
use common::{job, o, v, Rng};

type Host = unsafe extern "C" fn(*const Job);
type HostGpu = unsafe extern "C" fn(*const Job, *mut Fault) -> u32;

extern "C" {
    fn erlcuda_host_job_axpy_f32(job: *const Job);
    fn erlcuda_host_job_axpy_f64(job: *const Job);
    fn erlcuda_host_job_sumsq_f32(job: *const Job);
    fn erlcuda_host_job_sumsq_f64(job: *const Job);
    fn erlcuda_host_job_row_max_f32(job: *const Job);
    fn erlcuda_host_job_row_max_f64(job: *const Job);
    fn erlcuda_host_masked_dot_f32(job: *const Job);
    fn erlcuda_host_masked_dot_f64(job: *const Job);
    fn erlcuda_host_scale_add_s32(job: *const Job);
    fn erlcuda_host_scale_add_u32(job: *const Job);
    fn erlcuda_host_scale_add_f64(job: *const Job);
    fn erlcuda_host_byte_hist(job: *const Job);
    fn erlcuda_hostgpu_job_axpy_f32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_job_axpy_f64(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_job_sumsq_f32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_job_sumsq_f64(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_job_row_max_f32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_job_row_max_f64(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_masked_dot_f32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_masked_dot_f64(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_scale_add_s32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_scale_add_u32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_scale_add_f64(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_byte_hist(job: *const Job, fault: *mut Fault) -> u32;
}

const BIG: usize = (1 << 20) + 7;
const LENGTHS: [usize; 4] = [0, 1, 1023, BIG];
const SHAPES: [(usize, usize); 6] = [(0, 5), (1, 1), (1, 1023), (1023, 1), (3, 1023), (1021, 1027)];

/// The run's generator, its seed printed (KIT_SEED repeats a run).
fn rng() -> Rng {
    common::seeded("gpu_bodies")
}

/// Both bodies of one kernel on the job `make` builds over the outputs it
/// is given (each body its own copy of `outs`, as it starts): the two
/// sets of outputs, the CPU body's first.
fn both<O: Clone>(cpu: Host, gpu: HostGpu, outs: &O, make: impl Fn(&mut O) -> Job) -> (O, O) {
    let (mut c, mut g) = (outs.clone(), outs.clone());
    unsafe { cpu(&make(&mut c)) };
    let mut fault = Fault::default();
    let r = unsafe { gpu(&make(&mut g), &mut fault) };
    assert_eq!(r, 0, "the GPU body faulted: {fault:?}");
    (c, g)
}

/// A float type's unit roundoff and its draws.
trait F: Copy + PartialEq + std::fmt::Debug {
    const EPS: f64;
    fn of(x: f64) -> Self;
    fn to(self) -> f64;
    fn bits(self) -> u64;
    /// NaN: what a poisoned output holds.
    fn poison() -> Self;
}

impl F for f32 {
    const EPS: f64 = f32::EPSILON as f64 / 2.0;
    fn of(x: f64) -> Self {
        x as f32
    }
    fn to(self) -> f64 {
        self as f64
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    fn poison() -> Self {
        f32::NAN
    }
}

impl F for f64 {
    const EPS: f64 = f64::EPSILON / 2.0;
    fn of(x: f64) -> Self {
        x
    }
    fn to(self) -> f64 {
        self
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn poison() -> Self {
        f64::NAN
    }
}

fn floats<T: F>(rng: &mut Rng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::of(rng.uniform(-2.0, 2.0))).collect()
}

fn same_bits<T: F>(what: &str, c: &[T], g: &[T]) {
    assert_eq!(c.len(), g.len());
    for (i, (a, b)) in c.iter().zip(g).enumerate() {
        assert_eq!(a.bits(), b.bits(), "{what}: element {i}: cpu body {a:?}, GPU body {b:?}");
    }
}

/// Two sums of `terms` terms of magnitude `mag` in all: each within
/// (serial run + tree depth) roundings of the exact sum.
fn close_sums(what: &str, c: f64, g: f64, terms: usize, mag: f64, eps: f64) {
    let depth = 2.0 * (terms.max(2) as f64).log2();
    let tol = 2.0 * (256.0 + depth + 16.0) * eps * mag;
    assert!((c - g).abs() <= tol, "{what}: cpu body {c}, GPU body {g} (tolerance {tol})");
}

fn axpy<T: F>(rng: &mut Rng, cpu: Host, gpu: HostGpu) {
    for n in LENGTHS {
        let (x, y) = (floats::<T>(rng, n), floats::<T>(rng, n));
        let alpha = rng.uniform(-2.0, 2.0);
        let (c, g) = both(cpu, gpu, &vec![T::poison(); n], |out| job(&[v(&x), v(&y)], &[o(out)], &[alpha.to_bits()]));
        same_bits(&format!("job_axpy n {n}"), &c, &g);
    }
}

fn sumsq<T: F>(rng: &mut Rng, cpu: Host, gpu: HostGpu) {
    for n in LENGTHS {
        let x = floats::<T>(rng, n);
        let (c, g) = both(cpu, gpu, &vec![T::of(0.0)], |out| job(&[v(&x)], &[o(out)], &[]));
        let mag: f64 = x.iter().map(|v| v.to() * v.to()).sum();
        close_sums(&format!("job_sumsq n {n}"), c[0].to(), g[0].to(), n, mag, T::EPS);
    }
}

fn row_max<T: F>(rng: &mut Rng, cpu: Host, gpu: HostGpu) {
    for (rows, cols) in SHAPES {
        let x = floats::<T>(rng, rows * cols);
        let (c, g) = both(cpu, gpu, &vec![T::of(0.0); rows], |out| job(&[v(&x)], &[o(out)], &[cols as u64]));
        same_bits(&format!("job_row_max {rows}x{cols}"), &c, &g);
    }
}

fn masked_dot<T: F>(rng: &mut Rng, cpu: Host, gpu: HostGpu) {
    for (rows, cols) in SHAPES {
        let x = floats::<T>(rng, rows * cols);
        let w: Vec<f64> = (0..cols).map(|_| rng.uniform(-2.0, 2.0)).collect();
        let mask: Vec<u8> = (0..rows).map(|_| (rng.next() % 3) as u8).collect();
        let (scale, shift) = (rng.uniform(-2.0, 2.0), (rng.next() % 17) as i64 - 8);
        let params = [scale.to_bits(), shift as u64, rows as u64, cols as u64];
        let outs = (vec![T::of(0.0); rows], vec![0u32]);
        let (c, g) = both(cpu, gpu, &outs, |(y, hits)| job(&[v(&x), v(&w), v(&mask)], &[o(y), o(hits)], &params));
        let what = format!("masked_dot {rows}x{cols}");
        assert_eq!(c.1, g.1, "{what}: hits");
        for r in 0..rows {
            let terms: f64 = (0..cols).map(|j| (x[r * cols + j].to() * T::of(w[j]).to()).abs()).sum();
            let mag = scale.abs() * terms + shift.abs() as f64;
            close_sums(&format!("{what}: row {r}"), c.0[r].to(), g.0[r].to(), cols, mag, T::EPS);
        }
    }
}

fn scale_add<T: Copy + PartialEq + std::fmt::Debug>(
    rng: &mut Rng,
    draw: impl Fn(&mut Rng) -> T,
    a: u64,
    cpu: Host,
    gpu: HostGpu,
) {
    for n in LENGTHS {
        let x: Vec<T> = (0..n).map(|_| draw(rng)).collect();
        let acc: Vec<T> = (0..n).map(|_| draw(rng)).collect();
        // acc is the io argument: each body updates its own copy in place.
        let (c, g) = both(cpu, gpu, &acc, |acc| job(&[o(acc), v(&x)], &[], &[a]));
        assert!(c == g, "scale_add n {n}: the bodies' accumulators differ");
    }
}

#[test]
fn the_gpu_tests_kernels_gpu_bodies_match_their_cpu_bodies() {
    let mut rng = rng();
    axpy::<f32>(&mut rng, erlcuda_host_job_axpy_f32, erlcuda_hostgpu_job_axpy_f32);
    axpy::<f64>(&mut rng, erlcuda_host_job_axpy_f64, erlcuda_hostgpu_job_axpy_f64);
    sumsq::<f32>(&mut rng, erlcuda_host_job_sumsq_f32, erlcuda_hostgpu_job_sumsq_f32);
    sumsq::<f64>(&mut rng, erlcuda_host_job_sumsq_f64, erlcuda_hostgpu_job_sumsq_f64);
    row_max::<f32>(&mut rng, erlcuda_host_job_row_max_f32, erlcuda_hostgpu_job_row_max_f32);
    row_max::<f64>(&mut rng, erlcuda_host_job_row_max_f64, erlcuda_hostgpu_job_row_max_f64);
    masked_dot::<f32>(&mut rng, erlcuda_host_masked_dot_f32, erlcuda_hostgpu_masked_dot_f32);
    masked_dot::<f64>(&mut rng, erlcuda_host_masked_dot_f64, erlcuda_hostgpu_masked_dot_f64);
    // Integers that do not overflow: a test build checks arithmetic (gpud's
    // release build wraps, on both sides).
    scale_add(&mut rng, |r| (r.next() % 20001) as i32 - 10000, (-3i64) as u64, erlcuda_host_scale_add_s32, erlcuda_hostgpu_scale_add_s32);
    scale_add(&mut rng, |r| (r.next() % 100_000) as u32, 7, erlcuda_host_scale_add_u32, erlcuda_hostgpu_scale_add_u32);
    scale_add(&mut rng, |r| r.uniform(-2.0, 2.0), 0.75f64.to_bits(), erlcuda_host_scale_add_f64, erlcuda_hostgpu_scale_add_f64);
    for n in LENGTHS {
        let x: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let outs = (vec![0u32; 256], vec![0i64]);
        let (c, g) = both(erlcuda_host_byte_hist, erlcuda_hostgpu_byte_hist, &outs, |(counts, total)| {
            job(&[v(&x)], &[o(counts), o(total)], &[])
        });
        assert_eq!(c, g, "byte_hist n {n}");
        assert_eq!(c.0.iter().map(|&k| k as usize).sum::<usize>(), n);
    }
}
