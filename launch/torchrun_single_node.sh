#!/usr/bin/env bash
# One node, NPROC ranks (default 1); extra arguments are Hydra overrides, e.g.
#   NPROC=2 launch/torchrun_single_node.sh parallel.lp=2 dataset.limit=3
# Runs from any directory: relative paths (output.path, dataset.path, RUN_DIR) are the caller's, as for
# python -m lp_runtime.generate; torchrun is the repository's .venv/bin/torchrun (found from this script's
# location), else TORCHRUN, else torchrun on PATH.
# Every rank runs @hydra.main, so all get the same hydra.run.dir, fixed here (${now:} would differ per rank).
# A sweep (-m) is refused: every rank would run the whole sweep (sweep with hydra/launcher=lp_local instead).
# Ctrl-C: torchrun passes it to the ranks, rank 0 prints one "interrupted; ..." line, exit 130 (SIGTERM to the
# process group, e.g. timeout or scancel: the same line, exit 143, once torchrun and its ranks have ended; a SIGTERM
# to this script alone is held until the run ends: 143 if it did not complete, else a note and torchrun's 0);
# a bad setting:
# the first rank's "error: ..." line, exit 2; a rank killed by a signal (kill -9, out of memory): one line naming
# it, exit 1. What torchrun prints then (its warnings, a traceback and a failure report) and the other ranks'
# copies of the error line are replaced by launch/until_interrupted.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=python3
if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; fi
for arg in "$@"; do
    if [ "$arg" = "-m" ] || [ "$arg" = "--multirun" ] || [ "$arg" = "hydra.mode=MULTIRUN" ]; then
        echo "error: sweeps (-m/--multirun) and torchrun do not mix: every rank would run the whole sweep;" \
             "launch torchrun once per setting, or sweep from one process with hydra/launcher=lp_local" \
             "(or lp_slurm), which starts each job's ranks itself" >&2
        exit 2
    fi
done
case "${NPROC:-1}" in
    ''|*[!0-9]*|0|0[0-9]*) echo "error: NPROC=${NPROC:-} is not allowed; give the number of ranks, an integer >= 1" \
        "(e.g. NPROC=2)" >&2; exit 2 ;;
esac
# Hydra's flags given first (--cfg job, --info config) stay before this script's overrides: Hydra refuses a flag
# standing between overrides
FLAGS=()
while [ $# -gt 0 ] && [[ "$1" != *=* || "$1" == -* ]]; do FLAGS+=("$1"); shift; done
export HYDRA_FULL_ERROR=1
# torchrun's own default for > 1 rank a node, set here so it does not print its 4-line banner about it
if [ "${NPROC:-1}" -gt 1 ]; then export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; fi
RUN_DIR=${RUN_DIR:-outputs/hydra/torchrun_$(date +%Y-%m-%d_%H-%M-%S)}
for flag in ${FLAGS[@]+"${FLAGS[@]}"} "$@"; do   # one that prints and exits (first or last): one process, one copy
    case "$flag" in --cfg|--cfg=*|-c|--info|--info=*|-i|--help|-h|--hydra-help|--version|-sc|--shell-completion)
        exec "$PY" -m lp_runtime.generate ${FLAGS[@]+"${FLAGS[@]}"} hydra.run.dir="$RUN_DIR" "$@" ;;
    esac
done
NEW_DIRS=(); d=$RUN_DIR   # the run folder and its parents that do not exist yet, deepest first
while [ ! -e "$d" ] && [ "$d" != . ] && [ "$d" != / ]; do NEW_DIRS+=("$d"); d=$(dirname -- "$d"); done
if [ -z "${TORCHRUN:-}" ]; then
    if [ -x "$ROOT/.venv/bin/torchrun" ]; then TORCHRUN=$ROOT/.venv/bin/torchrun; else TORCHRUN=torchrun; fi
fi
trap '' INT   # this script and the filter ignore Ctrl-C; torchrun installs its own handler and stops the ranks
# (the filter also ignores SIGTERM: sent to the whole group, e.g. by timeout, it must outlive torchrun's ranks; this
# script notes it and exits after the pipeline, so it never returns while torchrun and the filter still run)
TERMINATED=
trap 'TERMINATED=1' TERM
# The ranks' stdout goes straight to this script's, their stderr through the filter, which passes a progress bar's
# partial line only after a 50 ms pause: on one terminal (or one file) a line printed on stdout then landed on the
# bar's line (decoding=auto's line, an answer's). There stdout joins stderr through the filter, unbuffered, in order.
RANK_OUT=3
if [ /dev/stdout -ef /dev/stderr ]; then RANK_OUT=1; export PYTHONUNBUFFERED=1; fi
set +e
{ "$TORCHRUN" --standalone --nproc-per-node="${NPROC:-1}" \
    -m lp_runtime.generate ${FLAGS[@]+"${FLAGS[@]}"} hydra.run.dir="$RUN_DIR" "$@" 2>&1 1>&"$RANK_OUT" 3>&- \
    | (trap '' TERM; exec "$PY" "$ROOT/launch/until_interrupted.py") 3>&-; } 3>&1
codes=("${PIPESTATUS[@]}")
if [ -n "$TERMINATED" ] && [ "${codes[0]}" = 0 ]; then   # the run went on (a TERM to this script alone) and completed
    echo "note: a SIGTERM reached this script while torchrun ran, and the run completed (the script holds a SIGTERM" \
         "sent to it alone until torchrun ends); to stop a run, send SIGTERM to torchrun and its ranks too, e.g. to" \
         "their process group, as timeout does" >&2
elif [ -n "$TERMINATED" ]; then exit 143; fi
if [ "${codes[1]}" = 130 ] || [ "${codes[1]}" = 143 ]; then exit "${codes[1]}"; fi
if [ "${codes[0]}" = 130 ] && [ "${codes[1]}" = 0 ]; then   # Ctrl-C reached torchrun alone, as its ranks ended
    echo "interrupted; the answers written so far are complete: re-run the same command to resume" >&2
    exit 130
fi
if [ "${codes[1]}" = 2 ] && [ "${codes[0]}" != 0 ]; then   # a rank refused a setting
    # README: a refused setting leaves no new folder; each rank removes its own, but a slower rank's Hydra can
    # write it again after the first one removed it
    if [ "${#NEW_DIRS[@]}" -gt 0 ]; then
        rm -rf -- "$RUN_DIR"
        for d in "${NEW_DIRS[@]:1}"; do rmdir -- "$d" 2>/dev/null || break; done
    fi
    exit 2
fi
exit "${codes[0]}"
