#!/bin/bash
# session 6, call 6: matmul_f32 with both tile bodies (chosen per launch): the
# PTX checks of every kernel, the whole benchmark, the GPU check.
here=$(cd "$(dirname "$0")" && pwd)
o=$OUT/s6f; mkdir -p $o
T0=$(date +%s)
st() { echo "== $1 at $(( $(date +%s) - T0 )) s" | tee -a $o/steps.txt; }
st kernels; timeout 150 bash $here/run.sh kernels > $o/kernels.txt 2>&1; echo "kernels rc $?"; grep -E "matmul|FAIL|passed|failed" $o/kernels.txt | head -30
st bench; (cd $o && OUT=$o timeout 240 bash $here/run.sh bench > $o/bench.out 2>&1); echo "bench rc $?"
grep -E "^\| .*(met|missed)" $o/RESULTS.md | grep -i "matmul\|cold\|throughput with" | head -12
grep -E "matmul.kernel" $o/RESULTS.md | head -8
st check; left=$(( 560 - ($(date +%s) - T0) )); echo "check budget $left s"
[ $left -gt 60 ] && { timeout $left bash $here/run.sh check > $o/check.txt 2>&1; echo "check rc $?"; grep -E "cargo tests|passed, .* failed|FAIL" $o/check.txt | head; }
st done
cd $OUT && tar czf r.tgz s6f
