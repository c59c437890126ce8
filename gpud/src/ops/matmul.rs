//! `matmul`: `C (m×n) = A (m×k) · B (k×n)`, row-major, Args
//! `[A, B, M, N, K]`. Each output element is one serial multiply-add chain
//! over k in the element type, on both backends.

use super::{abi, push_pod, DevPtrs, DeviceLaunch, Float, KernelOp, Placement};
use crate::backend::Arena;
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
                abi::MatmulJob { a: p.in0, b: p.in1, c: p.out, m: m as u32, n: n as u32, k: k as u32, tiles_n: 0, tile_start: 0 }
            })
            .collect();
        let (total, smem) = match jobs.first().map(Job::ty) {
            Some(ElemType::F64) => (abi::matmul_f64_abi::matmul_f64_prepare(&mut t)?, abi::matmul_f64_abi::MATMUL_F64_SMEM_BYTES),
            _ => (abi::matmul_prepare(&mut t)?, abi::MATMUL_SMEM_BYTES),
        };
        push_pod(table, &t);
        Some(DeviceLaunch::counted(jobs.len(), total, abi::MATMUL_MAX_GRID, smem))
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
pub fn matmul_cpu<T: Float>(a: &[T], b: &[T], out: &mut [T], m: usize, n: usize, k: usize) {
    use rayon::prelude::*;
    assert!(a.len() == m * k && b.len() == k * n && out.len() == m * n);
    if m == 0 || n == 0 {
        return;
    }
    let row = |i: usize, orow: &mut [T]| {
        // i-k-j order: the inner loop streams one row of B and the output
        // row with unit stride, which vectorises.
        orow.fill(T::ZERO);
        for (p, &aip) in a[i * k..(i + 1) * k].iter().enumerate() {
            for (s, &bpj) in orow.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *s += aip * bpj;
            }
        }
    };
    let work = m as u64 * n as u64 * k.max(1) as u64;
    if work >= PAR_MATMUL_WORK && m > 1 {
        out.par_chunks_mut(n).enumerate().for_each(|(i, orow)| row(i, orow));
    } else {
        for (i, orow) in out.chunks_mut(n).enumerate() {
            row(i, orow);
        }
    }
}
