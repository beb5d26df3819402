#!/usr/bin/env bash
# Issue 7's figures on one H200 in one call from the project root (at most 9 minutes):
#   1. bench_one_batch on inkling-slice (dummy weights) at batch 1 and 64, eager and kernels + CUDA graph,
#      and MTP (verify step, draft chain, forced acceptance lengths 1/2.5/4.5/9),
#   2. bench_peer: the transformers port on the same config, batch 1 and the largest of 64/32/... that fits,
#   3. test/gpu/test_sampler_sync.py (sampling never waits for the device),
#   4. bench_serving against a launched inkling-slice dummy server at concurrency 1, 8, 64, 256 with
#      lengths scaled down from 8K/1K to SERVING_INPUT_LEN/SERVING_OUTPUT_LEN to fit (the JSON says so),
# then the results tables (benchmark/results_table.py). Everything goes to $OUT (default
# benchmark/results/gpu_issue7): JSON, logs, server log. Each stage has its own time limit, so one
# hang cannot eat the others; the serving stage gets what is left of the 9 minutes. Exit status:
# non-zero if any stage failed (all still run). The machine has no .git: pass GIT_COMMIT=<sha>.
#   GIT_COMMIT=$(git rev-parse HEAD) bash benchmark/gpu_issue7.sh     (carry .whl when the serving
#   stack is not installed there: it is installed from .whl/ into /tmp/site)
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUDGET=${BUDGET_S:-530}
OUT="${OUT:-$PWD/benchmark/results/gpu_issue7}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
IN_LEN="${SERVING_INPUT_LEN:-1024}"
OUT_LEN="${SERVING_OUTPUT_LEN:-256}"
export PYTHONPATH="$PWD/kernels:$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

echo "== environment"
if ls .whl/*.whl >/dev/null 2>&1; then  # the serving stack's wheels (see shared/device/README.md)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -3
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
"$PY" -c "import fastapi, uvicorn, zmq, xgrammar, orjson, jsonschema, tml_renderers" \
  || echo "!! the serving stack is not importable (carry .whl/): the serving stage will fail"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
"$PY" -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$OUT/gpu.txt"
echo "git commit: ${GIT_COMMIT:-unknown}" | tee -a "$OUT/gpu.txt"

STAGE_TAIL=6
. benchmark/gpu_stage.sh

# One process per batch size: an out-of-memory at batch 64 must not lose the batch-1 figures.
for bs in 1 64; do
  stage "bench_one_batch_bs$bs" 100 "$PY" benchmark/bench_one_batch.py --config slice --batch-size "$bs" --mtp \
    --input-len 1024 --decode-steps 10 --prefill-repeats 1 --fast-path eager kernels --cuda-graph \
    --result-file "$OUT/bench_one_batch_inkling-slice_bs$bs.json"
done

# Same prompt length as bench_one_batch; writes after each batch size, so a time-out keeps batch 1.
stage bench_peer 150 "$PY" benchmark/bench_peer.py --config slice --batch-size 1 64 --input-len 1024 \
  --decode-steps 8 --extra-steps 8 --repeats 2 --result-file "$OUT/bench_peer_inkling-slice.json"

# Sampling must not wait for the device (set_sync_debug_mode("error")); CPU-checked elsewhere.
stage test_sampler_sync 45 "$PY" -m pytest -q -p no:cacheprovider test/gpu/test_sampler_sync.py

# Writes after each concurrency level; the server is stopped on time-out (SIGTERM is handled).
left=$((BUDGET - (SECONDS - START) - 15))
[ "$left" -gt 220 ] && left=220
stage bench_serving "$left" "$PY" benchmark/bench_serving.py --launch-server --server-timeout 150 \
  --max-concurrency 1 8 64 256 --random-input-len "$IN_LEN" --random-output-len "$OUT_LEN" --seed 1 \
  --note "GPU run of benchmark/gpu_issue7.sh: lengths scaled down from 8192/1024 to $IN_LEN/$OUT_LEN and 2 x concurrency requests (at least 8) per level, to fit the 9-minute run" \
  --output-file "$OUT/bench_serving_inkling-slice.json" \
  -- --model-path inkling-slice --load-format dummy --max-running-requests 256 --random-seed 0

echo "== results ($((SECONDS - START)) s)"
"$PY" benchmark/results_table.py "$OUT" 2>&1 | tee "$OUT/results_table.md"
exit $status
