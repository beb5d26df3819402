#!/usr/bin/env bash
# Issue 20's "no compile after warm-up" with MTP serving, on one H200 from the project root (about 4
# minutes): the NVFP4 slice (dummy weights) served with MTP at a fixed 8 drafts a step
# (--no-speculative-adaptive, so every depth, the 9-token verify and the draft graphs run in every
# step; with dummy weights the adaptive chooser would mostly pick plain decode), 2K-token prompts at
# concurrency 1, 4 and 16, then the server log's count of Triton compiles after warm-up (each with
# the variant's specialization, jit_watch). JSON to $OUT; the machine has no .git: pass GIT_COMMIT=<sha>.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
gpu_begin gpu_mtp_serve
NAME=inkling-slice-nvfp4
SERVER=(--model-path inkling-slice --load-format dummy --quantization modelopt_fp4 --served-model-name "$NAME"
  --random-seed 0 --speculative-algorithm MTP --no-speculative-adaptive)
RESULT="$OUT/bench_serving_${NAME}_mtp_fixed8.json"
stage serving_mtp "${LIMIT_S:-240}" "$PY" benchmark/bench_serving.py --launch-server --server-timeout 150 \
  --random-input-len 2048 --random-output-len 128 --seed 1 --max-concurrency 1 4 16 --num-prompts 2 8 32 \
  --note "benchmark/gpu_mtp_serve_check.sh: MTP with 8 drafts a step, dummy weights (drafts rarely accepted)" \
  --output-file "$RESULT" -- "${SERVER[@]}"
LOG="${RESULT%.json}.server.log"
n=missing
[ -f "$LOG" ] && n=$(grep -c "compiled a kernel after warm-up" "$LOG")  # (exits 1 on a count of 0)
echo "== Triton compiles after warm-up in the MTP server: $n" | tee -a "$OUT/gpu.txt"
grep "compiled a kernel after warm-up" "$LOG" 2>/dev/null | head -5 | cut -c1-1500
[ "$n" = 0 ] || status=1
exit $status
