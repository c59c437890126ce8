//! The checker's kernels that the kit's tests run as well
//! (`kernels/kit/tests/checked.rs` includes this file): one definition
//! each, for the Erlang suites (through this crate) and the kit's own.

use erlcuda_kernel::kernel;
// (both targets: the CPU backend runs these GPU bodies)
use erlcuda_kernel::device::{block_dim, thread_idx};
use erlcuda_kernel::Float;

/// y = 2x over thread `thread_idx` of virtual block `b`'s share of an
/// `elements(n)` job: 4 consecutive elements a thread (the rule's count).
/// The faulty kernels' common work, before or after their fault.
#[inline(always)]
pub(crate) unsafe fn double_block<T: Float>(x: *const T, y: *mut T, n: usize, b: u64) {
    let base = (b as usize * block_dim() as usize + thread_idx() as usize) * 4;
    for i in base..n.min(base + 4) {
        let v = T::load_nc(x.add(i));
        T::store(y.add(i), v + v);
    }
}

kernel! {
    /// y = 2x; thread 5 of block 0 reads x[at] and thread 7 writes y[to]
    /// (0; not where `to` is -1): outside x or y, an out_of_bounds fault
    /// naming the argument and the index.
    out_of_bounds, T: Float in [f32],
    (x: v(T, n), at: s(s64), to: s(s64)) -> (y: w(T, n)),
    blocks = elements(n), threads = 64, block_rule = warps, shared = 0,
    gpu(job, b) {
        double_block(x, y, job.len(0) as usize, b);
        // wrapping_offset: the address may be meant to be outside.
        if b == 0 && thread_idx() == 5 {
            let _ = T::load(x.wrapping_offset(at as isize));
        }
        if b == 0 && thread_idx() == 7 && to != -1 {
            T::store(y.wrapping_offset(to as isize), T::ZERO);
        }
    }
}

kernel! {
    /// y[e] = x[e - 1] within each group of 64 elements (the group's first
    /// keeps its own), through shared memory, with the barrier between the
    /// writes and the reads missing: thread t reads what thread t - 1
    /// wrote. Run in index order (thread t - 1 always first) it gives the
    /// right answer; in a seeded order it reads the poison (NaN) of slots
    /// not yet written. On a GPU: a race.
    missing_barrier, T: Float in [f32],
    (x: v(T, n)) -> (y: w(T, n)),
    blocks = elements(n), threads = 64, block_rule = warps, shared = 0,
    gpu(job, b) {
        let n = job.len(0) as usize;
        let tile = erlcuda_kernel::shared_array!(tile: [T; 256], room = f64);
        let t = thread_idx() as usize;
        let base = b as usize * 256;
        for k in 0..4 {
            if base + t + 64 * k < n {
                tile.set(t + 64 * k, T::load(x.add(base + t + 64 * k)));
            }
        }
        // sync_threads() belongs here.
        for k in 0..4 {
            let e = base + t + 64 * k;
            if e < n {
                let from = if t == 0 { t + 64 * k } else { t - 1 + 64 * k };
                T::store(y.add(e), tile.get(from));
            }
        }
    }
}
