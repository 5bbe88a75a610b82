#!/usr/bin/env bash
# One node, NPROC ranks (default 1); extra arguments are Hydra overrides, e.g.
#   NPROC=2 launch/torchrun_single_node.sh parallel.lp=2 dataset.limit=3
# Runs from any directory: relative paths (output.path, dataset.path, RUN_DIR) are the caller's, as for
# python -m lp_runtime.generate; torchrun is the repository's .venv/bin/torchrun (found from this script's
# location), else TORCHRUN, else torchrun on PATH.
# Every rank runs @hydra.main, so all get the same hydra.run.dir, fixed here (${now:} would differ per rank).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export HYDRA_FULL_ERROR=1
RUN_DIR=${RUN_DIR:-outputs/hydra/torchrun_$(date +%Y-%m-%d_%H-%M-%S)}
if [ -z "${TORCHRUN:-}" ]; then
    if [ -x "$ROOT/.venv/bin/torchrun" ]; then TORCHRUN=$ROOT/.venv/bin/torchrun; else TORCHRUN=torchrun; fi
fi
exec "$TORCHRUN" --standalone --nproc-per-node="${NPROC:-1}" \
    -m lp_runtime.generate hydra.run.dir="$RUN_DIR" "$@"
