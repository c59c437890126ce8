#!/bin/bash
# session 6, call 1: GPU check with the cubins, cold start with the JIT cache off,
# matmul variants vs cuBLAS, ncu of the kernel and of cuBLAS, registration probe.
here=$(cd "$(dirname "$0")" && pwd)
o=$OUT/s6a; mkdir -p $o
T0=$(date +%s)
st() { echo "== $1 at $(( $(date +%s) - T0 )) s" | tee -a $o/steps.txt; }
st reg; timeout 60 python3 $here/reg_probe.py > $o/reg.txt 2>&1; cat $o/reg.txt | tail -14
st startup; ERLCUDA_BENCH_JSON=$o/startup.json timeout 90 bash $here/run.sh eval "erlcuda_bench:main([startup])" > $o/startup.txt 2>&1; grep -E "start to ready|kernels:" $o/startup.txt | head -12
st mm; (cd $here && timeout 120 python3 mm_probe.py mmv/v0.ptx mmv/v1.ptx mmv/v2.ptx mmv/v3.ptx) > $o/mm.txt 2>&1; cat $o/mm.txt
st ncu; NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu); echo "ncu: $NCU"
(cd $here && timeout 150 $NCU --clock-control none --set full -k regex:'matmul_f32|gemm' --launch-count 4 python3 mm_probe.py --ncu mmv/v0.ptx) > $o/ncu.txt 2>&1; grep -E "^  [a-z_0-9]+.*\(|Duration|Registers|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc Active|Stall|Warp Cycles Per Issued|No Eligible|L1/TEX Hit|Bank" $o/ncu.txt | head -80
st check; timeout 330 bash $here/run.sh check > $o/check.txt 2>&1; echo "check rc $?"; grep -E "cargo tests|passed|FAIL|kernels:" $o/check.txt | head -20
st done
cd $OUT && tar czf r.tgz s6a
