#!/usr/bin/env bash
# Issue 19's adaptive MTP table on one H200 in one call from the project root (about 8 minutes, 10 at most):
# bench_one_batch --mtp --mtp-adaptive-only on inkling-slice (dummy weights, CUDA graphs) at batch 1,
# 8 and 64, BF16 and NVFP4 routed experts: plain decode and every fixed k = 0..8, the adaptive
# chooser (128 timed steps: exploration shows at about its share, and a 64-step window of batch-1
# choices strayed below 0.97 of the best k in one of two H100 runs of the same code) and the chooser from a flat
# prior (1,000 host-only learning steps first), under the public per-depth acceptance curve (a
# benchmark-only forced curve), with the 66-layer extrapolation and each chooser's long-run figure
# (4,000 host-only steps charged the fixed-k step times). k = 0 steps are plain decode steps (the
# decode graph). The machine has no .git: pass GIT_COMMIT=<sha>; each JSON records it. Exit status:
# non-zero if a stage failed.
# CPU smoke test (tiny config, batch 1, a few steps, no CUDA graphs; a few minutes on a busy 2-core machine):
#   SMOKE=1 OUT=/tmp/mtp_smoke benchmark/gpu_mtp_adaptive.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
gpu_begin gpu_mtp_adaptive

if [ "${SMOKE:-0}" = 1 ]; then
  stage mtp_adaptive_smoke 900 "$PY" benchmark/bench_one_batch.py --config tiny --device cpu --batch-size 1 \
    --mtp --mtp-adaptive-only --mtp-adaptive-warmup 2 --mtp-adaptive-steps 4 --input-len 32 --decode-steps 1 \
    --warmup-steps 1 --prefill-repeats 1 --result-file "$OUT/bench_one_batch_mtp_adaptive_smoke_tiny.json"
  exit $status
fi

for experts in bf16 nvfp4; do
  quant=()
  [ "$experts" = nvfp4 ] && quant=(--quantization modelopt_fp4)
  stage "mtp_adaptive_$experts" 290 "$PY" benchmark/bench_one_batch.py --config slice --batch-size 1 8 64 \
    --mtp --mtp-adaptive-only --mtp-adaptive-warmup 40 --mtp-adaptive-steps 128 --mtp-learn-steps 1000 \
    --input-len 1024 --decode-steps 8 --warmup-steps 2 --prefill-repeats 1 --fast-path kernels --cuda-graph \
    "${quant[@]}" --result-file "$OUT/bench_one_batch_mtp_adaptive_${experts}_inkling-slice.json"
done

echo "== done ($((SECONDS - START)) s)"
exit $status
