"""Latency curves: ms of one forward pass against the tokens q in it, per dtype and step variant (issue 9).

For each dtype (float32, bfloat16, ...) and variant (``lp_runtime.latency.VARIANTS``: ``dynamic`` = today's
DynamicCache + mask concatenated each step, ``static_mask`` = a preallocated mask buffer, ``compile`` =
``torch.compile``), ``latency.measure_latency`` times one step of q tokens over a ``--cache-tokens`` cache. The
(dtype, variant) pairs are measured in ``--rounds`` interleaved rounds (the machine drifts) and each q keeps
the median over rounds. Writes ``OUT/<model>__<device>__<dtype>__<variant>.json``, ``OUT/latency_curves.json``
(all of them), ``OUT/latency_curves.md`` (a table) and ``OUT/latency_curves.png`` (ms and ratio to q = 1).
``compile`` is not in the defaults: on the 2-core CPU (shared at the time) its warm-up compiles took over 6
minutes for two step sizes without finishing, so it is not cheap here; try it with ``--variants compile``.
With ``--save-profile`` the ``static_mask`` curve of each dtype also becomes the tuner's cached profile, so
``decoding=auto`` uses it. Run on a quiet machine (nothing else on the cores)::

    python scripts/latency_curve.py --out results/latency --save-profile              # ~10 min on 2 cores
    python scripts/latency_curve.py --out /tmp/lc --reps 1 --rounds 1 --qs 1 2 4 --dtypes float32  # smoke
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from lp_runtime import latency, models  # noqa: E402
from lp_runtime.config import ModelConfig  # noqa: E402


ROUNDS: dict[tuple[str, str], list[dict[int, float]]] = {}  # (dtype, variant) -> one curve per round


def measure_all(model, dtype, variants, qs, *, reps, rounds, cache_tokens, log=print) -> dict:
    """{(dtype, variant): {q: median seconds over rounds}}, the model converted to ``dtype`` IN PLACE first;
    rounds interleave the variants, rotating their order from round to round (the machine drifts)."""
    model.to(getattr(torch, dtype))
    samples: dict[tuple[str, str], dict[int, list[float]]] = {}
    for r in range(rounds):
        pairs = [(dtype, v) for v in variants]
        pairs = pairs[r % len(pairs):] + pairs[: r % len(pairs)]
        for d, v in pairs:
            t0 = time.perf_counter()
            curve = latency.measure_latency(model, qs, cache_tokens=cache_tokens, reps=reps, variant=v,
                                            warmup=3 if v == "compile" else 1)
            for q, t in curve.items():
                samples.setdefault((d, v), {}).setdefault(q, []).append(t)
            log(f"round {r + 1}/{rounds} {d} {v} ({time.perf_counter() - t0:.0f}s): "
                + " ".join(f"{q}:{1e3 * t:.1f}" for q, t in curve.items()))
    ROUNDS.update({k: [{q: ts[r] for q, ts in per_q.items() if r < len(ts)} for r in range(rounds)]
                   for k, per_q in samples.items()})  # per round, for the tuner's robust_curve (--save-profile)
    return {k: {q: statistics.median(ts) for q, ts in per_q.items()} for k, per_q in samples.items()}


def write(out: str, curves: dict, meta: dict) -> list[str]:
    os.makedirs(out, exist_ok=True)
    paths = []
    for (d, v), curve in curves.items():
        p = os.path.join(out, f"{meta['model']}__{meta['device']}__{d}__{v}.json")
        with open(p, "w", encoding="utf-8") as f:
            json.dump({**meta, "dtype": d, "variant": v, "latency_s": {str(q): t for q, t in curve.items()}}, f, indent=1)
        paths.append(p)
    every = {f"{d}/{v}": {str(q): t for q, t in c.items()} for (d, v), c in curves.items()}
    p = os.path.join(out, "latency_curves.json")
    with open(p, "w", encoding="utf-8") as f:
        json.dump({**meta, "curves_s": every}, f, indent=1)
    paths.append(p)
    qs = sorted({q for c in curves.values() for q in c})
    lines = ["| dtype / variant | " + " | ".join(f"q={q}" for q in qs) + " |", "|---" * (len(qs) + 1) + "|"]
    for (d, v), c in curves.items():
        lines.append(f"| {d} / {v} | " + " | ".join(f"{1e3 * c[q]:.1f}" if q in c else "-" for q in qs) + " |")
    lines.append("")
    lines.append("ms per forward pass (median); " + ", ".join(f"{k}={v}" for k, v in meta.items()))
    p = os.path.join(out, "latency_curves.md")
    with open(p, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    paths.append(p)
    paths.append(plot(out, curves, meta))
    return paths


def plot(out: str, curves: dict, meta: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for (d, v), c in curves.items():
        qs = sorted(c)
        style = "-" if v == "static_mask" else "--" if v == "dynamic" else ":"
        axes[0].plot(qs, [1e3 * c[q] for q in qs], style, marker="o", ms=3, label=f"{d} {v}")
        axes[1].plot(qs, [c[q] / c[qs[0]] for q in qs], style, marker="o", ms=3, label=f"{d} {v}")
    for ax, ylabel in zip(axes, ("ms per forward pass", "x a one-token step")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens in the step q (log scale)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{meta['model']} on {meta['device']} ({meta['threads']} threads, {meta['cache_tokens']}-token cache)",
                 fontsize=9)
    fig.tight_layout()
    p = os.path.join(out, "latency_curves.png")
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/latency")
    ap.add_argument("--model-path", default="bundled:smollm2")
    ap.add_argument("--model-name", default="smollm2_135m")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--variants", nargs="+", default=["dynamic", "static_mask"], choices=latency.VARIANTS)
    ap.add_argument("--qs", nargs="+", type=int, default=list(latency.LATENCY_QS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-tokens", type=int, default=latency.CACHE_TOKENS)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--save-profile", action="store_true",
                    help="also store each dtype's static_mask curve as the tuner's profile (decoding=auto uses it)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, _ = models.load_model(ModelConfig(name=args.model_name, path=args.model_path, device=args.device,
                                             dtype="float32"))
    device = str(next(model.parameters()).device)
    meta = {"model": args.model_name, "device": device, "threads": torch.get_num_threads(),
            "cache_tokens": args.cache_tokens, "reps": args.reps, "rounds": args.rounds,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    log = lambda *a: print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)  # noqa: E731
    log("measuring", meta)
    # the model is converted in place (float32 weights first, so nothing is rounded twice)
    dtypes = sorted(args.dtypes, key=lambda d: d != "float32")
    curves = {}
    for d in dtypes:
        curves.update(measure_all(model, d, args.variants, args.qs, reps=args.reps, rounds=args.rounds,
                                  cache_tokens=args.cache_tokens, log=log))
    for p in write(args.out, curves, meta):
        log("wrote", p)
    if args.save_profile:
        for d in dtypes:
            if (d, latency.DEFAULT_VARIANT) in curves and args.qs == list(latency.LATENCY_QS):
                rounds = ROUNDS[(d, latency.DEFAULT_VARIANT)]
                prof = latency.latency_profile(models.model_id_of(model), latency.device_key(model), d, retune=True,
                                               measure=lambda r=rounds: latency.robust_curve(r))
                log("tuner profile", prof["path"])
    log(f"done in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
