#!/bin/bash
# Session 8, call 9: where the small-job tail goes. The latency section
# twice, with the split's per-job percentiles of the launch call and of the
# wait after it (bench/erlcuda_bench.erl at this call's commit).
here=$(cd "$(dirname "$0")" && pwd); o=${OUT:-.}
for r in 1 2; do
  ERLCUDA_BENCH_JSON=$o/lat$r.json bash $here/run.sh eval 'erlcuda_bench:main([latency])' > $o/lat$r.log 2>&1
  grep -E "erlcuda, binaries|in-process|full stack|one-in-flight|per job" $o/lat$r.log
done
