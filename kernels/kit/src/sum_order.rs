//! The order of every CPU sum in erlcuda (c_src/erlcuda_ring.h states it
//! for all backends): runs of at most [`SERIAL`] terms added one after the
//! other, their partials combined pairwise within each chunk of [`CHUNK`]
//! terms ([`chunk_sum`]); the chunks' partials are then added in at most
//! [`GROUPS`] groups of consecutive chunks ([`combine`]; gpud runs chunks on
//! several threads). The groups are the parts of a pipelined reduction
//! (c_src/pipeline.c publishes one descriptor per group and adds their sums
//! as [`combine`] does), so a pipelined job gives the same bits.
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

/// Chunks' partials are summed in at most this many groups (EC_SUM_GROUPS):
/// as many as a pipelined job has parts at most (c_src/pipeline.c).
pub const GROUPS: usize = 32;

/// Chunks per group for a sum of `chunks` chunks (at least 1).
pub const fn group_chunks(chunks: usize) -> usize {
    let g = chunks.div_ceil(GROUPS);
    if g == 0 {
        1
    } else {
        g
    }
}

/// `Σ partial(c)` for `c < chunks`, the chunks' partials of one sum: each
/// group of [`group_chunks`] consecutive chunks added in index order from
/// `zero`, then the groups' sums in index order from `zero`. With at most
/// [`GROUPS`] chunks every group is one chunk, which is a plain sum in index
/// order; at most `chunks + 1` additions deep in any case.
pub fn combine<T: Copy + Add<Output = T>>(zero: T, chunks: usize, partial: impl Fn(usize) -> T) -> T {
    let g = group_chunks(chunks);
    let mut total = zero;
    let mut c = 0;
    while c < chunks {
        let end = if c + g < chunks { c + g } else { chunks };
        let mut group = zero;
        for i in c..end {
            group = group + partial(i);
        }
        total = total + group;
        c = end;
    }
    total
}

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
