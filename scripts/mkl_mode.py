"""A step's latency curve under each MKL mode (``MKL_CBWR``; lp_runtime/blas.py), side by side in one run.

MKL reads its mode once per process, so each mode runs in its own child process; ``--rounds`` rounds alternate
the children (rotating their order) and each q keeps its median over rounds. The curve is ``latency.measure_latency``
(the decoder's step: a mask, the logits of the last ceil(q/2) rows) of the bundled SmolLM2-135M in ``--dtype``.
"default" runs MKL's default (``MKL_CBWR`` set empty, which lp_runtime leaves as it is). Run alone on the machine::

    OMP_NUM_THREADS=2 .venv/bin/python scripts/mkl_mode.py --modes default AUTO --rounds 3 --out results/mkl_mode
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def child(qs: list[int], dtype: str, reps: int) -> None:
    sys.path.insert(0, ROOT)
    from lp_runtime import latency, models  # first: before torch's first product
    from lp_runtime.config import ModelConfig

    model, _ = models.load_model(ModelConfig(dtype=dtype))
    curve = latency.measure_latency(model, qs, reps=reps)
    print(json.dumps({"key": latency.device_key(model), "curve": {q: curve[q] for q in qs}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", nargs="+", default=["default", "AUTO"], help="MKL_CBWR values; 'default' = empty")
    ap.add_argument("--qs", nargs="+", type=int, default=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", help="folder for mkl_mode.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.qs, args.dtype, args.reps)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    rounds: dict[str, list[dict]] = {m: [] for m in args.modes}
    for r in range(args.rounds):
        for mode in args.modes[r % len(args.modes):] + args.modes[:r % len(args.modes)]:
            env = dict(os.environ, MKL_CBWR="" if mode == "default" else mode)
            cmd = [sys.executable, __file__, "--child", "--dtype", args.dtype, "--reps", str(args.reps), "--qs",
                   *map(str, args.qs)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            rounds[mode].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {r + 1} {mode}: {rounds[mode][-1]['key']}", flush=True)
    medians = {m: {q: statistics.median(rd["curve"][str(q)] for rd in rs) for q in args.qs} for m, rs in rounds.items()}
    print(f"{started}, {platform.processor() or platform.machine()}, {args.dtype}, ms per step (median of "
          f"{args.rounds} rounds); last column: the first mode / the last")
    print("q".rjust(4) + "".join(m.rjust(10) for m in args.modes) + "  ratio")
    for q in args.qs:
        row = [medians[m][q] * 1e3 for m in args.modes]
        print(f"{q:4d}" + "".join(f"{v:10.1f}" for v in row) + f"  {row[0] / row[-1]:.2f}x")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "mkl_mode.json"), "w") as f:
            json.dump({"started": started, "dtype": args.dtype, "rounds": rounds, "median_s": medians}, f, indent=1)


if __name__ == "__main__":
    main()
