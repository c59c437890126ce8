#!/bin/bash
# session 6, call 7: the PTX checks again (call 6's gpu_check.py crashed in its summary).
here=$(cd "$(dirname "$0")" && pwd)
o=$OUT/s6g; mkdir -p $o
timeout 150 bash $here/run.sh kernels > $o/kernels.txt 2>&1; echo "kernels rc $?"
grep -E "FAIL|checks:|Traceback|matmul_f32.*(4096|1000x1000)" $o/kernels.txt | head -20
cd $OUT && tar czf r.tgz s6g
