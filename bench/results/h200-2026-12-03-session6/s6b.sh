#!/bin/bash
# session 6, call 2: matmul builds vs cuBLAS, then the whole benchmark, then the GPU check.
here=$(cd "$(dirname "$0")" && pwd)
o=$OUT/s6b; mkdir -p $o
T0=$(date +%s)
st() { echo "== $1 at $(( $(date +%s) - T0 )) s" | tee -a $o/steps.txt; }
st mm; (cd $here && timeout 90 python3 mm_probe.py mmv/v0.ptx erlcuda_kernels.ptx mmv/bk32.ptx@32) > $o/mm.txt 2>&1; grep -v "err" $o/mm.txt; grep -c OK $o/mm.txt
st bench; (cd $o && OUT=$o timeout 420 bash $here/run.sh bench > $o/bench.out 2>&1); echo "bench rc $?"
grep -E "^\| .*(met|missed)" $o/RESULTS.md | head -30
st check; left=$(( 585 - ($(date +%s) - T0) )); echo "check budget $left s"
[ $left -gt 60 ] && { timeout $left bash $here/run.sh check > $o/check.txt 2>&1; echo "check rc $?"; grep -E "cargo tests|passed, .* failed" $o/check.txt; }
st done
cd $OUT && tar czf r.tgz s6b
