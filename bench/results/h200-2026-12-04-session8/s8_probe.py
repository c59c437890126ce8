#!/usr/bin/env python3
"""Session 8 probe (one device call): where three misses of issue 13 go.

  python3 s8_probe.py BUNDLE_DIR [clock] [vadd] [driver]

1. vector_add 2^26 f32 between device arrays: erlcuda's kernel (the cubin in
   the bundle, one job, gpud's grid rule and other grids) against CuPy's
   a + b and torch.add(out=), interleaved rounds of CUDA-event timings. Says
   whether buffers.vector_add's 1.20x against PyTorch is the kernel or the
   round trip around it.
2. The driver's start: cuInit and the primary context, in fresh processes,
   alone and while another process holds a context, and with
   CUDA_DEVICE_MAX_CONNECTIONS=1: what bounds gpud's cold start.
3. The clock: clocksource and the cost of clock_gettime (ctypes).
"""
import ctypes
import os
import statistics
import subprocess
import sys
import time

import numpy as np

B = sys.argv[1]
sys.path.insert(0, os.path.join(B, "kernels"))


def med(xs):
    return statistics.median(xs)


def driver_child():
    """In a fresh process: ms to open libcuda, to open it again after
    closing it (what cudarc's is_culib_present + culib did), for cuInit,
    then for the primary context."""
    import _ctypes
    t0 = time.perf_counter()
    cu = ctypes.CDLL("libcuda.so.1")
    t1 = time.perf_counter()
    if os.environ.get("S8_REOPEN"):
        _ctypes.dlclose(cu._handle)
        cu = ctypes.CDLL("libcuda.so.1")
    t2 = time.perf_counter()
    assert cu.cuInit(0) == 0
    t3 = time.perf_counter()
    dev = ctypes.c_int()
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cu.cuCtxSetCurrent(ctx) == 0
    free, tot = ctypes.c_size_t(), ctypes.c_size_t()
    assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(tot)) == 0
    t4 = time.perf_counter()
    print(" ".join(f"{x * 1e3:.1f}" for x in (t1 - t0, t2 - t1, t3 - t2, t4 - t3)), flush=True)
    if len(sys.argv) > 3 and sys.argv[3] == "hold":
        sys.stdin.read()


def driver_times(env_extra=None, n=5):
    env = dict(os.environ, **(env_extra or {}))
    out = []
    for _ in range(n):
        r = subprocess.run([sys.executable, __file__, B, "child"], capture_output=True, text=True, env=env)
        out.append(tuple(map(float, r.stdout.split())))
        time.sleep(0.3)
    return out


def show(label, xs):
    cols = list(zip(*xs))
    names = ("dlopen", "reopen", "cuInit", "context")
    print(f"  {label:40} " + ", ".join(f"{nm} {med(c):6.1f} ({min(c):.1f}-{max(c):.1f})"
                                         for nm, c in zip(names, cols)) + f" ms, n={len(xs)}", flush=True)


def driver_probe():
    print("== the driver's start (fresh processes; medians and ranges in ms)")
    print("  " + subprocess.run(["nvidia-smi", "--query-gpu=persistence_mode,pstate,clocks.sm,clocks.max.sm",
                                 "--format=csv"], capture_output=True, text=True).stdout.replace("\n", " | "))
    show("alone", driver_times())
    show("dlclose and dlopen again (cudarc)", driver_times({"S8_REOPEN": "1"}))
    for c in ("1", "2", "4", "8"):
        show(f"CUDA_DEVICE_MAX_CONNECTIONS={c}", driver_times({"CUDA_DEVICE_MAX_CONNECTIONS": c}))
    show("alone again", driver_times())


def clock_probe():
    print("== the clock")
    try:
        cs = open("/sys/devices/system/clocksource/clocksource0/current_clocksource").read().strip()
        av = open("/sys/devices/system/clocksource/clocksource0/available_clocksource").read().strip()
    except OSError as e:
        cs, av = f"? ({e})", "?"
    print(f"  clocksource {cs} (available: {av})")
    n = 200000
    t0 = time.perf_counter_ns()
    for _ in range(n):
        time.monotonic_ns()
    t1 = time.perf_counter_ns()
    for _ in range(n):
        pass
    t2 = time.perf_counter_ns()
    print(f"  time.monotonic_ns(): {((t1 - t0) - (t2 - t1)) / n:.0f} ns per call (loop subtracted)")


def vadd_probe():
    import cupy as cp
    import torch
    import ptx_launch as pl
    abi = pl.read_abi(os.path.join(B, "kernels", "abi.rs"))
    epb = abi["VADD_ELEMS_PER_BLOCK"]
    cubin = os.path.join(B, "erlcuda_kernels_sm80.sm_90.cubin")
    mod = cp.RawModule(path=cubin if os.path.exists(cubin) else os.path.join(B, "erlcuda_kernels_sm80.ptx"))
    k = mod.get_function(abi["ENTRY_VECTOR_ADD"] + "_f32")
    print(f"== vector_add 2^26 f32 on the device ({'cubin' if os.path.exists(cubin) else 'ptx'})")
    n = 1 << 26
    a = cp.random.standard_normal(n, dtype=cp.float32)
    b = cp.random.standard_normal(n, dtype=cp.float32)
    o = cp.full(n, cp.nan, dtype=cp.float32)
    total = pl.cdiv(n, epb)
    table = cp.asarray(np.array([[a.data.ptr, b.data.ptr, o.data.ptr, n, 0]], dtype=np.uint64))
    ours = {}
    max_grid = 132 * 64
    for g in sorted({min(total, max_grid), total, 132 * 8, 132 * 16, 132 * 32}):
        ours[f"erlcuda grid {g}"] = (lambda g=g: k((g,), (256,), (table, pl.u32(1), pl.u32(total))))
    ours[f"erlcuda grid {min(total, max_grid)}"]()
    cp.cuda.Device().synchronize()
    ref = a.astype(cp.float64) + b.astype(cp.float64)
    err = float(cp.max(cp.abs(o.astype(cp.float64) - ref) / cp.maximum(cp.abs(ref), 1e-30)))
    print(f"  check: max rel err {err:.2e} (one rounding: <= 6e-8) {'PASS' if err <= 2 ** -24 else 'FAIL'}")
    ta = torch.as_tensor(a, device="cuda")
    tb = torch.as_tensor(b, device="cuda")
    to = torch.empty_like(ta)
    fns = list(ours.items()) + [("cupy a + b (out=)", lambda: cp.add(a, b, out=o)),
                                ("torch.add(out=)", lambda: torch.add(ta, tb, out=to)),
                                ("torch a + b (allocates)", lambda: ta + tb)]
    times = pl.interleaved_times(cp, fns, rounds=5, reps=20)
    base = med(times["torch a + b (allocates)"])
    for name, ts in times.items():
        m = med(ts)
        print(f"  {name:32} median {m * 1e3:.4f} ms  {12 * n / m / 1e12:.2f} TB/s  {m / base:.3f}x torch a+b",
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "child":
        driver_child()
    else:
        what = sys.argv[2:] or ["clock", "vadd", "driver"]
        if "clock" in what:
            clock_probe()
        if "vadd" in what:
            vadd_probe()
        if "driver" in what:
            driver_probe()
