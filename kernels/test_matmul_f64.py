#!/usr/bin/env python3
"""GPU check of matmul_batch_f64 (CuPy launches, numpy/torch f64 references).

    python3 kernels/test_matmul_f64.py [PTX_DIR] [--quick]

PTX_DIR holds erlcuda_kernels.ptx and erlcuda_kernels_sm80.ptx (what
`kernels/build.sh PTX_DIR` writes; default: this script's folder). The ABI
constants come from abi.rs + matmul_f64_abi.rs, beside this script or in its
src/ folder.

1. Correctness, for the entry of BOTH modules (sm80 = FP64 tensor cores,
   plain = the SIMT path every CC >= 7.0 gets): a batch of odd shapes in ONE
   launch (zeros shapes, 16-byte-misaligned operands included), again with
   grid.x = 3 (grid-stride), on fresh uniform [-1, 1) inputs, outputs and
   guard elements around them poisoned with NaN. Error of an element:
   |got - ref| / (|A|·|B|)[i, j]; must stay under 1e-12, guards untouched.
2. Timing (CUDA events, median of 20 after 5 warm-ups, the better of two
   rounds) at 2048^3 and 4096^3 of the sm80 entry against cuBLAS DGEMM
   (torch.matmul on float64), its result checked against cuBLAS's.
Exits non-zero when a check fails.
"""
import os
import sys
import time

import numpy as np
import cupy as cp

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from ptx_launch import MM_DT, cupy_event_times, matmul_table, read_abi, u32  # noqa: E402

ABI_PATH = next(p for p in (os.path.join(HERE, "abi.rs"), os.path.join(HERE, "src", "abi.rs")) if os.path.exists(p))
ABI = read_abi(ABI_PATH)
BM, BN = ABI["MATMUL_F64_BM"], ABI["MATMUL_F64_BN"]
SMEM = ABI["MATMUL_F64_SMEM_BYTES"]
THREADS = ABI["MATMUL_F64_THREADS"]
ENTRY = ABI["ENTRY_MATMUL_F64"]
TOL = 1e-12

rng = np.random.default_rng(int(time.time() * 1e6) % 2**32)
failed = False
rows = []


def report(what, case, ok, detail):
    global failed
    failed |= not ok
    rows.append((what, case, "PASS" if ok else "FAIL", detail))
    print(f"{what:22} {case:34} {'PASS' if ok else 'FAIL'}  {detail}", flush=True)


def load_entry(ptx, entry=ENTRY):
    return cp.RawModule(path=ptx).get_function(entry)


def uniform(n):
    return rng.uniform(-1.0, 1.0, n)


class Case:
    """One job: A (m×k), B (k×n) random; C poisoned, with GUARD NaNs on both
    sides. `mis` offsets every operand by one f64, so 8- but not 16-byte
    aligned (the scalar copy and store paths)."""
    GUARD = 3

    def __init__(self, m, n, k, mis=False):
        self.m, self.n, self.k, self.mis = m, n, k, mis
        off = 1 if mis else 0
        self.ha = uniform(m * k).reshape(m, k)
        self.hb = uniform(k * n).reshape(k, n)
        self.da = cp.asarray(np.concatenate([np.zeros(off), self.ha.ravel()]))
        self.db = cp.asarray(np.concatenate([np.zeros(off), self.hb.ravel()]))
        self.c0 = self.GUARD + off
        self.dc = cp.full(self.c0 + m * n + self.GUARD, np.nan)
        self.ptrs = (self.da.data.ptr + 8 * off, self.db.data.ptr + 8 * off, self.dc.data.ptr + 8 * self.c0)

    def poison(self):
        self.dc.fill(np.nan)

    def check(self):
        """(ok, max error relative to |A|·|B|)."""
        m, n = self.m, self.n
        out = cp.asnumpy(self.dc)
        guards = np.concatenate([out[:self.c0], out[self.c0 + m * n:]])
        got = out[self.c0:self.c0 + m * n].reshape(m, n)
        ref = self.ha @ self.hb
        bound = np.abs(self.ha) @ np.abs(self.hb)
        if np.isnan(got).any() or not np.isnan(guards).all():
            return False, float("nan")
        if self.k == 0:
            return bool((got == 0).all()), 0.0
        rel = np.abs(got - ref) / np.maximum(bound, 1e-300)
        worst = float(rel.max()) if rel.size else 0.0
        return worst <= TOL, worst

    @property
    def label(self):
        return f"{self.m}x{self.n}x{self.k}" + (" mis16" if self.mis else "")


def launch(fn, cases, grid=None, bm=BM, bn=BN, smem=SMEM):
    table, total = matmul_table([c.ptrs + (c.m, c.n, c.k) for c in cases], bm, bn)
    assert table.dtype == MM_DT
    dt = cp.asarray(table.view(np.uint8))
    for c in cases:
        c.poison()
    if total:
        fn((grid or total,), (THREADS,), (dt, u32(len(cases)), u32(total)), shared_mem=smem)
    cp.cuda.Device().synchronize()
    return total


SHAPES = [(1, 1, 1), (0, 5, 7), (5, 0, 7), (5, 7, 0), (17, 33, 65), (127, 129, 131), (1000, 1, 1000),
          (256, 256, 256), (128, 64, 16), (129, 65, 17), (3, 1000, 5), (1, 517, 64), (300, 2, 1)]
MIS_SHAPES = [(17, 33, 65), (127, 129, 131), (256, 256, 256), (64, 200, 34)]


def correctness(name, fn, bm=BM, bn=BN, smem=SMEM):
    cases = [Case(*s) for s in SHAPES] + [Case(*s, mis=True) for s in MIS_SHAPES]
    for grid, tag in ((None, "batch"), (3, "grid=3")):
        total = launch(fn, cases, grid, bm, bn, smem)
        worst = 0.0
        for c in cases:
            ok, rel = c.check()
            worst = max(worst, rel) if rel == rel else worst
            report(name, f"{c.label} ({tag})", ok, f"max err/(|A||B|)={rel:.2e}")
        report(name, f"{len(cases)} jobs, one launch ({tag})", all(c.check()[0] for c in cases),
               f"tiles={total}; worst {worst:.2e}")


def cuda_times(fn, reps=20, warm=5):
    """Median seconds per call, CUDA events (ptx_launch's timing)."""
    return float(np.median(cupy_event_times(cp, fn, reps, warm)))


def timing(kernels, sizes, quick=False):
    """kernels: {label: (fn, bm, bn, smem)}; returns {(label, N): TFLOP/s}."""
    import torch
    res = {}
    for N in sizes:
        A = torch.rand(N, N, dtype=torch.float64, device="cuda") * 2 - 1
        B = torch.rand(N, N, dtype=torch.float64, device="cuda") * 2 - 1
        ref = torch.matmul(A, B)
        bound = torch.matmul(A.abs(), B.abs())
        torch.cuda.synchronize()
        C = cp.full((N, N), np.nan)
        flops = 2.0 * N ** 3
        for label, (fn, bm, bn, smem) in kernels.items():
            table, total = matmul_table([(A.data_ptr(), B.data_ptr(), C.data.ptr, N, N, N)], bm, bn)
            dt = cp.asarray(table.view(np.uint8))
            C.fill(np.nan)
            go = lambda: fn((total,), (THREADS,), (dt, u32(1), u32(total)), shared_mem=smem)  # noqa: E731
            go()
            cp.cuda.Device().synchronize()
            got = torch.as_tensor(C, device="cuda")
            rel = float(((got - ref).abs() / bound).max())
            ok = rel <= TOL and not bool(torch.isnan(got).any())
            ts = [cuda_times(go) for _ in range(1 if quick else 2)]
            res[(label, N)] = flops / min(ts) / 1e12
            report(label, f"{N}^3", ok, f"err vs cuBLAS/(|A||B|)={rel:.1e}; "
                   + ", ".join(f"{t*1e3:.3f} ms" for t in ts) + f" = {res[(label, N)]:.1f} TFLOP/s")
        mm = lambda: torch.matmul(A, B, out=ref)  # noqa: E731
        ts = [cuda_times(mm) for _ in range(1 if quick else 2)]
        res[("cuBLAS", N)] = flops / min(ts) / 1e12
        report("cuBLAS DGEMM (torch)", f"{N}^3", True,
               ", ".join(f"{t*1e3:.3f} ms" for t in ts) + f" = {res[('cuBLAS', N)]:.1f} TFLOP/s")
        del A, B, C, ref, bound
    return res


def table_print(res, sizes, labels):
    print("\n| N^3 | " + " | ".join(labels) + " | cuBLAS DGEMM | " + " | ".join(f"{l} / cuBLAS" for l in labels) + " |")
    print("|---" * (2 + 2 * len(labels)) + "|")
    for N in sizes:
        cb = res[("cuBLAS", N)]
        print(f"| {N} | " + " | ".join(f"{res[(l, N)]:.1f}" for l in labels) + f" | {cb:.1f} | "
              + " | ".join(f"{100 * res[(l, N)] / cb:.0f} %" for l in labels) + " |")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    ptx_dir = args[0] if args else HERE
    props = cp.cuda.runtime.getDeviceProperties(0)
    cc = props["major"] * 10 + props["minor"]
    print(f"device: {props['name'].decode()}, CC {cc}, SMs {props['multiProcessorCount']}; tile {BM}x{BN}, smem {SMEM}")
    plain = load_entry(os.path.join(ptx_dir, "erlcuda_kernels.ptx"))
    correctness("sm70 PTX (SIMT)", plain)
    if cc < ABI["MATMUL_F64_SM80_MIN_CC"]:
        print("CC < 8.0: the sm80 module does not load here; done")
        sys.exit(1 if failed else 0)
    tc = load_entry(os.path.join(ptx_dir, ABI["PTX_SM80_FILE_NAME"]))
    correctness("sm80 PTX (DMMA)", tc)
    sizes = [2048, 4096]
    res = timing({"sm80 f64": (tc, BM, BN, SMEM)}, sizes, quick)
    table_print(res, sizes, ["sm80 f64"])
    print(f"\nchecks: {sum(r[2] == 'PASS' for r in rows)} passed, {sum(r[2] == 'FAIL' for r in rows)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
