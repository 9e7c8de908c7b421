#!/bin/bash
# One device call: build once (timed), then the steps named in $@, each with a time limit, output in $OUT.
#   bash tools/device_run.sh buildtimes tests eval kernelbench sanitize bench sweep variants ncu wmma mma wgmma configs
#                            decode_dev decode_sanitize varlen_sanitize serving varlen_bench
#                            decode_bench tf32 sm90_sanitize bench_all bwd_sanitize train bwd_ab bwd_probe
#                            bwd_sm90_san
# (kernelbench needs KernelBench's src/ in .kb/src, carried: tools/kernelbench_compare.py; bwd_ab reads
#  BWD_AB_ARGS, e.g. --baseline old=scratch/old.py with that copy made by git show and scratch carried)
set -u
export TORCH_EXTENSIONS_DIR=/tmp/ext PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
t0=$(date +%s.%N)
python3 -c "import solution; solution.build()" 2>&1 | tail -3
echo "first import + build() of every unit $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" | tee -a $OUT/log.txt
for step in "$@"; do
  echo "== $step" | tee -a $OUT/log.txt
  case $step in
    tests) timeout 400 python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tail -4 | tee -a $OUT/log.txt ;;
    buildtimes) timeout 300 python3 tools/build_times.py --repeat ${BUILD_REPEAT:-1} 2>&1 | tail -8 | tee -a $OUT/log.txt ;;
    wmma) timeout 300 python3 dev/chunk_wmma.py --trials 30 2>&1 | tail -12 | tee -a $OUT/log.txt ;;
    mma) timeout 120 python3 dev/mma_peak.py 2>&1 | tail -8 | tee -a $OUT/log.txt ;;
    wgmma) timeout 180 python3 dev/wgmma_probe.py 2>&1 | grep -v Warn | tail -12 | tee -a $OUT/log.txt ;;
    bench) timeout 300 python3 bench.py --shapes S1,S2,S3,S2-bf16,S3-bf16 --trials 30 --eager-max-s 0.1 --out $OUT 2>&1 | tee $OUT/bench.log | tail -8 | tee -a $OUT/log.txt ;;
    serving) timeout 260 python3 bench.py --shapes "" --decode --varlen --trials 20 --out $OUT 2>&1 | tee $OUT/bench_serving.log | grep -v "^{" | tail -30 | tee -a $OUT/log.txt ;;
    decode_bench) timeout 200 python3 bench.py --shapes "" --decode --trials 20 --out $OUT 2>&1 | tee $OUT/bench_decode.log | grep -v "^{" | tail -24 | tee -a $OUT/log.txt ;;
    tf32) timeout 240 python3 dev/tf32_probe.py --trials 10 2>&1 | grep -v Warn | tail -60 | tee -a $OUT/log.txt ;;
    varlen_bench) timeout 200 python3 bench.py --shapes "" --varlen --trials 20 --out $OUT 2>&1 | tee $OUT/bench_varlen.log | grep -v "^{" | tail -20 | tee -a $OUT/log.txt ;;
    sweep) timeout 400 python3 bench.py --sweep --trials 30 --out $OUT 2>&1 | grep -v "^{" | tail -20 | tee -a $OUT/log.txt ;;
    eval) for p in fp32 fp16 bf16; do timeout 120 python3 eval.py --precision $p 2>&1 | tail -15 | tee -a $OUT/log.txt; done ;;
    kernelbench) timeout 300 python3 tools/kernelbench_compare.py --kernelbench .kb/src --precisions fp32,fp16,bf16 \
        --seeds 0,1,2,3,4,5,6,7,8,9 --seq-lens 128,1024 --perf-trials 30 2>&1 | grep "KernelBench eval" | tee -a $OUT/log.txt ;;
    parallel) timeout 200 python3 dev/parallel_vs_recurrent.py ${PVR_ARGS:---no-grid} 2>&1 | grep -v Warn | tail -30 | tee -a $OUT/log.txt ;;
    variants) timeout 400 python3 tools/variants.py ${VARIANTS:-GR_PDL=0} --trials 30 2>&1 | grep -v Warn | tail -20 | tee -a $OUT/log.txt ;;
    ncu)
      for dt in ${NCU_DTYPES:-bfloat16 float32}; do
        timeout 120 bash tools/ncu_metrics.sh "chunk_(tf32|bf16)_kernel" 8 2048 16 128 $dt 2>&1 | grep -v "^==PROF==\|Warn" | tail -26 | tee -a $OUT/log.txt
      done ;;
    configs) timeout 300 python3 dev/chunk_configs.py --trials 15 2>&1 | tail -60 | tee -a $OUT/log.txt ;;
    decode_dev) timeout 200 python3 dev/decode_persistent.py --trials 40 2>&1 | tail -8 | tee -a $OUT/log.txt ;;
    varlen_sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 150 compute-sanitizer --tool $tool python3 tools/sanitize_smoke.py --varlen-only 2>&1 | tail -1 | tee -a $OUT/log.txt
      done ;;
    sm90_sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 150 compute-sanitizer --tool $tool python3 tools/sanitize_smoke.py --sm90-only 2>&1 | tail -1 | tee -a $OUT/log.txt
      done ;;
    bench_all) timeout 300 python3 bench.py --shapes S0,S1,S2,S3,S4,S2-bf16,S3-bf16,S4-bf16 --trials 20 --eager-max-s 0.05 --out $OUT 2>&1 | tee $OUT/bench.log | grep -v "^{" | tail -12 | tee -a $OUT/log.txt ;;
    # fla's chunk backward autotunes on first use: about 130 s a shape, so the issue's shapes alone, 5 trials
    train) timeout 560 python3 bench.py --shapes "" --train --train-shapes ${TRAIN_SHAPES:-S2-bf16,S2,S4-bf16,S3-bf16} --fla-640-guard-off --trials 5 --out $OUT 2>&1 | tee $OUT/bench_train.log | grep -v "^{" | tail -20 | tee -a $OUT/log.txt ;;
    bwd_probe) timeout 200 python3 dev/bwd_sm90_probe.py --trials 10 2>&1 | grep -v "WARNING\|^W1" | tail -28 | tee -a $OUT/log.txt ;;
    bwd_sm90_san)
      for tool in memcheck racecheck synccheck; do
        timeout 150 compute-sanitizer --tool $tool --print-limit 12 python3 tools/sanitize_smoke.py --backward-sm90-only \
          > $OUT/bwd_sm90_san_$tool.txt 2>&1
        grep "SUMMARY\|rror\|done" $OUT/bwd_sm90_san_$tool.txt | head -4 | tee -a $OUT/log.txt
      done ;;
    bwd_sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 150 compute-sanitizer --tool $tool python3 tools/sanitize_smoke.py --backward-only 2>&1 | tail -1 | tee -a $OUT/log.txt
      done ;;
    decode_sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 100 compute-sanitizer --tool $tool python3 tools/sanitize_smoke.py --decode-only 2>&1 | tail -1 | tee -a $OUT/log.txt
      done ;;
    sanitize)
      timeout 200 compute-sanitizer --tool memcheck python3 tools/sanitize_smoke.py 2>&1 | tail -3 | tee -a $OUT/log.txt
      timeout 200 compute-sanitizer --tool racecheck python3 tools/sanitize_smoke.py 2>&1 | tail -3 | tee -a $OUT/log.txt ;;
  esac
done
