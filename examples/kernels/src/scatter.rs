//! Kernels that add into places chosen by the data: `histogram` and
//! `scatter_add`, with atomics on the GPU (the CPU backend runs a job on
//! one thread, so its loops add in index order).

use erlcuda_kernel::kernel;
// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
use erlcuda_kernel::{Element, Numeric};

kernel! {
    /// counts[b] = how many of p are b, for b < 256: Args [P], P u8.
    ///
    /// GPU: `chunks(n)` blocks of 256 bytes a thread (64 KiB at B = 256),
    /// read 16 bytes at a time. Each block counts into eight copies of the
    /// 256 bins in shared memory (warp w into copy w mod 8, so warps
    /// rarely wait on one another's atomics), then adds each bin's total
    /// to the output with one global atomic: 256 global atomics per 64 KiB
    /// instead of one per byte. Written once: the CPU backend runs this GPU
    /// body (18× what a `cpu` body took, within the 30× of a kernel with
    /// barriers: bench/EXPERIMENTS.md).
    histogram, [],
    (p: v(u8, n)) -> (counts: o(u32, 256)),
    blocks = chunks(n), threads = 256, block_rule = any, shared = 0,
    gpu(job, block) {
        gpu::histogram_block(p, job.len(0), block, counts);
    }
}

kernel! {
    /// acc[index[j]] += vals[j] for every j: Args [Acc, Index, Vals], Acc
    /// a device buffer updated in place, result `ok`. An index ≥ n is
    /// skipped. Integers wrap. GPU: one atomic add per element (f32/f64:
    /// `red.global.add`), so repeated indices all count; float sums come
    /// in whatever order the atomics land (the CPU adds in j order).
    scatter_add, T: Numeric in [s32, u32, s64, f32, f64],
    (acc: io(T, n), index: v(u32, m), vals: v(T, m)) -> (),
    blocks = elements(m), threads = 256, block_rule = any, shared = 0,
    gpu(job, block) {
        let (n, m) = (job.len(0), job.len(1));
        let e = 4 * (block * block_dim() as u64 + thread_idx() as u64);
        let add = |i: u32, v: T| {
            if (i as u64) < n {
                gpu::atomic_add(acc.add(i as usize), v);
            }
        };
        if e + 4 <= m && crate::group::aligned(index) && crate::group::aligned(vals) {
            let (ix, vs) = (crate::group::load4(index.add(e as usize)), crate::group::load4(vals.add(e as usize)));
            for q in 0..4 {
                add(ix[q], vs[q]);
            }
        } else {
            for e in e..m.min(e + 4) {
                add(u32::load_nc(index.add(e as usize)), T::load_nc(vals.add(e as usize)));
            }
        }
    }
    cpu(job) {
        let n = acc.len();
        for (&i, &v) in index.iter().zip(vals) {
            if (i as usize) < n {
                acc[i as usize] = acc[i as usize] + v;
            }
        }
    }
}

// (both targets: the CPU backend runs GPU code where cpu_runs = gpu)
mod gpu {
    use super::*;
    use erlcuda_kernel::device::{block_dim, sync_threads, thread_idx, trap};
    use erlcuda_kernel::job::SERIAL;
    use erlcuda_kernel::{atomic, shared_array, Float};

    /// `*p += v` atomically for the kit's atomic types: integers by their
    /// bits (a two's-complement add is the same for signed and unsigned),
    /// floats with `red` (no old value wanted). T is one of the kernel's
    /// types, so the match folds to one arm.
    #[inline(always)]
    pub unsafe fn atomic_add<T: Numeric>(p: *mut T, v: T) {
        let int = T::ONE.to_bits64() == 1;
        match (T::BYTES, int) {
            (4, true) => {
                atomic::add(p as *mut u32, v.to_bits64() as u32);
            }
            (8, true) => {
                atomic::add(p as *mut u64, v.to_bits64());
            }
            (4, false) => f32::red_add(p as *mut f32, f32::from_bits(v.to_bits64() as u32)),
            (8, false) => f64::red_add(p as *mut f64, f64::from_bits(v.to_bits64())),
            // u8 is not among scatter_add's types.
            _ => trap(),
        }
    }

    /// Copies of the 256 bins per block.
    const COPIES: u32 = 8;

    /// One virtual block of `histogram`: bytes [block·B·256, ...) of p.
    pub unsafe fn histogram_block(p: *const u8, n: u64, block: u64, counts: *mut u32) {
        let bins = shared_array!(histogram_bins: [u32; 256 * COPIES as usize]);
        let (t, nt) = (thread_idx(), block_dim());
        let mut i = t;
        while i < 256 * COPIES {
            bins.set(i as usize, 0);
            i += nt;
        }
        sync_threads();
        let mine = bins.addr(0) + 4 * 256 * ((t / 32) % COPIES);
        let count = |b: u32| {
            atomic::add_shared::<u32>(mine + 4 * b, 1);
        };
        let count_word = |w: u32| {
            count(w & 0xff);
            count(w >> 8 & 0xff);
            count(w >> 16 & 0xff);
            count(w >> 24);
        };
        let per = nt as u64 * SERIAL;
        let lo = block * per;
        let len = n.min(lo + per) - lo;
        let base = p.add(lo as usize);
        let (t64, nt64) = (t as u64, nt as u64);
        let mut tail = 0;
        if base as u64 % 16 == 0 {
            // 16 bytes a load, four loads in flight before their counting.
            let ng = len / 16;
            let load = |g: u64| f32::ldg4_nc(base.add(16 * g as usize) as *const f32);
            let mut g = t64;
            while g + 3 * nt64 < ng {
                let v: [[f32; 4]; 4] = core::array::from_fn(|u| load(g + u as u64 * nt64));
                for vu in v {
                    for x in vu {
                        count_word(x.to_bits());
                    }
                }
                g += 4 * nt64;
            }
            while g < ng {
                for x in load(g) {
                    count_word(x.to_bits());
                }
                g += nt64;
            }
            tail = 16 * ng;
        }
        let mut i = tail + t64;
        while i < len {
            count(u8::load_nc(base.add(i as usize)) as u32);
            i += nt64;
        }
        sync_threads();
        // One global atomic per bin; the barrier after each virtual block
        // keeps the next one from zeroing the bins before they are read.
        let mut b = t;
        while b < 256 {
            let mut s = 0u32;
            for c in 0..COPIES {
                s += bins.get((c * 256 + b) as usize);
            }
            if s != 0 {
                atomic::add(counts.add(b as usize), s);
            }
            b += nt;
        }
    }
}
