#!/usr/bin/env bash
# Issue 20's serving table on one H200 from the project root, under 5 minutes in all (BUDGET, s):
#   0. test/gpu/test_mixed_chunk_gpu.py: mixed steps (riders through the extend kernels) give the same
#      greedy tokens and logprobs as plain decode (graphs) on inkling-tiny in fp32; test_overlap_gpu.py
#      and test_sampler_sync.py: overlapped decode and mixed steps (snapshots included) and the
#      sampling path never wait for the device; test_graph_staging.py: decode staged into the graphs'
#      inputs gives eager decode's tokens;
#   1. engine_timings.py: the slice's own prefill of one 8K prompt and its CUDA-graph decode step at
#      batch 1, 16, 32, 48, 64, 128, 256 with 8.7K-token contexts (a separate measured stage: the GPU
#      holds one copy of the slice at a time), and the prefill with 16, 32, 63 decode riders (mixed steps);
#   2. bench_serving with --enable-mixed-chunk (the default without MTP): 8K in / 1K out at
#      concurrency 64, 1, 16, 256 (most important first: a time-out keeps the levels done); prompts per
#      level 64, 2, 16, 96 (the 256 level uses 96 prompts: the JSON says so);
#   3. the same server with --no-enable-mixed-chunk at concurrency 64, then 16, with what is left;
#   4. CHUNKS="2048 4096" (optional): concurrency 64 again with mixed chunks under each
#      --chunked-prefill-size (more, smaller mixed steps give the running requests more decode
#      tokens while the wave prefills), one server each, in bench_serving_<model>_mixed_chunk<N>.json.
# The time left after stages 0-1 goes 55% / 45% to stages 2 / 3; each writes its JSON after every
# level and stops its server on time-out, so a cut run keeps the levels it finished.
# Each level's JSON row carries its back-to-back figure from stage 1 (benchmark/back_to_back.py).
# JSON goes to $OUT (default benchmark/results/gpu_serving). The machine has no .git: pass GIT_COMMIT=<sha>.
# QUANT=modelopt_fp4: NVFP4 routed experts (dummy codes) in the engine timings and the servers, served as
# <model>-nvfp4 (its own tables); LEVELS / PROMPTS override the mixed stage's concurrency levels and prompts;
# PLAIN_LEVELS (default "64 16", one prompt per request slot) the plain stage's, empty to skip it;
# SKIP_TESTS=1 skips stage 0, ENGINE_TIMINGS=<file> reuses that engine_timings JSON instead of stage 1.
# Smoke test on a CPU: MODEL=inkling-tiny IN_LEN=64 OUT_LEN=8 benchmark/gpu_serving.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
BUDGET="${BUDGET:-290}"  # the lead's limit; a larger one lets the later levels finish
MODEL="${MODEL:-inkling-slice}"
IN_LEN="${IN_LEN:-8192}"
OUT_LEN="${OUT_LEN:-1024}"
CONFIG=slice
[ "$MODEL" = inkling-tiny ] && CONFIG=tiny
QUANT="${QUANT:-}"
NAME="$MODEL${QUANT:+-nvfp4}"
QARGS=()
[ -n "$QUANT" ] && QARGS=(--quantization "$QUANT")
read -r -a LEVELS <<< "${LEVELS:-64 1 16 256}"
read -r -a PROMPTS <<< "${PROMPTS:-64 2 16 96}"
# Stage and server logs end up in $OUT/logs.tgz (the device returns at most 8 files).
LOGS="${LOGS:-/tmp/gpu_serving_logs}"
if command -v nvidia-smi >/dev/null; then gpu_begin gpu_serving; else
  START=$SECONDS; OUT="${OUT:-$PWD/benchmark/results/gpu_serving}"; mkdir -p "$OUT" "$LOGS"; PY="${PYTHON:-python3}"; status=0
  export PYTHONPATH="$PWD/kernels:$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
left() { echo $((BUDGET - (SECONDS - START))); }

[ "$CONFIG" = slice ] && [ -z "${SKIP_TESTS:-}" ] && stage test_mixed_gpu 130 "$PY" -m pytest -q -x -p no:cacheprovider test/gpu/test_mixed_chunk_gpu.py \
  test/gpu/test_overlap_gpu.py test/gpu/test_sampler_sync.py test/gpu/test_graph_staging.py
if [ -n "${ENGINE_TIMINGS:-}" ]; then  # this commit's timings from an earlier call: reuse them
  cp "$ENGINE_TIMINGS" "$OUT/engine_timings_$NAME.json"
else
  stage engine_timings 75 "$PY" benchmark/engine_timings.py --config "$CONFIG" --input-len "$IN_LEN" \
    --output-len "$OUT_LEN" --batch-size 1 16 32 48 64 128 256 --decode-steps 10 --sustained-steps 100 \
    --prefill-repeats 2 --mixed-riders 16 32 63 "${QARGS[@]}" --out "$OUT/engine_timings_$NAME.json"
fi
ENGINE=()
[ -f "$OUT/engine_timings_$NAME.json" ] && ENGINE=(--engine-timings "$OUT/engine_timings_$NAME.json")

SERVER=(--model-path "$MODEL" --max-running-requests 256 --random-seed 0 "${QARGS[@]}")
[ -n "$QUANT" ] && SERVER+=(--served-model-name "$NAME")
[ "$CONFIG" = slice ] && SERVER+=(--load-format dummy)
BENCH=(benchmark/bench_serving.py --launch-server --server-timeout 150 --random-input-len "$IN_LEN"
  --random-output-len "$OUT_LEN" --seed 1 "${ENGINE[@]}")
NOTE="benchmark/gpu_serving.sh: $IN_LEN in / $OUT_LEN out; prompts per level in num_prompts"
lim=$(( $(left) * 55 / 100 ))
stage serving_mixed "$lim" "$PY" "${BENCH[@]}" --max-concurrency "${LEVELS[@]}" --num-prompts "${PROMPTS[@]}" \
  --note "$NOTE" --output-file "$OUT/bench_serving_${NAME}_mixed.json" -- "${SERVER[@]}" --enable-mixed-chunk
read -r -a PLAIN <<< "${PLAIN_LEVELS-64 16}"
lim=$(( $(left) - 5 ))
[ "$lim" -gt 20 ] && [ ${#PLAIN[@]} -gt 0 ] && stage serving_plain "$lim" "$PY" "${BENCH[@]}" \
  --max-concurrency "${PLAIN[@]}" --num-prompts "${PLAIN[@]}" --note "$NOTE" \
  --output-file "$OUT/bench_serving_${NAME}_plain.json" -- "${SERVER[@]}" --no-enable-mixed-chunk
for n in ${CHUNKS:-}; do
  lim=$(( $(left) - 5 ))
  [ "$lim" -gt 60 ] && stage "serving_chunk$n" "$lim" "$PY" "${BENCH[@]}" --max-concurrency 64 --num-prompts 64 \
    --note "$NOTE; --chunked-prefill-size $n" --output-file "$OUT/bench_serving_${NAME}_mixed_chunk$n.json" -- \
    "${SERVER[@]}" --enable-mixed-chunk --chunked-prefill-size "$n"
done
"$PY" benchmark/results_table.py "$OUT" --include-cpu 2>&1 | tee "$OUT/results_table.md"
mv "$OUT"/*.server.log "$LOGS"/ 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$LOGS" .
echo "== done ($((SECONDS - START)) s)"
exit $status
