//! `saxpy_f32` / `saxpy_f64`: `out[i] = alpha * x[i] + y[i]`, declared with
//! the helper crate like any user's kernel (Args `[Alpha, X, Y]`, signature
//! `alpha:s:T,x:v:T:n,y:v:T:n` -> `out:o:T:n`), so built-in and users'
//! kernels share one path: the job ABI of kernels/kit/src/job.rs (alpha in
//! `param[0]`, x and y in slots 0 and 1, out in slot 8) and the kit's
//! elementwise streaming loop (4 elements per thread per virtual block,
//! 16-byte vectors when `x`, `y` and `out` are aligned). Alpha is the job's
//! f64 scalar rounded to the element type; one fused multiply-add per
//! element (one rounding).

erlcuda_kernel::elementwise!(saxpy, [f32, f64], (alpha: s, x: v, y: v) => alpha.fma(x, y));
