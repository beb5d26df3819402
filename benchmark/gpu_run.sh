#!/usr/bin/env bash
# Issue 7 on the H200, in one call from the project root:
#   1. the kernel and GPU tests (test/kernels, test/gpu),
#   2. bench_one_batch on inkling-slice (dummy weights) at batch 1 and batch 64,
# then a short table; logs, junit XML and the JSON results are copied to $OUT (default:
# benchmark/results/gpu_run). About 5-7 minutes; each stage has its own time limit so one hang
# cannot eat the others. Exit status: non-zero if any stage failed (all stages still run).
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
timeout 260 "$PY" -m pytest test/kernels test/gpu -q -rs -s -p no:cacheprovider --junitxml="$OUT/pytest.xml" \
  2>&1 | tee "$OUT/pytest.log" | grep -v '^$' | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "!! tests failed (see $OUT/pytest.log)"; status=1; }

# One process per batch size: an out-of-memory at batch 64 must not lose the batch-1 figures.
for bs in 1 64; do
  echo "== bench_one_batch inkling-slice batch $bs"
  json="$OUT/bench_one_batch_inkling-slice_bs$bs.json"
  timeout 200 "$PY" benchmark/bench_one_batch.py --config slice --batch-size "$bs" --input-len 1024 \
    --decode-steps 20 --result-file "$json" 2>&1 | tee "$OUT/bench_bs$bs.log" | tail -8
  if [ "${PIPESTATUS[0]}" -eq 0 ] && [ -f "$json" ]; then
    cp "$json" benchmark/results/
  else
    echo "!! bench batch $bs failed (see $OUT/bench_bs$bs.log)"; status=1
  fi
done

echo "== summary (decode per step; floor = bytes that must be read / 4.3 TB/s; eager, no CUDA graphs)"
"$PY" - "$OUT" <<'EOF'
import json, pathlib, sys
rows = []
for f in sorted(pathlib.Path(sys.argv[1]).glob("bench_one_batch_inkling-slice_bs*.json")):
    for r in json.loads(f.read_text())["runs"]:
        rows.append(r)
print(f"{'bs':>3} {'prefill ms':>10} {'step ms':>8} {'floor':>7} {'%':>5} {'sliding ms (%)':>15} {'full ms (%)':>13} "
      f"{'head ms (%)':>12} {'tok/s/user@66':>13} {'floor':>6}")
for r in sorted(rows, key=lambda r: r["batch_size"]):
    sl = [x for x in r["layers"] if x["kind"] == "sliding"]
    fu = [x for x in r["layers"] if x["kind"] == "full"]
    def cell(xs):
        if not xs:
            return "-"
        ms = sum(x["ms"] for x in xs) / len(xs)
        fl = sum(x["floor_ms"] for x in xs) / len(xs)
        return f"{ms:.3f} ({100 * fl / ms:.0f}%)"
    e = r["extrapolated_66_layers"]
    print(f"{r['batch_size']:>3} {r['prefill_ms']:>10.1f} {r['decode_step_ms']:>8.3f} {r['decode_step_floor_ms']:>7.3f} "
          f"{100 * r['decode_step_achieved_fraction']:>4.0f}% {cell(sl):>15} {cell(fu):>13} "
          f"{r['lm_head_ms']:.3f} ({100 * r['lm_head_achieved_fraction']:.0f}%) {e['tok_per_s_per_user']:>13.1f} "
          f"{e['floor_tok_per_s_per_user']:>6.1f}")
EOF
exit $status
