//! `matmul_f64`: batched `C = A·B` in f64 (ABI: `matmul_f64_abi.rs`).
//!
//! One 128×64 tile of C per (virtual) block, grid-stride over the tiles of
//! all jobs like `matmul_f32`. Two bodies behind one entry name:
//! * `--features sm80` (the sm_80 module): FP64 tensor cores. 8 warps as
//!   4×2, each owning a 32×32 sub-tile = 4×4 `mma.sync.m8n8k4.f64`
//!   fragments; A and B k-slices of 16 go global → shared with `cp.async`,
//!   double-buffered, one barrier per k-slice.
//! * otherwise (the sm_70 module, which must load on any CC >= 7.0, where
//!   neither `mma.*.f64` nor `cp.async` exist): SIMT f64 FMAs, each thread
//!   8×4 outputs.
//!
//! Both run 2 blocks per SM (ptx-link's `.minnctapersm 2` for `matmul_f64`:
//! 128 registers; the tensor-core body needs no more and does not spill).
//! On an H200 the tensor-core body reaches ~30.7 TFLOP/s at 4096³, about
//! half of cuBLAS DGEMM; 64×128 and 64×64 (3 stages, 3 blocks per SM) tiles
//! measured the same and 1 block per SM 12 % less, so the limit looks like
//! the m8n8k4 DMMA rate itself (Hopper's faster f64 MMA shapes, m16n8k*,
//! need sm_90 PTX).

use core::arch::asm;

use crate::abi::matmul_f64_abi::*;
use crate::abi::MatmulJob;
use crate::common::{block_idx, grid_dim, owner, smem_base, sync_threads, thread_idx};

const BM: u32 = MATMUL_F64_BM;
const BN: u32 = MATMUL_F64_BN;
const BK: u32 = MATMUL_F64_BK;

#[inline(always)]
unsafe fn to_global(p: u64) -> u64 {
    let g: u64;
    asm!("cvta.to.global.u64 {g}, {p};", g = out(reg64) g, p = in(reg64) p,
         options(pure, nomem, nostack, preserves_flags));
    g
}

/// `p` is a global-window address (from [`to_global`]).
#[inline(always)]
unsafe fn stg_f64(p: u64, v: f64) {
    asm!("st.global.f64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v,
         options(nostack, preserves_flags));
}

/// 16-byte store; `p` global-window, 16-byte aligned.
#[inline(always)]
unsafe fn stg2_f64(p: u64, v: [f64; 2]) {
    asm!("st.global.v2.f64 [{p}], {{{x}, {y}}};", p = in(reg64) p, x = in(reg64) v[0], y = in(reg64) v[1],
         options(nostack, preserves_flags));
}

#[cfg(feature = "sm80")]
#[inline(always)]
unsafe fn lds_f64(a: u32) -> f64 {
    let v: f64;
    asm!("ld.shared.f64 {v}, [{a}];", a = in(reg32) a, v = out(reg64) v,
         options(pure, readonly, nostack, preserves_flags));
    v
}

/// Origin (m0, n0) of the tile of virtual block `vb` of `job`. Tiles go in
/// groups of MATMUL_F64_GROUP_M tile rows, column by column, so the blocks
/// that run together share A rows and B columns through L2.
#[inline(always)]
fn tile_origin(job: &MatmulJob, vb: u32) -> (u32, u32) {
    let local = (vb as u64 - job.tile_start) as u32;
    let tiles_m = (job.m + BM - 1) / BM;
    let per_group = MATMUL_F64_GROUP_M * job.tiles_n;
    let first_m = (local / per_group) * MATMUL_F64_GROUP_M;
    let gsize = if tiles_m - first_m < MATMUL_F64_GROUP_M { tiles_m - first_m } else { MATMUL_F64_GROUP_M };
    let in_group = local % per_group;
    ((first_m + in_group % gsize) * BM, (in_group / gsize) * BN)
}

#[no_mangle]
pub unsafe extern "ptx-kernel" fn matmul_f64(jobs: *const MatmulJob, njobs: u32, total_tiles: u32) {
    let smem = smem_base();
    let mut vb = block_idx();
    while vb < total_tiles {
        let j = owner(njobs, vb as u64, |i| (*jobs.add(i as usize)).tile_start);
        let job = *jobs.add(j as usize);
        let (m0, n0) = tile_origin(&job, vb);
        tile(&job, m0, n0, smem);
        // The next tile's first loads overwrite the shared memory just read
        // (the tensor-core body has no barrier after its last k-slice).
        sync_threads();
        vb += grid_dim();
    }
}

// ------------------------------------------------------- sm_80: tensor cores

/// Warps along m (the other 8 / 4 = 2 along n); each warp's sub-tile is
/// MI×NJ fragments of 8×8.
#[cfg(feature = "sm80")]
const WARPS_M: u32 = 4;
#[cfg(feature = "sm80")]
const MI: usize = (BM / WARPS_M / 8) as usize;
#[cfg(feature = "sm80")]
const NJ: usize = (BN / (8 / WARPS_M) / 8) as usize;
/// Shared memory of one stage: A[BM][BK] then B[BK][BN], f64, unpadded.
/// A rows are 128 bytes = 8 chunks of 16; B rows BN/2 chunks. Chunk `c` of
/// row `r` is stored at chunk `c ^ 2·(r % 4)`: a fragment load reads 4
/// rows × 2 chunks per half-warp (A: rows r..r+4, k-chunks 2s, 2s+1;
/// B: k-rows 4s..4s+4, 2 chunks of 4 columns) and the XOR spreads those 8
/// chunks over all 32 banks; the 16-byte `cp.async` writes of 8 adjacent
/// chunks stay conflict-free (XOR by an even value < 8 permutes each aligned
/// group of 8 chunks).
#[cfg(feature = "sm80")]
const A_STAGE: u32 = BM * BK * 8;
#[cfg(feature = "sm80")]
const B_ROW: u32 = BN * 8;
#[cfg(feature = "sm80")]
const STAGE: u32 = A_STAGE + BK * B_ROW;
#[cfg(feature = "sm80")]
const _: () = assert!(BK == 16 && 2 * STAGE == MATMUL_F64_SMEM_BYTES && BN % 16 == 0 && BN <= 128);

/// `D = A·B + D` on one 8×8×4 fragment: `a` = A[lane/4][lane%4],
/// `b` = B[lane%4][lane/4], `d` = D[lane/4][2·(lane%4) + {0,1}].
#[cfg(feature = "sm80")]
#[inline(always)]
unsafe fn dmma(d: &mut [f64; 2], a: f64, b: f64) {
    asm!("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {{{d0}, {d1}}}, {{{a}}}, {{{b}}}, {{{d0}, {d1}}};",
         d0 = inout(reg64) d[0], d1 = inout(reg64) d[1], a = in(reg64) a, b = in(reg64) b,
         options(pure, nomem, nostack, preserves_flags));
}

/// 16 bytes global → shared, of which the first `bytes` (0, 8 or 16) are
/// read from `src` (global window, 16-byte aligned) and the rest zero-filled.
/// `.cg`: through L2 only; the tile is staged in shared memory anyway.
/// Callers pass a valid `src` (the matrix base) even when `bytes` is 0.
#[cfg(feature = "sm80")]
#[inline(always)]
unsafe fn cp_async16(dst: u32, src: u64, bytes: u32) {
    asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};", d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes,
         options(nostack, preserves_flags));
}

/// 16 bytes global → shared, all read from `src` (global window, 16-byte
/// aligned): the interior k-slices, with no size operand to compute.
#[cfg(feature = "sm80")]
#[inline(always)]
unsafe fn cp_async16_full(dst: u32, src: u64) {
    asm!("cp.async.cg.shared.global [{d}], [{s}], 16;", d = in(reg32) dst, s = in(reg64) src,
         options(nostack, preserves_flags));
}

/// One f64 global → shared (`bytes` 8) or a zero (`bytes` 0).
#[cfg(feature = "sm80")]
#[inline(always)]
unsafe fn cp_async8(dst: u32, src: u64, bytes: u32) {
    asm!("cp.async.ca.shared.global [{d}], [{s}], 8, {n};", d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes,
         options(nostack, preserves_flags));
}

/// Waits for this thread's outstanding `cp.async`s (not other threads':
/// a barrier must follow).
#[cfg(feature = "sm80")]
#[inline(always)]
unsafe fn cp_async_wait_all() {
    asm!("cp.async.wait_all;", options(nostack, preserves_flags));
}

/// Bytes of the 16-byte chunk starting at element `i` of a row of `len`.
#[cfg(feature = "sm80")]
#[inline(always)]
fn chunk_bytes(i: u32, len: u32) -> u32 {
    if i + 2 <= len { 16 } else if i < len { 8 } else { 0 }
}

#[cfg(feature = "sm80")]
#[inline(always)]
unsafe fn tile(job: &MatmulJob, m0: u32, n0: u32, smem: u32) {
    let (m, n, k) = (job.m, job.n, job.k);
    let (ga, gb) = (to_global(job.a), to_global(job.b));
    let t = thread_idx();
    let (lane, warp) = (t % 32, t / 32);
    let (g, tq) = (lane / 4, lane % 4);
    let wm = (warp % WARPS_M) * (MI as u32 * 8);
    let wn = (warp / WARPS_M) * (NJ as u32 * 8);

    // Fragment addresses relative to a stage (see A_STAGE for the swizzle):
    // A[wm + 8i + g][4s + tq] at aoff[s] + 8i·128, B[4s + tq][wn + 8j + g]
    // at boff[j] + 4s·B_ROW.
    let mut aoff = [0u32; 4];
    for s in 0..4u32 {
        aoff[s as usize] = (wm + g) * 128 + (2 * (s ^ (g % 4)) + tq / 2) * 16 + (tq % 2) * 8;
    }
    let mut boff = [0u32; NJ];
    for j in 0..NJ as u32 {
        boff[j as usize] = A_STAGE + tq * B_ROW + ((wn / 2 + 4 * j + g / 2) ^ (2 * tq)) * 16 + (g % 2) * 8;
    }

    // Loaders. A: thread copies chunk ac of rows ar + 32p (p < BM/32);
    // B: chunk bc of k-rows br + B_RPP·p (p < BK/B_RPP).
    const A_PASSES: u32 = BM / 32;
    const B_CPR: u32 = BN / 2;
    const B_RPP: u32 = 256 / B_CPR;
    const B_PASSES: u32 = BK / B_RPP;
    let (ac, ar) = (t % 8, t / 8);
    let (bc, br) = (t % B_CPR, t / B_CPR);
    let a_dst = ar * 128 + (ac ^ (2 * (ar % 4))) * 16;
    let b_dst = A_STAGE + br * B_ROW + (bc ^ (2 * (br % 4))) * 16;
    let mut a_rows_ok = 0u32;
    for p in 0..A_PASSES {
        a_rows_ok |= ((m0 + ar + 32 * p < m) as u32) << p;
    }
    // Row ar of the tile at column 2·ac; rows ar + 32p are p·a_pstride further.
    let a_src = ga + ((m0 + ar) as u64 * k as u64 + 2 * ac as u64) * 8;
    let a_pstride = 32 * k as u64 * 8;
    let bn_col = n0 + 2 * bc;
    let b_src = gb + (br as u64 * n as u64 + bn_col as u64) * 8;
    let b_pstride = B_RPP as u64 * n as u64 * 8;
    let b_bytes = chunk_bytes(bn_col, n);
    let vec_a = job.a % 16 == 0 && k % 2 == 0;
    let vec_b = job.b % 16 == 0 && n % 2 == 0;
    // k-slices below fast_k lie wholly inside A and B: plain 16-byte copies,
    // none of the per-chunk bounds and sizes (measured 8 % faster at 4096^3).
    let fast_k = if vec_a && vec_b && m0 + BM <= m && n0 + BN <= n { k / BK } else { 0 };

    let load = |kt: u32, st: u32| {
        let k0 = kt * BK;
        if kt < fast_k {
            let a_kt = a_src + k0 as u64 * 8;
            for p in 0..A_PASSES {
                cp_async16_full(st + a_dst + p * 32 * 128, a_kt + p as u64 * a_pstride);
            }
            let b_kt = b_src + k0 as u64 * n as u64 * 8;
            for p in 0..B_PASSES {
                cp_async16_full(st + b_dst + p * B_RPP * B_ROW, b_kt + p as u64 * b_pstride);
            }
            return;
        }
        let ak = k0 + 2 * ac;
        let a_bytes = chunk_bytes(ak, k);
        let a_kt = a_src + k0 as u64 * 8;
        for p in 0..A_PASSES {
            let ok = a_rows_ok & (1 << p) != 0;
            let src = a_kt + p as u64 * a_pstride;
            let dst = st + a_dst + p * 32 * 128;
            if vec_a {
                cp_async16(dst, if ok { src } else { ga }, if ok { a_bytes } else { 0 });
            } else {
                for e in 0..2u32 {
                    let ok = ok && ak + e < k;
                    cp_async8(dst + 8 * e, if ok { src + 8 * e as u64 } else { ga }, if ok { 8 } else { 0 });
                }
            }
        }
        let b_kt = b_src + k0 as u64 * n as u64 * 8;
        for p in 0..B_PASSES {
            let ok = k0 + br + B_RPP * p < k;
            let src = b_kt + p as u64 * b_pstride;
            let dst = st + b_dst + p * B_RPP * B_ROW;
            if vec_b {
                cp_async16(dst, if ok { src } else { gb }, if ok { b_bytes } else { 0 });
            } else {
                for e in 0..2u32 {
                    let ok = ok && bn_col + e < n;
                    cp_async8(dst + 8 * e, if ok { src + 8 * e as u64 } else { gb }, if ok { 8 } else { 0 });
                }
            }
        }
    };

    let mut acc = [[[0.0f64; 2]; NJ]; MI];
    let ktiles = (k + BK - 1) / BK;
    if ktiles > 0 {
        load(0, smem);
        let mut kt = 0;
        while kt < ktiles {
            let cur = smem + (kt & 1) * STAGE;
            // k-slice kt has landed for every thread, and every warp is done
            // with kt - 1, whose stage the next copies overwrite.
            cp_async_wait_all();
            sync_threads();
            if kt + 1 < ktiles {
                load(kt + 1, smem + ((kt + 1) & 1) * STAGE);
            }
            for s in 0..4u32 {
                let mut af = [0.0f64; MI];
                let mut bf = [0.0f64; NJ];
                for i in 0..MI as u32 {
                    af[i as usize] = lds_f64(cur + aoff[s as usize] + 8 * i * 128);
                }
                for j in 0..NJ {
                    bf[j] = lds_f64(cur + boff[j] + 4 * s * B_ROW);
                }
                for i in 0..MI {
                    for j in 0..NJ {
                        dmma(&mut acc[i][j], af[i], bf[j]);
                    }
                }
            }
            kt += 1;
        }
    }

    // C[wm + 8i + g][wn + 8j + 2tq + {0,1}] = acc[i][j]
    let gc = to_global(job.c);
    let vec_c = job.c % 16 == 0 && n % 2 == 0;
    for i in 0..MI as u32 {
        let row = m0 + wm + 8 * i + g;
        if row < m {
            let crow = gc + row as u64 * n as u64 * 8;
            for j in 0..NJ as u32 {
                let col = n0 + wn + 8 * j + 2 * tq;
                let v = acc[i as usize][j as usize];
                if vec_c && col < n {
                    stg2_f64(crow + col as u64 * 8, v);
                } else {
                    for e in 0..2u32 {
                        if col + e < n {
                            stg_f64(crow + (col + e) as u64 * 8, v[e as usize]);
                        }
                    }
                }
            }
        }
    }
}

// -------------------------------------------------------------- sm_70: SIMT

/// Shared memory: A^T[BK][BM + 2] (transposed so a thread's 4 rows are one
/// pair of 16-byte loads; +2 halves the bank conflicts of the transposing
/// stores) then B[BK][BN]; one stage, loaded straight through (no register
/// prefetch: with 32 f64 accumulators it would spill under the 128-register
/// cap of 2 blocks per SM).
#[cfg(not(feature = "sm80"))]
const LDA_S: u32 = BM + 2;
#[cfg(not(feature = "sm80"))]
const B_OFF: u32 = BK * LDA_S * 8;
#[cfg(not(feature = "sm80"))]
const _: () = assert!(BM == 128 && BN == 64 && BK == 16 && B_OFF % 16 == 0
    && B_OFF + BK * BN * 8 <= MATMUL_F64_SMEM_BYTES);

#[cfg(not(feature = "sm80"))]
#[inline(always)]
unsafe fn ldg_f64(p: u64) -> f64 {
    let v: f64;
    asm!("ld.global.nc.f64 {v}, [{p}];", p = in(reg64) p, v = out(reg64) v,
         options(pure, readonly, nostack, preserves_flags));
    v
}

#[cfg(not(feature = "sm80"))]
#[inline(always)]
unsafe fn lds2_f64(a: u32) -> [f64; 2] {
    let (x, y): (f64, f64);
    asm!("ld.shared.v2.f64 {{{x}, {y}}}, [{a}];", a = in(reg32) a, x = out(reg64) x, y = out(reg64) y,
         options(pure, readonly, nostack, preserves_flags));
    [x, y]
}

#[cfg(not(feature = "sm80"))]
#[inline(always)]
unsafe fn sts_f64(a: u32, v: f64) {
    asm!("st.shared.f64 [{a}], {v};", a = in(reg32) a, v = in(reg64) v, options(nostack, preserves_flags));
}

/// 256 threads as 16×16 (tx, ty); thread computes rows {ty·4.., 64 + ty·4..}
/// (4 each) × columns {tx·2.., 32 + tx·2..} (2 each) of the tile.
#[cfg(not(feature = "sm80"))]
#[inline(always)]
unsafe fn tile(job: &MatmulJob, m0: u32, n0: u32, smem: u32) {
    let (m, n, k) = (job.m, job.n, job.k);
    let (ga, gb) = (to_global(job.a), to_global(job.b));
    let t = thread_idx();
    let (tx, ty) = (t % 16, t / 16);
    // Loaders (coalesced along rows): A[row = t/16 + 16p][t%16] for p < 8,
    // B[t/64 + 4p][t%64] for p < 4; zero outside the matrices.
    let (a_k, a_r) = (t % 16, t / 16);
    let (b_c, b_r) = (t % 64, t / 64);
    // One k-slice into shared memory (the caller brackets it with barriers).
    let load = |kt: u32| {
        let k0 = kt * BK;
        for p in 0..8u32 {
            let (gm, gk) = (m0 + a_r + 16 * p, k0 + a_k);
            let v = if gm < m && gk < k { ldg_f64(ga + (gm as u64 * k as u64 + gk as u64) * 8) } else { 0.0 };
            sts_f64(smem + (a_k * LDA_S + a_r + 16 * p) * 8, v);
        }
        for p in 0..4u32 {
            let (gk, gn) = (k0 + b_r + 4 * p, n0 + b_c);
            let v = if gk < k && gn < n { ldg_f64(gb + (gk as u64 * n as u64 + gn as u64) * 8) } else { 0.0 };
            sts_f64(smem + B_OFF + ((b_r + 4 * p) * BN + b_c) * 8, v);
        }
    };

    let mut acc = [[0.0f64; 4]; 8];
    let ktiles = (k + BK - 1) / BK;
    for kt in 0..ktiles {
        load(kt);
        sync_threads();
        for kk in 0..BK {
            let ap = smem + (kk * LDA_S + ty * 4) * 8;
            let bp = smem + B_OFF + (kk * BN + tx * 2) * 8;
            let (a0, a1, a2, a3) = (lds2_f64(ap), lds2_f64(ap + 16), lds2_f64(ap + 64 * 8), lds2_f64(ap + 64 * 8 + 16));
            let (b0, b1) = (lds2_f64(bp), lds2_f64(bp + 32 * 8));
            let av = [a0[0], a0[1], a1[0], a1[1], a2[0], a2[1], a3[0], a3[1]];
            let bv = [b0[0], b0[1], b1[0], b1[1]];
            for i in 0..8 {
                for j in 0..4 {
                    acc[i][j] += av[i] * bv[j];
                }
            }
        }
        sync_threads();
    }

    let gc = to_global(job.c);
    let vec_c = job.c % 16 == 0 && n % 2 == 0;
    for i in 0..8u32 {
        let row = m0 + (i / 4) * 64 + ty * 4 + i % 4;
        if row < m {
            let crow = gc + row as u64 * n as u64 * 8;
            for h in 0..2u32 {
                let col = n0 + h * 32 + tx * 2;
                let v = [acc[i as usize][2 * h as usize], acc[i as usize][2 * h as usize + 1]];
                if vec_c && col < n {
                    stg2_f64(crow + col as u64 * 8, v);
                } else {
                    for e in 0..2u32 {
                        if col + e < n {
                            stg_f64(crow + (col + e) as u64 * 8, v[e as usize]);
                        }
                    }
                }
            }
        }
    }
}
