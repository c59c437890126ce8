"""Host-side helpers for launching erlcuda's PTX kernels from Python.

Shared by kernels/gpu_check.py and bench/peers.py. Pure Python + numpy: no
GPU work, no CuPy/torch import, nothing done at import time. It mirrors the
host-side prep of kernels/src/abi.rs, whose constants it reads (abi.rs is the
single source of truth):

    abi = read_abi("kernels/src/abi.rs")      # {"MATMUL_BM": 128, ..., "ENTRY_MATMUL": "matmul"}
    entry = abi["ENTRY_MATMUL"] + "_f32"      # entries are <prefix>_<type>: matmul_f32
    jobs = [(pa, pb, pc, m, n, k)]
    rows = matmul_rows(jobs, abi)             # the tile height, as gpud chooses it
    table, total = matmul_table(jobs, rows, abi["MATMUL_BN"])
    # upload table.view(np.uint8); launch grid (total,), block (256,),
    # params (table_ptr, u32(njobs), u32(total), u32(rows)),
    # shared_mem=matmul_smem(abi, rows)
"""
import os
import re

import numpy as np

DEFAULT_ABI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "abi.rs")

# `pub const NAME: u32 = 128;` (plain integer literals only; expressions are skipped)
_INT_RE = re.compile(r"pub const (\w+): \w+ = ([0-9_]+);")
# `pub const NAME: &str = "text";`
_STR_RE = re.compile(r'pub const (\w+): &str = "([^"]*)";')
# `pub const NAME: &str = OTHER_NAME;` (an alias of another string constant)
_ALIAS_RE = re.compile(r"pub const (\w+): &str = ([A-Za-z_]\w*);")
# `#[path = "file.rs"] pub mod name;`: a module abi.rs includes from its folder
_PATH_MOD_RE = re.compile(r'#\[path = "([^"]+)"\]\s*pub mod \w+;')

# MatmulJob (#[repr(C)], 48 bytes): a, b, c: u64; m, n, k, tiles_n: u32; tile_start: u64
MM_DT = np.dtype([("a", "<u8"), ("b", "<u8"), ("c", "<u8"), ("m", "<u4"), ("n", "<u4"),
                  ("k", "<u4"), ("tiles_n", "<u4"), ("tile_start", "<u8")])
assert MM_DT.itemsize == 48


def read_abi(path=None):
    """Constants of abi.rs: integer literals as int, string constants as str
    (aliases resolved), those of the modules abi.rs includes with `#[path]`
    (matmul_f64_abi.rs, which must lie beside it) included."""
    path = path or DEFAULT_ABI
    with open(path) as fh:
        text = fh.read()
    for m in _PATH_MOD_RE.finditer(text):
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), m.group(1))) as fh:
            text += "\n" + fh.read()
    abi = {}
    for m in _INT_RE.finditer(text):
        abi[m.group(1)] = int(m.group(2).replace("_", ""))
    for m in _STR_RE.finditer(text):
        abi[m.group(1)] = m.group(2)
    aliases = {m.group(1): m.group(2) for m in _ALIAS_RE.finditer(text)}
    for name, target in aliases.items():
        seen = {name}
        while target in aliases and target not in seen:  # alias of an alias
            seen.add(target)
            target = aliases[target]
        if target in abi and isinstance(abi[target], str):
            abi[name] = abi[target]
    return abi


def matmul_smem(abi, rows=None):
    """Dynamic shared memory of a matmul_f32 launch of `rows`-high tiles
    (abi::matmul_tile_smem: two stages of A^T[BK][rows+4] and B[BK][BN]
    f32; MATMUL_WIDE_BK for MATMUL_WIDE_BM rows, MATMUL_BK for the others)."""
    rows = rows or abi["MATMUL_BM"]
    bk = abi["MATMUL_WIDE_BK"] if rows == abi["MATMUL_WIDE_BM"] else abi["MATMUL_BK"]
    return 2 * bk * (rows + 4 + abi["MATMUL_BN"]) * 4


def matmul_rows(jobs, abi):
    """The tile height abi::matmul_prepare chooses for a launch of `jobs`
    ((a, b, c, m, n, k) tuples): MATMUL_WIDE_BM where that makes at least
    MATMUL_WIDE_MIN_TILES tiles, MATMUL_NARROW_BM where MATMUL_BM would make
    at most MATMUL_NARROW_MAX_TILES, else MATMUL_BM. It is matmul_f32's 4th
    parameter, and the `bm` of matmul_table."""
    def tiles(bm):
        return sum(cdiv(j[3], bm) * cdiv(j[4], abi["MATMUL_BN"]) for j in jobs)
    if tiles(abi["MATMUL_WIDE_BM"]) >= abi["MATMUL_WIDE_MIN_TILES"]:
        return abi["MATMUL_WIDE_BM"]
    if tiles(abi["MATMUL_BM"]) <= abi["MATMUL_NARROW_MAX_TILES"]:
        return abi["MATMUL_NARROW_BM"]
    return abi["MATMUL_BM"]


def cdiv(a, b):
    return (a + b - 1) // b


def u32(x):
    return np.uint32(x)


def matmul_table(jobs, bm, bn):
    """Descriptor table for matmul_f32 (bm: its tile rows, matmul_rows), or
    matmul_f64 (bm: MATMUL_F64_BM), as abi::matmul_prepare.

    jobs: sequence of (a_ptr, b_ptr, c_ptr, m, n, k) with device pointers as ints
    (C(m x n) = A(m x k) . B(k x n), row-major f32). Returns (table, total_tiles):
    table is a numpy array of MM_DT (upload `table.view(np.uint8)` to the device
    and pass its device pointer as the first kernel parameter); a launch with
    total_tiles == 0 must be skipped."""
    table = np.zeros(len(jobs), dtype=MM_DT)
    acc = 0
    for i, (pa, pb, pc, m, n, k) in enumerate(jobs):
        tn = cdiv(n, bn)
        table[i] = (pa, pb, pc, m, n, k, tn, acc)
        acc += cdiv(m, bm) * tn
    return table, acc


def cupy_event_times(cp, fn, reps, warm):
    """Seconds per call of fn (which enqueues GPU work on the current
    stream), each timed with a pair of CUDA events, after warm calls."""
    for _ in range(warm):
        fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) * 1e-3)
    return ts


def interleaved_times(cp, fns, rounds, reps, before=None):
    """{name: [seconds]} of `fns` ((name, fn) pairs) timed in `rounds`
    rounds, each running every fn `reps` times (cupy_event_times, 2 warm
    calls) in turn, so that drifts of the GPU's clock fall on all alike.
    `before` (if any) is called ahead of each block (a synchronisation)."""
    times = {n: [] for n, _ in fns}
    for _ in range(rounds):
        for name, f in fns:
            if before:
                before()
            times[name] += cupy_event_times(cp, f, reps, 2)
    return times
