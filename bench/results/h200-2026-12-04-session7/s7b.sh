#!/bin/bash
# matmul: cp.async variants timed against cuBLAS, then ncu stall reasons of each at 4096.
here=$(cd "$(dirname "$0")" && pwd); cd $here
python3 mm_probe.py --sizes 1024,2048,4096,8192 base=v/base new=v/new areg=v/areg > $OUT/probe.log 2>&1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu | head -1); echo "ncu: $NCU" > $OUT/ncu.txt
M=smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__inst_executed_pipe_lsu.sum,smsp__inst_executed_op_ldgsts.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,gpu__time_duration.sum
for s in barrier long_scoreboard short_scoreboard mio_throttle lg_throttle math_pipe_throttle not_selected selected wait dispatch_stall no_instruction branch_resolving drain misc tex_throttle; do M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio; done
timeout 200 $NCU --clock-control none --metrics $M -k regex:matmul_f32 --launch-count 3 python3 mm_probe.py --ncu base=v/base new=v/new areg=v/areg >> $OUT/ncu.txt 2>&1
echo ncu rc $? >> $OUT/ncu.txt
