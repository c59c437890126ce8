//! Atomics (cuda_std's `atomic`, CubeCL's `Atomic<T>`): each returns the
//! value it replaced.
//!
//! | operation | types |
//! |---|---|
//! | [`add`] | u32, i32, u64, i64, f32, f64 |
//! | [`min`], [`max`] | u32, i32, u64, i64 |
//! | [`exch`], [`cas`] | u32, i32, u64, i64, f32, f64 (by their bits) |
//!
//! On nvptx64 `p` is a generic pointer into global memory (PTX
//! `atom.global`, relaxed, GPU scope); the `*_shared` forms take a
//! shared-window address ([`crate::shared::SharedArray::addr`], `atom.shared`).
//! Integer adds wrap. On the host (the CPU backend) they are
//! `core::sync::atomic` operations on the same memory, relaxed, so a host
//! body run on several threads gets the same meaning; the float add is a
//! compare-and-swap loop there.

use crate::element::Element;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// Elements with an atomic add: u32, i32, u64, i64, f32, f64.
pub trait AtomicAdd: Element {
    #[doc(hidden)]
    unsafe fn atomic_add(p: *mut Self, v: Self) -> Self;
    #[doc(hidden)]
    #[cfg(target_arch = "nvptx64")]
    unsafe fn atomic_add_shared(a: u32, v: Self) -> Self;
}

/// Elements with atomic min and max: u32, i32, u64, i64.
pub trait AtomicMinMax: Element {
    #[doc(hidden)]
    unsafe fn atomic_min(p: *mut Self, v: Self) -> Self;
    #[doc(hidden)]
    unsafe fn atomic_max(p: *mut Self, v: Self) -> Self;
    #[doc(hidden)]
    #[cfg(target_arch = "nvptx64")]
    unsafe fn atomic_min_shared(a: u32, v: Self) -> Self;
    #[doc(hidden)]
    #[cfg(target_arch = "nvptx64")]
    unsafe fn atomic_max_shared(a: u32, v: Self) -> Self;
}

/// Elements of 4 or 8 bytes, exchanged and compared by their bits.
pub trait AtomicBits: Element {
    #[doc(hidden)]
    unsafe fn atomic_exch(p: *mut Self, v: Self) -> Self;
    #[doc(hidden)]
    unsafe fn atomic_cas(p: *mut Self, expected: Self, new: Self) -> Self;
    #[doc(hidden)]
    #[cfg(target_arch = "nvptx64")]
    unsafe fn atomic_exch_shared(a: u32, v: Self) -> Self;
    #[doc(hidden)]
    #[cfg(target_arch = "nvptx64")]
    unsafe fn atomic_cas_shared(a: u32, expected: Self, new: Self) -> Self;
}

/// `*p += v`; returns the old value.
///
/// # Safety
/// `p` points to a `T` (in global memory on the GPU) that is only accessed
/// atomically meanwhile.
#[inline(always)]
pub unsafe fn add<T: AtomicAdd>(p: *mut T, v: T) -> T {
    T::atomic_add(p, v)
}

/// `*p = min(*p, v)`; returns the old value.
///
/// # Safety
/// As [`add`].
#[inline(always)]
pub unsafe fn min<T: AtomicMinMax>(p: *mut T, v: T) -> T {
    T::atomic_min(p, v)
}

/// `*p = max(*p, v)`; returns the old value.
///
/// # Safety
/// As [`add`].
#[inline(always)]
pub unsafe fn max<T: AtomicMinMax>(p: *mut T, v: T) -> T {
    T::atomic_max(p, v)
}

/// `*p = v`; returns the old value.
///
/// # Safety
/// As [`add`].
#[inline(always)]
pub unsafe fn exch<T: AtomicBits>(p: *mut T, v: T) -> T {
    T::atomic_exch(p, v)
}

/// `*p = new` if `*p` has the bits of `expected`; returns the old value
/// (the swap happened when its bits are `expected`'s).
///
/// # Safety
/// As [`add`].
#[inline(always)]
pub unsafe fn cas<T: AtomicBits>(p: *mut T, expected: T, new: T) -> T {
    T::atomic_cas(p, expected, new)
}

/// [`add`] on shared memory at shared-window address `a`.
///
/// # Safety
/// `a` holds a `T` of this block's shared memory.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn add_shared<T: AtomicAdd>(a: u32, v: T) -> T {
    T::atomic_add_shared(a, v)
}

/// [`min`] on shared memory.
///
/// # Safety
/// As [`add_shared`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn min_shared<T: AtomicMinMax>(a: u32, v: T) -> T {
    T::atomic_min_shared(a, v)
}

/// [`max`] on shared memory.
///
/// # Safety
/// As [`add_shared`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn max_shared<T: AtomicMinMax>(a: u32, v: T) -> T {
    T::atomic_max_shared(a, v)
}

/// [`exch`] on shared memory.
///
/// # Safety
/// As [`add_shared`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn exch_shared<T: AtomicBits>(a: u32, v: T) -> T {
    T::atomic_exch_shared(a, v)
}

/// [`cas`] on shared memory.
///
/// # Safety
/// As [`add_shared`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn cas_shared<T: AtomicBits>(a: u32, expected: T, new: T) -> T {
    T::atomic_cas_shared(a, expected, new)
}

// ------------------------------------------------- host: shared memory

/// The emulated shared memory at address `a` as a `T` ([`crate::emu`]).
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
fn shared_at<T: Element>(a: u32) -> *mut T {
    crate::emu::shared_ptr(a, T::BYTES as usize).cast()
}

/// [`add`] on the emulated block's shared memory.
///
/// # Safety
/// `a` holds a `T` of this block's shared memory.
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub unsafe fn add_shared<T: AtomicAdd>(a: u32, v: T) -> T {
    T::atomic_add(shared_at(a), v)
}

/// [`min`] on the emulated block's shared memory.
///
/// # Safety
/// As [`add_shared`].
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub unsafe fn min_shared<T: AtomicMinMax>(a: u32, v: T) -> T {
    T::atomic_min(shared_at(a), v)
}

/// [`max`] on the emulated block's shared memory.
///
/// # Safety
/// As [`add_shared`].
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub unsafe fn max_shared<T: AtomicMinMax>(a: u32, v: T) -> T {
    T::atomic_max(shared_at(a), v)
}

/// [`exch`] on the emulated block's shared memory.
///
/// # Safety
/// As [`add_shared`].
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub unsafe fn exch_shared<T: AtomicBits>(a: u32, v: T) -> T {
    T::atomic_exch(shared_at(a), v)
}

/// [`cas`] on the emulated block's shared memory.
///
/// # Safety
/// As [`add_shared`].
#[cfg(not(target_arch = "nvptx64"))]
#[track_caller]
pub unsafe fn cas_shared<T: AtomicBits>(a: u32, expected: T, new: T) -> T {
    T::atomic_cas(shared_at(a), expected, new)
}

/// `*p += v` for f32 or f64 by a compare-and-swap loop on the bits: the
/// host form of [`crate::Float::red_add`].
#[cfg(not(target_arch = "nvptx64"))]
pub(crate) unsafe fn add_bits<T: crate::Float>(p: *mut T, v: T) {
    let p = crate::emu::global_mut(p);
    if T::BYTES == 4 {
        let a = AtomicU32::from_ptr(p.cast());
        let _ = a.fetch_update(Relaxed, Relaxed, |b| Some((T::from_bits64(b.into()) + v).to_bits64() as u32));
    } else {
        let a = AtomicU64::from_ptr(p.cast());
        let _ = a.fetch_update(Relaxed, Relaxed, |b| Some((T::from_bits64(b) + v).to_bits64()));
    }
}

// ------------------------------------------------------------ nvptx64

/// One `atom` operation in global and shared memory: `$f`/`$fs` the trait
/// methods, `$op` and `$ty` the PTX operation and type (`add`, `u32`).
#[cfg(target_arch = "nvptx64")]
macro_rules! atom_op {
    ($t:ty, $reg:ident, $f:ident, $fs:ident, $op:literal, $ty:literal) => {
        #[inline(always)]
        unsafe fn $f(p: *mut $t, v: $t) -> $t {
            let old: $t;
            asm!(concat!("cvta.to.global.u64 {t}, {p}; atom.global.", $op, ".", $ty, " {o}, [{t}], {v};"),
                 t = out(reg64) _, p = in(reg64) p, v = in($reg) v, o = out($reg) old,
                 options(nostack, preserves_flags));
            old
        }
        #[inline(always)]
        unsafe fn $fs(a: u32, v: $t) -> $t {
            let old: $t;
            asm!(concat!("atom.shared.", $op, ".", $ty, " {o}, [{a}], {v};"),
                 a = in(reg32) a, v = in($reg) v, o = out($reg) old,
                 options(nostack, preserves_flags));
            old
        }
    };
}

#[cfg(target_arch = "nvptx64")]
macro_rules! atom_cas {
    ($t:ty, $reg:ident, $b:literal) => {
        #[inline(always)]
        unsafe fn atomic_cas(p: *mut $t, e: $t, n: $t) -> $t {
            let old: $t;
            asm!(concat!("cvta.to.global.u64 {t}, {p}; atom.global.cas.", $b, " {o}, [{t}], {e}, {n};"),
                 t = out(reg64) _, p = in(reg64) p, e = in($reg) e, n = in($reg) n, o = out($reg) old,
                 options(nostack, preserves_flags));
            old
        }
        #[inline(always)]
        unsafe fn atomic_cas_shared(a: u32, e: $t, n: $t) -> $t {
            let old: $t;
            asm!(concat!("atom.shared.cas.", $b, " {o}, [{a}], {e}, {n};"),
                 a = in(reg32) a, e = in($reg) e, n = in($reg) n, o = out($reg) old,
                 options(nostack, preserves_flags));
            old
        }
    };
}

/// `$add`: the PTX add type (`u64` for i64: PTX has no `add.s64`, and a
/// two's-complement add is the same bits).
#[cfg(target_arch = "nvptx64")]
macro_rules! atomic_int {
    ($t:ty, $reg:ident, $add:literal, $ord:literal, $b:literal) => {
        impl AtomicAdd for $t {
            atom_op!($t, $reg, atomic_add, atomic_add_shared, "add", $add);
        }
        impl AtomicMinMax for $t {
            atom_op!($t, $reg, atomic_min, atomic_min_shared, "min", $ord);
            atom_op!($t, $reg, atomic_max, atomic_max_shared, "max", $ord);
        }
        impl AtomicBits for $t {
            atom_op!($t, $reg, atomic_exch, atomic_exch_shared, "exch", $b);
            atom_cas!($t, $reg, $b);
        }
    };
}

#[cfg(target_arch = "nvptx64")]
macro_rules! atomic_float {
    ($t:ty, $reg:ident, $ty:literal, $b:literal) => {
        impl AtomicAdd for $t {
            atom_op!($t, $reg, atomic_add, atomic_add_shared, "add", $ty);
        }
        impl AtomicBits for $t {
            atom_op!($t, $reg, atomic_exch, atomic_exch_shared, "exch", $b);
            atom_cas!($t, $reg, $b);
        }
    };
}

#[cfg(target_arch = "nvptx64")]
atomic_int!(u32, reg32, "u32", "u32", "b32");
#[cfg(target_arch = "nvptx64")]
atomic_int!(i32, reg32, "s32", "s32", "b32");
#[cfg(target_arch = "nvptx64")]
atomic_int!(u64, reg64, "u64", "u64", "b64");
#[cfg(target_arch = "nvptx64")]
atomic_int!(i64, reg64, "u64", "s64", "b64");
#[cfg(target_arch = "nvptx64")]
atomic_float!(f32, reg32, "f32", "b32");
#[cfg(target_arch = "nvptx64")]
atomic_float!(f64, reg64, "f64", "b64");

// ---------------------------------------------------------------- host

#[cfg(not(target_arch = "nvptx64"))]
use core::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

#[cfg(not(target_arch = "nvptx64"))]
macro_rules! atomic_int {
    ($t:ty, $a:ident) => {
        impl AtomicAdd for $t {
            #[inline(always)]
            unsafe fn atomic_add(p: *mut $t, v: $t) -> $t {
                $a::from_ptr(crate::emu::global_mut(p)).fetch_add(v, Relaxed)
            }
        }
        impl AtomicMinMax for $t {
            #[inline(always)]
            unsafe fn atomic_min(p: *mut $t, v: $t) -> $t {
                $a::from_ptr(crate::emu::global_mut(p)).fetch_min(v, Relaxed)
            }
            #[inline(always)]
            unsafe fn atomic_max(p: *mut $t, v: $t) -> $t {
                $a::from_ptr(crate::emu::global_mut(p)).fetch_max(v, Relaxed)
            }
        }
        impl AtomicBits for $t {
            #[inline(always)]
            unsafe fn atomic_exch(p: *mut $t, v: $t) -> $t {
                $a::from_ptr(crate::emu::global_mut(p)).swap(v, Relaxed)
            }
            #[inline(always)]
            unsafe fn atomic_cas(p: *mut $t, e: $t, n: $t) -> $t {
                match $a::from_ptr(crate::emu::global_mut(p)).compare_exchange(e, n, Relaxed, Relaxed) {
                    Ok(old) | Err(old) => old,
                }
            }
        }
    };
}

#[cfg(not(target_arch = "nvptx64"))]
macro_rules! atomic_float {
    ($t:ident, $a:ident) => {
        impl AtomicAdd for $t {
            #[inline(always)]
            unsafe fn atomic_add(p: *mut $t, v: $t) -> $t {
                let a = $a::from_ptr(crate::emu::global_mut(p).cast());
                let mut old = a.load(Relaxed);
                loop {
                    let new = ($t::from_bits(old) + v).to_bits();
                    match a.compare_exchange_weak(old, new, Relaxed, Relaxed) {
                        Ok(_) => return $t::from_bits(old),
                        Err(cur) => old = cur,
                    }
                }
            }
        }
        impl AtomicBits for $t {
            #[inline(always)]
            unsafe fn atomic_exch(p: *mut $t, v: $t) -> $t {
                $t::from_bits($a::from_ptr(crate::emu::global_mut(p).cast()).swap(v.to_bits(), Relaxed))
            }
            #[inline(always)]
            unsafe fn atomic_cas(p: *mut $t, e: $t, n: $t) -> $t {
                match $a::from_ptr(crate::emu::global_mut(p).cast()).compare_exchange(e.to_bits(), n.to_bits(), Relaxed, Relaxed) {
                    Ok(old) | Err(old) => $t::from_bits(old),
                }
            }
        }
    };
}

#[cfg(not(target_arch = "nvptx64"))]
atomic_int!(u32, AtomicU32);
#[cfg(not(target_arch = "nvptx64"))]
atomic_int!(i32, AtomicI32);
#[cfg(not(target_arch = "nvptx64"))]
atomic_int!(u64, AtomicU64);
#[cfg(not(target_arch = "nvptx64"))]
atomic_int!(i64, AtomicI64);
#[cfg(not(target_arch = "nvptx64"))]
atomic_float!(f32, AtomicU32);
#[cfg(not(target_arch = "nvptx64"))]
atomic_float!(f64, AtomicU64);
