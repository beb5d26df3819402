#!/usr/bin/env bash
# Issue 20 items 1 and 4 on one H200 in one call from the project root (at most 9 minutes):
#   1. the fused decode kernels' tests on CUDA (real Inkling shapes) and test/gpu/test_kernel_warmup.py
#      (no Triton compile after start-up warm-up),
#   2. bench_decode_ops at batch 1 and 64: each fused op and the launches it replaced, against
#      bytes / 4.3 TB/s (q/k/v/r + convs + norms, conv + add + norm, conv + add, router; decode
#      attention at 8K / 128K and the 512 window),
#   3. profile_decode --compare at batch 1 (8K context) and 64 (1K): every kernel of a step, unfused then fused,
#   4. bench_one_batch at batch 1 and 64 with CUDA graphs: the step and per-layer floor fractions.
# JSON goes to $OUT (default benchmark/results/gpu_floor). The machine has no .git: pass GIT_COMMIT=<sha>.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
gpu_begin gpu_floor

stage tests 150 "$PY" -m pytest -q -x -p no:cacheprovider test/kernels/test_qkvr_epilogue.py \
  test/kernels/test_sconv_norm.py test/kernels/test_router.py test/kernels/test_decode_attention.py \
  test/kernels/test_model_wiring.py test/gpu/test_kernel_warmup.py test/gpu/test_triton_backend.py
stage bench_decode_ops 90 "$PY" benchmark/bench_decode_ops.py --batch-sizes 1 64 \
  --result-file "$OUT/bench_decode_ops_inkling.json"
# Batch 1 at an 8K context; batch 64 at 1K (its prefill is one extend of all 64 prompts).
for run in "1 8192" "64 1024"; do
  set -- $run
  stage "profile_decode_bs$1" 80 "$PY" benchmark/profile_decode.py --batch-size "$1" --input-len "$2" \
    --compare --out "$OUT/profile_decode_compare_bs$1.json"
done
for bs in 1 64; do
  stage "bench_one_batch_bs$bs" 100 "$PY" benchmark/bench_one_batch.py --config slice --batch-size "$bs" \
    --input-len 1024 --decode-steps 10 --prefill-repeats 1 --fast-path kernels --cuda-graph \
    --result-file "$OUT/bench_one_batch_inkling-slice_bs$bs.json"
done
exit $status
