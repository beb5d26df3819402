#!/usr/bin/env bash
# Issue 8's figures on one H200 in one call from the project root (at most 9 minutes):
#   1. test/gpu/test_mtp_gpu.py: greedy output with MTP (verify and draft steps replayed from CUDA
#      graphs) equals greedy output without it; the figures go to $OUT/mtp_gpu_equality.json,
#   2. bench_one_batch --mtp on inkling-slice (dummy weights) at batch 1 and 64: the verify step and
#      the draft chain, eager and from their CUDA graphs, against their floors, at forced acceptance
#      lengths 1/2.5/4.5/9 (benchmark only), extrapolated to 66 layers,
#   3. profile_draft_step.py at batch 1 and 64: the draft step's kernels,
# then the rest of test/gpu (kernels against references, sampling without host syncs; MTP under TP 2
# when two GPUs are present) and the attention kernel tests. The machine has no .git: pass GIT_COMMIT=<sha>. Exit status: non-zero if any
# stage failed (all still run).
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
gpu_begin gpu_mtp

for bs in 1 64; do
  stage "bench_one_batch_bs$bs" 130 "$PY" benchmark/bench_one_batch.py --config slice --batch-size "$bs" --mtp \
    --input-len 1024 --decode-steps 10 --prefill-repeats 1 --fast-path kernels --cuda-graph \
    --result-file "$OUT/bench_one_batch_mtp_inkling-slice_bs$bs.json"
done

for bs in 1 64; do
  stage "profile_draft_step_bs$bs" 60 "$PY" benchmark/profile_draft_step.py --batch-size "$bs" --accept 4 \
    --out "$OUT/profile_draft_step_inkling-slice_bs$bs.json"
done

MTP_GPU_REPORT="$OUT/mtp_gpu_equality.json" stage test_mtp_gpu "${TEST_LIMIT_S:-270}" \
  "$PY" -m pytest -q -x -p no:cacheprovider test/gpu/test_mtp_gpu.py

stage test_gpu_rest 200 "$PY" -m pytest -q -rA -p no:cacheprovider test/gpu --ignore=test/gpu/test_mtp_gpu.py \
  test/kernels/test_extend_attention.py test/kernels/test_decode_attention.py

echo "== done ($((SECONDS - START)) s)"
exit $status
