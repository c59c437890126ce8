//! Static shared arrays (nvptx64): `__shared__ T name[N]` in Rust.
//!
//! ```ignore
//! // In a GPU body: 256 f32 of this block's shared memory.
//! let tile = erlcuda_kernel::shared_array!(tile: [f32; 256]);
//! tile.set(thread_idx(), x);
//! sync_threads();
//! let y = tile.get(255 - thread_idx());
//! ```
//!
//! rustc cannot put a Rust `static` in PTX's shared state space (nvptx64
//! statics land in `.global`), so [`shared_array!`] declares the array in
//! PTX itself, with module-level assembly (`global_asm!`):
//! `.shared .align 16 .b8 erlcuda_shared_NAME_LLINE_CCOL[BYTES];`, and
//! reads its address with `mov.u32`. ptxas gives each kernel the shared
//! arrays it uses, and only those (`ptxas -v` reports them as its `smem`);
//! the launch's dynamic shared memory ([`crate::device::smem_base`]) comes
//! after them.
//!
//! The symbol is made of the array's name and the macro call's line and
//! column, so arrays need distinct names within a source line; a generic
//! function's array is one array for all its instances (they are the same
//! item). In a body generic over `T`, size the array by its widest type:
//! `shared_array!(tile: [T; 256], room = f64)`.
//!
//! Shared memory is not zeroed: write before reading, with a barrier
//! between the writers and the readers.

#[allow(unused_imports)]
use crate::element::Element;
#[allow(unused_imports)]
use core::marker::PhantomData;

/// `shared_array!(NAME: [T; N])` or `shared_array!(NAME: [T; N], room =
/// W)`: a [`SharedArray<T, N>`] of static shared memory, `N` elements of
/// `W` (default `T`) reserved.
#[cfg(target_arch = "nvptx64")]
#[macro_export]
#[allow_internal_unstable(asm_experimental_arch)]
macro_rules! shared_array {
    ($name:ident : [$t:ty; $n:expr]) => {
        $crate::shared_array!($name: [$t; $n], room = $t)
    };
    ($name:ident : [$t:ty; $n:expr], room = $w:ty) => {{
        ::core::arch::global_asm!(
            concat!(".shared .align 16 .b8 erlcuda_shared_", stringify!($name), "_L", line!(), "C", column!(), "[{n}];"),
            n = const { ($n) * ::core::mem::size_of::<$w>() },
        );
        let a: u32;
        // SAFETY: the address of the array declared just above.
        unsafe {
            ::core::arch::asm!(
                concat!("mov.u32 {a}, erlcuda_shared_", stringify!($name), "_L", line!(), "C", column!(), ";"),
                a = out(reg32) a,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        const { assert!(::core::mem::size_of::<$t>() <= ::core::mem::size_of::<$w>()) };
        // SAFETY: N elements of the room type were reserved, 16-byte aligned.
        unsafe { $crate::shared::SharedArray::<$t, { $n }>::at(a) }
    }};
}

/// `N` elements of `T` in the block's shared memory, addressed by their
/// shared-window address. Copy it freely: it is the address.
// Both targets (the host's: in a GPU body run on the CPU, crate::emu).
#[derive(Clone, Copy)]
pub struct SharedArray<T, const N: usize> {
    addr: u32,
    _t: PhantomData<T>,
}

// Both targets; `as_ptr` per target.
impl<T: Element, const N: usize> SharedArray<T, N> {
    /// # Safety
    /// `addr` is the shared-window address of `N` elements of `T`, aligned
    /// for `T`, that nothing else uses as another type meanwhile.
    #[inline(always)]
    pub const unsafe fn at(addr: u32) -> Self {
        SharedArray { addr, _t: PhantomData }
    }

    /// The number of elements.
    #[inline(always)]
    pub const fn len(&self) -> usize {
        N
    }

    #[inline(always)]
    pub const fn is_empty(&self) -> bool {
        N == 0
    }

    /// The shared-window address of element `i` (for [`crate::atomic`]'s
    /// `*_shared` functions and `ld.shared`/`st.shared`).
    #[inline(always)]
    pub fn addr(&self, i: usize) -> u32 {
        check_index(self.addr, i, N, T::BYTES);
        self.addr + (i as u32) * T::BYTES
    }

    /// Element `i` (`ld.shared`); traps when `i >= N`.
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        unsafe { T::load_shared(self.addr(i)) }
    }

    /// Sets element `i` (`st.shared`); traps when `i >= N`.
    #[inline(always)]
    pub fn set(&self, i: usize, v: T) {
        unsafe { T::store_shared(self.addr(i), v) }
    }

    /// The array as a generic pointer, for plain Rust accesses (the asm converts the address only).
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    #[allow(clippy::pointers_in_nomem_asm_block)]
    pub fn as_ptr(&self) -> *mut T {
        let p: u64;
        unsafe {
            core::arch::asm!("cvt.u64.u32 {w}, {a}; cvta.shared.u64 {p}, {w};",
                             w = out(reg64) _, a = in(reg32) self.addr, p = out(reg64) p,
                             options(pure, nomem, nostack, preserves_flags));
        }
        p as *mut T
    }
}

/// Bytes of the kit's own static scratch array (one 16-byte slot per warp of
/// a 1024-thread block), which [`crate::block`]'s reductions and scans use.
pub const SCRATCH_BYTES: usize = 32 * 16;

/// The kit's scratch array: 32 slots of 16 bytes. Only [`crate::block`]
/// uses it, between two barriers of its own.
// Both targets: the host's is in the emulated block's shared memory.
#[inline(always)]
pub(crate) fn scratch() -> SharedArray<u64, { SCRATCH_BYTES / 8 }> {
    crate::shared_array!(erlcuda_kit_scratch: [u64; SCRATCH_BYTES / 8])
}

/// The host side of [`SharedArray`]: a pointer into the emulated block's
/// shared memory ([`crate::emu`]).
#[cfg(not(target_arch = "nvptx64"))]
impl<T: Element, const N: usize> SharedArray<T, N> {
    /// The array as a pointer, for plain Rust accesses.
    pub fn as_ptr(&self) -> *mut T {
        crate::emu::shared_ptr(self.addr, N * T::BYTES as usize).cast()
    }
}

/// `shared_array!` in a GPU body run on the CPU ([`crate::emu`]): the
/// array is placed in the block's emulated shared memory at its first use,
/// keyed by a static of the call site's own (one array per call site, as
/// the GPU's `.shared` symbol), and poisoned with the rest of it before
/// each block.
#[cfg(not(target_arch = "nvptx64"))]
#[macro_export]
macro_rules! shared_array {
    ($name:ident : [$t:ty; $n:expr]) => {
        $crate::shared_array!($name: [$t; $n], room = $t)
    };
    ($name:ident : [$t:ty; $n:expr], room = $w:ty) => {{
        // Interior mutability: a static of its own address, never merged
        // with another call site's.
        static KEY: ::core::sync::atomic::AtomicU8 = ::core::sync::atomic::AtomicU8::new(0);
        const { assert!(::core::mem::size_of::<$t>() <= ::core::mem::size_of::<$w>()) };
        let a = $crate::emu::static_shared(&KEY as *const _ as usize, ($n) * ::core::mem::size_of::<$w>());
        // SAFETY: N elements of the room type were reserved, 16-byte aligned.
        unsafe { $crate::shared::SharedArray::<$t, { $n }>::at(a) }
    }};
}

/// Index `i` of an array of `n` elements of `bytes` at shared address
/// `addr` (kept below [`scratch`], whose call's line names its PTX symbol):
/// past its end the GPU traps.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn check_index(_addr: u32, i: usize, n: usize, _bytes: u32) {
    assert!(i < n);
}

/// On the host, past the end is the thread's fault ([`crate::emu`]), with
/// the byte it would have reached in the shared window.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
fn check_index(addr: u32, i: usize, n: usize, bytes: u32) {
    if i >= n {
        let at = i64::from(addr).saturating_add((i as i64).saturating_mul(i64::from(bytes)));
        crate::emu::fault(crate::emu::Reason::OutOfBounds { slot: crate::emu::SHARED_SLOT, index: at });
    }
}
