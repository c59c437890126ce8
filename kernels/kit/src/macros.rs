//! The three kernel macros. Each invocation expands to one anonymous
//! `const _: () = { ... };` block holding
//! * the kernel's manifest line, checked at compile time
//!   ([`crate::manifest::line`]) and, on the host, stored in the
//!   `erlcuda_manifest` section (`#[used]`, so the linker keeps it);
//! * the body, as a function generic over `T: Float`;
//! * per element type, a nested block with the PTX entry `NAME_TY`
//!   (nvptx64) or the host entry `erlcuda_host_NAME_TY` (elsewhere). The
//!   symbol names come from `export_name`, so the Rust items need no names
//!   of their own (macro_rules cannot paste identifiers).
//!
//! `allow_internal_unstable(abi_ptx)` lets the expansion use
//! `extern "ptx-kernel"` in a crate that enables no feature itself.

/// An elementwise kernel: `out[i] = body` over vectors of equal length `n`,
/// with each argument bound by name (a `v` to its element at `i`, an `s` to
/// the scalar rounded to `T`).
///
/// ```ignore
/// erlcuda_kernel::elementwise!(clamp, [f32, f64], (x: v, lo: s, hi: s) => x.max(lo).min(hi));
/// ```
///
/// Arguments: 1 or 2 `v`, up to 2 `s`, in the order callers pass them (the
/// entry's signature). Manifest: `out=n blocks=elements threads=256
/// shared=0`. The GPU entry streams `blockDim.x · 4` elements per virtual
/// block, with 16-byte vector loads and stores when every pointer is
/// 16-byte aligned; the host entry is a plain loop.
#[macro_export]
macro_rules! elementwise {
    ($(#[$m:meta])* $name:ident, [$($ty:ident),+ $(,)?], ($($arg:ident : $kind:ident),+ $(,)?) => $body:expr $(,)?) => {
        $(#[$m])*
        const _: () = {
            $crate::__signature!(
                $name, Elementwise, [$($ty),+], ($($arg : $kind),+),
                ("n", &[]), ("elements", &[]), $crate::job::DEFAULT_THREADS, 0
            );
            $crate::__pointwise_body!(($($arg : $kind),+) => $body);
            $( $crate::__pointwise_entries!(elementwise, $name, $ty); )+
        };
    };
}

/// A reduction: `out[0] = Σ body` over i < n, each argument bound as in
/// [`elementwise!`].
///
/// ```ignore
/// erlcuda_kernel::reduction!(sumsq, [f32, f64], (x: v) => x * x);
/// ```
///
/// Manifest: `out=1 blocks=chunks threads=256 shared=264`. On the GPU each
/// thread adds at most `SERIAL` terms serially, the block sums its threads'
/// partials in a tree and adds the result to the output (zeroed by gpud)
/// with one `red.global.add`. On the host the sum follows erlcuda's stated
/// order ([`crate::host::sum`]).
#[macro_export]
macro_rules! reduction {
    ($(#[$m:meta])* $name:ident, [$($ty:ident),+ $(,)?], ($($arg:ident : $kind:ident),+ $(,)?) => $body:expr $(,)?) => {
        $(#[$m])*
        const _: () = {
            $crate::__signature!(
                $name, Reduction, [$($ty),+], ($($arg : $kind),+),
                ("1", &[]), ("chunks", &[]), $crate::job::DEFAULT_THREADS, $crate::BLOCK_SHARED_BYTES
            );
            $crate::__pointwise_body!(($($arg : $kind),+) => $body);
            $( $crate::__pointwise_entries!(reduction, $name, $ty); )+
        };
    };
}

/// A job-table kernel: the launch shape is yours, with a GPU body run once
/// per virtual block and a CPU body run once per job.
///
/// ```ignore
/// erlcuda_kernel::table! {
///     row_sums, [f32, f64], (x: v, cols: d),
///     out = n / cols, blocks = n / cols, threads = 256, shared = erlcuda_kernel::BLOCK_SHARED_BYTES,
///     gpu(k, row) {
///         // x: *const T, cols: u32, k: Args<T>, row: u64 (the block's index within its job)
///     }
///     cpu(k) {
///         // x: &[T], cols: u32, k: Args<T> (k.output_slice() for the output)
///     }
/// }
/// ```
///
/// * `out`: `n`, `1` or `n / D`; `blocks`: `elements`, `chunks`, `one` or
///   `n / D`, D being a `d` argument's name (or `d0`, `d1`, ...);
///   `threads` (a multiple of 32, ≤ 1024) and `shared` (bytes) are
///   constant expressions.
/// * In both bodies each argument is bound by name: a `v` to a `*const T`
///   (GPU: a device address, read with `T::ldg`/`T::ldg_nc`) or a `&[T]` of
///   `n` elements (CPU), an `s` to a `T`, a `d` to a `u32`; the named
///   [`crate::Args`] gives the rest (output, `n`, `out_len`, the raw job).
/// * The GPU body sees [`crate::device`]'s functions by their plain names
///   (`thread_idx()`, `block_dim()`, `block_sum(v)`, ...).
/// * Both bodies run in an unsafe context. The GPU body must reach every
///   barrier with all the block's threads; a barrier follows each call.
#[macro_export]
macro_rules! table {
    (
        $(#[$m:meta])*
        $name:ident, [$($ty:ident),+ $(,)?], ($($arg:ident : $kind:ident),+ $(,)?),
        out = $o:tt $(/ $od:ident)?, blocks = $b:tt $(/ $bd:ident)?,
        threads = $threads:expr, shared = $shared:expr,
        gpu($gk:ident, $gblock:ident) $gbody:block
        cpu($ck:ident) $cbody:block
        $(,)?
    ) => {
        $(#[$m])*
        const _: () = {
            $crate::__signature!(
                $name, Table, [$($ty),+], ($($arg : $kind),+),
                (stringify!($o), &[$(stringify!($od))?]), (stringify!($b), &[$(stringify!($bd))?]),
                $threads, $shared
            );

            #[cfg(target_arch = "nvptx64")]
            #[inline(always)]
            #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
            unsafe fn __gpu<T: $crate::Float>($gk: $crate::Args<'_, T>, $gblock: u64) {
                // The device primitives by their plain names in the body.
                #[allow(unused_imports)]
                use $crate::device::*;
                let (mut __vi, mut __si, mut __di) = (0usize, 0usize, 0usize);
                $( let $arg = $crate::__bind!(gpu $kind, $gk, __vi, __si, __di); )+
                unsafe { $gbody }
            }

            #[cfg(not(target_arch = "nvptx64"))]
            #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
            unsafe fn __cpu<T: $crate::Float>($ck: $crate::Args<'_, T>) {
                let (mut __vi, mut __si, mut __di) = (0usize, 0usize, 0usize);
                $( let $arg = $crate::__bind!(cpu $kind, $ck, __vi, __si, __di); )+
                unsafe { $cbody }
            }

            $( $crate::__table_entries!($name, $ty); )+
        };
    };
}

// ------------------------------------------------------------ internals

/// The signature constants of a kernel (`__SIG`, `__LAYOUT`, `__NV`,
/// `__NS`, `__OFFS`) and its manifest line `__LINE`, evaluated (so checked)
/// on every target and stored in the host library's manifest section.
#[doc(hidden)]
#[macro_export]
macro_rules! __signature {
    ($name:ident, $shape:ident, [$($ty:ident),+], ($($arg:ident : $kind:ident),+),
     $out:expr, $blocks:expr, $threads:expr, $shared:expr) => {
        #[allow(dead_code)]
        const __SIG: &str = concat!($(stringify!($kind)),+);
        #[allow(dead_code)]
        const __LAYOUT: $crate::manifest::Layout = $crate::manifest::Layout::of(__SIG);
        #[allow(dead_code)]
        const __NV: usize = __LAYOUT.vectors;
        #[allow(dead_code)]
        const __NS: usize = __LAYOUT.scalars;
        #[allow(dead_code)]
        const __OFFS: [usize; __NS] = __LAYOUT.scalar_offsets::<__NS>();
        const __LINE: $crate::manifest::Line = $crate::manifest::line(&$crate::manifest::Decl {
            name: stringify!($name),
            shape: $crate::manifest::Shape::$shape,
            args: &[$((stringify!($arg), stringify!($kind))),+],
            types: &[$(stringify!($ty)),+],
            out: $out,
            blocks: $blocks,
            threads: $threads,
            shared: $shared,
        });
        const _: usize = __LINE.len;
        // The section name is manifest::SECTION (an attribute takes a literal).
        #[cfg(not(target_arch = "nvptx64"))]
        #[used]
        #[unsafe(link_section = "erlcuda_manifest")]
        static __MANIFEST: [u8; $crate::manifest::LINE_MAX] = __LINE.bytes;
    };
}

/// `__body<T>(vectors, scalars) -> T` of an elementwise or reduction
/// kernel: the user's expression with each argument bound by name. The
/// counters fold to constants once inlined.
#[doc(hidden)]
#[macro_export]
macro_rules! __pointwise_body {
    (($($arg:ident : $kind:ident),+) => $body:expr) => {
        #[inline(always)]
        #[allow(unused_assignments, unused_mut, unused_variables, non_snake_case, clippy::all)]
        fn __body<T: $crate::Float>(__vals: [T; __NV], __sc: &[T; __NS]) -> T {
            let (mut __vi, mut __si) = (0usize, 0usize);
            $( let $arg: T = $crate::__pick!($kind, __vals, __sc, __vi, __si); )+
            $body
        }
    };
}

/// Argument binding of `__pointwise_body`: a `v` from the vectors' values,
/// an `s` from the scalars. (Other letters are refused by the manifest
/// check, with a clearer message than a macro error would give.)
#[doc(hidden)]
#[macro_export]
macro_rules! __pick {
    (v, $vals:ident, $sc:ident, $vi:ident, $si:ident) => {{
        let x = $vals[$vi];
        $vi += 1;
        x
    }};
    (s, $vals:ident, $sc:ident, $vi:ident, $si:ident) => {{
        let x = $sc[$si];
        $si += 1;
        x
    }};
    ($other:ident, $vals:ident, $sc:ident, $vi:ident, $si:ident) => {
        Default::default()
    };
}

/// Argument binding of the `table!` bodies.
#[doc(hidden)]
#[macro_export]
macro_rules! __bind {
    (gpu v, $k:ident, $vi:ident, $si:ident, $di:ident) => {{
        let x = $k.input($vi);
        $vi += 1;
        x
    }};
    (cpu v, $k:ident, $vi:ident, $si:ident, $di:ident) => {{
        let x = $k.input_slice($vi);
        $vi += 1;
        x
    }};
    ($side:ident s, $k:ident, $vi:ident, $si:ident, $di:ident) => {{
        let x = $k.scalar($si);
        $si += 1;
        x
    }};
    ($side:ident d, $k:ident, $vi:ident, $si:ident, $di:ident) => {{
        let x = $k.dim($di);
        $di += 1;
        x
    }};
    ($side:ident $other:ident, $k:ident, $vi:ident, $si:ident, $di:ident) => {
        ()
    };
}

/// The entries of an elementwise or reduction kernel for one element type.
#[doc(hidden)]
#[macro_export]
#[allow_internal_unstable(abi_ptx)]
macro_rules! __pointwise_entries {
    ($shape:ident, $name:ident, $ty:ident) => {
        const _: () = {
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(export_name = concat!(stringify!($name), "_", stringify!($ty)))]
            unsafe extern "ptx-kernel" fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::$shape::<$ty, __NV, __NS>(jobs, njobs, total_blocks, &__OFFS, __body::<$ty>)
            }

            #[cfg(not(target_arch = "nvptx64"))]
            #[unsafe(export_name = concat!("erlcuda_host_", stringify!($name), "_", stringify!($ty)))]
            unsafe extern "C" fn __host(job: *const $crate::Job) {
                $crate::host::$shape::<$ty, __NV, __NS>(&*job, &__OFFS, __body::<$ty>)
            }
        };
    };
}

/// The entries of a table kernel for one element type.
#[doc(hidden)]
#[macro_export]
#[allow_internal_unstable(abi_ptx)]
macro_rules! __table_entries {
    ($name:ident, $ty:ident) => {
        const _: () = {
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(export_name = concat!(stringify!($name), "_", stringify!($ty)))]
            unsafe extern "ptx-kernel" fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::table(jobs, njobs, total_blocks, |job, block| {
                    __gpu::<$ty>($crate::Args::new(job, &__LAYOUT), block)
                })
            }

            #[cfg(not(target_arch = "nvptx64"))]
            #[unsafe(export_name = concat!("erlcuda_host_", stringify!($name), "_", stringify!($ty)))]
            unsafe extern "C" fn __host(job: *const $crate::Job) {
                $crate::host::table::<$ty>(&*job, &__LAYOUT, |k| __cpu::<$ty>(k))
            }
        };
    };
}
