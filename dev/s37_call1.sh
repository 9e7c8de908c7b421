#!/bin/bash
# The thirty-sixth session's two prepared patches and the forward's trace, in one device call (about 8-9 minutes):
#   bash dev/s37_call1.sh          (run: carry [".whl"]; writes $OUT/*.txt, *.json; tar them if more than 8 files)
# Copies (each a full checkout of the tracked files, its own extension cache): head (this tree), bwdtma
# (dev/chunk_bwd_sm90_s36_tma.patch: the bf16 checkpoint by TMA, docs/bwd-tma-s36.md), tf32sw
# (dev/chunk_sm90_tf32_s36_sw128.patch: the float32 forward on 128-byte boxes, docs/fwd-tf32-sw128-s36.md).
# Gates: bwdtma's gradients bitwise (train_ab: rel-L2 0.00e+00), tf32sw's y and state bitwise (chunk_ab: "bitwise
# bad: 0") and its probe's "PATCH FORMS: PASS".
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out} TORCH_EXTENSIONS_DIR=/tmp/ext
t0=$(date +%s)
for v in bwdtma tf32sw; do
  mkdir -p scratch/v/$v && cp -r *.py *.txt tools dev tests scratch/v/$v/  # (the device's copy may have no .git)
  (cd scratch/v/$v && patch -s -p1 < ../../../dev/$( [ $v = bwdtma ] && echo chunk_bwd_sm90_s36_tma || echo chunk_sm90_tf32_s36_sw128 ).patch)
done
(timeout 200 python3 dev/tma_swizzle_tf32_probe.py --isolate > $OUT/tf32_probe.txt 2>&1; echo "tf32 probe rc $?") &
python3 -c "
import sys; sys.path.insert(0, '.')
from tools.common import prebuild
prebuild(['solution.py', 'scratch/v/bwdtma/solution.py', 'scratch/v/tf32sw/solution.py'], ['chunk_sm90', 'backward_sm90'])
" > $OUT/prebuild.txt 2>&1; echo "prebuild rc $? $(( $(date +%s) - t0 )) s"
wait; grep -E "PASS|FAIL" $OUT/tf32_probe.txt | tail -12
timeout 150 python3 tools/chunk_ab.py --baseline tf32sw=scratch/v/tf32sw/solution.py --dtype float32 --shapes S4,S2,S3 \
  --reps 3 2>&1 | grep -E "bitwise bad|us \[|rror" ; echo "chunk_ab $(( $(date +%s) - t0 )) s"
timeout 150 python3 tools/train_ab.py --units chunk_sm90,backward_sm90 --baseline bwdtma=scratch/v/bwdtma/solution.py \
  --shapes S4-bf16,S2-bf16 --reps 3 --profile 2>&1 | grep -E "rel-L2|min|rror" | grep -v "kernel.*min" | head -20
echo "train_ab $(( $(date +%s) - t0 )) s"
timeout 120 python3 dev/fwd90_trace.py --shapes S4-bf16 --trials 10 > $OUT/fwd90_trace.txt 2>&1; echo "trace rc $?"
tail -30 $OUT/fwd90_trace.txt
echo "trace $(( $(date +%s) - t0 )) s"
(cd scratch/v/bwdtma && timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_backward_sm90.py \
  tests/test_forward_checkpoints.py 2>&1 | tail -1)
(cd scratch/v/tf32sw && timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_chunk_sm90_tf32.py \
  tests/test_backward_sm90_fp32.py 2>&1 | tail -1)
(cd scratch/v/bwdtma && timeout 60 compute-sanitizer --tool racecheck python3 tools/sanitize_smoke.py --backward-sm90-only 2>&1 | tail -1)
(cd scratch/v/tf32sw && timeout 60 compute-sanitizer --tool racecheck python3 tools/sanitize_smoke.py --sm90-only 2>&1 | tail -1)
echo "done $(( $(date +%s) - t0 )) s"
