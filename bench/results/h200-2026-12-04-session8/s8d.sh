#!/bin/bash
# Session 8, call 4: the whole benchmark on the final code, then the GPU
# check; every output file in one archive (the file-count limit).
here=$(cd "$(dirname "$0")" && pwd); o=${OUT:-.}
timeout 330 bash $here/run.sh bench > $o/bench.log 2>&1; echo "bench rc $?"
timeout 240 bash $here/run.sh check > $o/check.log 2>&1; echo "check rc $?"
cd $o && tar czf r.tgz --exclude r.tgz . && find . -mindepth 1 ! -name r.tgz -delete
