#!/usr/bin/env bash
# GPU check of the eager and captured steps (issue 19): exactness in fp32, per-bucket latency in bf16, greedy
# tokens/s, predicted speedup; needs only torch + transformers (no Hydra). One H200: 5 minutes (2026-12-04).
#   scripts/device_check.sh OUTDIR                                   # GPU machine
#   scripts/device_check.sh OUTDIR --device cpu --quick --backend aot_eager --buckets 1,4,16   # CPU dry run
#   scripts/device_check.sh OUTDIR --results results/bench_zen4_2026-12-04b/results.json   # S from a CPU bench (the default)
# On the device tool: run "scripts/device_check.sh \$OUT"; the results JSON must travel (it is committed).
# Optional wheels in .whl/ (see the device README) are installed first when present.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: scripts/device_check.sh OUTDIR [--device cpu --quick] [--results results.json]}
shift
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1
{ $PY -m pip list 2>/dev/null; echo; nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; } > "$OUTDIR/pip_list.txt"
set +e
timeout 470 $PY scripts/device_check.py "$OUTDIR" "$@" 2>&1 | tee "$OUTDIR/device_check.log"
rc=${PIPESTATUS[0]}
echo "device_check exit code $rc (0: all exact, no errors; 1: a divergence beyond a near-tie or a failed part; 124: timed out)" | tee -a "$OUTDIR/device_check.log"
exit $rc
