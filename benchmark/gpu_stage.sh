# Sourced by the GPU scripts: `stage NAME LIMIT_S CMD...` runs CMD with a time limit, logs it to
# $LOGS/NAME.log ($LOGS defaults to $OUT), shows the log's last $STAGE_TAIL lines (default 12) and,
# on failure, its FAILED/ERROR lines; a failure sets status=1 and the next stages still run.
# Needs START (the script's $SECONDS at its start) and OUT: gpu_begin below sets both.
stage() {
  local name=$1 limit=$2 log="${LOGS:-$OUT}/$1.log"
  shift 2
  echo "== $name (limit ${limit} s, $((SECONDS - START)) s used)"
  timeout -k 15 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  tail -"${STAGE_TAIL:-12}" "$log"
  if [ $rc -ne 0 ]; then
    grep -E "^(FAILED|ERROR)|Error" "$log" | head -20
    echo "!! $name failed with status $rc (see $log)"
    status=1
  fi
}

# `gpu_begin NAME`, the shared start of the GPU scripts (run from the project root): $OUT (default
# benchmark/results/NAME) and $LOGS made, $PY and PYTHONPATH set, status=0, START taken, and the GPU and
# GIT_COMMIT (the machine has no .git) written to $OUT/gpu.txt.
gpu_begin() {
  START=$SECONDS
  OUT="${OUT:-$PWD/benchmark/results/$1}"
  LOGS="${LOGS:-$OUT}"
  mkdir -p "$OUT" "$LOGS"
  PY="${PYTHON:-python3}"
  export PYTHONPATH="$PWD/kernels:$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  status=0
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  echo "git commit: ${GIT_COMMIT:-unknown}" | tee -a "$OUT/gpu.txt"
}
