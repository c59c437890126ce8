//! `matmul`: `C (m×n) = A (m×k) · B (k×n)`, row-major, Args
//! `[A, B, M, N, K]`. Each output element sums its k products in k order in
//! the element type: one fused chain on the GPU, blocked chains on the CPU
//! ([`Gemm`]), at most k + 1 roundings deep on both (the header's rule).

use super::{abi, push_pod, DevPtrs, DeviceLaunch, Float, KernelOp, Placement};
use crate::arena::Arena;
use crate::descriptor::Job;
use crate::layout::ElemType;
use crate::with_float;

pub struct Op;

/// Multiply-adds above which a matmul is split by rows on the CPU.
const PAR_MATMUL_WORK: u64 = 1 << 18;
/// Multiply-adds from which a matmul with tile reuse copies its inputs to
/// the device: inputs are re-read once per 128-wide tile, so copying pays
/// once there is reuse and real work (512^3: 140 vs 224 µs, 2048^3: 8x);
/// up to 256^3 mapped wins (56 vs 63 µs) (cuda.rs's table, f32).
const MATMUL_COPY_MIN_WORK: u64 = 1 << 25;

impl KernelOp for Op {
    unsafe fn cpu(&self, arena: &Arena<'_>, job: &Job) {
        let (m, n, k) = job.dims();
        with_float!(job.ty(), T => {
            // SAFETY: forwarded from the caller.
            let (a, b, out) =
                unsafe { (arena.input::<T>(job.in0()), arena.input::<T>(job.in1()), arena.output::<T>(job.out())) };
            matmul_cpu::<T>(a, b, out, m, n, k)
        })
    }

    fn device_table(&self, jobs: &[Job], ptrs: &[DevPtrs], table: &mut Vec<u8>) -> Option<DeviceLaunch> {
        let mut t: Vec<abi::MatmulJob> = jobs
            .iter()
            .zip(ptrs)
            .map(|(j, p)| {
                let (m, n, k) = j.dims();
                abi::MatmulJob { a: p.in0(), b: p.in1(), c: p.out(), m: m as u32, n: n as u32, k: k as u32, tiles_n: 0, tile_start: 0 }
            })
            .collect();
        let launch = match jobs.first().map(Job::ty) {
            Some(ElemType::F64) => DeviceLaunch::counted(
                jobs.len(),
                abi::matmul_f64_abi::matmul_f64_prepare(&mut t)?,
                abi::MATMUL_MAX_GRID,
                abi::matmul_f64_abi::MATMUL_F64_SMEM_BYTES,
            ),
            _ => {
                // The f32 kernel's tile height is chosen per launch (its 4th
                // parameter): wide tiles where there are enough of them.
                let (total, rows) = abi::matmul_prepare(&mut t)?;
                let mut l = DeviceLaunch::counted(jobs.len(), total, abi::MATMUL_MAX_GRID, abi::matmul_smem(rows));
                l.params[2] = rows;
                l.nparams = 3;
                l
            }
        };
        push_pod(table, &t);
        Some(launch)
    }

    fn reference(&self, _ty: ElemType, ins: &[&[f64]], _scalars: &[f64], dims: &[u32]) -> Vec<(f64, f64)> {
        let (m, n, k) = (dims[0] as usize, dims[1] as usize, dims[2] as usize);
        let (a, b) = (ins[0], ins[1]);
        let mut out = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                out.push(super::dot2((0..k).map(|p| (a[i * k + p], b[p * n + j]))));
            }
        }
        out
    }

    fn blocks(&self, job: &Job) -> u64 {
        let (m, n, _) = job.dims();
        match job.ty() {
            ElemType::F64 => abi::matmul_f64_abi::matmul_f64_tiles(m as u32, n as u32),
            _ => abi::matmul_tiles(m as u32, n as u32),
        }
    }

    fn placement(&self, job: &Job, _njobs: usize) -> Placement {
        let (m, n, k) = job.dims();
        let reuse = m > abi::MATMUL_BM as usize || n > abi::MATMUL_BN as usize;
        if reuse && (m as u64) * (n as u64) * (k as u64) >= MATMUL_COPY_MIN_WORK {
            Placement::CopyIn
        } else {
            Placement::Mapped
        }
    }
}

/// Row-major `out (m×n) = a (m×k) · b (k×n)`, each output a serial chain
/// over k in `T`, rows in parallel when large.
pub fn matmul_cpu<T: Float + Gemm>(a: &[T], b: &[T], out: &mut [T], m: usize, n: usize, k: usize) {
    use rayon::prelude::*;
    assert!(a.len() == m * k && b.len() == k * n && out.len() == m * n);
    if m == 0 || n == 0 {
        return;
    }
    // Bands of rows over rayon's threads, each one GEMM call: the crate
    // runs one thread per call (its own threading is off), so the row
    // split stays ours and the result does not depend on the thread count.
    let rows_per_band = if (m as u64) * (n as u64) * (k.max(1) as u64) >= PAR_MATMUL_WORK && m > 1 {
        m.div_ceil(rayon::current_num_threads() * 4).max(1)
    } else {
        m
    };
    out.par_chunks_mut(rows_per_band * n).enumerate().for_each(|(band, o)| {
        let rows = o.len() / n;
        let a = &a[band * rows_per_band * k..][..rows * k];
        T::gemm(a, b, o, rows, n, k);
    });
}

/// A row-major GEMM `out = a · b` of the element type (matrixmultiply's
/// packed, cache-blocked kernels: sgemm / dgemm). Each output element sums
/// its k products in k order: chains of at most the crate's kc products
/// (fused where the CPU has FMA), each chain's sum then added to the
/// output, so at most k + 1 roundings deep, the depth the header states.
pub trait Gemm: Sized {
    fn gemm(a: &[Self], b: &[Self], out: &mut [Self], m: usize, n: usize, k: usize);
}

macro_rules! gemm_impl {
    ($t:ty, $f:ident) => {
        impl Gemm for $t {
            fn gemm(a: &[$t], b: &[$t], out: &mut [$t], m: usize, n: usize, k: usize) {
                assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
                // SAFETY: the asserts bound every access: A is m×k with row
                // stride k, B k×n with row stride n, C m×n with row stride
                // n, all unit column stride; beta = 0 ignores C's contents.
                unsafe {
                    matrixmultiply::$f(
                        m, k, n, 1.0,
                        a.as_ptr(), k as isize, 1,
                        b.as_ptr(), n as isize, 1,
                        0.0, out.as_mut_ptr(), n as isize, 1,
                    )
                }
            }
        }
    };
}
gemm_impl!(f32, sgemm);
gemm_impl!(f64, dgemm);
