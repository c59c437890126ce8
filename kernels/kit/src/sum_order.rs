//! The order of every CPU sum in erlcuda (c_src/erlcuda_ring.h states it
//! for all backends): runs of at most [`SERIAL`] terms added one after the
//! other, their partials combined pairwise within each chunk of [`CHUNK`]
//! terms; the chunks' partials are then added in index order by the caller
//! (gpud runs chunks on several threads).
//!
//! Plain `core` Rust with no dependencies, shared verbatim by the kit's host
//! code and gpud (`#[path = ".../kernels/kit/src/sum_order.rs"]`), so the
//! two CPU sums are one definition.

use core::ops::Add;

/// Terms one accumulator adds serially (EC_SUM_SERIAL).
pub const SERIAL: usize = 256;
/// Terms per chunk (EC_SUM_CHUNK): one GPU virtual block of a reduction at
/// 256 threads.
pub const CHUNK: usize = 65536;

/// `Σ term(i)` for `lo <= i < hi` (at most [`CHUNK`] terms), from `zero`:
/// serial runs of [`SERIAL`], then their partials pairwise (depth 8).
pub fn chunk_sum<T: Copy + Add<Output = T>>(zero: T, lo: usize, hi: usize, term: &impl Fn(usize) -> T) -> T {
    debug_assert!(hi - lo <= CHUNK);
    let mut parts = [zero; CHUNK / SERIAL];
    let mut np = 0;
    let mut i = lo;
    while i < hi {
        let end = if i + SERIAL < hi { i + SERIAL } else { hi };
        let mut acc = zero;
        for j in i..end {
            acc = acc + term(j);
        }
        parts[np] = acc;
        np += 1;
        i = end;
    }
    while np > 1 {
        for j in 0..np / 2 {
            parts[j] = parts[2 * j] + parts[2 * j + 1];
        }
        if np % 2 == 1 {
            parts[np / 2] = parts[np - 1];
        }
        np = np.div_ceil(2);
    }
    parts[0]
}
