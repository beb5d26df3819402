#!/usr/bin/env bash
# fp8 draft weights (--speculative-draft-model-quantization fp8) on one GPU in one call from the project
# root (about 6 minutes): the W8A16 GEMV against cuBLAS BF16 at an MTP depth's shapes, its kernel tests
# in real Triton, then the adaptive MTP table (NVFP4 experts, 32K draft vocabulary, public MTP8 curve
# forced) at batch 1 and 8 with BF16 depths (the baseline, same card) and with fp8 depths. The machine
# has no .git: pass GIT_COMMIT=<sha>; each JSON records it. Exit status: non-zero if a stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
gpu_begin gpu_mtp_fp8_drafts
if grep -q H200 "$OUT/gpu.txt"; then SUFFIX=""; else SUFFIX="_h100"; fi
stage prebuild 120 "$PY" benchmark/prebuild_cuda.py
stage fp8_gemv 60 "$PY" benchmark/bench_fp8_gemv.py --out "$OUT/bench_fp8_gemv${SUFFIX}.json"
stage fp8_gemv_tests 60 "$PY" -m pytest -q -rs -x test/kernels/test_fp8_gemv.py
for drafts in bf16 fp8; do
  dq=()
  [ $drafts = fp8 ] && dq=(--mtp-draft-quantization fp8)
  stage "mtp_$drafts" 170 "$PY" benchmark/bench_one_batch.py --config slice --batch-size 1 8 \
    --mtp --mtp-adaptive-only --mtp-adaptive-warmup 40 --mtp-adaptive-steps 128 --mtp-learn-steps 1000 \
    --input-len 1024 --decode-steps 8 --warmup-steps 2 --prefill-repeats 1 --fast-path kernels --cuda-graph \
    --quantization modelopt_fp4 --mtp-token-map-size 32768 "${dq[@]}" \
    --result-file "$OUT/bench_one_batch_mtp_adaptive_nvfp4_map32k_${drafts}drafts_inkling-slice${SUFFIX}.json"
  echo "compiles after warm-up ($drafts drafts): $(grep -c 'after warm-up' "${LOGS:-$OUT}/mtp_$drafts.log")"
done
echo "== done ($((SECONDS - START)) s)"
exit $status
