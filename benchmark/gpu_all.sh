#!/usr/bin/env bash
# The GPU figures of issues 15, 16, 19 and 20 on one H200 in one call from the project root (at most
# 10 minutes; each stage has its own limit so one hang cannot eat the rest):
#   1. the fused decode kernels' GPU tests and test/gpu/test_kernel_warmup.py (no compile after warm-up),
#   2. bench_one_batch on inkling-slice, CUDA graphs, batch 1 and 64: NVFP4 routed experts (with the MTP
#      tables: forced acceptance 2.5 / 4.5, and fixed k = 1..8 vs adaptive under the public per-depth
#      curve at batch 1, 8, 64) and BF16 experts,
#   3. the NVFP4 slice served through sglang.Engine (CUDA graphs, greedy repeat identical),
#   4. bench_prefix_cache on the slice (exact resume, shared prefix, TTFT cold vs cached, follow-ups),
#   5. profile_decode --compare at batch 1 (8K context): every kernel of a step, unfused then fused.
# JSON goes to $OUT, the stage logs to $OUT/logs.tgz. The machine has no .git: pass GIT_COMMIT=<sha>.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
LOGS="${LOGS:-/tmp/gpu_all_logs}"  # $OUT brings back at most 8 files: the logs come back as one archive
gpu_begin gpu_all

stage tests 90 "$PY" -m pytest -q -x -p no:cacheprovider test/kernels/test_qkvr_epilogue.py \
  test/kernels/test_sconv_norm.py test/gpu/test_kernel_warmup.py
COMMON=(--config slice --batch-size 1 64 --input-len 1024 --decode-steps 10 --prefill-repeats 1 --fast-path kernels
  --cuda-graph)
stage bench_nvfp4 120 "$PY" benchmark/bench_one_batch.py "${COMMON[@]}" --quantization modelopt_fp4 \
  --result-file "$OUT/bench_one_batch_nvfp4_inkling-slice.json"
stage bench_nvfp4_mtp 170 "$PY" benchmark/bench_one_batch.py --config slice --batch-size 1 8 64 --input-len 1024 \
  --decode-steps 10 --prefill-repeats 1 --fast-path kernels --cuda-graph --quantization modelopt_fp4 --mtp \
  --mtp-accept 2.5 4.5 --result-file "$OUT/bench_one_batch_mtp_nvfp4_inkling-slice.json"
stage bench_bf16 60 "$PY" benchmark/bench_one_batch.py "${COMMON[@]}" \
  --result-file "$OUT/bench_one_batch_bf16_inkling-slice.json"
stage serve_nvfp4 60 "$PY" benchmark/gpu_nvfp4_serve_check.py "$OUT/gpu_nvfp4_serve_check.json"
stage prefix_cache 120 "$PY" benchmark/bench_prefix_cache.py --config slice --device cuda \
  --out "$OUT/prefix_cache_inkling-slice.json"
stage profile_decode_bs1 60 "$PY" benchmark/profile_decode.py --batch-size 1 --input-len 8192 --compare \
  --out "$OUT/profile_decode_compare_bs1.json"
tar -czf "$OUT/logs.tgz" -C "$LOGS" .
echo "== done ($((SECONDS - START)) s)"
exit $status
