//! `matmul_f32`: `C(m×n) = A(m×k) · B(k×n)`, row-major f32, batched (ABI:
//! `abi.rs`, [`MatmulJob`]). Three tile shapes, chosen per launch by
//! `abi::matmul_prepare` (the 4th parameter): 128×128×16 (256 threads each
//! computing 8×8 outputs); for launches of at least MATMUL_WIDE_MIN_TILES
//! such tiles, 256×128×8 (16×8 outputs per thread); and for launches too
//! small to give every SM a 128-row tile, 64×128×16 (4×8 per thread).
//! Double-buffered shared memory (`abi::matmul_smem`), grouped tile order for
//! L2 reuse. Assembled with `.minnctapersm 1` (tools/ptx-link): one block per
//! SM, 239 registers, no spills (at 2 blocks per SM, capped at 128
//! registers, the 128-row body spilled and ran 5% slower).

use crate::abi::*;
use crate::common::*;

const BN: u32 = MATMUL_BN;
const LDB_S: u32 = MATMUL_LDB_S;

/// 4 consecutive elements of row `gm` of A (m×k), columns `gk..gk+4`, zero
/// outside the matrix.
#[inline(always)]
unsafe fn load_a4(a: *const f32, m: u32, k: u32, gm: u32, gk: u32, vec: bool) -> [f32; 4] {
    let mut v = [0.0f32; 4];
    if gm < m {
        let row = a.add(gm as usize * k as usize + gk as usize);
        if vec && gk + 4 <= k {
            v = f32::ldg4_nc(row);
        } else {
            for q in 0..4 {
                if gk + q < k {
                    v[q as usize] = f32::ldg_nc(row.add(q as usize));
                }
            }
        }
    }
    v
}

/// 4 consecutive elements of row `gk` of B (k×n), columns `gn..gn+4`.
#[inline(always)]
unsafe fn load_b4(b: *const f32, k: u32, n: u32, gk: u32, gn: u32, vec: bool) -> [f32; 4] {
    let mut v = [0.0f32; 4];
    if gk < k {
        let row = b.add(gk as usize * n as usize + gn as usize);
        if vec && gn + 4 <= n {
            v = f32::ldg4_nc(row);
        } else {
            for q in 0..4 {
                if gn + q < n {
                    v[q as usize] = f32::ldg_nc(row.add(q as usize));
                }
            }
        }
    }
    v
}

/// One 128×128 tile of C per (virtual) block; 256 threads as 16×16, each
/// computing 8×8 outputs: rows {ty*4..+4, 64+ty*4..+4}, columns
/// {tx*4..+4, 64+tx*4..+4}. Shared memory: 2 stages of A^T[BK][132] and
/// B[BK][128]; global loads of the next k-tile go to registers while the
/// current one is computed.
///
/// `BM` = 256 (the wide tile): 16×8 outputs per thread, rows {ty*4..+4,
/// 64+ty*4.., 128+.., 192+..}; the same code with 4 row groups instead of 2.
/// `BM` = 64 (the narrow tile): one row group, 4×8 outputs per thread.
#[inline(always)]
unsafe fn matmul_impl<const BM: u32, const BK: u32>(jobs: *const MatmulJob, njobs: u32, total_tiles: u32) {
    let lda_s = BM + 4; // MATMUL_LDA_S for BM = 128
    // groups of 4 rows per thread (2 or 4), and rows per thread
    let rg = BM / 64;
    let tr = rg * 4;
    // loads per thread per k-tile
    const fn kv(bk: u32) -> u32 { bk / 4 } // float4 per A row
    let a_rows_per_pass = 256 / kv(BK);
    let a_passes = BM / a_rows_per_pass; // 2 (128×16 and 256×8)
    let b_passes = BK / 8; // 32 float4 per B row, 8 rows per pass: 2 or 1
    let stage_bytes = BK * (lda_s + LDB_S) * 4;

    let smem = smem_base();
    let t = thread_idx();
    let (tx, ty) = (t % 16, t / 16);
    // A loader mapping
    let a_r = t / kv(BK);
    let a_c = (t % kv(BK)) * 4;
    // B loader mapping
    let b_r = t / 32;
    let b_c = (t % 32) * 4;

    let mut vb = block_idx();
    while vb < total_tiles {
        let j = owner(njobs, vb as u64, |i| (*jobs.add(i as usize)).tile_start);
        let job = *jobs.add(j as usize);
        let (m, n, k) = (job.m, job.n, job.k);
        let (pa, pb, pc) = (job.a as *const f32, job.b as *const f32, job.c as *mut f32);

        // grouped tile order for L2 reuse
        let local = (vb as u64 - job.tile_start) as u32;
        let tiles_n = job.tiles_n;
        let tiles_m = (m + BM - 1) / BM;
        let per_group = MATMUL_GROUP_M * tiles_n;
        let group = local / per_group;
        let first_m = group * MATMUL_GROUP_M;
        let gsize = if tiles_m - first_m < MATMUL_GROUP_M { tiles_m - first_m } else { MATMUL_GROUP_M };
        let in_group = local % per_group;
        let tm = first_m + in_group % gsize;
        let tn = in_group / gsize;
        let m0 = tm * BM;
        let n0 = tn * BN;

        let vec_a = (k & 3) == 0 && (job.a & 15) == 0;
        let vec_b = (n & 3) == 0 && (job.b & 15) == 0;
        // Interior tile with vector-friendly operands: every full k-tile is
        // loaded without bounds checks through pointers that just advance.
        let interior = vec_a && vec_b && m0 + BM <= m && n0 + BN <= n;
        let full_k = if interior { k / BK } else { 0 };
        let a_ptr = pa.add((m0 + a_r) as usize * k as usize + a_c as usize);
        let b_ptr = pb.add(b_r as usize * n as usize + (n0 + b_c) as usize);
        let a_pass_stride = a_rows_per_pass as usize * k as usize;
        let b_kt_stride = BK as usize * n as usize;

        let mut acc = [[0.0f32; 8]; 16]; // rows past `tr` unused (and optimised away)
        let ktiles = (k + BK - 1) / BK;

        if ktiles > 0 {
            let mut ra = [[0.0f32; 4]; 4];
            let mut rb = [[0.0f32; 4]; 4];
            // global k-tile `kt` -> registers
            let load = |kt: u32, ra: &mut [[f32; 4]; 4], rb: &mut [[f32; 4]; 4]| {
                if kt < full_k {
                    let ap = a_ptr.add((kt * BK) as usize);
                    let bp = b_ptr.add(kt as usize * b_kt_stride);
                    unroll!(p, 4, if p < a_passes {
                        ra[p as usize] = f32::ldg4_nc(ap.add(p as usize * a_pass_stride));
                    });
                    unroll!(p, 4, if p < b_passes {
                        rb[p as usize] = f32::ldg4_nc(bp.add(8 * p as usize * n as usize));
                    });
                } else {
                    let k0 = kt * BK;
                    unroll!(p, 4, if p < a_passes {
                        ra[p as usize] = load_a4(pa, m, k, m0 + a_r + p * a_rows_per_pass, k0 + a_c, vec_a);
                    });
                    unroll!(p, 4, if p < b_passes {
                        rb[p as usize] = load_b4(pb, k, n, k0 + b_r + 8 * p, n0 + b_c, vec_b);
                    });
                }
            };
            // registers -> shared stage at `st`
            let store = |st: u32, ra: &[[f32; 4]; 4], rb: &[[f32; 4]; 4]| {
                unroll!(p, 4, if p < a_passes {
                    unroll!(q, 4, {
                        f32::sts(st + ((a_c + q) * lda_s + a_r + p * a_rows_per_pass) * 4, ra[p as usize][q as usize]);
                    });
                });
                unroll!(p, 4, if p < b_passes {
                    sts4_f32(st + BK * lda_s * 4 + ((b_r + 8 * p) * LDB_S + b_c) * 4, rb[p as usize]);
                });
            };

            load(0, &mut ra, &mut rb);
            store(smem, &ra, &rb);
            sync_threads();

            let mut kt = 0;
            while kt < ktiles {
                let cur = smem + (kt & 1) * stage_bytes;
                let nxt = smem + ((kt + 1) & 1) * stage_bytes;
                let more = kt + 1 < ktiles;
                if more {
                    load(kt + 1, &mut ra, &mut rb);
                }
                let as_ = cur + ty * 16;
                let bs_ = cur + BK * lda_s * 4 + tx * 16;
                unroll!(kk, 16, if kk < BK {
                    let mut av = [0.0f32; 16];
                    unroll!(r, 4, if r < rg {
                        let a = lds4_f32(as_ + kk * lda_s * 4 + r * 64 * 4);
                        unroll!(q, 4, { av[(r * 4 + q) as usize] = a[q as usize]; });
                    });
                    let b0 = lds4_f32(bs_ + kk * LDB_S * 4);
                    let b1 = lds4_f32(bs_ + kk * LDB_S * 4 + 64 * 4);
                    let bv = [b0[0], b0[1], b0[2], b0[3], b1[0], b1[1], b1[2], b1[3]];
                    unroll!(i, 16, if i < tr {
                        unroll!(jj, 8, {
                            acc[i as usize][jj as usize] += av[i as usize] * bv[jj as usize];
                        });
                    });
                });
                if more {
                    store(nxt, &ra, &rb);
                }
                sync_threads();
                kt += 1;
            }
        }

        // epilogue
        let vec_c = (n & 3) == 0 && (job.c & 15) == 0;
        for i in 0..tr {
            let gm = m0 + (i / 4) * 64 + ty * 4 + (i % 4);
            if gm < m {
                let row = pc.add(gm as usize * n as usize);
                for h in 0..2u32 {
                    let gn = n0 + h * 64 + tx * 4;
                    let v = [
                        acc[i as usize][(h * 4) as usize],
                        acc[i as usize][(h * 4 + 1) as usize],
                        acc[i as usize][(h * 4 + 2) as usize],
                        acc[i as usize][(h * 4 + 3) as usize],
                    ];
                    if vec_c && gn + 4 <= n {
                        f32::stg4(row.add(gn as usize), v);
                    } else {
                        for q in 0..4u32 {
                            if gn + q < n {
                                f32::stg(row.add((gn + q) as usize), v[q as usize]);
                            }
                        }
                    }
                }
            }
        }
        vb += grid_dim();
    }
}

/// `tile_rows`: the height of the tiles `abi::matmul_prepare` chose and
/// laid the table out for (MATMUL_NARROW_BM, MATMUL_BM or MATMUL_WIDE_BM);
/// uniform over the launch, so the branch costs nothing.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn matmul_f32(jobs: *const MatmulJob, njobs: u32, total_tiles: u32, tile_rows: u32) {
    match tile_rows {
        MATMUL_WIDE_BM => matmul_impl::<MATMUL_WIDE_BM, MATMUL_WIDE_BK>(jobs, njobs, total_tiles),
        MATMUL_NARROW_BM => matmul_impl::<MATMUL_NARROW_BM, MATMUL_BK>(jobs, njobs, total_tiles),
        _ => matmul_impl::<MATMUL_BM, MATMUL_BK>(jobs, njobs, total_tiles),
    }
}
