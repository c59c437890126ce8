#!/bin/bash
# Session 8, call 10: the GPU check on the final gpud (register_start),
# then cold_start(5) and a restart after growth, as in calls 3 and 8.
here=$(cd "$(dirname "$0")" && pwd); o=${OUT:-.}
timeout 240 bash $here/run.sh check > $o/check.log 2>&1; echo "check rc $?"; tail -1 $o/check.log
bash $here/run.sh eval 'erlcuda_bench:cold_start(5)' > $o/cold.log 2>&1
ERLCUDA_BENCH_JSON=$o/br.json bash $here/run.sh eval 'erlcuda_bench:main([buffers, restart])' > $o/br.log 2>&1
grep -hE "^cold: |^restart: |kill -9" $o/cold.log $o/br.log
tar czf /tmp/r.tgz -C $o . && rm -f $o/* && mv /tmp/r.tgz $o/
