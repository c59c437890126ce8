//! The host meaning of the kit's device primitives: atomics under
//! contention from several threads, the reduction operators (ties and NaN
//! for the arg-reductions, a non-commutative user operator), the warp and
//! block forms over slices, the element traits, and the launch helpers.

use erlcuda_kernel::launch::{strided, thread_2d, RowParts, Tiles};
use erlcuda_kernel::reduce::{exclusive_scan, fold, inclusive_scan, ArgMax, ArgMin, Max, Min, Op, ReduceOp, Sum};
use erlcuda_kernel::{atomic, block, warp, Element, Int, Numeric};
use std::thread;

const THREADS: usize = 8;
const PER_THREAD: usize = 20_000;

/// A raw pointer the threads share (the atomics take raw pointers, as on
/// the GPU).
#[derive(Clone, Copy)]
struct P<T>(*mut T);
unsafe impl<T> Send for P<T> {}
unsafe impl<T> Sync for P<T> {}

fn int_atomics<T: Int + atomic::AtomicAdd + atomic::AtomicMinMax + atomic::AtomicBits>() {
    let mut cell = [T::ZERO, T::HIGHEST, T::LOWEST, T::ZERO];
    let p = P(cell.as_mut_ptr());
    let olds: Vec<Vec<T>> = thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let p = p;
                    let mut olds = Vec::with_capacity(PER_THREAD);
                    for i in 0..PER_THREAD {
                        let v = T::from_u64((t * PER_THREAD + i) as u64 % 97 + 1);
                        unsafe {
                            olds.push(atomic::add(p.0, v));
                            atomic::min(p.0.add(1), T::from_u64((t * 1000 + i) as u64 % 5000 + 3));
                            atomic::max(p.0.add(2), T::from_u64((t * 1000 + i) as u64 % 5000 + 3));
                            // A CAS loop: the counter ends at the number of
                            // increments whatever the interleaving.
                            let c = p.0.add(3);
                            let mut cur = *c;
                            loop {
                                let old = atomic::cas(c, cur, cur + T::ONE);
                                if old == cur {
                                    break;
                                }
                                cur = old;
                            }
                        }
                    }
                    olds
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let n = THREADS * PER_THREAD;
    let total: u64 = (0..n as u64).map(|k| k % 97 + 1).sum();
    assert_eq!(cell[0], T::from_u64(total), "{} add", T::NAME);
    assert_eq!(cell[1], T::from_u64(3), "{} min", T::NAME);
    assert_eq!(cell[2], T::from_u64(4999 + 3), "{} max", T::NAME);
    assert_eq!(cell[3], T::from_u64(n as u64), "{} cas", T::NAME);
    // add returns the old values: each is a partial sum, all distinct
    // (every term > 0), and one of them is 0.
    let mut all: Vec<u64> = olds.into_iter().flatten().map(|v| v.to_u64()).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!((all.len(), all[0]), (n, 0), "{} add's old values", T::NAME);
    // exch: every value put in comes out once, the last stays.
    let mut cell = T::ZERO;
    let p = P(&mut cell as *mut T);
    let outs: Vec<u64> = thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let p = p;
                    (0..1000).map(|i| unsafe { atomic::exch(p.0, T::from_u64((t * 1000 + i + 1) as u64)) }.to_u64()).collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut seen: Vec<u64> = outs.into_iter().chain([cell.to_u64()]).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..=(THREADS * 1000) as u64).collect::<Vec<_>>(), "{} exch", T::NAME);
}

#[test]
fn integer_atomics_under_contention() {
    int_atomics::<u32>();
    int_atomics::<i32>();
    int_atomics::<u64>();
    int_atomics::<i64>();
}

#[test]
fn signed_min_max_order_negatives_below_zero() {
    let mut c = [0i32, 0];
    unsafe {
        assert_eq!(atomic::min(&mut c[0], -5), 0);
        assert_eq!(atomic::max(&mut c[1], -5), 0);
    }
    assert_eq!(c, [-5, 0]);
    let mut c = [0i64, 0];
    unsafe {
        atomic::min(&mut c[0], i64::MIN);
        atomic::max(&mut c[1], i64::MAX);
    }
    assert_eq!(c, [i64::MIN, i64::MAX]);
}

#[test]
fn float_atomic_add_returns_the_old_value() {
    // Quarters summed exactly: any order gives the same total, and the old
    // values are every partial sum, 0 to total - 1/4, once each.
    let mut s32 = 0.0f32;
    let mut s64 = 0.0f64;
    let (p32, p64) = (P(&mut s32 as *mut f32), P(&mut s64 as *mut f64));
    let olds: Vec<f32> = thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(move || {
                    let (p32, p64) = (p32, p64);
                    (0..1000)
                        .map(|_| unsafe {
                            atomic::add(p64.0, 0.5);
                            atomic::add(p32.0, 0.25)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let n = THREADS * 1000;
    assert_eq!(s32, 0.25 * n as f32);
    assert_eq!(s64, 0.5 * n as f64);
    let mut olds: Vec<u32> = olds.iter().map(|&o| (o * 4.0) as u32).collect();
    olds.sort_unstable();
    assert_eq!(olds, (0..n as u32).collect::<Vec<_>>());
    let mut x = 1.5f64;
    unsafe {
        assert_eq!(atomic::add(&mut x, 2.0), 1.5);
        assert_eq!(atomic::exch(&mut x, -1.0), 3.5);
        // cas compares bits: the swap happens only on the expected value.
        assert_eq!(atomic::cas(&mut x, 7.0, 8.0), -1.0);
        assert_eq!(atomic::cas(&mut x, -1.0, 8.0), -1.0);
    }
    assert_eq!(x, 8.0);
}

// ------------------------------------------------------------ operators

#[test]
fn sum_max_min_identities() {
    assert_eq!(fold(Sum::<i32>::new(), [1, 2, 3]), 6);
    assert_eq!(fold(Max::<u8>::new(), []), 0);
    assert_eq!(fold(Max::<f32>::new(), []), f32::NEG_INFINITY);
    assert_eq!(fold(Min::<f64>::new(), [2.0, f64::NAN, -1.0]), -1.0);
    // maxNum: a NaN is ignored.
    assert_eq!(fold(Max::<f64>::new(), [f64::NAN, 2.0, f64::NAN]), 2.0);
    assert_eq!(fold(Min::<i64>::new(), [5, i64::MIN, 0]), i64::MIN);
}

fn with_index<T: Copy>(xs: &[T]) -> Vec<(T, u32)> {
    xs.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect()
}

#[test]
fn argmax_ties_to_the_lower_index_and_nan_never_wins() {
    let nan = f32::NAN;
    let am = ArgMax::<f32>::new();
    let cases: &[(&[f32], (f32, u32))] = &[
        (&[1.0, 3.0, 3.0, 2.0], (3.0, 1)),
        (&[nan, 1.0, nan, 1.0], (1.0, 1)),
        (&[nan, nan], (f32::NEG_INFINITY, u32::MAX)),
        (&[f32::NEG_INFINITY, f32::NEG_INFINITY], (f32::NEG_INFINITY, 0)),
        (&[-0.0, 0.0], (-0.0, 0)),
        (&[], (f32::NEG_INFINITY, u32::MAX)),
    ];
    for (xs, want) in cases {
        let got = fold(am, with_index(xs));
        assert!(got.0 == want.0 && got.1 == want.1, "argmax {xs:?}: {got:?}");
        // Any grouping gives the same answer: pairs combined in a tree.
        let items = with_index(xs);
        let mut level = items.clone();
        while level.len() > 1 {
            level = level.chunks(2).map(|c| if c.len() == 2 { am.combine(c[0], c[1]) } else { c[0] }).collect();
        }
        let tree = level.first().copied().unwrap_or(am.identity());
        assert!(tree.0 == want.0 && tree.1 == want.1, "argmax tree {xs:?}: {tree:?}");
    }
    let got = fold(ArgMin::<i32>::new(), with_index(&[4, -2, 7, -2]));
    assert_eq!(got, (-2, 1));
    let got = fold(ArgMin::<f64>::new(), with_index(&[f64::NAN, 2.0, 2.0]));
    assert_eq!(got, (2.0, 1));
}

#[test]
fn a_users_operator_keeps_the_order() {
    // Last non-zero: associative, not commutative.
    let last = Op::new(0u32, |a, b| if b != 0 { b } else { a });
    let xs = [0, 5, 0, 7, 0, 0];
    assert_eq!(fold(last, xs), 7);
    let mut inc = [0; 6];
    inclusive_scan(last, &xs, &mut inc);
    assert_eq!(inc, [0, 5, 5, 7, 7, 7]);
    let mut exc = [9; 6];
    exclusive_scan(last, &xs, &mut exc);
    assert_eq!(exc, [0, 0, 5, 5, 7, 7]);
    // The product, with its identity.
    assert_eq!(fold(Op::new(1.0f64, |a, b| a * b), [2.0, 3.0, 4.0]), 24.0);
}

#[test]
fn block_and_warp_on_the_host_are_the_sequential_forms() {
    let xs: Vec<i64> = (0..1024).map(|i| (i * 7919) % 1000 - 500).collect();
    assert_eq!(block::reduce_of(Sum::new(), &xs), xs.iter().sum::<i64>());
    let mut inc = vec![0; xs.len()];
    block::inclusive_scan_of(Sum::new(), &xs, &mut inc);
    let mut exc = vec![0; xs.len()];
    block::exclusive_scan_of(Sum::new(), &xs, &mut exc);
    let mut acc = 0;
    for i in 0..xs.len() {
        assert_eq!(exc[i], acc);
        acc += xs[i];
        assert_eq!(inc[i], acc);
    }
    let mut mx = vec![0; xs.len()];
    block::inclusive_scan_of(Max::new(), &xs, &mut mx);
    assert_eq!(mx[1023], *xs.iter().max().unwrap());
    assert_eq!(warp::reduce_of(ArgMax::<i64>::new(), &with_index(&xs[..32])).1, {
        let m = xs[..32].iter().max().unwrap();
        xs.iter().position(|v| v == m).unwrap() as u32
    });

    let preds: Vec<bool> = (0..32).map(|i| i % 3 == 0).collect();
    assert_eq!(warp::ballot_of(&preds), 0x4924_9249);
    assert!(warp::any_of(&preds) && !warp::all_of(&preds));
    assert!(warp::all_of(&[true; 32]) && !warp::any_of(&[false; 32]));
    assert_eq!(warp::ballot_of(&[true; 32]), u32::MAX);
}

// -------------------------------------------------------------- elements

fn roundtrip<T: Element>(v: T) {
    assert_eq!(T::from_bits64(v.to_bits64()), v, "{}", T::NAME);
    assert!(T::BYTES == 8 || v.to_bits64() >> (8 * T::BYTES) == 0, "{}: bits zero-extended", T::NAME);
}

#[test]
fn element_family() {
    let names = [u8::NAME, i32::NAME, u32::NAME, i64::NAME, u64::NAME, f32::NAME, f64::NAME];
    assert_eq!(names, ["u8", "s32", "u32", "s64", "u64", "f32", "f64"]);
    assert_eq!([u8::BYTES, i32::BYTES, i64::BYTES, f32::BYTES, f64::BYTES], [1, 4, 8, 4, 8]);
    roundtrip(200u8);
    roundtrip(-3i32);
    roundtrip(-3i64);
    roundtrip(u64::MAX);
    roundtrip(-1.5f32);
    roundtrip(f64::MIN_POSITIVE);
    // Scalars arrive as f64: integers truncate and saturate, as Rust's `as`.
    assert_eq!((<u8 as Numeric>::from_f64(300.0), <i32 as Numeric>::from_f64(-2.7)), (255, -2));
    assert_eq!(<u32 as Numeric>::from_f64(f64::NAN), 0);
    assert_eq!((i32::LOWEST, u8::HIGHEST, f64::LOWEST), (i32::MIN, 255, f64::NEG_INFINITY));
    assert_eq!(Numeric::maximum(f32::NAN, 1.0), 1.0);
    assert_eq!(Numeric::minimum(-4i64, 3), -4);
    assert_eq!([i32::SIGNED, i64::SIGNED, u8::SIGNED, u32::SIGNED, u64::SIGNED], [true, true, false, false, false]);
    assert_eq!(<i32 as Int>::to_u64(-1), u64::MAX);
    // The names stay unambiguous for concrete integers with the traits in
    // scope: Ord::max here (of values the compiler cannot fold).
    let three = std::hint::black_box(3u32);
    assert_eq!(three.max(4), 4);
}

/// One body for every type: the sum of squares, generic over Numeric.
fn sumsq<T: Numeric>(xs: &[T]) -> T {
    fold(Sum::<T>::new(), xs.iter().map(|&x| x * x))
}

#[test]
fn one_generic_body_serves_ints_and_floats() {
    assert_eq!(sumsq(&[1u8, 2, 3]), 14);
    assert_eq!(sumsq(&[-1i32, 2, -3]), 14);
    assert_eq!(sumsq(&[1u64 << 20, 1]), (1 << 40) + 1);
    assert_eq!(sumsq(&[0.5f32, 1.5]), 2.5);
    assert_eq!(sumsq(&[0.5f64, -1.5]), 2.5);
}

// ---------------------------------------------------------------- launch

#[test]
fn rows_and_tiles_cover_every_element_once() {
    for (rows, cols, tr, tc) in [(7u64, 5u64, 2u64, 3u64), (1, 1, 4, 4), (64, 33, 16, 16), (3, 100, 1, 100)] {
        let t = Tiles::new(rows, cols, tr, tc);
        let mut hit = vec![0u32; (rows * cols) as usize];
        for b in 0..t.count() {
            let ((r0, r1), (c0, c1)) = t.bounds(b);
            assert!(r0 < r1 && c0 < c1, "tile {b} empty");
            for r in r0..r1 {
                for c in c0..c1 {
                    hit[(r * cols + c) as usize] += 1;
                }
            }
        }
        assert!(hit.iter().all(|&h| h == 1), "{rows}x{cols} by {tr}x{tc}");
        assert_eq!(t.of(t.count() - 1), (t.down() - 1, t.across() - 1));
    }
    for (cols, per) in [(10u64, 4u64), (8, 8), (0, 4), (1000, 256)] {
        let rp = RowParts::new(cols, per);
        let mut hit = vec![0u32; (3 * cols) as usize];
        for b in 0..rp.blocks(3) {
            let (row, part) = rp.of(b);
            let (lo, hi) = rp.span(part);
            for c in lo..hi {
                hit[(row * cols + c) as usize] += 1;
            }
        }
        assert!(hit.iter().all(|&h| h == 1), "cols {cols} per {per}");
        assert_eq!(rp.blocks(3), 3 * cols.div_ceil(per).max(1));
    }
    assert_eq!(thread_2d(37, 16), (5, 2));
    let mut seen: Vec<u64> = (0..4).flat_map(|t| strided(10, 31, t, 4)).collect();
    seen.sort_unstable();
    assert_eq!(seen, (10..31).collect::<Vec<_>>());
}
