//! The element types of kernels, as a trait family (CubeCL's shape):
//!
//! * [`Element`]: anything a vector holds (u8, i32, u32, i64, u64, f32,
//!   f64): its signature name and size, its raw bits (for shuffles and
//!   compare-and-swap) and, on nvptx64, its global and shared loads and
//!   stores;
//! * [`Numeric`]: an element with arithmetic, an order, a zero, a one and
//!   the identities of max and min, so one body serves integers and floats;
//! * [`Int`] and [`crate::Float`]: what only integers or only floats have.
//!
//! Names that the primitive types already have (`max`, `MIN`, `to_bits`)
//! are not reused: a concrete `u32` keeps `Ord::max` unambiguous wherever
//! these traits are imported. Generic code writes `a.maximum(b)`;
//! `T: Float` bodies keep `a.max(b)` as before.
//!
//! Global accesses (nvptx64) convert the generic pointer with
//! `cvta.to.global` so the PTX uses `ld.global`/`st.global` (pointers read
//! from a job table are generic and LLVM cannot infer their address
//! space); `load_nc` goes through the read-only path, for data nobody
//! writes during the kernel. Shared accesses take the 32-bit address in the
//! shared window ([`crate::device::smem_base`], [`crate::shared`]).

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;
use core::fmt::Debug;
use core::ops::{
    Add, AddAssign, BitAnd, BitOr, BitXor, Div, DivAssign, Mul, MulAssign, Not, Rem, Shl, Shr, Sub, SubAssign,
};

/// A type a vector can hold.
pub trait Element: Copy + Default + Debug + PartialEq + PartialOrd + Send + Sync + 'static {
    /// The type's name in erlcuda's signatures and entry names: `u8`,
    /// `s32`, `u32`, `s64`, `u64`, `f32`, `f64`.
    const NAME: &'static str;
    /// Size in bytes.
    const BYTES: u32;

    /// The raw bits, zero-extended.
    fn to_bits64(self) -> u64;
    /// The value whose bits are the low [`Element::BYTES`] bytes of `b`.
    fn from_bits64(b: u64) -> Self;
    /// A scalar argument of this type from its job parameter
    /// ([`crate::Job::param`]): a float's parameter is the bits of an f64,
    /// rounded to nearest for f32; an integer's is a two's complement s64,
    /// wrapped to the type as Rust's `as` does (gpud checked the range).
    fn from_param(p: u64) -> Self;

    /// Global load (`p` generic, in global memory).
    #[cfg(target_arch = "nvptx64")]
    unsafe fn load(p: *const Self) -> Self;
    /// Global load through the read-only path.
    #[cfg(target_arch = "nvptx64")]
    unsafe fn load_nc(p: *const Self) -> Self;
    /// Global store.
    #[cfg(target_arch = "nvptx64")]
    unsafe fn store(p: *mut Self, v: Self);
    /// Shared-memory load at the shared-window address `a`.
    #[cfg(target_arch = "nvptx64")]
    unsafe fn load_shared(a: u32) -> Self;
    /// Shared-memory store at the shared-window address `a`.
    #[cfg(target_arch = "nvptx64")]
    unsafe fn store_shared(a: u32, v: Self);

    /// Load (host: a GPU body run on the CPU, [`crate::emu`]; an
    /// argument's address is checked against its extent there).
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    unsafe fn load(p: *const Self) -> Self {
        crate::emu::global(p).read()
    }
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    unsafe fn load_nc(p: *const Self) -> Self {
        crate::emu::global(p).read()
    }
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    unsafe fn store(p: *mut Self, v: Self) {
        crate::emu::global_mut(p).write(v)
    }
    /// The emulated block's shared memory at address `a`.
    #[cfg(not(target_arch = "nvptx64"))]
    #[track_caller]
    unsafe fn load_shared(a: u32) -> Self {
        crate::emu::shared_ptr(a, Self::BYTES as usize).cast::<Self>().read_unaligned()
    }
    #[cfg(not(target_arch = "nvptx64"))]
    #[track_caller]
    unsafe fn store_shared(a: u32, v: Self) {
        crate::emu::shared_ptr(a, Self::BYTES as usize).cast::<Self>().write_unaligned(v)
    }
}

/// An element with arithmetic. Integer arithmetic wraps on the GPU (PTX
/// has no overflow check) and, in a release build, on the host.
pub trait Numeric:
    Element
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
{
    const ZERO: Self;
    const ONE: Self;
    /// No value is below it (NaN aside): the identity of a maximum
    /// (`-inf` for floats, `MIN` for integers).
    const LOWEST: Self;
    /// No value is above it (NaN aside): the identity of a minimum.
    const HIGHEST: Self;

    /// From an f64 (a scalar argument): rounded to nearest for f32, exact
    /// for f64, truncated toward zero and saturated for integers (NaN → 0),
    /// as Rust's `as`.
    fn from_f64(x: f64) -> Self;
    /// To f64: exact for every type but i64/u64 beyond 2^53 (rounded).
    fn to_f64(self) -> f64;
    /// The larger; for floats IEEE maxNum (a NaN operand is ignored), as
    /// [`crate::Float::max`].
    fn maximum(self, other: Self) -> Self;
    /// The smaller; for floats IEEE minNum.
    fn minimum(self, other: Self) -> Self;
    /// `self + other`, an integer sum wrapping on every target and build:
    /// the GPU's add wraps, a debug host build's `+` panics on overflow, so
    /// the kit's sums (`reduce::Sum`) use this to give the GPU's answer in
    /// a debug test too. Floats: `+`.
    fn wrapping_add(self, other: Self) -> Self;
}

/// An integer element.
pub trait Int:
    Numeric
    + Eq
    + Rem<Output = Self>
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + BitXor<Output = Self>
    + Not<Output = Self>
    + Shl<u32, Output = Self>
    + Shr<u32, Output = Self>
{
    const SIGNED: bool;
    /// Wrapping conversion from u64 (Rust's `as`).
    fn from_u64(x: u64) -> Self;
    /// Wrapping conversion to u64 (sign-extended for signed types).
    fn to_u64(self) -> u64;
}

// ------------------------------------------------------------ the impls

/// Element's loads and stores for one type: `$ptx` is the PTX type
/// suffix, `$reg` the asm register class and `$via` the Rust type held in
/// it (u8 travels in a 16-bit register: PTX has no 8-bit ones).
#[cfg(target_arch = "nvptx64")]
macro_rules! memory_ops {
    ($t:ty, $ptx:literal, $reg:ident, $via:ty) => {
        #[inline(always)]
        unsafe fn load(p: *const $t) -> $t {
            let v: $via;
            asm!(concat!("cvta.to.global.u64 {t}, {p}; ld.global.", $ptx, " {v}, [{t}];"),
                 t = out(reg64) _, p = in(reg64) p, v = out($reg) v,
                 options(pure, readonly, nostack, preserves_flags));
            v as $t
        }
        #[inline(always)]
        unsafe fn load_nc(p: *const $t) -> $t {
            let v: $via;
            asm!(concat!("cvta.to.global.u64 {t}, {p}; ld.global.nc.", $ptx, " {v}, [{t}];"),
                 t = out(reg64) _, p = in(reg64) p, v = out($reg) v,
                 options(pure, readonly, nostack, preserves_flags));
            v as $t
        }
        #[inline(always)]
        unsafe fn store(p: *mut $t, v: $t) {
            asm!(concat!("cvta.to.global.u64 {t}, {p}; st.global.", $ptx, " [{t}], {v};"),
                 t = out(reg64) _, p = in(reg64) p, v = in($reg) v as $via,
                 options(nostack, preserves_flags));
        }
        #[inline(always)]
        unsafe fn load_shared(a: u32) -> $t {
            let v: $via;
            asm!(concat!("ld.shared.", $ptx, " {v}, [{a}];"), a = in(reg32) a, v = out($reg) v,
                 options(pure, readonly, nostack, preserves_flags));
            v as $t
        }
        #[inline(always)]
        unsafe fn store_shared(a: u32, v: $t) {
            asm!(concat!("st.shared.", $ptx, " [{a}], {v};"), a = in(reg32) a, v = in($reg) v as $via,
                 options(nostack, preserves_flags));
        }
    };
}

macro_rules! int_element {
    ($t:ty, $name:literal, $signed:literal, $ptx:literal, $reg:ident, $via:ty, $bits:ty) => {
        impl Element for $t {
            const NAME: &'static str = $name;
            const BYTES: u32 = core::mem::size_of::<$t>() as u32;
            #[inline(always)]
            fn to_bits64(self) -> u64 {
                self as $bits as u64
            }
            #[inline(always)]
            fn from_bits64(b: u64) -> $t {
                b as $bits as $t
            }
            #[inline(always)]
            fn from_param(p: u64) -> $t {
                p as i64 as $t
            }
            #[cfg(target_arch = "nvptx64")]
            memory_ops!($t, $ptx, $reg, $via);
        }
        impl Numeric for $t {
            const ZERO: $t = 0;
            const ONE: $t = 1;
            const LOWEST: $t = <$t>::MIN;
            const HIGHEST: $t = <$t>::MAX;
            #[inline(always)]
            fn from_f64(x: f64) -> $t {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn maximum(self, o: $t) -> $t {
                if o > self { o } else { self }
            }
            #[inline(always)]
            fn minimum(self, o: $t) -> $t {
                if o < self { o } else { self }
            }
            #[inline(always)]
            fn wrapping_add(self, o: $t) -> $t {
                <$t>::wrapping_add(self, o)
            }
        }
        impl Int for $t {
            const SIGNED: bool = $signed;
            #[inline(always)]
            fn from_u64(x: u64) -> $t {
                x as $t
            }
            #[inline(always)]
            fn to_u64(self) -> u64 {
                self as u64
            }
        }
    };
}

int_element!(u8, "u8", false, "u8", reg16, u16, u8);
int_element!(i32, "s32", true, "s32", reg32, i32, u32);
int_element!(u32, "u32", false, "u32", reg32, u32, u32);
int_element!(i64, "s64", true, "s64", reg64, i64, u64);
int_element!(u64, "u64", false, "u64", reg64, u64, u64);

macro_rules! float_element {
    ($t:ident, $ptx:literal, $reg:ident) => {
        impl Element for $t {
            const NAME: &'static str = stringify!($t);
            const BYTES: u32 = core::mem::size_of::<$t>() as u32;
            #[inline(always)]
            fn to_bits64(self) -> u64 {
                self.to_bits() as u64
            }
            #[inline(always)]
            fn from_bits64(b: u64) -> $t {
                $t::from_bits(b as _)
            }
            #[inline(always)]
            fn from_param(p: u64) -> $t {
                f64::from_bits(p) as $t
            }
            #[cfg(target_arch = "nvptx64")]
            memory_ops!($t, $ptx, $reg, $t);
        }
        impl Numeric for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            const LOWEST: $t = $t::NEG_INFINITY;
            const HIGHEST: $t = $t::INFINITY;
            #[inline(always)]
            fn from_f64(x: f64) -> $t {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn maximum(self, o: $t) -> $t {
                $t::max(self, o)
            }
            #[inline(always)]
            fn minimum(self, o: $t) -> $t {
                $t::min(self, o)
            }
            #[inline(always)]
            fn wrapping_add(self, o: $t) -> $t {
                self + o
            }
        }
    };
}

float_element!(f32, "f32", reg32);
float_element!(f64, "f64", reg64);
