#!/usr/bin/env bash
# Run the lookahead-parallel tests N times (default 50); stop at the first failure and keep its log.
# Issue 11 fault 9: a finished torchrun job must exit 0 on every rank, every time.
#   scripts/lp_loop.sh 50                      # tests/test_parallel.py -k test_lp_matches_single_process
#   LP_LOOP_K='lp4' scripts/lp_loop.sh 12      # one parametrisation only
set -u
N=${1:-50}
K=${LP_LOOP_K:-test_lp_matches_single_process}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOG=${LP_LOOP_LOG:-$ROOT/outputs/lp_loop}
mkdir -p "$LOG"
cd "$ROOT"
for i in $(seq 1 "$N"); do
  if ! PYTHONPATH="$ROOT" OMP_NUM_THREADS=1 "$ROOT/.venv/bin/python" -m pytest -q -x -p no:cacheprovider \
      tests/test_parallel.py -k "$K" > "$LOG/run_$i.log" 2>&1; then
    echo "run $i of $N FAILED; log: $LOG/run_$i.log"
    tail -40 "$LOG/run_$i.log"
    exit 1
  fi
  echo "run $i of $N passed ($(grep -o '[0-9]* passed' "$LOG/run_$i.log"))"
  rm -f "$LOG/run_$i.log"
done
echo "all $N runs passed"
