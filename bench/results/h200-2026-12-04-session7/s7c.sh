#!/bin/bash
# Persistent worker: latency A/B (on, then ERLCUDA_PERSIST=0), then the GPU check.
here=$(cd "$(dirname "$0")" && pwd); cd $here
o=${OUT:-.}
for mode in on off on; do
  if [ $mode = off ]; then export ERLCUDA_PERSIST=0; else unset ERLCUDA_PERSIST; fi
  ERLCUDA_BENCH_JSON=$o/lat-$mode.json timeout 150 bash run.sh eval "erlcuda_bench:main([latency, other_latency])" > $o/lat-$mode-$RANDOM.log 2>&1
  echo "latency $mode rc $?"
done
unset ERLCUDA_PERSIST
timeout 330 bash run.sh check > $o/check.log 2>&1; echo "check rc $?"
tail -5 $o/check.log
