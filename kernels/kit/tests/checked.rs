//! GPU bodies run checked on the CPU, as gpud's CPU backend runs them
//! (`host::run_gpu` through a kernel's `erlcuda_hostgpu_*` entry): an
//! access outside an argument, even one that lands in the argument next to
//! it, or outside a shared array, is the job's out-of-bounds fault; a
//! seeded thread order shows a missing barrier that the in-index order
//! hides, the same result for the same seed.

use erlcuda_kernel::job::{Fault, Job, FAULT_OUT_OF_BOUNDS, FAULT_SLOT_SHARED, OPT_THREAD_ORDER};
use erlcuda_kernel::signature::MAX_VECTORS;
use erlcuda_kernel::kernel;

// `out_of_bounds` (y = 2x; thread 5 of block 0 reads x[at], thread 7
// writes y[to] unless `to` is -1) and `missing_barrier` (y[e] = x[e - 1]
// within groups of 64 through shared memory, the barrier between writes
// and reads left out), as the Erlang suites run them.
#[path = "../../../test/kernels_faulty/src/checked.rs"]
mod faulty;

kernel! {
    /// Thread t writes tile[t + 64 k] and reads tile[at].
    shared_poke, [],
    (x: v(u32, n), at: s(s64)) -> (y: w(u32, n)),
    blocks = 1, threads = 64, block_rule = warps, shared = 0,
    gpu(job, b) {
        let tile = erlcuda_kernel::shared_array!(tile: [u32; 64]);
        tile.set(thread_idx() as usize, thread_idx());
        sync_threads();
        if thread_idx() == 3 {
            let _ = tile.get(at as usize);
        }
    }
}

extern "C" {
    fn erlcuda_hostgpu_out_of_bounds_f32(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_shared_poke(job: *const Job, fault: *mut Fault) -> u32;
    fn erlcuda_hostgpu_missing_barrier_f32(job: *const Job, fault: *mut Fault) -> u32;
}

const OUT: usize = MAX_VECTORS;

/// Runs `entry` on `job`: Ok, or the fault.
fn run(entry: unsafe extern "C" fn(*const Job, *mut Fault) -> u32, job: &Job) -> Result<(), Fault> {
    let mut f = Fault::default();
    match unsafe { entry(job, &mut f) } {
        0 => Ok(()),
        _ => Err(f),
    }
}

/// A job of `out_of_bounds`: x and y are halves of one buffer (y starts right after
/// x's last element), so a read just past x is a read of y's memory.
fn poke(buf: &mut [f32], n: usize, at: i64, to: i64) -> Result<(), Fault> {
    let mut j = Job::default();
    let p = buf.as_mut_ptr();
    (j.addr[0], j.len[0]) = (p as u64, n as u32);
    (j.addr[OUT], j.len[OUT]) = (unsafe { p.add(n) } as u64, n as u32);
    j.param[0] = at as u64;
    j.param[1] = to as u64;
    run(erlcuda_hostgpu_out_of_bounds_f32, &j)
}

fn oob(slot: usize, index: i64, thread: u32) -> Fault {
    Fault { reason: FAULT_OUT_OF_BOUNDS, thread, block: 0, slot: slot as u32, index: index as u64, ..Default::default() }
}

#[test]
fn accesses_inside_the_arguments_run() {
    for n in [8usize, 300, 1023] {
        let mut buf: Vec<f32> = (0..2 * n).map(|i| i as f32).collect();
        // The first and last elements: y[0] (thread 0 of block 0 wrote it
        // already, in index order) becomes 0.
        poke(&mut buf, n, n as i64 - 1, 0).unwrap();
        let want: Vec<f32> = (0..n).map(|i| if i == 0 { 0.0 } else { 2.0 * i as f32 }).collect();
        assert_eq!(&buf[n..], &want[..], "n {n}");
    }
}

#[test]
fn a_read_past_an_argument_is_its_fault_even_over_the_next_one() {
    let n = 300;
    let mut buf = vec![1.0f32; 2 * n];
    assert_eq!(poke(&mut buf, n, n as i64, -1), Err(oob(0, n as i64, 5)));
    assert_eq!(poke(&mut buf, n, 2 * n as i64 + 5, -1), Err(oob(0, 2 * n as i64 + 5, 5)));
    // Before the first element: a negative index.
    assert_eq!(poke(&mut buf, n, -1, -1), Err(oob(0, -1, 5)));
    // A wild index, far from any memory: a fault, not a segfault.
    assert_eq!(poke(&mut buf, n, 1 << 40, -1), Err(oob(0, 1 << 40, 5)));
}

#[test]
fn a_write_past_an_output_is_its_fault() {
    let n = 100;
    let mut buf = vec![1.0f32; 2 * n + 1];
    assert_eq!(poke(&mut buf, n, 0, n as i64), Err(oob(OUT, n as i64, 7)));
    // The element after y was not written.
    assert_eq!(buf[2 * n], 1.0);
}

#[test]
fn an_empty_argument_has_no_element_to_read() {
    let mut buf = vec![0.0f32; 4];
    let mut j = Job::default();
    (j.addr[0], j.len[0]) = (buf.as_mut_ptr() as u64, 0);
    (j.addr[OUT], j.len[OUT]) = (buf.as_mut_ptr() as u64, 0);
    // No blocks at all for n = 0: nothing runs, nothing faults.
    assert_eq!(run(erlcuda_hostgpu_out_of_bounds_f32, &j), Ok(()));
}

#[test]
fn a_shared_array_index_past_its_end_is_a_shared_fault() {
    let x = [0u32; 1];
    let mut y = [0u32; 1];
    let mut job = |at: i64| {
        let mut j = Job::default();
        (j.addr[0], j.len[0]) = (x.as_ptr() as u64, 1);
        (j.addr[OUT], j.len[OUT]) = (y.as_mut_ptr() as u64, 1);
        j.param[0] = at as u64;
        j
    };
    assert_eq!(run(erlcuda_hostgpu_shared_poke, &job(63)), Ok(()));
    let f = run(erlcuda_hostgpu_shared_poke, &job(64)).unwrap_err();
    // The byte it would have reached: the array's start (its own address
    // in the window) plus 64 u32.
    assert_eq!((f.reason, f.slot, f.thread), (FAULT_OUT_OF_BOUNDS, FAULT_SLOT_SHARED, 3));
    assert_eq!(f.index % 16, 0, "the array starts 16-byte aligned: {f:?}");
    assert!(f.index >= 256, "{f:?}");
}

/// `missing_barrier` over x = 1, 2, ..., n: y, or the fault.
fn missing_barrier(n: usize, seed: Option<u32>) -> Vec<f32> {
    let x: Vec<f32> = (1..=n).map(|i| i as f32).collect();
    let mut y = vec![0.0f32; n];
    let mut j = Job::default();
    (j.addr[0], j.len[0]) = (x.as_ptr() as u64, n as u32);
    (j.addr[OUT], j.len[OUT]) = (y.as_mut_ptr() as u64, n as u32);
    if let Some(s) = seed {
        j.given |= OPT_THREAD_ORDER;
        j.seed = s;
    }
    run(erlcuda_hostgpu_missing_barrier_f32, &j).unwrap();
    y
}

/// What `missing_barrier` computes with its barrier.
fn shifted(n: usize) -> Vec<f32> {
    (0..n).map(|e| if e % 64 == 0 { e as f32 + 1.0 } else { e as f32 }).collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().map(|v| v.to_bits()).eq(b.iter().map(|v| v.to_bits()))
}

#[test]
fn in_order_hides_a_missing_barrier_and_is_deterministic() {
    for n in [1usize, 64, 1000] {
        let first = missing_barrier(n, None);
        assert_eq!(first, shifted(n), "n {n}");
        for _ in 0..3 {
            assert!(same_bits(&missing_barrier(n, None), &first));
        }
    }
}

#[test]
fn a_seeded_order_finds_a_missing_barrier_in_99_of_100_seeds() {
    let n = 1000;
    let found = (0..100u32).filter(|&s| missing_barrier(n, Some(s)) != shifted(n)).count();
    assert!(found >= 99, "found in {found} of 100 seeds");
    // The same seed, the same order: the same bits.
    for s in [0u32, 7, u32::MAX] {
        assert!(same_bits(&missing_barrier(n, Some(s)), &missing_barrier(n, Some(s))), "seed {s}");
    }
}

#[test]
fn a_seeded_order_keeps_a_correct_kernel_correct() {
    // out_of_bounds has no shared state between threads: any order, the same y.
    let n = 1000;
    let mut want = vec![1.0f32; 2 * n];
    poke(&mut want, n, 0, -1).unwrap();
    let x: Vec<f32> = vec![1.0; n];
    for s in 0..10u32 {
        let mut y = vec![0.0f32; n];
        let mut j = Job::default();
        (j.addr[0], j.len[0]) = (x.as_ptr() as u64, n as u32);
        (j.addr[OUT], j.len[OUT]) = (y.as_mut_ptr() as u64, n as u32);
        j.param[1] = -1i64 as u64;
        (j.given, j.seed) = (OPT_THREAD_ORDER, s);
        run(erlcuda_hostgpu_out_of_bounds_f32, &j).unwrap();
        assert_eq!(&y[..], &want[n..], "seed {s}");
    }
}
