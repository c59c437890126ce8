#!/bin/bash
# The whole benchmark on the final code, then the GPU check.
here=$(cd "$(dirname "$0")" && pwd); o=${OUT:-.}
timeout 330 bash $here/run.sh bench > $o/bench.log 2>&1; echo "bench rc $?"
timeout 240 bash $here/run.sh check > $o/check.log 2>&1; echo "check rc $?"
