#!/usr/bin/env python3
"""GPU check of the erlcuda kernels' PTX (CuPy + numpy f64 references).

    python3 kernels/gpu_check.py [PTX] [--quick]

Runs every kernel in batched form (many jobs of mixed sizes in one launch),
on fresh random inputs with outputs poisoned with NaN, against f64 numpy
references; times matmul 4096^3 next to torch.matmul (TF32 off). Prints a
table; exits non-zero when any check fails. The launch logic mirrors the
host-side helpers in kernels/src/abi.rs (constants are read from that file).
"""
import os
import sys
import time

import numpy as np
import cupy as cp

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import ptx_launch  # noqa: E402
from ptx_launch import MM_DT, cdiv, matmul_smem, matmul_table, read_abi, u32  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
QUICK = "--quick" in sys.argv
PTX = args[0] if args else os.path.join(HERE, "out", "erlcuda_kernels.ptx")

# ---- constants from abi.rs (single source of truth; parsed by ptx_launch.read_abi)
ABI = read_abi(os.path.join(HERE, "src", "abi.rs"))
VADD_EPB = ABI["VADD_ELEMS_PER_BLOCK"]
VADD_MAX_GRID = 132 * 64
SMALL_MAX, MEDIUM_MAX, CHUNK = ABI["REDUCE_SMALL_MAX"], ABI["REDUCE_MEDIUM_MAX"], ABI["REDUCE_LARGE_CHUNK"]
WARPS = 256 // 32
REDUCE_SMEM = ABI["REDUCE_SMEM_BYTES"]
BM, BN = ABI["MATMUL_BM"], ABI["MATMUL_BN"]
MATMUL_SMEM = matmul_smem(ABI)

mod = cp.RawModule(path=PTX)
K_VADD = mod.get_function("vector_add_batch")
K_RED = mod.get_function("reduce_batch")
K_DOT = mod.get_function("dot_batch")
K_MM = {name: mod.get_function(name) for name in ("matmul_batch", "matmul_batch_bk16")}

rng = np.random.default_rng(int(time.time()))
rows = []
failed = False


def report(kernel, case, ok, detail):
    global failed
    failed |= not ok
    rows.append((kernel, case, "PASS" if ok else "FAIL", detail))
    print(f"{kernel:18} {case:40} {'PASS' if ok else 'FAIL'}  {detail}", flush=True)


def alloc_vec(n, misalign):
    """Random f32 vector on the device; returns (array_to_keep, device_ptr, host_copy)."""
    h = rng.standard_normal(n + 1).astype(np.float32)
    d = cp.asarray(h)
    off = 1 if misalign else 0
    return d, d.data.ptr + 4 * off, h[off:off + n]


def events_time(fn, reps=20, warm=3):
    return float(np.median(ptx_launch.cupy_event_times(cp, fn, reps, warm)))


# ---------------------------------------------------------------- vector_add
def vadd_case(lens, misalign, grid=None, label=""):
    keep, table = [], np.zeros((len(lens), 5), dtype=np.uint64)
    hs = []
    acc = 0
    for i, n in enumerate(lens):
        da, pa, ha = alloc_vec(n, misalign[i])
        db, pb, hb = alloc_vec(n, misalign[i])
        do = cp.full(n + 1, np.nan, dtype=cp.float32)
        po = do.data.ptr + (4 if misalign[i] else 0)
        keep += [da, db, do]
        hs.append((ha, hb, do, 1 if misalign[i] else 0))
        table[i] = (pa, pb, po, n, acc)
        acc += cdiv(n, VADD_EPB)
    total = acc
    dt = cp.asarray(table)
    g = grid or min(total, VADD_MAX_GRID)
    launch = lambda: K_VADD((g,), (256,), (dt, u32(len(lens)), u32(total)))
    if total:
        launch()
    cp.cuda.Device().synchronize()
    bad = 0
    for n, (ha, hb, do, off) in zip(lens, hs):
        got = cp.asnumpy(do)[off:off + n]
        ref = ha + hb
        if not np.array_equal(got.view(np.uint32), ref.view(np.uint32)):
            bad += 1
    report("vector_add_batch", f"{len(lens)} jobs {label}", bad == 0,
           f"exact; {bad} bad jobs; grid={g} vblocks={total}")
    return launch, total


# ------------------------------------------------------------ reduce / dot
def reduce_case(kernel, dot, lens, misalign, grid=None, label=""):
    jobs = []
    keep = []
    for i, n in enumerate(lens):
        da, pa, ha = alloc_vec(n, misalign[i])
        keep.append(da)
        if dot:
            db, pb, hb = alloc_vec(n, misalign[i])
            keep.append(db)
        else:
            pb, hb = 0, None
        jobs.append(dict(n=n, pa=pa, pb=pb, ha=ha, hb=hb, slot=i))
    out = cp.full(len(lens), np.nan, dtype=cp.float32)
    # partition small | medium | large (as abi::reduce_prepare)
    small = [j for j in jobs if j["n"] <= SMALL_MAX]
    med = [j for j in jobs if SMALL_MAX < j["n"] <= MEDIUM_MAX]
    large = [j for j in jobs if j["n"] > MEDIUM_MAX]
    table = np.zeros((len(jobs), 5), dtype=np.uint64)
    acc = 0
    for r, j in enumerate(small + med + large):
        bs = 0
        if j["n"] > MEDIUM_MAX:
            bs = acc
            acc += cdiv(j["n"], CHUNK)
        table[r] = (j["pa"], j["pb"], out.data.ptr + 4 * j["slot"], j["n"], bs)
    total = cdiv(len(small), WARPS) + len(med) + acc
    dt = cp.asarray(table)
    large_slots = cp.asarray(np.array([j["slot"] for j in large], dtype=np.int64))
    g = grid or min(total, 132 * 64)

    def launch():
        if len(large):
            out[large_slots] = 0.0  # host prep: large outputs start at 0
        kernel((g,), (256,), (dt, u32(len(small)), u32(len(med)), u32(len(large)), u32(total)),
               shared_mem=REDUCE_SMEM)

    launch()
    cp.cuda.Device().synchronize()
    got = cp.asnumpy(out)
    worst = 0.0
    bad = 0
    for j in jobs:
        a = j["ha"].astype(np.float64)
        terms = a * j["hb"].astype(np.float64) if dot else a
        ref = terms.sum()
        tol = 1e-5 * np.abs(terms).sum()
        err = abs(float(got[j["slot"]]) - ref)
        if not (err <= tol) or (j["n"] == 0 and got[j["slot"]] != 0.0):
            bad += 1
        if tol > 0:
            worst = max(worst, err / (np.abs(terms).sum()))
    name = "dot_batch" if dot else "reduce_batch"
    report(name, f"{len(lens)} jobs {label}", bad == 0,
           f"{bad} bad; max err/sum(abs terms)={worst:.2e}; S/M/L={len(small)}/{len(med)}/{len(large)} grid={g}")
    return launch


# ------------------------------------------------------------------ matmul
def mm_jobs(shapes, misalign):
    jobs, keep = [], []
    for (m, n, k), mis in zip(shapes, misalign):
        da, pa, ha = alloc_vec(m * k, mis)
        db, pb, hb = alloc_vec(k * n, mis)
        dc = cp.full(m * n + 1, np.nan, dtype=cp.float32)
        pc = dc.data.ptr + (4 if mis else 0)
        keep += [da, db, dc]
        jobs.append(dict(m=m, n=n, k=k, pa=pa, pb=pb, pc=pc, ha=ha.reshape(m, k), hb=hb.reshape(k, n),
                         dc=dc, off=1 if mis else 0))
    table, acc = matmul_table([(j["pa"], j["pb"], j["pc"], j["m"], j["n"], j["k"]) for j in jobs], BM, BN)
    assert table.dtype == MM_DT
    return jobs, keep, cp.asarray(table.view(np.uint8)), acc


def mm_check(j, sample=None):
    m, n = j["m"], j["n"]
    got = cp.asnumpy(j["dc"])[j["off"]:j["off"] + m * n].reshape(m, n)
    A, B = j["ha"].astype(np.float64), j["hb"].astype(np.float64)
    if sample is None:
        ref = A @ B
        bound = np.abs(A) @ np.abs(B)
        g = got
    else:
        ii = rng.integers(0, m, sample)
        jj = rng.integers(0, n, sample)
        ref = np.einsum("sk,ks->s", A[ii], B[:, jj])
        bound = np.einsum("sk,ks->s", np.abs(A[ii]), np.abs(B[:, jj]))
        g = got[ii, jj]
    err = np.abs(g.astype(np.float64) - ref)
    ok = bool(np.all(err <= 1e-5 * bound + 1e-30)) and not np.isnan(g).any()
    rel = float(np.max(err / np.maximum(bound, 1e-30))) if err.size else 0.0
    return ok, rel


def matmul_batch_case(name, kern, shapes, misalign, grid=None, label=""):
    jobs, keep, dt, total = mm_jobs(shapes, misalign)
    g = grid or total
    kern((g,), (256,), (dt, u32(len(jobs)), u32(total)), shared_mem=MATMUL_SMEM)
    cp.cuda.Device().synchronize()
    for j in jobs:
        ok, rel = mm_check(j)
        report(name, f"{j['m']}x{j['n']}x{j['k']}{' unaligned' if j['off'] else ''} {label}", ok,
               f"max err/sum(abs a*b)={rel:.2e}")


def main():
    print(f"PTX: {PTX}")
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"CC {cp.cuda.Device().compute_capability}")
    sizes = [0, 1, 7, 1000, 4097, 2**20 + 7]
    # ---- vector_add
    lens = sizes * 4 + [int(x) for x in rng.integers(0, 70000, 200)] + [2**26]
    mis = [i % 3 == 1 for i in range(len(lens) - 1)] + [False]
    launch, _ = vadd_case(lens, mis, label="mixed+2^26")
    t = events_time(launch, reps=10)
    nbytes = 12 * sum(lens)
    report("vector_add_batch", "timing (batch above)", True, f"{t*1e3:.3f} ms, {nbytes/t/1e9:.0f} GB/s")
    vadd_case(sizes * 3, [i % 2 == 1 for i in range(18)], grid=5, label="grid-stride grid=5")
    # ---- reduce / dot
    for kern, dot in ((K_RED, False), (K_DOT, True)):
        lens = sizes * 4 + [2048, 2049, 65536, 65537, 131072] + [int(x) for x in rng.integers(0, 200000, 300)] + [2**26]
        mis = [i % 3 == 1 for i in range(len(lens) - 1)] + [False]
        launch = reduce_case(kern, dot, lens, mis, label="mixed+2^26")
        reduce_case(kern, dot, sizes * 2 + [2**26 + 3], [True] * 12 + [True], grid=7, label="grid-stride, unaligned 2^26+3")
        big = reduce_case(kern, dot, [2**26], [False], label="single 2^26 (timing)")
        t = events_time(big, reps=10)
        report("dot_batch" if dot else "reduce_batch", "timing 2^26", True,
               f"{t*1e3:.3f} ms, {(8 if dot else 4)*2**26/t/1e9:.0f} GB/s (incl. zeroing out)")
    # ---- matmul
    shapes = [(1, 1, 1), (7, 13, 5), (129, 65, 257), (1000, 1000, 1000), (5, 3, 0), (0, 5, 5),
              (128, 128, 128), (130, 4, 9), (64, 200, 33), (300, 1, 700), (1, 517, 64)]
    mis = [False, False, False, False, False, False, False, False, True, False, True]
    for name, kern in K_MM.items():
        matmul_batch_case(name, kern, shapes, mis, label="(batch)")
        matmul_batch_case(name, kern, shapes[:3] + shapes[4:], mis[:3] + mis[4:], grid=3, label="(grid=3)")
    # ---- 4096^3 timed
    N = 4096
    jobs, keep, dt, total = mm_jobs([(N, N, N)], [False])
    flops = 2.0 * N ** 3
    results = {}
    for name, kern in K_MM.items():
        j = jobs[0]
        j["dc"].fill(np.nan)
        f = lambda: kern((total,), (256,), (dt, u32(1), u32(total)), shared_mem=MATMUL_SMEM)
        f()
        cp.cuda.Device().synchronize()
        ok, rel = mm_check(j, sample=4096)
        t = events_time(f, reps=20, warm=5)
        results[name] = flops / t / 1e12
        report(name, "4096^3 (sampled f64 check)", ok,
               f"max rel={rel:.2e}; {t*1e3:.3f} ms = {results[name]:.1f} TFLOP/s")
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        A = torch.randn(N, N, device="cuda", dtype=torch.float32)
        B = torch.randn(N, N, device="cuda", dtype=torch.float32)
        for _ in range(5):
            torch.matmul(A, B)
        torch.cuda.synchronize()
        ts = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.matmul(A, B)
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e-3)
        tt = float(np.median(ts))
        tf = flops / tt / 1e12
        report("torch.matmul", "4096^3 fp32 (allow_tf32=False)", True, f"{tt*1e3:.3f} ms = {tf:.1f} TFLOP/s")
        for name, v in results.items():
            print(f"  {name}: {v:.1f} TFLOP/s = {100*v/tf:.0f}% of torch/cuBLAS")
    except Exception as e:  # noqa
        report("torch.matmul", "4096^3", False, f"torch failed: {e!r}")

    print("\n| kernel | case | result | detail |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_check.md"), "w") as fh:
            fh.write("| kernel | case | result | detail |\n|---|---|---|---|\n")
            for r in rows:
                fh.write("| " + " | ".join(r) + " |\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
