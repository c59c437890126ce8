#!/usr/bin/env python3
"""GPU check of the erlcuda kernels' PTX (CuPy + numpy f64 references).

    python3 kernels/gpu_check.py [PTX] [--abi PATH/abi.rs] [--before OLD_PTX] [--quick]

Checks every entry of both element types (vector_add, saxpy, reduce, dot:
`<kernel>_f32` / `<kernel>_f64`; matmul_f32) at lengths 0, 1, 1023 and
2^20+7 (one job per launch), in batches of many jobs of mixed lengths and
alignments in one launch, and grid-stride with a tiny grid. Inputs are fresh
random numbers every run; outputs are poisoned with NaN before each launch
(plus one NaN guard element after each output, which must survive).
References are float64 (numpy; exact sums via math.fsum and error-free
products for f64). Tolerances:
  * vector_add: one rounding, |err| <= u |a + b|;
  * saxpy: |err| <= 2u (|alpha x| + |y|) (the kernel rounds once: fma);
  * reduce / dot: the documented summation structure (abi.rs, reduce.rs):
    |err| <= (SUM_SERIAL + SUM_TREE_DEPTH + ceil(n / SUM_CHUNK) + 1) u sum|terms|
  with u = 2^-24 (f32) or 2^-53 (f64), plus a tiny absolute floor;
  * matmul_f32: |err| <= 1e-5 (|A| |B|) elementwise, and 4096^3 timed next
    to torch.matmul (TF32 off).
Times vector_add / saxpy / reduce / dot at 2^24 (and, with --before, the
old module's vector_add_batch / reduce_batch / dot_batch at the same size).
Prints a table (also to $OUT/gpu_check.md when $OUT is set); exits non-zero
when any check fails. The launch logic mirrors the host-side helpers of
kernels/src/abi.rs, whose constants it reads (saxpy's table: the kit's Job,
kernels/kit/src/job.rs).
"""
import math
import os
import sys
import time

import numpy as np
import cupy as cp

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import ptx_launch  # noqa: E402
from ptx_launch import MM_DT, cdiv, matmul_rows, matmul_smem, matmul_table, read_abi, u32  # noqa: E402


def opt(name):
    if name in sys.argv:
        i = sys.argv.index(name)
        return sys.argv[i + 1]
    return None


_skip = {i + 1 for i, a in enumerate(sys.argv) if a in ("--abi", "--before")}
args = [a for i, a in enumerate(sys.argv) if i > 0 and i not in _skip and not a.startswith("--")]
QUICK = "--quick" in sys.argv
PTX = args[0] if args else os.path.join(HERE, "out", "erlcuda_kernels.ptx")
ABI_PATH = opt("--abi") or next(p for p in (os.path.join(HERE, "src", "abi.rs"), os.path.join(HERE, "abi.rs"))
                                if os.path.isfile(p))
BEFORE = opt("--before")

# ---- constants from abi.rs (single source of truth; parsed by ptx_launch.read_abi)
ABI = read_abi(ABI_PATH)
VADD_EPB = ABI["VADD_ELEMS_PER_BLOCK"]
# saxpy is declared with the helper crate: the kit's job ABI (kernels/kit/src/job.rs,
# beside abi.rs in the GPU bundle), virtual blocks of 256 threads x ELEMS_PER_THREAD.
KIT = read_abi(next(p for p in (os.path.join(HERE, "kit", "src", "job.rs"), os.path.join(HERE, "job.rs"))
                    if os.path.isfile(p)))
SAXPY_EPB = 256 * KIT["ELEMS_PER_THREAD"]
MAX_GRID = 132 * 64  # VADD_MAX_GRID = REDUCE_MAX_GRID (expressions in abi.rs) = gpud's KIT_MAX_GRID
SMALL_MAX, MEDIUM_MAX, CHUNK = ABI["REDUCE_SMALL_MAX"], ABI["REDUCE_MEDIUM_MAX"], ABI["REDUCE_LARGE_CHUNK"]
SUM_SERIAL, SUM_DEPTH, SUM_CHUNK = ABI["SUM_SERIAL"], ABI["SUM_TREE_DEPTH"], ABI["SUM_CHUNK"]
WARPS = 256 // 32
REDUCE_SMEM = ABI["REDUCE_SMEM_BYTES"]
BN = ABI["MATMUL_BN"]
# matmul_f32's tile heights: the batch cases run under each
MM_ROWS = (ABI["MATMUL_NARROW_BM"], ABI["MATMUL_BM"], ABI["MATMUL_WIDE_BM"])

TYPES = {"f32": (np.float32, 2.0 ** -24), "f64": (np.float64, 2.0 ** -53)}
# kit Job (256 bytes, ec_job_args): addr[12] (x slot 0, y slot 1, out slot 8),
# len[12] u32, param[8] (saxpy: alpha's f64 bits in param[0]), block_start,
# then the wire's buffers and launch options (0 here).
SAXPY_DT = np.dtype([("addr", "<u8", 12), ("len", "<u4", 12), ("alpha", "<f8"), ("param", "<u8", 7),
                     ("block_start", "<u8"), ("wire", "<u4", 10)])
assert SAXPY_DT.itemsize == 256

mod = cp.RawModule(path=PTX)


def entry(prefix_const, t):
    return ABI[prefix_const] + "_" + t


K = {}
for _t in TYPES:
    for _k, _c in (("vector_add", "ENTRY_VECTOR_ADD"), ("saxpy", "ENTRY_SAXPY"), ("reduce", "ENTRY_REDUCE"),
                   ("dot", "ENTRY_DOT")):
        K[(_k, _t)] = (entry(_c, _t), mod.get_function(entry(_c, _t)))
K_MM = {entry("ENTRY_MATMUL", "f32"): mod.get_function(entry("ENTRY_MATMUL", "f32"))}

rng = np.random.default_rng(int(time.time() * 1000) % 2**32)
rows = []
failed = False


def report(kernel, case, ok, detail):
    global failed
    failed |= not ok
    rows.append((kernel, case, "PASS" if ok else "FAIL", detail))
    print(f"{kernel:15} {case:42} {'PASS' if ok else 'FAIL'}  {detail}", flush=True)


def alloc_vec(n, misalign, dt):
    """Random vector on the device; returns (array_to_keep, device_ptr, host_copy).
    misalign: start one element in (never 16-byte aligned for f32 or f64)."""
    h = rng.standard_normal(n + 1).astype(dt)
    d = cp.asarray(h)
    off = 1 if misalign else 0
    return d, d.data.ptr + h.itemsize * off, h[off:off + n]


def alloc_out(n, misalign, dt):
    """NaN-poisoned output of n elements plus a NaN guard element after it."""
    off = 1 if misalign else 0
    d = cp.full(n + 2, np.nan, dtype=dt)
    return d, d.data.ptr + d.itemsize * off, off


def read_out(d, off, n):
    """(the n outputs, guard intact?)"""
    h = cp.asnumpy(d)
    return h[off:off + n], bool(np.isnan(h[off + n]))


def events_time(fn, reps=20, warm=3):
    return float(np.median(ptx_launch.cupy_event_times(cp, fn, reps, warm)))


# --- error-free transformations (float64 numpy arrays)
def _split(a):
    c = 134217729.0 * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def exact_sum(*parts):
    """Sum of all elements of the float64 arrays, correctly rounded."""
    return math.fsum(np.concatenate([p.ravel() for p in parts]).tolist()) if parts else 0.0


# ---------------------------------------------------------------- vector_add
def vadd_case(t, lens, misalign, grid=None, label="", check=True, kern=None, name=None):
    dt, u = TYPES[t]
    if kern is None:
        name, kern = K[("vector_add", t)]
    keep, table, hs, acc = [], np.zeros((len(lens), 5), dtype=np.uint64), [], 0
    for i, n in enumerate(lens):
        da, pa, ha = alloc_vec(n, misalign[i], dt)
        db, pb, hb = alloc_vec(n, misalign[i], dt)
        do, po, off = alloc_out(n, misalign[i], dt)
        keep += [da, db, do]
        hs.append((ha, hb, do, off))
        table[i] = (pa, pb, po, n, acc)
        acc += cdiv(n, VADD_EPB)
    total = acc
    dt_dev = cp.asarray(table)
    g = grid or min(total, MAX_GRID)
    launch = lambda: kern((g,), (256,), (dt_dev, u32(len(lens)), u32(total)))  # noqa: E731
    if total:
        launch()
    cp.cuda.Device().synchronize()
    if not check:
        return launch, keep
    bad = bitwise = 0
    worst = 0.0
    for n, (ha, hb, do, off) in zip(lens, hs):
        got, guard = read_out(do, off, n)
        ref = ha.astype(np.float64) + hb.astype(np.float64)
        err = np.abs(got.astype(np.float64) - ref)
        tol = u * np.abs(ref) + np.finfo(dt).tiny
        ok = guard and bool(np.all(err <= tol))
        bad += not ok
        bitwise += bool(np.array_equal(got.view(np.uint8), (ha + hb).view(np.uint8)))
        if n:
            worst = max(worst, float(np.max(err / np.maximum(np.abs(ref), 1e-300))))
    report(name, f"{len(lens)} jobs {label}", bad == 0,
           f"<=1 rounding; {bad} bad; bitwise=numpy {bitwise}/{len(lens)}; max rel {worst:.1e}; grid={g} vblocks={total}")
    return launch, keep


# --------------------------------------------------------------------- saxpy
def saxpy_case(t, lens, misalign, grid=None, label="", check=True):
    dt, u = TYPES[t]
    name, kern = K[("saxpy", t)]
    keep, table, hs, acc = [], np.zeros(len(lens), dtype=SAXPY_DT), [], 0
    for i, n in enumerate(lens):
        dx, px, hx = alloc_vec(n, misalign[i], dt)
        dy, py, hy = alloc_vec(n, misalign[i], dt)
        do, po, off = alloc_out(n, misalign[i], dt)
        alpha = float(rng.standard_normal()) * (1 + 3 * (i % 2))
        keep += [dx, dy, do]
        hs.append((hx.copy(), hy.copy(), alpha, do, off))
        addr, lens = [0] * 12, [0] * 12
        addr[0], addr[1], addr[8] = px, py, po
        lens[0], lens[1], lens[8] = n, n, n
        table[i] = (addr, lens, alpha, [0] * 7, acc, [0] * 10)
        acc += cdiv(n, SAXPY_EPB)
    total = acc
    dt_dev = cp.asarray(table.view(np.uint8))
    g = grid or min(total, MAX_GRID)
    launch = lambda: kern((g,), (256,), (dt_dev, u32(len(lens)), u32(total)))  # noqa: E731
    if total:
        launch()
    cp.cuda.Device().synchronize()
    if not check:
        return launch, keep
    bad = 0
    worst = 0.0
    for n, (hx, hy, alpha, do, off) in zip(lens, hs):
        got, guard = read_out(do, off, n)
        x, y = hx.astype(np.float64), hy.astype(np.float64)
        a = float(np.float32(alpha)) if t == "f32" else alpha
        p, e = two_prod(np.full_like(x, a), x)  # e == 0 for f32 inputs
        s, f = two_sum(p, y)
        err = np.abs((got.astype(np.float64) - s) - (f + e))
        scale = np.abs(p) + np.abs(y)
        tol = 2 * u * scale + np.finfo(dt).tiny
        ok = guard and bool(np.all(err <= tol))
        bad += not ok
        if n:
            worst = max(worst, float(np.max(err / np.maximum(scale, 1e-300))))
    report(name, f"{len(lens)} jobs {label}", bad == 0,
           f"{bad} bad; max err/(|ax|+|y|)={worst:.1e} (tol {2*u:.1e}); grid={g} vblocks={total}")
    return launch, keep


# ------------------------------------------------------------ reduce / dot
def reduce_case(t, dot, lens, misalign, grid=None, label="", check=True, kern=None, name=None):
    dt, u = TYPES[t]
    if kern is None:
        name, kern = K[("dot" if dot else "reduce", t)]
    jobs, keep = [], []
    for i, n in enumerate(lens):
        da, pa, ha = alloc_vec(n, misalign[i], dt)
        keep.append(da)
        if dot:
            db, pb, hb = alloc_vec(n, misalign[i], dt)
            keep.append(db)
        else:
            pb, hb = 0, None
        jobs.append(dict(n=n, pa=pa, pb=pb, ha=ha, hb=hb, slot=i))
    out = cp.full(len(lens) + 1, np.nan, dtype=dt)  # last: guard
    isz = out.itemsize
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
        table[r] = (j["pa"], j["pb"], out.data.ptr + isz * j["slot"], j["n"], bs)
    total = cdiv(len(small), WARPS) + len(med) + acc
    dt_dev = cp.asarray(table)
    large_slots = cp.asarray(np.array([j["slot"] for j in large], dtype=np.int64))
    g = grid or min(total, MAX_GRID)

    def launch():
        if len(large):
            out[large_slots] = 0.0  # host prep: large outputs start at 0
        kern((g,), (256,), (dt_dev, u32(len(small)), u32(len(med)), u32(len(large)), u32(total)),
             shared_mem=REDUCE_SMEM)

    launch()
    cp.cuda.Device().synchronize()
    if not check:
        return launch, keep
    got = cp.asnumpy(out)
    worst, bad = 0.0, 0
    if not np.isnan(got[-1]):
        bad += 1
    for j in jobs:
        a = j["ha"].astype(np.float64)
        if dot:
            p, e = two_prod(a, j["hb"].astype(np.float64))
            ref = exact_sum(p, e)
            sabs = float(np.abs(p).sum())
        else:
            ref = exact_sum(a)
            sabs = float(np.abs(a).sum())
        n = j["n"]
        tol = (SUM_SERIAL + SUM_DEPTH + cdiv(n, SUM_CHUNK) + 1) * u * sabs + np.finfo(dt).tiny
        v = float(got[j["slot"]])
        err = abs(v - ref)
        if not (err <= tol) or (n == 0 and v != 0.0):
            bad += 1
        if sabs > 0:
            worst = max(worst, err / (u * sabs))
    report(name, f"{len(lens)} jobs {label}", bad == 0,
           f"{bad} bad; max err/(u sum|terms|)={worst:.2f} (tol >= {SUM_SERIAL + SUM_DEPTH + 2}); "
           f"S/M/L={len(small)}/{len(med)}/{len(large)} grid={g}")
    return launch, keep


# ------------------------------------------------------------------ matmul
def mm_jobs(shapes, misalign, rows=None):
    """Jobs of these shapes and their table, for tiles `rows` high (None:
    as gpud chooses, matmul_rows). Returns (jobs, keep, table, total, rows)."""
    jobs, keep = [], []
    for (m, n, k), mis in zip(shapes, misalign):
        da, pa, ha = alloc_vec(m * k, mis, np.float32)
        db, pb, hb = alloc_vec(k * n, mis, np.float32)
        dc = cp.full(m * n + 1, np.nan, dtype=cp.float32)
        pc = dc.data.ptr + (4 if mis else 0)
        keep += [da, db, dc]
        jobs.append(dict(m=m, n=n, k=k, pa=pa, pb=pb, pc=pc, ha=ha.reshape(m, k), hb=hb.reshape(k, n),
                         dc=dc, off=1 if mis else 0))
    t = [(j["pa"], j["pb"], j["pc"], j["m"], j["n"], j["k"]) for j in jobs]
    rows = rows or matmul_rows(t, ABI)
    table, acc = matmul_table(t, rows, BN)
    assert table.dtype == MM_DT
    return jobs, keep, cp.asarray(table.view(np.uint8)), acc, rows


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


def matmul_batch_case(name, kern, shapes, misalign, grid=None, label="", rows=None):
    jobs, keep, dt_dev, total, rows = mm_jobs(shapes, misalign, rows)
    g = grid or total
    kern((g,), (256,), (dt_dev, u32(len(jobs)), u32(total), u32(rows)), shared_mem=matmul_smem(ABI, rows))
    cp.cuda.Device().synchronize()
    for j in jobs:
        ok, rel = mm_check(j)
        report(name, f"{j['m']}x{j['n']}x{j['k']}{' unaligned' if j['off'] else ''} {label}", ok,
               f"max err/sum(abs a*b)={rel:.2e}")


# ------------------------------------------------------------------- timing
def timing(old_mod):
    N = 2 ** 24
    for t in TYPES:
        isz = np.dtype(TYPES[t][0]).itemsize
        cases = [("vector_add", 3, lambda: vadd_case(t, [N], [False], check=False)),
                 ("saxpy", 3, lambda: saxpy_case(t, [N], [False], check=False)),
                 ("reduce", 1, lambda: reduce_case(t, False, [N], [False], check=False)),
                 ("dot", 2, lambda: reduce_case(t, True, [N], [False], check=False))]
        for kname, nvec, mk in cases:
            launch, keep = mk()
            s = events_time(launch, reps=20, warm=3)
            report(K[(kname, t)][0], "timing 2^24", True,
                   f"{s*1e3:.4f} ms, {nvec*isz*N/s/1e9:.0f} GB/s" + (" (incl. zeroing out)" if nvec < 3 else ""))
            del keep
    if old_mod is None:
        return
    # the previous module's f32 entries, same tables and harness
    launch, keep = vadd_case("f32", [N], [False], label="(before)", kern=old_mod.get_function("vector_add_batch"),
                             name="vector_add_batch")
    s = events_time(launch, reps=20, warm=3)
    report("vector_add_batch", "timing 2^24 (before)", True, f"{s*1e3:.4f} ms, {12*N/s/1e9:.0f} GB/s")
    for nm, dot in (("reduce_batch", False), ("dot_batch", True)):
        launch, keep = reduce_case("f32", dot, [N], [False], label="(before)", kern=old_mod.get_function(nm), name=nm)
        s = events_time(launch, reps=20, warm=3)
        report(nm, "timing 2^24 (before)", True,
               f"{s*1e3:.4f} ms, {(8 if dot else 4)*N/s/1e9:.0f} GB/s (incl. zeroing out)")


def main():
    print(f"PTX: {PTX}\nabi: {ABI_PATH}")
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"CC {cp.cuda.Device().compute_capability}")
    lens_req = [0, 1, 1023, 2 ** 20 + 7]
    rnd = lambda k, hi: [int(x) for x in rng.integers(0, hi, k)]  # noqa: E731
    for t in TYPES:
        # ---- vector_add / saxpy
        for n in lens_req:
            vadd_case(t, [n], [False], label=f"n={n}")
        lens = lens_req * 3 + [4096, 4097, 5] + rnd(60, 70000) + [2 ** 22 + 3]
        mis = [i % 3 == 1 for i in range(len(lens))]
        vadd_case(t, lens, mis, label="batch mixed, 1/3 unaligned")
        vadd_case(t, lens_req * 3, [i % 2 == 1 for i in range(12)], grid=5, label="grid-stride grid=5")
        for n in lens_req:
            saxpy_case(t, [n], [False], label=f"n={n}")
        saxpy_case(t, lens, mis, label="batch mixed, 1/3 unaligned")
        saxpy_case(t, lens_req * 3, [i % 2 == 1 for i in range(12)], grid=5, label="grid-stride grid=5")
        # (no in-place case: the kit's ABI never has an output overlap an input)
        # ---- reduce / dot
        for dot in (False, True):
            for n in lens_req:
                reduce_case(t, dot, [n], [False], label=f"n={n}")
            lens = lens_req * 3 + [2048, 2049, 65536, 65537, 131072] + rnd(60, 200000) + [2 ** 22 + 3]
            mis = [i % 3 == 1 for i in range(len(lens))]
            reduce_case(t, dot, lens, mis, label="batch mixed, 1/3 unaligned")
            reduce_case(t, dot, lens_req * 2 + [2 ** 22 + 3], [True] * 9, grid=7, label="grid-stride grid=7, unaligned")
    # ---- matmul_f32
    shapes = [(1, 1, 1), (7, 13, 5), (129, 65, 257), (1000, 1000, 1000), (5, 3, 0), (0, 5, 5),
              (128, 128, 128), (130, 4, 9), (64, 200, 33), (300, 1, 700), (1, 517, 64)]
    mis = [False, False, False, False, False, False, False, False, True, False, True]
    for name, kern in K_MM.items():
        for r in MM_ROWS:
            matmul_batch_case(name, kern, shapes, mis, label=f"(batch, {r}-row tiles)", rows=r)
            matmul_batch_case(name, kern, shapes[:3] + shapes[4:], mis[:3] + mis[4:], grid=3,
                              label=f"(grid=3, {r}-row tiles)", rows=r)
    # ---- timings
    timing(cp.RawModule(path=BEFORE) if BEFORE else None)
    N = 4096
    jobs, keep, dt_dev, total, tile_rows = mm_jobs([(N, N, N)], [False])
    flops = 2.0 * N ** 3
    results = {}
    for name, kern in K_MM.items():
        j = jobs[0]
        j["dc"].fill(np.nan)
        f = lambda: kern((total,), (256,), (dt_dev, u32(1), u32(total), u32(tile_rows)),  # noqa: E731
                         shared_mem=matmul_smem(ABI, tile_rows))
        f()
        cp.cuda.Device().synchronize()
        ok, rel = mm_check(j, sample=4096)
        s = events_time(f, reps=20, warm=5)
        results[name] = flops / s / 1e12
        report(name, "4096^3 (sampled f64 check)", ok,
               f"max rel={rel:.2e}; {s*1e3:.3f} ms = {results[name]:.1f} TFLOP/s")
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
