//! GPU bodies run on the CPU (`emu`): indices, barriers, shared memory
//! (isolated per block, poisoned), warp shuffles, votes and ballots over 32
//! lanes and over a short last warp, block reductions and scans in the
//! GPU's order (bit for bit against a model of its tree), atomics, and the
//! faults of a divergent barrier or warp operation. Inputs are random, a
//! fresh seed each run (printed with any failure).

use erlcuda_kernel::device::{block_dim, block_dim_y, block_idx, grid_dim, sync_threads, thread_idx, thread_idx_y};
use erlcuda_kernel::emu::{run_block, Dims, Fault, Reason};
use erlcuda_kernel::reduce::{ReduceOp, Sum};
use erlcuda_kernel::{atomic, block, shared_array, warp};
use std::cell::RefCell;

struct Rng(u64);
impl Rng {
    fn new() -> (Rng, u64) {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
        (Rng(seed), seed)
    }
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn dims(x: u32, y: u32, shared: u32) -> Dims {
    Dims { block: (x, y), grid: (3, 1), shared_bytes: shared }
}

/// Runs `body` as one block; the values each thread records, by linear
/// thread index.
fn each<R: Copy + Default>(d: Dims, idx: (u32, u32), body: impl Fn() -> R) -> Result<Vec<R>, Fault> {
    let n = (d.block.0 * d.block.1) as usize;
    let out = RefCell::new(vec![R::default(); n]);
    unsafe {
        run_block(d, idx, &|| {
            let r = body();
            let t = (thread_idx() + thread_idx_y() * block_dim()) as usize;
            out.borrow_mut()[t] = r;
        })?
    };
    Ok(out.into_inner())
}

#[test]
fn indices_are_the_launchs_in_x_and_y() {
    let r = each(dims(8, 4, 0), (2, 0), || (thread_idx(), thread_idx_y(), block_dim(), block_dim_y(), block_idx(), grid_dim()))
        .unwrap();
    for (t, &(x, y, bx, by, b, g)) in r.iter().enumerate() {
        assert_eq!((x, y, bx, by, b, g), (t as u32 % 8, t as u32 / 8, 8, 4, 2, 3));
    }
}

#[test]
fn a_barrier_orders_shared_memory_between_threads() {
    let (mut rng, seed) = Rng::new();
    for n in [1u32, 31, 33, 256, 1024] {
        let xs: Vec<u32> = (0..n).map(|_| rng.next() as u32).collect();
        // Each thread writes its value, then reads its neighbour's, twice
        // (the second round after a second barrier overwrites the first).
        let r = each(dims(n, 1, 0), (0, 0), || {
            let s = shared_array!(ring: [u32; 1024]);
            let t = thread_idx() as usize;
            s.set(t, xs[t]);
            sync_threads();
            let a = s.get((t + 1) % n as usize);
            sync_threads();
            s.set(t, a.wrapping_mul(3));
            sync_threads();
            s.get((t + 1) % n as usize)
        })
        .unwrap();
        for t in 0..n as usize {
            assert_eq!(r[t], xs[(t + 2) % n as usize].wrapping_mul(3), "seed {seed:#x} n {n} t {t}");
        }
    }
}

#[test]
fn shared_memory_is_poisoned_and_isolated_per_block() {
    let mut seen = Vec::new();
    for b in 0..2 {
        // Block 0 writes, block 1 reads before writing: it sees the poison,
        // never block 0's values. Dynamic shared memory too.
        let r = each(dims(64, 1, 256), (b, 0), || {
            let s = shared_array!(cells: [f32; 64]);
            let dynamic = erlcuda_kernel::device::shared::<u32>(4 * thread_idx());
            let before = (s.get(thread_idx() as usize), unsafe { dynamic.read() });
            s.set(thread_idx() as usize, 1.5);
            unsafe { dynamic.write(7) };
            before
        })
        .unwrap();
        seen.push(r);
    }
    for r in &seen {
        assert!(r.iter().all(|&(f, u)| f.is_nan() && u == u32::MAX), "{r:?}");
    }
}

/// Lane `l`'s shuffle source as PTX defines it, `None` for its own value.
fn source(how: warp::Shfl, l: u32, arg: u32, lanes: u32) -> Option<u32> {
    let s = match how {
        warp::Shfl::Idx => Some(arg & 31),
        warp::Shfl::Up => l.checked_sub(arg),
        warp::Shfl::Down => Some(l + arg).filter(|&s| s < 32),
        warp::Shfl::Xor => Some(l ^ arg).filter(|&s| s < 32),
    };
    s.filter(|&s| s < lanes)
}

#[test]
fn shuffles_read_the_lane_ptx_names() {
    let (mut rng, seed) = Rng::new();
    // 64: two full warps; 45: a short second warp of 13 lanes.
    for n in [64u32, 45] {
        let xs: Vec<u64> = (0..n).map(|_| rng.next()).collect();
        for how in [warp::Shfl::Idx, warp::Shfl::Up, warp::Shfl::Down, warp::Shfl::Xor] {
            for arg in [0u32, 1, 5, 16, 31, 37] {
                let r = each(dims(n, 1, 0), (0, 0), || {
                    let v = xs[thread_idx() as usize];
                    // u64 and f64 move whole; a pair moves both halves.
                    let (a, (b, c)) = match how {
                        warp::Shfl::Idx => (warp::shfl_idx(v, arg), warp::shfl_idx((v as u32, v as f64), arg)),
                        warp::Shfl::Up => (warp::shfl_up(v, arg), warp::shfl_up((v as u32, v as f64), arg)),
                        warp::Shfl::Down => (warp::shfl_down(v, arg), warp::shfl_down((v as u32, v as f64), arg)),
                        warp::Shfl::Xor => (warp::shfl_xor(v, arg), warp::shfl_xor((v as u32, v as f64), arg)),
                    };
                    (a, b, c.to_bits())
                })
                .unwrap();
                for t in 0..n {
                    let (w, l) = (t / 32, t % 32);
                    let lanes = (n - 32 * w).min(32);
                    let want = xs[source(how, l, arg, lanes).map_or(t, |s| 32 * w + s) as usize];
                    assert_eq!(r[t as usize], (want, want as u32, (want as f64).to_bits()), "seed {seed:#x} {how:?} {arg} t {t}");
                }
            }
        }
    }
}

#[test]
fn votes_and_ballots_cover_the_warps_lanes() {
    let (mut rng, seed) = Rng::new();
    for n in [64u32, 40, 1] {
        for density in [0u64, 1, 2, 3] {
            // density 0: none; 3: all; else random.
            let ps: Vec<bool> = (0..n).map(|_| density == 3 || (density > 0 && rng.next() % (density + 1) == 0)).collect();
            let r = each(dims(n, 1, 0), (0, 0), || {
                let p = ps[thread_idx() as usize];
                (warp::ballot(p), warp::all(p), warp::any(p))
            })
            .unwrap();
            for t in 0..n as usize {
                let ws = (t / 32) * 32..(t / 32 * 32 + 32).min(n as usize);
                let want = warp::ballot_of(&ps[ws.clone()]);
                assert_eq!(r[t], (want, warp::all_of(&ps[ws.clone()]), warp::any_of(&ps[ws])), "seed {seed:#x} n {n} t {t}");
            }
        }
    }
}

/// The GPU's warp butterfly (`warp::reduce`): every lane's result.
fn butterfly<R: ReduceOp>(op: R, xs: &[R::Item; 32]) -> [R::Item; 32] {
    let mut x: [R::Item; 32] = std::array::from_fn(|l| op.combine(op.identity(), xs[l]));
    let mut m = 1;
    while m < 32 {
        let y: [R::Item; 32] = std::array::from_fn(|l| x[l ^ m]);
        x = std::array::from_fn(|l| if l & m == 0 { op.combine(x[l], y[l]) } else { op.combine(y[l], x[l]) });
        m <<= 1;
    }
    x
}

#[test]
fn block_reduce_and_scan_compute_in_the_gpus_order() {
    let (mut rng, seed) = Rng::new();
    let sum = Sum::<f32>::new();
    for n in [32u32, 96, 256, 1024] {
        // Magnitudes far apart: a different order gives different bits.
        let xs: Vec<f32> = (0..n).map(|i| rng.f32() * [1.0, 1e-4, 1e4, 3.0][i as usize % 4]).collect();
        let r = each(dims(n, 1, 0), (0, 0), || {
            let v = xs[thread_idx() as usize];
            (block::reduce(sum, v), block::inclusive_scan(sum, v), block::exclusive_scan(sum, v), warp::reduce(sum, v))
        })
        .unwrap();
        // The model: each warp's butterfly, then warp 0's butterfly over the
        // warps' results (identity past the last warp).
        let nw = (n / 32) as usize;
        let warps: Vec<f32> = (0..nw).map(|w| butterfly(sum, &std::array::from_fn(|l| xs[32 * w + l]))[0]).collect();
        let total = butterfly(sum, &std::array::from_fn(|l| if l < nw { warps[l] } else { 0.0 }))[0];
        for t in 0..n as usize {
            assert_eq!(r[t].0.to_bits(), total.to_bits(), "seed {seed:#x} n {n} t {t}");
            assert_eq!(r[t].3.to_bits(), warps[t / 32].to_bits(), "seed {seed:#x} n {n} t {t}");
        }
        // The scans: within a warp Hillis–Steele, then the warps before.
        let mut inc = vec![0f32; n as usize];
        for w in 0..nw {
            let mut x: Vec<f32> = (0..32).map(|l| 0.0 + xs[32 * w + l]).collect();
            let mut d = 1;
            while d < 32 {
                let y = x.clone();
                for l in d..32 {
                    x[l] = y[l - d] + y[l];
                }
                d <<= 1;
            }
            inc[32 * w..32 * w + 32].copy_from_slice(&x);
        }
        let mut before = vec![0f32; nw];
        let mut x: Vec<f32> = (0..32).map(|l| if l < nw { 0.0 + inc[32 * l + 31] } else { 0.0 }).collect();
        let mut d = 1;
        while d < 32 {
            let y = x.clone();
            for l in d..32 {
                x[l] = y[l - d] + y[l];
            }
            d <<= 1;
        }
        for w in 1..nw {
            before[w] = x[w - 1];
        }
        for t in 0..n as usize {
            let (w, l) = (t / 32, t % 32);
            let want_inc = before[w] + inc[t];
            let want_exc = if l == 0 { before[w] } else { before[w] + inc[t - 1] };
            assert_eq!(r[t].1.to_bits(), want_inc.to_bits(), "seed {seed:#x} n {n} inclusive t {t}");
            assert_eq!(r[t].2.to_bits(), want_exc.to_bits(), "seed {seed:#x} n {n} exclusive t {t}");
        }
    }
}

#[test]
fn atomics_add_up_across_threads_and_blocks() {
    let (mut rng, seed) = Rng::new();
    let xs: Vec<u32> = (0..256).map(|_| rng.next() as u32 % 1000).collect();
    let mut global = [0u64; 1];
    let g = global.as_mut_ptr() as usize;
    for b in 0..3 {
        let r = each(dims(256, 1, 0), (b, 0), || {
            let c = shared_array!(count: [u32; 1]);
            if thread_idx() == 0 {
                c.set(0, 0);
            }
            sync_threads();
            unsafe { atomic::add_shared(c.addr(0), xs[thread_idx() as usize]) };
            unsafe { atomic::add(g as *mut u64, xs[thread_idx() as usize] as u64) };
            sync_threads();
            c.get(0)
        })
        .unwrap();
        let want: u32 = xs.iter().sum();
        assert!(r.iter().all(|&c| c == want), "seed {seed:#x}");
    }
    assert_eq!(global[0], 3 * xs.iter().map(|&x| x as u64).sum::<u64>(), "seed {seed:#x}");
}

#[test]
fn a_barrier_some_threads_skip_is_a_fault_not_a_hang() {
    // Threads that return while others wait.
    let f = each(dims(64, 1, 0), (1, 0), || {
        if thread_idx() < 40 {
            sync_threads();
        }
    })
    .unwrap_err();
    assert_eq!((f.reason, f.block), (Reason::DivergentBarrier, (1, 0)));
    // Two barriers in the two arms of a branch.
    let f = each(dims(64, 1, 0), (0, 0), || {
        if thread_idx() % 2 == 0 {
            sync_threads();
        } else {
            sync_threads();
        }
    })
    .unwrap_err();
    assert_eq!(f.reason, Reason::DivergentBarrier);
    // A uniform branch is fine.
    each(dims(64, 1, 0), (0, 0), || {
        if block_dim() == 64 {
            sync_threads();
        }
    })
    .unwrap();
}

#[test]
fn a_warp_op_some_lanes_skip_is_a_fault() {
    let f = each(dims(64, 1, 0), (0, 0), || if thread_idx() != 40 { warp::ballot(true) } else { 0 }).unwrap_err();
    assert_eq!((f.reason, f.thread), (Reason::DivergentWarpOp, 32));
    let f = each(dims(32, 1, 0), (0, 0), || if thread_idx() < 16 { warp::shfl_xor(1u32, 1) } else { warp::shfl_xor(2u32, 1) })
        .unwrap_err();
    assert_eq!(f.reason, Reason::DivergentWarpOp);
    // A warp op in one warp while the other waits at a barrier is fine.
    let r = each(dims(64, 1, 0), (0, 0), || {
        let v = if thread_idx() < 32 { warp::ballot(thread_idx() % 2 == 0) } else { 0 };
        sync_threads();
        v
    })
    .unwrap();
    assert_eq!(r[0], 0x5555_5555);
}

#[test]
fn device_functions_outside_a_gpu_body_panic() {
    assert!(std::panic::catch_unwind(thread_idx).is_err());
}

/// The kit's warp reductions and scans on the CPU in one wait of the
/// warp (`emu::warp_collective`) give every lane the bits their shuffles
/// give, one wait per shuffle: sums (-0.0, NaN, infinities among random
/// values), maxima, arg-maxima (pairs), inclusive and exclusive scans, and
/// the device module's shuffle-down and butterfly sums and maxima.
#[test]
fn warp_collectives_give_the_shuffles_bits() {
    use erlcuda_kernel::device::{warp_max, warp_max_all, warp_sum, warp_sum_all};
    use erlcuda_kernel::emu::set_collectives;
    use erlcuda_kernel::reduce::{ArgMax, Max};
    let (mut r, seed) = Rng::new();
    for round in 0..20 {
        let xs: Vec<f32> = (0..64)
            .map(|i| match r.next() % 16 {
                0 => f32::NAN,
                1 => -0.0,
                2 if round % 2 == 0 => f32::INFINITY,
                _ => r.f32() * (1 << (i % 20)) as f32,
            })
            .collect();
        let ys: Vec<f64> = xs.iter().map(|&x| x as f64 * 1.25).collect();
        let run = |on: bool| {
            set_collectives(on);
            let out = each(dims(64, 1, 0), (0, 0), || {
                let t = thread_idx() as usize;
                let (x, y) = (xs[t], ys[t]);
                let s = warp::reduce(Sum::<f32>::new(), x);
                let m = warp::reduce(Max::<f64>::new(), y);
                let (am, ai) = warp::reduce(ArgMax::<f32>::new(), (x, t as u32));
                let inc = warp::inclusive_scan(Sum::<f64>::new(), y);
                let exc = warp::exclusive_scan(Max::<f32>::new(), x);
                let d = (warp_sum(x), warp_max(y), warp_sum_all(y), warp_max_all(x));
                [s.to_bits() as u64, m.to_bits(), am.to_bits() as u64, ai as u64, inc.to_bits(), exc.to_bits() as u64,
                 d.0.to_bits() as u64, d.1.to_bits(), d.2.to_bits(), d.3.to_bits() as u64]
            });
            set_collectives(true);
            out.unwrap()
        };
        assert_eq!(run(true), run(false), "seed {seed}, round {round}");
    }
}

/// The block reductions and scans (`block::reduce`, `inclusive_scan`,
/// `exclusive_scan`, `device::block_sum`, `block_max`) on the CPU in one
/// wait of the block (`emu::block_collective`) give every thread the bits
/// their barriers and shuffles give, and leave the same shared memory
/// (the scratch slots and the dynamic region's first bytes, read back
/// after a barrier): blocks of 32 to 1,024 threads.
#[test]
fn block_collectives_give_the_barriers_bits() {
    use erlcuda_kernel::device::{block_max, block_sum, shared};
    use erlcuda_kernel::emu::set_collectives;
    use erlcuda_kernel::reduce::{ArgMax, Max};
    let (mut r, seed) = Rng::new();
    for threads in [32u32, 96, 256, 1024] {
        let xs: Vec<f32> = (0..threads)
            .map(|i| match r.next() % 16 {
                0 => f32::NAN,
                1 => -0.0,
                2 => f32::NEG_INFINITY,
                _ => r.f32() * (1 << (i % 20)) as f32,
            })
            .collect();
        let run = |on: bool| {
            set_collectives(on);
            let out = each(dims(threads, 1, 33 * 8), (0, 0), || {
                let t = thread_idx() as usize;
                let x = xs[t];
                let y = x as f64 * 0.75;
                let s = block::reduce(Sum::<f64>::new(), y);
                let (am, ai) = block::reduce(ArgMax::<f32>::new(), (x, t as u32));
                let inc = block::inclusive_scan(Sum::<f32>::new(), x);
                let exc = block::exclusive_scan(Max::<f64>::new(), y);
                let bs = block_sum(x);
                let bm = block_max(y);
                sync_threads();
                let sh = unsafe { *shared::<u64>(8 * (t as u32 % 33)) };
                [s.to_bits(), am.to_bits() as u64, ai as u64, inc.to_bits() as u64, exc.to_bits(), bs.to_bits() as u64,
                 bm.to_bits(), sh]
            });
            set_collectives(true);
            out.unwrap()
        };
        assert_eq!(run(true), run(false), "seed {seed}, {threads} threads");
    }
}
