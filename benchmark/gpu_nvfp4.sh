#!/usr/bin/env bash
# Issue 15 on one H200 in one call (at most 10 minutes): the NVFP4 kernel tests on the GPU, bench_one_batch
# on inkling-slice with NVFP4 and with BF16 routed experts (batch 1 and 64, CUDA graphs; MTP at forced
# acceptance 2.5 / 4.5 with NVFP4), and a serving check of the NVFP4 slice through sglang.Engine. Needs GIT_COMMIT.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
OUT="${OUT:-$PWD/benchmark/results/gpu_nvfp4}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/kernels:$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "git commit: ${GIT_COMMIT:-unknown}" | tee -a "$OUT/gpu.txt"
. benchmark/gpu_stage.sh

stage test_nvfp4_kernels 110 "$PY" -m pytest -q -x -p no:cacheprovider test/kernels/test_fused_moe_nvfp4.py
COMMON=(--config slice --batch-size 1 64 --input-len 1024 --decode-steps 10 --prefill-repeats 1 --fast-path kernels
  --cuda-graph)
stage bench_one_batch_nvfp4 220 "$PY" benchmark/bench_one_batch.py "${COMMON[@]}" --quantization modelopt_fp4 \
  --mtp --mtp-accept 2.5 4.5 --result-file "$OUT/bench_one_batch_nvfp4_inkling-slice.json"
stage bench_one_batch_bf16 130 "$PY" benchmark/bench_one_batch.py "${COMMON[@]}" \
  --result-file "$OUT/bench_one_batch_bf16_inkling-slice.json"
stage serve_nvfp4 120 "$PY" benchmark/gpu_nvfp4_serve_check.py "$OUT/gpu_nvfp4_serve_check.json"
echo "== done ($((SECONDS - START)) s)"
exit $status
