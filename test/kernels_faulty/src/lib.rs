//! Users' kernels that fail on purpose. For the crash-isolation tests: a
//! user kernel's fault must take down gpud (which the supervisor restarts,
//! failing the jobs it held), never the VM. For the CPU run's checks: a
//! GPU body's divergent barrier or warp operation, or its access outside an
//! argument, is answered as the job's kernel_fault, and gpud serves on; a
//! missing barrier shows in a seeded thread order. Built like any users' crate:
//! `priv/erlcuda-build test/kernels_faulty OUT_DIR`.

#![cfg_attr(target_arch = "nvptx64", no_std)]

use erlcuda_kernel::table;

table! {
    // GPU: a store 2^40 elements past the output, an illegal address (the
    // CUDA context is lost). CPU: a store through a null pointer, SIGSEGV.
    oob, [f32], (x: v),
    out = n, blocks = one, threads = 32, shared = 0,
    gpu(k, block) {
        if thread_idx() == 0 {
            // wrapping_add: the address is meant to be wild.
            T::stg(k.output().wrapping_add(1 << 40), T::ONE);
        }
    }
    cpu(k) {
        core::ptr::write_volatile(core::ptr::null_mut::<T>(), T::ONE);
    }
}

table! {
    // GPU: `trap` (the launch fails). CPU: a panic, which cannot unwind out
    // of the extern "C" host entry, so the process aborts (SIGABRT).
    boom, [f32], (x: v),
    out = n, blocks = one, threads = 32, shared = 0,
    gpu(k, block) {
        trap();
    }
    cpu(k) {
        panic!("boom: erlcuda's fault-test kernel panics on purpose");
    }
}

// GPU bodies only, which the CPU backend runs itself and checks (the kit's
// emulator): a job whose first element is negative stops short, and is
// answered {error, {kernel_fault, ...}}; any other job gets y = 2x. On a
// GPU the faulting jobs would hang or be undefined: CPU-only fixtures.
use erlcuda_kernel::kernel;

// out_of_bounds and missing_barrier (the kit's own tests run them too:
// kernels/kit/tests/checked.rs), and the work the faulty kernels share.
mod checked;

kernel! {
    /// y = 2x; with x[0] < 0, only the first 16 threads of each block reach
    /// a barrier (the others return): a divergent barrier.
    divergent_barrier, T: Float in [f32],
    (x: v(T, n)) -> (y: w(T, n)),
    blocks = elements(n), threads = 64, block_rule = warps, shared = 0,
    gpu(job, b) {
        let n = job.len(0) as usize;
        checked::double_block(x, y, n, b);
        if n > 0 && T::load_nc(x) < T::ZERO {
            if thread_idx() >= 16 {
                return;
            }
            sync_threads();
        }
    }
}

kernel! {
    /// y = 2x; with x[0] < 0, only lanes 0 to 15 of each warp shuffle: a
    /// warp operation the other lanes never reach.
    divergent_shuffle, T: Float in [f32],
    (x: v(T, n)) -> (y: w(T, n)),
    blocks = elements(n), threads = 64, block_rule = warps, shared = 0,
    gpu(job, b) {
        let n = job.len(0) as usize;
        if n > 0 && T::load_nc(x) < T::ZERO && erlcuda_kernel::warp::lane() < 16 {
            let _ = erlcuda_kernel::warp::shfl_xor(T::ZERO, 1);
        }
        checked::double_block(x, y, n, b);
    }
}
