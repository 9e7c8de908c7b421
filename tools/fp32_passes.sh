#!/bin/bash
# One device call for the float32 Hopper backward (solution.py's chunk_bwd_sm90_fp32, unit backward_sm90_fp32) through
# its dev harnesses (dev/bwd_fp32_pass{A,B}.py, training-design 8.6-8.7), which build the unit's production text with a
# dev entry (one build, shared): the build, then pass A's (the dq kernel, split t) and pass B's (the dv kernel, split r)
# --check (both kernels as the host launches them, against float64, and the non-finite flag) and --bench (each kernel
# alone at S4), each step with its own time limit.
#   bash tools/fp32_passes.sh      (results and logs under $OUT; the steps' limits add up to 420 s)
# An earlier harness or kernel: git show COMMIT:dev/bwd_fp32_passA.py (and the solution.py it builds from).
set -u
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
export TORCH_EXTENSIONS_DIR=/tmp/ext
s0=$(date +%s)
timeout 120 python3 dev/bwd_fp32_passA.py --build-only > $OUT/build.txt 2>&1
echo "built rc=$? t=$(( $(date +%s) - s0 ))" | tee $OUT/log.txt
grep -h "regs\|warnings" $OUT/build.txt | tee -a $OUT/log.txt
step() {  # name, limit, command...
  local name=$1 limit=$2; shift 2
  timeout $limit "$@" > $OUT/$name.txt 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - s0 ))" | tee -a $OUT/log.txt
  for j in $OUT/bwd_fp32_pass*.json; do [ -e "$j" ] && mv "$j" $OUT/$name.json; done  # (each pass writes one name)
  grep -E "^check|^bench|OVER|FAIL|FLAG NOT" $OUT/$name.txt | tee -a $OUT/log.txt
}
step passA_t 150 python3 dev/bwd_fp32_passA.py --check --bench --trials 20
step passB_r 150 python3 dev/bwd_fp32_passB.py --check --bench --trials 20
echo "t=$(( $(date +%s) - s0 ))" | tee -a $OUT/log.txt
# everything but the log in one archive (the device call brings back only a few files)
(cd $OUT && tar czf passes.tgz --remove-files $(ls | grep -v -e '^log.txt$' -e '^passes.tgz$'))
