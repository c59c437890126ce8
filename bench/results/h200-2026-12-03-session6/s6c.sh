#!/bin/bash
# session 6, call 3: gpud populates segment 0's page tables while the driver starts.
here=$(cd "$(dirname "$0")" && pwd)
o=$OUT/s6c; mkdir -p $o
T0=$(date +%s)
st() { echo "== $1 at $(( $(date +%s) - T0 )) s" | tee -a $o/steps.txt; }
st startup; ERLCUDA_BENCH_JSON=$o/startup.json timeout 90 bash $here/run.sh eval "erlcuda_bench:main([startup])" > $o/startup.txt 2>&1; grep -E "start to ready|ready: backend" $o/startup.txt | sed 's/.*started in/started in/' | head -12
st cold_start; timeout 120 bash $here/run.sh eval "erlcuda_bench:cold_start(8)" > $o/cold_start.txt 2>&1; grep -vE "INFO REPORT|^gpud\[0\]: cuda: registered|^$" $o/cold_start.txt | grep -v "^gpud" | head -30
st check; timeout 330 bash $here/run.sh check > $o/check.txt 2>&1; echo "check rc $?"; grep -E "cargo tests|passed, .* failed" $o/check.txt
st done
cd $OUT && tar czf r.tgz s6c
