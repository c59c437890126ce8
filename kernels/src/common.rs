//! What the built-in kernels share, all of it from the helper crate
//! `erlcuda-kernel` (kernels/kit), so built-in and users' kernels have one
//! definition of each primitive: thread/block indices, barriers, dynamic
//! shared memory, `unroll!`, the warp/block sums, the job search
//! ([`owner`]), the [`Float`] trait (f32, f64) the generic kernels are
//! written against, and reduce/dot's per-thread partial sums ([`partial`]).

pub(crate) use erlcuda_kernel::device::*;
pub(crate) use erlcuda_kernel::gpu::partial;
pub(crate) use erlcuda_kernel::job::owner;
pub(crate) use erlcuda_kernel::unroll;
pub(crate) use erlcuda_kernel::Float;
