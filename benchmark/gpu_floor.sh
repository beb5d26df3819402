#!/usr/bin/env bash
# Issue 20 item 1 and the layer floors of issue 15 on one H200 in one call from the project root
# (at most 9 minutes):
#   1. the decode kernels' tests on CUDA (real Inkling shapes) and test/gpu/test_kernel_warmup.py
#      (no Triton compile after start-up warm-up),
#   2. bench_decode_ops at batch 1 and 64: each fused op and the launches it replaced, against
#      bytes / 4.3 TB/s (q/k/v/r + convs + norms, conv + add + norm, conv + add, router; decode
#      attention at 8K / 128K and the 512 window, also at the split coverages in SPLIT_COVERAGE),
#   3. profile_decode at batch 1 (8K context) and 64 (1K) with NVFP4 experts: every kernel of a step,
#   4. bench_one_batch at batch 1, 8 and 64 with CUDA graphs, NVFP4 and BF16 experts: the step and
#      per-layer floor fractions.
# JSON goes to $OUT (default benchmark/results/gpu_floor). The machine has no .git: pass GIT_COMMIT=<sha>.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
gpu_begin gpu_floor

stage tests 150 "$PY" -m pytest -q -x -p no:cacheprovider test/kernels/test_qkvr_epilogue.py \
  test/kernels/test_sconv_norm.py test/kernels/test_router.py test/kernels/test_decode_attention.py \
  test/kernels/test_model_wiring.py test/gpu/test_kernel_warmup.py ${EXTRA_TESTS:-}
# shellcheck disable=SC2086  # the list is split on purpose
stage bench_decode_ops 120 "$PY" benchmark/bench_decode_ops.py --batch-sizes ${OPS_BATCH_SIZES:-1 64} \
  --split-coverage ${SPLIT_COVERAGE:-} --result-file "$OUT/bench_decode_ops_inkling.json"
# Batch 1 at an 8K context; batch 64 at 1K (its prefill is one extend of all 64 prompts).
for run in "1 8192" "64 1024"; do
  set -- $run
  stage "profile_decode_bs$1" 80 "$PY" benchmark/profile_decode.py --batch-size "$1" --input-len "$2" \
    --quantization modelopt_fp4 --out "$OUT/profile_decode_nvfp4_bs$1.json"
done
COMMON=(--config slice --batch-size 1 8 64 --input-len 1024 --decode-steps 10 --prefill-repeats 1
  --fast-path kernels --cuda-graph)
stage bench_nvfp4 90 "$PY" benchmark/bench_one_batch.py "${COMMON[@]}" --quantization modelopt_fp4 \
  --result-file "$OUT/bench_one_batch_nvfp4_inkling-slice.json"
stage bench_bf16 90 "$PY" benchmark/bench_one_batch.py "${COMMON[@]}" \
  --result-file "$OUT/bench_one_batch_bf16_inkling-slice.json"
exit $status
