#!/usr/bin/env python3
"""GPU tests of the kit's device primitives (kernels/kit/gpu_tests/src/lib.rs)
and of its kernel macros (src/jobs.rs).

    python3 kernels/kit/gpu_tests/run.py PTX [SEED]

PTX is what build.sh wrote (OUT_DIR/kit_gpu_tests.ptx). Loads it with CuPy,
launches every test kernel on fresh random inputs (a new seed each run,
printed; pass it back to repeat a run), checks the results against NumPy:
exactly for integers, shuffles, votes, shared arrays and arg-reductions;
float sums within their rounding bound; the math functions within the
ulps the kit states (MATH_ULPS in kernels/kit/src/float.rs, read from the
source) against Python's math module (float64, glibc) on random arguments,
and on IEEE's special cases as fixed arguments (IEEE_ARGS, every pair for a
two-argument function, as tests/math.rs on the host) against glibc itself
through ctypes: C's ±0, ±inf and NaN exactly, sign included (pow(-0, -1) is
-inf), elsewhere a finite number of C's sign. The macros' kernels
run as gpud runs them: several jobs per launch in a table of 256-byte job
records (struct ec_job_args), any grid, the block sizes their block rule
allows; their data are small integers, so every result is exact. One line
per primitive; exits 1 if any failed. KIT_GPU_TESTS=vote,math (names of
the test_ functions below, comma-separated) runs only those.
"""
import ctypes
import ctypes.util
import math
import os
import re
import sys
import time

import cupy as cp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FAILED = []


def report(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILED.append(name)


def u32(x):
    return np.uint32(x)


INT_TYPES = {"u32": np.uint32, "i32": np.int32, "u64": np.uint64, "i64": np.int64}
ALL_TYPES = {"u8": np.uint8, **INT_TYPES, "f32": np.float32, "f64": np.float64}


def multiset_eq(a, b):
    return a.shape == b.shape and np.array_equal(np.sort(a), np.sort(b))


def check_group(dt, v, slot_of, slots, init, acc, olds):
    """One group of threads sharing `slots` slots (a whole launch, or one
    block for the shared forms): the final values and every returned old
    value against what some order of the same operations gives."""
    errs = []
    for s in range(slots):
        m = slot_of == s
        if not m.any():
            continue
        vv = v[m]
        o = [olds[c][m] for c in range(5)]
        a = [acc[c * slots + s] for c in range(5)]
        i0 = [init[c * slots + s] for c in range(5)]
        with np.errstate(over="ignore"):
            # add: the states s0..sk are the old values plus the final one.
            if not multiset_eq(np.append((o[0] + vv).astype(dt), dt(i0[0])), np.append(o[0], a[0])):
                errs.append(f"add slot {s}")
            # The CAS loop: each thread replaced one counter value, all distinct.
            want = (np.full(len(vv), i0[4], dt) + np.arange(len(vv)).astype(dt)).astype(dt)
            final = (np.array([i0[4]], dt) + np.array([len(vv)], dt))[0]
        if a[1] != min(vv.min(), i0[1]) or not np.all(np.isin(o[1], np.append(vv, i0[1]))) or np.any(o[1] < a[1]):
            errs.append(f"min slot {s}")
        if a[2] != max(vv.max(), i0[2]) or not np.all(np.isin(o[2], np.append(vv, i0[2]))) or np.any(o[2] > a[2]):
            errs.append(f"max slot {s}")
        if not multiset_eq(np.append(o[3], a[3]), np.append(vv, dt(i0[3]))):
            errs.append(f"exch slot {s}")
        if a[4] != final or not multiset_eq(o[4], want):
            errs.append(f"cas slot {s}")
    return errs


def test_int_atomics(mod, rng):
    for t, dt in INT_TYPES.items():
        info = np.iinfo(dt)
        for where in ("global", "shared"):
            n, slots, block = 1 << 16, int(rng.integers(1, 65)), 256
            # Full-range values: min/max meet negatives and the extremes;
            # adds wrap, as NumPy's do.
            vals = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
            vals[rng.integers(0, n, 8)] = info.max
            vals[rng.integers(0, n, 8)] = info.min
            rnd = lambda: rng.integers(info.min, info.max, size=slots, dtype=dt, endpoint=True)
            init = np.concatenate([rnd(), np.full(slots, info.max, dt), np.full(slots, info.min, dt), rnd(), rnd()])
            olds = cp.zeros(5 * n, dt)
            grid = n // block
            if where == "global":
                acc = cp.asarray(init)
                mod.get_function(f"atomics_global_{t}")((grid,), (block,), (cp.asarray(vals), u32(n), u32(slots), acc, olds))
                groups = [(np.arange(n), acc.get())]
            else:
                acc = cp.zeros(grid * 5 * slots, dt)
                mod.get_function(f"atomics_shared_{t}")(
                    (grid,), (block,), (cp.asarray(vals), u32(n), u32(slots), cp.asarray(init), acc, olds))
                a = acc.get()
                groups = [(np.arange(b * block, (b + 1) * block), a[b * 5 * slots:(b + 1) * 5 * slots]) for b in range(grid)]
            o = olds.get().reshape(5, n)
            errs = []
            for idx, a in groups:
                errs += check_group(dt, vals[idx], idx % slots, slots, init, a, [o[c][idx] for c in range(5)])
            report(f"atomic add/min/max/exch/cas {t} ({where}, {slots} slots, {n} threads)", not errs, ", ".join(errs[:4]))


def test_float_atomics(mod, rng):
    for t, dt in (("f32", np.float32), ("f64", np.float64)):
        n, slots, block = 1 << 16, int(rng.integers(1, 65)), 256
        grid = n // block
        # Normal values only: atom.add.f32 flushes subnormals to zero.
        vals = rng.uniform(0.5, 2.0, n).astype(dt)
        acc = cp.zeros((3 + grid) * slots, dt)
        olds = cp.zeros(3 * n, dt)
        mod.get_function(f"float_atomics_{t}")((grid,), (block,), (cp.asarray(vals), u32(n), u32(slots), acc, olds))
        a, o = acc.get(), olds.get().reshape(3, n)
        errs = []
        # add returns the old value: fl(old + v) in the type is the next
        # state, so the states chain exactly (round to nearest, as NumPy).
        for s in range(slots):
            m = np.arange(n) % slots == s
            if not multiset_eq(np.append((o[0][m] + vals[m]).astype(dt), dt(0)), np.append(o[0][m], a[s])):
                errs.append(f"add slot {s}")
            if not multiset_eq(np.append(o[1][m], a[slots + s]), np.append(vals[m], dt(0))):
                errs.append(f"exch slot {s}")
            if a[2 * slots + s] != vals[m].max():
                errs.append(f"cas-max slot {s}")
        for b in range(grid):
            idx = np.arange(b * block, (b + 1) * block)
            for s in range(slots):
                m = idx[idx % slots == s]
                if len(m) and not multiset_eq(np.append((o[2][m] + vals[m]).astype(dt), dt(0)),
                                              np.append(o[2][m], a[(3 + b) * slots + s])):
                    errs.append(f"shared add block {b} slot {s}")
        report(f"atomic float add (old value, global and shared), exch, cas {t} ({slots} slots)", not errs, ", ".join(errs[:4]))


def test_vote(mod, rng):
    warps = 64
    pats = [np.ones(32), np.zeros(32), np.eye(32)[int(rng.integers(32))], np.arange(32) % 2, 1 - np.eye(32)[0]]
    pats += [rng.integers(0, 2, 32) for _ in range(warps - len(pats))]
    preds = np.concatenate(pats).astype(np.uint32) * rng.integers(1, 1 << 31, warps * 32).astype(np.uint32)
    out = cp.zeros(3 * warps, np.uint32)
    mod.get_function("vote")((warps,), (32,), (cp.asarray(preds), out))
    o = out.get().reshape(warps, 3)
    p = (preds != 0).reshape(warps, 32)
    want = np.stack([(p * (1 << np.arange(32, dtype=np.uint64))).sum(1).astype(np.uint32), p.all(1), p.any(1)], 1)
    bad = np.flatnonzero((o != want.astype(np.uint32)).any(1))
    report(f"warp ballot/all/any ({warps} warps: all, none, one, alternate, all but one, random)", not len(bad),
           f"{len(bad)} warps differ, first {bad[:1]}: got {o[bad[:1]]} want {want[bad[:1]]}" if len(bad) else "")


def rand_of(dt, rng, n):
    if np.issubdtype(dt, np.floating):
        return rng.standard_normal(n).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


def test_shuffles(mod, rng):
    n = 4096
    lane = np.arange(n) % 32
    base = np.arange(n) - lane
    for t, dt in ALL_TYPES.items():
        x = rand_of(dt, rng, n)
        arg = int(rng.integers(1, 32))
        out = cp.zeros(4 * n, dt)
        mod.get_function(f"shuffles_{t}")((n // 128,), (128,), (cp.asarray(x), u32(n), u32(arg), out))
        o = out.get().reshape(4, n)
        up = np.where(lane >= arg, np.arange(n) - arg, np.arange(n))
        down = np.where(lane + arg < 32, np.arange(n) + arg, np.arange(n))
        want = [x[base + (7 * lane + 3) % 32], x[up], x[down], x[base + (lane ^ arg)]]
        ok = all(np.array_equal(o[k].view(np.uint8), want[k].view(np.uint8)) for k in range(4))
        report(f"warp shuffles idx/up/down/xor {t} (by {arg})", ok)
    x = rng.standard_normal(n).astype(np.float32)
    arg = int(rng.integers(1, 32))
    ov, oi = cp.zeros(n, np.float32), cp.zeros(n, np.uint32)
    mod.get_function("shuffles_pair")((n // 256,), (256,), (cp.asarray(x), u32(arg), ov, oi))
    src = base + (lane ^ arg)
    report("warp shuffle of a (value, index) pair", np.array_equal(ov.get(), x[src]) and np.array_equal(oi.get(), src))


def argext(v, better):
    """Index of the first best non-NaN value, or the identity's index."""
    ok = ~np.isnan(v) if v.dtype.kind == "f" else np.ones(len(v), bool)
    if not ok.any():
        return None
    best = (np.nanmax if better == "max" else np.nanmin)(v) if v.dtype.kind == "f" else (v.max() if better == "max" else v.min())
    return int(np.flatnonzero(ok & (v == best))[0])


def argmax_scan(v, lowest):
    """Prefix argmax: NaN never wins, ties keep the lower index, no
    non-NaN value yet gives the identity (lowest, 0xffffffff)."""
    vals, idx = np.empty_like(v), np.empty(len(v), np.uint32)
    bv, bi = lowest, 0xFFFFFFFF
    for i, x in enumerate(v.tolist()):
        if x == x and (x > bv or (x == bv and i < bi)):
            bv, bi = x, i
        vals[i], idx[i] = bv, bi
    return vals, idx


def last_nonzero_scan(v):
    out, cur = np.empty_like(v), v.dtype.type(0)
    for i, x in enumerate(v):
        if x != 0:
            cur = x
        out[i] = cur
    return out


def same(a, b):
    """Equal arrays, NaN equal to NaN."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


# The depth of the GPU's sums and scans: 5 within a warp, 5 across the
# warps, and the last combine.
SUM_DEPTH = 11


def close(got, want, dt, terms):
    """Float sums: equal (infinities too), or within depth·eps·Σ|x| of the
    float64 sum (the bound of a tree of that depth); NaN where NaN."""
    if dt.kind != "f":
        return np.array_equal(got, want)
    g, w = got.astype(np.float64), np.asarray(want, np.float64)
    nan = np.isnan(w)
    with np.errstate(invalid="ignore"):
        near = (g == w) | (np.abs(g - w) <= terms * np.finfo(dt).eps * SUM_DEPTH)
    return bool(np.array_equal(np.isnan(g), nan) and np.all(near[~nan]))


def test_block_ops(mod, rng):
    for block in (1024, 96, 32):
        for t, dt in (("u8", np.uint8), ("i32", np.int32), ("u32", np.uint32), ("i64", np.int64), ("f32", np.float32), ("f64", np.float64)):
            dt = np.dtype(dt)
            grid = 16
            n = grid * block
            # Few distinct values (ties everywhere), zeros for the custom
            # operator, and for floats NaN, ±inf and an all-NaN block.
            x = rng.integers(-4 if dt.kind != "u" else 0, 5, n).astype(dt)
            if dt.kind == "f":
                x += rng.standard_normal(n).astype(dt) * (rng.random(n) < 0.3)
                x[rng.random(n) < 0.05] = np.nan
                x[rng.integers(0, n, 3)] = np.inf
                x[rng.integers(0, n, 3)] = -np.inf
                x[block:2 * block] = np.nan
            red, red_idx = cp.zeros(8 * grid, dt), cp.zeros(2 * grid, np.uint32)
            scan, scan_idx = cp.zeros(8 * n, dt), cp.zeros(n, np.uint32)
            mod.get_function(f"block_ops_{t}")((grid,), (block,), (cp.asarray(x), u32(n), red, red_idx, scan, scan_idx))
            cp.cuda.runtime.deviceSynchronize()
            r, ri, s, si = red.get().reshape(grid, 8), red_idx.get().reshape(grid, 2), scan.get().reshape(8, n), scan_idx.get()
            errs = []
            lowest = -np.inf if dt.kind == "f" else np.iinfo(dt).min
            highest = np.inf if dt.kind == "f" else np.iinfo(dt).max
            with np.errstate(over="ignore", invalid="ignore"):
                for b in range(grid):
                    v = x[b * block:(b + 1) * block]
                    terms = np.cumsum(np.abs(v.astype(np.float64))) if dt.kind == "f" else None
                    fmax = np.fmax.reduce(v) if dt.kind == "f" else v.max()
                    fmin = np.fmin.reduce(v) if dt.kind == "f" else v.min()
                    if dt.kind == "f" and np.isnan(fmax):
                        fmax, fmin = dt.type(lowest), dt.type(highest)
                    ref = np.float64 if dt.kind == "f" else dt
                    want_sum = v.sum(dtype=ref)
                    if not close(np.array([r[b, 0]]), [want_sum], dt, terms[-1] if terms is not None else 0):
                        errs.append(f"sum block {b}")
                    if not (same(r[b, 1], fmax) and same(r[b, 2], fmin)):
                        errs.append(f"max/min block {b}")
                    if not same(r[b, 3], last_nonzero_scan(v)[-1]):
                        errs.append(f"custom block {b}")
                    for k, (better, ident, col) in enumerate((("max", lowest, 4), ("min", highest, 5))):
                        j = argext(v, better)
                        want = (dt.type(ident), 0xFFFFFFFF) if j is None else (v[j], j)
                        if r[b, col] != want[0] or ri[b, k] != want[1]:
                            errs.append(f"arg{better} block {b}: {(r[b, col], ri[b, k])} != {want}")
                    sl = slice(b * block, (b + 1) * block)
                    inc = np.cumsum(v, dtype=ref)
                    exc = np.concatenate([[0], inc[:-1]]).astype(ref)
                    if not (close(s[0][sl], inc, dt, terms) and close(s[1][sl], exc, dt, np.concatenate([[0], terms[:-1]]) if terms is not None else 0)):
                        errs.append(f"sum scans block {b}")
                    acc = (np.fmax if dt.kind == "f" else np.maximum).accumulate(v)
                    acc_min = (np.fmin if dt.kind == "f" else np.minimum).accumulate(v)
                    if dt.kind == "f":
                        acc = np.where(np.isnan(acc), lowest, acc)
                        acc_min = np.where(np.isnan(acc_min), highest, acc_min)
                    mexc = np.concatenate([[dt.type(lowest)], acc[:-1]]).astype(dt)
                    if not (same(s[2][sl], acc) and same(s[3][sl], mexc) and same(s[4][sl], acc_min)):
                        errs.append(f"max/min scans block {b}")
                    ln = last_nonzero_scan(v)
                    if not (same(s[5][sl], ln) and same(s[6][sl], np.concatenate([[dt.type(0)], ln[:-1]]).astype(dt))):
                        errs.append(f"custom scans block {b}")
                    wv, wi = argmax_scan(v, dt.type(lowest))
                    if not (same(s[7][sl], wv) and same(si[sl], wi)):
                        errs.append(f"argmax scan block {b}")
            report(f"block reduce+scans {t} (block {block}: sum, max, min, argmax, argmin, last-nonzero; ties, NaN, inf)",
                   not errs, ", ".join(errs[:3]))
    n = 2048
    x = rng.integers(-1000, 1000, n).astype(np.int32)
    out = cp.zeros(3 * n, np.int32)
    mod.get_function("warp_ops_i32")((n // 64,), (64,), (cp.asarray(x), u32(n), out))
    o = out.get().reshape(3, n)
    w = x.reshape(-1, 32)
    inc = np.cumsum(w, 1)
    mexc = np.concatenate([np.full((len(w), 1), np.iinfo(np.int32).min), np.maximum.accumulate(w, 1)[:, :-1]], 1)
    ok = np.array_equal(o[0], np.repeat(w.sum(1), 32)) and np.array_equal(o[1], inc.ravel()) and np.array_equal(o[2], mexc.ravel())
    report("warp reduce and scans i32 (sum, inclusive sum, exclusive max)", ok)


def test_shared(mod, rng):
    grid, n = 8, 8 * 1024
    x32, x64 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n)
    x8 = rng.integers(0, 256, n, dtype=np.uint8)
    o32, o64, o8 = cp.zeros(n, np.float32), cp.zeros(n), cp.zeros(n, np.uint8)
    mod.get_function("shared_reverse")((grid,), (1024,), (cp.asarray(x32), cp.asarray(x64), cp.asarray(x8), o32, o64, o8))
    rev = lambda a: a.reshape(grid, 1024)[:, ::-1].ravel()
    ok = np.array_equal(o32.get(), rev(x32)) and np.array_equal(o64.get(), rev(x64)) and np.array_equal(o8.get(), rev(x8))
    report("static shared arrays f32, f64 (generic, as pointer), u8 (reverse 1024 through each)", ok)
    # A barrier after a branch on the thread: n splits a warp (a hang, not
    # a wrong answer, if the barrier were two instructions).
    n = int(rng.integers(1, 1024))
    while n % 32 == 0:
        n = int(rng.integers(1, 1024))
    x = rng.integers(-8, 8, n).astype(np.float32)
    out = cp.full(1024, 0xFFFFFFFF, np.uint32)
    mod.get_function("barrier_after_branch")((1,), (1024,), (cp.asarray(x), u32(n), out))
    want = np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(np.uint32)
    got = out.get()
    report(f"a barrier after a branch on the thread ({n} of 1024 threads store)",
           np.array_equal(got[:n], want) and bool((got[n:] == 0xFFFFFFFF).all()))


def test_dimensions(mod, rng):
    w, h = int(rng.integers(1, 300)), int(rng.integers(1, 300))
    out = cp.full(w * h, 0xFFFFFFFF, np.uint32)
    bx, by = 16, 8
    mod.get_function("grid_2d")(((w + bx - 1) // bx, (h + by - 1) // by), (bx, by), (out, u32(w), u32(h)))
    yy, xx = np.mgrid[0:h, 0:w]
    report(f"2-D grid indices ({w}x{h}, blocks {bx}x{by})", np.array_equal(out.get(), ((yy << 16) | xx).astype(np.uint32).ravel()))
    rows, cols, tr, tc = int(rng.integers(1, 200)), int(rng.integers(1, 200)), int(rng.integers(1, 40)), int(rng.integers(1, 40))
    out = cp.full(rows * cols, 0xFFFFFFFF, np.uint32)
    mod.get_function("tiles")((7,), (128,), (out, u32(rows), u32(cols), u32(tr), u32(tc)))
    across = -(-cols // tc)
    want = (yy_t := np.mgrid[0:rows, 0:cols])[0] // tr * across + yy_t[1] // tc
    report(f"tiles ({rows}x{cols} by {tr}x{tc}, grid-stride over 7 blocks)", np.array_equal(out.get(), want.astype(np.uint32).ravel()))
    rows, cols, per = int(rng.integers(1, 50)), int(rng.integers(1, 3000)), int(rng.integers(1, 1000))
    parts = max(1, -(-cols // per))
    out = cp.full(rows * cols, 0xFFFFFFFF, np.uint32)
    mod.get_function("row_parts")((rows * parts,), (256,), (out, u32(rows), u32(cols), u32(per)))
    r, c = np.mgrid[0:rows, 0:cols]
    report(f"blocks per row ({rows} rows of {cols}, {per} per block)", np.array_equal(out.get(), ((r << 16) | (c // per)).astype(np.uint32).ravel()))


# ------------------------------------------------------------- job tables

# One job record: struct ec_job_args (c_src/erlcuda_ring.h), the kit's Job
# (kernels/kit/src/job.rs). Slots 0..8 the v and io arguments, 8..12 the
# outputs; param the s and d arguments (floats as f64 bits, integers as s64,
# dimensions as u64), all in declared order.
JOB = np.dtype([("addr", "<u8", (12,)), ("len", "<u4", (12,)), ("param", "<u8", (8,)), ("block_start", "<u8"),
                ("buffers", "<u4"), ("grid", "<u4"), ("block", "<u4"), ("shared_bytes", "<u4"), ("given", "<u4"),
                ("reserved", "<u4", (5,))])
assert JOB.itemsize == 256 and JOB.fields["param"][1] == 144 and JOB.fields["block_start"][1] == 208
OUT = 8  # the first output's slot (MAX_VECTORS)
ELEMS_PER_THREAD, SERIAL = 4, 256  # the blocks rules elements(LEN) and chunks(LEN)
BLOCK_SHARED_BYTES = 33 * 8


def fparam(x):
    return int(np.array(x, np.float64).view(np.uint64))


def iparam(x):
    return int(np.array(x, np.int64).view(np.uint64))


def run_jobs(mod, entry, jobs, blocks, threads, shared, rng):
    """One launch of `entry` over `jobs` (dicts: "slots" {slot: CuPy array},
    "params" [u64]), laid out as gpud lays a batch: block_start is the
    exclusive prefix of `blocks(job)`, the virtual blocks the kernel's
    blocks rule gives the job at `threads`. The grid is drawn from 1 to the
    total (the entries are grid-stride). Returns the total."""
    table = np.zeros(len(jobs), JOB)
    total = 0
    for j, job in enumerate(jobs):
        for slot, a in job["slots"].items():
            table["addr"][j, slot] = a.data.ptr if a.size else 0
            table["len"][j, slot] = a.size
        for i, p in enumerate(job.get("params", ())):
            table["param"][j, i] = p
        table["block_start"][j] = total
        total += blocks(job)
    if total:
        grid = int(rng.integers(1, total + 1))
        mod.get_function(entry)((grid,), (threads,), (cp.asarray(table.view(np.uint8)), u32(len(jobs)), u32(total)),
                                shared_mem=shared)
    cp.cuda.runtime.deviceSynchronize()
    return total


def n_of(job):
    return job["slots"][0].size


def elements(threads):
    return lambda job: -(-n_of(job) // (threads * ELEMS_PER_THREAD))


def chunks(threads):
    return lambda job: -(-n_of(job) // (threads * SERIAL))


def placed(a, rng):
    """`a` on the GPU at a 16-byte aligned address or one element past one
    (the kit's vector paths and their fallbacks)."""
    off = int(rng.integers(0, 2))
    d = cp.zeros(a.size + off, a.dtype)
    d[off:] = cp.asarray(a)
    return d[off:]


def ints(rng, n, dt, lo=-1000, hi=1000):
    return rng.integers(lo, hi + 1, n).astype(dt)


LENGTHS = (0, 1, 3, 4, 1023, 1024, 4097, 65537)


def test_jobs(mod, rng):
    f_types = (("f32", np.float32), ("f64", np.float64))
    # elementwise!: out = alpha x + y (alpha, x, y small dyadics: exact).
    for t, dt in f_types:
        for threads in (256, 96, 1024):
            lens = list(LENGTHS) + [int(rng.integers(1, 300_000))]
            jobs, want = [], []
            for n in lens:
                x, y, alpha = ints(rng, n, dt), ints(rng, n, dt), int(rng.integers(-16, 17)) / 4
                jobs.append({"slots": {0: placed(x, rng), 1: placed(y, rng), OUT: placed(np.zeros(n, dt), rng)},
                             "params": [fparam(alpha)]})
                want.append((dt(alpha) * x + y).astype(dt))
            run_jobs(mod, f"job_axpy_{t}", jobs, elements(threads), threads, 0, rng)
            bad = [n for job, w, n in zip(jobs, want, lens) if not np.array_equal(job["slots"][OUT].get(), w)]
            report(f"job table: elementwise! {t} ({len(jobs)} jobs, block {threads}, aligned and not)", not bad,
                   f"lengths {bad} differ" if bad else "")
    # reduction!: sum = Σ x² into each job's zeroed output, exact.
    for t, dt in f_types:
        for threads in (256, 64, 1024):
            lens = list(LENGTHS) + [256 * threads * 3 + 5, int(rng.integers(1, 300_000))]
            xs = [ints(rng, n, dt, 0, 2) for n in lens]
            out = cp.zeros(len(lens), dt)
            jobs = [{"slots": {0: placed(x, rng), OUT: out[j:j + 1]}} for j, x in enumerate(xs)]
            run_jobs(mod, f"job_sumsq_{t}", jobs, chunks(threads), threads, BLOCK_SHARED_BYTES, rng)
            want = np.array([(x.astype(np.float64) ** 2).sum() for x in xs])
            got = out.get().astype(np.float64)
            ok = np.array_equal(got, want)
            report(f"job table: reduction! {t} ({len(jobs)} jobs, block {threads})", ok, "" if ok else f"got {got} want {want}")
    # table!: out[r] = max of row r, one block per row.
    for t, dt in f_types:
        for threads in (128, 32, 96):
            shapes = [(0, 5), (1, 1), (7, 1000), (100, 33), (3, 5000), (int(rng.integers(1, 300)), int(rng.integers(1, 300)))]
            xs = [rng.standard_normal(r * c).astype(dt) for r, c in shapes]
            jobs = [{"slots": {0: placed(x, rng), OUT: cp.zeros(r, dt)}, "params": [c]} for x, (r, c) in zip(xs, shapes)]
            run_jobs(mod, f"job_row_max_{t}", jobs, lambda job: n_of(job) // job["params"][0], threads,
                     BLOCK_SHARED_BYTES, rng)
            bad = [s for job, x, s in zip(jobs, xs, shapes)
                   if not np.array_equal(job["slots"][OUT].get(), x.reshape(s).max(1) if s[0] else np.zeros(0, dt))]
            report(f"job table: table! {t} out = n / cols ({len(jobs)} jobs, block {threads})", not bad, f"shapes {bad} differ" if bad else "")
    # kernel!: typed inputs (T, f64, u8), scalars of T and s32, two
    # outputs (a vector of T and a u32 counted atomically).
    for t, dt in f_types:
        for threads in (256, 32, 160):
            shapes = [(0, 4), (1, 1), (5, 3000), (64, 7), (int(rng.integers(1, 200)), int(rng.integers(1, 500)))]
            jobs, want = [], []
            for rows, cols in shapes:
                x, w = ints(rng, rows * cols, dt, -4, 4), ints(rng, cols, np.float64, -3, 3)
                mask = (rng.random(rows) < 0.6).astype(np.uint8) * rng.integers(1, 256, rows).astype(np.uint8)
                scale, shift = [0.5, 1.5, -2.0][int(rng.integers(0, 3))], int(rng.integers(-10, 11))
                y = np.where(mask != 0, scale * (x.reshape(rows, cols).astype(np.float64) @ w) + shift, 0).astype(dt)
                want.append((y, int((mask != 0).sum())))
                jobs.append({"slots": {0: placed(x, rng), 1: placed(w, rng), 2: cp.asarray(mask),
                                       OUT: cp.zeros(rows, dt), OUT + 1: cp.zeros(1, np.uint32)},
                             "params": [fparam(scale), iparam(shift), rows, cols]})
            run_jobs(mod, f"masked_dot_{t}", jobs, lambda job: job["params"][2], threads, BLOCK_SHARED_BYTES, rng)
            bad = [s for job, (y, h), s in zip(jobs, want, shapes)
                   if not (np.array_equal(job["slots"][OUT].get(), y) and int(job["slots"][OUT + 1].get()[0]) == h)]
            report(f"job table: kernel! {t} typed inputs, two outputs ({len(jobs)} jobs, block {threads})", not bad,
                   f"shapes {bad} differ" if bad else "")
    # kernel!: an io argument, integers and floats: acc += a x (wrapping
    # for the integers, as on the GPU).
    for t, dt in (("s32", np.int32), ("u32", np.uint32), ("f64", np.float64)):
        for threads in (256, 1, 33):
            lens = [0, 1, 5, 1024, 4099] + ([int(rng.integers(1, 100_000))] if threads > 1 else [])
            jobs, want = [], []
            for n in lens:
                lo = 0 if dt == np.uint32 else -1000
                acc, x, a = ints(rng, n, dt, lo), ints(rng, n, dt, lo), int(rng.integers(lo // 200, 6))
                with np.errstate(over="ignore"):
                    want.append((acc + dt(a) * x).astype(dt))
                jobs.append({"slots": {0: cp.asarray(acc), 1: placed(x, rng)},
                             "params": [fparam(a) if t == "f64" else iparam(a)]})
            run_jobs(mod, f"scale_add_{t}", jobs, elements(threads), threads, 0, rng)
            bad = [n for job, w, n in zip(jobs, want, lens) if not np.array_equal(job["slots"][0].get(), w)]
            report(f"job table: kernel! {t} io argument, no output ({len(jobs)} jobs, block {threads})", not bad,
                   f"lengths {bad} differ" if bad else "")
    # kernel! with no T: one entry, a u8 input, a u32 vector and an s64
    # scalar output.
    for threads in (256, 50):
        lens = list(LENGTHS) + [int(rng.integers(1, 300_000))]
        xs = [rng.integers(0, 256, n).astype(np.uint8) for n in lens]
        jobs = [{"slots": {0: placed(x, rng), OUT: cp.zeros(256, np.uint32), OUT + 1: cp.zeros(1, np.int64)}} for x in xs]
        run_jobs(mod, "byte_hist", jobs, elements(threads), threads, 0, rng)
        bad = [len(x) for job, x in zip(jobs, xs)
               if not (np.array_equal(job["slots"][OUT].get(), np.bincount(x, minlength=256).astype(np.uint32))
                       and int(job["slots"][OUT + 1].get()[0]) == int(x.astype(np.int64).sum()))]
        report(f"job table: kernel! with no T ({len(jobs)} jobs, block {threads})", not bad, f"lengths {bad} differ" if bad else "")


# ------------------------------------------------------------------ math

def math_ulps():
    """MATH_ULPS of kernels/kit/src/float.rs: (name, f32 bound, f64 bound)
    in row order (the kernels' function ids)."""
    src = open(os.path.join(HERE, "..", "src", "float.rs")).read()
    body = src[src.index("pub const MATH_ULPS"):]
    body = body[:body.index("];")]
    rows = [(m[0], float(m[1]), float(m[2])) for m in re.findall(r'\("(\w+)", ([\d.]+), ([\d.]+)\)', body)]
    # GPU_F64_ULPS: wider f64 bounds for the GPU (fused multiply-adds).
    gpu = src[src.index("pub const GPU_F64_ULPS"):]
    gpu = dict((m[0], float(m[1])) for m in re.findall(r'\("(\w+)", ([\d.e]+)\)', gpu[:gpu.index("];")]))
    return [(n, b32, gpu.get(n, b64)) for n, b32, b64 in rows]


def py_round(v):
    return math.copysign(math.floor(abs(v) + 0.5), v) if abs(v) < 2 ** 52 else v


# Python's math (glibc) per function; exp10 as pow(10, x) (correctly rounded
# in glibc); domain errors and overflows become C's results below.
def recip(v):
    return math.copysign(math.inf, v) if v == 0 else 1.0 / v


REF = {
    "recip": recip, "exp": math.exp, "exp2": lambda v: 2.0 ** v, "exp10": lambda v: 10.0 ** v, "expm1": math.expm1,
    "log": math.log, "log1p": math.log1p, "log2": math.log2, "log10": math.log10, "cbrt": lambda v: math.copysign(abs(v) ** (1 / 3), v),
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "sinh": math.sinh, "cosh": math.cosh, "tanh": math.tanh, "asinh": math.asinh, "acosh": math.acosh, "atanh": math.atanh,
    "erf": math.erf, "erfc": math.erfc, "lgamma": math.lgamma, "tgamma": math.gamma, "floor": np.floor, "ceil": np.ceil,
    "round": py_round, "trunc": np.trunc, "pow": math.pow, "hypot": math.hypot, "atan2": math.atan2, "fmod": math.fmod,
}
if hasattr(math, "cbrt"):
    REF["cbrt"] = math.cbrt
if hasattr(math, "exp2"):
    REF["exp2"] = math.exp2
BINARY = {"pow", "hypot", "atan2", "fmod"}

# Argument ranges (as tests/math.rs draws them): ("u", lo, hi) uniform,
# ("l", lo, hi, signed) log-uniform magnitude; second for binary functions.
DOMAIN = {
    "recip": (("l", 1e-45, 3e38, 1), ("l", 1e-320, 1e308, 1)),
    "exp": (("u", -104, 89), ("u", -746, 710)), "exp2": (("u", -150, 128), ("u", -1075, 1024)),
    "exp10": (("u", -45, 38.5), ("u", -323, 308.2)), "expm1": (("u", -20, 88), ("u", -40, 709)),
    "log": (("l", 1e-45, 3e38, 0), ("l", 1e-320, 1e308, 0)), "log1p": (("u", -0.999, 1e3), ("u", -0.999, 1e3)),
    "log2": (("l", 1e-45, 3e38, 0), ("l", 1e-320, 1e308, 0)), "log10": (("l", 1e-45, 3e38, 0), ("l", 1e-320, 1e308, 0)),
    "cbrt": (("l", 1e-40, 3e38, 1), ("l", 1e-300, 1e300, 1)),
    "sin": (("l", 1e-6, 1e6, 1), ("l", 1e-10, 1e10, 1)), "cos": (("l", 1e-6, 1e6, 1), ("l", 1e-10, 1e10, 1)),
    "tan": (("l", 1e-6, 1e6, 1), ("l", 1e-10, 1e10, 1)), "asin": (("u", -1, 1),) * 2, "acos": (("u", -1, 1),) * 2,
    "atan": (("l", 1e-10, 1e10, 1), ("l", 1e-20, 1e20, 1)), "sinh": (("u", -89, 89), ("u", -710, 710)),
    "cosh": (("u", -89, 89), ("u", -710, 710)), "tanh": (("u", -20, 20), ("u", -40, 40)),
    "asinh": (("l", 1e-10, 1e30, 1), ("l", 1e-20, 1e300, 1)), "acosh": (("l", 1, 1e30, 0), ("l", 1, 1e300, 0)),
    "atanh": (("u", -1, 1),) * 2, "erf": (("u", -6, 6),) * 2, "erfc": (("u", -6, 10), ("u", -6, 27)),
    "lgamma": (("u", 0.01, 100),) * 2, "tgamma": (("u", 0.01, 35), ("u", 0.01, 171)),
    "floor": (("l", 1e-3, 1e30, 1), ("l", 1e-3, 1e300, 1)), "ceil": (("l", 1e-3, 1e30, 1), ("l", 1e-3, 1e300, 1)),
    "round": (("u", -1e3, 1e3),) * 2, "trunc": (("l", 1e-3, 1e30, 1), ("l", 1e-3, 1e300, 1)),
    "pow": (("u", 0, 100), ("u", -20, 20)), "hypot": (("l", 1e-30, 1e30, 1),) * 2,
    "atan2": (("u", -10, 10),) * 2, "fmod": (("u", -1e3, 1e3), ("u", -10, 10)),
}
# IEEE's special cases, fixed (random draws found a pair such as (-0, -1)
# only sometimes): signed zeros, infinities, NaN, odd and even integers of
# both signs (pow's exponents), halves, a subnormal and a large even
# integer. The same list as IEEE_ARGS in tests/math.rs.
IEEE_ARGS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 2.5, -2.5, 1e-40, -1e-40, 1e30, -1e30,
             math.inf, -math.inf, math.nan]

# C's own results for the special cases: glibc's libm (the host test's
# reference too), so no special case is mapped by hand.
LIBM = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")


def c_libm(name):
    f = getattr(LIBM, name)
    f.restype = ctypes.c_double
    f.argtypes = [ctypes.c_double] * (2 if name in BINARY else 1)
    return f


def special_ok(got, want, err, bound, dt):
    """Per element: where C's float64 `want` is NaN, ±0 or ±inf, `got` is
    exactly that (the sign of zeros and infinities included); where `want` is
    beyond dt's range, within `bound` ulps (`err`); elsewhere finite, non-zero
    and of want's sign."""
    got = got.astype(np.float64)
    fi = np.finfo(dt)
    tiny = float(np.nextafter(dt(0), dt(1))) / 2
    with np.errstate(invalid="ignore"):
        same_sign = np.signbit(got) == np.signbit(want)
        exact = (want == 0) | np.isinf(want)
        beyond = ~exact & ((np.abs(want) > fi.max) | (np.abs(want) < tiny))
        ok = np.where(np.isnan(want), np.isnan(got),
                      np.where(exact, (got == want) & same_sign,
                               np.where(beyond, err <= bound, np.isfinite(got) & (got != 0) & same_sign)))
    return ok


def draw(d, rng, n):
    if d[0] == "u":
        return rng.uniform(d[1], d[2], n)
    m = np.exp(rng.uniform(np.log(d[1]), np.log(d[2]), n))
    return m * np.where(rng.random(n) < 0.5, -1, 1) if d[3] else m


def c_result(f, name, *a):
    try:
        return float(f(*a))
    except OverflowError:
        # Overflow: an infinity of the function's sign there.
        if name == "sinh" or name == "pow" and a[0] < 0 and a[1] % 2 == 1:
            return math.copysign(math.inf, a[0])
        return math.inf
    except ValueError:
        # Poles give infinities in C, the rest of the domain errors NaN.
        x = a[0]
        if name in ("log", "log2", "log10") and x == 0:
            return -math.inf
        if name == "log1p" and x == -1:
            return -math.inf
        if name == "atanh" and abs(x) == 1:
            return math.copysign(math.inf, x)
        if name in ("lgamma",) and x <= 0 and x == math.floor(x):
            return math.inf
        if name == "tgamma" and x == 0:
            return math.copysign(math.inf, x)
        if name == "pow" and x == 0 and a[1] < 0:
            # A pole: -inf only for -0 to an odd integer power.
            odd = a[1] == math.floor(a[1]) and a[1] % 2 == 1
            return math.copysign(math.inf, x) if odd else math.inf
        return math.nan


def ulps(got, want, dt):
    """Error of `got` (type dt) against the float64 `want`, in ulps of dt at
    `want`; 0 where both are NaN or equal, inf where only one is NaN."""
    got = got.astype(np.float64)
    both_nan = np.isnan(got) & np.isnan(want)
    one_nan = np.isnan(got) ^ np.isnan(want)
    fi = np.finfo(dt)
    mag = np.maximum(np.abs(want), fi.tiny)
    with np.errstate(all="ignore"):
        e = np.floor(np.log2(mag))
        ulp = np.ldexp(1.0, (e - fi.nmant).astype(int))
        err = np.abs(got - want) / ulp
    over = np.abs(want) > fi.max
    err = np.where(over, np.where(np.isinf(got) & (np.sign(got) == np.sign(want)) | (np.abs(got) == fi.max), 0.0, np.inf), err)
    err = np.where(got == want, 0.0, err)
    err = np.where(both_nan, 0.0, np.where(one_nan, np.inf, err))
    return err


def run_math(mod, fid, t, dt, x, y):
    out = cp.zeros(len(x), dt)
    mod.get_function(f"math_{t}")(((len(x) + 255) // 256,), (256,), (u32(fid), cp.asarray(x), cp.asarray(y), out, u32(len(x))))
    return out.get()


def test_math(mod, rng):
    n = 1 << 15
    grid = np.array(IEEE_ARGS)
    for fid, (name, b32, b64) in enumerate(math_ulps()):
        # recip is no libm function: its reference, the division, serves
        # for its special cases too.
        f, c_f, worst, special = REF[name], (REF[name] if name == "recip" else c_libm(name)), {}, []
        # The fixed special cases: every pair for two arguments, else y = 1.
        gx, gy = (np.repeat(grid, len(grid)), np.tile(grid, len(grid))) if name in BINARY else (grid, np.ones(len(grid)))
        for ti, (t, dt, bound) in enumerate((("f32", np.float32, b32), ("f64", np.float64, b64))):
            dx = DOMAIN[name][ti]
            x = draw(dx, rng, n).astype(dt)
            y = (draw(DOMAIN[name][ti], rng, len(x)) if name in BINARY else np.ones(len(x))).astype(dt)
            got = run_math(mod, fid, t, dt, x, y)
            xs, ys = x.astype(np.float64), y.astype(np.float64)
            want = np.array([c_result(f, name, a, b) if name in BINARY else c_result(f, name, a) for a, b in zip(xs, ys)])
            err = ulps(got, want, dt)
            k = int(np.argmax(err))
            worst[t] = (err[k], xs[k], ys[k], bound)
            sx, sy = gx.astype(dt), gy.astype(dt)
            got = run_math(mod, fid, t, dt, sx, sy)
            sxs, sys_ = sx.astype(np.float64), sy.astype(np.float64)
            want = np.array([c_f(a, b) if name in BINARY else c_f(a) for a, b in zip(sxs, sys_)])
            ok = special_ok(got, want, ulps(got, want, dt), bound, dt)
            special += [(t, float(sxs[i]), float(sys_[i]), float(got[i]), float(want[i])) for i in np.flatnonzero(~ok)]
        ok = all(w[0] <= w[3] for w in worst.values()) and not special
        detail = ", ".join(f"{t} {w[0]:.3f} ulp (bound {w[3]:g}{'' if w[0] <= w[3] else f'; at {w[1]!r}, {w[2]!r}'})"
                           for t, w in worst.items())
        detail += f"; {len(gx)} special cases" + (
            f": {len(special)} differ from C, first {special[0][0]} ({special[0][1]!r}, {special[0][2]!r}) = "
            f"{special[0][3]!r}, C says {special[0][4]!r}" if special else " as C's")
        report(f"math {name}", ok, detail)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: run.py PTX [SEED]")
    seed = int(sys.argv[2]) if len(sys.argv) == 3 else int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"seed {seed}  ({cp.cuda.runtime.getDeviceProperties(0)['name'].decode()})", flush=True)
    rng = np.random.default_rng(seed)
    mod = cp.RawModule(path=sys.argv[1])
    only = os.environ.get("KIT_GPU_TESTS", "")
    for test in (test_int_atomics, test_float_atomics, test_vote, test_shuffles, test_block_ops, test_shared,
                 test_dimensions, test_jobs, test_math):
        if only and test.__name__[5:] not in only.split(","):
            continue
        t0 = time.time()
        test(mod, rng)
        print(f"     ({test.__name__[5:]}: {time.time() - t0:.1f} s)", flush=True)
    cp.cuda.runtime.deviceSynchronize()
    print(f"{len(FAILED)} failed" if FAILED else "all passed (seed %d)" % seed)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
