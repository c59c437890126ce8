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
names += ["gpud.cold_start_ready", "gpud.restart_ready", "gpud.kill9_to_served", "gpud.idle_cpu"]
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
    if not n.startswith("pcie."):
        check(f["system"] == "erlcuda", "%s: own system %s" % (n, f["system"]))
    else:
        check(f["system"] == "pcie_pinned" and f["peers"] == {}, "%s: pcie figure" % n)
lat = figs["latency.vector_add_1000.p50"]["peers"]
check(set(lat) == {"erlcuda_lists", "in_process", "pytorch_pageable", "pytorch_pinned", "cupy"}, "latency peers %s" % lat)
check(set(figs["matmul.kernel.n4096"]["peers"]) == {"cublas_sgemm"}, "matmul kernel peers")
check(set(figs["matmul.end_to_end.n4096"]["peers"]) == {"pytorch_pinned", "pytorch_pageable"}, "matmul e2e peers")

# targets: 8, evaluated, the fixtures make two of them miss
t = {n: f["target"] for n, f in figs.items() if "target" in f}
check(len(t) == 8, "expected 8 targets, got %d" % len(t))
check(all(isinstance(x["met"], bool) and x["op"] in ("<=", ">=", "<") and isinstance(x["value"], (int, float))
          and x["text"] for x in t.values()), "target fields")
missed = sorted(n for n, x in t.items() if not x["met"])
check(missed == ["large.vector_add.binaries.n67108864", "matmul.kernel.n4096"], "missed targets %s" % missed)
mk = figs["matmul.kernel.n4096"]
check(abs(t["matmul.kernel.n4096"]["value"] - 0.70 * mk["peers"]["cublas_sgemm"]) < 1e-9, "matmul target is 70% of cuBLAS")
check(t["gpud.idle_cpu"]["op"] == "<", "idle_cpu target op")

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
print("merged JSON: %d figures, %d targets (%d missed), derived GB/s and ratios ok" % (len(figs), len(t), len(missed)))
EOF

md="$T/RESULTS.md"
grep -q '^# erlcuda benchmark results' "$md" || fail "Markdown title"
grep -q '^## fake-h200$' "$md" || fail "Markdown machine section"
grep -q 'FAKE DATA' "$md" || fail "Markdown does not flag fake data"
grep -q '^### Targets$' "$md" || fail "no Targets section"
grep -q '^| target | record | wanted | reached | result | by |$' "$md" || fail "no Targets table header"
[ "$(grep -c '\*\*met\*\*' "$md")" -eq 6 ] || fail "expected 6 met targets in the Markdown"
[ "$(grep -c '\*\*missed\*\*' "$md")" -eq 2 ] || fail "expected 2 missed targets in the Markdown"
for h in '### Latency' '### Throughput' '### Large vectors' '### Matmul' '### gpud' '### PCIe'; do
    grep -q "^$h" "$md" || fail "no section $h"
done
grep -q '| record | erlcuda | erlcuda_lists | in_process | pytorch_pinned | pytorch_pageable | cupy |' "$md" \
    || fail "latency table lacks peer columns"
grep -q '| `throughput.callers_10000` | 1,121,400 | jobs/s' "$md" || fail "jobs/s not formatted with separators"
grep -q '| vector_add | 67,108,864 | 805 | 26.9 ' "$md" || fail "large vector table row"
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
grep -q 'set for an H200; here they are for reference only' "$T/cpu-section.md" || fail "CPU targets note"
grep -q '^- \*\*erlang: 1 error\*\* (meta.errors):$' "$T/cpu-section.md" || fail "meta.errors not shown"
grep -q 'timeout after 5000 ms' "$T/cpu-section.md" || fail "meta.errors text not shown"
grep -q '^| `latency.reduce_1000.p50` | 18.5 ✗ |' "$T/cpu-section.md" || fail "checked=false not marked"
grep -q '✗' "$T/fake-h200-section.md" && fail "fake-h200 section marks a result as wrong"

after=$(snapshot)
[ "$before" = "$after" ] || fail "bench/results or bench/RESULTS.md changed"
echo "PASS: report.py on the fixtures (merged JSON, targets, derived figures, Markdown, multi-machine)"
