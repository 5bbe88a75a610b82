#!/usr/bin/env bash
# GPU check (exactness in fp32, latency curve in bf16, predicted speedup); needs only torch + transformers.
#   scripts/device_check.sh OUTDIR                                   # GPU machine, < 8 minutes
#   scripts/device_check.sh OUTDIR --device cpu --quick              # smoke test on a CPU
#   scripts/device_check.sh OUTDIR --results results/bench_cpu/results.json    # S from a CPU bench run (the default)
# On the device tool: run "scripts/device_check.sh \$OUT --results <a results.json in the working tree>";
# the results JSON must travel (commit it, or copy it to an un-ignored path, or name it in carry).
# Hydra is not needed (scripts/device_check.py imports lp_runtime's core directly). Optional wheels in .whl/
# (see the device README) are installed first when present.
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
set +e
timeout 470 $PY scripts/device_check.py "$OUTDIR" "$@" 2>&1 | tee "$OUTDIR/device_check.log"
rc=${PIPESTATUS[0]}
echo "device_check exit code $rc (0: all exact; 1: a divergence beyond a near-tie; 124: timed out)" | tee -a "$OUTDIR/device_check.log"
exit $rc
