//! Element-by-element kernels: `gather`, `axpbypcz`, `gelu`, `u8_to_unit`.
//!
//! `blocks = elements(LEN)`: virtual block b of a job covers elements
//! [b·B·4, (b + 1)·B·4), and thread t of it the group of four at
//! 4·(b·B + t): one 16-byte access per thread and vector (one 32-bit word
//! for u8), neighbouring threads neighbouring groups. A group that is not
//! whole (the end of the vector) or not aligned goes element by element.
//! No barrier, so any block size works (`block_rule = any`).

use crate::math::gelu;
use erlcuda_kernel::{kernel, Element};

/// Table[i] for an index in range, else 0 of T.
#[inline(always)]
fn pick<T: Element>(i: i32, n: u64, at: impl Fn(usize) -> T) -> T {
    if i >= 0 && (i as u64) < n {
        at(i as usize)
    } else {
        T::from_bits64(0)
    }
}

kernel! {
    /// out[j] = table[index[j]]: Args [Table, Index]. An index outside
    /// 0 ≤ i < n gives 0 (of T) and reads nothing.
    gather, T: Element in [u8, s32, u32, s64, f32, f64],
    (table: v(T, n), index: v(s32, m)) -> (out: w(T, m)),
    blocks = elements(m), threads = 256, block_rule = any, shared = 0,
    gpu(job, block) {
        let (n, m) = (job.len(0), job.len(1));
        let e = group_at(block);
        let at = |i: usize| T::load_nc(table.add(i));
        if e + 4 <= m && aligned(index) && aligned(out as *const T) {
            // Four independent random reads in flight per thread.
            let ix = load4(index.add(e as usize));
            store4(out.add(e as usize), ix.map(|i| pick(i, n, at)));
        } else {
            for e in e..m.min(e + 4) {
                T::store(out.add(e as usize), pick(i32::load_nc(index.add(e as usize)), n, at));
            }
        }
    }
    cpu(job) {
        let n = table.len() as u64;
        for (o, &i) in out.iter_mut().zip(index) {
            *o = pick(i, n, |i| table[i]);
        }
    }
}

kernel! {
    /// out = a·x + b·y + c·z: Args [A, X, B, Y, C, Z], scalars of T.
    /// Integers wrap; floats: the GPU fuses the multiply-adds (one rounding
    /// less than the CPU's plain products and sums).
    axpbypcz, T: Numeric in [s32, u32, s64, f32, f64],
    (a: s(T), x: v(T, n), b: s(T), y: v(T, n), c: s(T), z: v(T, n)) -> (out: w(T, n)),
    blocks = elements(n), threads = 256, block_rule = any, shared = 0,
    gpu(job, block) {
        let n = job.len(0);
        let e = group_at(block);
        let f = |xi: T, yi: T, zi: T| a * xi + b * yi + c * zi;
        if e + 4 <= n && aligned(x) && aligned(y) && aligned(z) && aligned(out as *const T) {
            let at = e as usize;
            let (xv, yv, zv) = (load4(x.add(at)), load4(y.add(at)), load4(z.add(at)));
            store4(out.add(at), core::array::from_fn(|i| f(xv[i], yv[i], zv[i])));
        } else {
            for e in e..n.min(e + 4) {
                let at = e as usize;
                T::store(out.add(at), f(T::load_nc(x.add(at)), T::load_nc(y.add(at)), T::load_nc(z.add(at))));
            }
        }
    }
    cpu(job) {
        for (((o, &xi), &yi), &zi) in out.iter_mut().zip(x).zip(y).zip(z) {
            *o = a * xi + b * yi + c * zi;
        }
    }
}

kernel! {
    /// y = x·(1 + erf(x/√2))/2: Args [X]. f32 in f32 arithmetic without
    /// libm (math.rs: within 3.5 ulp, accurate for x < 0 too, where the
    /// formula taken literally cancels); f64 with libm's erfc.
    gelu, T: Float in [f32, f64],
    (x: v(T, n)) -> (y: w(T, n)),
    blocks = elements(n), threads = 256, block_rule = any, shared = 0,
    gpu(job, block) {
        let n = job.len(0);
        let e = group_at(block);
        if e + 4 <= n && aligned(x) && aligned(y as *const T) {
            store4(y.add(e as usize), load4(x.add(e as usize)).map(gelu));
        } else {
            for e in e..n.min(e + 4) {
                T::store(y.add(e as usize), gelu(T::load_nc(x.add(e as usize))));
            }
        }
    }
    cpu(job) {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = gelu(v);
        }
    }
}

kernel! {
    /// unit[i] = p[i] / 255 as f32 (0.0 to 1.0, correctly rounded): Args
    /// [P], P u8.
    u8_to_unit, [],
    (p: v(u8, n)) -> (unit: w(f32, n)),
    blocks = elements(n), threads = 256, block_rule = any, shared = 0,
    gpu(job, block) {
        let n = job.len(0);
        let e = group_at(block);
        if e + 4 <= n && aligned(p) && aligned(unit as *const f32) {
            // Four bytes in one word, four floats in one 16-byte store.
            let w = u32::load_nc(p.add(e as usize) as *const u32);
            f32::stg4(unit.add(e as usize), [w, w >> 8, w >> 16, w >> 24].map(unit_u8));
        } else {
            for e in e..n.min(e + 4) {
                f32::stg(unit.add(e as usize), unit_u8(u8::load_nc(p.add(e as usize)) as u32));
            }
        }
    }
    cpu(job) {
        for (o, &v) in unit.iter_mut().zip(p) {
            *o = v as f32 / 255.0;
        }
    }
}

/// The first element of this thread's group in virtual block `block`.
// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
#[inline(always)]
fn group_at(block: u64) -> u64 {
    use erlcuda_kernel::device::{block_dim, thread_idx};
    4 * (block * block_dim() as u64 + thread_idx() as u64)
}

// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
use {
    crate::group::{aligned, load4, store4},
    crate::math::unit_u8,
};
