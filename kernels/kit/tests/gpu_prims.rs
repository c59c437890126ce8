//! The bodies of the kit's GPU tests' raw entries (`gpu_tests/src/prims.rs`,
//! which run.py launches on a GPU) on the CPU: every block of a launch run
//! by the emulator (32-lane warps, barriers, poisoned shared memory), one
//! after another, and the outputs checked against models of run.py's
//! checks. Random inputs, the seed printed (`KIT_SEED=N` repeats a run).
//!
//! The emulator runs a block's threads in order between waits and the
//! blocks one after another, so atomics land in thread order: the atomics'
//! models are that sequential order, final values and every old value
//! (run.py accepts any order's).

use erlcuda_kernel::emu::{run_block, Dims};
use erlcuda_kernel::MATH_ULPS;

#[path = "../gpu_tests/src/prims.rs"]
mod prims;

mod common;
use common::{seeded, Rng};

/// Every block of a `grid` launch of `block` threads, in order; a fault
/// fails the test.
fn launch(grid: (u32, u32), block: (u32, u32), body: &dyn Fn()) {
    let d = Dims { block, grid, shared_bytes: 0 };
    for y in 0..grid.1 {
        for x in 0..grid.0 {
            unsafe { run_block(d, (x, y), body) }.unwrap_or_else(|f| panic!("block ({x}, {y}) faulted: {f:?}"));
        }
    }
}

fn below(r: &mut Rng, n: u64) -> u64 {
    r.next() % n
}

/// The element types' draws, limits and arithmetic as run.py's models use
/// them (integers wrap, as NumPy's do).
trait Val: Copy + PartialEq + PartialOrd + std::fmt::Debug + Default {
    const FLOAT: bool;
    const EPS: f64;
    fn draw(r: &mut Rng) -> Self;
    /// A few distinct values (ties everywhere) and zeros.
    fn small(r: &mut Rng) -> Self;
    fn lowest() -> Self;
    fn highest() -> Self;
    fn wadd(self, o: Self) -> Self;
    fn f(self) -> f64;
    fn bits(self) -> u64;
    fn is_nan(self) -> bool {
        self != self
    }
}

macro_rules! int_val {
    ($($t:ty),*) => { $(
        impl Val for $t {
            const FLOAT: bool = false;
            const EPS: f64 = 0.0;
            fn draw(r: &mut Rng) -> Self {
                match below(r, 64) {
                    0 => <$t>::MAX,
                    1 => <$t>::MIN,
                    _ => r.next() as $t,
                }
            }
            #[allow(unused_comparisons)]
            fn small(r: &mut Rng) -> Self {
                if <$t>::MIN == 0 { below(r, 5) as $t } else { (below(r, 9) as i64 - 4) as $t }
            }
            fn lowest() -> Self {
                <$t>::MIN
            }
            fn highest() -> Self {
                <$t>::MAX
            }
            fn wadd(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn f(self) -> f64 {
                self as f64
            }
            fn bits(self) -> u64 {
                self as u64
            }
        }
    )* };
}
int_val!(u8, i32, u32, i64, u64);

macro_rules! float_val {
    ($($t:ident),*) => { $(
        impl Val for $t {
            const FLOAT: bool = true;
            const EPS: f64 = $t::EPSILON as f64;
            fn draw(r: &mut Rng) -> Self {
                r.uniform(-3.0, 3.0) as $t
            }
            fn small(r: &mut Rng) -> Self {
                let v = below(r, 9) as $t - 4.0;
                match below(r, 40) {
                    0..=1 => $t::NAN,
                    2 => $t::INFINITY,
                    3 => $t::NEG_INFINITY,
                    4..=15 => v + r.uniform(-1.0, 1.0) as $t,
                    _ => v,
                }
            }
            fn lowest() -> Self {
                $t::NEG_INFINITY
            }
            fn highest() -> Self {
                $t::INFINITY
            }
            fn wadd(self, o: Self) -> Self {
                self + o
            }
            fn f(self) -> f64 {
                self as f64
            }
            fn bits(self) -> u64 {
                self.to_bits() as u64
            }
        }
    )* };
}
float_val!(f32, f64);

fn same_bits<T: Val>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.bits() == y.bits())
}

// ---------------------------------------------------------------- atomics

macro_rules! int_atomics {
    ($r:expr, $($t:ty),*) => { $( {
        let r: &mut Rng = $r;
        let (n, block) = (4096usize, 256u32);
        let slots = 1 + below(r, 64) as usize;
        let vals: Vec<$t> = (0..n).map(|_| <$t>::draw(r)).collect();
        let mut init: Vec<$t> = (0..slots).map(|_| <$t>::draw(r)).collect();
        init.extend(std::iter::repeat(<$t>::MAX).take(slots));
        init.extend(std::iter::repeat(<$t>::MIN).take(slots));
        init.extend((0..2 * slots).map(|_| <$t>::draw(r)));
        // One group's five operations on its slots `m`, thread i's old
        // values into `olds`.
        let step = |m: &mut [$t], olds: &mut [$t], i: usize| {
            let (s, v) = (i % slots, vals[i]);
            olds[i] = m[s];
            m[s] = m[s].wrapping_add(v);
            olds[n + i] = m[slots + s];
            m[slots + s] = m[slots + s].min(v);
            olds[2 * n + i] = m[2 * slots + s];
            m[2 * slots + s] = m[2 * slots + s].max(v);
            olds[3 * n + i] = m[3 * slots + s];
            m[3 * slots + s] = v;
            olds[4 * n + i] = m[4 * slots + s];
            m[4 * slots + s] = m[4 * slots + s].wrapping_add(1);
        };
        let grid = n as u32 / block;
        // Global: one group, the whole launch.
        let (mut acc, mut olds) = (init.clone(), vec![0 as $t; 5 * n]);
        let (a, o, x) = (acc.as_mut_ptr(), olds.as_mut_ptr(), vals.as_ptr());
        launch((grid, 1), (block, 1), &|| unsafe { prims::atomics_global(x, n as u32, slots as u32, a, o) });
        let (mut m, mut mo) = (init.clone(), vec![0 as $t; 5 * n]);
        (0..n).for_each(|i| step(&mut m, &mut mo, i));
        assert_eq!((&acc, &olds), (&m, &mo), "atomics_global {} ({slots} slots)", stringify!($t));
        // Shared: a group per block, seeded from init, copied out per block.
        let (mut acc, mut olds) = (vec![0 as $t; grid as usize * 5 * slots], vec![0 as $t; 5 * n]);
        let (a, o, ini) = (acc.as_mut_ptr(), olds.as_mut_ptr(), init.as_ptr());
        launch((grid, 1), (block, 1), &|| unsafe { prims::atomics_shared(x, n as u32, slots as u32, ini, a, o) });
        let mut want = Vec::new();
        let mut mo = vec![0 as $t; 5 * n];
        for b in 0..grid as usize {
            let mut m = init.clone();
            (b * block as usize..(b + 1) * block as usize).for_each(|i| step(&mut m, &mut mo, i));
            want.extend(m);
        }
        assert_eq!((&acc, &olds), (&want, &mo), "atomics_shared {} ({slots} slots)", stringify!($t));
    } )* };
}

#[test]
fn integer_atomics_global_and_shared() {
    let mut r = seeded("gpu_prims");
    int_atomics!(&mut r, u32, i32, u64, i64);
}

macro_rules! float_atomics {
    ($r:expr, $($t:ident),*) => { $( {
        let r: &mut Rng = $r;
        let (n, block) = (4096usize, 256u32);
        let grid = n / block as usize;
        let slots = 1 + below(r, 64) as usize;
        let vals: Vec<$t> = (0..n).map(|_| r.uniform(0.5, 2.0) as $t).collect();
        let (mut acc, mut olds) = (vec![0.0 as $t; (3 + grid) * slots], vec![0.0 as $t; 3 * n]);
        let (a, o, x) = (acc.as_mut_ptr(), olds.as_mut_ptr(), vals.as_ptr());
        launch((grid as u32, 1), (block, 1), &|| unsafe { prims::float_atomics(x, n as u32, slots as u32, a, o) });
        let (mut m, mut mo) = (vec![0.0 as $t; (3 + grid) * slots], vec![0.0 as $t; 3 * n]);
        for b in 0..grid {
            let mut sh = vec![0.0 as $t; slots];
            for i in b * block as usize..(b + 1) * block as usize {
                let (s, v) = (i % slots, vals[i]);
                mo[i] = m[s];
                m[s] += v;
                mo[n + i] = m[slots + s];
                m[slots + s] = v;
                if v > m[2 * slots + s] {
                    m[2 * slots + s] = v;
                }
                mo[2 * n + i] = sh[s];
                sh[s] += v;
            }
            m[(3 + b) * slots..(4 + b) * slots].copy_from_slice(&sh);
        }
        assert!(same_bits(&acc, &m) && same_bits(&olds, &mo), "float_atomics {} ({slots} slots)", stringify!($t));
    } )* };
}

#[test]
fn float_atomics_global_and_shared() {
    let mut r = seeded("gpu_prims");
    float_atomics!(&mut r, f32, f64);
}

// ------------------------------------------------------------------ warps

#[test]
fn votes_of_every_pattern() {
    let mut r = seeded("gpu_prims");
    let warps = 64;
    let mut pats: Vec<[bool; 32]> = vec![[true; 32], [false; 32]];
    let one = below(&mut r, 32) as usize;
    pats.push(std::array::from_fn(|l| l == one));
    pats.push(std::array::from_fn(|l| l % 2 == 1));
    pats.push(std::array::from_fn(|l| l != 0));
    while pats.len() < warps {
        pats.push(std::array::from_fn(|_| r.next() & 1 == 1));
    }
    let preds: Vec<u32> = pats.iter().flatten().map(|&p| if p { 1 + below(&mut r, 1 << 31) as u32 } else { 0 }).collect();
    let mut out = vec![0u32; 3 * warps];
    let (p, o) = (preds.as_ptr(), out.as_mut_ptr());
    launch((warps as u32, 1), (32, 1), &|| unsafe { prims::vote(p, o) });
    let want: Vec<u32> = pats
        .iter()
        .flat_map(|w| {
            let ballot = w.iter().enumerate().fold(0u32, |b, (l, &p)| b | (p as u32) << l);
            [ballot, w.iter().all(|&p| p) as u32, w.iter().any(|&p| p) as u32]
        })
        .collect();
    assert_eq!(out, want);
}

macro_rules! shuffles {
    ($r:expr, $($t:ident),*) => { $( {
        let r: &mut Rng = $r;
        let n = 4096usize;
        let x: Vec<$t> = (0..n).map(|_| <$t>::draw(r)).collect();
        let arg = 1 + below(r, 31) as usize;
        let mut out = vec![<$t>::default(); 4 * n];
        let (xp, o) = (x.as_ptr(), out.as_mut_ptr());
        launch((n as u32 / 128, 1), (128, 1), &|| unsafe { prims::shuffles(xp, n as u32, arg as u32, o) });
        let mut want = Vec::with_capacity(4 * n);
        for k in 0..4 {
            want.extend((0..n).map(|i| {
                let (l, base) = (i % 32, i - i % 32);
                x[match k {
                    0 => base + (7 * l + 3) % 32,
                    1 => if l >= arg { i - arg } else { i },
                    2 => if l + arg < 32 { i + arg } else { i },
                    _ => base + (l ^ arg),
                }]
            }));
        }
        assert!(same_bits(&out, &want), "shuffles {} by {arg}", stringify!($t));
    } )* };
}

#[test]
fn shuffles_of_every_type_and_a_pair() {
    let mut r = seeded("gpu_prims");
    shuffles!(&mut r, u8, i32, u32, i64, u64, f32, f64);
    let n = 4096usize;
    let x: Vec<f32> = (0..n).map(|_| f32::draw(&mut r)).collect();
    let arg = 1 + below(&mut r, 31) as u32;
    let (mut ov, mut oi) = (vec![0f32; n], vec![0u32; n]);
    let (xp, v, i) = (x.as_ptr(), ov.as_mut_ptr(), oi.as_mut_ptr());
    launch((n as u32 / 256, 1), (256, 1), &|| unsafe { prims::shuffles_pair(xp, arg, v, i) });
    let src: Vec<u32> = (0..n as u32).map(|i| i - i % 32 + ((i % 32) ^ arg)).collect();
    assert_eq!(oi, src, "shuffles_pair's indices");
    assert!(same_bits(&ov, &src.iter().map(|&j| x[j as usize]).collect::<Vec<_>>()), "shuffles_pair's values");
}

#[test]
fn warp_reduce_and_scans() {
    let mut r = seeded("gpu_prims");
    let n = 2048usize;
    let x: Vec<i32> = (0..n).map(|_| below(&mut r, 2000) as i32 - 1000).collect();
    let mut out = vec![0i32; 3 * n];
    let (xp, o) = (x.as_ptr(), out.as_mut_ptr());
    launch((n as u32 / 64, 1), (64, 1), &|| unsafe { prims::warp_ops_i32(xp, n as u32, o) });
    let mut want = vec![0i32; 3 * n];
    for w in 0..n / 32 {
        let lanes = &x[32 * w..32 * (w + 1)];
        let (mut inc, mut max) = (0i32, i32::MIN);
        for (l, &v) in lanes.iter().enumerate() {
            inc += v;
            want[32 * w + l] = lanes.iter().sum();
            want[n + 32 * w + l] = inc;
            want[2 * n + 32 * w + l] = max;
            max = max.max(v);
        }
    }
    assert_eq!(out, want);
}

// ------------------------------------------------------------ block level

/// The value reductions and scans meet NaN as the GPU's `max`/`min` do (a
/// NaN loses to any number); `None` where nothing but NaN was met.
fn better<T: Val>(max: bool, cur: Option<T>, v: T) -> Option<T> {
    if v.is_nan() {
        return cur;
    }
    match cur {
        Some(c) if (max && !(v > c)) || (!max && !(v < c)) => Some(c),
        _ => Some(v),
    }
}

/// A float sum against its f64 reference: equal (infinities too), NaN
/// where NaN, or within run.py's bound for a tree of 11 levels.
fn close<T: Val>(got: T, want: f64, terms: f64) -> bool {
    if !T::FLOAT {
        return got.f() == want;
    }
    let g = got.f();
    if want.is_nan() || g.is_nan() {
        return want.is_nan() && g.is_nan();
    }
    g == want || (g - want).abs() <= terms * T::EPS * 11.0
}

fn block_ops<T: Val + erlcuda_kernel::Numeric + erlcuda_kernel::warp::Lanes>(r: &mut Rng, name: &str) {
    for block in [1024usize, 96, 32] {
        let grid = 3usize;
        let n = grid * block;
        let mut x: Vec<T> = (0..n).map(|_| T::small(r)).collect();
        if T::FLOAT {
            // An all-NaN block.
            let nan = T::small(r);
            let nan = if nan.is_nan() { nan } else { (0..).map(|_| T::small(r)).find(|v| v.is_nan()).unwrap() };
            x[block..2 * block].iter_mut().for_each(|v| *v = nan);
        }
        let (mut red, mut red_idx) = (vec![T::default(); 8 * grid], vec![0u32; 2 * grid]);
        let (mut scan, mut scan_idx) = (vec![T::default(); 8 * n], vec![0u32; n]);
        let (xp, rp, rip, sp, sip) = (x.as_ptr(), red.as_mut_ptr(), red_idx.as_mut_ptr(), scan.as_mut_ptr(), scan_idx.as_mut_ptr());
        launch((grid as u32, 1), (block as u32, 1), &|| unsafe { prims::block_ops(xp, n as u32, rp, rip, sp, sip) });
        let wrap = |v: T| if T::FLOAT { v.f() } else { v.f() };
        for b in 0..grid {
            let v = &x[b * block..(b + 1) * block];
            let at = format!("{name} block {b} of {block}");
            // Reductions: sum, max, min, last non-zero, argmax, argmin.
            let terms: f64 = v.iter().map(|x| x.f().abs()).filter(|a| !a.is_nan()).sum();
            let sum = if T::FLOAT { v.iter().map(|x| x.f()).sum::<f64>() } else { wrap(v.iter().fold(T::default(), |a, &x| a.wadd(x))) };
            assert!(close(red[8 * b], sum, terms), "{at}: sum {:?} against {sum}", red[8 * b]);
            let mx = v.iter().fold(None, |c, &x| better(true, c, x)).unwrap_or(T::lowest());
            let mn = v.iter().fold(None, |c, &x| better(false, c, x)).unwrap_or(T::highest());
            assert_eq!((red[8 * b + 1].bits(), red[8 * b + 2].bits()), (mx.bits(), mn.bits()), "{at}: max, min");
            let last = v.iter().fold(T::default(), |c, &x| if x != T::default() { x } else { c });
            assert_eq!(red[8 * b + 3].bits(), last.bits(), "{at}: last non-zero");
            for (k, max) in [(0usize, true), (1, false)] {
                let best = if max { mx } else { mn };
                let want = match v.iter().position(|&x| !x.is_nan() && x == best) {
                    Some(j) if !(T::FLOAT && v.iter().all(|x| x.is_nan())) => (best.bits(), j as u32),
                    _ => ((if max { T::lowest() } else { T::highest() }).bits(), u32::MAX),
                };
                assert_eq!((red[8 * b + 4 + k].bits(), red_idx[2 * b + k]), want, "{at}: arg{}", if max { "max" } else { "min" });
            }
            // Scans, element by element.
            let (mut inc_f, mut inc_t, mut t_abs) = (0f64, T::default(), 0f64);
            let (mut amax, mut amin, mut ln) = (None, None, T::default());
            let mut arg: (Option<T>, u32) = (None, u32::MAX);
            for (t, &xv) in v.iter().enumerate() {
                let i = b * block + t;
                let (exc_f, exc_t, exc_abs) = (inc_f, inc_t, t_abs);
                inc_f += xv.f();
                inc_t = inc_t.wadd(xv);
                if !xv.f().is_nan() {
                    t_abs += xv.f().abs();
                }
                let (inc_w, exc_w) = if T::FLOAT { (inc_f, exc_f) } else { (wrap(inc_t), wrap(exc_t)) };
                assert!(close(scan[i], inc_w, t_abs) && close(scan[n + i], exc_w, exc_abs), "{at}: sum scans at {t}");
                let exc_max = amax.unwrap_or(T::lowest());
                amax = better(true, amax, xv);
                amin = better(false, amin, xv);
                assert_eq!(
                    (scan[2 * n + i].bits(), scan[3 * n + i].bits(), scan[4 * n + i].bits()),
                    (amax.unwrap_or(T::lowest()).bits(), exc_max.bits(), amin.unwrap_or(T::highest()).bits()),
                    "{at}: max and min scans at {t}"
                );
                let exc_ln = ln;
                if xv != T::default() {
                    ln = xv;
                }
                assert_eq!((scan[5 * n + i].bits(), scan[6 * n + i].bits()), (ln.bits(), exc_ln.bits()), "{at}: custom scans at {t}");
                if !xv.is_nan() && arg.0.map_or(true, |c| xv > c) {
                    arg = (Some(xv), t as u32);
                }
                assert_eq!(
                    (scan[7 * n + i].bits(), scan_idx[i]),
                    (arg.0.unwrap_or(T::lowest()).bits(), arg.1),
                    "{at}: argmax scan at {t}"
                );
            }
        }
    }
}

#[test]
fn block_reductions_and_scans_of_every_operator() {
    let mut r = seeded("gpu_prims");
    block_ops::<u8>(&mut r, "u8");
    block_ops::<i32>(&mut r, "i32");
    block_ops::<u32>(&mut r, "u32");
    block_ops::<i64>(&mut r, "i64");
    block_ops::<f32>(&mut r, "f32");
    block_ops::<f64>(&mut r, "f64");
}

// ---------------------------------------------------------- shared arrays

#[test]
fn static_shared_arrays_reverse_each_block() {
    let mut r = seeded("gpu_prims");
    let (grid, n) = (4usize, 4 * 1024);
    let x32: Vec<f32> = (0..n).map(|_| f32::draw(&mut r)).collect();
    let x64: Vec<f64> = (0..n).map(|_| f64::draw(&mut r)).collect();
    let x8: Vec<u8> = (0..n).map(|_| r.next() as u8).collect();
    let (mut o32, mut o64, mut o8) = (vec![0f32; n], vec![0f64; n], vec![0u8; n]);
    let p = (x32.as_ptr(), x64.as_ptr(), x8.as_ptr(), o32.as_mut_ptr(), o64.as_mut_ptr(), o8.as_mut_ptr());
    launch((grid as u32, 1), (1024, 1), &|| unsafe { prims::shared_reverse(p.0, p.1, p.2, p.3, p.4, p.5) });
    let rev = |i: usize| i - i % 1024 + 1023 - i % 1024;
    assert!(same_bits(&o32, &(0..n).map(|i| x32[rev(i)]).collect::<Vec<_>>()));
    assert!(same_bits(&o64, &(0..n).map(|i| x64[rev(i)]).collect::<Vec<_>>()));
    assert_eq!(o8, (0..n).map(|i| x8[rev(i)]).collect::<Vec<_>>());
}

#[test]
fn a_barrier_after_a_branch_on_the_thread() {
    let mut r = seeded("gpu_prims");
    let n = loop {
        let n = 1 + below(&mut r, 1023) as usize;
        if n % 32 != 0 {
            break n;
        }
    };
    let x: Vec<f32> = (0..n).map(|_| below(&mut r, 16) as f32 - 8.0).collect();
    let mut out = vec![u32::MAX; 1024];
    let (xp, o) = (x.as_ptr(), out.as_mut_ptr());
    launch((1, 1), (1024, 1), &|| unsafe { prims::barrier_after_branch(xp, n as u32, o) });
    let rank = |t: usize| (0..n).filter(|&j| x[j] < x[t] || (x[j] == x[t] && j < t)).count() as u32;
    assert_eq!(&out[..n], &(0..n).map(rank).collect::<Vec<_>>()[..], "{n} of 1024 threads store");
    assert!(out[n..].iter().all(|&v| v == u32::MAX));
}

// ----------------------------------------------------------- dimensions

#[test]
fn grids_in_two_dimensions_tiles_and_row_parts() {
    let mut r = seeded("gpu_prims");
    let (w, h) = (1 + below(&mut r, 299) as u32, 1 + below(&mut r, 299) as u32);
    let mut out = vec![u32::MAX; (w * h) as usize];
    let o = out.as_mut_ptr();
    launch((w.div_ceil(16), h.div_ceil(8)), (16, 8), &|| unsafe { prims::grid_2d(o, w, h) });
    assert_eq!(out, (0..h).flat_map(|y| (0..w).map(move |x| y << 16 | x)).collect::<Vec<_>>(), "grid_2d {w}x{h}");

    let (rows, cols) = (1 + below(&mut r, 199) as u32, 1 + below(&mut r, 199) as u32);
    let (tr, tc) = (1 + below(&mut r, 39) as u32, 1 + below(&mut r, 39) as u32);
    let mut out = vec![u32::MAX; (rows * cols) as usize];
    let o = out.as_mut_ptr();
    launch((7, 1), (128, 1), &|| unsafe { prims::tiles(o, rows, cols, tr, tc) });
    let across = cols.div_ceil(tc);
    let want: Vec<u32> = (0..rows).flat_map(|y| (0..cols).map(move |x| y / tr * across + x / tc)).collect();
    assert_eq!(out, want, "tiles {rows}x{cols} by {tr}x{tc}");

    let (rows, cols, per) = (1 + below(&mut r, 49) as u32, 1 + below(&mut r, 2999) as u32, 1 + below(&mut r, 999) as u32);
    let parts = cols.div_ceil(per).max(1);
    let mut out = vec![u32::MAX; (rows * cols) as usize];
    let o = out.as_mut_ptr();
    launch((rows * parts, 1), (256, 1), &|| unsafe { prims::row_parts(o, rows, cols, per) });
    let want: Vec<u32> = (0..rows).flat_map(|y| (0..cols).map(move |x| y << 16 | x / per)).collect();
    assert_eq!(out, want, "row_parts {rows} rows of {cols}, {per} a block");
}

// ------------------------------------------------------------------- math

#[test]
fn math_entries_give_the_functions_bits() {
    let mut r = seeded("gpu_prims");
    let n = 300usize;
    for id in 0..MATH_ULPS.len() as u32 {
        let x32: Vec<f32> = (0..n).map(|_| r.uniform(-4.0, 4.0) as f32).collect();
        let y32: Vec<f32> = (0..n).map(|_| r.uniform(-4.0, 4.0) as f32).collect();
        let mut o32 = vec![0f32; n];
        let p = (x32.as_ptr(), y32.as_ptr(), o32.as_mut_ptr());
        launch((2, 1), (256, 1), &|| unsafe { prims::math(id, p.0, p.1, p.2, n as u32) });
        let want: Vec<f32> = (0..n).map(|i| prims::apply(id as usize, x32[i], y32[i])).collect();
        assert!(same_bits(&o32, &want), "math_f32 {}", MATH_ULPS[id as usize].0);
        let x64: Vec<f64> = x32.iter().map(|&v| v as f64 * 1.5).collect();
        let mut o64 = vec![0f64; n];
        let p = (x64.as_ptr(), x64.as_ptr(), o64.as_mut_ptr());
        launch((2, 1), (256, 1), &|| unsafe { prims::math(id, p.0, p.1, p.2, n as u32) });
        let want: Vec<f64> = (0..n).map(|i| prims::apply(id as usize, x64[i], x64[i])).collect();
        assert!(same_bits(&o64, &want), "math_f64 {}", MATH_ULPS[id as usize].0);
    }
}
