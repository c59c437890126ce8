#!/bin/bash
# session 6, call 4: matmul_f32 with 256x128 tiles (16x8 outputs per thread) against the current 128x128.
here=$(cd "$(dirname "$0")" && pwd)
o=$OUT/s6d; mkdir -p $o
(cd $here && timeout 150 python3 mm_probe.py erlcuda_kernels.ptx mmv/t256k8.ptx@8@256 mmv/t256k16.ptx@16@256) > $o/mm.txt 2>&1; cat $o/mm.txt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
(cd $here && timeout 120 $NCU --clock-control none --set full -k regex:'matmul_f32' --launch-count 1 python3 mm_probe.py --ncu mmv/t256k8.ptx@8@256) > $o/ncu.txt 2>&1; grep -E "^  [a-z_0-9]+.*\(|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|No Eligible" $o/ncu.txt | head -20
cd $OUT && tar czf r.tgz s6d
