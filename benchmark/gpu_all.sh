#!/usr/bin/env bash
# The GPU figures of issues 15, 19 and 20 on one H200 in one call from the project root (under 10
# minutes; each stage has its own limit so one hang cannot eat the rest):
#   1. GPU tests: the CUDA NVFP4 decode kernels against the reference (the row ring, the default,
#      and the chunk ring), the fused decode kernels, no Triton compile after warm-up, the overlapped
#      decode step without host syncs,
#   2. bench_moe_nvfp4 at inkling-slice width: the default dispatch (CUDA kernels) beside the build
#      variants of SWEEP (below), batch 1, 8 and 64; decode below uses the fastest if the tests passed,
#   3. bench_one_batch on inkling-slice with NVFP4 experts, CUDA graphs, batch 1 and 64 (per-layer floor),
#   4. the same with MTP: forced acceptance 2.5 / 4.5; then fixed k = 1..8 against the adaptive chooser
#      under the public per-depth curve at batch 1, 8, 64 (benchmark/mtp_adaptive.py), NVFP4 and BF16,
#   5. the batch-1 draft step with and without a 32K draft vocabulary (profile_draft_step.py),
#      the NVFP4 slice served through sglang.Engine (CUDA graphs, greedy repeat identical),
#   6. if the time is left, the overlap scheduler: HTTP TPOT at concurrency 1 with and without it;
#   on demand (not in the default STAGES): tests_new (GPU tests no GPU has run yet), sched_profile
#   (profile_scheduler_step.py: the serving decode step's host part at batch 64) and sink_gemv (the
#   sinks' Triton GEMVs against cuBLAS, alone and in the fused MoE).
# STAGES picks stages by name (see below). JSON goes to $OUT, the stage logs to $OUT/logs.tgz (at most
# 8 files come back). The machine has no .git of this commit: pass GIT_COMMIT=<sha>.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmark/gpu_stage.sh
LOGS="${LOGS:-/tmp/gpu_all_logs}"
gpu_begin gpu_all
export PYTHONUNBUFFERED=1

# STAGES (default all): the stages to run, by name, e.g. STAGES="tests bench_moe bench_nvfp4 mtp_adaptive_nvfp4".
STAGES="${STAGES:-tests bench_moe bench_nvfp4 bench_nvfp4_mtp mtp_adaptive_nvfp4 mtp_adaptive_bf16 draft_map serve_nvfp4 overlap}"
want() { [[ " $STAGES " == *" $1 "* ]]; }
# The MoE build sweep: the shipped default (sinks on a side stream, two routed launches, the cp.async
# row ring of 3 stages, copies of whole 128-byte row spans, read by the lean loop in CTAs of 2 warps)
# beside the build it replaced (4 warps, 4 stages, the generic loop).
SWEEP=(default "c:1,4,8,256,4,1,0,8,1,1,1,8,4,0,1")
# SWEEP_SPECS (space-separated) replaces it, e.g. SWEEP_SPECS=default for the shipped build alone.
[ -n "${SWEEP_SPECS:-}" ] && read -r -a SWEEP <<< "$SWEEP_SPECS"
# Every CUDA MoE library the tests and the sweep load, built in parallel first.
stage prebuild 120 "$PY" benchmark/prebuild_cuda.py "${SWEEP[@]}"
M=test/kernels/test_fused_moe_nvfp4.py
CASES=("$M::test_cuda_decode_matches_reference" "$M::test_side_stream_sinks_replay_from_a_cuda_graph"
  "$M::test_cuda_decode_is_the_default_and_skips_foreign_ids" "$M::test_blas_sinks_match_a_brute_force"
  "$M::test_default_build_serves_scales_off_8_byte_boundaries" "$M::test_sink_plans_replay_from_a_cuda_graph")
# GPU_TESTS (default: these) narrows the test stage; a failure there keeps decode on the shipped build.
GPU_TESTS="${GPU_TESTS:-${CASES[*]} test/gpu/test_kernel_warmup.py test/kernels/test_qkvr_epilogue.py
  test/kernels/test_sconv_norm.py test/gpu/test_overlap_gpu.py test/gpu/test_mtp_sample_accept_sync.py}"
tests_failed=0
if want tests; then
  before=$status status=0
  # One process: both rings have passed on the GPU (the row ring's cases at f49cebb), and the default
  # build is the row ring, so its cases apart would isolate nothing (test ids still name the ring: -k).
  # shellcheck disable=SC2086  # the list is split on purpose
  stage tests 240 "$PY" -m pytest -q -p no:cacheprovider $GPU_TESTS
  tests_failed=$status status=$((before | status))
fi
# tests_new (not in the default STAGES): GPU tests of paths no GPU has run yet (the sampled MTP rule's
# graphs, the grammar draft graphs, mixed chunks), in a process apart from the others; they decide
# nothing below.
if want tests_new; then
  before=$status status=0
  # shellcheck disable=SC2086
  # 360 s: the bf16 slice with MTP starts three engines of about 95 s each (cut at 240 s at cc98e2a).
  stage tests_new 360 "$PY" -m pytest -q --tb=short -p no:cacheprovider ${NEW_GPU_TESTS:-test/kernels/test_sink_gemv.py test/gpu/test_mtp_sampled_graph.py
    test/gpu/test_mtp_gpu.py test/gpu/test_mixed_chunk_gpu.py}
  status=$((before | status))
fi
want bench_moe && stage bench_moe 160 "$PY" benchmark/bench_moe_nvfp4.py --no-bf16 --replays 10 --batch-sizes 1 8 64 \
  --tiles "${SWEEP[@]}" \
  --result-file "$OUT/bench_moe_nvfp4_inkling-slice.json"
# sink_gemv (not in the default STAGES): the BF16 sinks alone in cuBLAS and Triton forms, then the fused MoE
# with cuBLAS for its sinks (a file of its own: the README's MoE table stays the shipped path's, the GEMVs).
if want sink_gemv; then
  stage sink_gemms 90 "$PY" benchmark/bench_sink_gemms.py --batch-sizes 1 8 16 32 64 \
    --out "$OUT/bench_sink_gemms_inkling.json"
  stage bench_moe_blas 120 "$PY" benchmark/bench_moe_nvfp4.py --no-bf16 --replays 10 --batch-sizes 1 8 64 \
    --sink-path blas --result-file "$OUT/bench_moe_nvfp4_blas_sinks_inkling-slice.json"
fi
# Decode is timed with the build the sweep found fastest (moe_build.py --pick; "" is the shipped default).
MOE_BUILD=""
[ -f "$OUT/bench_moe_nvfp4_inkling-slice.json" ] && [ "$tests_failed" = 0 ] && \
  MOE_BUILD=$("$PY" benchmark/moe_build.py --pick "$OUT/bench_moe_nvfp4_inkling-slice.json" 2>/dev/null)
echo "== MoE build for decode: '${MOE_BUILD}'" | tee -a "$OUT/gpu.txt"
COMMON=(--config slice --input-len 1024 --decode-steps 10 --prefill-repeats 1 --fast-path kernels --cuda-graph
  --quantization modelopt_fp4 --moe-build "$MOE_BUILD")
want bench_nvfp4 && stage bench_nvfp4 75 "$PY" benchmark/bench_one_batch.py "${COMMON[@]}" --batch-size 1 64 \
  --result-file "$OUT/bench_one_batch_nvfp4_inkling-slice.json"
want bench_nvfp4_mtp && stage bench_nvfp4_mtp 170 "$PY" benchmark/bench_one_batch.py "${COMMON[@]}" --batch-size 1 8 64 \
  --mtp --mtp-accept 2.5 4.5 --mtp-forced-only --decode-steps 8 --result-file "$OUT/bench_one_batch_mtp_nvfp4_inkling-slice.json"
ADAPTIVE=(--config slice --batch-size 1 8 64 --mtp --mtp-adaptive-only --mtp-adaptive-warmup 40 --mtp-adaptive-steps 64
  --mtp-learn-steps 1000 --input-len 1024 --decode-steps 8 --warmup-steps 2 --prefill-repeats 1 --fast-path kernels
  --cuda-graph)
want mtp_adaptive_nvfp4 && stage mtp_adaptive_nvfp4 180 "$PY" benchmark/bench_one_batch.py "${ADAPTIVE[@]}" \
  --quantization modelopt_fp4 --moe-build "$MOE_BUILD" \
  --result-file "$OUT/bench_one_batch_mtp_adaptive_nvfp4_inkling-slice.json"
want mtp_adaptive_bf16 && stage mtp_adaptive_bf16 180 "$PY" benchmark/bench_one_batch.py "${ADAPTIVE[@]}" \
  --result-file "$OUT/bench_one_batch_mtp_adaptive_bf16_inkling-slice.json"
# What a draft vocabulary (--speculative-token-map, 32K ids) saves in the batch-1 draft step.
if want draft_map; then
  stage draft_step 60 "$PY" benchmark/profile_draft_step.py --batch-size 1 --accept 4 \
    --out "$OUT/profile_draft_step_inkling-slice_bs1.json"
  stage draft_step_map 60 "$PY" benchmark/profile_draft_step.py --batch-size 1 --accept 4 --token-map-size 32768 \
    --out "$OUT/profile_draft_step_inkling-slice_bs1_map32k.json"
fi
# The serving decode step at batch 64 (NVFP4 slice, 8K-token prompts as gpu_serving.sh serves) over the 1K
# steps of a served output (medians per 100) against its graph replay before and after them.
want sched_profile && stage sched_profile 200 "$PY" benchmark/profile_scheduler_step.py --batch-size 64 \
  --input-len 8192 --steps 1000 --window 100 --quantization modelopt_fp4 \
  --out "$OUT/profile_scheduler_step_inkling-slice-nvfp4_bs64.json"
want serve_nvfp4 && stage serve_nvfp4 50 "$PY" benchmark/gpu_nvfp4_serve_check.py "$OUT/gpu_nvfp4_serve_check.json"
# The overlap check runs only with the time it needs left of the call's budget (BUDGET_S seconds in all).
left=$((${BUDGET_S:-575} - (SECONDS - START)))
if want overlap && [ "$left" -ge 150 ]; then
  stage overlap "$left" "$PY" benchmark/gpu_overlap_check.py "$OUT/gpu_overlap_check.json"
else
  echo "== overlap: skipped, $left s left"
fi
tar -czf "$OUT/logs.tgz" -C "$LOGS" .
echo "== done ($((SECONDS - START)) s)"
exit $status
