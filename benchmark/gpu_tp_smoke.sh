#!/usr/bin/env bash
# TP 2 serving smoke test on two GPUs: launch inkling-slice (dummy weights) with --tp-size 2, send one
# greedy /generate and one chat request, print the answers, stop the server. Prints PASS or FAIL.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
DIR=$("$PY" -c "from benchmark.slice_dir import write_slice_dir; print(write_slice_dir())")
"$PY" -m sglang.launch_server --model-path "$DIR" --load-format dummy --tp-size 2 --port 31000 \
  --max-running-requests 8 "$@" > "${OUT:-/tmp}/tp_smoke_server.log" 2>&1 &
pid=$!
ok=0
for _ in $(seq 1 150); do
  if curl -sf localhost:31000/health > /dev/null; then ok=1; break; fi
  sleep 1
done
status=1
if [ $ok = 1 ]; then
  curl -s localhost:31000/generate -H 'Content-Type: application/json' \
    -d '{"input_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}' && echo &&
  curl -s localhost:31000/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}' && echo && status=0
fi
kill $pid; wait $pid 2>/dev/null
tail -5 "${OUT:-/tmp}/tp_smoke_server.log"
[ $status = 0 ] && echo PASS || echo FAIL
exit $status
