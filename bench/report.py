#!/usr/bin/env python3
"""Merge erlcuda benchmark records into one file per machine and write RESULTS.md.

    python3 bench/report.py --machine NAME --erlang erlang.json [--peers peers.json]
        [--out-dir bench/results] [--md bench/RESULTS.md] [--command "how it was run"]
        [--baseline FILE]
    python3 bench/report.py --regenerate [--out-dir ...] [--md ...] [--machine NAME --baseline FILE]

Inputs follow bench/FORMAT.md.  Writes OUT_DIR/NAME.json (the merged figures),
then the plots (bench/plot.py, when matplotlib is installed), then regenerates
the whole Markdown report from every merged OUT_DIR/*.json, one section per
machine, H200/GPU machines first.  Last it prints the regression table:
erlcuda's records more than 15% worse than the baseline (default: the
OUT_DIR/NAME.json this run replaces, read before it is written), which
NAME.json keeps ("comparison") and RESULTS.md shows.  --regenerate makes no
new run: it rewrites the Markdown only.  Standard library only.
"""

import argparse
import collections
import datetime
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

OWN = "erlcuda"

# Display order of systems (columns); unknown systems follow, sorted.
SYSTEM_ORDER = [OWN, "erlcuda_lists", "in_process", "pytorch_pinned", "pytorch_pageable",
                "pytorch_cuda", "torch_compile", "pytorch_priority", "cupy", "cublas_sgemm", "pcie_pinned"]

# The speed targets, defined once: the project's own goals, in three groups
# (GOALS).  RESULTS.md's Targets table shows each beside its figure;
# bench/FORMAT.md lists them (the lines of target_line(), checked by
# bench/testdata/check_report.sh).
#
# A target compares erlcuda's value of record `name` (or, with `field`, its
# derived extra[field]) with a limit:
#   of=None:            the limit is in the record's unit;
#   of=SYSTEM:          the limit is a fraction of SYSTEM's value of the same record;
#   of=SYSTEM, record=R: ... of SYSTEM's value of another record R (SYSTEM may be
#                       "erlcuda": erlcuda's own figure of R).
# A record may carry several targets; each is evaluated and shown on its own.
GOALS = {
    "speed": "small jobs (a million a second, 15 us a round trip), large jobs from binaries, "
             "the matmul against cuBLAS and PyTorch, gpud's start",
    "buffers": "data that stays on the GPU (device buffers against PyTorch, cuBLAS and pinned PCIe)",
    "base": "kept from the first benchmarks (arena inputs, gpud idle)",
    "kernels": "the example kernels (examples/kernels) from device buffers against PyTorch on the same GPU, "
               "and their small jobs against the built-in vector_add in the same loop",
    "isolation": "small jobs beside large ones (the mixed load): their tail latency, and the large jobs' "
                 "throughput kept",
    "shared": "many callers querying one matrix on the device (the example cos_topk, group launches) against "
              "PyTorch's queries batched by hand",
}
Target = collections.namedtuple("Target", "name op limit desc goal of record field")


def T(name, op, limit, desc, goal, of=None, record=None, field=None):
    assert goal in GOALS, goal
    return Target(name, op, limit, desc, goal, of, record, field)


VA26 = "large.vector_add.binaries.n67108864"
TARGETS = [
    T("latency.vector_add_1000.p50", "<=", 15, "vector_add 1000 round trip, p50", "speed"),
    T("latency.vector_add_1000.p99", "<=", 30, "vector_add 1000 round trip, p99", "speed"),
    T("latency.vector_add_1000.ratio_full_stack_in_process", "<=", 1.2,
      "full stack / in-process p50, interleaved", "speed"),
    T("throughput.callers_1000", ">=", 1_000_000, "throughput with 1,000 callers", "speed"),
    T("throughput.callers_10000", ">=", 1_000_000, "throughput with 10,000 callers", "speed"),
    T("throughput.callers_1000", ">=", 1.0, "no fall-off from 100 to 1,000 callers", "speed",
      of=OWN, record="throughput.callers_100"),
    T("throughput.callers_10000", ">=", 1.0, "no fall-off from 1,000 to 10,000 callers", "speed",
      of=OWN, record="throughput.callers_1000"),
    T("throughput.callers_10000", ">=", 64, "average batch at 10,000 callers", "speed",
      field="avg_batch"),
    T(VA26, "<=", 15, "vector_add 2^26 from binaries", "speed"),
    T("large.reduce.binaries.n67108864", "<=", 1.1, "reduce 2^26 from binaries, vs vector_add", "speed",
      of=OWN, record=VA26),
    T("large.dot_product.binaries.n67108864", "<=", 1.1, "dot_product 2^26 from binaries, vs vector_add",
      "speed", of=OWN, record=VA26),
    T("large.vector_add.arena.n67108864", "<=", 12, "vector_add 2^26, arena inputs", "base"),
    T("matmul.kernel.n4096", ">=", 1.0, "PTX matmul kernel 4096 vs cuBLAS SGEMM", "speed", of="cublas_sgemm"),
    T("matmul.end_to_end.n8192", ">=", 1.0, "matmul 8192 end to end from binaries vs PyTorch pinned",
      "speed", of="pytorch_pinned"),
    T("gpud.cold_start_ready", "<=", 150, "gpud cold start to ready", "speed"),
    T("gpud.idle_cpu", "<", 1, "gpud idle CPU", "base"),
    T("buffers.vector_add.2^26", "<=", 0.5, "vector_add 2^26 between device buffers", "buffers"),
    T("buffers.vector_add.2^26", "<=", 1.2, "vector_add 2^26 between device buffers, vs PyTorch CUDA",
      "buffers", of="pytorch_cuda", record="device.vector_add.n67108864"),
    T("buffers.matmul.n4096", ">=", 0.85, "matmul 4096 from device buffers vs cuBLAS SGEMM", "buffers",
      of="cublas_sgemm", record="matmul.kernel.n4096"),
    T("buffers.matmul.n8192", ">=", 0.85, "matmul 8192 from device buffers vs cuBLAS SGEMM", "buffers",
      of="cublas_sgemm", record="matmul.kernel.n8192"),
    T("buffers.put.256MiB", ">=", 0.8, "put of 256 MiB vs pinned PCIe host to device", "buffers",
      of="pcie_pinned", record="pcie.h2d"),
    T("buffers.get.256MiB", ">=", 0.8, "get of 256 MiB vs pinned PCIe device to host", "buffers",
      of="pcie_pinned", record="pcie.d2h"),
    T("buffers.put_pinned.256MiB", ">=", 0.8, "put of a pinned 256 MiB binary (erlcuda:pin/1) vs pinned PCIe "
      "host to device", "buffers", of="pcie_pinned", record="pcie.h2d"),
    T("buffers.chain.put_add_saxpy_dot.2^26", "<=", 1.2, "chain add, saxpy, dot on 2^26 from a put of a plain "
      "binary vs PyTorch from pinned", "buffers", of="pytorch_cuda",
      record="device.chain_add_saxpy_dot.n67108864.from_pinned"),
    T("buffers.chain.pinned_add_saxpy_dot.2^26", "<=", 1.2, "chain add, saxpy, dot on 2^26 from a put of a "
      "pinned binary vs PyTorch from pinned", "buffers", of="pytorch_cuda",
      record="device.chain_add_saxpy_dot.n67108864.from_pinned"),
    # Section shared (bench/erlcuda_shared_bench.erl, peers.py's sec_shared).
    T("shared.callers_10000", ">=", 1.0, "cos_topk queries/s with 10,000 callers vs PyTorch's batched by hand",
      "shared", of="pytorch_cuda", record="shared.torch_batched_10000"),
    T("shared.burst_10000.p99", "<=", 1.25, "cos_topk burst of 10,000: p99 vs PyTorch's time for the 10,000",
      "shared", of="pytorch_cuda"),
    T("shared.burst_10000.max", "<=", 1.25, "cos_topk burst of 10,000: max vs its p99", "shared", of=OWN,
      record="shared.burst_10000.p99"),
    T("shared.callers_16", ">=", 12.8, "cos_topk queries/s with 16 callers vs one caller's (0.8 x 16)", "shared",
      of=OWN, record="shared.callers_1"),
    T("shared.lone", "<=", 1.1, "one caller: cos_topk p50 vs cos_sim then topk_rows, interleaved", "shared"),
]

# The example kernels of examples/kernels (DESIGN.md, "The example kernels"),
# in DESIGN's order, with the sizes both sides run (bench/peers.py's
# sec_examples, bench/erlcuda_examples_bench.erl). The first six have a
# speed target against PyTorch on the device; every one a small-job target.
EXAMPLES = [("cos_sim", "16384x1024 f32"), ("argmax_rows", "16384x1024 f32"), ("histogram", "2^26 u8"),
            ("topk_rows", "4096x4096 f32, K 8"), ("gelu", "2^26 f32"), ("gather", "2^24 s32 of 2^26 f32"),
            ("log_softmax_rows", "4096x4096 f32"), ("u8_to_unit", "2^26 u8"),
            ("scatter_add", "2^24 f32 into 2^20"), ("axpbypcz", "2^26 f32")]
EXAMPLE_ORDER = [k for k, _ in EXAMPLES]
EXAMPLE_TARGETED = EXAMPLE_ORDER[:6]
TARGETS += [T("examples.{}.device".format(k), "<=", 1.25, "{} {} from device buffers vs PyTorch".format(k, size),
              "kernels", of="pytorch_cuda") for k, size in EXAMPLES if k in EXAMPLE_TARGETED]
TARGETS += [T("examples.{}.small_p50".format(k), "<=", 1.1,
              "{} small job p50 vs vector_add 1000 in the same loop".format(k), "kernels", field="ratio")
            for k in EXAMPLE_ORDER]
# The mixed load (bench/erlcuda_mixed_bench.erl, bench/peers.py's sec_mixed):
# the large kinds the small jobs run beside, with their sizes at scale 1.
# Beside each: small-job p99 <= 100 us and max <= 2 ms, and the large job's
# throughput at least 85% of its own alone (the isolation goal). A scaled
# run (extra.scale != 1, ERLCUDA_BENCH_MIXED_SCALE) is not evaluated.
MIXED = [("matmul_4096_buffers", "matmul 4096^3 from device buffers"),
         ("matmul_4096_binaries", "matmul 4096^3 from binaries"),
         ("vector_add_2^26_binaries", "vector_add 2^26 from binaries"),
         ("put_get_256MiB", "put and get of 256 MiB"),
         ("arena_growth", "arena growth from cold (vector_add 2^26 from binaries)")]
MIXED_ORDER = [k for k, _ in MIXED]
for _k, _d in MIXED:
    TARGETS += [T("mixed.small.beside.{}.p99".format(_k), "<=", 100, "small-job p99 beside {}".format(_d),
                  "isolation"),
                T("mixed.small.beside.{}.max".format(_k), "<=", 2000, "small-job max beside {}".format(_d),
                  "isolation"),
                T("mixed.large.{}.beside_small".format(_k), ">=", 0.85,
                  "{}: throughput beside small jobs vs alone".format(_d), "isolation",
                  of=OWN, record="mixed.large.{}.alone".format(_k))]
# Units of the derived fields a target may name.
FIELD_UNITS = {"avg_batch": "jobs/batch", "ratio": "x"}

OPS = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
       "<": lambda a, b: a < b, ">": lambda a, b: a > b}
OP_SIGN = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}

# Known record names and their units (FORMAT.md); anything else is warned about.
KNOWN = [
    (r"latency\.vector_add_1000\.ratio_full_stack_in_process", ("x",)),
    (r"latency\.[a-z_]+_\d+\.p\d+(\.\d+)?", ("us",)),
    (r"latency\.vector_add_1000_sync(\.mailbox_10000)?\.p50", ("us",)),
    (r"latency\.vector_add_1000\.split", ("us",)),
    (r"throughput\.callers_\d+", ("jobs/s",)),
    (r"large\.(vector_add|reduce|dot_product)\.(binaries|arena)\.n\d+", ("ms",)),
    (r"pcie\.(h2d|d2h|bidir)", ("GB/s",)),
    (r"matmul\.(kernel|end_to_end)\.n\d+", ("TFLOP/s",)),
    (r"gpud\.(cold_start_ready|cold_start_no_jit_cache|restart_ready|kill9_to_served)", ("ms",)),
    (r"gpud\.idle_cpu", ("%", "% of a core")),
    (r"profile\.callers_\d+", ("ns",)),
    (r"buffers\.(put|put_pinned|get)\.\d+MiB", ("GB/s",)),
    (r"buffers\.(vector_add|chain\.[a-z_]+)\.2\^\d+", ("ms",)),
    (r"buffers\.matmul\.n\d+", ("TFLOP/s",)),
    (r"device\.vector_add\.n\d+", ("ms",)),
    (r"device\.chain_add_saxpy_dot\.n\d+\.(from_pinned|on_device)", ("ms",)),
    (r"examples\.[a-z0-9_]+\.device", ("ms",)),
    (r"examples\.[a-z0-9_]+\.small_p50", ("us",)),
    (r"examples\.round_trip\.p50", ("us",)),
    (r"examples\.d2d_copy", ("GB/s",)),
    (r"mixed\.small\.(alone|beside\.[A-Za-z0-9_^]+)\.(p50|p99|max)", ("us",)),
    (r"mixed\.large\.[A-Za-z0-9_^]+\.(alone|beside_small)", ("jobs/s",)),
    (r"soak\.(arena_used|vm_total|vm_binary|gpud_rss|gpud_rss_anon)\.growth_per_hour", ("MiB/h", "bytes/h")),
    (r"soak\.(vm_fds|processes|gpud_fds)\.growth_per_hour", ("fds/h", "processes/h", "count/h")),
    (r"soak\.calls", ("calls/s",)),
    (r"shared\.(callers|torch_batched)_\d+", ("queries/s",)),
    (r"shared\.burst_\d+\.(p50|p99|max)", ("us",)),
    (r"shared\.lone", ("x",)),
    (r"bodies\.[a-z0-9_]+\.gpu_over_cpu", ("x",)),
]

LARGE_RE = re.compile(r"^large\.([a-z_]+)\.([a-z_]+)\.n(\d+)$")
KERNEL_ORDER = ["vector_add", "reduce", "dot_product", "matmul"]
# Row order of the other known name parts (exact tokens).
TOKEN_ORDER = ["kernel", "end_to_end", "cold_start_ready", "cold_start_no_jit_cache", "restart_ready", "kill9_to_served", "idle_cpu",
               "h2d", "d2h", "bidir"]
MODE_ORDER = ["binaries", "arena"]

GROUPS = [  # (name prefix, section title)
    ("latency", "Latency (one job in flight, launch to result)"),
    ("throughput", "Throughput (1000-element jobs, C concurrent callers)"),
    ("profile", "Profile of the VM side"),
    ("large", "Large vectors (host to host)"),
    ("matmul", "Matmul"),
    ("buffers", "Device buffers"),
    ("device", "PyTorch, tensors on the device"),
    ("examples", "Example kernels vs PyTorch (examples/kernels, from device buffers)"),
    ("mixed", "Mixed load (small jobs beside large ones)"),
    ("gpud", "gpud"),
    ("pcie", "PCIe (pinned copies, 256 MiB)"),
    ("shared", "Many callers, one matrix (`cos_topk`, group launches on and off, PyTorch batched by hand)"),
    ("bodies", "GPU bodies on the CPU (the emulator) against their `cpu` bodies"),
    ("soak", "Long runs (`make soak`: growth per hour of each resource, fitted after the warm-up)"),
]


def warn(msg):
    print("report.py: warning: " + msg, file=sys.stderr)


# ----------------------------------------------------------------------------
# formatting

def fmt(v, unit=None):
    """About three significant digits; thousands separators; jobs/s as integers."""
    if v is None:
        return ""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if unit == "jobs/s":
        return "{:,}".format(int(round(v)))
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    decimals = 2 - mag
    if decimals <= 0:
        return "{:,.0f}".format(v)
    s = "{:.{}f}".format(v, decimals)
    return s


def fmt_spread(sp, unit=None):
    if not isinstance(sp, dict) or sp.get("min") is None or sp.get("max") is None:
        return ""
    return "{}–{}".format(fmt(sp["min"], unit), fmt(sp["max"], unit))


def fmt_limit(v, unit=None):
    """A target limit as written in FORMAT.md (15, 1.2, 1,000,000, 0.7)."""
    if float(v).is_integer():
        return "{:,}".format(int(v))
    return "{:g}".format(v)


def pct(x):
    return "{:.0f}%".format(100 * x)


def natural_key(name):
    """Sort key: kernels in KERNEL_ORDER, then numbers numerically."""
    key = []
    for tok in name.split("."):
        rank = len(KERNEL_ORDER) + len(TOKEN_ORDER)
        for i, k in enumerate(KERNEL_ORDER):
            if tok.startswith(k):
                rank = i
                break
        if tok in TOKEN_ORDER:
            rank = len(KERNEL_ORDER) + TOKEN_ORDER.index(tok)
        parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p)
                      for p in re.split(r"(\d+)", tok) if p != "")
        key.append((rank, parts))
    return tuple(key)


def system_key(s):
    return (SYSTEM_ORDER.index(s), "") if s in SYSTEM_ORDER else (len(SYSTEM_ORDER), s)


# ----------------------------------------------------------------------------
# merging

def load(path):
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise SystemExit("report.py: {}: not a bench record file (no \"records\" list)".format(path))
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    recs = []
    for i, r in enumerate(doc["records"]):
        ok = (isinstance(r, dict) and isinstance(r.get("name"), str)
              and isinstance(r.get("system"), str)
              and isinstance(r.get("value"), (int, float)) and not isinstance(r.get("value"), bool)
              and math.isfinite(r["value"]))
        if not ok:
            warn("{}: record {} skipped (needs name, system and a finite numeric value): {}"
                 .format(path, i, json.dumps(r)[:200]))
            continue
        check_name(r, path)
        recs.append(r)
    return meta, recs


def check_name(r, path):
    for pat, units in KNOWN:
        if re.fullmatch(pat, r["name"]):
            if r.get("unit") not in units:
                warn("{}: {} ({}) has unit {!r}, FORMAT.md says {!r}"
                     .format(path, r["name"], r["system"], r.get("unit"), units[0]))
            return
    warn("{}: record name {!r} is not in FORMAT.md".format(path, r["name"]))


def expected_unit(name):
    for pat, units in KNOWN:
        if re.fullmatch(pat, name):
            return units[0]
    return ""


def large_bytes(name):
    """Bytes across PCIe for a large.* record, per FORMAT.md (fallback when extra.bytes is absent)."""
    m = LARGE_RE.match(name)
    if not m:
        return None
    k, n = m.group(1), int(m.group(3))
    return {"vector_add": 12 * n, "reduce": 4 * n, "dot_product": 8 * n + 4}.get(k)


def gbps(bytes_, ms):
    if not bytes_ or not ms or ms <= 0:
        return None
    return bytes_ / (ms * 1e6)


def merge(records):
    by_name = {}
    order = []
    for r in records:
        if r["name"] not in by_name:
            by_name[r["name"]] = []
            order.append(r["name"])
        same = [x for x in by_name[r["name"]] if x["system"] == r["system"]]
        if same:
            warn("duplicate record {} / {}: keeping the first (value {}), dropping value {}"
                 .format(r["name"], r["system"], same[0]["value"], r["value"]))
            continue
        by_name[r["name"]].append(r)

    figures = []
    for name in sorted(order, key=natural_key):
        recs = by_name[name]
        own = next((r for r in recs if r["system"] == OWN), recs[0])
        fig = {
            "name": name,
            "value": own["value"],
            "unit": own.get("unit"),
            "spread": own.get("spread"),
            "n": own.get("n"),
            "extra": dict(own.get("extra") or {}),
            "system": own["system"],
            "peers": {},
            "peer_spread": {},
            "peer_n": {},
        }
        peer_extra = {}
        for r in sorted((r for r in recs if r is not own), key=lambda r: system_key(r["system"])):
            fig["peers"][r["system"]] = r["value"]
            fig["peer_spread"][r["system"]] = r.get("spread")
            fig["peer_n"][r["system"]] = r.get("n")
            if r.get("unit") != own.get("unit"):
                warn("{}: {} unit {!r} differs from {} unit {!r}"
                     .format(name, r["system"], r.get("unit"), own["system"], own.get("unit")))
            if r.get("extra"):
                peer_extra[r["system"]] = r["extra"]
        if peer_extra:
            fig["peer_extra"] = peer_extra
        figures.append(fig)

    derive(figures)
    by = {f["name"]: f for f in figures}
    for t in TARGETS:
        r = evaluate_target(t, by)
        if r is not None:
            by[t.name].setdefault("targets", []).append(r)
    return figures


def derive(figures):
    by = {f["name"]: f for f in figures}
    bidir = by.get("pcie.bidir")
    bidir_v = bidir["value"] if bidir else None
    for f in figures:
        if f["name"].startswith("large."):
            b = f["extra"].get("bytes") or large_bytes(f["name"])
            if b and "bytes" not in f["extra"]:
                f["extra"]["bytes"] = b
            g = gbps(b, f["value"])
            if g is not None:
                f["extra"]["gbps"] = g
                if bidir_v:
                    f["extra"]["pcie_bidir_fraction"] = g / bidir_v
            pg = {}
            for s, v in f["peers"].items():
                pb = (f.get("peer_extra", {}).get(s) or {}).get("bytes") or b
                x = gbps(pb, v)
                if x is not None:
                    pg[s] = x
            if pg:
                f["extra"]["peer_gbps"] = pg
        elif f["name"].startswith("throughput.") and f["system"] == OWN:
            # n = jobs completed; extra.batches = batches gpud ran (else the histogram's total)
            h = f["extra"].get("hist")
            batches = f["extra"].get("batches")
            if batches is None and isinstance(h, dict) and h:
                batches = sum(v for v in h.values() if isinstance(v, (int, float)))
            if f.get("n") and batches:
                f["extra"]["avg_batch"] = f["n"] / batches
        elif f["name"].startswith("matmul.kernel.") and f["system"] == OWN:
            c = f["peers"].get("cublas_sgemm")
            if c:
                f["extra"]["ratio_cublas"] = f["value"] / c
        elif EXAMPLE_DEVICE_RE.match(f["name"]):
            derive_example(f, by)


EXAMPLE_DEVICE_RE = re.compile(r"^examples\.([a-z0-9_]+)\.device$")
EXAMPLE_SMALL_RE = re.compile(r"^examples\.([a-z0-9_]+)\.small_p50$")
PYT = "pytorch_cuda"
# The peers an example kernel is weighed against (bench/peers.py: eager
# PyTorch in the examples section; torch.compile and CuPy in examples_peers).
EXAMPLE_PEERS = (PYT, "torch_compile", "cupy")


def best_peer(f):
    """(system, value) of the fastest of EXAMPLE_PEERS with a figure for f
    whose result matched (extra.checked not false), or None."""
    got = [(value_of(f, s), s) for s in EXAMPLE_PEERS
           if value_of(f, s) is not None and extra_of(f, s).get("checked") is not False]
    return (min(got)[1], min(got)[0]) if got else None


def derive_example(f, by):
    """GB/s of each system (extra.gbps, extra.peer_gbps), erlcuda over PyTorch
    (extra.ratio_pytorch), and the bytes at HBM copy speed (extra.copy_speed_ms,
    from pytorch_cuda's examples.d2d_copy) with the fraction of it reached
    (extra.copy_fraction)."""
    ex = f["extra"]
    pex = f.get("peer_extra", {})
    b = ex.get("bytes") or next((e.get("bytes") for e in pex.values() if e.get("bytes")), None)
    if b and "bytes" not in ex:
        ex["bytes"] = b
    g = gbps(b, f["value"])
    if g is not None:
        ex["gbps"] = g
    pg = {}
    for s, v in f["peers"].items():
        x = gbps((pex.get(s) or {}).get("bytes") or b, v)
        if x is not None:
            pg[s] = x
    if pg:
        ex["peer_gbps"] = pg
    pt = f["peers"].get(PYT)
    bp = best_peer(f) if f["system"] == OWN else None
    if bp:
        # The kernels goal: erlcuda (wall, and gpud's own run) against the
        # best peer of the same run.
        ex["best_peer"], ex["best_peer_ms"] = bp
        ex["ratio_best_peer"] = f["value"] / bp[1]
        if isinstance(ex.get("gpud_run_ms"), (int, float)):
            ex["gpud_ratio_best_peer"] = ex["gpud_run_ms"] / bp[1]
    if f["system"] == OWN and pt:
        ex["ratio_pytorch"] = f["value"] / pt
        psize = (pex.get(PYT) or {}).get("size")
        if psize and ex.get("size") and psize != ex["size"]:
            # (a scaled run, ERLCUDA_BENCH_EXAMPLES_SCALE): no ratio, its target not evaluated
            ex["size_mismatch"] = "erlcuda ran {}, {} ran {}".format(ex["size"], PYT, psize)
            del ex["ratio_pytorch"]
            for key in ("best_peer", "best_peer_ms", "ratio_best_peer", "gpud_ratio_best_peer"):
                ex.pop(key, None)
            warn("{}: {}".format(f["name"], ex["size_mismatch"]))
    cp = by.get("examples.d2d_copy")
    cv = value_of(cp, PYT) if cp else None
    if cv and b:
        ex["copy_speed_ms"] = b / (cv * 1e6)
        if g is not None:
            ex["copy_fraction"] = g / cv


def target_unit(t, fig=None):
    if t.field:
        return FIELD_UNITS.get(t.field, "")
    return ((fig or {}).get("unit") or expected_unit(t.name)) or ""


def target_base(t):
    """What a relative target's limit is a fraction of, as text: "cublas_sgemm",
    "pcie_pinned `pcie.h2d`", "erlcuda `large.vector_add.binaries.n67108864`"."""
    if t.of is None:
        return None
    return t.of if t.record in (None, t.name) else "{} `{}`".format(t.of, t.record)


def target_line(t):
    """The target as bench/FORMAT.md lists it (plain text, one line)."""
    what = "`{}`".format(t.name) + (" extra.{}".format(t.field) if t.field else "")
    if t.of is None:
        want = "{} {} {}".format(OP_SIGN[t.op], fmt_limit(t.limit), target_unit(t)).strip()
    elif t.record in (None, t.name):
        want = "{} {} × {}'s value".format(OP_SIGN[t.op], fmt_limit(t.limit), t.of)
    else:
        want = "{} {} × {}'s `{}`".format(OP_SIGN[t.op], fmt_limit(t.limit), t.of, t.record)
    return "- {} {} ({}; {} goal)".format(what, want, t.desc, t.goal)


def evaluate_target(t, figs):
    """One target against the figures (name -> figure); None when its record is absent."""
    fig = figs.get(t.name)
    if fig is None:
        return None
    unit = target_unit(t, fig)
    res = {"op": t.op, "limit": t.limit, "desc": t.desc, "goal": t.goal,
           "relative_to": None if t.of is None else {"system": t.of, "record": t.record or t.name},
           "field": t.field, "base": None, "value": None, "reached": None, "met": None}

    def not_eval(why):
        res["text"] = "{}: not evaluated, {}".format(t.desc, why)
        return res

    if fig["system"] != OWN:
        return not_eval("no erlcuda record")
    own = fig["extra"].get(t.field) if t.field else fig["value"]
    if not isinstance(own, (int, float)):
        return not_eval("no extra.{}".format(t.field))
    res["reached"] = own
    for f in (fig, figs.get(t.record) if t.record else None):
        why = mixed_scaled(f)
        if why:
            return not_eval(why)
    what = t.name + ("." + t.field if t.field else "")
    if t.of is None:
        lim = t.limit
        res["text"] = "{}: {} {} {} {}".format(t.desc, what, t.op, fmt_limit(t.limit), unit).strip()
    else:
        bf = figs.get(t.record or t.name)
        base = value_of(bf, t.of) if bf else None
        if not base:
            return not_eval("no {} record".format(target_base(t) if t.record else t.of))
        if bf is fig and fig["extra"].get("size_mismatch"):
            return not_eval(fig["extra"]["size_mismatch"])
        lim = t.limit * base
        res["base"] = base
        res["text"] = "{}: {} {} {} x {} ({} {}) = {} {}".format(
            t.desc, what, t.op, fmt_limit(t.limit), target_base(t).replace("`", ""),
            fmt(base, unit), unit, fmt(lim, unit), unit)
    res["value"] = lim
    res["met"] = OPS[t.op](own, lim)
    return res


def mixed_scaled(fig):
    """Why a figure of the mixed load is no measure of its targets (a scaled
    run), or None."""
    if not fig or not fig["name"].startswith("mixed.") or fig["system"] != OWN:
        return None
    sc = fig["extra"].get("scale")
    if sc not in (None, 1):
        return "a scaled run (ERLCUDA_BENCH_MIXED_SCALE {})".format(sc)
    # The targets are over 100,000 small jobs; a shorter stream
    # (ERLCUDA_BENCH_MIXED_SMALL_JOBS) sees fewer of the rare stalls.
    wanted = fig["extra"].get("jobs_wanted")
    if isinstance(wanted, int) and wanted < 100000:
        return "a stream of {:,} small jobs (ERLCUDA_BENCH_MIXED_SMALL_JOBS)".format(wanted)
    return None


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def build(machine, erlang_path, peers_path, command):
    emeta, erecs = load(erlang_path)
    pmeta, precs = (load(peers_path) if peers_path else (None, []))
    date = emeta.get("date") or (pmeta or {}).get("date") or utc_now()
    return {
        "machine": machine,
        "date": date,
        "command": command if command is not None else "",
        "meta": {"erlang": emeta, "peers": pmeta},
        "figures": merge(erecs + precs),
    }


# ----------------------------------------------------------------------------
# regressions: this run against an earlier record of the same machine

# The direction of "worse", from the record's unit (FORMAT.md's units): times,
# the full-stack / in-process ratio and the CPU share are better lower; rates
# better higher. A unit in neither has no direction and is not compared.
LOWER_BETTER = {"us", "ms", "ns", "x", "%", "% of a core"}
HIGHER_BETTER = {"jobs/s", "GB/s", "TFLOP/s"}
# erlcuda's own code: erlcuda (binaries), erlcuda_lists, and in_process (gpud's
# backend driven by a Rust program). Only these make a regression; the peers'
# figures move with the machine and its libraries, so they are listed apart,
# as a hint of whether the machine itself changed.
OWN_SYSTEMS = (OWN, "erlcuda_lists", "in_process")
REGRESSION = 0.15     # more than this much worse than the baseline is listed
# erlcuda's records whose figure is the host's work more than the GPU's or
# PCIe's: a small job's round trip and the throughput of small jobs (the VM,
# the NIF, gpud's loop, the driver's calls), the VM's profile, gpud's start.
# A slower host CPU moves them as it moves the peers' own small-job round
# trips (HOST_PEERS: PyTorch's and CuPy's 1000-element add, launch to
# result), not as the peers' large copies and kernels, which most of the
# median of every peer is: on the H100 of 2026-12-08 the peers' median was
# 1.07x and their small-job round trips 1.21-2.09x the record's
# (bench/EXPERIMENTS.md, "Bounded whole runs").
HOST_BOUND = re.compile(r"^(latency\.|profile\.|throughput\.|mixed\.small\.|gpud\.|examples\.round_trip)"
                        r"|\.small_p50$")
HOST_PEERS = re.compile(r"^latency\.")
# extra fields that say what a record ran on: where they differ (a scaled
# run), its figures are not comparable.
SIZE_FIELDS = ("scale", "size")


def records_of(merged):
    """{(name, system): (value, unit, extra)} of every figure of a merged file,
    the peers' included."""
    out = {}
    for f in merged.get("figures") or []:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "system" not in f:
            continue
        for s in [f["system"]] + list(f.get("peers") or {}):
            v = value_of(f, s)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[(f["name"], s)] = (v, f.get("unit"), extra_of(f, s))
    return out


def load_baseline(path):
    """The baseline's figures: a merged file (bench/results/NAME.json), or a
    producer's record file (merged here); None where there is none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        doc = json.load(f)
    if isinstance(doc, dict) and isinstance(doc.get("figures"), list):
        return doc
    if isinstance(doc, dict) and isinstance(doc.get("records"), list):
        meta, recs = load(path)
        return {"date": meta.get("date"), "command": "", "figures": merge(recs)}
    raise ValueError("neither a merged file (\"figures\") nor a record file (\"records\")")


def slow_factor(unit, base, value):
    """How many times slower value is than base (above 1: worse), from the
    unit's direction; None where it has none or a figure is not positive."""
    if not base or base <= 0 or not value or value <= 0:
        return None
    if unit in LOWER_BETTER:
        return value / base
    if unit in HIGHER_BETTER:
        return base / value
    return None


def worse_fraction(unit, factor):
    """A slowdown factor as the fraction the unit's figure is worse by: a time
    1.25x as long is 25% worse, a rate 0.8x as high 20% worse."""
    return factor - 1 if unit in LOWER_BETTER else 1 - 1 / factor


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def compare(merged, base, path):
    """This run's figures against the baseline's, host drift taken out: the
    peers' figures (PyTorch, CuPy, PCIe: not erlcuda's code) say how much the
    machine itself moved. An erlcuda record with peers of its own is compared
    by its ratio to them (its slowdown over the median of theirs); one without
    by its slowdown over the median of every peer's, where that is above 1
    (a faster host is not held against records no peer measured). Listed:
    erlcuda's records more than REGRESSION worse beyond that drift (and the
    peers more than REGRESSION worse, apart), with the counts of records
    compared, in this run only (new) and in the baseline only (missing)."""
    res = {"file": path, "date": base.get("date"), "command": base.get("command"), "threshold": REGRESSION,
           "compared": 0, "new": 0, "missing": 0, "not_comparable": 0, "worse": [], "peers_worse": [],
           "drift": None}
    new, old = records_of(merged), records_of(base)
    both = []
    for key in set(new) | set(old):
        name, system = key
        own = system in OWN_SYSTEMS
        if key not in old or key not in new:
            if own:
                res["new" if key not in old else "missing"] += 1
            continue
        (v, unit, ex), (b, bunit, bex) = new[key], old[key]
        sized = any(k in ex and k in bex and ex[k] != bex[k] for k in SIZE_FIELDS)
        f = None if unit != bunit or sized else slow_factor(unit, b, v)
        if f is None:
            if own:
                res["not_comparable"] += 1
            continue
        both.append((name, system, unit, b, v, f, own))
    peer_f = {}
    for name, _, _, _, _, f, own in both:
        if not own:
            peer_f.setdefault(name, []).append(f)
    every = [f for fs in peer_f.values() for f in fs]
    host = median(every) if every else 1.0
    small = [f for name, fs in peer_f.items() if HOST_PEERS.match(name) for f in fs]
    if every:
        res["drift"] = {"n": len(every), "median": host, "p10": quantile(every, 0.1),
                        "p90": quantile(every, 0.9)}
        if small:
            res["drift"]["small_jobs"] = {"n": len(small), "median": median(small)}
    for name, system, unit, b, v, f, own in both:
        row = {"name": name, "system": system, "unit": unit, "baseline": b, "value": v, "ratio": v / b}
        if own:
            res["compared"] += 1
            if peer_f.get(name):
                drift, row["drift_from"] = median(peer_f[name]), "peers"
            elif small and HOST_BOUND.search(name):
                drift, row["drift_from"] = max(1.0, median(small)), "small-job peers"
            else:
                drift, row["drift_from"] = max(1.0, host), "host"
            row["drift"] = drift
            row["worse_by"] = worse_fraction(unit, f / drift)
            if row["worse_by"] > REGRESSION:
                res["worse"].append(row)
        elif worse_fraction(unit, f) > REGRESSION:
            row["worse_by"] = worse_fraction(unit, f)
            res["peers_worse"].append(row)
    for k in ("worse", "peers_worse"):
        res[k].sort(key=lambda r: (-r["worse_by"], natural_key(r["name"]), system_key(r["system"])))
    return res


def worse_text(d):
    """A fraction worse as a percentage, with a decimal below 100% so that
    15.4% does not read as the threshold itself."""
    return "{:.1f}%".format(100 * d) if d < 1 else pct(d)


def regression_blocks(cmp, full_path=False):
    """The regression table as blocks, each a line and the table under it (or
    []): the verdict and erlcuda's records more than REGRESSION worse, the
    counts, the peers' worse. Markdown; stdout prints the same. The baseline
    is named by its file name (full_path: as given) and its date."""
    if cmp is None:
        return None
    where = "`{}`".format(cmp["file"] if full_path else os.path.basename(cmp["file"]))
    if cmp.get("absent"):
        return [("Not compared: no baseline record ({} absent).".format(where), [])]
    if cmp.get("error"):
        return [("Not compared: baseline {} unreadable ({}).".format(where, cmp["error"]), [])]
    where += " of {}".format(cmp["date"]) if cmp.get("date") else ""
    lim = pct(cmp["threshold"])

    def rows(rs, own):
        head = ["record", "system", "unit", "baseline", "new", "new / baseline"]
        head += ["drift", "worse beyond it"] if own else ["worse by"]
        out = []
        for r in rs:
            row = ["`{}`".format(r["name"]), r["system"], r["unit"] or "", fmt(r["baseline"], r["unit"]),
                   fmt(r["value"], r["unit"]), fmt(r["ratio"]) + "×"]
            if own:
                row.append("{}× ({})".format(fmt(r["drift"]), r["drift_from"]) if "drift" in r else "")
            row.append(worse_text(r["worse_by"]))
            out.append(row)
        return table(head, out)
    blocks = []
    dr = cmp.get("drift")
    if dr:
        sj = dr.get("small_jobs")
        blocks.append(("Host drift: the peers' figures (not erlcuda's code) are {}× as slow as in {} at the "
                       "median of {} (10th percentile {}×, 90th {}×){}; an erlcuda record is compared beyond "
                       "its own peers' drift, or, with none, beyond the median where it is above 1{}.".format(
                           fmt(dr["median"]), where, dr["n"], fmt(dr["p10"]), fmt(dr["p90"]),
                           ", their small jobs' round trips (`latency.*`) {}× at the median of {}".format(
                               fmt(sj["median"]), sj["n"]) if sj else "",
                           " (a record of the host's work, small jobs, the VM's profile or gpud's start: "
                           "beyond the small jobs' drift)" if sj else ""), []))
    elif "drift" in cmp:
        blocks.append(("Host drift: no peer figure in both runs; erlcuda's records are compared as they are.",
                       []))
    if cmp["worse"]:
        blocks.append(("{} of erlcuda's records more than {} worse than {}, beyond the drift:".format(
            len(cmp["worse"]), lim, where), rows(cmp["worse"], True)))
    else:
        blocks.append(("No regression: no erlcuda record more than {} worse than {}, beyond the drift.".format(
            lim, where), []))
    counts = "{} of erlcuda's records compared, {} new, {} missing (in one file only: not compared)".format(
        cmp["compared"], cmp["new"], cmp["missing"])
    if cmp["not_comparable"]:
        counts += ", {} not comparable (another unit or size, a zero baseline, or a unit with no " \
                  "better side)".format(cmp["not_comparable"])
    blocks.append((counts + "; worse: a higher value in {}, a lower one in {}.".format(
        ", ".join("`{}`".format(u) for u in sorted(LOWER_BETTER)),
        ", ".join("`{}`".format(u) for u in sorted(HIGHER_BETTER))), []))
    if cmp["peers_worse"]:
        blocks.append(("Peers more than {} worse (not erlcuda's code: the machine or its libraries changed; "
                       "for context):".format(lim), rows(cmp["peers_worse"], False)))
    else:
        blocks.append(("Peers: none more than {} worse.".format(lim), []))
    return blocks


def baseline_comparison(merged, path):
    """compare() against the record file at path, or why there is none."""
    try:
        base = load_baseline(path)
        if base is not None:
            return compare(merged, base, path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        # (a bad baseline costs the table, not the run's report)
        warn("baseline {}: {!r}".format(path, e))
        return {"file": path, "error": repr(e)[:200]}
    return {"file": path, "absent": True}


# ----------------------------------------------------------------------------
# Markdown

def md_escape(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(md_escape(c) for c in r) + " |")
    return out


def value_of(fig, system):
    if fig["system"] == system:
        return fig["value"]
    return fig["peers"].get(system)


WRONG = " ✗"   # appended to a value whose result did not match the reference


def extra_of(fig, system):
    if fig["system"] == system:
        return fig.get("extra") or {}
    return (fig.get("peer_extra") or {}).get(system) or {}


def n_of(fig, system):
    if fig["system"] == system:
        return fig.get("n")
    return (fig.get("peer_n") or {}).get(system)


def cell(fig, system):
    v = value_of(fig, system)
    if v is None:
        return ""
    return fmt(v, fig.get("unit")) + (WRONG if extra_of(fig, system).get("checked") is False else "")


def wrong_note(figs):
    systems = {fig["system"] for fig in figs} | {s for fig in figs for s in fig["peers"]}
    if any(extra_of(f, s).get("checked") is False for f in figs for s in systems):
        return ["", "✗ = that run's result did not match the reference (extra.checked = false)."]
    return []


def device_of(merged):
    for k in ("erlang", "peers"):
        m = merged.get("meta", {}).get(k) or {}
        if m.get("device"):
            return str(m["device"])
    return ""


def is_fake(merged):
    return any(((merged.get("meta", {}).get(k) or {}).get("fake") is True) for k in ("erlang", "peers"))


def machine_rank(merged):
    """H200 machines first, then other GPU machines, then the rest."""
    text = " ".join([merged.get("machine", ""), device_of(merged)] +
                    [str((merged.get("meta", {}).get(k) or {}).get("backend", ""))
                     for k in ("erlang", "peers")]).lower()
    if "h200" in text:
        return 0
    if any(w in text for w in ("nvidia", "cuda", "gpu", "h100", "a100", "l40", "rtx")):
        return 1
    return 2


def evaluate_all(merged):
    """[(target, result or None)] for every target of TARGETS, evaluated on the
    merged figures now (so an older merged file shows the current targets)."""
    figs = {f["name"]: f for f in merged["figures"]}
    return [(t, evaluate_target(t, figs)) for t in TARGETS]


def target_counts(results):
    met = [r["met"] for _, r in results if r is not None]
    return met.count(True), met.count(False), met.count(None), sum(1 for _, r in results if r is None)


def target_rows(merged):
    figs = {f["name"]: f for f in merged["figures"]}
    results = evaluate_all(merged)
    rows = []
    for t, r in results:
        f = figs.get(t.name)
        unit = target_unit(t, f)
        rec = "`{}`".format(t.name) + (" {}".format(t.field) if t.field else "")
        if t.of is None:
            want = "{} {} {}".format(OP_SIGN[t.op], fmt_limit(t.limit), unit).strip()
        elif r and r.get("value") is not None:
            want = "{} {} × {} = {} {}".format(OP_SIGN[t.op], fmt_limit(t.limit), target_base(t),
                                               fmt(r["value"], unit), unit)
        else:
            want = "{} {} × {}".format(OP_SIGN[t.op], fmt_limit(t.limit), target_base(t))
        if r is None:
            rows.append([t.desc, t.goal, rec, want, "not measured", "—", ""])
            continue
        got = "{} {}".format(fmt(r["reached"], unit), unit).strip() if r["reached"] is not None else ""
        if r.get("base"):   # the ratio; the base is named in "wanted"
            got += " = {}×".format(fmt(r["reached"] / r["base"]))
        if r.get("met") is None:
            rows.append([t.desc, t.goal, rec, want, got, "not evaluated", r["text"].split("not evaluated, ")[-1]])
            continue
        d = r["reached"] / r["value"] - 1 if r["value"] else float("inf")
        if t.op in ("<=", "<"):
            by = "{} under".format(pct(-d)) if d <= 0 else "{} over".format(pct(d))
        else:
            by = "{} above".format(pct(d)) if d >= 0 else "{} short".format(pct(-d))
        rows.append([t.desc, t.goal, rec, want, got, "**met**" if r["met"] else "**missed**", by])
    met, missed, noeval, nomeas = target_counts(results)
    summary = "{} targets: {} met, {} missed, {} not evaluated, {} not measured.".format(
        len(TARGETS), met, missed, noeval, nomeas)
    goals = "Goals: " + "; ".join("{}: {}".format(g, d) for g, d in GOALS.items()) + "."
    return table(["target", "goal", "record", "wanted", "reached", "result", "by"], rows) + ["", summary, "", goals]


def generic_table(figs, extra_cols=()):
    systems = sorted({f["system"] for f in figs} | {s for f in figs for s in f["peers"]}, key=system_key)
    header = ["record"] + systems + ["unit", "spread", "n"] + [h for h, _ in extra_cols]
    rows = []
    for f in figs:
        u = f.get("unit")
        rows.append(["`{}`".format(f["name"])] + [cell(f, s) for s in systems] +
                    [u or "", fmt_spread(f.get("spread"), u), "" if f.get("n") is None else str(f["n"])] +
                    [fn(f) for _, fn in extra_cols])
    lines = table(header, rows) + wrong_note(figs)
    own_sys = {f["system"] for f in figs}
    if len(systems) > 1:
        lines.append("")
        lines.append("spread and n are those of the {} value.".format(
            " / ".join(sorted(own_sys, key=system_key))))
    return lines


def hist_text(f):
    h = f.get("extra", {}).get("hist")
    if not isinstance(h, dict) or not h:
        return ""
    items = sorted(((int(k), v) for k, v in h.items() if str(k).isdigit()), key=lambda kv: kv[0])
    return " ".join("{}+:{}".format(k, v) for k, v in items if v)


def large_table(figs):
    """Rows: kernel x N. erlcuda per input mode (binaries, arena), then the peers (same under each mode)."""
    rows_by = {}
    modes, peers = set(), set()
    for f in figs:
        m = LARGE_RE.match(f["name"])
        k, mode, n = m.group(1), m.group(2), int(m.group(3))
        rows_by.setdefault((k, n), {})[mode] = f
        if f["system"] == OWN:
            modes.add(mode)
        peers.update(f["peers"])
    modes = sorted(modes, key=lambda m: (MODE_ORDER.index(m) if m in MODE_ORDER else 9, m))
    peers = sorted(peers, key=system_key)
    has_bidir = any("pcie_bidir_fraction" in f["extra"] for f in figs)
    header = ["kernel", "N", "MB moved"]
    for m in modes:
        header += ["erlcuda {} ms".format(m), "GB/s"]
        if has_bidir:
            header += ["% PCIe bidir"]
    for p in peers:
        header += ["{} ms".format(p), "GB/s"]
    rows = []
    for (k, n) in sorted(rows_by, key=lambda kn: (KERNEL_ORDER.index(kn[0]) if kn[0] in KERNEL_ORDER else 9,
                                                   kn[0], kn[1])):
        byMode = rows_by[(k, n)]
        any_f = next(iter(byMode.values()))
        b = any_f["extra"].get("bytes")
        row = [k, "{:,}".format(n), fmt(b / 1e6) if b else ""]
        for m in modes:
            f = byMode.get(m)
            if f is None or f["system"] != OWN:
                row += ["", ""] + ([""] if has_bidir else [])
                continue
            ms = cell(f, OWN)
            sp = fmt_spread(f.get("spread"), "ms")
            row += [ms + (" ({})".format(sp) if sp else ""), fmt(f["extra"].get("gbps"))]
            if has_bidir:
                fr = f["extra"].get("pcie_bidir_fraction")
                row += [pct(fr) if fr is not None else ""]
        for p in peers:
            # pytorch peers are emitted under every mode name; take the first mode that has one
            src = next((byMode[m] for m in sorted(byMode, key=lambda m: (MODE_ORDER.index(m)
                        if m in MODE_ORDER else 9, m)) if p in byMode[m]["peers"]), None)
            if src is None:
                row += ["", ""]
            else:
                row += [cell(src, p), fmt(src["extra"].get("peer_gbps", {}).get(p))]
        rows.append(row)
    lines = table(header, rows) + wrong_note(figs)
    lines += ["", "GB/s = bytes moved across PCIe / time (vector_add 12N, reduce 4N, dot_product 8N+4 bytes)."
              + (" % PCIe bidir = that GB/s over `pcie.bidir`." if has_bidir else "")
              + " erlcuda ms cells show min–max over repeats in parentheses."]
    return lines


def avg_batch_text(f):
    a = f.get("extra", {}).get("avg_batch")
    return fmt(a) if isinstance(a, (int, float)) else ""


PROFILE_RE = re.compile(r"^profile\.callers_(\d+)$")
# Rows of the profile table: (extra key, label, unit).  Keys not listed here
# that hold numbers follow, under their own names; nested maps are left out.
PROFILE_ROWS = [
    ("submit_ns", "submit: the whole NIF call (the record's value)", "ns per sampled submit"),
    ("parse_ns", "· parse the arguments", "ns per sampled submit"),
    ("reserve_ns", "· reserve slot and regions (under the lock)", "ns per sampled submit"),
    ("copy_ns", "· copy the inputs into the arena", "ns per sampled submit"),
    ("publish_ns", "· publish onto the SQ (under the lock), wake gpud", "ns per sampled submit"),
    ("lock_wait_pct", "device lock: calls that found it held", "% of lock calls"),
    ("lock_wait_ns", "device lock: wait", "ns per wait"),
    ("answer_ns", "completion: answer (results as terms, enif_send)", "ns per job"),
    ("release_ns", "completion: release slots (under the lock)", "ns per job"),
    ("send_ns", "· enif_send", "ns per sampled send"),
    ("cqes_per_drain", "completion: CQ entries per drain", "entries"),
    ("cq_sleeps_per_1k", "completion thread: sleeps", "per 1000 jobs"),
    ("sq_wakeups_per_1k", "gpud: SQ wake-ups sent", "per 1000 jobs"),
    ("sched_busy_pct", "schedulers busy (not sleeping)", "% of scheduler time"),
    ("sched_emulator_pct", "schedulers: emulator", "% of scheduler time"),
    ("sched_other_pct", "schedulers: other", "% of scheduler time"),
    ("sched_gc_pct", "schedulers: gc", "% of scheduler time"),
]


def profile_table(figs):
    """One row per profile figure (submit phases, lock waits, ...), one column per caller count."""
    cols = sorted(figs, key=lambda f: int(PROFILE_RE.match(f["name"]).group(1)))
    keys = [k for k, _, _ in PROFILE_ROWS]
    more = sorted({k for f in cols for k, v in f["extra"].items()
                   if k not in keys and isinstance(v, (int, float)) and not isinstance(v, bool)})
    rows = []
    for key, label, unit in PROFILE_ROWS + [(k, k, "") for k in more]:
        vals = [f["value"] if key == "submit_ns" and key not in f["extra"] else f["extra"].get(key)
                for f in cols]
        if all(v is None for v in vals):
            continue
        rows.append([label, "`{}`".format(key)] + [fmt(v) if isinstance(v, (int, float)) else "" for v in vals]
                    + [unit])
    rows.append(["submits sampled", "n"] + ["" if f.get("n") is None else "{:,}".format(f["n"]) for f in cols]
                + [""])
    header = ["", "extra"] + ["{:,} callers".format(int(PROFILE_RE.match(f["name"]).group(1))) for f in cols] \
        + ["unit"]
    return table(header, rows) + [
        "", "The throughput rows run again with the NIF's sampled timings (c_src/profile.h) and the "
        "schedulers' microstate accounting (records `profile.callers_C`; the full accounting is in "
        "extra.msacc_schedulers of the merged JSON)."]


BUFFERS_ORDER = ["buffers.put.", "buffers.put_pinned.", "buffers.get.", "buffers.vector_add.",
                 "buffers.chain.put_", "buffers.chain.pinned_", "buffers.chain.binaries_", "buffers.chain.",
                 "buffers.matmul."]
CHAIN_WAYS = [  # (record prefix, system, how)
    ("buffers.chain.put_add_saxpy_dot.", OWN, "erlcuda, device buffers (from `put` to the scalar)"),
    ("buffers.chain.pinned_add_saxpy_dot.", OWN,
     "erlcuda, device buffers (from `put` of a pinned binary, erlcuda:pin/1, to the scalar)"),
    ("buffers.chain.binaries_add_saxpy_dot.", OWN, "erlcuda, binaries (every job crosses PCIe)"),
    ("device.chain_add_saxpy_dot.n67108864.from_pinned", "pytorch_cuda",
     "PyTorch, tensors on the device (from the upload of a pinned input)"),
    ("device.chain_add_saxpy_dot.n67108864.on_device", "pytorch_cuda",
     "PyTorch, tensors already on the device"),
]


def buffers_order(f):
    i = next((i for i, p in enumerate(BUFFERS_ORDER) if f["name"].startswith(p)), len(BUFFERS_ORDER))
    return (i, natural_key(f["name"]))


def beside_text(f):
    """A figure's relative targets as "0.37× pcie_pinned `pcie.h2d` (54.8 GB/s)"."""
    out = []
    for r in f.get("targets") or []:
        rel = r.get("relative_to")
        if not rel or not r.get("base") or r.get("reached") is None:
            continue
        who = rel["system"] if rel["record"] == f["name"] else "{} `{}`".format(rel["system"], rel["record"])
        out.append("{}× {} ({} {})".format(fmt(r["reached"] / r["base"]), who, fmt(r["base"]),
                                           f.get("unit") or ""))
    return "; ".join(out)


def chain_table(all_figs):
    """The chain add, saxpy, dot of 2^26 elements, three ways (the buffers goal), side by side."""
    rows = []
    ref = None
    found = []
    for prefix, system, how in CHAIN_WAYS:
        f = next((f for f in all_figs if f["name"].startswith(prefix) and value_of(f, system) is not None), None)
        if f is None:
            continue
        found.append((f, system, how))
        if prefix.endswith("from_pinned"):
            ref = value_of(f, system)
    if not found:
        return []
    for f, system, how in found:
        v = value_of(f, system)
        rows.append([how, "`{}`".format(f["name"]), system, cell(f, system),
                     fmt(v / ref) + "×" if ref else ""])
    return table(["chain add, saxpy, dot on 2^26 elements", "record", "system", "ms", "/ PyTorch from pinned"],
                 rows) + wrong_note([f for f, _, _ in found])


def matmul_extra_cols(figs):
    cols = []
    if any("ratio_cublas" in f["extra"] for f in figs):
        cols.append(("erlcuda / cuBLAS", lambda f: fmt(f["extra"].get("ratio_cublas"))
                     if "ratio_cublas" in f["extra"] else ""))
    if any("ms" in f["extra"] for f in figs):
        cols.append(("erlcuda ms", lambda f: fmt(f["extra"].get("ms")) if f["system"] == OWN else ""))
    return cols


def example_order(k):
    return (EXAMPLE_ORDER.index(k), k) if k in EXAMPLE_ORDER else (len(EXAMPLE_ORDER), k)


def example_target_text(t, figs):
    r = evaluate_target(t, figs)
    if r is None:
        return "not measured"
    if r.get("met") is None:
        return "{} {}×: not evaluated".format(OP_SIGN[t.op], fmt_limit(t.limit))
    return "{} {}×: {}".format(OP_SIGN[t.op], fmt_limit(t.limit), "met" if r["met"] else "missed")


def examples_tables(gf):
    """The example kernels: erlcuda against PyTorch from device buffers (ms, GB/s, the
    bytes at HBM copy speed), then each kernel's small jobs against vector_add 1000."""
    figs = {f["name"]: f for f in gf}
    dev = sorted((f for f in gf if EXAMPLE_DEVICE_RE.match(f["name"])),
                 key=lambda f: example_order(EXAMPLE_DEVICE_RE.match(f["name"]).group(1)))
    small = sorted((f for f in gf if EXAMPLE_SMALL_RE.match(f["name"])),
                   key=lambda f: example_order(EXAMPLE_SMALL_RE.match(f["name"]).group(1)))
    rest = [f for f in gf if f not in dev and f not in small]
    L = []
    if dev:
        rows = []
        variants = []
        with_others = False
        for f in dev:
            k = EXAMPLE_DEVICE_RE.match(f["name"]).group(1)
            own = f["system"] == OWN
            fx = f["extra"]                  # the figure's, with the derived fields
            ex = fx if own else {}           # erlcuda's
            pex = extra_of(f, PYT)           # PyTorch's
            size = ex.get("size") or pex.get("size") or dict(EXAMPLES).get(k, "")
            if own and pex.get("size") and pex["size"] != size:
                size += " (PyTorch: {})".format(pex["size"])
            ratio = ex.get("ratio_pytorch")
            gpud = ex.get("gpud_run_ms")
            pg = ex.get("gbps")
            ptg = (fx.get("peer_gbps") or {}).get(PYT) if own else fx.get("gbps")
            tg = [t for t in TARGETS if t.name == f["name"] and t.of == PYT]
            others = [cell(f, s) for s in EXAMPLE_PEERS[1:]]
            if any(others):
                with_others = True
            # From the figures (a JSON written before best_peer was derived
            # shows it too), unless a scaled run's sizes differ.
            bp = best_peer(f) if own and "size_mismatch" not in ex else None
            best = "{} ({})".format(fmt(bp[1]), bp[0]) if bp else ""
            rb = f["value"] / bp[1] if bp else None
            gb = gpud / bp[1] if bp and isinstance(gpud, (int, float)) else None
            rows.append([k, size, cell(f, OWN), fmt(gpud) if isinstance(gpud, (int, float)) else "",
                         cell(f, PYT)] + others +
                        [best, fmt(rb) + "×" if rb else "", fmt(gb) + "×" if gb else "",
                         fmt(ratio) + "×" if ratio else "", fmt(pg), fmt(ptg),
                         fmt(fx.get("copy_speed_ms")),
                         "; ".join(example_target_text(t, figs) for t in tg) or "—"])
            for key, v in sorted(pex.items()):
                if key.endswith("_ms") and key != "copy_speed_ms" and isinstance(v, (int, float)):
                    variants.append("{} {} ms".format("`{}` {}".format(k, key[:-3].replace("_", " ")), fmt(v)))
        head = ["kernel", "size", "erlcuda ms", "gpud run ms", "PyTorch ms", "torch.compile ms", "CuPy ms",
                "best peer ms", "erlcuda / best peer", "gpud / best peer", "erlcuda / PyTorch",
                "erlcuda GB/s", "PyTorch GB/s", "bytes at copy speed, ms", "target"]
        if not with_others:
            # PyTorch eager alone (examples_peers not run): no empty columns.
            head = head[:5] + head[7:]
            rows = [r[:5] + r[7:] for r in rows]
        L += table(head, rows)
        L += wrong_note(dev)
        notes = ["erlcuda ms: the median wall time of `launch_sync` from Erlang, inputs and output device "
                 "buffers, one in flight, so it includes the round trip"]
        rt = figs.get("examples.round_trip.p50")
        if rt and value_of(rt, OWN) is not None:
            notes[-1] += " (`examples.round_trip.p50`: {} us for a 1,000-element job)".format(fmt(value_of(rt, OWN)))
        notes[-1] += ("; gpud run ms: gpud's own time per launch, from its submit to the poll that saw it "
                      "done. PyTorch ms: the same op on tensors on the device, CUDA events (the expression is "
                      "extra.how of the merged JSON). GB/s = bytes moved / time")
        cp = figs.get("examples.d2d_copy")
        if cp and value_of(cp, PYT):
            notes[-1] += "; bytes at copy speed = bytes moved at the device-to-device copy's {} GB/s " \
                         "(`examples.d2d_copy`, reads and writes)".format(fmt(value_of(cp, PYT)))
        notes[-1] += ("; best peer: the fastest of PyTorch eager, torch.compile and CuPy whose result matched "
                      "eager's (torch.compile and CuPy come from peers.py's examples_peers section: "
                      "`run.sh part examples examples,examples_peers`), with erlcuda's wall time and gpud's run "
                      "time over it (the kernels goal: ≤ 1.0×). Target: erlcuda ≤ 1.25× PyTorch.")
        if variants:
            notes.append("PyTorch done another way: " + "; ".join(variants) + ".")
        L += [""] + notes
    if small:
        rows = []
        for f in small:
            k = EXAMPLE_SMALL_RE.match(f["name"]).group(1)
            ex = f["extra"] if f["system"] == OWN else {}
            tg = [t for t in TARGETS if t.name == f["name"] and t.field == "ratio"]
            lo, hi = ex.get("ratio_min"), ex.get("ratio_max")
            rows.append([k, ex.get("size", ""), cell(f, OWN), fmt(ex.get("p99")), fmt(ex.get("vector_add_p50")),
                         fmt(ex.get("ratio")) + "×" if isinstance(ex.get("ratio"), (int, float)) else "",
                         "{}–{}".format(fmt(lo), fmt(hi)) if lo is not None and hi is not None else "",
                         "; ".join(example_target_text(t, figs) for t in tg) or "—"])
        L += ([""] if L else []) + table(["small job", "size", "p50 us", "p99 us", "vector_add 1000 p50 us",
                                          "ratio", "per block", "target"], rows)
        L += ["", "Small jobs: `launch_sync` from binaries, one in flight, each job paired with a built-in "
              "`vector_add` of 1000 in the same loop (which goes first alternates); ratio = the kernel's "
              "p50 over vector_add's; per block: the same ratio in each block of 1,000 pairs. Target: "
              "ratio ≤ 1.1 (the kernels goal)."]
    if rest:
        L += ([""] if L else []) + generic_table(sorted(rest, key=lambda f: natural_key(f["name"])))
    return L


MIXED_SMALL_RE = re.compile(r"^mixed\.small\.(alone|beside\.([A-Za-z0-9_^]+))\.(p50|p99|max)$")
MIXED_LARGE_RE = re.compile(r"^mixed\.large\.([A-Za-z0-9_^]+)\.(alone|beside_small)$")
MIXED_PEER = "pytorch_priority"


def mixed_order(k):
    return (MIXED_ORDER.index(k), k) if k in MIXED_ORDER else (len(MIXED_ORDER), k)


def mixed_target_text(t, figs):
    r = evaluate_target(t, figs)
    lim = "{} {}".format(OP_SIGN[t.op], fmt_limit(t.limit)) + ("×" if t.of else " us")
    if r is None:
        return "{}: not measured".format(lim)
    if r.get("met") is None:
        return "{}: not evaluated".format(lim)
    return "{}: {}".format(lim, "met" if r["met"] else "missed")


def mixed_waits(small):
    """A line per small-job row with erlcuda's stall counts (extra.gpud_stalls)
    or its slowest jobs placed in the large ones (extra.outliers); [] where no
    row has either."""
    lines = []
    for k in sorted(small, key=lambda k: (-1, "") if k == "" else mixed_order(k)):
        ex = extra_of(next(iter(small[k].values())), OWN)
        stalls, outliers = ex.get("gpud_stalls"), ex.get("outliers")
        if not isinstance(stalls, dict) and not isinstance(outliers, list):
            continue
        parts = []
        if isinstance(stalls, dict):
            parts.append("steps of 1 ms or more: " + (", ".join(
                "{} {} ({} ms)".format(p, st.get("n"), fmt(st.get("ms"))) for p, st in sorted(stalls.items())
                if isinstance(st, dict)) or "none"))
        if isinstance(outliers, list) and outliers:
            worst = sorted((o for o in outliers if isinstance(o, dict) and isinstance(o.get("us"), (int, float))),
                           key=lambda o: -o["us"])[:8]
            parts.append("small jobs over 1 ms: {}, the slowest {}".format(len(outliers), ", ".join(
                "{} @ {}".format(fmt(o["us"]), "between large jobs" if not isinstance(o.get("into_large_ms"), (int, float))
                                 else "{} of {}".format(fmt(o["into_large_ms"]), fmt(o.get("large_ms"))))
                for o in worst)))
        lines.append("- {}: {}".format(k or "nothing (alone)", "; ".join(parts)))
    return lines


def mixed_tables(gf):
    """The mixed load: the small jobs' p50, p99 and max alone and beside each large
    kind, erlcuda's and PyTorch's (priority streams); then the large jobs'
    throughput alone and beside the small jobs; with the isolation targets."""
    figs = {f["name"]: f for f in gf}
    small, large, rest = {}, {}, []
    for f in gf:
        m, n = MIXED_SMALL_RE.match(f["name"]), MIXED_LARGE_RE.match(f["name"])
        if m:
            small.setdefault(m.group(2) or "", {})[m.group(3)] = f
        elif n:
            large.setdefault(n.group(1), {})[n.group(2)] = f
        else:
            rest.append(f)
    L = []
    notes = []
    scaled = sorted({str(extra_of(f, s).get("scale")) for f in gf for s in (OWN, MIXED_PEER)
                     if extra_of(f, s).get("scale") not in (None, 1)})
    if small:
        rows = []
        cut = []
        for k in sorted(small, key=lambda k: (-1, "") if k == "" else mixed_order(k)):
            fs = small[k]
            any_f = next(iter(fs.values()))
            size = extra_of(any_f, OWN).get("size") or extra_of(any_f, MIXED_PEER).get("size") or ""
            row = ["nothing (alone)" if k == "" else "{} ({})".format(k, size) if size else k]
            for s in (OWN, MIXED_PEER):
                row += [cell(fs[p], s) if p in fs else "" for p in ("p50", "p99", "max")]
                jobs = n_of(any_f, s)
                ex = extra_of(any_f, s)
                row.append("{:,}".format(jobs) if isinstance(jobs, int) else "")
                if ex.get("cut_short"):
                    cut.append("{} beside {} ({} of {:,} jobs in {} s)".format(
                        "erlcuda" if s == OWN else "PyTorch", k or "nothing",
                        "{:,}".format(jobs) if isinstance(jobs, int) else "?", ex.get("jobs_wanted") or 0,
                        fmt(ex.get("seconds"))))
            tg = [t for t in TARGETS if t.name in ("mixed.small.beside.{}.p99".format(k),
                                                   "mixed.small.beside.{}.max".format(k))]
            row.append("; ".join("{} {}".format(t.name.rsplit(".", 1)[1], mixed_target_text(t, figs))
                                 for t in tg) or "—")
            rows.append(row)
        L += table(["small jobs beside", "erlcuda p50 us", "p99 us", "max us", "jobs",
                    "PyTorch p50 us", "p99 us", "max us", "jobs", "targets"], rows)
        L += wrong_note([f for fs in small.values() for f in fs.values()])
        waits = mixed_waits(small)
        if waits:
            L += ["", "Where erlcuda's small jobs waited, beside each large kind: the steps of 1 ms or more "
                      "while they ran, per phase (steps, ms in all; gpud's loop: drain, submit, poll, answer, "
                      "control, segments; the VM side: vm_lock, vm_answer; guides/observability.md), and the "
                      "slowest small jobs over 1 ms, each placed in the large job then running (us @ ms into a "
                      "large job of ms):", ""] + waits
        if cut:
            notes.append("Cut short by the time budget: " + "; ".join(cut) + ".")
    if large:
        rows = []
        for k in sorted(large, key=mixed_order):
            fs = large[k]
            any_f = next(iter(fs.values()))
            size = extra_of(any_f, OWN).get("size") or extra_of(any_f, MIXED_PEER).get("size") or ""
            row = [k, size]
            for s in (OWN, MIXED_PEER):
                a = value_of(fs["alone"], s) if "alone" in fs else None
                b = value_of(fs["beside_small"], s) if "beside_small" in fs else None
                # (three digits: cell() rounds jobs/s to integers, and a large job does tens a second)
                row += [fmt(a) if a is not None else "", fmt(b) if b is not None else "",
                        fmt(b / a) + "×" if a and b is not None else ""]
            tg = [t for t in TARGETS if t.name == "mixed.large.{}.beside_small".format(k)]
            row.append("; ".join(mixed_target_text(t, figs) for t in tg) or "—")
            rows.append(row)
        L += ([""] if L else []) + table(["large job", "size", "erlcuda alone jobs/s", "beside small jobs/s",
                                          "beside / alone", "PyTorch alone jobs/s", "beside small jobs/s",
                                          "beside / alone", "target"], rows)
    if small or large:
        notes.insert(0, "Small job: `vector_add` of 1,000 f32 from binaries, `launch_sync`, one in flight, "
                        "each timed (erlcuda); PyTorch: `torch.add` of 1,000 f32 from pinned host memory to "
                        "pinned host memory on a stream of the highest priority, one in flight. The large "
                        "jobs run back to back, one in flight, in another Erlang process (PyTorch: in another "
                        "thread, on a stream of the lowest priority) while the small ones are timed; jobs/s = "
                        "large jobs over the sum of their wall times; arena_growth restarts erlcuda on a small "
                        "arena before each of its rounds (PyTorch: empties its caching host allocator). "
                        "Targets (isolation goal): beside each large kind, small-job p99 ≤ 100 us and max ≤ "
                        "2,000 us over 100,000 jobs, and the large job's throughput ≥ 0.85× its own alone.")
        if scaled:
            notes.append("A scaled run (ERLCUDA_BENCH_MIXED_SCALE {}: fewer small jobs, smaller large "
                         "jobs): its targets are not evaluated.".format(", ".join(scaled)))
        for n in notes:
            L += ["", n]
    if rest:
        L += ([""] if L else []) + generic_table(sorted(rest, key=lambda f: natural_key(f["name"])))
    return L


def plot_links(merged, out_dir, md_dir):
    links = []
    name = merged["machine"]
    for kind in ("latency", "throughput", "bandwidth", "matmul"):
        p = os.path.join(out_dir, "{}-{}.png".format(name, kind))
        if os.path.exists(p):
            rel = os.path.relpath(p, md_dir).replace(os.sep, "/")
            links.append("![{} {}]({})".format(name, kind, rel))
    return links


def machine_section(merged, out_dir, md_dir, comparison=None):
    """comparison: the regression table's data to show, where not the one
    stored in the merged file (report.py --regenerate --baseline)."""
    name = merged["machine"]
    L = ["## {}".format(name), ""]
    if is_fake(merged):
        L += ["**FAKE DATA (test fixture, meta.fake = true); not a measurement.**", ""]
    L += ["- date: {}".format(merged.get("date", "")),
          "- command: `{}`".format(merged.get("command") or "(not given)"),
          "- device: {}".format(device_of(merged) or "(not given)")]
    for k in ("erlang", "peers"):
        m = merged.get("meta", {}).get(k)
        if m:
            keys = [x for x in ("producer", "date", "host", "backend", "driver", "versions", "python", "numpy",
                                "torch", "torch_cuda", "cupy") if m.get(x) not in (None, "", {}, [])]
            if keys:
                L.append("- {}: {}".format(k, ", ".join(
                    "{} {}".format(x, json.dumps(m[x]) if not isinstance(m[x], str) else m[x])
                    for x in keys)))
    for k in ("erlang", "peers"):
        m = merged.get("meta", {}).get(k) or {}
        if m.get("quick"):
            L.append("- **{}: quick run (fewer repeats); not for comparison**".format(k))
        for key in ("skipped", "unavailable"):
            if m.get(key):
                L.append("- {} {}: {}".format(k, key, m[key] if isinstance(m[key], str) else json.dumps(m[key])))
        errs = m.get("errors") or []
        if errs:
            L.append("- **{}: {} error{}** (meta.errors):".format(k, len(errs), "" if len(errs) == 1 else "s"))
            L += ["  - `{}`".format(str(e).replace("`", "'")[:300]) for e in errs]
    # A long run's records alone (make soak) have no targets and no
    # regression table: their verdicts are in their own section.
    soak_only = all(f["name"].startswith("soak.") for f in merged["figures"])
    if soak_only:
        L += [""]
    if not soak_only:
        L += ["", "### Targets", ""]
    if not soak_only and machine_rank(merged) != 0:
        L += ["The targets of `bench/FORMAT.md` are set for an H200; here they are for reference only.", ""]
    if not soak_only:
        L += [*target_rows(merged), ""]
        L += ["### Regressions", ""]
        blocks = regression_blocks(comparison or merged.get("comparison"))
        if blocks is None:
            blocks = [("No comparison with an earlier record is stored in `{}.json`.".format(name), [])]
        for line, tab in blocks:
            L += [line, ""] + (tab + [""] if tab else [])

    figs = merged["figures"]
    grouped = {}
    for f in figs:
        grouped.setdefault(f["name"].split(".")[0], []).append(f)
    for prefix, title in GROUPS + [(g, g) for g in sorted(grouped) if g not in dict(GROUPS)]:
        gf = grouped.get(prefix)
        if not gf:
            continue
        L += ["### " + title, ""]
        if prefix == "large":
            ok = [f for f in gf if LARGE_RE.match(f["name"])]
            odd = [f for f in gf if not LARGE_RE.match(f["name"])]
            if ok:
                L += large_table(ok)
            if odd:
                L += [""] + generic_table(odd)
        elif prefix == "soak":
            def x(key):
                return lambda f: fmt(f["extra"].get(key)) if isinstance(f["extra"].get(key), (int, float)) \
                    else str(f["extra"].get(key, ""))
            L += generic_table(gf, [("start", x("start")), ("end", x("end")), ("bound/h", x("bound")),
                                    ("verdict", x("verdict"))])
        elif prefix == "throughput":
            cols = [("batch-size histogram (2^i+: batches)", hist_text)]
            if any("avg_batch" in f["extra"] for f in gf):
                cols.insert(0, ("jobs per batch", avg_batch_text))
            L += generic_table(gf, cols)
        elif prefix == "profile":
            ok = [f for f in gf if PROFILE_RE.match(f["name"])]
            odd = [f for f in gf if not PROFILE_RE.match(f["name"])]
            if ok:
                L += profile_table(ok)
            if odd:
                L += [""] + generic_table(odd)
        elif prefix == "buffers":
            gf = sorted(gf, key=buffers_order)
            main = [f for f in gf if not f["name"].startswith("buffers.chain.")]
            if main:
                L += generic_table(main, [("beside, same run", beside_text)])
            chain = chain_table(figs)
            if chain:
                L += ([""] if main else []) + chain
            rest = [f for f in gf if f["name"].startswith("buffers.chain.")
                    and not any(f["name"].startswith(p) for p, _, _ in CHAIN_WAYS)]
            if rest:
                L += [""] + generic_table(rest)
        elif prefix == "examples":
            L += examples_tables(gf)
        elif prefix == "mixed":
            L += mixed_tables(gf)
        elif prefix == "matmul":
            kinds = {}
            for f in gf:
                kinds.setdefault(f["name"].split(".")[1] if "." in f["name"] else "", []).append(f)
            for i, (kind, kf) in enumerate(kinds.items()):
                sub = {"kernel": "kernel only (timed with CUDA events)",
                       "end_to_end": "end to end (host to host: upload, mm, download)"}.get(kind, kind)
                L += ([""] if i else []) + ["**{}**".format(sub), ""] + generic_table(kf, matmul_extra_cols(kf))
        else:
            L += generic_table(gf)
        L.append("")
    links = plot_links(merged, out_dir, md_dir)
    if links:
        L += ["### Plots", ""]
        for l in links:
            L += [l, ""]
    return L


def load_merged_dir(out_dir):
    res = []
    for fn in sorted(os.listdir(out_dir)):
        if not fn.endswith(".json"):
            continue
        p = os.path.join(out_dir, fn)
        try:
            with open(p) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            warn("{}: skipped ({})".format(p, e))
            continue
        if isinstance(d, dict) and isinstance(d.get("figures"), list) and "machine" in d:
            res.append(d)
    res.sort(key=lambda d: (machine_rank(d), d["machine"]))
    return res


def write_md(md_path, out_dir, comparisons=None):
    """comparisons: {machine: compare()'s result} shown instead of the one
    stored in that machine's merged file."""
    md_dir = os.path.dirname(os.path.abspath(md_path))
    machines = load_merged_dir(out_dir)
    L = ["# erlcuda benchmark results", "",
         "Generated by `bench/report.py` from `{}/*.json`; do not edit by hand. "
         "Record names, units and targets: `bench/FORMAT.md`; what was tried, kept or rejected: "
         "`bench/EXPERIMENTS.md`.".format(
             os.path.relpath(out_dir, md_dir).replace(os.sep, "/")), ""]
    if len(machines) > 1:
        L += ["Machines: " + ", ".join("[{0}](#{1})".format(
            m["machine"], re.sub(r"[^a-z0-9_ -]", "", m["machine"].lower()).replace(" ", "-"))
            for m in machines), ""]
    for m in machines:
        L += machine_section(m, out_dir, md_dir, (comparisons or {}).get(m["machine"]))
    with open(md_path, "w") as f:
        f.write("\n".join(L).rstrip("\n") + "\n")
    return machines


# ----------------------------------------------------------------------------

def print_regressions(cmp):
    """The regression table at the end of the run (what `run.sh bench` shows)."""
    print()
    for line, tab in regression_blocks(cmp, full_path=True):
        print("\n".join([line] + tab))


def ab_compare(d):
    """run.sh ab's rounds, DIR/{baseline,this}-R.json: erlcuda_bench's record
    files of the same sections from two builds, alternated on one host. Per
    record of erlcuda's own systems in both: each build's median over its
    rounds and range, this build's slowdown over the baseline's; the lines
    to print (records more than REGRESSION worse first) and the rows."""
    runs = {"baseline": [], "this": []}
    for f in sorted(os.listdir(d)):
        m = re.fullmatch(r"(baseline|this)-(\d+)\.json", f)
        if m:
            _, recs = load(os.path.join(d, f))
            runs[m.group(1)].append(records_of({"figures": merge(recs)}))
    keys = set().union(*runs["baseline"]) & set().union(*runs["this"]) if runs["baseline"] and runs["this"] else set()
    rows = []
    for key in keys:
        if key[1] not in OWN_SYSTEMS:
            continue
        b = [r[key][0] for r in runs["baseline"] if key in r]
        t = [r[key][0] for r in runs["this"] if key in r]
        unit = next(r[key][1] for r in runs["this"] if key in r)
        f = slow_factor(unit, median(b), median(t))
        if f is None:
            continue
        rows.append({"name": key[0], "system": key[1], "unit": unit, "baseline": median(b), "value": median(t),
                     "baseline_range": [min(b), max(b)], "range": [min(t), max(t)],
                     "worse_by": worse_fraction(unit, f),
                     "ranges_overlap": min(t) <= max(b) and min(b) <= max(t)})
    rows.sort(key=lambda r: (-r["worse_by"], natural_key(r["name"]), system_key(r["system"])))
    worse = [r for r in rows if r["worse_by"] > REGRESSION]
    head = ["record", "system", "unit", "baseline (range)", "this (range)", "this / baseline", "worse by",
            "ranges overlap"]

    def row(r):
        u = r["unit"]
        return ["`{}`".format(r["name"]), r["system"], u or "",
                "{} ({}..{})".format(fmt(r["baseline"], u), fmt(r["baseline_range"][0], u), fmt(r["baseline_range"][1], u)),
                "{} ({}..{})".format(fmt(r["value"], u), fmt(r["range"][0], u), fmt(r["range"][1], u)),
                fmt(r["value"] / r["baseline"]) + "×",
                worse_text(r["worse_by"]) if r["worse_by"] > 0.0005 else "better" if r["worse_by"] < -0.0005 else "same",
                "yes" if r["ranges_overlap"] else "no"]
    lines = ["A/B on one host: {} rounds of the baseline, {} of this build, alternated; {} of erlcuda's records "
             "in both.".format(len(runs["baseline"]), len(runs["this"]), len(rows))]
    if worse:
        lines += ["{} more than {} worse at the median (ranges overlap: within the rounds' spread):".format(
            len(worse), pct(REGRESSION))] + table(head, [row(r) for r in worse])
    else:
        lines.append("None more than {} worse at the median.".format(pct(REGRESSION)))
    lines += ["Every record:"] + table(head, [row(r) for r in rows])
    return lines, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machine", help="machine name; output is OUT_DIR/NAME.json")
    ap.add_argument("--erlang", help="records from bench/erlcuda_bench.erl")
    ap.add_argument("--peers", help="records from bench/peers.py")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--md", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--command", help="how the benchmarks were run (shown in the report)")
    ap.add_argument("--goals", action="store_true",
                    help="print every target (goal) with what was reached, its ratio and whether it was met")
    ap.add_argument("--baseline", metavar="FILE",
                    help="record file to compare this run with (a merged OUT_DIR/NAME.json or a producer's "
                         "records); default: OUT_DIR/NAME.json as it was before this run")
    ap.add_argument("--regenerate", action="store_true",
                    help="no new run: rewrite the Markdown from OUT_DIR/*.json; with --machine and --baseline, "
                         "compare OUT_DIR/NAME.json with the baseline")
    ap.add_argument("--ab", metavar="DIR",
                    help="no report: compare run.sh ab's rounds in DIR (baseline-R.json, this-R.json), "
                         "the table on stdout and DIR/ab.json")
    a = ap.parse_args(argv)

    if a.ab:
        lines, rows = ab_compare(a.ab)
        print("\n".join(lines))
        with open(os.path.join(a.ab, "ab.json"), "w") as f:
            json.dump(rows, f, indent=1)
        return 0

    if a.machine is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", a.machine):
        ap.error("--machine: use letters, digits, '.', '_' and '-' only")
    if a.regenerate:
        if a.erlang or a.peers or a.command is not None:
            ap.error("--regenerate makes no new run: no --erlang, --peers or --command")
        if a.baseline and not a.machine:
            ap.error("--regenerate --baseline: say which machine's record to compare (--machine)")
        cmp = None
        if a.baseline:
            path = os.path.join(a.out_dir, a.machine + ".json")
            if not os.path.exists(path):
                ap.error("--regenerate --baseline: no {} to compare".format(path))
            with open(path) as f:
                cmp = baseline_comparison(json.load(f), a.baseline)
        machines = write_md(a.md, a.out_dir, {a.machine: cmp} if cmp else None)
        print("wrote {} ({} machine{})".format(a.md, len(machines), "" if len(machines) == 1 else "s"))
        if cmp:
            print_regressions(cmp)
        return 0
    if not a.machine or not a.erlang:
        ap.error("--machine and --erlang are needed (or --regenerate)")

    merged = build(a.machine, a.erlang, a.peers, a.command)
    os.makedirs(a.out_dir, exist_ok=True)
    out = os.path.join(a.out_dir, a.machine + ".json")
    # Before the write below: by default the baseline is the file it replaces.
    merged["comparison"] = baseline_comparison(merged, a.baseline or out)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")
    os.replace(tmp, out)
    print("wrote {} ({} figures)".format(out, len(merged["figures"])))

    plot_failed = False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plots skipped: matplotlib not installed (pip install matplotlib)")
    else:
        sys.path.insert(0, HERE)
        sys.dont_write_bytecode = True   # no bench/__pycache__ in the checkout
        try:
            import plot as plotmod
            for p in plotmod.plot(out, a.out_dir):
                print("wrote " + p)
        except Exception:  # keep the report; say the plots failed
            import traceback
            traceback.print_exc()
            print("report.py: plots failed (see above)", file=sys.stderr)
            plot_failed = True

    machines = write_md(a.md, a.out_dir)
    print("wrote {} ({} machine{})".format(a.md, len(machines), "" if len(machines) == 1 else "s"))
    if a.goals:
        # every goal with its figure and ratio, where a run's caller sees
        # only the end of its output (run.sh all)
        print("\n" + "\n".join(target_rows(merged)))
    print("targets: {} met, {} missed, {} not evaluated, {} not measured".format(
        *target_counts(evaluate_all(merged))))
    print_regressions(merged["comparison"])
    return 1 if plot_failed else 0


if __name__ == "__main__":
    sys.exit(main())
