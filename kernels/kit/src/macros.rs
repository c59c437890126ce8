//! The kernel macros: [`kernel!`](crate::kernel) (any signature) and the
//! three fixed shapes written on it, [`elementwise!`](crate::elementwise),
//! [`reduction!`](crate::reduction) and [`table!`](crate::table). Each
//! invocation expands to one anonymous `const _: () = { ... };` block
//! holding
//! * the kernel, checked at compile time ([`crate::manifest::kernel`] or
//!   [`crate::manifest::legacy`]), and on the host its manifest line in the
//!   `erlcuda_manifest` section (`#[used]`, so the linker keeps it);
//! * the bodies, as functions generic over T (none for a kernel with no T);
//! * per type, a nested block with the PTX entry `NAME_TY` (nvptx64) or the
//!   host entry `erlcuda_host_NAME_TY` (elsewhere); `NAME` and
//!   `erlcuda_host_NAME` for a kernel with no T. The symbol names come from
//!   `export_name`, so the Rust items need no names of their own
//!   (macro_rules cannot paste identifiers).
//!
//! `allow_internal_unstable(abi_ptx)` lets the expansion use
//! `extern "ptx-kernel"` in a crate that enables no feature itself.

/// A kernel of any signature: a GPU body run once per virtual block, a
/// CPU body run once per job.
///
/// ```ignore
/// erlcuda_kernel::kernel! {
///     /// sim[r] = x[r, ..] · q (x row-major, rows × cols)
///     cos_sim, T: Float in [f32, f64],
///     (x: v(T, rows * cols), q: v(T, cols), rows: d, cols: d) -> (sim: o(T, rows)),
///     blocks = rows, threads = 256, block_rule = warps, shared = erlcuda_kernel::BLOCK_SHARED_BYTES,
///     gpu(k, block) { /* x: *const T, q: *const T, rows: u32, cols: u32, sim: *mut T, block: u64 */ }
///     cpu(k) { /* x: &[T], q: &[T], rows: u32, cols: u32, sim: &mut [T] */ }
/// }
/// ```
///
/// * Type: `T: Bound in [types]`, Bound one of [`crate::Element`],
///   [`crate::Numeric`], [`crate::Int`], [`crate::Float`], the types among
///   `u8`, `s32`, `u32`, `s64`, `f32`, `f64` (one entry `NAME_TY` each;
///   the bodies see only the bound's methods on T); or `[]` for a kernel
///   with no T (one entry, `NAME`).
/// * Arguments, in the order callers pass them: `name: v(TY, LEN)` a
///   vector, `name: io(TY, LEN)` a device buffer updated in place,
///   `name: s(TY)` a scalar, `name: d` a dimension, `name: d(RANGE)` one
///   with a range (`1..`, `..= 64`, `1 ..= cols & 64`: inclusive, each
///   side lengths joined by `&`, every one holding; a call outside is
///   refused with `{badarg, {arg, I}}`). Outputs, in the order
///   callers get them: `name: o(TY, LEN)` a vector, which starts zeroed
///   (the kernel may add into it, atomically or not, or leave parts of
///   it alone); `name: w(TY, LEN)` a vector the kernel writes in full,
///   every element, and never adds into: it does not start zeroed, and
///   gpud writes it where it lies (no scratch, no memset, no copy back:
///   a small job then costs what a built-in's does); `name: s(TY)` one
///   element given back as a number (zeroed); `-> ()` for none (the
///   kernel then has an io argument). TY is `T` or an element type; LEN
///   a length of the signature language (`n`, `rows * cols`, `n / cols`,
///   `256`: `c_src/erlcuda_ring.h`, "Signatures").
/// * `blocks`: virtual blocks per job, `elements(LEN)` (LEN / (threads ·
///   4), rounded up), `chunks(LEN)` (LEN / (threads · 256)) or `LEN`;
///   `threads` (the default block size) and `shared` (dynamic shared
///   bytes) are constant expressions; `block_rule` (`any`, `warps`,
///   `pow2`) is which `{block, B}` the GPU body is correct for.
/// * Bindings, by name, with R the element type's Rust type (T, `u8`,
///   `i32` for s32, `u32`, `i64` for s64, `f32`, `f64`):
///
///   | | GPU body | CPU body |
///   |---|---|---|
///   | `v` | `*const R` | `&[R]` (the job's length) |
///   | `io` | `*mut R` | `&mut [R]` |
///   | `o`, `w`, output `s` | `*mut R` | `&mut [R]` (one element for `s`) |
///   | `s` argument | `R` | `R` |
///   | `d` | `u32` | `u32` |
///
///   A float scalar is the caller's number rounded to R, an integer one
///   the caller's integer. `k` is the job's [`crate::Args`] (raw job,
///   `len(slot)`, `ptr`, `param`, ...), `block` (GPU) the virtual block's
///   index within its job, a `u64`.
/// * The GPU body sees [`crate::device`]'s functions by their plain names;
///   both see the methods of the element traits on every element type
///   (`u8::load_nc(p)`, `x.to_f64()`). Both bodies run in an unsafe
///   context. The GPU body must reach every barrier with all the block's
///   threads; a barrier follows each call.
///
/// * Without `cpu(k) { .. }` the kernel has its GPU body alone, which the
///   CPU backend runs itself ([`crate::emu`]): the host library then
///   exports `erlcuda_hostgpu_NAME_TY` ([`crate::job::HostGpuFn`]) instead
///   of `erlcuda_host_NAME_TY`.
///
/// The declaration is checked at compile time by the parser gpud reads
/// the manifest with; a broken rule is a compile error naming it.
#[macro_export]
macro_rules! kernel {
    (
        $(#[$m:meta])*
        $name:ident, T : $bound:ident in [$($ty:ident),+ $(,)?],
        ($($an:ident : $ak:ident $(( $($as:tt)* ))?),* $(,)?) -> ($($on:ident : $ok:ident $(( $($os:tt)* ))?),* $(,)?),
        blocks = $($rest:tt)+
    ) => {
        $crate::__kernel_blocks!(
            [$(#[$m])* $name, [$bound], [$($ty),+],
             ($($an : $ak $(( $($as)* ))?),*) -> ($($on : $ok $(( $($os)* ))?),*)]
            [] $($rest)+
        );
    };
    (
        $(#[$m:meta])*
        $name:ident, [],
        ($($an:ident : $ak:ident $(( $($as:tt)* ))?),* $(,)?) -> ($($on:ident : $ok:ident $(( $($os:tt)* ))?),* $(,)?),
        blocks = $($rest:tt)+
    ) => {
        $crate::__kernel_blocks!(
            [$(#[$m])* $name, [], [],
             ($($an : $ak $(( $($as)* ))?),*) -> ($($on : $ok $(( $($os)* ))?),*)]
            [] $($rest)+
        );
    };
    ($($other:tt)*) => {
        compile_error!(
            "erlcuda_kernel: kernel! is `NAME, T: Bound in [types] (or []), (ARGS) -> (OUTS), blocks = RULE, \
             threads = N, block_rule = any|warps|pow2, shared = BYTES, gpu(k, block) { .. } [cpu(k) { .. }]`"
        );
    };
}

/// An elementwise kernel: `out[i] = body` over vectors of equal length `n`,
/// with each argument bound by name (a `v` to its element at `i`, an `s` to
/// the scalar rounded to `T`).
///
/// ```ignore
/// erlcuda_kernel::elementwise!(clamp, [f32, f64], (x: v, lo: s, hi: s) => x.max(lo).min(hi));
/// ```
///
/// Arguments: at least one `v`, any `s`, in the order callers pass them.
/// Manifest: `args=x:v:T:n,lo:s:T,hi:s:T outs=out:w:T:n blocks=elements(n)
/// threads=256 block_rule=any shared=0`. The GPU entry streams
/// `blockDim.x · 4` elements per virtual block, with 16-byte vector loads
/// and stores when every pointer is 16-byte aligned; the host entry is a
/// plain loop.
#[macro_export]
macro_rules! elementwise {
    ($(#[$m:meta])* $name:ident, [$($ty:ident),+ $(,)?], ($($arg:ident : $kind:ident),+ $(,)?) => $body:expr $(,)?) => {
        $(#[$m])*
        const _: () = {
            $crate::__legacy!(
                $name, Elementwise, [$($ty),+], ($($arg : $kind),+),
                ("n", &[]), ("elements", &[]), $crate::job::DEFAULT_THREADS, 0
            );
            $crate::__pointwise_body!(($($arg : $kind),+) => $body);
            $( $crate::__pointwise_entries!(elementwise, $name, $ty); )+
        };
    };
}

/// A reduction: `sum = Σ body` over i < n, each argument bound as in
/// [`elementwise!`]; the caller gets the sum as a number.
///
/// ```ignore
/// erlcuda_kernel::reduction!(sumsq, [f32, f64], (x: v) => x * x);
/// ```
///
/// Manifest: `outs=sum:s:T blocks=chunks(n) threads=256 block_rule=pow2
/// shared=264`. On the GPU each thread adds at most `SERIAL` terms
/// serially, the block sums its threads' partials in a tree and adds the
/// result to the output (zeroed by gpud) with one `red.global.add`. On the
/// host the sum follows erlcuda's stated order ([`crate::host::sum`]).
#[macro_export]
macro_rules! reduction {
    ($(#[$m:meta])* $name:ident, [$($ty:ident),+ $(,)?], ($($arg:ident : $kind:ident),+ $(,)?) => $body:expr $(,)?) => {
        $(#[$m])*
        const _: () = {
            $crate::__legacy!(
                $name, Reduction, [$($ty),+], ($($arg : $kind),+),
                ("1", &[]), ("chunks", &[]), $crate::job::DEFAULT_THREADS, $crate::BLOCK_SHARED_BYTES
            );
            $crate::__pointwise_body!(($($arg : $kind),+) => $body);
            $( $crate::__pointwise_entries!(reduction, $name, $ty); )+
        };
    };
}

/// A job-table kernel of the fixed form: vectors of one length `n`, one
/// output of T, a GPU body run once per virtual block and a CPU body run
/// once per job. [`kernel!`] writes any other signature.
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
/// * `out`: `n`, `1` (given back as a number) or `n / D`; `blocks`:
///   `elements`, `chunks`, `one` or `n / D`, D being a `d` argument's name
///   (or `d0`, `d1`, ...); `threads` (a multiple of 32, ≤ 1024) and
///   `shared` (bytes) are constant expressions. The manifest says
///   `out:o:T:n` / `out:s:T` / `out:o:T:n/D`, `elements(n)` / `chunks(n)`
///   / `1` / `n/D`, `block_rule=warps`.
/// * In both bodies each argument is bound by name: a `v` to a `*const T`
///   (GPU: a device address, read with `T::ldg`/`T::ldg_nc`) or a `&[T]` of
///   `n` elements (CPU), an `s` to a `T`, a `d` to a `u32`; the named
///   [`crate::Args`] gives the rest (`output()`, `output_slice()`, `n()`,
///   `out_len()`, the raw job).
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
            $crate::__legacy!(
                $name, Table, [$($ty),+], ($($arg : $kind),+),
                (stringify!($o), &[$(stringify!($od))?]), (stringify!($b), &[$(stringify!($bd))?]),
                $threads, $shared
            );

            // Both targets: the host runs it on the CPU (`crate::emu`) where a
            // setting asks for the GPU body.
            #[inline(always)]
            #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
            unsafe fn __gpu<T: $crate::Float>($gk: $crate::Args<'_, T>, $gblock: u64) {
                // The device primitives by their plain names in the body.
                #[allow(unused_imports)]
                use $crate::device::*;
                let (mut __vi, mut __pi) = (0usize, 0usize);
                $( let $arg = $crate::__bind!(gpu $kind, $gk, __vi, __pi); )+
                unsafe { $gbody }
            }

            #[cfg(not(target_arch = "nvptx64"))]
            #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
            unsafe fn __cpu<T: $crate::Float>($ck: $crate::Args<'_, T>) {
                let (mut __vi, mut __pi) = (0usize, 0usize);
                $( let $arg = $crate::__bind!(cpu $kind, $ck, __vi, __pi); )+
                unsafe { $cbody }
            }

            $( $crate::__entries!($name, [Float], $ty, [cpu]); )+
        };
    };
}

// ------------------------------------------------------------ internals

/// `kernel!`'s `blocks = RULE`: its tokens, up to the comma before
/// `threads` (a rule holds no comma outside its parentheses).
#[doc(hidden)]
#[macro_export]
macro_rules! __kernel_blocks {
    (
        [$($head:tt)*] [$($b:tt)*]
        , threads = $threads:expr, block_rule = $rule:ident, shared = $shared:expr,
        gpu($gk:ident, $gb:ident) $gbody:block
        cpu($ck:ident) $cbody:block
        group_gpu($xg:ident, $xj:ident, $xb:ident, jobs_per_block = $jpb:expr) $xbody:block
        group_cpu($yg:ident, $yj:ident) $ybody:block
        $(,)?
    ) => {
        $crate::__kernel_expand!(
            $($head)* ; [$($b)*] ; $threads ; $rule ; $shared ;
            gpu($gk, $gb) $gbody cpu($ck) $cbody ;
            group [[$jpb] ($xg, $xj, $xb) $xbody ($yg, $yj) $ybody]
        );
    };
    (
        [$($head:tt)*] [$($b:tt)*]
        , threads = $threads:expr, block_rule = $rule:ident, shared = $shared:expr,
        gpu($gk:ident, $gb:ident) $gbody:block
        $(cpu($ck:ident) $cbody:block)?
        $(,)?
    ) => {
        $crate::__kernel_expand!(
            $($head)* ; [$($b)*] ; $threads ; $rule ; $shared ;
            gpu($gk, $gb) $gbody $(cpu($ck) $cbody)? ;
            group []
        );
    };
    ([$($head:tt)*] [$($b:tt)*] $t:tt $($rest:tt)*) => {
        $crate::__kernel_blocks!([$($head)*] [$($b)* $t] $($rest)*);
    };
    ([$($head:tt)*] [$($b:tt)*]) => {
        compile_error!(
            "erlcuda_kernel: after the signature, kernel! takes `blocks = RULE, threads = N, \
             block_rule = any|warps|pow2, shared = BYTES, gpu(k, block) { .. } [cpu(k) { .. }]`"
        );
    };
}

/// The expansion of a parsed `kernel!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __kernel_expand {
    (
        $(#[$m:meta])* $name:ident, [$($bound:ident)?], [$($ty:ident),*],
        ($($an:ident : $ak:ident $(( $($as:tt)* ))?),*) -> ($($on:ident : $ok:ident $(( $($os:tt)* ))?),*) ;
        [$($b:tt)*] ; $threads:expr ; $rule:ident ; $shared:expr ;
        gpu($gk:ident, $gb:ident) $gbody:block $(cpu($ck:ident) $cbody:block)?
        ; group [$($grp:tt)*]
    ) => {
        $(#[$m])*
        const _: () = {
            const __K: $crate::manifest::Kernel = match $crate::manifest::kernel(&$crate::manifest::Decl {
                name: stringify!($name),
                bound: concat!("" $(, stringify!($bound))?),
                types: &[$(stringify!($ty)),*],
                args: &[$($crate::__item!(arg $an $ak [$($($as)*)?])),*],
                outs: &[$($crate::__item!(out $on $ok [$($($os)*)?])),*],
                blocks: stringify!($($b)*),
                threads: $threads,
                block_rule: stringify!($rule),
                shared: $shared,
                group: $crate::__group_jobs!($($grp)*),
            }) {
                Ok(k) => k,
                Err(e) => panic!("{}", e.as_str()),
            };
            $crate::__manifest!(__K);

            $crate::__kernel_fn!(
                gpu [$($bound)?] [$($ck)?] ($gk, $gb) {
                    // The device primitives by their plain names in the body,
                    // and the element traits' methods on any element type.
                    #[allow(unused_imports)]
                    use $crate::device::*;
                    #[allow(unused_imports)]
                    use $crate::{Element as _, Float as _, Int as _, Numeric as _};
                    let (mut __vi, mut __pi, mut __oi) = (0usize, 0usize, 0usize);
                    $( let $an = $crate::__arg!(gpu $ak [$($($as)*)?], $gk, __vi, __pi); )*
                    $( let $on = $crate::__out!(gpu $ok [$($($os)*)?], $gk, __oi); )*
                    unsafe { $gbody }
                }
            );
            $crate::__kernel_cpu!(
                [$($bound)?] ($($an : $ak $(( $($as)* ))?),*) -> ($($on : $ok $(( $($os)* ))?),*)
                $(cpu($ck) $cbody)?
            );

            // The kernel's block size and shared bytes, for running the GPU
            // body on the host.
            #[cfg(not(target_arch = "nvptx64"))]
            #[allow(dead_code)]
            const __LAUNCH: (u32, u32) = ($threads, $shared);

            $crate::__kernel_entries!($name, [$($bound)?], [$($ty),*], [$($ck)?]);
            $crate::__group_fns!(
                [$($bound)?] [$($ty),*] $name ($($an : $ak $(( $($as)* ))?),*) -> ($($on : $ok $(( $($os)* ))?),*)
                $($grp)*
            );
        };
    };
}

/// `kernel!`'s `group` part: its jobs per block, 0 for none.
#[doc(hidden)]
#[macro_export]
macro_rules! __group_jobs {
    () => {
        0
    };
    ([$jpb:expr] $($rest:tt)*) => {
        $jpb
    };
}

/// A `kernel!`'s group bodies as `__ggpu` (both targets) and `__gcpu`
/// (host): the shared and same_ arguments bound by name (the group's: its
/// first job's), every other name bound to `()`, and `JOB` bound to a
/// closure giving job i's bindings as a tuple in declared order,
/// arguments then outputs (`()` in the shared and same_ places).
#[doc(hidden)]
#[macro_export]
macro_rules! __group_fns {
    ([$($bound:ident)?] [$($ty:ident),*] $name:ident ($($args:tt)*) -> ($($outs:tt)*)) => {};
    (
        [$bound:ident] [$($ty:ident),+] $name:ident ($($an:ident : $ak:ident $(( $($as:tt)* ))?),*) -> ($($on:ident : $ok:ident $(( $($os:tt)* ))?),*)
        [$jpb:expr] ($xg:ident, $xj:ident, $xb:ident) $xbody:block ($yg:ident, $yj:ident) $ybody:block
    ) => {
        #[allow(dead_code)]
        const __GROUP_JOBS: u32 = $jpb;
        $crate::__group_entries!($name, [$bound], [$($ty),+]);

        #[inline(always)]
        #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
        unsafe fn __ggpu<T: $crate::$bound>($xg: $crate::Group<'_, T>, $xb: u64) {
            #[allow(unused_imports)]
            use $crate::device::*;
            #[allow(unused_imports)]
            use $crate::{Element as _, Float as _, Int as _, Numeric as _};
            let __first = $xg.job(0);
            let (mut __vi, mut __pi) = (0usize, 0usize);
            $( let $an = $crate::__garg!(gpu $ak [$($($as)*)?], __first, __vi, __pi); )*
            let $xj = |__i: u32| {
                let __k = $xg.job(__i);
                let (mut __vi, mut __pi, mut __oi) = (0usize, 0usize, 0usize);
                ($( $crate::__jarg!(gpu $ak [$($($as)*)?], __k, __vi, __pi), )* $( $crate::__out!(gpu $ok [$($($os)*)?], __k, __oi), )*)
            };
            unsafe { $xbody }
        }

        #[cfg(not(target_arch = "nvptx64"))]
        #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
        unsafe fn __gcpu<T: $crate::$bound>($yg: $crate::Group<'_, T>) {
            #[allow(unused_imports)]
            use $crate::{Element as _, Float as _, Int as _, Numeric as _};
            let __first = $yg.job(0);
            let (mut __vi, mut __pi) = (0usize, 0usize);
            $( let $an = $crate::__garg!(cpu $ak [$($($as)*)?], __first, __vi, __pi); )*
            let $yj = |__i: u32| {
                let __k = $yg.job(__i);
                let (mut __vi, mut __pi, mut __oi) = (0usize, 0usize, 0usize);
                ($( $crate::__jarg!(cpu $ak [$($($as)*)?], __k, __vi, __pi), )* $( $crate::__out!(cpu $ok [$($($os)*)?], __k, __oi), )*)
            };
            unsafe { $ybody }
        }
    };
    ([] [] $($rest:tt)*) => {
        compile_error!("erlcuda_kernel: group bodies need a kernel with T (T: Bound in [types])");
    };
}

/// A group body's binding of an argument by name: a shared or same_ one
/// as [`__arg!`] binds it, any other `()` (its counter still moves on).
#[doc(hidden)]
#[macro_export]
macro_rules! __garg {
    ($side:ident shared [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {
        $crate::__arg!($side shared [$($x)*], $k, $vi, $pi)
    };
    ($side:ident same_d [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {
        $crate::__arg!($side same_d [$($x)*], $k, $vi, $pi)
    };
    ($side:ident same_s [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {
        $crate::__arg!($side same_s [$($x)*], $k, $vi, $pi)
    };
    ($side:ident $kind:ident [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {{
        let _ = $crate::__arg!($side $kind [$($x)*], $k, $vi, $pi);
    }};
}

/// A group body's per-job binding: the opposite of [`__garg!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __jarg {
    ($side:ident shared [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {{
        $vi += 1;
    }};
    ($side:ident same_d [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {{
        $pi += 1;
    }};
    ($side:ident same_s [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {{
        $pi += 1;
    }};
    ($side:ident $kind:ident [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {
        $crate::__arg!($side $kind [$($x)*], $k, $vi, $pi)
    };
}

/// The group entries of a `kernel!` with group bodies, per type:
/// `NAME_TY__group` (the PTX entry, the job-table ABI of every entry:
/// `ceil(njobs / jobs_per_block)` virtual blocks), and on the host
/// `erlcuda_hostgroup_NAME_TY(jobs, njobs)` (the CPU body, the whole
/// group at once) and `erlcuda_hostgpugroup_NAME_TY(jobs, njobs, fault)
/// -> u32` (the GPU body on the CPU, as [`crate::job::HostGpuFn`]).
#[doc(hidden)]
#[macro_export]
#[allow_internal_unstable(abi_ptx)]
macro_rules! __group_entries {
    ($name:ident, [$bound:ident], [$($ty:ident),+]) => {
        $( const _: () = {
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(export_name = concat!(stringify!($name), "_", stringify!($ty), "__group"))]
            unsafe extern "ptx-kernel" fn __gentry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_group(jobs, njobs, total_blocks, __GROUP_JOBS, |first, n, block| {
                    __ggpu::<$crate::__rty!($ty)>($crate::Group::new(first, n, &__LAYOUT), block)
                })
            }
            #[cfg(not(target_arch = "nvptx64"))]
            unsafe fn __gentry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_group(jobs, njobs, total_blocks, __GROUP_JOBS, |first, n, block| {
                    __ggpu::<$crate::__rty!($ty)>($crate::Group::new(first, n, &__LAYOUT), block)
                })
            }
            #[cfg(not(target_arch = "nvptx64"))]
            #[unsafe(export_name = concat!("erlcuda_hostgroup_", stringify!($name), "_", stringify!($ty)))]
            unsafe extern "C" fn __host_group(jobs: *const $crate::Job, njobs: u32) {
                __gcpu::<$crate::__rty!($ty)>($crate::Group::new(jobs, njobs, &__LAYOUT))
            }
            #[cfg(not(target_arch = "nvptx64"))]
            #[unsafe(export_name = concat!("erlcuda_hostgpugroup_", stringify!($name), "_", stringify!($ty)))]
            unsafe extern "C" fn __host_gpu_group(jobs: *const $crate::Job, njobs: u32, fault: *mut $crate::job::Fault) -> u32 {
                $crate::host::run_gpu_group(jobs, njobs, __LAUNCH, __GROUP_JOBS, &mut *fault, |j, n, t| __gentry(j, n, t))
            }
        }; )+
    };
    ($name:ident, [], []) => {};
}

/// A `kernel!`'s CPU body as `__cpu`, its arguments bound by name; nothing
/// for a kernel with only a GPU body.
#[doc(hidden)]
#[macro_export]
macro_rules! __kernel_cpu {
    (
        [$($bound:ident)?] ($($an:ident : $ak:ident $(( $($as:tt)* ))?),*) -> ($($on:ident : $ok:ident $(( $($os:tt)* ))?),*)
        cpu($ck:ident) $cbody:block
    ) => {
        $crate::__kernel_fn!(
            cpu [$($bound)?] ($ck) {
                #[allow(unused_imports)]
                use $crate::{Element as _, Float as _, Int as _, Numeric as _};
                let (mut __vi, mut __pi, mut __oi) = (0usize, 0usize, 0usize);
                $( let $an = $crate::__arg!(cpu $ak [$($($as)*)?], $ck, __vi, __pi); )*
                $( let $on = $crate::__out!(cpu $ok [$($($os)*)?], $ck, __oi); )*
                unsafe { $cbody }
            }
        );
    };
    ([$($bound:ident)?] ($($args:tt)*) -> ($($outs:tt)*)) => {};
}

/// One `kernel!` item as a [`crate::manifest::Item`]; a malformed one gets
/// a kind `manifest::kernel` refuses, with the rule in its message.
#[doc(hidden)]
#[macro_export]
macro_rules! __item {
    ($side:ident $n:ident $k:ident [$ty:ident, $($len:tt)+]) => {
        $crate::manifest::Item { name: stringify!($n), kind: stringify!($k), ty: stringify!($ty), len: stringify!($($len)+) }
    };
    ($side:ident $n:ident $k:ident [$ty:ident]) => {
        $crate::manifest::Item { name: stringify!($n), kind: stringify!($k), ty: stringify!($ty), len: "" }
    };
    ($side:ident $n:ident $k:ident []) => {
        $crate::manifest::Item { name: stringify!($n), kind: stringify!($k), ty: "", len: "" }
    };
    // A dimension's range, `d(1..=cols & 64)`: in `ty`, which a d has no
    // other use for.
    (arg $n:ident d [$($range:tt)+]) => {
        $crate::manifest::Item { name: stringify!($n), kind: "d", ty: stringify!($($range)+), len: "" }
    };
    (arg $n:ident same_d [$($range:tt)+]) => {
        $crate::manifest::Item { name: stringify!($n), kind: "same_d", ty: stringify!($($range)+), len: "" }
    };
    ($side:ident $n:ident $k:ident [$($other:tt)*]) => {
        $crate::manifest::Item { name: stringify!($n), kind: "?", ty: "", len: "" }
    };
}

/// The Rust type of an element type name (T stays T).
#[doc(hidden)]
#[macro_export]
macro_rules! __rty {
    (T) => { T };
    (u8) => { u8 };
    (s32) => { i32 };
    (u32) => { u32 };
    (s64) => { i64 };
    (f32) => { f32 };
    (f64) => { f64 };
    ($other:ident) => { () };
}

/// A `kernel!` body as a function: generic over `T: Bound`, or not (no T,
/// `Args<'_, ()>`).
#[doc(hidden)]
#[macro_export]
macro_rules! __kernel_fn {
    // The GPU body, for both targets: the host runs it on the CPU
    // (`crate::emu`), alone or where a setting asks for it instead of the
    // CPU body.
    (gpu [$bound:ident] [$($ck:ident)?] ($k:ident, $b:ident) $body:tt) => {
        #[inline(always)]
        #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
        unsafe fn __gpu<T: $crate::$bound>($k: $crate::Args<'_, T>, $b: u64) $body
    };
    (gpu [] [$($ck:ident)?] ($k:ident, $b:ident) $body:tt) => {
        #[inline(always)]
        #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
        unsafe fn __gpu($k: $crate::Args<'_, ()>, $b: u64) $body
    };
    (cpu [$bound:ident] ($k:ident) $body:tt) => {
        #[cfg(not(target_arch = "nvptx64"))]
        #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
        unsafe fn __cpu<T: $crate::$bound>($k: $crate::Args<'_, T>) $body
    };
    (cpu [] ($k:ident) $body:tt) => {
        #[cfg(not(target_arch = "nvptx64"))]
        #[allow(unused_assignments, unused_mut, unused_variables, unused_unsafe, non_snake_case, clippy::all)]
        unsafe fn __cpu($k: $crate::Args<'_, ()>) $body
    };
}

/// A `kernel!` argument's binding: v and io take the next vector slot, s
/// and d the next parameter (the order `Sig::parse` numbers them in).
#[doc(hidden)]
#[macro_export]
macro_rules! __arg {
    (gpu v [$ty:ident, $($len:tt)+], $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.ptr::<$crate::__rty!($ty)>($vi) as *const $crate::__rty!($ty);
        $vi += 1;
        x
    }};
    (gpu io [$ty:ident, $($len:tt)+], $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.ptr::<$crate::__rty!($ty)>($vi);
        $vi += 1;
        x
    }};
    (cpu v [$ty:ident, $($len:tt)+], $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.slice::<$crate::__rty!($ty)>($vi);
        $vi += 1;
        x
    }};
    (cpu io [$ty:ident, $($len:tt)+], $k:ident, $vi:ident, $pi:ident) => {{
        // SAFETY: an io argument is a buffer of its own (gpud refuses one
        // that overlaps another argument), bound once.
        let x = unsafe { $k.slice_mut::<$crate::__rty!($ty)>($vi) };
        $vi += 1;
        x
    }};
    ($side:ident shared [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {
        $crate::__arg!($side v [$($x)*], $k, $vi, $pi)
    };
    ($side:ident same_d [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {
        $crate::__arg!($side d [$($x)*], $k, $vi, $pi)
    };
    ($side:ident same_s [$($x:tt)*], $k:ident, $vi:ident, $pi:ident) => {
        $crate::__arg!($side s [$($x)*], $k, $vi, $pi)
    };
    ($side:ident s [$ty:ident], $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.param_as::<$crate::__rty!($ty)>($pi);
        $pi += 1;
        x
    }};
    ($side:ident d [$($range:tt)*], $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.param($pi) as u32;
        $pi += 1;
        x
    }};
    ($($other:tt)*) => {
        ()
    };
}

/// A `kernel!` output's binding: the next output slot.
#[doc(hidden)]
#[macro_export]
macro_rules! __out {
    (gpu $kind:ident [$ty:ident $(, $($len:tt)+)?], $k:ident, $oi:ident) => {{
        let x = $k.ptr::<$crate::__rty!($ty)>($crate::manifest::out_slot($oi));
        $oi += 1;
        x
    }};
    (cpu $kind:ident [$ty:ident $(, $($len:tt)+)?], $k:ident, $oi:ident) => {{
        // SAFETY: outputs overlap nothing, and each is bound once.
        let x = unsafe { $k.slice_mut::<$crate::__rty!($ty)>($crate::manifest::out_slot($oi)) };
        $oi += 1;
        x
    }};
    ($($other:tt)*) => {
        ()
    };
}

/// The entries of a `kernel!`: one per type (`NAME_TY`), or one
/// (`NAME`) for a kernel with no T.
#[doc(hidden)]
#[macro_export]
#[allow_internal_unstable(abi_ptx)]
macro_rules! __kernel_entries {
    ($name:ident, [$bound:ident], [$($ty:ident),+], $cpu:tt) => {
        $( $crate::__entries!($name, [$bound], $ty, $cpu); )+
    };
    ($name:ident, [], [], []) => {
        const _: () = {
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(export_name = stringify!($name))]
            unsafe extern "ptx-kernel" fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_block(jobs, njobs, total_blocks, |job, block| {
                    __gpu($crate::Args::new(job, &__LAYOUT), block)
                })
            }
            #[cfg(not(target_arch = "nvptx64"))]
            unsafe fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_block(jobs, njobs, total_blocks, |job, block| {
                    __gpu($crate::Args::new(job, &__LAYOUT), block)
                })
            }
            $crate::__host_gpu_entry!(concat!("erlcuda_hostgpu_", stringify!($name)), ());
        };
    };
    ($name:ident, [], [], [$ck:ident]) => {
        const _: () = {
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(export_name = stringify!($name))]
            unsafe extern "ptx-kernel" fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_block(jobs, njobs, total_blocks, |job, block| {
                    __gpu($crate::Args::new(job, &__LAYOUT), block)
                })
            }
            #[cfg(not(target_arch = "nvptx64"))]
            unsafe fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_block(jobs, njobs, total_blocks, |job, block| {
                    __gpu($crate::Args::new(job, &__LAYOUT), block)
                })
            }
            $crate::__host_gpu_entry!(concat!("erlcuda_hostgpu_", stringify!($name)), ());

            #[cfg(not(target_arch = "nvptx64"))]
            #[unsafe(export_name = concat!("erlcuda_host_", stringify!($name)))]
            unsafe extern "C" fn __host(job: *const $crate::Job) {
                $crate::host::run::<()>(&*job, &__LAYOUT, |k| __cpu(k))
            }
        };
    };
}

/// The entries of a `kernel!` or `table!` for one type.
#[doc(hidden)]
#[macro_export]
#[allow_internal_unstable(abi_ptx)]
macro_rules! __entries {
    ($name:ident, [$bound:ident], $ty:ident, []) => {
        const _: () = {
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(export_name = concat!(stringify!($name), "_", stringify!($ty)))]
            unsafe extern "ptx-kernel" fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_block(jobs, njobs, total_blocks, |job, block| {
                    __gpu::<$crate::__rty!($ty)>($crate::Args::new(job, &__LAYOUT), block)
                })
            }
            #[cfg(not(target_arch = "nvptx64"))]
            unsafe fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_block(jobs, njobs, total_blocks, |job, block| {
                    __gpu::<$crate::__rty!($ty)>($crate::Args::new(job, &__LAYOUT), block)
                })
            }
            $crate::__host_gpu_entry!(concat!("erlcuda_hostgpu_", stringify!($name), "_", stringify!($ty)), $crate::__rty!($ty));
        };
    };
    ($name:ident, [$bound:ident], $ty:ident, [$ck:ident]) => {
        const _: () = {
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(export_name = concat!(stringify!($name), "_", stringify!($ty)))]
            unsafe extern "ptx-kernel" fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_block(jobs, njobs, total_blocks, |job, block| {
                    __gpu::<$crate::__rty!($ty)>($crate::Args::new(job, &__LAYOUT), block)
                })
            }
            #[cfg(not(target_arch = "nvptx64"))]
            unsafe fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::each_block(jobs, njobs, total_blocks, |job, block| {
                    __gpu::<$crate::__rty!($ty)>($crate::Args::new(job, &__LAYOUT), block)
                })
            }
            $crate::__host_gpu_entry!(concat!("erlcuda_hostgpu_", stringify!($name), "_", stringify!($ty)), $crate::__rty!($ty));

            #[cfg(not(target_arch = "nvptx64"))]
            #[unsafe(export_name = concat!("erlcuda_host_", stringify!($name), "_", stringify!($ty)))]
            unsafe extern "C" fn __host(job: *const $crate::Job) {
                $crate::host::run::<$crate::__rty!($ty)>(&*job, &__LAYOUT, |k| __cpu::<$crate::__rty!($ty)>(k))
            }
        };
    };
}

/// The host entry that runs a kernel's GPU body on the CPU
/// ([`crate::host::run_gpu`]): `erlcuda_hostgpu_NAME[_TY](job, fault) ->
/// u32` ([`crate::job::HostGpuFn`]); `$t` the kernel's T (`()`: none).
#[doc(hidden)]
#[macro_export]
macro_rules! __host_gpu_entry {
    ($sym:expr, $t:ty) => {
        #[cfg(not(target_arch = "nvptx64"))]
        #[unsafe(export_name = $sym)]
        unsafe extern "C" fn __host_gpu(job: *const $crate::Job, fault: *mut $crate::job::Fault) -> u32 {
            // T's size: the unit of the arguments of type T (`()`: none).
            let t_bytes = ::core::mem::size_of::<$t>() as u64;
            $crate::host::run_gpu(&*job, &__K.sig, &__K.blocks, __LAUNCH, t_bytes, &mut *fault, |j, n, t| __entry(j, n, t))
        }
    };
}

/// `__LAYOUT` of the checked kernel `$k`, its evaluation forced on every
/// target (so a bad declaration fails the GPU build too), and on the host
/// its manifest line in the section, at the line's own length.
#[doc(hidden)]
#[macro_export]
macro_rules! __manifest {
    ($k:ident) => {
        #[allow(dead_code)]
        const __LAYOUT: $crate::manifest::Layout = $k.layout;
        const _: usize = $k.line.len();
        // The section name is manifest::SECTION (an attribute takes a literal).
        #[cfg(not(target_arch = "nvptx64"))]
        #[used]
        #[unsafe(link_section = "erlcuda_manifest")]
        static __MANIFEST: [u8; $k.line.len()] = $k.line.exact();
    };
}

/// The checked kernel of an `elementwise!`, `reduction!` or `table!`
/// ([`crate::manifest::legacy`]), and the constants their entries use:
/// `__NV` vectors, `__NS` scalars.
#[doc(hidden)]
#[macro_export]
macro_rules! __legacy {
    ($name:ident, $shape:ident, [$($ty:ident),+], ($($arg:ident : $kind:ident),+),
     $out:expr, $blocks:expr, $threads:expr, $shared:expr) => {
        const __K: $crate::manifest::Kernel = match $crate::manifest::legacy(
            stringify!($name),
            $crate::manifest::Shape::$shape,
            &[$(stringify!($ty)),+],
            &[$((stringify!($arg), stringify!($kind))),+],
            $out,
            $blocks,
            $threads,
            $shared,
        ) {
            Ok(k) => k,
            Err(e) => panic!("{}", e.as_str()),
        };
        $crate::__manifest!(__K);
        #[allow(dead_code)]
        const __NV: usize = __LAYOUT.vectors as usize;
        #[cfg(not(target_arch = "nvptx64"))]
        #[allow(dead_code)]
        const __LAUNCH: (u32, u32) = ($threads, $shared);
        #[allow(dead_code)]
        const __NS: usize = __LAYOUT.scalars as usize;
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

/// Argument binding of the `table!` bodies: a `v` the next vector slot, an
/// `s` or `d` the next parameter.
#[doc(hidden)]
#[macro_export]
macro_rules! __bind {
    (gpu v, $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.input($vi);
        $vi += 1;
        x
    }};
    (cpu v, $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.input_slice($vi);
        $vi += 1;
        x
    }};
    ($side:ident s, $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.param_as::<T>($pi);
        $pi += 1;
        x
    }};
    ($side:ident d, $k:ident, $vi:ident, $pi:ident) => {{
        let x = $k.param($pi) as u32;
        $pi += 1;
        x
    }};
    ($side:ident $other:ident, $k:ident, $vi:ident, $pi:ident) => {
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
                $crate::gpu::$shape::<$ty, __NV, __NS>(jobs, njobs, total_blocks, __body::<$ty>)
            }

            // The same on the host, where a setting runs the GPU code on the
            // CPU (`crate::emu`).
            #[cfg(not(target_arch = "nvptx64"))]
            unsafe fn __entry(jobs: *const $crate::Job, njobs: u32, total_blocks: u32) {
                $crate::gpu::$shape::<$ty, __NV, __NS>(jobs, njobs, total_blocks, __body::<$ty>)
            }
            $crate::__host_gpu_entry!(concat!("erlcuda_hostgpu_", stringify!($name), "_", stringify!($ty)), $ty);

            #[cfg(not(target_arch = "nvptx64"))]
            #[unsafe(export_name = concat!("erlcuda_host_", stringify!($name), "_", stringify!($ty)))]
            unsafe extern "C" fn __host(job: *const $crate::Job) {
                $crate::host::$shape::<$ty, __NV, __NS>(&*job, __body::<$ty>)
            }
        };
    };
}
