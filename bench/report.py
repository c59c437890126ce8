#!/usr/bin/env python3
"""Merge erlcuda benchmark records into one file per machine and write RESULTS.md.

    python3 bench/report.py --machine NAME --erlang erlang.json [--peers peers.json]
        [--out-dir bench/results] [--md bench/RESULTS.md] [--command "how it was run"]

Inputs follow bench/FORMAT.md.  Writes OUT_DIR/NAME.json (the merged figures),
then the plots (bench/plot.py, when matplotlib is installed), then regenerates
the whole Markdown report from every merged OUT_DIR/*.json, one section per
machine, H200/GPU machines first.  Standard library only.
"""

import argparse
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
                "cupy", "cublas_sgemm", "pcie_pinned"]

# The speed targets of bench/FORMAT.md, defined once.
# (record name, op, limit, relative_to, description)
# relative_to = None: the limit is in the record's unit.  Otherwise the limit
# is a fraction of that system's value for the same record name.
TARGETS = [
    ("latency.vector_add_1000.p50", "<=", 15, None,
     "vector_add 1000 round trip, p50"),
    ("latency.vector_add_1000.ratio_full_stack_in_process", "<=", 1.2, None,
     "full stack / in-process p50"),
    ("throughput.callers_10000", ">=", 1_000_000, None,
     "throughput with 10,000 callers"),
    ("large.vector_add.arena.n67108864", "<=", 12, None,
     "vector_add 64Mi elements, arena inputs"),
    ("large.vector_add.binaries.n67108864", "<=", 25, None,
     "vector_add 64Mi elements, binary inputs"),
    ("matmul.kernel.n4096", ">=", 0.70, "cublas_sgemm",
     "PTX matmul kernel 4096 vs cuBLAS SGEMM"),
    ("gpud.restart_ready", "<=", 400, None,
     "gpud restart to ready"),
    ("gpud.idle_cpu", "<", 1, None,
     "gpud idle CPU"),
]

OPS = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
       "<": lambda a, b: a < b, ">": lambda a, b: a > b}
OP_SIGN = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}

# Known record names and their units (FORMAT.md); anything else is warned about.
KNOWN = [
    (r"latency\.vector_add_1000\.ratio_full_stack_in_process", ("x",)),
    (r"latency\.[a-z_]+_\d+\.p\d+(\.\d+)?", ("us",)),
    (r"throughput\.callers_\d+", ("jobs/s",)),
    (r"large\.(vector_add|reduce|dot_product)\.(binaries|arena)\.n\d+", ("ms",)),
    (r"pcie\.(h2d|d2h|bidir)", ("GB/s",)),
    (r"matmul\.(kernel|end_to_end)\.n\d+", ("TFLOP/s",)),
    (r"gpud\.(cold_start_ready|restart_ready|kill9_to_served)", ("ms",)),
    (r"gpud\.idle_cpu", ("%", "% of a core")),
    (r"profile\.callers_\d+", ("ns",)),
]

LARGE_RE = re.compile(r"^large\.([a-z_]+)\.([a-z_]+)\.n(\d+)$")
KERNEL_ORDER = ["vector_add", "reduce", "dot_product", "matmul"]
# Row order of the other known name parts (exact tokens).
TOKEN_ORDER = ["kernel", "end_to_end", "cold_start_ready", "restart_ready", "kill9_to_served", "idle_cpu",
               "h2d", "d2h", "bidir"]
MODE_ORDER = ["binaries", "arena"]

GROUPS = [  # (name prefix, section title)
    ("latency", "Latency (one job in flight, launch to result)"),
    ("throughput", "Throughput (1000-element jobs, C concurrent callers)"),
    ("large", "Large vectors (host to host)"),
    ("matmul", "Matmul"),
    ("gpud", "gpud"),
    ("pcie", "PCIe (pinned copies, 256 MiB)"),
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
        }
        peer_extra = {}
        for r in sorted((r for r in recs if r is not own), key=lambda r: system_key(r["system"])):
            fig["peers"][r["system"]] = r["value"]
            fig["peer_spread"][r["system"]] = r.get("spread")
            if r.get("unit") != own.get("unit"):
                warn("{}: {} unit {!r} differs from {} unit {!r}"
                     .format(name, r["system"], r.get("unit"), own["system"], own.get("unit")))
            if r.get("extra"):
                peer_extra[r["system"]] = r["extra"]
        if peer_extra:
            fig["peer_extra"] = peer_extra
        figures.append(fig)

    derive(figures)
    for fig in figures:
        t = evaluate_target(fig)
        if t is not None:
            fig["target"] = t
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
        elif f["name"].startswith("matmul.kernel.") and f["system"] == OWN:
            c = f["peers"].get("cublas_sgemm")
            if c:
                f["extra"]["ratio_cublas"] = f["value"] / c


def target_for(name):
    for t in TARGETS:
        if t[0] == name:
            return t
    return None


def evaluate_target(fig):
    t = target_for(fig["name"])
    if t is None:
        return None
    name, op, limit, rel, desc = t
    unit = fig.get("unit") or ""
    if fig["system"] != OWN:
        return {"op": op, "value": None, "met": None,
                "text": "{}: not evaluated, no erlcuda record".format(desc)}
    if rel is None:
        return {"op": op, "value": limit, "met": OPS[op](fig["value"], limit),
                "text": "{}: {} {} {} {}".format(desc, name, op, fmt_limit(limit), unit)}
    base = fig["peers"].get(rel)
    if not base:
        return {"op": op, "value": None, "met": None,
                "text": "{}: not evaluated, no {} record".format(desc, rel)}
    lim = limit * base
    return {"op": op, "value": lim, "met": OPS[op](fig["value"], lim),
            "text": "{}: {} {} {} x {} ({} {}) = {} {}".format(
                desc, name, op, limit, rel, fmt(base, unit), unit, fmt(lim, unit), unit)}


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


def target_rows(merged):
    figs = {f["name"]: f for f in merged["figures"]}
    rows = []
    for name, op, limit, rel, desc in TARGETS:
        f = figs.get(name)
        t = (f or {}).get("target")
        unit = (f or {}).get("unit") or expected_unit(name)
        if rel is None:
            want = "{} {} {}".format(OP_SIGN[op], fmt_limit(limit), unit).strip()
        elif t and t.get("value") is not None:
            want = "{} {} × {} = {} {}".format(OP_SIGN[op], fmt_limit(limit), rel, fmt(t["value"], unit), unit)
        else:
            want = "{} {} × {}".format(OP_SIGN[op], fmt_limit(limit), rel)
        if f is None or t is None:
            rows.append([desc, "`{}`".format(name), want, "not measured", "—", ""])
            continue
        got = "{} {}".format(fmt(f["value"], unit), unit).strip()
        if rel and t.get("value") is not None:
            got += " = {}× {}".format(fmt(f["value"] / f["peers"][rel]), rel)
        if t.get("met") is None:
            rows.append([desc, "`{}`".format(name), want, got, "not evaluated",
                         t.get("text", "").split("not evaluated, ")[-1]])
            continue
        d = f["value"] / t["value"] - 1 if t["value"] else float("inf")
        if op in ("<=", "<"):
            by = "{} under".format(pct(-d)) if d <= 0 else "{} over".format(pct(d))
        else:
            by = "{} above".format(pct(d)) if d >= 0 else "{} short".format(pct(-d))
        rows.append([desc, "`{}`".format(name), want, got, "**met**" if t["met"] else "**missed**", by])
    return table(["target", "record", "wanted", "reached", "result", "by"], rows)


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


def matmul_extra_cols(figs):
    cols = []
    if any("ratio_cublas" in f["extra"] for f in figs):
        cols.append(("erlcuda / cuBLAS", lambda f: fmt(f["extra"].get("ratio_cublas"))
                     if "ratio_cublas" in f["extra"] else ""))
    if any("ms" in f["extra"] for f in figs):
        cols.append(("erlcuda ms", lambda f: fmt(f["extra"].get("ms")) if f["system"] == OWN else ""))
    return cols


def plot_links(merged, out_dir, md_dir):
    links = []
    name = merged["machine"]
    for kind in ("latency", "throughput", "bandwidth", "matmul"):
        p = os.path.join(out_dir, "{}-{}.png".format(name, kind))
        if os.path.exists(p):
            rel = os.path.relpath(p, md_dir).replace(os.sep, "/")
            links.append("![{} {}]({})".format(name, kind, rel))
    return links


def machine_section(merged, out_dir, md_dir):
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
    L += ["", "### Targets", ""]
    if machine_rank(merged) != 0:
        L += ["The targets of `bench/FORMAT.md` are set for an H200; here they are for reference only.", ""]
    L += [*target_rows(merged), ""]

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
        elif prefix == "throughput":
            L += generic_table(gf, [("batch-size histogram (2^i+: batches)", hist_text)])
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


def write_md(md_path, out_dir):
    md_dir = os.path.dirname(os.path.abspath(md_path))
    machines = load_merged_dir(out_dir)
    L = ["# erlcuda benchmark results", "",
         "Generated by `bench/report.py` from `{}/*.json`; do not edit by hand. "
         "Record names, units and targets: `bench/FORMAT.md`.".format(
             os.path.relpath(out_dir, md_dir).replace(os.sep, "/")), ""]
    if len(machines) > 1:
        L += ["Machines: " + ", ".join("[{0}](#{1})".format(
            m["machine"], re.sub(r"[^a-z0-9_ -]", "", m["machine"].lower()).replace(" ", "-"))
            for m in machines), ""]
    for m in machines:
        L += machine_section(m, out_dir, md_dir)
    with open(md_path, "w") as f:
        f.write("\n".join(L).rstrip("\n") + "\n")
    return machines


# ----------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machine", required=True, help="machine name; output is OUT_DIR/NAME.json")
    ap.add_argument("--erlang", required=True, help="records from bench/erlcuda_bench.erl")
    ap.add_argument("--peers", help="records from bench/peers.py")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--md", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--command", help="how the benchmarks were run (shown in the report)")
    a = ap.parse_args(argv)

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", a.machine):
        ap.error("--machine: use letters, digits, '.', '_' and '-' only")
    merged = build(a.machine, a.erlang, a.peers, a.command)
    os.makedirs(a.out_dir, exist_ok=True)
    out = os.path.join(a.out_dir, a.machine + ".json")
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
    met = [f["target"]["met"] for f in merged["figures"] if "target" in f]
    print("targets: {} met, {} missed, {} not evaluated, {} not measured".format(
        met.count(True), met.count(False), met.count(None), len(TARGETS) - len(met)))
    return 1 if plot_failed else 0


if __name__ == "__main__":
    sys.exit(main())
