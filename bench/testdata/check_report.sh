#!/usr/bin/env bash
# Checks bench/report.py (and bench/plot.py when matplotlib is installed) on the
# fake fixtures in this folder. Everything goes to a temp dir; bench/results/
# and bench/RESULTS.md are not touched.   Usage: bash bench/testdata/check_report.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=$(dirname "$HERE")
T=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

snapshot() { find "$BENCH/results" "$BENCH/RESULTS.md" -maxdepth 1 -printf '%p %s %T@\n' 2>/dev/null | sort || true; }
before=$(snapshot)

# 1. full H200-like run
python3 "$BENCH/report.py" --machine fake-h200 --erlang "$HERE/erlang.json" --peers "$HERE/peers.json" \
    --out-dir "$T/results" --md "$T/RESULTS.md" --command "bash bench/testdata/check_report.sh" \
    >"$T/out1.txt" 2>"$T/err1.txt" || { cat "$T/out1.txt" "$T/err1.txt"; fail "report.py exited non-zero"; }
[ -s "$T/err1.txt" ] && { cat "$T/err1.txt"; fail "report.py warned on the fixtures"; }
[ -f "$T/results/fake-h200.json" ] || fail "no merged JSON"

python3 - "$T/results/fake-h200.json" "$HERE/erlang.json" "$HERE/peers.json" <<'EOF'
import json, re, sys
merged = json.load(open(sys.argv[1]))
recs = json.load(open(sys.argv[2]))["records"] + json.load(open(sys.argv[3]))["records"]
figs = {f["name"]: f for f in merged["figures"]}
def check(cond, msg):
    if not cond:
        sys.exit("FAIL: " + msg)

for k in ("machine", "date", "command", "meta", "figures"):
    check(k in merged, "merged JSON lacks " + k)
check(merged["meta"]["erlang"].get("fake") is True and merged["meta"]["peers"].get("fake") is True, "meta.fake lost")

# every record name of FORMAT.md, expanded
names = ["latency.vector_add_1000." + p for p in ("p50", "p90", "p99", "p99.9")]
names += ["latency.vector_add_1000.ratio_full_stack_in_process"]
names += ["latency.%s.%s" % (k, p) for k in ("reduce_1000", "dot_product_1000", "matmul_32") for p in ("p50", "p99")]
names += ["throughput.callers_%d" % c for c in (1, 10, 100, 1000, 10000)]
names += ["large.%s.%s.n%d" % (k, m, n) for k in ("vector_add", "reduce", "dot_product")
          for m in ("binaries", "arena") for n in (65536, 1048576, 16777216, 67108864)]
names += ["pcie.h2d", "pcie.d2h", "pcie.bidir"]
names += ["matmul.%s.n%d" % (k, s) for k in ("kernel", "end_to_end") for s in (256, 512, 1024, 2048, 4096, 8192)]
names += ["gpud.cold_start_ready", "gpud.cold_start_no_jit_cache", "gpud.restart_ready", "gpud.kill9_to_served", "gpud.idle_cpu"]
names += ["profile.callers_%d" % c for c in (100, 1000, 10000)]
names += ["buffers.put.256MiB", "buffers.get.256MiB", "buffers.vector_add.2^26",
          "buffers.chain.put_add_saxpy_dot.2^26", "buffers.chain.binaries_add_saxpy_dot.2^26",
          "buffers.matmul.n4096", "buffers.matmul.n8192"]
names += ["device.vector_add.n67108864"] + ["device.chain_add_saxpy_dot.n67108864." + w
                                           for w in ("from_pinned", "on_device")]
EXAMPLES = ["cos_sim", "argmax_rows", "histogram", "topk_rows", "gelu", "gather", "log_softmax_rows",
            "u8_to_unit", "scatter_add", "axpbypcz"]
names += ["examples.%s.%s" % (k, w) for k in EXAMPLES for w in ("device", "small_p50")]
names += ["examples.round_trip.p50", "examples.d2d_copy"]
MIXED = ["matmul_4096_buffers", "matmul_4096_binaries", "vector_add_2^26_binaries", "put_get_256MiB", "arena_growth"]
names += ["mixed.small.alone." + p for p in ("p50", "p99", "max")]
names += ["mixed.small.beside.%s.%s" % (k, p) for k in MIXED for p in ("p50", "p99", "max")]
names += ["mixed.large.%s.%s" % (k, w) for k in MIXED for w in ("alone", "beside_small")]
for n in names:
    check(n in figs, "no figure for " + n)
check(len(figs) == len(merged["figures"]), "duplicate figure names")
check(set(figs) == {r["name"] for r in recs}, "figures do not match the input record names one to one")

# own value and peers
for r in recs:
    f = figs[r["name"]]
    if r["system"] == f["system"]:
        check(f["value"] == r["value"], "value of %s" % r["name"])
    else:
        check(f["peers"].get(r["system"]) == r["value"], "peer %s of %s" % (r["system"], r["name"]))
        check(r["system"] in f["peer_spread"], "peer_spread %s of %s" % (r["system"], r["name"]))
for n, f in figs.items():
    if n.startswith("pcie."):
        check(f["system"] == "pcie_pinned" and f["peers"] == {}, "%s: pcie figure" % n)
    elif n.startswith("device.") or n == "examples.d2d_copy":
        check(f["system"] == "pytorch_cuda" and f["peers"] == {}, "%s: device figure" % n)
    else:
        check(f["system"] == "erlcuda", "%s: own system %s" % (n, f["system"]))
lat = figs["latency.vector_add_1000.p50"]["peers"]
check(set(lat) == {"erlcuda_lists", "in_process", "pytorch_pageable", "pytorch_pinned", "cupy"}, "latency peers %s" % lat)
check(set(figs["matmul.kernel.n4096"]["peers"]) == {"cublas_sgemm"}, "matmul kernel peers")
check(set(figs["matmul.end_to_end.n4096"]["peers"]) == {"pytorch_pinned", "pytorch_pageable"}, "matmul e2e peers")
check(all(set(f["peers"]) == {"pytorch_priority"} and f["peer_n"]["pytorch_priority"] for n, f in figs.items()
          if n.startswith("mixed.")), "mixed peers")

# targets: 56 on 52 records, all evaluated; the fixtures make 17 of them miss
t = {n: f["targets"] for n, f in figs.items() if "targets" in f}
flat = [(n, x) for n, xs in t.items() for x in xs]
check(len(flat) == 56 and len(t) == 52, "expected 56 targets on 52 records, got %d on %d" % (len(flat), len(t)))
check(all(isinstance(x["met"], bool) and x["op"] in ("<=", ">=", "<") and isinstance(x["value"], (int, float))
          and isinstance(x["reached"], (int, float)) and x["text"]
          and x["goal"] in ("speed", "buffers", "base", "kernels", "isolation") for _, x in flat), "target fields")
check(sum(x["goal"] == "speed" for _, x in flat) == 14 and sum(x["goal"] == "buffers" for _, x in flat) == 9
      and sum(x["goal"] == "kernels" for _, x in flat) == 16 and sum(x["goal"] == "isolation" for _, x in flat) == 15,
      "targets per goal")
missed = sorted((n, x["desc"]) for n, x in flat if not x["met"])
want_missed = sorted([
    ("throughput.callers_10000", "average batch at 10,000 callers"),
    ("large.vector_add.binaries.n67108864", "vector_add 2^26 from binaries"),
    ("large.dot_product.binaries.n67108864", "dot_product 2^26 from binaries, vs vector_add"),
    ("matmul.kernel.n4096", "PTX matmul kernel 4096 vs cuBLAS SGEMM"),
    ("matmul.end_to_end.n8192", "matmul 8192 end to end from binaries vs PyTorch pinned"),
    ("gpud.cold_start_ready", "gpud cold start to ready"),
    ("buffers.vector_add.2^26", "vector_add 2^26 between device buffers, vs PyTorch CUDA"),
    ("buffers.matmul.n8192", "matmul 8192 from device buffers vs cuBLAS SGEMM"),
    ("buffers.put.256MiB", "put of 256 MiB vs pinned PCIe host to device"),
    ("buffers.chain.put_add_saxpy_dot.2^26",
     "chain add, saxpy, dot on 2^26 from a put of a plain binary vs PyTorch from pinned"),
    ("examples.argmax_rows.device", "argmax_rows 16384x1024 f32 from device buffers vs PyTorch"),
    ("examples.gather.device", "gather 2^24 s32 of 2^26 f32 from device buffers vs PyTorch"),
    ("examples.topk_rows.small_p50", "topk_rows small job p50 vs vector_add 1000 in the same loop"),
    ("mixed.small.beside.matmul_4096_binaries.max", "small-job max beside matmul 4096^3 from binaries"),
    ("mixed.small.beside.vector_add_2^26_binaries.p99", "small-job p99 beside vector_add 2^26 from binaries"),
    ("mixed.small.beside.arena_growth.max",
     "small-job max beside arena growth from cold (vector_add 2^26 from binaries)"),
    ("mixed.large.matmul_4096_binaries.beside_small",
     "matmul 4096^3 from binaries: throughput beside small jobs vs alone")])
check(missed == want_missed, "missed targets %s" % missed)
def one(name, **kw):
    xs = [x for x in t.get(name, []) if all(x.get(k) == v for k, v in kw.items())]
    check(len(xs) == 1, "%s: one target with %s, got %d" % (name, kw, len(xs)))
    return xs[0]
def close(a, b):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))
# the old goals are gone
check("gpud.restart_ready" not in t, "restart_ready still a target")
# the absolute limits
for name, op, lim in (("latency.vector_add_1000.p50", "<=", 15), ("latency.vector_add_1000.p99", "<=", 30),
                      ("latency.vector_add_1000.ratio_full_stack_in_process", "<=", 1.2),
                      ("large.vector_add.binaries.n67108864", "<=", 15), ("gpud.cold_start_ready", "<=", 150),
                      ("large.vector_add.arena.n67108864", "<=", 12), ("gpud.idle_cpu", "<", 1)):
    x = one(name)
    check(x["op"] == op and x["value"] == lim and x["relative_to"] is None, "%s target %s" % (name, x))
for c in (1000, 10000):
    one("throughput.callers_%d" % c, relative_to=None, field=None, value=1_000_000, op=">=")
# the same record, a peer system
mk = figs["matmul.kernel.n4096"]
x = one("matmul.kernel.n4096")
check(x["relative_to"] == {"system": "cublas_sgemm", "record": "matmul.kernel.n4096"} and x["limit"] == 1.0
      and close(x["value"], mk["peers"]["cublas_sgemm"]), "matmul kernel target is 1.0x cuBLAS")
x = one("matmul.end_to_end.n8192")
check(close(x["value"], figs["matmul.end_to_end.n8192"]["peers"]["pytorch_pinned"]), "e2e 8192 vs pytorch_pinned")
# another record: erlcuda's own value of it, and a peer's value of it
va = figs["large.vector_add.binaries.n67108864"]["value"]
for k, met in (("reduce", True), ("dot_product", False)):
    x = one("large.%s.binaries.n67108864" % k)
    check(x["relative_to"] == {"system": "erlcuda", "record": "large.vector_add.binaries.n67108864"}
          and x["base"] == va and close(x["value"], 1.1 * va) and x["met"] is met,
          "%s vs vector_add binaries: %s" % (k, x))
for b, rec, sys_ in (("put", "pcie.h2d", "pcie_pinned"), ("get", "pcie.d2h", "pcie_pinned")):
    x = one("buffers.%s.256MiB" % b)
    check(x["relative_to"] == {"system": sys_, "record": rec} and close(x["value"], 0.8 * figs[rec]["value"]),
          "buffers.%s target" % b)
for s in (4096, 8192):
    x = one("buffers.matmul.n%d" % s)
    check(close(x["value"], 0.85 * figs["matmul.kernel.n%d" % s]["peers"]["cublas_sgemm"]), "buffers matmul %d" % s)
# no fall-off: another record of the same system
x = one("throughput.callers_10000", relative_to={"system": "erlcuda", "record": "throughput.callers_1000"})
check(x["value"] == figs["throughput.callers_1000"]["value"] and x["met"], "no fall-off 1000 -> 10000")
one("throughput.callers_1000", relative_to={"system": "erlcuda", "record": "throughput.callers_100"}, met=True)
# a derived field: the average batch
x = one("throughput.callers_10000", field="avg_batch")
tp = figs["throughput.callers_10000"]
check(x["value"] == 64 and close(x["reached"], tp["n"] / tp["extra"]["batches"]) and not x["met"], "avg batch %s" % x)
check(len(t["throughput.callers_10000"]) == 3, "three targets on throughput.callers_10000")
# two targets on one record: one met (absolute), one missed (vs PyTorch's device.vector_add)
bv = t["buffers.vector_add.2^26"]
check(len(bv) == 2, "two targets on buffers.vector_add.2^26")
check(bv[0]["relative_to"] is None and bv[0]["value"] == 0.5 and bv[0]["met"] is True, "buffers vector_add <= 0.5 ms")
dv = figs["device.vector_add.n67108864"]["value"]
check(bv[1]["relative_to"] == {"system": "pytorch_cuda", "record": "device.vector_add.n67108864"}
      and close(bv[1]["value"], 1.2 * dv) and bv[1]["met"] is False, "buffers vector_add <= 1.2x pytorch_cuda")
check("target" not in mk, "old single 'target' field written")
# the example kernels: <= 1.25x pytorch_cuda's value of the same record (six of them), and the
# small jobs' extra.ratio <= 1.1 (all ten); derived GB/s, ratio and the bytes at copy speed
copy = figs["examples.d2d_copy"]["value"]
for k in EXAMPLES:
    f = figs["examples.%s.device" % k]
    ex, pt = f["extra"], f["peers"]["pytorch_cuda"]
    check(close(ex["gbps"], ex["bytes"] / (f["value"] * 1e6)) and close(ex["ratio_pytorch"], f["value"] / pt)
          and close(ex["peer_gbps"]["pytorch_cuda"], ex["bytes"] / (pt * 1e6))
          and close(ex["copy_speed_ms"], ex["bytes"] / (copy * 1e6))
          and close(ex["copy_fraction"], ex["gbps"] / copy), "derived fields of examples.%s.device: %s" % (k, ex))
    dt = t.get("examples.%s.device" % k, [])
    if k in EXAMPLES[:6]:
        check(len(dt) == 1 and dt[0]["relative_to"] == {"system": "pytorch_cuda", "record": "examples.%s.device" % k}
              and dt[0]["limit"] == 1.25 and close(dt[0]["value"], 1.25 * pt)
              and dt[0]["met"] is (f["value"] <= 1.25 * pt), "examples.%s.device target %s" % (k, dt))
    else:
        check(dt == [], "no target on examples.%s.device" % k)
    s = figs["examples.%s.small_p50" % k]
    x = one("examples.%s.small_p50" % k, field="ratio")
    check(x["value"] == 1.1 and close(x["reached"], s["value"] / s["extra"]["vector_add_p50"])
          and x["met"] is (k != "topk_rows"), "examples.%s.small_p50 target %s" % (k, x))
check(figs["examples.cos_sim.device"]["extra"]["bytes"] == 4 * 16384 * 1024 + 4 * 1024 + 4 * 16384, "cos_sim bytes")
# the best peer in the merged JSON: the least value among the peers whose result matched
for k, sysname, v in (("gelu", "torch_compile", 0.1290), ("u8_to_unit", "cupy", 0.0902),
                      ("cos_sim", "pytorch_cuda", figs["examples.cos_sim.device"]["peers"]["pytorch_cuda"])):
    ex = figs["examples.%s.device" % k]["extra"]
    check(ex["best_peer"] == sysname and close(ex["best_peer_ms"], v)
          and close(ex["ratio_best_peer"], figs["examples.%s.device" % k]["value"] / v)
          and close(ex["gpud_ratio_best_peer"], ex["gpud_run_ms"] / v), "best peer of %s: %s" % (k, ex))
# the mixed load: beside each large kind, small-job p99 <= 100 us and max <= 2000 us, and the large
# job's throughput >= 0.85x erlcuda's own alone
for k in MIXED:
    for p, lim in (("p99", 100), ("max", 2000)):
        f = figs["mixed.small.beside.%s.%s" % (k, p)]
        x = one("mixed.small.beside.%s.%s" % (k, p))
        check(x["relative_to"] is None and x["value"] == lim and x["goal"] == "isolation"
              and x["met"] is (f["value"] <= lim), "mixed %s %s target %s" % (k, p, x))
    a, b = figs["mixed.large.%s.alone" % k], figs["mixed.large.%s.beside_small" % k]
    x = one("mixed.large.%s.beside_small" % k)
    check(x["relative_to"] == {"system": "erlcuda", "record": "mixed.large.%s.alone" % k}
          and close(x["value"], 0.85 * a["value"]) and x["met"] is (b["value"] >= 0.85 * a["value"]),
          "mixed %s throughput target %s" % (k, x))
    check("mixed.large.%s.alone" % k not in t, "no target on the alone record")
check(not any(n.startswith("mixed.small.alone") for n in t), "no target on the small jobs alone")

# derived: GB/s, PCIe fraction, cuBLAS ratio
for n, f in figs.items():
    if n.startswith("large."):
        ex = f["extra"]
        want = ex["bytes"] / (f["value"] * 1e6)
        check(abs(ex["gbps"] - want) < 1e-9 * want, "gbps of " + n)
        check(set(ex["peer_gbps"]) == {"pytorch_pinned", "pytorch_pageable"}, "peer_gbps of " + n)
        for s, g in ex["peer_gbps"].items():
            check(abs(g - ex["bytes"] / (f["peers"][s] * 1e6)) < 1e-9 * g, "peer gbps %s of %s" % (s, n))
        check(abs(ex["pcie_bidir_fraction"] - ex["gbps"] / figs["pcie.bidir"]["value"]) < 1e-12, "bidir fraction " + n)
    if n.startswith("matmul.kernel."):
        check(abs(f["extra"]["ratio_cublas"] - f["value"] / f["peers"]["cublas_sgemm"]) < 1e-12, "ratio_cublas " + n)
va = figs["large.vector_add.arena.n67108864"]["extra"]
check(va["bytes"] == 12 * 67108864 and 60 < va["gbps"] < 80, "vector_add arena 64Mi GB/s %s" % va.get("gbps"))
check(figs["throughput.callers_10000"]["extra"]["hist"], "throughput histogram kept")
print("merged JSON: %d figures, %d targets (%d missed), derived GB/s and ratios ok" % (len(figs), len(flat), len(missed)))
EOF

# FORMAT.md lists the targets of report.py's TARGETS (the one definition), line for line
python3 -B - "$BENCH" <<'EOF' || fail "bench/FORMAT.md's target list differs from report.py's TARGETS"
import sys
sys.path.insert(0, sys.argv[1])
import report
doc = open(sys.argv[1] + "/FORMAT.md").read().split("\n")
want = [report.target_line(t) for t in report.TARGETS]
have = [l for l in doc[next(i for i, l in enumerate(doc) if l.startswith("Targets (H200)")):] if l.startswith("- ")]
if have != want:
    print("\n".join("FORMAT.md: " + l for l in have if l not in want) or "(order differs)", file=sys.stderr)
    print("\n".join("TARGETS:   " + l for l in want if l not in have), file=sys.stderr)
    sys.exit(1)
EOF

md="$T/RESULTS.md"
grep -q '^# erlcuda benchmark results' "$md" || fail "Markdown title"
grep -qF -- '- matmul_4096_buffers: steps of 1 ms or more: submit 3 (4.50 ms), vm_lock 1 (1.25 ms); small jobs over 1 ms: 1, the slowest 1,630 @ 2.50 of 3.10' "$md" \
    || fail "the mixed load's stalls and outliers line"
grep -q '^- matmul_4096_binaries' "$md" && fail "a stalls line for a row with neither stalls nor outliers"

grep -q '^## fake-h200$' "$md" || fail "Markdown machine section"
grep -q 'FAKE DATA' "$md" || fail "Markdown does not flag fake data"
grep -q '^### Targets$' "$md" || fail "no Targets section"
grep -q '^| target | goal | record | wanted | reached | result | by |$' "$md" || fail "no Targets table header"
[ "$(grep -c '\*\*met\*\*' "$md")" -eq 39 ] || fail "expected 39 met targets in the Markdown"
[ "$(grep -c '\*\*missed\*\*' "$md")" -eq 17 ] || fail "expected 17 missed targets in the Markdown"
grep -q '^61 targets: 39 met, 17 missed, 0 not evaluated, 5 not measured\.$' "$md" || fail "targets summary line (the fixtures have no section shared: its 5 targets are not measured)"
grep -q '^targets: 39 met, 17 missed, 0 not evaluated, 5 not measured$' "$T/out1.txt" || fail "targets line on stdout"
# the first record of a machine: no baseline, said in one line (stdout, and the Markdown)
[ "$(tail -n1 "$T/out1.txt")" = "Not compared: no baseline record (\`$T/results/fake-h200.json\` absent)." ] \
    || fail "no-baseline line on stdout: $(tail -n1 "$T/out1.txt")"
grep -qxF 'Not compared: no baseline record (`fake-h200.json` absent).' "$md" || fail "no-baseline line in the Markdown"
secs=$(grep '^### ' "$md" | sed 's/ (.*//' | tr '\n' '|')
[ "$secs" = "### Targets|### Regressions|### Latency|### Throughput|### Profile of the VM side|### Large vectors|### Matmul|### Device buffers|### PyTorch, tensors on the device|### Example kernels vs PyTorch|### Mixed load|### gpud|### PCIe|### Plots|" ] \
    || [ "$secs" = "### Targets|### Regressions|### Latency|### Throughput|### Profile of the VM side|### Large vectors|### Matmul|### Device buffers|### PyTorch, tensors on the device|### Example kernels vs PyTorch|### Mixed load|### gpud|### PCIe|" ] \
    || fail "sections: $secs"
# the target rows: absolute, relative to another record (erlcuda's own, a peer's), two on one record
grep -qF '| vector_add 1000 round trip, p99 | speed | `latency.vector_add_1000.p99` | ≤ 30 us | 22.5 us | **met** | 25% under |' "$md" \
    || fail "p99 target row"
grep -qF '| dot_product 2^26 from binaries, vs vector_add | speed | `large.dot_product.binaries.n67108864` | ≤ 1.1 × erlcuda `large.vector_add.binaries.n67108864` = 29.6 ms | 30.4 ms = 1.13× | **missed** | 3% over |' "$md" \
    || fail "relative-to-another-record target row (erlcuda's own)"
grep -qF '| put of 256 MiB vs pinned PCIe host to device | buffers | `buffers.put.256MiB` | ≥ 0.8 × pcie_pinned `pcie.h2d` = 44.2 GB/s | 20.2 GB/s = 0.367× | **missed** | 54% short |' "$md" \
    || fail "relative-to-another-record target row (a peer's)"
[ "$(grep -c '^| [^|]* | buffers | `buffers.vector_add.2^26` |' "$md")" -eq 2 ] || fail "two target rows for buffers.vector_add.2^26"
grep -qF '| ≤ 0.5 ms | 0.251 ms | **met** |' "$md" || fail "buffers vector_add absolute target row"
grep -qF '| ≤ 1.2 × pytorch_cuda `device.vector_add.n67108864` = 0.232 ms | 0.251 ms = 1.30× | **missed** | 8% over |' "$md" \
    || fail "buffers vector_add vs PyTorch target row"
grep -qF '| `throughput.callers_10000` avg_batch | ≥ 64 jobs/batch | 24.4 jobs/batch | **missed** |' "$md" || fail "avg batch row"
grep -qF '| matmul 8192 end to end from binaries vs PyTorch pinned | speed |' "$md" || fail "e2e 8192 row"
grep -qF '| gpud idle CPU | base | `gpud.idle_cpu` | < 1 % |' "$md" || fail "idle cpu row"
grep -q '^Goals: speed: ' "$md" || fail "no goals under the Targets table"
grep -q 'restart_ready` | ≤ 400' "$md" && fail "old restart target still shown"
# the profile table: one column per caller count, the extra fields as rows, no raw map
grep -qF '|  | extra | 100 callers | 1,000 callers | 10,000 callers | unit |' "$md" || fail "profile table header"
grep -qF '| · reserve slot and regions (under the lock) | `reserve_ns` | 1,737 | 5,043 | 35,068 | ns per sampled submit |' "$md" \
    || fail "profile reserve row"
grep -qF '| device lock: calls that found it held | `lock_wait_pct` | 18.3 | 33.7 | 40.9 | % of lock calls |' "$md" || fail "profile lock row"
grep -qF '| gpud: SQ wake-ups sent | `sq_wakeups_per_1k` | 1.30 | 3.80 | 23.6 | per 1000 jobs |' "$md" || fail "profile wake-up row"
grep -qF '| schedulers: emulator | `sched_emulator_pct` | 8.50 | 20.3 | 42.7 |' "$md" || fail "profile msacc row"
grep -q 'msacc_schedulers`\|"sleep"' "$md" && fail "profile dumps the raw microstate map"
# buffers: the references beside them, the chain three ways, PyTorch's device section
grep -qF '| `buffers.put.256MiB` | 20.2 | GB/s | 19.8–20.6 | 10 | 0.367× pcie_pinned `pcie.h2d` (55.2 GB/s) |' "$md" || fail "buffers put row"
grep -qF '| `buffers.vector_add.2^26` | 0.251 | ms | 0.247–0.262 | 50 | 1.30× pytorch_cuda `device.vector_add.n67108864` (0.193 ms) |' "$md" \
    || fail "buffers vector_add row"
grep -qF '| erlcuda, device buffers (from `put` to the scalar) | `buffers.chain.put_add_saxpy_dot.2^26` | erlcuda | 14.3 | 2.62× |' "$md" \
    || fail "chain row, device buffers"
grep -qF '| erlcuda, binaries (every job crosses PCIe) | `buffers.chain.binaries_add_saxpy_dot.2^26` | erlcuda | 59.7 | 10.9× |' "$md" \
    || fail "chain row, binaries"
grep -qF '| `device.chain_add_saxpy_dot.n67108864.from_pinned` | pytorch_cuda | 5.45 | 1.00× |' "$md" || fail "chain row, PyTorch"
grep -qF '| `device.vector_add.n67108864` | 0.193 | ms |' "$md" || fail "device section row"
grep -qF '| `throughput.callers_10000` | 1,121,400 | jobs/s | 1,065,330–1,155,042 | 2242800 | 24.4 |' "$md" || fail "throughput jobs per batch"
grep -q '| record | erlcuda | erlcuda_lists | in_process | pytorch_pinned | pytorch_pageable | cupy |' "$md" \
    || fail "latency table lacks peer columns"
grep -q '| `throughput.callers_10000` | 1,121,400 | jobs/s' "$md" || fail "jobs/s not formatted with separators"
grep -q '| vector_add | 67,108,864 | 805 | 26.9 ' "$md" || fail "large vector table row"
# the example kernels: the side-by-side table, the small jobs, the notes, their targets
grep -qF '| kernel | size | erlcuda ms | gpud run ms | PyTorch ms | torch.compile ms | CuPy ms | best peer ms | erlcuda / best peer | gpud / best peer | erlcuda / PyTorch | erlcuda GB/s | PyTorch GB/s | bytes at copy speed, ms | target |' "$md" \
    || fail "examples table header"
grep -qF '| cos_sim | 16384x1024 f32 | 0.0412 | 0.0251 | 0.102 |  |  | 0.102 (pytorch_cuda) | 0.404× | 0.246× | 0.404× | 1,631 | 658 | 0.0162 | ≤ 1.25×: met |' "$md" || fail "examples cos_sim row"
grep -qF '| argmax_rows | 16384x1024 f32 | 0.0551 | 0.0384 | 0.0402 |  |  | 0.0402 (pytorch_cuda) | 1.37× | 0.955× | 1.37× | 1,219 | 1,671 | 0.0162 | ≤ 1.25×: missed |' "$md" \
    || fail "examples argmax_rows row"
grep -qF '| axpbypcz | 2^26 f32 | 0.278 | 0.264 | 0.805 |  |  | 0.805 (pytorch_cuda) | 0.345× | 0.328× | 0.345× | 3,861 | 1,334 | 0.260 | — |' "$md" || fail "examples axpbypcz row"
# the best peer: torch.compile's gelu (CuPy's is faster but its result did not match: ✗, left out),
# CuPy's u8_to_unit
grep -qF '| gelu | 2^26 f32 | 0.152 | 0.137 | 0.138 | 0.129 | 0.120 ✗ | 0.129 (torch_compile) | 1.18× | 1.07× | 1.10× |' "$md" \
    || fail "examples gelu row, best peer torch_compile"
grep -qF '| u8_to_unit | 2^26 u8 | 0.0965 | 0.0831 | 0.327 |  | 0.0902 | 0.0902 (cupy) | 1.07× | 0.921× | 0.295× |' "$md" \
    || fail "examples u8_to_unit row, best peer cupy"
grep -qF '(`examples.round_trip.p50`: 14.2 us for a 1,000-element job)' "$md" || fail "examples round trip note"
grep -qF "the device-to-device copy's 4,135 GB/s" "$md" || fail "examples copy speed note"
grep -qF 'PyTorch done another way: `histogram` without conversion 0.399 ms; `gather` index select 0.441 ms.' "$md" \
    || fail "examples PyTorch variants note"
grep -qF '| topk_rows | 10x100, K 8 | 14.5 | 23.2 | 12.5 | 1.16× | 1.13–1.21 | ≤ 1.1×: missed |' "$md" || fail "small jobs row"
grep -qF '| gather 2^24 s32 of 2^26 f32 from device buffers vs PyTorch | kernels | `examples.gather.device` | ≤ 1.25 × pytorch_cuda = 0.608 ms | 0.653 ms = 1.34× | **missed** | 7% over |' "$md" \
    || fail "examples device target row"
grep -qF '| `examples.topk_rows.small_p50` ratio | ≤ 1.1 x | 1.16 x | **missed** | 5% over |' "$md" || fail "small job target row"
# the mixed load: small jobs erlcuda beside PyTorch, the large jobs' throughput, the targets
grep -qF '| small jobs beside | erlcuda p50 us | p99 us | max us | jobs | PyTorch p50 us | p99 us | max us | jobs | targets |' "$md" \
    || fail "mixed small table header"
grep -qF '| nothing (alone) | 14.1 | 21.3 | 412 | 100,000 | 24.8 | 31.0 | 290 | 100,000 | — |' "$md" || fail "mixed alone row"
grep -qF '| vector_add_2^26_binaries (2^26 f32 from binaries) | 17.5 | 131 | 1,890 | 100,000 | 2,410 | 9,100 | 14,800 | 18,650 | p99 ≤ 100 us: missed; max ≤ 2,000 us: met |' "$md" \
    || fail "mixed small row"
grep -qF '| large job | size | erlcuda alone jobs/s | beside small jobs/s | beside / alone | PyTorch alone jobs/s | beside small jobs/s | beside / alone | target |' "$md" \
    || fail "mixed large table header"
grep -qF '| matmul_4096_binaries | 4096x4096 f32, binaries | 118 | 97.5 | 0.826× | 149 | 138 | 0.926× | ≥ 0.85×: missed |' "$md" \
    || fail "mixed large row"
grep -qF 'Cut short by the time budget: PyTorch beside vector_add_2^26_binaries (18,650 of 100,000 jobs in 45.0 s);' "$md" \
    || fail "mixed cut-short note"
grep -qF '| small-job max beside arena growth from cold (vector_add 2^26 from binaries) | isolation | `mixed.small.beside.arena_growth.max` | ≤ 2,000 us | 9,800 us | **missed** | 390% over |' "$md" \
    || fail "mixed max target row"
grep -qF '| matmul 4096^3 from binaries: throughput beside small jobs vs alone | isolation | `mixed.large.matmul_4096_binaries.beside_small` | ≥ 0.85 × erlcuda `mixed.large.matmul_4096_binaries.alone` = 100 jobs/s | 98 jobs/s = 0.826× | **missed** | 3% short |' "$md" \
    || fail "mixed throughput target row"
grep -q 'command: `bash bench/testdata/check_report.sh`' "$md" || fail "command not in header"
grep -q 'device: cuda NVIDIA H200' "$md" || fail "device not in header"

if python3 -c 'import matplotlib' 2>/dev/null; then
    for p in latency throughput bandwidth matmul; do
        f="$T/results/fake-h200-$p.png"
        [ -s "$f" ] || fail "no $p plot"
        [ "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$p plot is not a PNG"
        grep -q "](results/fake-h200-$p.png)" "$md" || fail "Markdown does not link the $p plot"
    done
    echo "plots: 4 PNGs written and linked"
else
    grep -q 'plots skipped: matplotlib not installed' "$T/out1.txt" || fail "no 'plots skipped' message"
    echo "plots: matplotlib not installed, skipped (message checked)"
fi

# 2. no matplotlib: a shadowing package that fails to import
mkdir -p "$T/nompl/matplotlib"
echo 'raise ImportError("hidden for the test")' >"$T/nompl/matplotlib/__init__.py"
PYTHONPATH="$T/nompl" python3 "$BENCH/report.py" --machine fake-h200 --erlang "$HERE/erlang.json" \
    --peers "$HERE/peers.json" --out-dir "$T/r2" --md "$T/R2.md" >"$T/out2.txt" \
    || fail "report.py without matplotlib exited non-zero"
grep -q '^plots skipped: matplotlib not installed (pip install matplotlib)$' "$T/out2.txt" || fail "skip message"
ls "$T/r2"/*.png >/dev/null 2>&1 && fail "PNGs written without matplotlib"
grep -q '^### Targets$' "$T/R2.md" || fail "no Markdown without matplotlib"
grep -q '\.png)' "$T/R2.md" && fail "Markdown links PNGs that do not exist"

# 3. a second, CPU-only machine in the same out dir: without peers, sorted after the H200
python3 - "$HERE/erlang.json" "$T/cpu.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["meta"].update(device="cpu (reference backend)", backend="cpu", host="fake-cpu-host")
d["meta"]["errors"] = ["gpud.kill9_to_served: timeout after 5000 ms"]
d["records"] = [r for r in d["records"] if r["name"] != "gpud.kill9_to_served"]
for r in d["records"]:
    if r["name"] == "latency.reduce_1000.p50":
        r["extra"]["checked"] = False
json.dump(d, open(sys.argv[2], "w"))
EOF
python3 "$BENCH/report.py" --machine a-cpu-box --erlang "$T/cpu.json" --out-dir "$T/results" --md "$T/RESULTS.md" \
    >"$T/out3.txt" 2>&1 || { cat "$T/out3.txt"; fail "report.py on the CPU machine"; }
[ -f "$T/results/fake-h200.json" ] && [ -f "$T/results/a-cpu-box.json" ] || fail "merged files"
secs=$(grep '^## ' "$md" | tr '\n' ' ')
[ "$secs" = "## fake-h200 ## a-cpu-box " ] || fail "machine order in the Markdown: $secs"
[ "$(grep -c '^### Targets$' "$md")" -eq 2 ] || fail "one Targets table per machine"
python3 - "$T/results/a-cpu-box.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
figs = {f["name"]: f for f in m["figures"]}
assert m["meta"]["peers"] is None, "peers meta"
assert all(set(f["peers"]) <= {"erlcuda_lists", "in_process"} for f in figs.values()), "only erlang.json peers"
assert set(figs["latency.vector_add_1000.p50"]["peers"]) == {"erlcuda_lists", "in_process"}
assert "gpud.kill9_to_served" not in figs
assert "gbps" in figs["large.vector_add.arena.n67108864"]["extra"]
assert "pcie_bidir_fraction" not in figs["large.vector_add.arena.n67108864"]["extra"]
EOF
sed -n '/^## a-cpu-box/,$p' "$md" >"$T/cpu-section.md"
sed -n '/^## fake-h200/,/^## a-cpu-box/p' "$md" >"$T/fake-h200-section.md"
grep -q 'PTX matmul kernel 4096 vs cuBLAS SGEMM.*not measured' "$T/cpu-section.md" \
    || fail "target without a figure not reported as 'not measured'"
# without peers the relative targets on erlcuda's records cannot be evaluated; the rest are
grep -qF '| ≤ 1.2 × pytorch_cuda `device.vector_add.n67108864` | 0.251 ms | not evaluated | no pytorch_cuda `device.vector_add.n67108864` record |' "$T/cpu-section.md" \
    || fail "relative target without its base not 'not evaluated'"
grep -qF '| ≤ 0.5 ms | 0.251 ms | **met** |' "$T/cpu-section.md" || fail "the other target of the same record evaluated"
grep -q '^61 targets: 31 met, 9 missed, 15 not evaluated, 6 not measured\.$' "$T/cpu-section.md" \
    || fail "CPU targets summary: $(grep "^61 targets" "$T/cpu-section.md")"
grep -q '^targets: 31 met, 9 missed, 15 not evaluated, 6 not measured$' "$T/out3.txt" || fail "CPU targets line on stdout"
grep -q 'set for an H200; here they are for reference only' "$T/cpu-section.md" || fail "CPU targets note"
grep -qF '| `examples.cos_sim.device` | ≤ 1.25 × pytorch_cuda | 0.0412 ms | not evaluated | no pytorch_cuda record |' "$T/cpu-section.md" \
    || fail "CPU: example target without PyTorch not 'not evaluated'"
grep -q '^- \*\*erlang: 1 error\*\* (meta.errors):$' "$T/cpu-section.md" || fail "meta.errors not shown"
grep -q 'timeout after 5000 ms' "$T/cpu-section.md" || fail "meta.errors text not shown"
grep -q '^| `latency.reduce_1000.p50` | 18.5 ✗ |' "$T/cpu-section.md" || fail "checked=false not marked"
# the one wrong result of the fixture's GPU run: CuPy's gelu (and the note under its table)
grep '✗' "$T/fake-h200-section.md" | grep -v -e '^| gelu | 2^26 f32 |' -e "^✗ = that run's result did not match" \
    && fail "fake-h200 section marks a result as wrong"

# 4. a scaled run of the example kernels (ERLCUDA_BENCH_EXAMPLES_SCALE) beside full-size peers:
# no ratio, the target not evaluated, a warning; the other targets as before
python3 - "$HERE/erlang.json" "$T/scaled.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["records"]:
    if r["name"] == "examples.cos_sim.device":
        r["extra"].update(size="16x1024 f32", scale=1024)
json.dump(d, open(sys.argv[2], "w"))
EOF
python3 "$BENCH/report.py" --machine scaled-h200 --erlang "$T/scaled.json" --peers "$HERE/peers.json" \
    --out-dir "$T/r4" --md "$T/R4.md" >"$T/out4.txt" 2>"$T/err4.txt" || { cat "$T/err4.txt"; fail "report.py on the scaled run"; }
grep -q 'examples.cos_sim.device: erlcuda ran 16x1024 f32, pytorch_cuda ran 16384x1024 f32' "$T/err4.txt" \
    || fail "no warning for a scaled run: $(cat "$T/err4.txt")"
grep -qF '| `examples.cos_sim.device` | ≤ 1.25 × pytorch_cuda | 0.0412 ms | not evaluated | erlcuda ran 16x1024 f32, pytorch_cuda ran 16384x1024 f32 |' "$T/R4.md" \
    || fail "scaled run's target row"
grep -qF '| cos_sim | 16x1024 f32 (PyTorch: 16384x1024 f32) | 0.0412 | 0.0251 | 0.102 |  |' "$T/R4.md" || fail "scaled run's row"
grep -q '^targets: 38 met, 17 missed, 1 not evaluated, 5 not measured$' "$T/out4.txt" || fail "scaled run's targets line"

# 5. a scaled run of the mixed load (ERLCUDA_BENCH_MIXED_SCALE): none of its targets evaluated, said so
python3 - "$HERE/erlang.json" "$T/mixed-scaled.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["records"]:
    if r["name"].startswith("mixed."):
        r["extra"].update(scale=64, scale_from="default on the cpu backend")
json.dump(d, open(sys.argv[2], "w"))
EOF
python3 "$BENCH/report.py" --machine mixed-scaled --erlang "$T/mixed-scaled.json" --peers "$HERE/peers.json" \
    --out-dir "$T/r5" --md "$T/R5.md" >"$T/out5.txt" 2>"$T/err5.txt" || { cat "$T/err5.txt"; fail "report.py on the scaled mixed run"; }
grep -q '^targets: 28 met, 13 missed, 15 not evaluated, 5 not measured$' "$T/out5.txt" || fail "scaled mixed run's targets line"
grep -qF '| `mixed.small.beside.arena_growth.max` | ≤ 2,000 us | 9,800 us | not evaluated | a scaled run (ERLCUDA_BENCH_MIXED_SCALE 64) |' "$T/R5.md" \
    || fail "scaled mixed run's target row"
grep -qF '| ≥ 0.85 × erlcuda `mixed.large.put_get_256MiB.alone` | 66 jobs/s | not evaluated | a scaled run (ERLCUDA_BENCH_MIXED_SCALE 64) |' "$T/R5.md" \
    || fail "scaled mixed run's relative target row"
grep -qF 'A scaled run (ERLCUDA_BENCH_MIXED_SCALE 64: fewer small jobs, smaller large jobs): its targets are not evaluated.' "$T/R5.md" \
    || fail "scaled mixed run's note"

# 6. the regression table: a baseline, then a run in which one erlcuda record is 20% worse (listed,
# both figures), one 10% worse and two better (not listed), one record new and one gone (counted),
# and a peer 25% worse (listed apart: the machine, not erlcuda). The baseline is the default, the
# OUT_DIR/NAME.json this run replaces, read before it is written.
python3 - "$HERE/erlang.json" "$HERE/peers.json" "$T" <<'EOF'
import json, sys
e, p, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
base = dict(e, records=[r for r in e["records"] if r["name"] != "examples.round_trip.p50"])
json.dump(base, open(t + "/base-erlang.json", "w"))
scale = {("latency.vector_add_1000.p50", "erlcuda"): 1.2,        # 20% worse: a regression
         ("throughput.callers_1000", "erlcuda"): 0.9,             # 10% worse: within the margin
         ("large.vector_add.arena.n67108864", "erlcuda"): 0.7,    # better (lower ms)
         ("throughput.callers_100", "erlcuda"): 1.3,              # better (more jobs/s)
         ("pcie.h2d", "pcie_pinned"): 0.75}                       # a peer 25% worse
for d in (e, p):
    d["records"] = [r for r in d["records"] if r["name"] != "gpud.restart_ready"]
    for r in d["records"]:
        r["value"] *= scale.get((r["name"], r["system"]), 1)
json.dump(e, open(t + "/new-erlang.json", "w"))
json.dump(p, open(t + "/new-peers.json", "w"))
EOF
python3 "$BENCH/report.py" --machine reg-h200 --erlang "$T/base-erlang.json" --peers "$HERE/peers.json" \
    --out-dir "$T/r6" --md "$T/R6.md" >/dev/null 2>"$T/err6.txt" || { cat "$T/err6.txt"; fail "report.py on the baseline"; }
cp "$T/r6/reg-h200.json" "$T/base-merged.json"
python3 "$BENCH/report.py" --machine reg-h200 --erlang "$T/new-erlang.json" --peers "$T/new-peers.json" \
    --out-dir "$T/r6" --md "$T/R6.md" >"$T/out6.txt" 2>"$T/err6.txt" || { cat "$T/err6.txt"; fail "report.py on the new run"; }
[ -s "$T/err6.txt" ] && { cat "$T/err6.txt"; fail "report.py warned on the regression case"; }
sed -n '/^targets: /,$p' "$T/out6.txt" | tail -n +3 >"$T/reg6.txt"
cat >"$T/want6.txt" <<EOF
Host drift: the peers' figures (not erlcuda's code) are 1.00× as slow as in \`$T/r6/reg-h200.json\` of 2026-12-02T16:00:00+00:00 at the median of 126 (10th percentile 1.00×, 90th 1.00×), their small jobs' round trips (\`latency.*\`) 1.00× at the median of 12; an erlcuda record is compared beyond its own peers' drift, or, with none, beyond the median where it is above 1 (a record of the host's work, small jobs, the VM's profile or gpud's start: beyond the small jobs' drift).
1 of erlcuda's records more than 15% worse than \`$T/r6/reg-h200.json\` of 2026-12-02T16:00:00+00:00, beyond the drift:
| record | system | unit | baseline | new | new / baseline | drift | worse beyond it |
|---|---|---|---|---|---|---|---|
| \`latency.vector_add_1000.p50\` | erlcuda | us | 12.8 | 15.4 | 1.20× | 1.00× (peers) | 20.0% |
124 of erlcuda's records compared, 1 new, 1 missing (in one file only: not compared); worse: a higher value in \`%\`, \`% of a core\`, \`ms\`, \`ns\`, \`us\`, \`x\`, a lower one in \`GB/s\`, \`TFLOP/s\`, \`jobs/s\`.
Peers more than 15% worse (not erlcuda's code: the machine or its libraries changed; for context):
| record | system | unit | baseline | new | new / baseline | worse by |
|---|---|---|---|---|---|---|
| \`pcie.h2d\` | pcie_pinned | GB/s | 55.2 | 41.4 | 0.750× | 25.0% |
EOF
diff "$T/want6.txt" "$T/reg6.txt" >&2 || fail "the regression table on stdout (want, got above)"
python3 - "$T/r6/reg-h200.json" <<'EOF' || fail "the comparison kept in the merged JSON"
import json, sys
c = json.load(open(sys.argv[1]))["comparison"]
w = c["worse"]
assert len(w) == 1 and w[0]["name"] == "latency.vector_add_1000.p50" and w[0]["system"] == "erlcuda", w
assert w[0]["baseline"] == 12.8 and abs(w[0]["value"] - 15.36) < 1e-9 and abs(w[0]["ratio"] - 1.2) < 1e-9, w
assert [r["name"] for r in c["peers_worse"]] == ["pcie.h2d"], c["peers_worse"]
assert (c["compared"], c["new"], c["missing"], c["threshold"]) == (124, 1, 1, 0.15), c
EOF
sed -n '/^### Regressions$/,/^### Latency/p' "$T/R6.md" >"$T/reg6.md"
grep -qxF "1 of erlcuda's records more than 15% worse than \`reg-h200.json\` of 2026-12-02T16:00:00+00:00, beyond the drift:" "$T/reg6.md" \
    || fail "regression heading line in the Markdown"
grep -qxF '| `latency.vector_add_1000.p50` | erlcuda | us | 12.8 | 15.4 | 1.20× | 1.00× (peers) | 20.0% |' "$T/reg6.md" \
    || fail "regression row in the Markdown"
[ "$(grep -c '^| `' "$T/reg6.md")" -eq 2 ] || fail "the Markdown lists more than the regression and the peer"
grep -q '^Host drift: the peers.* 1.00× as slow as in `reg-h200.json`' "$T/reg6.md" || fail "the drift line in the Markdown"

# 7. nothing worse: a run against itself (an explicit --baseline) says so in one line
python3 "$BENCH/report.py" --machine reg-h200 --erlang "$T/new-erlang.json" --peers "$T/new-peers.json" \
    --out-dir "$T/r7" --md "$T/R7.md" --baseline "$T/r6/reg-h200.json" >"$T/out7.txt" 2>&1 \
    || { cat "$T/out7.txt"; fail "report.py against itself"; }
sed -n '/^targets: /,$p' "$T/out7.txt" | tail -n +3 >"$T/reg7.txt"
cat >"$T/want7.txt" <<EOF
Host drift: the peers' figures (not erlcuda's code) are 1.00× as slow as in \`$T/r6/reg-h200.json\` of 2026-12-02T16:00:00+00:00 at the median of 126 (10th percentile 1.00×, 90th 1.00×), their small jobs' round trips (\`latency.*\`) 1.00× at the median of 12; an erlcuda record is compared beyond its own peers' drift, or, with none, beyond the median where it is above 1 (a record of the host's work, small jobs, the VM's profile or gpud's start: beyond the small jobs' drift).
No regression: no erlcuda record more than 15% worse than \`$T/r6/reg-h200.json\` of 2026-12-02T16:00:00+00:00, beyond the drift.
125 of erlcuda's records compared, 0 new, 0 missing (in one file only: not compared); worse: a higher value in \`%\`, \`% of a core\`, \`ms\`, \`ns\`, \`us\`, \`x\`, a lower one in \`GB/s\`, \`TFLOP/s\`, \`jobs/s\`.
Peers: none more than 15% worse.
EOF
diff "$T/want7.txt" "$T/reg7.txt" >&2 || fail "the no-regression lines on stdout (want, got above)"
grep -qxF 'No regression: no erlcuda record more than 15% worse than `reg-h200.json` of 2026-12-02T16:00:00+00:00, beyond the drift.' "$T/R7.md" \
    || fail "no-regression line in the Markdown"

# 8. --regenerate: the Markdown again from the merged files, the JSON untouched; with --machine and
# --baseline, a comparison made there (the baseline here a producer's record file)
sum6=$(cksum <"$T/r6/reg-h200.json")
python3 "$BENCH/report.py" --regenerate --out-dir "$T/r6" --md "$T/R8.md" >"$T/out8.txt" 2>&1 \
    || { cat "$T/out8.txt"; fail "report.py --regenerate"; }
cmp -s "$T/R6.md" "$T/R8.md" || fail "--regenerate wrote another Markdown than the run did"
[ "$sum6" = "$(cksum <"$T/r6/reg-h200.json")" ] || fail "--regenerate changed the merged JSON"
python3 "$BENCH/report.py" --regenerate --out-dir "$T/r6" --md "$T/R8.md" --machine reg-h200 \
    --baseline "$T/base-erlang.json" >"$T/out8.txt" 2>&1 || { cat "$T/out8.txt"; fail "report.py --regenerate --baseline"; }
grep -qxF "1 of erlcuda's records more than 15% worse than \`$T/base-erlang.json\` of 2026-12-02T16:00:00+00:00, beyond the drift:" "$T/out8.txt" \
    || fail "--regenerate --baseline on stdout: $(cat "$T/out8.txt")"
# (a producer's record file has no peers: the drift taken out is the host's, none)
grep -qxF '| `latency.vector_add_1000.p50` | erlcuda | us | 12.8 | 15.4 | 1.20× | 1.00× (host) | 20.0% |' "$T/R8.md" \
    || fail "--regenerate --baseline in the Markdown"
[ "$sum6" = "$(cksum <"$T/r6/reg-h200.json")" ] || fail "--regenerate --baseline changed the merged JSON"
echo "regressions: the table (20% worse listed, 10% worse not), the no-regression line, --regenerate"

# report.py on $T/$2-erlang.json and $T/$2-peers.json against the case 6 baseline, into
# $T/r$1 and $T/out$1.txt ($3: the case, for a failure).
against_base() {
    python3 "$BENCH/report.py" --machine reg-h200 --erlang "$T/$2-erlang.json" --peers "$T/$2-peers.json" \
        --out-dir "$T/r$1" --md "$T/R$1.md" --baseline "$T/base-merged.json" >"$T/out$1.txt" 2>&1 \
        || { cat "$T/out$1.txt"; fail "report.py on $3"; }
}

# 9. a slower host: every peer 1.7x as slow, and erlcuda's records too (host drift, not listed),
# but for one record with peers of its own 1.7 x 1.2 as slow (its ratio to them 20% worse) and
# one with none 1.7 x 1.3 (30% beyond the peers' median drift): those two are listed.
python3 - "$HERE/peers.json" "$T" <<'EOF'
import json, sys
p, t = json.load(open(sys.argv[1])), sys.argv[2]
e = json.load(open(t + "/base-erlang.json"))
HIGHER = {"jobs/s", "GB/s", "TFLOP/s"}
extra = {("latency.vector_add_1000.p50", "erlcuda"): 1.2, ("throughput.callers_1000", "erlcuda"): 1.3}
for d in (e, p):
    for r in d["records"]:
        k = 1.7 * extra.get((r["name"], r["system"]), 1)
        r["value"] = r["value"] / k if r["unit"] in HIGHER else r["value"] * k
json.dump(e, open(t + "/slow-erlang.json", "w"))
json.dump(p, open(t + "/slow-peers.json", "w"))
EOF
against_base 9 slow "the slower host"
python3 - "$T/r9/reg-h200.json" <<'EOF' || fail "the slower host's comparison"
import json, sys
c = json.load(open(sys.argv[1]))["comparison"]
assert abs(c["drift"]["median"] - 1.7) < 1e-9, c["drift"]
w = {(r["name"], r["drift_from"]): round(r["worse_by"], 6) for r in c["worse"]}
assert w == {("latency.vector_add_1000.p50", "peers"): 0.2,
             ("throughput.callers_1000", "small-job peers"): round(1 - 1 / 1.3, 6)}, w
assert len(c["peers_worse"]) > 100, len(c["peers_worse"])
EOF
grep -q "^Host drift: the peers' figures (not erlcuda's code) are 1.70× as slow" "$T/out9.txt" || fail "the slower host's drift line"
grep -q "^2 of erlcuda's records more than 15% worse than .*, beyond the drift:$" "$T/out9.txt" || fail "the slower host's verdict"
echo "regressions beyond host drift: a host 1.7x slower on its peers lists only the 2 records slower beyond it"

# 10. a host whose CPU alone is slower: the peers' small jobs (latency.*, mixed.small.*) 1.4x as
# slow, their large copies and kernels as before; erlcuda's host-bound records (small jobs, the
# VM's profile, gpud's start) 1.4x as slow too: not listed, but for one 1.4 x 1.3 (30% beyond the
# small jobs' drift); a GPU-bound record 1.4x as slow is listed (its peers did not move).
python3 - "$HERE/peers.json" "$T" <<'EOF'
import json, re, sys
p, t = json.load(open(sys.argv[1])), sys.argv[2]
e = json.load(open(t + "/base-erlang.json"))
HIGHER = {"jobs/s", "GB/s", "TFLOP/s"}
host = re.compile(r"^(latency\.|profile\.|throughput\.|mixed\.small\.|gpud\.|examples\.round_trip)|\.small_p50$")
def slow(r, k):
    r["value"] = r["value"] / k if r["unit"] in HIGHER else r["value"] * k
for r in e["records"]:
    if r["name"] == "large.vector_add.arena.n67108864":
        slow(r, 1.4)
    elif host.search(r["name"]):
        slow(r, 1.4 * (1.3 if r["name"] == "throughput.callers_1000" else 1))
for r in p["records"]:
    if r["name"].startswith(("latency.", "mixed.small.")):
        slow(r, 1.4)
json.dump(e, open(t + "/cpu-erlang.json", "w"))
json.dump(p, open(t + "/cpu-peers.json", "w"))
EOF
against_base 10 cpu "the host with a slower CPU"
python3 - "$T/r10/reg-h200.json" <<'EOF' || fail "the slower CPU's comparison"
import json, sys
c = json.load(open(sys.argv[1]))["comparison"]
assert abs(c["drift"]["median"] - 1.0) < 1e-9, c["drift"]
assert abs(c["drift"]["small_jobs"]["median"] - 1.4) < 1e-9, c["drift"]
w = {(r["name"], r["drift_from"]): round(r["worse_by"], 6) for r in c["worse"]}
assert w == {("throughput.callers_1000", "small-job peers"): round(1 - 1 / 1.3, 6),
             ("large.vector_add.arena.n67108864", "peers"): 0.4}, w
EOF
grep -qF "their small jobs' round trips (\`latency.*\`) 1.40× at the median of 12;" "$T/out10.txt" \
    || fail "the slower CPU's drift line"
echo "regressions beyond a slower CPU: the small jobs' drift taken out of the host-bound records only"

# 11. run.sh ab's comparison (report.py --ab): two rounds of each build; this build's
# latency p50 1.3x the baseline's in both rounds (listed, ranges apart), its throughput at 100
# callers 1.1x as low (within 15%: not listed), everything else the same.
mkdir -p "$T/ab"
python3 - "$HERE/erlang.json" "$T/ab" <<'EOF'
import json, sys
e, d = json.load(open(sys.argv[1])), sys.argv[2]
for v in ("baseline", "this"):
    for r in (1, 2):
        doc = json.loads(json.dumps(e))
        for rec in doc["records"]:
            k = 1.0 + 0.01 * r          # the rounds' own spread
            if v == "this" and rec["name"] == "latency.vector_add_1000.p50" and rec["system"] == "erlcuda":
                k *= 1.3
            if v == "this" and rec["name"] == "throughput.callers_100" and rec["system"] == "erlcuda":
                k /= 1.1
            rec["value"] *= k
        json.dump(doc, open("{}/{}-{}.json".format(d, v, r), "w"))
EOF
python3 "$BENCH/report.py" --ab "$T/ab" >"$T/ab.txt" 2>&1 || { cat "$T/ab.txt"; fail "report.py --ab"; }
grep -q "^A/B on one host: 2 rounds of the baseline, 2 of this build, alternated;" "$T/ab.txt" || fail "the A/B's first line"
grep -q "^1 more than 15% worse at the median" "$T/ab.txt" || { cat "$T/ab.txt"; fail "the A/B's verdict"; }
grep -q '^| `latency.vector_add_1000.p50` | erlcuda | us | .* | 1.30× | 30.0% | no |$' "$T/ab.txt" \
    || { cat "$T/ab.txt"; fail "the A/B's listed record"; }
python3 - "$T/ab/ab.json" <<'EOF' || fail "the A/B's JSON"
import json, sys
rows = json.load(open(sys.argv[1]))
w = {r["name"]: round(r["worse_by"], 6) for r in rows if r["system"] == "erlcuda" and r["worse_by"] > 0.001}
assert w == {"latency.vector_add_1000.p50": 0.3, "throughput.callers_100": round(1 - 1 / 1.1, 6)}, w
EOF
echo "A/B of two builds (report.py --ab): the record 30% worse listed, 10% worse not"

after=$(snapshot)
[ "$before" = "$after" ] || fail "bench/results or bench/RESULTS.md changed"
echo "PASS: report.py on the fixtures (merged JSON, targets, derived figures, Markdown, multi-machine)"
