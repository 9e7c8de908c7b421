#!/bin/bash
# Instruction count, duration, pipe use and stall reasons of one chunked kernel launch:
#   bash tools/ncu_metrics.sh KERNEL_REGEX B T H D [dtype]   (KERNEL_REGEX e.g. chunk_bf16_kernel)
K=$1; shift
R=smsp__average_warps_issue_stalled
M=gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed_pipe_tensor_op_hmma.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
for r in barrier short_scoreboard long_scoreboard math_pipe_throttle mio_throttle wait not_selected selected dispatch_stall lg_throttle no_instruction branch_resolving; do
  M=$M,${R}_${r}_per_issue_active.ratio
done
ncu --clock-control none --profile-from-start off -k regex:"$K" -c 1 --metrics "$M" python3 "$(dirname "$0")/ncu_profile.py" "$@"
