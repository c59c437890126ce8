#!/bin/bash
# Session 8, call 8: the whole benchmark on the final code, then the GPU
# check; every output file in one archive.
here=$(cd "$(dirname "$0")" && pwd); o=${OUT:-.}
timeout 330 bash $here/run.sh bench > $o/bench.log 2>&1; echo "bench rc $?"
timeout 240 bash $here/run.sh check > $o/check.log 2>&1; echo "check rc $?"
tail -3 $o/check.log
tar czf /tmp/r.tgz -C $o . && rm -f $o/* && mv /tmp/r.tgz $o/
