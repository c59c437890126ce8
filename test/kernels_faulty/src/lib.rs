//! Users' kernels that fail on purpose, for the crash-isolation tests: a
//! user kernel's fault must take down gpud (which the supervisor restarts,
//! failing the jobs it held), never the VM. Built like any users' crate:
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
