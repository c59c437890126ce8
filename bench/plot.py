#!/usr/bin/env python3
"""Plots of a merged erlcuda benchmark file (written by bench/report.py).

    python3 bench/plot.py bench/results/NAME.json [--out-dir bench/results]

Writes NAME-latency.png, NAME-throughput.png, NAME-bandwidth.png and
NAME-matmul.png into OUT_DIR (default: the JSON file's folder); a plot whose
data is absent is skipped with a message.  Importable: plot(path, out_dir)
returns the paths written.  Needs matplotlib (Agg backend).
"""

import argparse
import json
import os
import re
import sys

LAT_SYSTEMS = ["erlcuda", "erlcuda_lists", "in_process", "pytorch_pageable", "pytorch_pinned", "cupy"]
LAT_PCTS = ["p50", "p90", "p99", "p99.9"]
LARGE_KERNELS = ["vector_add", "reduce", "dot_product"]
LABEL = {
    "erlcuda": "erlcuda (binaries)",
    "erlcuda_lists": "erlcuda (lists)",
    "in_process": "gpud backend in-process (Rust)",
    "pytorch_pageable": "PyTorch, pageable",
    "pytorch_pinned": "PyTorch, pinned",
    "cupy": "CuPy",
    "cublas_sgemm": "cuBLAS SGEMM (torch.matmul, TF32 off)",
}
COLOR = {
    "erlcuda": "#1f77b4", "erlcuda_arena": "#1f77b4", "erlcuda_binaries": "#17becf",
    "erlcuda_lists": "#aec7e8", "in_process": "#9467bd", "pytorch_pageable": "#ff7f0e",
    "pytorch_pinned": "#d62728", "cupy": "#2ca02c", "cublas_sgemm": "#7f7f7f",
}


def _msg(s):
    print("plot.py: " + s)


def _values(fig):
    """{system: value} of a figure, its own system included."""
    d = dict(fig.get("peers") or {})
    d[fig["system"]] = fig["value"]
    return d


def _targets(fig):
    """The evaluated targets of a figure with a limit: "targets" (a list, report.py
    now), or "target" (one, merged files written before several per record)."""
    if not fig:
        return []
    ts = fig.get("targets")
    if ts is None:
        ts = [fig["target"]] if fig.get("target") else []
    return [t for t in ts if t.get("value") is not None]


def _plain(t):
    """An absolute target on the figure's own value (no base, no derived field)."""
    return not t.get("relative_to") and not t.get("field")


def _title(plt_fig, merged, what):
    dev = ""
    for k in ("erlang", "peers"):
        m = (merged.get("meta") or {}).get(k) or {}
        if m.get("device"):
            dev = str(m["device"])
            break
    fake = any(((merged.get("meta") or {}).get(k) or {}).get("fake") is True for k in ("erlang", "peers"))
    t = "{}: {} ({})".format(merged.get("machine", "?"), what, merged.get("date", ""))
    if dev:
        t += "\n" + dev
    if fake:
        t += "  [FAKE DATA]"
    plt_fig.suptitle(t, fontsize=11)


def plot_latency(plt, merged, figs, path):
    present = [s for s in LAT_SYSTEMS
               if any(s in _values(figs[n]) for n in
                      ("latency.vector_add_1000." + p for p in LAT_PCTS) if n in figs)]
    pcts = [p for p in LAT_PCTS if "latency.vector_add_1000." + p in figs]
    if not present or not pcts:
        return False
    fig, ax = plt.subplots(figsize=(10, 5.5))
    width = 0.8 / len(present)
    for i, s in enumerate(present):
        # No error bars: producers differ in what a percentile's spread is
        # (min/max over repeats vs min/max of all samples); the bars are the distribution.
        xs, ys = [], []
        for j, p in enumerate(pcts):
            v = _values(figs["latency.vector_add_1000." + p]).get(s)
            if v is None:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(v)
        ax.bar(xs, ys, width * 0.95, label=LABEL.get(s, s), color=COLOR.get(s))
        for x, y in zip(xs, ys):
            ax.text(x, y * 1.04, "{:.3g}".format(y), ha="center", va="bottom", fontsize=6.5, rotation=90)
    for j, p in enumerate(pcts):
        for t in _targets(figs.get("latency.vector_add_1000." + p)):
            if _plain(t):
                ax.hlines(t["value"], j - 0.48, j + 0.48, color="k", ls=":", lw=1.2,
                          label="target {} ≤ {:g} µs".format(p, t["value"]))
    ax.set_yscale("log")
    ax.set_xticks(range(len(pcts)))
    ax.set_xticklabels(pcts)
    ax.set_xlabel("percentile of round-trip time")
    ax.set_ylabel("vector_add, 1000 elements: launch to result (µs, log)")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.6)
    _title(fig, merged, "latency distribution, one job in flight")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_throughput(plt, merged, figs, path):
    from matplotlib.ticker import FuncFormatter
    pts = []
    for n, f in figs.items():
        m = re.fullmatch(r"throughput\.callers_(\d+)", n)
        if m:
            pts.append((int(m.group(1)), f))
    if not pts:
        return False
    pts.sort(key=lambda p: p[0])
    fig, ax = plt.subplots(figsize=(8, 5))
    systems = []
    for _, f in pts:
        for s in _values(f):
            if s not in systems:
                systems.append(s)
    for s in systems:
        xs, ys, lo, hi = [], [], [], []
        for c, f in pts:
            v = _values(f).get(s)
            if v is None:
                continue
            xs.append(c)
            ys.append(v)
            sp = f.get("spread") if f["system"] == s else (f.get("peer_spread") or {}).get(s)
            if isinstance(sp, dict) and sp.get("min") is not None:
                lo.append(max(0.0, v - sp["min"]))
                hi.append(max(0.0, sp["max"] - v))
            else:
                lo.append(0.0)
                hi.append(0.0)
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=LABEL.get(s, s), color=COLOR.get(s))
        for x, y in zip(xs, ys):
            ax.annotate("{:,.0f}".format(y), (x, y), textcoords="offset points", xytext=(0, 7),
                        ha="center", fontsize=7)
    at = {}   # absolute targets: value -> caller counts
    for c, f in pts:
        for t in _targets(f):
            if _plain(t):
                at.setdefault(t["value"], []).append(c)
    for v, cs in sorted(at.items()):
        ax.axhline(v, color="k", ls=":", lw=1, label="target ≥ {:,.0f} jobs/s at {} callers".format(
            v, " and ".join("{:,}".format(c) for c in cs)))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent callers (Erlang processes, one job in flight each; log)")
    ax.set_ylabel("jobs/s (log)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "{:,.0f}".format(v)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: "{:,.0f}".format(v)))
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    _title(fig, merged, "throughput of 1000-element jobs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_bandwidth(plt, merged, figs, path):
    series = {}   # kernel -> label -> [(N, gbps)]
    for n, f in figs.items():
        m = re.fullmatch(r"large\.([a-z_]+)\.([a-z_]+)\.n(\d+)", n)
        if not m or m.group(1) not in LARGE_KERNELS:
            continue
        k, mode, N = m.group(1), m.group(2), int(m.group(3))
        ex = f.get("extra") or {}
        ks = series.setdefault(k, {})
        if f["system"] == "erlcuda" and ex.get("gbps") is not None:
            ks.setdefault(("erlcuda_" + mode, "erlcuda, {} inputs".format(mode)), {})[N] = ex["gbps"]
        for s, g in (ex.get("peer_gbps") or {}).items():
            # peers appear under every mode name: one series per system
            ks.setdefault((s, LABEL.get(s, s)), {}).setdefault(N, g)
    kernels = [k for k in LARGE_KERNELS if series.get(k)]
    if not kernels:
        return False
    pcie = {k: figs["pcie." + k]["value"] for k in ("bidir", "h2d") if "pcie." + k in figs}
    fig, axes = plt.subplots(1, len(kernels), figsize=(5.2 * len(kernels), 5), sharey=True, squeeze=False)
    order = ["erlcuda_binaries", "erlcuda_arena", "pytorch_pinned", "pytorch_pageable"]
    for ax, k in zip(axes[0], kernels):
        keys = sorted(series[k], key=lambda kl: (order.index(kl[0]) if kl[0] in order else 9, kl[0]))
        for key, label in keys:
            pts = sorted(series[k][(key, label)].items())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, color=COLOR.get(key),
                    ls="--" if key.startswith("pytorch") else "-")
        for name, ls in (("bidir", "-."), ("h2d", ":")):
            if name in pcie:
                ax.axhline(pcie[name], color="k", ls=ls, lw=1,
                           label="PCIe {} pinned copy {:.3g} GB/s".format(name, pcie[name]))
        ax.set_xscale("log")
        ax.set_title(k, fontsize=10)
        ax.set_xlabel("elements (float32; log)")
        ax.grid(which="both", alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel("GB/s across PCIe (bytes moved / host-to-host time)")
    axes[0][-1].legend(fontsize=7.5, loc="upper left")
    _title(fig, merged, "large vectors, effective bandwidth")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_matmul(plt, merged, figs, path):
    panels = []
    for kind, title, systems in (("kernel", "kernel only (CUDA events)", ["erlcuda", "cublas_sgemm"]),
                                 ("end_to_end", "end to end, host to host",
                                  ["erlcuda", "pytorch_pinned", "pytorch_pageable"])):
        pts = {}
        for n, f in figs.items():
            m = re.fullmatch(r"matmul\.{}\.n(\d+)".format(kind), n)
            if not m:
                continue
            for s, v in _values(f).items():
                pts.setdefault(s, []).append((int(m.group(1)), v))
        if pts:
            extra = sorted(s for s in pts if s not in systems)
            panels.append((kind, title, [s for s in systems + extra if s in pts], pts))
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5), squeeze=False)
    for ax, (kind, title, systems, pts) in zip(axes[0], panels):
        for s in systems:
            p = sorted(pts[s])
            lab = LABEL.get(s, s)
            if s == "erlcuda":
                lab = "erlcuda PTX kernel" if kind == "kernel" else "erlcuda, Erlang binaries to result"
            ax.plot([x for x, _ in p], [y for _, y in p], marker="o", label=lab, color=COLOR.get(s),
                    ls="--" if s.startswith("pytorch") else "-")
        for n, f in sorted(figs.items()):
            m = re.fullmatch(r"matmul\.{}\.n(\d+)".format(kind), n)
            for t in (_targets(f) if m else []):
                rel = t.get("relative_to") or {}
                how = ("{:g}× {}".format(t["limit"], LABEL.get(rel["system"], rel["system"]).split(" (")[0])
                       if rel and t.get("limit") is not None else "")
                ax.plot([int(m.group(1))], [t["value"]], marker="_", ms=22, mew=2, color="k", ls="none",
                        label="target at {}: {:.3g} TFLOP/s{}".format(m.group(1), t["value"],
                                                                     " ({})".format(how) if how else ""))
        xs = sorted({x for s in systems for x, _ in pts[s]})
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("S (S×S×S float32 matmul; log)")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(title, fontsize=10)
        ax.grid(which="both", alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, loc="upper left")
    _title(fig, merged, "matmul")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot(merged_json_path, out_dir=None):
    """Write the PNGs for one merged file; returns the list of paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(merged_json_path) as f:
        merged = json.load(f)
    if not isinstance(merged, dict) or not isinstance(merged.get("figures"), list):
        raise ValueError("{}: not a merged file (no \"figures\"); make one with bench/report.py"
                         .format(merged_json_path))
    if out_dir is None:
        out_dir = os.path.dirname(os.path.abspath(merged_json_path))
    os.makedirs(out_dir, exist_ok=True)
    name = merged.get("machine") or os.path.splitext(os.path.basename(merged_json_path))[0]
    figs = {f["name"]: f for f in merged.get("figures", [])}
    written = []
    for kind, fn in (("latency", plot_latency), ("throughput", plot_throughput),
                     ("bandwidth", plot_bandwidth), ("matmul", plot_matmul)):
        path = os.path.join(out_dir, "{}-{}.png".format(name, kind))
        if fn(plt, merged, figs, path):
            written.append(path)
        else:
            _msg("{} plot skipped: no {} records".format(kind, {
                "latency": "latency.vector_add_1000.*", "throughput": "throughput.callers_*",
                "bandwidth": "large.*", "matmul": "matmul.*"}[kind]))
            if os.path.exists(path):
                os.remove(path)   # a stale plot from an earlier run would be linked otherwise
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plots of a merged erlcuda benchmark file (bench/report.py output).")
    ap.add_argument("merged", help="bench/results/NAME.json")
    ap.add_argument("--out-dir", help="default: the folder of the JSON file")
    a = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plots skipped: matplotlib not installed (pip install matplotlib)")
        return 0
    for p in plot(a.merged, a.out_dir):
        print("wrote " + p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
