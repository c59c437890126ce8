#!/usr/bin/env python3
"""Runs the host (CPU backend) entries of built users' kernel modules through
ctypes, as gpud's CPU backend calls them: one `Job` (kernels/kit/src/job.rs,
the layout of ec_job_args) per call, host addresses, vectors in slots 0..8
and outputs from slot 8, the scalar/dimension arguments one per param.

    python3 test/kernel_host.py EXAMPLE_OUT FAULTY_OUT

EXAMPLE_OUT: priv/erlcuda-build's output for examples/kernels (clamp,
sumsq, softmax, row_sums checked against Python references, f32 and f64);
FAULTY_OUT: for test/kernels_faulty (oob must die of SIGSEGV, boom of
SIGABRT with its panic message, each in a child process). Prints one line
per check; exits non-zero on the first failure. Standard library only.
"""
import ctypes
import math
import os
import signal
import struct
import subprocess
import sys


class Job(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64 * 12), ("len", ctypes.c_uint32 * 12), ("param", ctypes.c_uint64 * 8),
                ("block_start", ctypes.c_uint64), ("buffers", ctypes.c_uint32), ("grid", ctypes.c_uint32),
                ("block", ctypes.c_uint32), ("shared_bytes", ctypes.c_uint32), ("given", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32 * 5)]


assert ctypes.sizeof(Job) == 256
OUT_SLOT = 8  # the first output's slot (MAX_VECTORS)
CTYPE = {"f32": ctypes.c_float, "f64": ctypes.c_double}


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def params(sig, scalars, dims):
    """The params in signature order: a float scalar as its f64 bits, a
    dimension as a u64 (job.rs)."""
    out, s, d = [], iter(scalars), iter(dims)
    for c in sig:
        if c == "s":
            out.append(struct.unpack("=Q", struct.pack("=d", next(s)))[0])
        elif c == "d":
            out.append(next(d))
    return out


def run(lib, kernel, ty, sig, ins, out_len, scalars=(), dims=()):
    """Calls erlcuda_host_<kernel>_<ty> on a job over `ins`; returns the output."""
    arrays = [(CTYPE[ty] * len(v))(*v) for v in ins]
    out = (CTYPE[ty] * out_len)(*([float("nan")] * out_len))
    job = Job()
    for i, a in enumerate(arrays):
        job.addr[i], job.len[i] = ctypes.addressof(a), len(ins[i])
    job.addr[OUT_SLOT], job.len[OUT_SLOT] = ctypes.addressof(out), out_len
    for i, p in enumerate(params(sig, scalars, dims)):
        job.param[i] = p
    fn = getattr(lib, f"erlcuda_host_{kernel}_{ty}")
    fn.argtypes, fn.restype = [ctypes.POINTER(Job)], None
    fn(ctypes.byref(job))
    return list(out)


def rounded(x, ty):
    return struct.unpack("=f", struct.pack("=f", x))[0] if ty == "f32" else x


def close(got, want, ty, what, rel=None):
    rel = rel or (4e-7 if ty == "f32" else 1e-15)
    for i, (g, w) in enumerate(zip(got, want)):
        if not abs(g - w) <= rel * max(abs(w), 1e-30):
            fail(f"{what}: element {i}: {g!r}, want {w!r}")
    if len(got) != len(want):
        fail(f"{what}: {len(got)} elements, want {len(want)}")


def check_example(lib):
    rows, cols = 7, 33
    xs = [math.sin(i * 0.7) * (1 + i % 5) * 3 for i in range(rows * cols)]
    for ty in ("f32", "f64"):
        x = [rounded(v, ty) for v in xs]
        got = run(lib, "clamp", ty, "vss", [x], len(x), scalars=[-2.5, 4.0])
        if got != [min(max(v, rounded(-2.5, ty)), rounded(4.0, ty)) for v in x]:
            fail(f"clamp {ty}")
        got = run(lib, "sumsq", ty, "v", [[float(i % 9) for i in range(100_000)]], 1)
        if got != [float(sum((i % 9) ** 2 for i in range(100_000)))]:
            fail(f"sumsq {ty}: {got}")
        got = run(lib, "softmax", ty, "vd", [x], len(x), dims=[cols])
        want = []
        for r in range(rows):
            row = x[r * cols:(r + 1) * cols]
            e = [math.exp(v - max(row)) for v in row]
            want += [v / math.fsum(e) for v in e]
        close(got, want, ty, f"softmax {ty}", rel=(2e-6 if ty == "f32" else 1e-14))
        for r in range(rows):
            if abs(math.fsum(got[r * cols:(r + 1) * cols]) - 1) > (1e-5 if ty == "f32" else 1e-14):
                fail(f"softmax {ty}: row {r} does not sum to 1")
        got = run(lib, "row_sums", ty, "vd", [x], rows, dims=[cols])
        u = 2.0 ** -24 if ty == "f32" else 2.0 ** -53
        for r in range(rows):
            row = x[r * cols:(r + 1) * cols]
            # A sum of `cols` terms errs by at most cols·u·Σ|x|.
            if not abs(got[r] - math.fsum(row)) <= cols * u * math.fsum(map(abs, row)):
                fail(f"row_sums {ty}: row {r}: {got[r]!r}, want {math.fsum(row)!r}")
        # Huge magnitudes: the softmax stays finite (stable form).
        got = run(lib, "softmax", ty, "vd", [[1e30, 0.0, -1e30, 1e30]], 4, dims=[4])
        close(got, [0.5, 0.0, 0.0, 0.5], ty, f"softmax {ty} of huge values")
        print(f"ok: examples/kernels host entries ({ty}): clamp, sumsq, softmax, row_sums")


def child(so, kernel):
    """Runs one faulty kernel's host entry in a child process: (returncode, stderr)."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import ctypes, kernel_host as k; k.run(ctypes.CDLL({so!r}), {kernel!r}, 'f32', 'v', [[1.0, 2.0]], 2)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


def check_faulty(so):
    rc, _ = child(so, "oob")
    if rc != -signal.SIGSEGV:
        fail(f"oob's host entry: exit status {rc}, want death by SIGSEGV")
    rc, err = child(so, "boom")
    if rc != -signal.SIGABRT or "boom: erlcuda's fault-test kernel panics on purpose" not in err:
        fail(f"boom's host entry: exit status {rc}, want SIGABRT after its panic message; stderr:\n{err}")
    print("ok: test/kernels_faulty host entries: oob dies of SIGSEGV, boom aborts (SIGABRT) after its panic")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        fail("usage: kernel_host.py EXAMPLE_OUT FAULTY_OUT")
    check_example(ctypes.CDLL(os.path.join(sys.argv[1], "host.so")))
    check_faulty(os.path.join(sys.argv[2], "host.so"))
