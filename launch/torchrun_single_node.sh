#!/usr/bin/env bash
# One node, NPROC ranks (default 1); extra arguments are Hydra overrides, e.g.
#   NPROC=2 launch/torchrun_single_node.sh parallel.lp=2 dataset.limit=3
# Every rank runs @hydra.main, so all get the same hydra.run.dir, fixed here (${now:} would differ per rank).
set -euo pipefail
cd "$(dirname "$0")/.."
export HYDRA_FULL_ERROR=1
RUN_DIR=${RUN_DIR:-outputs/hydra/torchrun_$(date +%Y-%m-%d_%H-%M-%S)}
if [ -z "${TORCHRUN:-}" ]; then
    if [ -x .venv/bin/torchrun ]; then TORCHRUN=.venv/bin/torchrun; else TORCHRUN=torchrun; fi
fi
exec "$TORCHRUN" --standalone --nproc-per-node="${NPROC:-1}" \
    -m lp_runtime.generate hydra.run.dir="$RUN_DIR" "$@"
