//! Kernels declared with the kit's macros, one of each form: built for the
//! GPU here (run.py launches them with job tables, as gpud does) and for
//! the host by the kit's host tests (`tests/host.rs` includes this file
//! and runs their CPU entries). One declaration, both sides checked on the
//! same data.

// The GPU bodies' (the host build has none).
#[allow(unused_imports)]
use erlcuda_kernel::{atomic, job::ELEMS_PER_THREAD};
use erlcuda_kernel::{elementwise, kernel, reduction, table, BLOCK_SHARED_BYTES};

// out[i] = alpha · x[i] + y[i], one rounding: the built-in saxpy's form.
elementwise!(job_axpy, [f32, f64], (alpha: s, x: v, y: v) => alpha.fma(x, y));

// sum = Σ x[i]²
reduction!(job_sumsq, [f32, f64], (x: v) => x * x);

table! {
    // out[r] = max of row r of x (row-major, cols columns): one block per row.
    job_row_max, [f32, f64], (x: v, cols: d),
    out = n / cols, blocks = n / cols, threads = 128, shared = BLOCK_SHARED_BYTES,
    gpu(k, row) {
        let c = cols as usize;
        let xr = x.add(row as usize * c);
        let mut m = T::NEG_INFINITY;
        let mut j = thread_idx() as usize;
        while j < c {
            m = m.max(T::ldg_nc(xr.add(j)));
            j += block_dim() as usize;
        }
        let m = block_max(m);
        if thread_idx() == 0 {
            T::stg(k.output().add(row as usize), m);
        }
    }
    cpu(k) {
        for (o, r) in k.output_slice().iter_mut().zip(x.chunks_exact(cols as usize)) {
            *o = r.iter().fold(T::NEG_INFINITY, |m, &v| m.max(v));
        }
    }
}

kernel! {
    /// Typed inputs and two outputs: for each row r of x (rows × cols,
    /// row-major) whose mask byte is not 0, y[r] = scale · Σ_j x[r, j] ·
    /// w[j] + shift, and hits counts those rows; other rows keep y[r] = 0.
    masked_dot, T: Float in [f32, f64],
    (x: v(T, rows * cols), w: v(f64, cols), mask: v(u8, rows), scale: s(T), shift: s(s32), rows: d, cols: d)
        -> (y: o(T, rows), hits: s(u32)),
    blocks = rows, threads = 256, block_rule = warps, shared = BLOCK_SHARED_BYTES,
    gpu(k, row) {
        let (r, c) = (row as usize, cols as usize);
        // One row per block: the whole block takes the same branch.
        if u8::load_nc(mask.add(r)) != 0 {
            let xr = x.add(r * c);
            let mut s = T::ZERO;
            let mut j = thread_idx() as usize;
            while j < c {
                s += T::ldg_nc(xr.add(j)) * T::from_f64(f64::load_nc(w.add(j)));
                j += block_dim() as usize;
            }
            let s = block_sum(s);
            if thread_idx() == 0 {
                T::stg(y.add(r), scale * s + T::from_f64(shift as f64));
                atomic::add(hits, 1u32);
            }
        }
    }
    cpu(k) {
        let c = cols as usize;
        for r in 0..rows as usize {
            if mask[r] != 0 {
                let s = erlcuda_kernel::sum(c, |j| x[r * c + j] * T::from_f64(w[j]));
                y[r] = scale * s + T::from_f64(shift as f64);
                hits[0] += 1;
            }
        }
    }
}

kernel! {
    /// An io argument and no output, over integers and floats:
    /// acc[i] += a · x[i].
    scale_add, T: Numeric in [s32, u32, f64],
    (acc: io(T, n), x: v(T, n), a: s(T)) -> (),
    blocks = elements(n), threads = 256, block_rule = any, shared = 0,
    gpu(k, block) {
        let (t, bd, n) = (thread_idx() as u64, block_dim() as u64, k.len(0));
        let base = block * bd * ELEMS_PER_THREAD;
        for i in 0..ELEMS_PER_THREAD {
            let e = base + t + bd * i;
            if e < n {
                let p = acc.add(e as usize);
                T::store(p, T::load(p) + a * T::load_nc(x.add(e as usize)));
            }
        }
    }
    cpu(k) {
        for (o, &v) in acc.iter_mut().zip(x) {
            *o += a * v;
        }
    }
}

kernel! {
    /// No T: the histogram of a byte vector and the sum of its bytes.
    byte_hist, [],
    (x: v(u8, n)) -> (counts: o(u32, 256), total: s(s64)),
    blocks = elements(n), threads = 256, block_rule = any, shared = 0,
    gpu(k, block) {
        let (t, bd, n) = (thread_idx() as u64, block_dim() as u64, k.len(0));
        let base = block * bd * ELEMS_PER_THREAD;
        let mut sum = 0i64;
        for i in 0..ELEMS_PER_THREAD {
            let e = base + t + bd * i;
            if e < n {
                let b = u8::load_nc(x.add(e as usize));
                atomic::add(counts.add(b as usize), 1u32);
                sum += b as i64;
            }
        }
        if sum != 0 {
            atomic::add(total, sum);
        }
    }
    cpu(k) {
        for &b in x {
            counts[b as usize] += 1;
            total[0] += b as i64;
        }
    }
}
