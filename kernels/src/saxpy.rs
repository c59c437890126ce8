//! `saxpy_f32` / `saxpy_f64`: `out[i] = alpha * x[i] + y[i]`, declared with
//! the helper crate like any user's kernel (Args `[Alpha, X, Y]`,
//! signature `svv`), so built-in and users' kernels share one path: the
//! job ABI of kernels/kit/src/job.rs, the kit's elementwise streaming loop
//! (4 elements per thread per virtual block, 16-byte vectors when `x`, `y`
//! and `out` are aligned). Alpha is the job's f64 scalar rounded to the
//! element type; one fused multiply-add per element (one rounding).

erlcuda_kernel::elementwise!(saxpy, [f32, f64], (alpha: s, x: v, y: v) => alpha.fma(x, y));
