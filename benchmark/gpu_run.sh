#!/usr/bin/env bash
# Issue 7 on the H200, in one call from the project root:
#   1. the kernel and GPU tests (test/kernels, test/gpu),
#   2. bench_one_batch on inkling-slice (dummy weights) at batch 1 and batch 64,
# then a short table; logs, junit XML and the JSON results are written to $OUT (default:
# benchmark/results/gpu_run) and the JSON also to benchmark/results/. Expected 5-7 minutes; the stage
# time limits (230 + 170 + 170 s) keep the whole under 10 minutes, and one hang cannot eat the
# other stages. Exit status: non-zero if any stage failed (all stages still run).
# Needs: torch with CUDA, triton, safetensors, tqdm, numpy (the kernels, the model and inkling-tiny).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/kernels:$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/benchmark/results/gpu_run}"
mkdir -p "$OUT" benchmark/results
PY="${PYTHON:-python3}"
status=0

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
"$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  | tee -a "$OUT/gpu.txt"

echo "== tests: test/kernels test/gpu"
timeout 230 "$PY" -m pytest test/kernels test/gpu -q -rs -s -p no:cacheprovider --junitxml="$OUT/pytest.xml" \
  2>&1 | tee "$OUT/pytest.log" | grep -v '^$' | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "!! tests failed (see $OUT/pytest.log)"; status=1; }

# One process per batch size: an out-of-memory at batch 64 must not lose the batch-1 figures.
# Each runs the model as written (eager) and with every kernel wired in (kernels, + CUDA graph).
for bs in 1 64; do
  echo "== bench_one_batch inkling-slice batch $bs"
  json="$OUT/bench_one_batch_inkling-slice_bs$bs.json"
  timeout 170 "$PY" benchmark/bench_one_batch.py --config slice --batch-size "$bs" --input-len 1024 \
    --decode-steps 10 --prefill-repeats 1 --fast-path eager kernels --cuda-graph --result-file "$json" \
    2>&1 | tee "$OUT/bench_bs$bs.log" | tail -8
  if [ "${PIPESTATUS[0]}" -eq 0 ] && [ -f "$json" ]; then
    cp "$json" benchmark/results/
  else
    echo "!! bench batch $bs failed (see $OUT/bench_bs$bs.log)"; status=1
  fi
done

echo "== summary (floor = bytes that must be read / 4.3 TB/s; % = floor / time, graph time where one ran)"
"$PY" - "$OUT" <<'EOF2'
import json, pathlib, sys
from benchmark.bench_one_batch import print_table
runs = [r for f in sorted(pathlib.Path(sys.argv[1]).glob("bench_one_batch_inkling-slice_bs*.json"))
        for r in json.loads(f.read_text())["runs"]]
print_table(sorted(runs, key=lambda r: (r["batch_size"], r["mode"])))
EOF2
grep -h "max |logit diff|" "$OUT/pytest.log" || true
exit $status
