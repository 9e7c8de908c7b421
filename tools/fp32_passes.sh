#!/bin/bash
# One device call for the float32 backward's dev passes (training-design 8.6): every build first, in parallel, then
# each pass's --check and --bench in its schemes (b, t; pass B also r), and an earlier copy of pass A for an A/B, each step with
# its own time limit.
#   bash tools/fp32_passes.sh [OLD_PASS_A.py]      (results and logs under $OUT; at most about 500 s)
# OLD_PASS_A.py: an earlier dev/bwd_fp32_passA.py made locally (git show COMMIT:dev/bwd_fp32_passA.py >
# scratch/passA_old.py) and carried; it runs as dev/passA_old.py with its own extension directory.
set -u
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
export TORCH_EXTENSIONS_DIR=/tmp/ext
s0=$(date +%s)
old=${1:-}
if [ -n "$old" ]; then  # (today's bwd_fp32_common.main passes build_module the scheme)
  cp "$old" dev/passA_old.py
  sed -i 's/^def build_module():/def build_module(split="b"):/' dev/passA_old.py
fi
python3 dev/bwd_fp32_passA.py --build-only > $OUT/build_A.txt 2>&1 &
python3 dev/bwd_fp32_passB.py --build-only > $OUT/build_B.txt 2>&1 &
python3 dev/bwd_fp32_passB.py --build-only --split t > $OUT/build_Bt.txt 2>&1 &
python3 dev/bwd_fp32_passB.py --build-only --split r > $OUT/build_Br.txt 2>&1 &
python3 dev/bwd_fp32_passA.py --build-only --split t > $OUT/build_At.txt 2>&1 &
[ -n "$old" ] && TORCH_EXTENSIONS_DIR=/tmp/ext_old python3 dev/passA_old.py --build-only > $OUT/build_Aold.txt 2>&1 &
wait
echo "built t=$(( $(date +%s) - s0 ))" | tee $OUT/log.txt
grep -h "regs" $OUT/build_*.txt | tee -a $OUT/log.txt
step() {  # name, limit, command...
  local name=$1 limit=$2; shift 2
  timeout $limit "$@" > $OUT/$name.txt 2>&1
  echo "$name rc=$? t=$(( $(date +%s) - s0 ))" | tee -a $OUT/log.txt
  for j in $OUT/bwd_fp32_pass*.json; do [ -e "$j" ] && mv "$j" $OUT/$name.json; done  # (each pass writes one name)
  grep -E "^check|^bench|OVER|FAIL" $OUT/$name.txt | tee -a $OUT/log.txt
}
step passA 100 python3 dev/bwd_fp32_passA.py --check --bench --trials 20
[ -n "$old" ] && TORCH_EXTENSIONS_DIR=/tmp/ext_old step passA_old 45 python3 dev/passA_old.py --bench --trials 20
step passB 40 python3 dev/bwd_fp32_passB.py --bench --trials 20
step passB_t 80 python3 dev/bwd_fp32_passB.py --check --bench --trials 20 --split t
step passB_r 80 python3 dev/bwd_fp32_passB.py --check --bench --trials 20 --split r
step passA_t 100 python3 dev/bwd_fp32_passA.py --check --bench --trials 20 --split t
rm -f dev/passA_old.py
echo "t=$(( $(date +%s) - s0 ))" | tee -a $OUT/log.txt
# everything but the log in one archive (the device call brings back only a few files)
(cd $OUT && tar czf passes.tgz --remove-files $(ls | grep -v -e '^log.txt$' -e '^passes.tgz$'))
