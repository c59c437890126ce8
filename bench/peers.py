#!/usr/bin/env python3
"""erlcuda benchmark, the "peers on the same GPU" half: PyTorch and CuPy doing
erlcuda's jobs on the same machine, plus erlcuda's own matmul PTX kernel alone.

    python3 bench/peers.py [OUT.json] --ptx PATH/erlcuda_kernels.ptx [--abi PATH/abi.rs] [--quick]

Writes ONE JSON file (default peers.json) in bench/FORMAT.md's format, rewritten
after every section, and prints a table as it goes. Each section is guarded:
a failure is recorded in meta.errors and the rest still runs; the exit status
is 0 whenever the JSON was written. Inputs are fresh random numbers for every
run (numpy default_rng seeded from the clock; the seed is in meta.seed).

What the figures mean (all wall-clock unless said otherwise):
* pcie.h2d / pcie.d2h / pcie.bidir (GB/s, system pcie_pinned): 256 MiB copies
  between pinned host memory and device memory, median of 10 after warm-up;
  bidir = one copy each way at once on two streams, both byte counts summed.
  The ceiling for anything that crosses PCIe.
* latency.vector_add_1000.p50/.p90/.p99/.p99.9 (us): one small job (1000
  f32 + 1000 f32) from host inputs to a host result, one job in flight,
  timed job by job (perf_counter_ns) over >= 10,000 jobs after 1,000 warm-up;
  spread = min/max of all samples, n = jobs. pytorch_pageable:
  (a.cuda() + b.cuda()).cpu(); pytorch_pinned: pinned inputs, non_blocking
  uploads, add, non_blocking copy into a pinned output, synchronize; cupy:
  (cp.asarray(a) + cp.asarray(b)).get().
* large.K.{binaries,arena}.nN (ms): one K job (vector_add = a+b, reduce =
  a.sum(), dot_product = torch.dot(a,b)) over N f32, host to host (upload
  inputs, compute, download the result, synchronize); median of reps, spread
  min/max, extra.bytes = bytes across PCIe (12N, 4N, 8N+4). Peers have no
  binaries/arena distinction, so the same measurement is written under both
  names (FORMAT.md); compare erlcuda binaries with pytorch_pageable and
  erlcuda arena with pytorch_pinned.
* matmul.kernel.nS (TFLOP/s = 2 S^3 / t): the kernel alone on device-resident
  S x S f32 matrices, CUDA events, median of reps after warm-up. cublas_sgemm
  = torch.matmul with TF32 off; erlcuda = erlcuda's PTX kernel (abi.rs
  ENTRY_MATMUL + "_f32": matmul_f32) launched through CuPy, its result checked against torch's
  (extra.checked; extra.max_rel_err = max |C - C_ref| / (|A||B|) over all
  elements, often exactly 0 as cuBLAS sums in the same order; extra.
  max_rel_err_f64_rows = the same against f64 on 16 sampled rows; bound 1e-4).
* matmul.end_to_end.nS (TFLOP/s, extra.ms): host A, B -> upload -> matmul
  (TF32 off) -> download -> synchronize, median wall time.
* examples.K.device (ms, pytorch_cuda): the op of example kernel K
  (examples/kernels) at DESIGN.md's size on tensors already on the device,
  median of 50 with CUDA events (sec_examples); extra.bytes = bytes moved,
  extra.copy_speed_ms = those bytes at examples.d2d_copy's speed (GB/s of
  a 1 GiB device-to-device copy, reads and writes counted). With `--only
  examples_peers` (not run by default), the same records for systems
  torch_compile (torch.compile of the same expression; extra.compile_s) and
  cupy (CuPy on the same tensors; no topk), each checked against eager's
  result (extra.checked): the report's best-peer column takes the least.
* mixed.small.alone.p50/.p99/.max, mixed.small.beside.K.p50/.p99/.max (us)
  and mixed.large.K.alone/.beside_small (jobs/s), system pytorch_priority
  (sec_mixed, `--only mixed`): bench/erlcuda_mixed_bench.erl's mix as
  PyTorch's best effort: torch.add of 1,000 f32 from pinned to pinned host
  memory, one in flight, on a stream of the device's highest priority,
  timed op by op over 100,000 ops, alone and while a large op K runs back
  to back in another thread on a stream of the lowest priority; each large
  op's throughput (ops / the sum of their wall times) alone and beside.
  ERLCUDA_BENCH_MIXED_SCALE shrinks it as it does erlcuda's.

Why pageable vs pinned: a copy from ordinary (pageable) host memory cannot be
DMA'd directly; the driver stages it through its own pinned buffer (an extra
memcpy, chunked and synchronous), so it is slower and blocks the host. Pinned
(page-locked) host memory is DMA'd at full PCIe speed and asynchronously.
Plain tensors are what most users pass (pageable); pinned buffers are the best
a careful user gets. erlcuda's "binaries" (plain Erlang binaries, copied into
its pinned arena) vs "arena" (inputs already in the arena) is the same split.
"""
import argparse
import datetime
import gc
import importlib
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PRODUCER = "bench/peers.py"
PTX_NAME = "erlcuda_kernels.ptx"

LARGE_SIZES = [65536, 1048576, 16777216, 67108864]
LARGE_KERNELS = ["vector_add", "reduce", "dot_product"]
MATMUL_SIZES = [256, 512, 1024, 2048, 4096, 8192]
MATMUL_TOL = 1e-4  # max |C - C_ref| / (|A| |B|) for erlcuda's matmul
SECTIONS = ["pcie", "latency", "large", "matmul_kernel", "matmul_e2e", "device_resident", "examples",
            "mixed", "shared"]
# The section `shared' (bench/erlcuda_shared_bench.erl's peer): X rows x 384
# f32 on the device, K 10, queries in chunks of 1,024.
SHARED_ROWS, SHARED_COLS, SHARED_K, SHARED_CHUNK = 1048576, 384, 10, 1024
SHARED_QUERIES = [1000, 10000]
# Run only when named (--only): too long for the whole benchmark's call.
OPTIONAL_SECTIONS = ["examples_peers"]

STATE = {"out": "peers.json", "meta": {}, "records": []}


# ---------------------------------------------------------------- recording
def clean(x):
    """JSON-safe copy: numpy scalars to Python, non-finite floats to None."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if hasattr(x, "item"):  # numpy / torch scalar
        try:
            return clean(x.item())
        except Exception:
            pass
    return str(x)


def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.3f}"
    return f"{v:.4f}"


def add(name, system, value, unit, spread=None, n=None, extra=None):
    """Appends one FORMAT.md record (and prints it); a non-finite value is an error."""
    try:
        value = float(value)
    except Exception:
        value = float("nan")
    if not math.isfinite(value):
        error(f"{name} [{system}]", f"non-finite value {value!r}")
        return False
    sp = None
    if spread is not None:
        lo, hi = float(spread[0]), float(spread[1])
        if math.isfinite(lo) and math.isfinite(hi):
            sp = {"min": lo, "max": hi}
    rec = {"name": name, "system": system, "value": value, "unit": unit,
           "spread": sp, "n": None if n is None else int(n), "extra": clean(extra or {})}
    STATE["records"].append(rec)
    sps = f"[{fmt(sp['min'])} .. {fmt(sp['max'])}]" if sp else ""
    ex = ""
    if extra and "checked" in extra:
        ex = " checked" if extra["checked"] else " CHECK FAILED"
    print(f"  {name:38} {system:17} {fmt(value):>10} {unit:8} {sps:24} n={n}{ex}", flush=True)
    return True


def error(where, exc):
    msg = f"{where}: {exc!r}" if isinstance(exc, BaseException) else f"{where}: {exc}"
    STATE["meta"].setdefault("errors", []).append(msg)
    print(f"  ERROR {msg}", file=sys.stderr, flush=True)
    if isinstance(exc, BaseException):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)


def write_json():
    """Writes STATE to the output file (atomically); True on success."""
    out = STATE["out"]
    try:
        d = os.path.dirname(os.path.abspath(out))
        os.makedirs(d, exist_ok=True)
        tmp = out + ".tmp"
        doc = {"meta": clean(STATE["meta"]), "records": clean(STATE["records"])}
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, out)
        return True
    except Exception as e:
        print(f"peers.py: cannot write {out}: {e!r}", file=sys.stderr, flush=True)
        return False


# ---------------------------------------------------------------- statistics
def pct(sorted_xs, q):
    """Nearest-rank percentile of an ascending list."""
    n = len(sorted_xs)
    i = max(0, min(n - 1, int(math.ceil(q / 100.0 * n)) - 1))
    return sorted_xs[i]


def wall_times(job, reps, warm):
    """Seconds per call of job() (which must synchronize itself)."""
    for _ in range(warm):
        job()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        job()
        ts.append(time.perf_counter() - t0)
    return ts


def summary(ts):
    """(median, min, max) of a list of times."""
    return statistics.median(ts), min(ts), max(ts)


# ---------------------------------------------------------------- context
class Ctx:
    np = None
    torch = None
    cp = None
    rng = None
    quick = False
    ptx = None
    abi = None


def need(c, *libs):
    missing = [lib for lib in libs if getattr(c, lib) is None]
    if missing:
        raise RuntimeError("not available: " + ", ".join({"cp": "cupy"}.get(m, m) for m in missing))


def free_gpu(c):
    gc.collect()
    try:
        if c.torch is not None:
            c.torch.cuda.synchronize()
            c.torch.cuda.empty_cache()
    except Exception:
        pass
    try:
        if c.cp is not None:
            c.cp.get_default_memory_pool().free_all_blocks()
            c.cp.get_default_pinned_memory_pool().free_all_blocks()
    except Exception:
        pass


def torch_events(c, fn, reps, warm):
    """Seconds per call of fn() on the current stream, CUDA events."""
    torch = c.torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)
    return ts


def cupy_events(c, fn, reps, warm):
    return find_ptx_launch().cupy_event_times(c.cp, fn, reps, warm)


# ---------------------------------------------------------------- 1. PCIe
def sec_pcie(c):
    need(c, "torch")
    torch = c.torch
    nbytes = 256 << 20
    reps, warm = (5, 2) if c.quick else (10, 3)
    h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    h2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    h.fill_(1)
    h2.fill_(2)
    d = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    d2 = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    d.fill_(3)
    d2.fill_(4)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()

    def h2d():
        d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()

    def d2h():
        h2.copy_(d, non_blocking=True)
        torch.cuda.synchronize()

    def bidir():
        with torch.cuda.stream(s1):
            d.copy_(h, non_blocking=True)
        with torch.cuda.stream(s2):
            h2.copy_(d2, non_blocking=True)
        torch.cuda.synchronize()

    for name, job, nb in (("pcie.h2d", h2d, nbytes), ("pcie.d2h", d2h, nbytes), ("pcie.bidir", bidir, 2 * nbytes)):
        try:
            med, lo, hi = summary(wall_times(job, reps, warm))
            add(name, "pcie_pinned", nb / med / 1e9, "GB/s", (nb / hi / 1e9, nb / lo / 1e9), reps,
                {"bytes": nb, "ms": med * 1e3, "timing": "wall clock around synchronize"})
        except Exception as e:
            error(f"pcie {name}", e)
    h = h2 = d = d2 = None  # free (not del: the closures above refer to them)


# ---------------------------------------------------------------- 2. latency
def run_latency(job, jobs, warm):
    for _ in range(warm):
        job()
    gc.collect()
    pc = time.perf_counter_ns
    out = [0] * jobs
    for i in range(jobs):
        t0 = pc()
        job()
        out[i] = pc() - t0
    return out


def latency_records(system, samples_ns, checked, warm):
    xs = sorted(samples_ns)
    n = len(xs)
    sp = (xs[0] / 1e3, xs[-1] / 1e3)
    for tag, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9)):
        add(f"latency.vector_add_1000.{tag}", system, pct(xs, q) / 1e3, "us", sp, n,
            {"checked": checked, "warmup": warm, "mean_us": sum(xs) / n / 1e3})


def sec_latency(c):
    np = c.np
    n_el = 1000
    jobs, warm = (2000, 200) if c.quick else (20000, 1000)

    def inputs():
        a = c.rng.standard_normal(n_el, dtype=np.float32)
        b = c.rng.standard_normal(n_el, dtype=np.float32)
        return a, b, a + b

    # pytorch_pageable
    try:
        need(c, "torch")
        torch = c.torch
        a_np, b_np, ref = inputs()
        a, b = torch.from_numpy(a_np), torch.from_numpy(b_np)

        def job_pageable():
            return (a.cuda() + b.cuda()).cpu()

        samples = run_latency(job_pageable, jobs, warm)
        ok = bool(np.array_equal(job_pageable().numpy(), ref))
        latency_records("pytorch_pageable", samples, ok, warm)
    except Exception as e:
        error("latency pytorch_pageable", e)

    # pytorch_pinned
    try:
        need(c, "torch")
        torch = c.torch
        a_np, b_np, ref = inputs()
        ap = torch.from_numpy(a_np).pin_memory()
        bp = torch.from_numpy(b_np).pin_memory()
        outp = torch.empty(n_el, dtype=torch.float32, pin_memory=True)

        def job_pinned():
            r = ap.cuda(non_blocking=True) + bp.cuda(non_blocking=True)
            outp.copy_(r, non_blocking=True)
            torch.cuda.synchronize()
            return outp

        samples = run_latency(job_pinned, jobs, warm)
        outp.fill_(float("nan"))
        ok = bool(np.array_equal(job_pinned().numpy().copy(), ref))
        latency_records("pytorch_pinned", samples, ok, warm)
    except Exception as e:
        error("latency pytorch_pinned", e)

    # cupy
    try:
        need(c, "cp")
        cp = c.cp
        a_np, b_np, ref = inputs()

        def job_cupy():
            return (cp.asarray(a_np) + cp.asarray(b_np)).get()

        samples = run_latency(job_cupy, jobs, warm)
        ok = bool(np.array_equal(job_cupy(), ref))
        latency_records("cupy", samples, ok, warm)
    except Exception as e:
        error("latency cupy", e)


# ---------------------------------------------------------------- 3. large vectors
def large_reps(c, n):
    if c.quick:
        return (3, 1) if n >= 1 << 24 else (10, 2)
    if n >= 1 << 26:
        return 10, 2
    if n >= 1 << 24:
        return 15, 2
    return 50, 5


def large_bytes(k, n):
    return {"vector_add": 12 * n, "reduce": 4 * n, "dot_product": 8 * n + 4}[k]


def large_check(c, k, got, a_np, b_np, refs):
    """(ok, rel_err) of a host result against numpy (exact for vector_add,
    f64 sum with |error| <= 1e-5 * sum|terms| for reduce / dot)."""
    np = c.np
    if k == "vector_add":
        if "vector_add" not in refs:
            refs["vector_add"] = a_np + b_np
        ok = bool(np.array_equal(np.asarray(got).reshape(-1), refs["vector_add"]))
        return ok, 0.0 if ok else None
    if k not in refs:
        if k == "reduce":
            refs[k] = (float(np.sum(a_np, dtype=np.float64)), float(np.sum(np.abs(a_np), dtype=np.float64)))
        else:
            a64, b64 = a_np.astype(np.float64), b_np.astype(np.float64)
            refs[k] = (float(np.dot(a64, b64)), float(np.dot(np.abs(a64), np.abs(b64))))
            del a64, b64
    ref, bound = refs[k]
    v = float(np.asarray(got).reshape(-1)[0])
    err = abs(v - ref)
    rel = err / bound if bound > 0 else err
    return bool(math.isfinite(v) and err <= 1e-5 * bound), rel


def sec_large(c):
    need(c, "torch")
    np, torch = c.np, c.torch
    ops = {
        "vector_add": lambda x, y: x + y,
        "reduce": lambda x, y: x.sum(),
        "dot_product": lambda x, y: torch.dot(x, y),
    }
    for n in LARGE_SIZES:
        reps, warm = large_reps(c, n)
        try:
            a_np = c.rng.standard_normal(n, dtype=np.float32)
            b_np = c.rng.standard_normal(n, dtype=np.float32)
            a, b = torch.from_numpy(a_np), torch.from_numpy(b_np)
            ap, bp = a.pin_memory(), b.pin_memory()
            out_vec = torch.empty(n, dtype=torch.float32, pin_memory=True)
            out_one = torch.empty(1, dtype=torch.float32, pin_memory=True)
        except Exception as e:
            error(f"large n{n} setup", e)
            free_gpu(c)
            continue
        refs = {}
        for k in LARGE_KERNELS:
            op = ops[k]
            two = k != "reduce"
            out_p = out_vec if k == "vector_add" else out_one

            def job_pageable():
                da = a.cuda()
                db = b.cuda() if two else None
                r = op(da, db).cpu()
                torch.cuda.synchronize()
                return r

            def job_pinned():
                da = ap.cuda(non_blocking=True)
                db = bp.cuda(non_blocking=True) if two else None
                r = op(da, db)
                out_p.copy_(r.reshape(-1), non_blocking=True)
                torch.cuda.synchronize()
                return out_p

            how = {"pytorch_pageable": "x.cuda(); op; .cpu() (a fresh pageable tensor); synchronize",
                   "pytorch_pinned": "pinned x.cuda(non_blocking=True); op; pinned out.copy_(non_blocking=True); synchronize"}
            for system, job in (("pytorch_pageable", job_pageable), ("pytorch_pinned", job_pinned)):
                try:
                    out_p.fill_(float("nan"))
                    ok, rel = large_check(c, k, job().numpy(), a_np, b_np, refs)
                    med, lo, hi = summary(wall_times(job, reps, warm))
                    nb = large_bytes(k, n)
                    extra = {"bytes": nb, "checked": ok, "rel_err": rel, "gbps": nb / med / 1e9, "how": how[system],
                             "note": "same measurement under both binaries and arena names"}
                    for m in ("binaries", "arena"):
                        add(f"large.{k}.{m}.n{n}", system, med * 1e3, "ms", (lo * 1e3, hi * 1e3), reps, extra)
                except Exception as e:
                    error(f"large {k} n{n} {system}", e)
        a = b = ap = bp = out_vec = out_one = a_np = b_np = refs = None  # free before the next size
        free_gpu(c)


# ---------------------------------------------------------------- 4. matmul kernel
def tf32_off(c):
    torch = c.torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        c_state = bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception:
        c_state = None
    STATE["meta"]["torch_allow_tf32"] = c_state


def matmul_sizes(c):
    return [256, 1024, 4096] if c.quick else MATMUL_SIZES


def kernel_reps(c, s):
    if c.quick:
        return (10, 2) if s <= 1024 else (5, 2)
    if s <= 1024:
        return 50, 5
    if s <= 2048:
        return 20, 3
    if s <= 4096:
        return 10, 3
    return 6, 2


def find_ptx_launch():
    """Imports ptx_launch from this script's folder, else from ../kernels."""
    for d in (HERE, os.path.join(HERE, "..", "kernels")):
        if os.path.isfile(os.path.join(d, "ptx_launch.py")):
            d = os.path.abspath(d)
            if d not in sys.path:
                sys.path.insert(0, d)
            return importlib.import_module("ptx_launch")
    raise ImportError("ptx_launch.py found neither next to peers.py nor in ../kernels")


def load_erlcuda_matmul(c):
    """(kernel, launch info) of erlcuda's matmul entry, loaded with CuPy."""
    need(c, "cp", "torch")
    pl = find_ptx_launch()
    if not c.abi or not os.path.isfile(c.abi):
        raise FileNotFoundError(f"abi.rs not found ({c.abi}); pass --abi")
    abi = pl.read_abi(c.abi)
    prefix = abi.get("ENTRY_MATMUL")
    if not isinstance(prefix, str):
        raise RuntimeError(f"ENTRY_MATMUL not resolved from {c.abi}")
    entry = prefix + "_f32"  # entries are <prefix>_<type> (abi::Dtype::suffix)
    if not c.ptx or not os.path.isfile(c.ptx):
        raise FileNotFoundError(f"PTX not found ({c.ptx}); pass --ptx PATH/{PTX_NAME}")
    mod = c.cp.RawModule(path=c.ptx)
    kern = mod.get_function(entry)
    info = {"pl": pl, "entry": entry, "abi": abi, "bn": abi["MATMUL_BN"],
            "threads": abi.get("MATMUL_THREADS", 256), "mod": mod}
    STATE["meta"]["erlcuda_matmul_entry"] = entry
    STATE["meta"]["ptx"] = os.path.abspath(c.ptx)
    return kern, info


def check_matmul(c, A, B, C, rows=16):
    """(ok, max rel err vs torch f32, max rel err vs f64 on sampled rows) of
    C = A B; errors relative to |A| |B|. The f32 comparison covers every
    element (row blocks, so memory stays bounded); cuBLAS may accumulate in
    the same order as erlcuda's kernel (error exactly 0), hence the f64 rows."""
    torch = c.torch
    s = A.shape[0]
    if bool(torch.isnan(C).any().item()) or bool(torch.isinf(C).any().item()):
        return False, None, None
    worst = 0.0
    step = 1024
    absB = B.abs()
    for r0 in range(0, s, step):
        a = A[r0:r0 + step]
        ref = torch.matmul(a, B)
        bound = torch.matmul(a.abs(), absB).clamp_min(1e-30)
        worst = max(worst, float(((C[r0:r0 + step] - ref).abs() / bound).max().item()))
        del a, ref, bound
    del absB
    ii = torch.from_numpy(c.rng.integers(0, s, rows)).to(A.device)
    a64, b64 = A[ii].double(), B.double()
    ref64 = torch.matmul(a64, b64)
    bound64 = torch.matmul(a64.abs(), b64.abs()).clamp_min(1e-300)
    worst64 = float(((C[ii].double() - ref64).abs() / bound64).max().item())
    del a64, b64, ref64, bound64
    return worst <= MATMUL_TOL and worst64 <= MATMUL_TOL, worst, worst64



def sec_device_resident(c):
    """PyTorch with its tensors on the device, beside erlcuda's device
    buffers: vector_add of 2^26 f32 between device tensors (CUDA events);
    the chain add, saxpy, dot of 2^26 from the upload of a pinned input to
    the scalar on the host (wall time, the same work erlcuda's
    buffers.chain does from put), and the same chain on tensors already
    there."""
    need(c, "torch")
    np, torch = c.np, c.torch
    n = 1 << 26
    reps, warm = (5, 2) if c.quick else (50, 5)
    x_np = c.rng.standard_normal(n, dtype=np.float32)
    xp = torch.from_numpy(x_np).pin_memory()
    a = torch.from_numpy(c.rng.standard_normal(n, dtype=np.float32)).cuda()
    b = torch.from_numpy(c.rng.standard_normal(n, dtype=np.float32)).cuda()
    out = torch.empty(n, device="cuda", dtype=torch.float32)
    med, lo, hi = summary(torch_events(c, lambda: torch.add(a, b, out=out), reps, warm))
    add("device.vector_add.n67108864", "pytorch_cuda", med * 1e3, "ms", (lo * 1e3, hi * 1e3), reps,
        {"timing": "cuda_events"})

    def chain_from_host():
        x = xp.cuda(non_blocking=True)
        s = x + x
        y = 0.5 * s + x
        return torch.dot(y, x).item()

    def chain_on_device(x):
        s = x + x
        y = 0.5 * s + x
        return torch.dot(y, x).item()

    xd = xp.cuda()
    want = float(np.dot((0.5 * (x_np.astype(np.float64) * 2) + x_np), x_np.astype(np.float64)))
    got = chain_from_host()
    ok = abs(got - want) <= 1e-3 * abs(want)
    for name, fn in (("from_pinned", chain_from_host), ("on_device", lambda: chain_on_device(xd))):
        ts = sorted(wall_times(fn, max(5, reps // 5), warm))
        med = pct(ts, 0.5)
        add(f"device.chain_add_saxpy_dot.n67108864.{name}", "pytorch_cuda", med * 1e3, "ms",
            (ts[0] * 1e3, ts[-1] * 1e3), len(ts), {"checked": ok})
    free_gpu(c)

# ---------------------------------------------------------------- 7. the example kernels' peers
# The ten example kernels of examples/kernels (DESIGN.md, "The example
# kernels"), in DESIGN's order; bench/erlcuda_examples_bench.erl times
# erlcuda's at the same sizes (its size texts and byte counts are these).
EXAMPLE_KERNELS = ["cos_sim", "argmax_rows", "histogram", "topk_rows", "gelu", "gather",
                   "log_softmax_rows", "u8_to_unit", "scatter_add", "axpbypcz"]
D2D_BYTES = 1 << 30  # the copy that gives HBM's speed: 1 GiB read, 1 GiB written


def example_case(c, k, unif, ints):
    """(size text, bytes moved, fn, how, variants, extra, tensors) of example kernel k
    at DESIGN's size, its tensors made on the device now. Bytes moved count
    the reads and writes a kernel cannot avoid (gather: the indices and the
    output, not the table's scattered lines; scatter_add: index, value and
    the accumulator's read-modify-write per update). variants: other ways
    to do it, timed too, into extra[name + "_ms"]. tensors: fn's inputs by
    name (sec_examples_peers runs CuPy on them)."""
    torch = c.torch
    F = torch.nn.functional
    if k in ("cos_sim", "argmax_rows"):
        r, cols = 16384, 1024
        x = unif(r, cols)
        size = f"{r}x{cols} f32"
        if k == "cos_sim":
            q = unif(cols)
            return (size, 4 * r * cols + 4 * cols + 4 * r,
                    lambda: (x @ q) / (x.norm(dim=1) * q.norm()),
                    "(x @ q) / (x.norm(dim=1) * q.norm())", {}, {}, {"x": x, "q": q})
        return (size, 4 * r * cols + 4 * r, lambda: torch.argmax(x, 1), "torch.argmax(x, 1)", {}, {},
                {"x": x})
    if k == "histogram":
        n = 1 << 26
        p = ints(256, n, torch.uint8)
        pi = p.int()
        variants = {"without_conversion": lambda: torch.bincount(pi, minlength=256),
                    "uint8_direct": lambda: torch.bincount(p, minlength=256)}
        return ("2^26 u8", n + 1024, lambda: torch.bincount(p.int(), minlength=256),
                "torch.bincount(p.int(), minlength=256), p uint8 (the int conversion included; "
                "without it: extra.without_conversion_ms)", variants, {}, {"p": p})
    if k == "topk_rows":
        r, cols, kk = 4096, 4096, 8
        x = unif(r, cols)
        return (f"{r}x{cols} f32, K {kk}", 4 * r * cols + 8 * r * kk,
                lambda: torch.topk(x, kk, dim=1), "torch.topk(x, 8, dim=1)", {}, {}, {"x": x})
    if k == "gelu":
        n = 1 << 26
        x = unif(n)
        return "2^26 f32", 8 * n, lambda: F.gelu(x), "F.gelu(x) (exact erf form)", {}, {}, {"x": x}
    if k == "gather":
        n, m = 1 << 26, 1 << 24
        table = unif(n)
        idx = ints(n, m, torch.int32)
        try:
            table[idx]
            dtype = "int32"
        except Exception:  # an older torch indexes with int64 only
            idx = idx.long()
            dtype = "int64"
        return ("2^24 s32 of 2^26 f32", 8 * m, lambda: table[idx], f"x[idx], idx {dtype}",
                {"index_select": lambda: torch.index_select(table, 0, idx)}, {"index_dtype": dtype},
                {"table": table, "idx": idx})
    if k == "log_softmax_rows":
        r, cols = 4096, 4096
        x = unif(r, cols)
        return (f"{r}x{cols} f32", 8 * r * cols, lambda: F.log_softmax(x, 1), "F.log_softmax(x, 1)", {}, {},
                {"x": x})
    if k == "u8_to_unit":
        n = 1 << 26
        p = ints(256, n, torch.uint8)
        return "2^26 u8", 5 * n, lambda: p.float() / 255, "p.float() / 255", {}, {}, {"p": p}
    if k == "scatter_add":
        n, m = 1 << 20, 1 << 24
        acc = torch.zeros(n, device="cuda", dtype=torch.float32)
        idx = ints(n, m, torch.int32)
        vals = unif(m)
        try:
            acc.index_add_(0, idx, vals)
            dtype = "int32"
        except Exception:
            idx = idx.long()
            dtype = "int64"
        return ("2^24 f32 into 2^20", 12 * m, lambda: acc.index_add_(0, idx, vals),
                f"acc.index_add_(0, idx, vals), idx {dtype}", {}, {"index_dtype": dtype},
                {"acc": acc, "idx": idx, "vals": vals})
    if k == "axpbypcz":
        n = 1 << 26
        x, y, z = unif(n), unif(n), unif(n)
        a, b, cc = 0.5, -1.25, 2.0
        return ("2^26 f32", 16 * n, lambda: a * x + b * y + cc * z, "a*x + b*y + c*z", {}, {},
                {"x": x, "y": y, "z": z})
    raise ValueError(k)


def example_inputs(c):
    """(unif, ints): makers of random tensors on the device, seeded from the
    run's generator: unif(*shape) floats in [-2, 2), ints(hi, n, dtype)."""
    torch = c.torch
    g = torch.Generator(device="cuda")
    g.manual_seed(int(c.rng.integers(0, 2 ** 62)))

    def unif(*shape):
        return torch.empty(*shape, device="cuda", dtype=torch.float32).uniform_(-2.0, 2.0, generator=g)

    def ints(hi, n, dtype):
        return torch.randint(0, hi, (n,), device="cuda", dtype=dtype, generator=g)

    return unif, ints


def example_cupy(cp, k, t):
    """CuPy's way to do example kernel k on the case's tensors t (shared
    through DLPack, no copy): (fn, how), or None where CuPy has no such op
    (topk). Elementwise ops are one ElementwiseKernel each, as a CuPy user
    who cares about speed writes them (a chain of array ops makes a pass
    over memory per operator)."""
    a = {n: cp.from_dlpack(v) for n, v in t.items()}
    if k == "cos_sim":
        x, q = a["x"], a["q"]
        return (lambda: (x @ q) / (cp.linalg.norm(x, axis=1) * cp.linalg.norm(q)),
                "(x @ q) / (cp.linalg.norm(x, axis=1) * cp.linalg.norm(q))")
    if k == "argmax_rows":
        return lambda: cp.argmax(a["x"], axis=1), "cp.argmax(x, axis=1)"
    if k == "histogram":
        return lambda: cp.bincount(a["p"], minlength=256), "cp.bincount(p, minlength=256), p uint8"
    if k == "gelu":
        ker = cp.ElementwiseKernel("float32 x", "float32 y",
                                   "y = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f))", "erlcuda_peer_gelu")
        return lambda: ker(a["x"]), "ElementwiseKernel 0.5f * x * (1.0f + erff(x * 0.70710678f))"
    if k == "gather":
        return lambda: cp.take(a["table"], a["idx"]), "cp.take(table, idx)"
    if k == "log_softmax_rows":
        import cupyx.scipy.special as special
        return lambda: special.log_softmax(a["x"], axis=1), "cupyx.scipy.special.log_softmax(x, axis=1)"
    if k == "u8_to_unit":
        ker = cp.ElementwiseKernel("uint8 p", "float32 y", "y = p / 255.0f", "erlcuda_peer_u8_to_unit")
        return lambda: ker(a["p"]), "ElementwiseKernel y = p / 255.0f"
    if k == "scatter_add":
        import cupyx
        acc = a["acc"]
        # scatter_add works in place and returns nothing: the result is acc.
        return (lambda: (cupyx.scatter_add(acc, a["idx"], a["vals"]), acc)[1],
                "cupyx.scatter_add(acc, idx, vals)")
    if k == "axpbypcz":
        ker = cp.ElementwiseKernel("float32 x, float32 y, float32 z", "float32 o",
                                   "o = 0.5f * x + -1.25f * y + 2.0f * z", "erlcuda_peer_axpbypcz")
        return lambda: ker(a["x"], a["y"], a["z"]), "ElementwiseKernel o = 0.5f*x + -1.25f*y + 2.0f*z"
    return None


def same_result(torch, got, want):
    """Whether a peer's result is eager PyTorch's: integers (indices,
    counts) equal, floats within 1e-4 (relative and absolute: the peers
    sum in other orders, and CuPy's erff is not PyTorch's erf). A pair
    (topk's values and indices) is judged by its values: ties may rank
    either way."""
    if isinstance(want, (tuple, list)):
        got, want = got[0], want[0]
    if not isinstance(got, torch.Tensor):
        got = torch.from_dlpack(got)
    if got.shape != want.shape:
        return False
    if want.dtype.is_floating_point:
        return bool(torch.allclose(got.float(), want.float(), rtol=1e-4, atol=1e-4))
    return bool(torch.equal(got.to(want.dtype), want))


def sec_examples_peers(c):
    """The example kernels' other peers, for the best peer's column: the
    op of each under torch.compile (system torch_compile; extra.compile_s,
    the first call's seconds) and in CuPy (system cupy), on the same
    tensors at the same size, median of 50 with CUDA events, each result
    checked against eager PyTorch's (extra.checked). Not in the default
    sections (torch.compile takes a minute or more to compile the ten):
    `run.sh part examples examples,examples_peers` runs it beside erlcuda's."""
    need(c, "torch")
    torch = c.torch
    tf32_off(c)
    reps, warm = (10, 3) if c.quick else (50, 10)
    unif, ints = example_inputs(c)
    for k in EXAMPLE_KERNELS:
        try:
            size, nbytes, fn, _, _, _, t = example_case(c, k, unif, ints)
        except Exception as e:
            error(f"examples.{k}.device [peers]", e)
            continue
        # scatter_add accumulates into acc: every result compared is of one
        # call on zeros.
        reset = (lambda: t["acc"].zero_()) if "acc" in t else (lambda: None)

        def clone(r):
            return tuple(x.clone() for x in r) if isinstance(r, (tuple, list)) else r.clone()

        reset()
        want = clone(fn())
        ways = []
        if c.cp is not None:
            try:
                cfn = example_cupy(c.cp, k, t)
                if cfn:
                    ways.append(("cupy", cfn[0], cfn[1], cupy_events))
            except Exception as e:
                error(f"examples.{k}.device [cupy]", e)
        try:
            ways.append(("torch_compile", torch.compile(fn), "torch.compile of the eager expression",
                         torch_events))
        except Exception as e:
            error(f"examples.{k}.device [torch_compile]", e)
        for system, pfn, how, timer in ways:
            try:
                reset()
                t0 = time.perf_counter()
                got = pfn()
                if system == "cupy":
                    c.cp.cuda.Device().synchronize()
                else:
                    torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
                ok = same_result(torch, got, want)
                got = None
                med, lo, hi = summary(timer(c, pfn, reps, warm))
                ex = {"bytes": nbytes, "size": size, "how": how, "timing": "cuda_events",
                      "gbps": nbytes / med / 1e9, "checked": ok}
                if system == "torch_compile":
                    ex["compile_s"] = round(first_s, 3)
                add(f"examples.{k}.device", system, med * 1e3, "ms", (lo * 1e3, hi * 1e3), reps, ex)
            except Exception as e:
                error(f"examples.{k}.device [{system}]", e)
        fn = want = ways = t = None
        free_gpu(c)


def sec_examples(c):
    """The example kernels' peers: PyTorch doing each op at the same size on
    tensors already on the device, median of 50 with CUDA events (records
    examples.K.device, pytorch_cuda); and the device-to-device copy speed
    (examples.d2d_copy, bytes read and written), so that each op's bytes at
    copy speed (extra.copy_speed_ms) and GB/s can be shown beside it."""
    need(c, "torch")
    torch = c.torch
    tf32_off(c)
    reps, warm = (10, 3) if c.quick else (50, 10)
    unif, ints = example_inputs(c)
    copy_gbps = None
    try:
        src = unif(D2D_BYTES // 4)
        dst = torch.empty_like(src)
        med, lo, hi = summary(torch_events(c, lambda: dst.copy_(src), reps, warm))
        nb = 2 * D2D_BYTES
        copy_gbps = nb / med / 1e9
        add("examples.d2d_copy", "pytorch_cuda", copy_gbps, "GB/s", (nb / hi / 1e9, nb / lo / 1e9), reps,
            {"bytes": nb, "ms": med * 1e3, "timing": "cuda_events",
             "how": "dst.copy_(src), 1 GiB of f32 on the device; bytes = read + written"})
    except Exception as e:
        error("examples.d2d_copy", e)
    src = dst = None
    free_gpu(c)

    for k in EXAMPLE_KERNELS:
        try:
            size, nbytes, fn, how, variants, extra, _ = example_case(c, k, unif, ints)
            med, lo, hi = summary(torch_events(c, fn, reps, warm))
            ex = {"bytes": nbytes, "size": size, "how": how, "timing": "cuda_events",
                  "gbps": nbytes / med / 1e9, **extra}
            if copy_gbps:
                ex["copy_speed_ms"] = nbytes / copy_gbps / 1e6
            for name, vfn in variants.items():
                try:
                    vmed, _, _ = summary(torch_events(c, vfn, reps, warm))
                    ex[name + "_ms"] = vmed * 1e3
                except Exception as e:  # a variant this torch lacks: noted, not an error
                    ex[name + "_ms"] = None
                    ex[name + "_error"] = repr(e)[:200]
            add(f"examples.{k}.device", "pytorch_cuda", med * 1e3, "ms", (lo * 1e3, hi * 1e3), reps, ex)
        except Exception as e:
            error(f"examples.{k}.device", e)
        fn = variants = None
        free_gpu(c)


def sec_shared(c):
    """Many queries against one matrix on the device, batched by hand:
    `topk(Qn @ Xn.T, 10)` over X rows x 384 f32 (rows normalised once, as a
    user keeps them) for N queries in chunks of 1,024, CUDA events around
    all the chunks; records shared.torch_batched_N (queries/s, pytorch_cuda),
    the peer of erlcuda's shared.callers_C, and shared.burst_N.p99 (us, the
    batch's whole time), the peer of erlcuda's burst of N."""
    need(c, "torch")
    torch = c.torch
    tf32_off(c)
    reps, warm = (3, 1) if c.quick else (10, 2)
    gen = torch.Generator(device="cuda").manual_seed(48)
    x = torch.rand(SHARED_ROWS, SHARED_COLS, device="cuda", generator=gen) * 2 - 1
    xn = torch.nn.functional.normalize(x, dim=1)
    x = None
    for n in SHARED_QUERIES:
        try:
            q = torch.rand(n, SHARED_COLS, device="cuda", generator=gen) * 2 - 1

            def run():
                qn = torch.nn.functional.normalize(q, dim=1)
                for s in range(0, n, SHARED_CHUNK):
                    torch.topk(qn[s:s + SHARED_CHUNK] @ xn.T, SHARED_K, dim=1)
            med, lo, hi = summary(torch_events(c, run, reps, warm))
            add(f"shared.torch_batched_{n}", "pytorch_cuda", n / med, "queries/s", (n / hi, n / lo), reps,
                {"ms": med * 1e3, "rows": SHARED_ROWS, "cols": SHARED_COLS, "k": SHARED_K,
                 "chunk": SHARED_CHUNK, "timing": "cuda_events",
                 "how": "topk(normalize(Q) @ normalize(X).T, 10) in chunks of 1,024 queries"})
            # Every query of the batch is answered when the batch is: the
            # time of the whole is each one's latency (the peer of
            # erlcuda's burst of N, its p99 and max).
            add(f"shared.burst_{n}.p99", "pytorch_cuda", med * 1e6, "us", (lo * 1e6, hi * 1e6), reps,
                {"queries": n, "timing": "cuda_events", "how": "the batched queries' whole time"})
        except Exception as e:
            error(f"shared.torch_batched_{n}", e)
        q = None
        free_gpu(c)
    xn = None


def sec_matmul_kernel(c):
    need(c, "torch")
    np, torch = c.np, c.torch
    tf32_off(c)
    kern, info, load_err = None, None, None
    try:
        kern, info = load_erlcuda_matmul(c)
    except Exception as e:
        load_err = e
        error("matmul.kernel erlcuda (load)", e)
    for s in matmul_sizes(c):
        reps, warm = kernel_reps(c, s)
        flops = 2.0 * s ** 3
        try:
            g = torch.Generator(device="cuda")
            g.manual_seed(int(c.rng.integers(0, 2 ** 62)))
            A = torch.randn(s, s, device="cuda", dtype=torch.float32, generator=g)
            B = torch.randn(s, s, device="cuda", dtype=torch.float32, generator=g)
            C = torch.empty(s, s, device="cuda", dtype=torch.float32)
        except Exception as e:
            error(f"matmul.kernel n{s} setup", e)
            free_gpu(c)
            continue
        # cuBLAS SGEMM through torch
        try:
            med, lo, hi = summary(torch_events(c, lambda: torch.matmul(A, B, out=C), reps, warm))
            add(f"matmul.kernel.n{s}", "cublas_sgemm", flops / med / 1e12, "TFLOP/s",
                (flops / hi / 1e12, flops / lo / 1e12), reps,
                {"ms": med * 1e3, "timing": "cuda_events", "tf32": False})
        except Exception as e:
            error(f"matmul.kernel n{s} cublas_sgemm", e)
        # erlcuda's PTX kernel through CuPy, on torch's buffers
        if kern is not None:
            try:
                cp, pl = c.cp, info["pl"]
                Ce = torch.full((s, s), float("nan"), device="cuda", dtype=torch.float32)
                # the tile height gpud would choose for this job
                jobs = [(A.data_ptr(), B.data_ptr(), Ce.data_ptr(), s, s, s)]
                rows = pl.matmul_rows(jobs, info["abi"])
                smem = pl.matmul_smem(info["abi"], rows)
                table, total = pl.matmul_table(jobs, rows, info["bn"])
                dt = cp.asarray(table.view(np.uint8))
                args = (dt, pl.u32(1), pl.u32(total), pl.u32(rows))
                torch.cuda.synchronize()
                cp.cuda.Device().synchronize()

                def launch():
                    kern((total,), (info["threads"],), args, shared_mem=smem)

                launch()
                cp.cuda.Device().synchronize()
                ok, rel, rel64 = check_matmul(c, A, B, Ce)
                med, lo, hi = summary(cupy_events(c, launch, reps, warm))
                cp.cuda.Device().synchronize()
                add(f"matmul.kernel.n{s}", "erlcuda", flops / med / 1e12, "TFLOP/s",
                    (flops / hi / 1e12, flops / lo / 1e12), reps,
                    {"ms": med * 1e3, "timing": "cuda_events", "entry": info["entry"], "grid": total,
                     "block": info["threads"], "smem": smem, "tile_rows": rows, "checked": ok, "max_rel_err": rel,
                     "max_rel_err_f64_rows": rel64, "tolerance": MATMUL_TOL,
                     "reference": "torch.matmul f32 (TF32 off), all elements; f64, 16 sampled rows"})
                del Ce, dt
            except Exception as e:
                error(f"matmul.kernel n{s} erlcuda", e)
        elif load_err is not None and s == matmul_sizes(c)[0]:
            print("  (erlcuda matmul kernel skipped: load failed, see meta.errors)", flush=True)
        A = B = C = None  # free before the next size
        free_gpu(c)


# ---------------------------------------------------------------- 5. matmul end to end
def e2e_reps(c, s):
    if c.quick:
        return (5, 1) if s <= 1024 else (3, 1)
    if s <= 1024:
        return 20, 3
    if s <= 2048:
        return 10, 2
    if s <= 4096:
        return 6, 2
    return 4, 1


def check_host_matmul(c, A_np, B_np, C_np, rows=8):
    """(ok, max rel err) of sampled rows of C against f64 numpy."""
    np = c.np
    s = A_np.shape[0]
    ii = c.rng.integers(0, s, rows)
    a = A_np[ii].astype(np.float64)
    b = B_np.astype(np.float64)
    ref = a @ b
    bound = np.maximum(np.abs(a) @ np.abs(b), 1e-30)
    got = np.asarray(C_np)[ii].astype(np.float64)
    if not np.all(np.isfinite(got)):
        return False, None
    rel = float(np.max(np.abs(got - ref) / bound))
    return rel <= MATMUL_TOL, rel


def sec_matmul_e2e(c):
    need(c, "torch")
    np, torch = c.np, c.torch
    tf32_off(c)
    for s in matmul_sizes(c):
        reps, warm = e2e_reps(c, s)
        flops = 2.0 * s ** 3
        try:
            A_np = c.rng.standard_normal((s, s), dtype=np.float32)
            B_np = c.rng.standard_normal((s, s), dtype=np.float32)
            A, B = torch.from_numpy(A_np), torch.from_numpy(B_np)
            Ap, Bp = A.pin_memory(), B.pin_memory()
            Cp = torch.empty((s, s), dtype=torch.float32, pin_memory=True)
        except Exception as e:
            error(f"matmul.end_to_end n{s} setup", e)
            free_gpu(c)
            continue

        def job_pageable():
            r = torch.matmul(A.cuda(), B.cuda()).cpu()
            torch.cuda.synchronize()
            return r

        def job_pinned():
            r = torch.matmul(Ap.cuda(non_blocking=True), Bp.cuda(non_blocking=True))
            Cp.copy_(r, non_blocking=True)
            torch.cuda.synchronize()
            return Cp

        for system, job in (("pytorch_pageable", job_pageable), ("pytorch_pinned", job_pinned)):
            try:
                Cp.fill_(float("nan"))
                ok, rel = check_host_matmul(c, A_np, B_np, job().numpy())
                med, lo, hi = summary(wall_times(job, reps, warm))
                add(f"matmul.end_to_end.n{s}", system, flops / med / 1e12, "TFLOP/s",
                    (flops / hi / 1e12, flops / lo / 1e12), reps,
                    {"ms": med * 1e3, "bytes": 12 * s * s, "checked": ok, "max_rel_err": rel, "tf32": False})
            except Exception as e:
                error(f"matmul.end_to_end n{s} {system}", e)
        A = B = Ap = Bp = Cp = A_np = B_np = None  # free before the next size
        free_gpu(c)


# ---------------------------------------------------------------- 8. mixed load
# bench/erlcuda_mixed_bench.erl's mix, PyTorch's best effort at it: the small
# op (torch.add of 1,000 f32 from pinned host memory to pinned host memory,
# one in flight) on a stream of the device's highest priority in the main
# thread; each large op, back to back, on a stream of the lowest priority
# in a Python thread of its own. Names as erlcuda's, system MIXED_SYSTEM.
MIXED_KINDS = ["matmul_4096_buffers", "matmul_4096_binaries", "vector_add_2^26_binaries", "put_get_256MiB",
               "arena_growth"]
MIXED_SYSTEM = "pytorch_priority"
MIXED_SMALL_JOBS = 100_000
MIXED_WARM = 2000
MIXED_ALONE_S = 2.0      # a large op's throughput alone: this long
MIXED_BUDGET_S = 45.0    # a stream of small ops stops after this long, done or not
MIXED_ROUNDS = 4         # arena_growth: rounds, each from cold host memory
MIXED_SWITCH_S = 1e-4    # the interpreter's switch interval meanwhile (default 5 ms)


class LargeLoop:
    """A large op run back to back in a thread of its own until stop() and
    at least `least` ops are done; times in seconds."""

    def __init__(self, job, least):
        self.job, self.least = job, least
        self.times, self.error = [], None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        try:
            pc = time.perf_counter
            while not (self.stopping.is_set() and len(self.times) >= self.least):
                t0 = pc()
                self.job()
                self.times.append(pc() - t0)
        except BaseException as e:  # the caller raises it
            self.error = e

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stopping.set()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.times


def elems_text(n):
    """2^k where n is one, else the number."""
    return f"2^{n.bit_length() - 1}" if n >= 1024 and n & (n - 1) == 0 else str(n)


def mixed_scale():
    v = os.environ.get("ERLCUDA_BENCH_MIXED_SCALE", "").strip()
    return max(1, int(v)) if v else 1


def sec_mixed(c):
    """Small ops alone and beside each large op (p50, p99, max in us) and the
    large ops' throughput alone and beside the small ones (jobs/s = ops over
    the sum of their wall times), as bench/erlcuda_mixed_bench.erl measures
    erlcuda; ERLCUDA_BENCH_MIXED_SCALE shrinks both the same way."""
    need(c, "torch")
    np, torch = c.np, c.torch
    tf32_off(c)
    s = mixed_scale()
    n_small = max(1000, (10_000 if c.quick else MIXED_SMALL_JOBS) // s)
    warm = max(200, MIXED_WARM // s)
    alone_s = max(0.5, (1.0 if c.quick else MIXED_ALONE_S) / s)
    budget_s = max(5.0, MIXED_BUDGET_S / s)
    side = max(32, 32 * round(4096 / s ** (1 / 3) / 32))
    elems = max(1024, (1 << 26) // s)
    lo, hi = 0, -1
    try:
        lo, hi = torch.cuda.Stream.priority_range()
    except Exception:
        pass
    small_s = torch.cuda.Stream(priority=hi)
    large_s = torch.cuda.Stream(priority=lo)
    common = {"scale": s, "quick": bool(c.quick), "small_priority": small_s.priority,
              "large_priority": large_s.priority, "switch_interval_s": MIXED_SWITCH_S,
              "threads": "the small op in the main thread, each large op in a thread of its own"}

    a_np = c.rng.standard_normal(1000, dtype=np.float32)
    b_np = c.rng.standard_normal(1000, dtype=np.float32)
    ref = a_np + b_np
    ap, bp = torch.from_numpy(a_np).pin_memory(), torch.from_numpy(b_np).pin_memory()
    outp = torch.empty(1000, dtype=torch.float32, pin_memory=True)
    ad, bd, rd = (torch.empty(1000, device="cuda", dtype=torch.float32) for _ in range(3))
    torch.cuda.synchronize()

    def small():
        with torch.cuda.stream(small_s):
            ad.copy_(ap, non_blocking=True)
            bd.copy_(bp, non_blocking=True)
            torch.add(ad, bd, out=rd)
            outp.copy_(rd, non_blocking=True)
        small_s.synchronize()

    def small_stream(n):
        """(times in ns, seconds, cut short)"""
        pc = time.perf_counter_ns
        out = []
        t_start = pc()
        deadline = t_start + int(budget_s * 1e9)
        for _ in range(n):
            t0 = pc()
            if t0 > deadline:
                break
            small()
            out.append(pc() - t0)
        return out, (pc() - t_start) / 1e9, len(out) < n

    def small_records(name, ns, extra):
        xs = sorted(ns)
        for tag, v in (("p50", pct(xs, 50)), ("p99", pct(xs, 99)), ("max", xs[-1])):
            add(f"{name}.{tag}", MIXED_SYSTEM, v / 1e3, "us", (xs[0] / 1e3, xs[-1] / 1e3), len(xs), extra)

    def large_records(k, alone, beside, extra):
        for tag, ts in (("alone", alone), ("beside_small", beside)):
            add(f"mixed.large.{k}.{tag}", MIXED_SYSTEM, len(ts) / sum(ts), "jobs/s",
                (1 / max(ts), 1 / min(ts)), len(ts),
                {**extra, "ms_per_job": sum(ts) / len(ts) * 1e3, "median_ms": statistics.median(ts) * 1e3,
                 "seconds": sum(ts)})

    def host_cold():
        """Pinned host memory back to the driver (a cold start's), where torch can."""
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        f = getattr(torch._C, "_host_emptyCache", None)
        if f is not None:
            f()
        return f is not None

    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(MIXED_SWITCH_S)
    try:
        for _ in range(warm):
            small()
        outp.fill_(float("nan"))
        small()
        ok = bool(np.array_equal(outp.numpy(), ref))
        ns, secs, cut = small_stream(n_small)
        small_records("mixed.small.alone", ns,
                      {**common, "checked": ok, "seconds": secs, "cut_short": cut, "jobs_wanted": n_small,
                       "how": "pinned a, b to the device, torch.add, to a pinned output, on a stream of "
                              "priority %d; stream.synchronize()" % small_s.priority})
        for k in MIXED_KINDS:
            try:
                job, size, how, keep = mixed_large_case(c, k, side, elems, large_s)
                extra = {**common, "size": size, "large_how": how}
                if k != "arena_growth":
                    job()  # warm-up (cuBLAS on this stream, the caching allocator)
                    alone = LargeLoop(job, 3).start()
                    time.sleep(alone_s)
                    alone = alone.stop()
                    for _ in range(max(1, warm // 10)):
                        small()
                    loop = LargeLoop(job, 1).start()
                    ns, secs, cut = small_stream(n_small)
                    beside = loop.stop()
                    jobs_wanted = n_small
                else:
                    per = max(1, n_small // MIXED_ROUNDS)
                    ns, secs, cut, alone, beside = [], 0.0, False, [], []
                    emptied = False
                    for _ in range(MIXED_ROUNDS):
                        emptied = host_cold()
                        for _ in range(max(1, warm // 10)):
                            small()
                        loop = LargeLoop(job, 1).start()
                        r_ns, r_secs, r_cut = small_stream(per)
                        beside += loop.stop()
                        ns += r_ns
                        secs += r_secs
                        cut = cut or r_cut
                        host_cold()
                        loop = LargeLoop(job, 1).start()
                        time.sleep(r_secs)
                        alone += loop.stop()
                    extra.update(rounds=MIXED_ROUNDS, host_cache_emptied=emptied)
                    jobs_wanted = per * MIXED_ROUNDS
                outp.fill_(float("nan"))
                small()
                ok = bool(np.array_equal(outp.numpy(), ref))
                small_records(f"mixed.small.beside.{k}", ns,
                              {**extra, "checked": ok, "seconds": secs, "cut_short": cut,
                               "jobs_wanted": jobs_wanted, "large_jobs": len(beside)})
                large_records(k, alone, beside, extra)
                keep.clear()
            except Exception as e:
                error(f"mixed {k}", e)
            free_gpu(c)
    finally:
        sys.setswitchinterval(old_switch)


def mixed_large_case(c, k, side, elems, stream):
    """(job, size text, how, tensors kept alive) of large op k on `stream`;
    each job ends with stream.synchronize()."""
    np, torch = c.np, c.torch
    cuda = torch.device("cuda")

    def dev(n):
        return torch.empty(n, device=cuda, dtype=torch.float32)

    def pinned(n):
        return torch.from_numpy(c.rng.standard_normal(n, dtype=np.float32)).pin_memory()

    keep = []
    if k == "matmul_4096_buffers":
        A, B, C = (dev((side, side)) for _ in range(3))
        A.normal_()
        B.normal_()
        keep += [A, B, C]

        def job():
            with torch.cuda.stream(stream):
                torch.matmul(A, B, out=C)
            stream.synchronize()
        how, size = "torch.matmul(A, B, out=C), tensors on the device (TF32 off)", f"{side}x{side} f32, on the device"
    elif k == "matmul_4096_binaries":
        Ap, Bp, Cp = pinned(side * side).view(side, side), pinned(side * side).view(side, side), \
            torch.empty((side, side), dtype=torch.float32, pin_memory=True)
        A, B, C = (dev((side, side)) for _ in range(3))
        keep += [Ap, Bp, Cp, A, B, C]

        def job():
            with torch.cuda.stream(stream):
                A.copy_(Ap, non_blocking=True)
                B.copy_(Bp, non_blocking=True)
                torch.matmul(A, B, out=C)
                Cp.copy_(C, non_blocking=True)
            stream.synchronize()
        how, size = ("pinned A, B to the device, torch.matmul (TF32 off), to a pinned C",
                     f"{side}x{side} f32, from pinned host memory")
    elif k == "vector_add_2^26_binaries":
        ap, bp = pinned(elems), pinned(elems)
        outp = torch.empty(elems, dtype=torch.float32, pin_memory=True)
        a, b, r = dev(elems), dev(elems), dev(elems)
        keep += [ap, bp, outp, a, b, r]

        def job():
            with torch.cuda.stream(stream):
                a.copy_(ap, non_blocking=True)
                b.copy_(bp, non_blocking=True)
                torch.add(a, b, out=r)
                outp.copy_(r, non_blocking=True)
            stream.synchronize()
        how, size = ("pinned a, b to the device, torch.add, to a pinned output",
                     f"{elems_text(elems)} f32 from pinned host memory")
    elif k == "put_get_256MiB":
        hp = pinned(elems)
        back = torch.empty(elems, dtype=torch.float32, pin_memory=True)
        keep += [hp, back]

        def job():
            with torch.cuda.stream(stream):
                d = torch.empty(elems, device=cuda, dtype=torch.float32)
                d.copy_(hp, non_blocking=True)
                back.copy_(d, non_blocking=True)
            stream.synchronize()
            del d
        how, size = ("a fresh device tensor, the pinned host tensor copied in and back out to a pinned one",
                     f"{4 * elems >> 20} MiB")
    elif k == "arena_growth":
        a_np = c.rng.standard_normal(elems, dtype=np.float32)
        b_np = c.rng.standard_normal(elems, dtype=np.float32)
        a_h, b_h = torch.from_numpy(a_np), torch.from_numpy(b_np)
        a, b, r = dev(elems), dev(elems), dev(elems)
        keep += [a_h, b_h, a, b, r]

        def job():
            ap, bp = a_h.pin_memory(), b_h.pin_memory()
            outp = torch.empty(elems, dtype=torch.float32, pin_memory=True)
            with torch.cuda.stream(stream):
                a.copy_(ap, non_blocking=True)
                b.copy_(bp, non_blocking=True)
                torch.add(a, b, out=r)
                outp.copy_(r, non_blocking=True)
            stream.synchronize()
        how, size = ("pageable a, b pinned for each op (x.pin_memory(), PyTorch's caching host allocator, "
                     "emptied at each round's start), to the device, torch.add, to a fresh pinned output",
                     f"{elems_text(elems)} f32 from pageable host memory")
    else:
        raise ValueError(k)
    torch.cuda.synchronize()
    return job, size, how, keep


# ---------------------------------------------------------------- summary table
def print_summary():
    recs = STATE["records"]
    if not recs:
        print("\n(no records)", flush=True)
        return
    systems, rows, units = [], {}, {}
    for r in recs:
        name = r["name"]
        if ".arena." in name:
            continue  # peers write the same figure under both names
        name = name.replace(".binaries.", ".")
        if r["system"] not in systems:
            systems.append(r["system"])
        rows.setdefault(name, {})[r["system"]] = r["value"]
        units[name] = r["unit"]
    w = max(len(n) for n in rows) + 2
    print("\nSummary (large.K.nN = large.K.binaries.nN = large.K.arena.nN)", flush=True)
    print(f"{'name':{w}} {'unit':8} " + " ".join(f"{s:>16}" for s in systems))
    for name, vals in rows.items():
        print(f"{name:{w}} {units[name]:8} " + " ".join(f"{fmt(vals.get(s)):>16}" for s in systems))
    errs = STATE["meta"].get("errors") or []
    if errs:
        print(f"\n{len(errs)} error(s):")
        for e in errs:
            print("  " + e)
    sys.stdout.flush()


# ---------------------------------------------------------------- main
def default_path(cands):
    for p in cands:
        if os.path.isfile(p):
            return os.path.abspath(p)
    return None


def parse_args(argv):
    p = argparse.ArgumentParser(description="erlcuda benchmark: PyTorch/CuPy peers on the same GPU")
    p.add_argument("out", nargs="?", default="peers.json", help="output JSON (default peers.json)")
    p.add_argument("--ptx", help=f"erlcuda's {PTX_NAME} (default: next to this script or ../kernels/out)")
    p.add_argument("--abi", help="kernels/src/abi.rs (default: <script dir>/../kernels/src/abi.rs)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and sizes (smoke run)")
    p.add_argument("--only", help="comma-separated subset of sections: " + ",".join(SECTIONS)
                   + " (all of these by default), or " + ",".join(OPTIONAL_SECTIONS) + " (only when named)")
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"peers.py: ignoring unknown arguments {unknown}", file=sys.stderr)
    if args.abi is None:
        args.abi = default_path([os.path.join(HERE, "..", "kernels", "src", "abi.rs"),
                                 os.path.join(HERE, "abi.rs"),
                                 os.path.join(HERE, "..", "kernels", "abi.rs")]) \
            or os.path.join(HERE, "..", "kernels", "src", "abi.rs")
    if args.ptx is None:
        args.ptx = default_path([os.path.join(HERE, PTX_NAME),
                                 os.path.join(HERE, "..", "kernels", "out", PTX_NAME),
                                 os.path.join(HERE, "..", "priv", PTX_NAME)])
    return args, unknown


def try_import(name):
    try:
        return importlib.import_module(name), None
    except Exception as e:  # ImportError, or a broken install (OSError, ...)
        return None, f"{name} does not import ({e!r})"


def nvidia_smi_driver():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0].strip()
    except Exception:
        pass
    return None


def main(argv):
    args, unknown = parse_args(argv)
    seed = time.time_ns() % (2 ** 63)
    STATE["out"] = args.out
    meta = STATE["meta"]
    meta.update({
        "producer": PRODUCER,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "quick": bool(args.quick),
        "seed": seed,
        "argv": list(argv),
        "errors": [],
    })
    if unknown:
        meta["ignored_args"] = unknown

    c = Ctx()
    c.quick, c.ptx, c.abi = args.quick, args.ptx, args.abi
    why = []
    np, err = try_import("numpy")
    if np is None:
        why.append(err)
    else:
        meta["numpy"] = np.__version__
        c.np = np
        c.rng = np.random.default_rng(seed)
        torch, err = try_import("torch")
        if torch is not None:
            meta["torch"] = torch.__version__
            meta["torch_cuda"] = getattr(torch.version, "cuda", None)
            try:
                if torch.cuda.is_available():
                    c.torch = torch
                else:
                    why.append("torch: no CUDA device")
            except Exception as e:
                why.append(f"torch.cuda: {e!r}")
        else:
            why.append(err)
        cp, err = try_import("cupy")
        if cp is not None:
            meta["cupy"] = cp.__version__
            try:
                if cp.cuda.runtime.getDeviceCount() > 0:
                    c.cp = cp
                else:
                    why.append("cupy: no CUDA device")
            except Exception as e:
                why.append(f"cupy: {e!r}")
        else:
            why.append(err)

    if c.np is None or (c.torch is None and c.cp is None):
        reason = "; ".join(why) or "no usable GPU library"
        meta["skipped"] = reason
        ok = write_json()
        print(f"peers.py: skipped, nothing measured: {reason}"
              + (f" (wrote {args.out} with no records)" if ok else ""), file=sys.stderr, flush=True)
        return 0 if ok else 1
    if why:
        meta["unavailable"] = why
        for w in why:
            error("setup", w)

    # device, driver
    try:
        if c.torch is not None:
            meta["device"] = c.torch.cuda.get_device_name(0)
        else:
            meta["device"] = c.cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as e:
        error("meta device", e)
    try:
        if c.cp is not None:
            v = int(c.cp.cuda.runtime.driverGetVersion())
            meta["cuda_driver_api"] = f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    drv = nvidia_smi_driver()
    if drv:
        meta["driver"] = drv
    meta["ptx"] = os.path.abspath(c.ptx) if c.ptx else None
    meta["abi"] = os.path.abspath(c.abi) if c.abi else None

    print(f"peers.py: {meta.get('device')} driver {meta.get('driver')} torch {meta.get('torch')} "
          f"cupy {meta.get('cupy')} numpy {meta.get('numpy')}{' (quick)' if c.quick else ''}", flush=True)
    print(f"  ptx {meta['ptx']}\n  abi {meta['abi']}\n  out {args.out}", flush=True)
    write_json()

    only = [s.strip() for s in args.only.split(",")] if args.only else SECTIONS
    funcs = {"pcie": ("PCIe, 256 MiB pinned copies", sec_pcie),
             "latency": ("small-job latency, vector_add of 1000", sec_latency),
             "large": ("large vectors, host to host", sec_large),
             "matmul_kernel": ("matmul kernel alone, device-resident f32", sec_matmul_kernel),
             "matmul_e2e": ("matmul end to end, host to host", sec_matmul_e2e),
             "device_resident": ("tensors on the device (erlcuda's device buffers' peer)", sec_device_resident),
             "examples": ("the example kernels' ops, tensors on the device", sec_examples),
             "mixed": ("mixed load: small ops beside large ones, stream priorities", sec_mixed),
             "shared": ("many queries against one matrix, batched by hand", sec_shared),
             "examples_peers": ("the example kernels' ops under torch.compile and in CuPy",
                                sec_examples_peers)}
    secs = {}
    for name in SECTIONS + OPTIONAL_SECTIONS:
        if name not in only:
            continue
        title, fn = funcs[name]
        print(f"\n== {title}", flush=True)
        t0 = time.perf_counter()
        try:
            fn(c)
        except Exception as e:
            error(name, e)
        secs[name] = round(time.perf_counter() - t0, 2)
        meta["section_seconds"] = secs
        free_gpu(c)
        write_json()
    print_summary()
    ok = write_json()
    print(f"\nwrote {args.out}: {len(STATE['records'])} records, {len(meta.get('errors') or [])} errors"
          if ok else f"\nFAILED to write {args.out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        rc = main(sys.argv[1:])
    except KeyboardInterrupt:
        STATE["meta"].setdefault("errors", []).append("interrupted")
        rc = 0 if write_json() else 1
        rc = 130 if rc == 0 else rc
    except Exception as e:  # last resort: still write what we have
        STATE["meta"].setdefault("errors", []).append(f"main: {e!r}")
        traceback.print_exc()
        rc = 0 if write_json() else 1
    sys.exit(rc)
