//! GPU access patterns the kernels share (both targets): four consecutive
//! elements of any element type in one access, a block's walk over a row,
//! and a thread's tile of a row held in registers.
//!
//! The kit's 16-byte loads and stores are `Float`'s (`ldg4_nc`, `stg4`); an
//! integer group goes through them by its bits (a register is a register:
//! `to_bits`/`from_bits` are moves), a u8 group through one 32-bit word.

use erlcuda_kernel::device::{block_dim, thread_idx};
use erlcuda_kernel::{unroll, Element, Float};

/// Elements per thread in a register tile ([`load_tile`]) for an element
/// type: four groups of four (256 threads hold a 4096-element row), two
/// for 8-byte types (16 of them would take half of the 64 registers a
/// thread has at `.maxntid 1024`, and spill).
#[inline(always)]
pub const fn tile_slots<T: Element>() -> usize {
    if T::BYTES == 8 {
        8
    } else {
        16
    }
}

/// The alignment in bytes a group of four elements needs for one access:
/// u8 groups are one 32-bit word, 4-byte types one 16-byte vector, 8-byte
/// types two 16-byte vectors.
#[inline(always)]
pub const fn group_align<T: Element>() -> u64 {
    if T::BYTES == 1 {
        4
    } else {
        16
    }
}

/// Whether `p` starts a group that [`load4`]/[`store4`] may access.
#[inline(always)]
pub fn aligned<T: Element>(p: *const T) -> bool {
    p as u64 % group_align::<T>() == 0
}

/// The four elements at `p` ([`aligned`]), through the read-only path.
#[inline(always)]
pub unsafe fn load4<T: Element>(p: *const T) -> [T; 4] {
    match T::BYTES {
        1 => {
            let w = u32::load_nc(p as *const u32);
            [0, 8, 16, 24].map(|s| T::from_bits64((w >> s) as u64 & 0xff))
        }
        4 => f32::ldg4_nc(p as *const f32).map(|x| T::from_bits64(x.to_bits() as u64)),
        _ => f64::ldg4_nc(p as *const f64).map(|x| T::from_bits64(x.to_bits())),
    }
}

/// Stores four elements at `p` ([`aligned`]).
#[inline(always)]
pub unsafe fn store4<T: Element>(p: *mut T, v: [T; 4]) {
    match T::BYTES {
        1 => {
            let b = v.map(|x| x.to_bits64() as u32);
            u32::store(p as *mut u32, b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24)
        }
        4 => f32::stg4(p as *mut f32, v.map(|x| f32::from_bits(x.to_bits64() as u32))),
        _ => f64::stg4(p as *mut f64, v.map(|x| f64::from_bits(x.to_bits64()))),
    }
}

/// Elements before the first aligned group of a row at `row` (at most
/// `len`): a row of a matrix starts wherever `r · cols` puts it.
#[inline(always)]
fn head<T: Element>(row: *const T, len: u32) -> u32 {
    let a = group_align::<T>();
    let h = ((a - row as u64 % a) % a) / T::BYTES as u64;
    h.min(len as u64) as u32
}

/// `f(i, row[i])` for the elements of `row[..len]` this thread takes, the
/// block's threads striding through the row together: a head of up to 3
/// elements, then aligned groups of four (thread t the groups t, t + B,
/// ..., two groups' loads in flight before their use: more would take
/// registers, and so resident warps, from a kernel that lives on loads in
/// flight), then a tail of up to 3. Each element is visited by exactly one
/// thread, and each thread visits its elements in increasing order.
#[inline(always)]
pub unsafe fn for_row<T: Element>(row: *const T, len: u32, mut f: impl FnMut(u32, T)) {
    let (t, nt) = (thread_idx(), block_dim());
    let h = head(row, len);
    if t < h {
        f(t, T::load_nc(row.add(t as usize)));
    }
    let body = row.add(h as usize);
    let ng = (len - h) / 4;
    let mut visit = |g: u32, v: [T; 4]| {
        for (q, &x) in v.iter().enumerate() {
            f(h + 4 * g + q as u32, x);
        }
    };
    let mut g = t;
    while g + nt < ng {
        let (v0, v1) = (load4(body.add(4 * g as usize)), load4(body.add(4 * (g + nt) as usize)));
        visit(g, v0);
        visit(g + nt, v1);
        g += 2 * nt;
    }
    while g < ng {
        visit(g, load4(body.add(4 * g as usize)));
        g += nt;
    }
    let tail = h + 4 * ng;
    if t < len - tail {
        f(tail + t, T::load_nc(row.add((tail + t) as usize)));
    }
}

/// `f(a[i], b[i])` over `a[..len]` and `b[..len]`, as [`for_row`]: groups
/// of four when both are aligned alike, one element at a time otherwise.
#[inline(always)]
pub unsafe fn for_row2<T: Element>(a: *const T, b: *const T, len: u32, mut f: impl FnMut(T, T)) {
    let (t, nt) = (thread_idx(), block_dim());
    let m = group_align::<T>();
    if a as u64 % m != b as u64 % m {
        let mut i = t;
        while i < len {
            f(T::load_nc(a.add(i as usize)), T::load_nc(b.add(i as usize)));
            i += nt;
        }
        return;
    }
    let h = head(a, len);
    if t < h {
        f(T::load_nc(a.add(t as usize)), T::load_nc(b.add(t as usize)));
    }
    let (ab, bb) = (a.add(h as usize), b.add(h as usize));
    let ng = (len - h) / 4;
    let mut g = t;
    while g + nt < ng {
        let (a0, b0) = (load4(ab.add(4 * g as usize)), load4(bb.add(4 * g as usize)));
        let (a1, b1) = (load4(ab.add(4 * (g + nt) as usize)), load4(bb.add(4 * (g + nt) as usize)));
        for q in 0..4 {
            f(a0[q], b0[q]);
        }
        for q in 0..4 {
            f(a1[q], b1[q]);
        }
        g += 2 * nt;
    }
    if g < ng {
        let (a0, b0) = (load4(ab.add(4 * g as usize)), load4(bb.add(4 * g as usize)));
        for q in 0..4 {
            f(a0[q], b0[q]);
        }
    }
    let tail = h + 4 * ng;
    if t < len - tail {
        let i = (tail + t) as usize;
        f(T::load_nc(a.add(i)), T::load_nc(b.add(i)));
    }
}

/// The row index of slot `s` of thread `t` in the tile starting at `lo`:
/// slot s is element s % 4 of the thread's group s / 4, and the block's
/// groups go round the threads (neighbouring threads, neighbouring
/// groups: coalesced).
#[inline(always)]
pub fn tile_col(lo: u32, s: u32, t: u32, nt: u32) -> u32 {
    lo.wrapping_add(4 * (t + nt * (s / 4)) + s % 4)
}

/// Thread `t`'s `N` elements (N = 8 or 16) of the tile `row[lo..lo + n]`
/// (n ≤ B·N), in registers: unused slots hold `fill`, and bit s of the
/// mask says slot s holds an element. `vec`: the row is [`aligned`] (then
/// so is every full group: tiles start at multiples of B·N).
#[inline(always)]
pub unsafe fn load_tile<T: Element, const N: usize>(row: *const T, lo: u32, n: u32, vec: bool, fill: T) -> ([T; N], u32) {
    const { assert!(N == 8 || N == 16) };
    let (t, nt) = (thread_idx(), block_dim());
    let base = row.add(lo as usize);
    let mut v = [fill; N];
    let mut live = 0u32;
    unroll!(g, 4, {
        if (g as usize) < N / 4 {
            let e = 4 * (t + nt * g);
            let s = (4 * g) as usize;
            if vec && e + 4 <= n {
                let x = load4(base.add(e as usize));
                v[s] = x[0];
                v[s + 1] = x[1];
                v[s + 2] = x[2];
                v[s + 3] = x[3];
                live |= 0xf << (4 * g);
            } else {
                unroll!(q, 4, {
                    if e + q < n {
                        v[s + q as usize] = T::load_nc(base.add((e + q) as usize));
                        live |= 1 << (4 * g + q);
                    }
                });
            }
        }
    });
    (v, live)
}

/// Stores the slots of a tile loaded by [`load_tile`] (the same `lo`, `n`,
/// `vec`) into `out`, mapped by `f`.
#[inline(always)]
pub unsafe fn store_tile<T: Element, const N: usize>(out: *mut T, lo: u32, n: u32, vec: bool, v: &[T; N], f: impl Fn(T) -> T) {
    let (t, nt) = (thread_idx(), block_dim());
    let base = out.add(lo as usize);
    unroll!(g, 4, {
        if (g as usize) < N / 4 {
            let e = 4 * (t + nt * g);
            let s = (4 * g) as usize;
            if vec && e + 4 <= n {
                store4(base.add(e as usize), [f(v[s]), f(v[s + 1]), f(v[s + 2]), f(v[s + 3])]);
            } else {
                unroll!(q, 4, {
                    if e + q < n {
                        T::store(base.add((e + q) as usize), f(v[s + q as usize]));
                    }
                });
            }
        }
    });
}
