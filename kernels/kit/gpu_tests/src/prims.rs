//! The kit's device primitives exercised one at a time: the bodies of the
//! GPU tests' raw entries (`lib.rs` makes each an `extern "ptx-kernel"`
//! entry for run.py). Plain Rust on both targets, so the kit's host tests
//! (`tests/gpu_prims.rs`) run the same bodies through the emulator on the
//! CPU, one virtual block after another, against models of run.py's checks.
//!
//! Conventions: `n` elements; thread `i = global_x()`; outputs written by
//! every thread that has an element.

use erlcuda_kernel::atomic::{self, AtomicAdd, AtomicBits, AtomicMinMax};
use erlcuda_kernel::device::{block_dim, block_idx, global_x, global_y, sync_threads, thread_idx};
use erlcuda_kernel::launch::{RowParts, Tiles};
use erlcuda_kernel::reduce::{ArgMax, ArgMin, Max, Min, Op, Sum};
use erlcuda_kernel::warp::{self, Lanes};
use erlcuda_kernel::{block, shared_array, Element, Float, Int, Numeric, MATH_ULPS};

// ---------------------------------------------------------------- atomics

/// Global integer atomics under contention: thread `i` works on slot `i %
/// slots` of each of five arrays in `acc` (`5 · slots`: add, min, max,
/// exch, a CAS-loop counter), recording the old values in `olds` (`5 · n`,
/// same order; the CAS column holds the counter value it replaced).
pub unsafe fn atomics_global<T: Int + AtomicAdd + AtomicMinMax + AtomicBits>(
    vals: *const T,
    n: u32,
    slots: u32,
    acc: *mut T,
    olds: *mut T,
) {
    let i = global_x();
    if i >= n {
        return;
    }
    let (v, s) = (T::load(vals.add(i as usize)), (i % slots) as usize);
    let (n, sl) = (n as usize, slots as usize);
    let col = |c: usize| olds.add(c * n + i as usize);
    T::store(col(0), atomic::add(acc.add(s), v));
    T::store(col(1), atomic::min(acc.add(sl + s), v));
    T::store(col(2), atomic::max(acc.add(2 * sl + s), v));
    T::store(col(3), atomic::exch(acc.add(3 * sl + s), v));
    let c = acc.add(4 * sl + s);
    let mut cur = T::load(c);
    loop {
        let old = atomic::cas(c, cur, cur.wrapping_add(T::ONE));
        if old == cur {
            break;
        }
        cur = old;
    }
    T::store(col(4), cur);
}

/// The same five operations on a block's shared slots (`atom.shared`):
/// `init` (`5 · slots`) seeds them, each block ends by copying its slots
/// to `acc[block · 5 · slots ..]`. `slots ≤ 64`.
pub unsafe fn atomics_shared<T: Int + AtomicAdd + AtomicMinMax + AtomicBits>(
    vals: *const T,
    n: u32,
    slots: u32,
    init: *const T,
    acc: *mut T,
    olds: *mut T,
) {
    let sh = shared_array!(slots: [T; 5 * 64], room = u64);
    let (t, i) = (thread_idx(), global_x());
    let cells = 5 * slots;
    let mut k = t;
    while k < cells {
        sh.set(k as usize, T::load(init.add(k as usize)));
        k += block_dim();
    }
    sync_threads();
    if i < n {
        let (v, s) = (T::load(vals.add(i as usize)), (i % slots) as usize);
        let (n, sl) = (n as usize, slots as usize);
        let col = |c: usize| olds.add(c * n + i as usize);
        T::store(col(0), atomic::add_shared(sh.addr(s), v));
        T::store(col(1), atomic::min_shared(sh.addr(sl + s), v));
        T::store(col(2), atomic::max_shared(sh.addr(2 * sl + s), v));
        T::store(col(3), atomic::exch_shared(sh.addr(3 * sl + s), v));
        let c = sh.addr(4 * sl + s);
        let mut cur = T::load_shared(c);
        loop {
            let old = atomic::cas_shared(c, cur, cur.wrapping_add(T::ONE));
            if old == cur {
                break;
            }
            cur = old;
        }
        T::store(col(4), cur);
    }
    sync_threads();
    let mut k = t;
    while k < cells {
        T::store(acc.add((block_idx() * cells + k) as usize), sh.get(k as usize));
        k += block_dim();
    }
}


/// Float atomics: `add` returning the old value (`olds[i]`), `exch`
/// (`olds[n + i]`), and a CAS loop computing the maximum (slots `acc[0..slots]`
/// add, `[slots..2 slots]` exch, `[2 slots..3 slots]` max); the shared form
/// adds into one shared cell per slot and copies it to `acc[3 slots + ...]`
/// per block, old values in `olds[2n + i]`.
pub unsafe fn float_atomics<T: Float + AtomicAdd + AtomicBits>(vals: *const T, n: u32, slots: u32, acc: *mut T, olds: *mut T) {
    let sh = shared_array!(fslots: [T; 64], room = f64);
    let (t, i) = (thread_idx(), global_x());
    if t < slots {
        sh.set(t as usize, T::ZERO);
    }
    sync_threads();
    if i < n {
        let (v, s, sl, nn) = (T::load(vals.add(i as usize)), (i % slots) as usize, slots as usize, n as usize);
        T::store(olds.add(i as usize), atomic::add(acc.add(s), v));
        T::store(olds.add(nn + i as usize), atomic::exch(acc.add(sl + s), v));
        let m = acc.add(2 * sl + s);
        let mut cur = T::load(m);
        while v > cur {
            let old = atomic::cas(m, cur, v);
            if old.to_bits64() == cur.to_bits64() {
                break;
            }
            cur = old;
        }
        T::store(olds.add(2 * nn + i as usize), atomic::add_shared(sh.addr(s), v));
    }
    sync_threads();
    if t < slots {
        T::store(acc.add((3 * slots + block_idx() * slots + t) as usize), sh.get(t as usize));
    }
}



// ------------------------------------------------------------------ warps

/// Per warp `w` (launches of whole warps): `out[3w..3w+3]` = ballot, all,
/// any of `preds[i] != 0`.
pub unsafe fn vote(preds: *const u32, out: *mut u32) {
    let i = global_x();
    let p = u32::load(preds.add(i as usize)) != 0;
    let (b, a, y) = (warp::ballot(p), warp::all(p), warp::any(p));
    if i & 31 == 0 {
        let o = out.add(3 * (i / 32) as usize);
        u32::store(o, b);
        u32::store(o.add(1), a as u32);
        u32::store(o.add(2), y as u32);
    }
}

/// Shuffles of element type T: `out[k·n + i]` for k = idx (lane `(7·lane
/// + 3) % 32`), up, down, xor (each by `arg`).
pub unsafe fn shuffles<T: Element + Lanes>(x: *const T, n: u32, arg: u32, out: *mut T) {
    let i = global_x();
    let v = T::load(x.add(i as usize));
    let l = i & 31;
    let r = [warp::shfl_idx(v, (7 * l + 3) % 32), warp::shfl_up(v, arg), warp::shfl_down(v, arg), warp::shfl_xor(v, arg)];
    if i < n {
        for (k, r) in r.into_iter().enumerate() {
            T::store(out.add(k * n as usize + i as usize), r);
        }
    }
}


/// A pair through the warp: ArgMax's item, (f32 value, u32 index) — lane
/// `i` gets the pair of lane `i ^ arg`.
pub unsafe fn shuffles_pair(x: *const f32, arg: u32, out_v: *mut f32, out_i: *mut u32) {
    let i = global_x();
    let (v, j) = warp::shfl_xor((f32::load(x.add(i as usize)), i), arg);
    f32::store(out_v.add(i as usize), v);
    u32::store(out_i.add(i as usize), j);
}

// ------------------------------------------------------------ block level

/// Last non-zero: a user's operator that is not commutative.
#[inline(always)]
fn last_nonzero<T: Numeric>() -> Op<T, fn(T, T) -> T> {
    Op::new(T::ZERO, |a, b| if b != T::ZERO { b } else { a })
}

/// Block reductions and scans of `x` (one element per thread, each block
/// its own group), every operator:
/// * `red[8·b ..]`: Sum, Max, Min, custom, ArgMax value, ArgMin value
///   (as T), and in `red_idx[2·b ..]` ArgMax and ArgMin's indices (within
///   the block);
/// * `scan[k·n + i]`, k: Sum inclusive, Sum exclusive, Max inclusive, Max
///   exclusive, Min inclusive, custom inclusive, custom exclusive, ArgMax
///   inclusive value; `scan_idx[i]` that scan's index.
pub unsafe fn block_ops<T: Numeric + Lanes>(x: *const T, n: u32, red: *mut T, red_idx: *mut u32, scan: *mut T, scan_idx: *mut u32) {
    let (t, b, i) = (thread_idx(), block_idx(), global_x());
    let v = if i < n { T::load(x.add(i as usize)) } else { T::ZERO };
    let sum = block::reduce(Sum::<T>::new(), v);
    let max = block::reduce(Max::<T>::new(), v);
    let min = block::reduce(Min::<T>::new(), v);
    let cus = block::reduce(last_nonzero(), v);
    let amax = block::reduce(ArgMax::<T>::new(), (v, t));
    let amin = block::reduce(ArgMin::<T>::new(), (v, t));
    let s: [T; 7] = [
        block::inclusive_scan(Sum::<T>::new(), v),
        block::exclusive_scan(Sum::<T>::new(), v),
        block::inclusive_scan(Max::<T>::new(), v),
        block::exclusive_scan(Max::<T>::new(), v),
        block::inclusive_scan(Min::<T>::new(), v),
        block::inclusive_scan(last_nonzero(), v),
        block::exclusive_scan(last_nonzero(), v),
    ];
    let am = block::inclusive_scan(ArgMax::<T>::new(), (v, t));
    if t == 0 {
        let r = red.add(8 * b as usize);
        for (k, x) in [sum, max, min, cus, amax.0, amin.0].into_iter().enumerate() {
            T::store(r.add(k), x);
        }
        u32::store(red_idx.add(2 * b as usize), amax.1);
        u32::store(red_idx.add(2 * b as usize + 1), amin.1);
    }
    if i < n {
        for (k, x) in s.into_iter().enumerate() {
            T::store(scan.add(k * n as usize + i as usize), x);
        }
        T::store(scan.add(7 * n as usize + i as usize), am.0);
        u32::store(scan_idx.add(i as usize), am.1);
    }
}


/// Warp-level reduce and scans on their own: `out[3·n ..]` = Sum reduce,
/// Sum inclusive, Max exclusive, per lane.
pub unsafe fn warp_ops_i32(x: *const i32, n: u32, out: *mut i32) {
    let i = global_x();
    let v = i32::load(x.add(i as usize));
    let r = [warp::reduce(Sum::<i32>::new(), v), warp::inclusive_scan(Sum::<i32>::new(), v), warp::exclusive_scan(Max::<i32>::new(), v)];
    for (k, r) in r.into_iter().enumerate() {
        i32::store(out.add(k * n as usize + i as usize), r);
    }
}

// ---------------------------------------------------------- shared arrays

/// Static shared arrays of three types in one kernel (1024 threads): each
/// block reverses its 1024 f32 through one array, its f64 through a second
/// (generic, sized by its room) and its u8 through a third.
pub unsafe fn shared_reverse(x32: *const f32, x64: *const f64, x8: *const u8, o32: *mut f32, o64: *mut f64, o8: *mut u8) {
    let a = shared_array!(rev32: [f32; 1024]);
    let t = thread_idx() as usize;
    let i = global_x() as usize;
    let base = i - t;
    a.set(t, f32::load(x32.add(i)));
    reverse_generic(x64.add(base), o64.add(base));
    let c = shared_array!(rev8: [u8; 1024]);
    c.set(t, u8::load(x8.add(i)));
    sync_threads();
    f32::store(o32.add(i), a.get(1023 - t));
    u8::store(o8.add(i), c.get(1023 - t));
}

#[inline(always)]
unsafe fn reverse_generic<T: Element>(x: *const T, o: *mut T) {
    let b = shared_array!(rev_t: [T; 1024], room = f64);
    let t = thread_idx() as usize;
    b.set(t, T::load(x.add(t)));
    sync_threads();
    // Through the generic pointer too.
    T::store(o.add(t), *b.as_ptr().add(1023 - t));
}

/// A barrier after a branch on the thread: threads below n store their
/// element in shared memory, the rest do not, then every thread ranks its
/// element among the n (`out[t]` = how many are smaller, or smaller and
/// earlier). The barrier must stay one instruction that every thread of a
/// warp reaches together: build.sh checks that the PTX has one `bar.sync`
/// here (an asm barrier was copied into both arms of such a branch, and a
/// warp split by n hung: `topk_rows`'s short rows on an H100).
pub unsafe fn barrier_after_branch(x: *const f32, n: u32, out: *mut u32) {
    let s = shared_array!(ranked: [f32; 1024]);
    let t = thread_idx();
    let mine = t < n;
    let v = if mine { f32::load(x.add(t as usize)) } else { 0.0 };
    if mine {
        s.set(t as usize, v);
    }
    sync_threads();
    if mine {
        let mut rank = 0u32;
        let mut j = 0u32;
        while j < n {
            let w = s.get(j as usize);
            rank += (w < v || (w == v && j < t)) as u32;
            j += 1;
        }
        u32::store(out.add(t as usize), rank);
    }
}

// ----------------------------------------------------------- dimensions

/// A 2-D launch: `out[y·w + x] = (x, y)` packed as `y << 16 | x` for every
/// (x, y) inside `w × h`.
pub unsafe fn grid_2d(out: *mut u32, w: u32, h: u32) {
    let (x, y) = (global_x(), global_y());
    if x < w && y < h {
        u32::store(out.add((y * w + x) as usize), y << 16 | x);
    }
}

/// One block per tile (grid-stride): every element of tile `b` gets `b`.
pub unsafe fn tiles(out: *mut u32, rows: u32, cols: u32, tile_rows: u32, tile_cols: u32) {
    let tl = Tiles::new(rows as u64, cols as u64, tile_rows as u64, tile_cols as u64);
    let mut b = block_idx() as u64;
    while b < tl.count() {
        let ((r0, r1), (c0, c1)) = tl.bounds(b);
        let w = c1 - c0;
        let mut k = thread_idx() as u64;
        while k < (r1 - r0) * w {
            let (r, c) = (r0 + k / w, c0 + k % w);
            u32::store(out.add((r * cols as u64 + c) as usize), b as u32);
            k += block_dim() as u64;
        }
        b += erlcuda_kernel::device::grid_dim() as u64;
    }
}

/// Blocks per row: each row of `cols` in parts of `per_block`; block `b`
/// writes `row << 16 | part` into its span.
pub unsafe fn row_parts(out: *mut u32, rows: u32, cols: u32, per_block: u32) {
    let rp = RowParts::new(cols as u64, per_block as u64);
    let b = block_idx() as u64;
    if b >= rp.blocks(rows as u64) {
        return;
    }
    let (row, part) = rp.of(b);
    let (lo, hi) = rp.span(part);
    for c in erlcuda_kernel::launch::strided(lo, hi, thread_idx() as u64, block_dim() as u64) {
        u32::store(out.add((row * cols as u64 + c) as usize), (row << 16 | part) as u32);
    }
}

// ------------------------------------------------------------------- math

/// `out[i] = f(x[i], y[i])` for the function `MATH_ULPS[id]`.
pub unsafe fn math<T: Float>(id: u32, x: *const T, y: *const T, out: *mut T, n: u32) {
    let i = global_x();
    if i >= n {
        return;
    }
    let (a, b) = (T::load(x.add(i as usize)), T::load(y.add(i as usize)));
    T::store(out.add(i as usize), apply(id as usize, a, b));
}

/// `const NAME: usize` = the function's row in `MATH_ULPS`, one per
/// function, and the dispatch over them; a build fails when a row has no
/// function here.
macro_rules! dispatch {
    (unary: $($u:ident),*; binary: $($b:ident),*) => {
        #[allow(non_upper_case_globals)]
        mod ids { $( pub const $u: usize = super::row(stringify!($u)); )* $( pub const $b: usize = super::row(stringify!($b)); )* }
        const _: () = assert!([$(stringify!($u)),*].len() + [$(stringify!($b)),*].len() == MATH_ULPS.len());
        #[inline(always)]
        pub fn apply<T: Float>(id: usize, x: T, y: T) -> T {
            $( if id == ids::$u { return x.$u(); } )*
            $( if id == ids::$b { return x.$b(y); } )*
            T::NAN
        }
    };
}

const fn row(name: &str) -> usize {
    let mut i = 0;
    while i < MATH_ULPS.len() {
        let (a, b) = (MATH_ULPS[i].0.as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut k = 0;
            while k < a.len() && a[k] == b[k] {
                k += 1;
            }
            if k == a.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("a function missing from MATH_ULPS")
}

dispatch!(
    unary: recip, exp, exp2, exp10, expm1, log, log1p, log2, log10, cbrt, sin, cos, tan, asin, acos, atan, sinh, cosh, tanh,
        asinh, acosh, atanh, erf, erfc, lgamma, tgamma, floor, ceil, round, trunc;
    binary: pow, hypot, atan2, fmod
);
