#!/usr/bin/env bash
# Issue 15, kernel half, on the H200 in one call from the project root: the NVFP4 MoE kernel tests on
# the GPU, then bench_moe_nvfp4 at inkling-slice shape over the tile variants given in $TILES
# (default: SWEEP below; batch sizes $BATCHES, more flags in $BENCH_ARGS), logs and JSON under $OUT; with NCU=1 also Nsight Compute on one routed up
# launch (the CUDA decode kernel of the NCU_BUILD build, e.g. row_ring=0, or the Triton one where it does not apply).
# Stage limits keep the whole under 9 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/kernels:$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/benchmark/results/gpu_moe_nvfp4}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
START=$SECONDS
status=0
source benchmark/gpu_stage.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# The MoE builds: the shipped default (the lean row ring of 3 stages, 2 warps), the build before it (4
# warps, 4 stages, the generic loop) and the chunk ring (row_ring=0) (c: specs: every CudaTiles field,
# bench_moe_nvfp4.py); every library the tests and these load is built first.
SWEEP=(default "c:1,4,8,256,4,1,0,8,1,1,1,8,4,0,1" "c:1,4,8,256,2,1,0,8,1,1,1,8,0,1,1")
TILES="${TILES:-${SWEEP[*]}}"
# shellcheck disable=SC2086  # the list is split on purpose
stage prebuild 60 "$PY" benchmark/prebuild_cuda.py $TILES
STAGE_TAIL=6 stage tests "${TEST_LIMIT:-170}" "$PY" -m pytest test/kernels/test_fused_moe_nvfp4.py -q -rs -p no:cacheprovider -n "${TEST_WORKERS:-4}"
# shellcheck disable=SC2086
STAGE_TAIL=40 stage bench "${BENCH_LIMIT:-300}" "$PY" benchmark/bench_moe_nvfp4.py --result-file "$OUT/bench_moe_nvfp4_inkling-slice.json" \
  --dump-dir "$OUT" ${TILES:+--tiles $TILES} ${ASM:+--asm $ASM} ${BATCHES:+--batch-sizes $BATCHES} ${BENCH_ARGS:-}
if [ -n "${NCU:-}" ]; then  # what limits the routed up kernel: one launch at batch 1 under Nsight Compute
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  STAGE_TAIL=60 stage ncu "${NCU_LIMIT:-120}" "$NCU_BIN" --clock-control none -k regex:"moe_w4a16|_up_kernel" --launch-skip 2 \
    --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --metrics smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum \
    "$PY" benchmark/profile_moe_nvfp4.py --batch-size 1 --moe-build "${NCU_BUILD:-}"
fi
exit $status
