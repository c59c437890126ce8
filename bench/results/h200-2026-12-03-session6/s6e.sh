#!/bin/bash
# session 6, call 5: 256x128 tiles, BK=16 with all of A's tile loaded (call 4's BK=16 build loaded half).
here=$(cd "$(dirname "$0")" && pwd)
o=$OUT/s6e; mkdir -p $o
(cd $here && timeout 150 python3 mm_probe.py erlcuda_kernels.ptx mmv/t256k8.ptx@8@256 mmv/t256k16.ptx@16@256) > $o/mm.txt 2>&1; cat $o/mm.txt
cd $OUT && tar czf r.tgz s6e
