#!/bin/bash
# Persistent worker (fields fetched in parallel): gpud on with the baseline off, then both off.
here=$(cd "$(dirname "$0")" && pwd); cd $here
o=${OUT:-.}
for mode in gpudon off; do
  if [ $mode = off ]; then export ERLCUDA_PERSIST=0; else unset ERLCUDA_PERSIST; fi
  ERLCUDA_GPUD_BENCH=$here/bench-nopersist.sh ERLCUDA_BENCH_JSON=$o/lat-$mode.json timeout 150 \
    bash "$here/run.sh" eval "erlcuda_bench:main([latency, other_latency])" > $o/lat-$mode.log 2>&1
  echo "latency $mode rc $?"
done
