"""A step's latency curve under each MKL mode (``MKL_CBWR``; lp_runtime/blas.py), side by side in one run.

MKL reads its mode once per process, so each mode runs in its own child process; ``--rounds`` rounds alternate
the children (rotating their order) and each q keeps its median over rounds. The curve is ``latency.measure_latency``
(the decoder's step: a mask, the logits of the last ceil(q/2) rows) of the bundled SmolLM2-135M in ``--dtype``.
"default" runs MKL's default (``MKL_CBWR`` set empty, which lp_runtime leaves as it is).

``--prompts FILE`` (Spec-Bench question format; ``--indices``) times whole answers instead: one worker process per
mode, each loading the product once (``LookaheadGenerator``, the defaults: ``decoding=auto``; ``--dtype``), and for
each prompt in turn every worker (order rotating per prompt) decodes it with transformers' greedy and with the
product, timed in the worker; per mode the product's speedup over that worker's greedy (mean of per-prompt ratios,
and total), its S, and whether its tokens equal greedy's. Run alone on the machine::

    OMP_NUM_THREADS=2 .venv/bin/python scripts/mkl_mode.py --modes default AUTO --rounds 3 --out results/mkl_mode
    OMP_NUM_THREADS=2 .venv/bin/python scripts/mkl_mode.py --modes default AUTO --prompts results/lp_scaling/prompts.jsonl \
        --indices 0 1 2 3 4 5 6 7 16 17 18 19 --max-new-tokens 128 --out results/mkl_mode
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def child(qs: list[int], dtype: str, reps: int) -> None:
    sys.path.insert(0, ROOT)
    from lp_runtime import latency, models  # first: before torch's first product
    from lp_runtime.config import ModelConfig

    model, _ = models.load_model(ModelConfig(dtype=dtype))
    curve = latency.measure_latency(model, qs, reps=reps)
    print(json.dumps({"key": latency.device_key(model), "curve": {q: curve[q] for q in qs}}))


def worker(dtype: str, prompts: str, max_new_tokens: int) -> None:
    """Answer ``{"prompt": i}`` lines on stdin with one JSON line: greedy and product seconds, steps, identical."""
    sys.path.insert(0, ROOT)
    from lp_runtime import LookaheadGenerator, latency  # first: before torch's first product
    from lp_runtime.config import DatasetConfig, ModelConfig
    from lp_runtime.data import build_prompt, load_questions

    gen = LookaheadGenerator.from_config(ModelConfig(dtype=dtype))
    questions = load_questions(DatasetConfig(name="jsonl", path=prompts, first_turn_only=True))
    gen.generate([1, 2, 3], max_new_tokens=4)  # decoding=auto's start-up (profile, calibration) before any timing
    print(json.dumps({"ready": latency.device_key(gen.model)}), flush=True)
    for line in sys.stdin:
        ids = build_prompt(gen.tokenizer, questions[json.loads(line)["prompt"]], [])
        t0 = time.perf_counter()
        ref = gen.model.generate(__import__("torch").tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=list(gen.decoder.eos_token_ids))[0, len(ids):].tolist()
        t1 = time.perf_counter()
        out = gen.generate(ids, max_new_tokens=max_new_tokens)
        t2 = time.perf_counter()
        print(json.dumps({"greedy_s": t1 - t0, "product_s": t2 - t1, "tokens": len(out.output_ids),
                          "steps": out.decoding_steps, "identical": ref[:len(out.output_ids)] == out.output_ids}),
              flush=True)


def read(proc: subprocess.Popen) -> dict:
    """The worker's next JSON line (the product's own lines, e.g. decoding=auto's start-up line, are passed on)."""
    while line := proc.stdout.readline():
        if line.startswith("{"):
            return json.loads(line)
        print("  worker: " + line.rstrip(), flush=True)
    raise SystemExit("mkl_mode: a worker stopped (its error is above)")


def bench(args) -> dict:
    """The per-prompt A/B of whole answers (see the module docstring)."""
    procs = {}
    for mode in args.modes:
        env = dict(os.environ, MKL_CBWR="" if mode == "default" else mode)
        procs[mode] = subprocess.Popen([sys.executable, __file__, "--worker", "--dtype", args.dtype, "--prompts",
                                        args.prompts, "--max-new-tokens", str(args.max_new_tokens)],
                                       env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        print(f"{mode}: {read(procs[mode])['ready']}", flush=True)
    rows: dict[str, list] = {m: [] for m in args.modes}
    for n, i in enumerate(args.indices):
        for mode in args.modes[n % len(args.modes):] + args.modes[:n % len(args.modes)]:
            procs[mode].stdin.write(json.dumps({"prompt": i}) + "\n")
            procs[mode].stdin.flush()
            rows[mode].append(dict(read(procs[mode]), prompt=i))
        print(f"prompt {i}: " + "  ".join(f"{m} {r[-1]['greedy_s'] / r[-1]['product_s']:.2f}x" for m, r in rows.items()),
              flush=True)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    for mode, rs in rows.items():
        mean = statistics.mean(r["greedy_s"] / r["product_s"] for r in rs)
        total = sum(r["greedy_s"] for r in rs) / sum(r["product_s"] for r in rs)
        s = sum(r["tokens"] for r in rs) / sum(r["steps"] for r in rs)
        print(f"{mode}: product over greedy {mean:.3f}x (mean of ratios) / {total:.3f}x (total), S {s:.2f}, "
              f"identical {sum(r['identical'] for r in rs)}/{len(rs)}, greedy {sum(r['greedy_s'] for r in rs):.1f} s")
    return rows


def check(ap: argparse.ArgumentParser, args) -> None:
    """Refuse bad numbers and question indices before any child starts (argparse's error: usage, exit 2)."""
    for name in ("qs", "rounds", "reps", "max_new_tokens"):
        value = getattr(args, name)
        if min(value if isinstance(value, list) else [value]) < 1:
            ap.error(f"--{name.replace('_', '-')} {value}: must be >= 1")
    if args.out:
        try:
            os.makedirs(args.out, exist_ok=True)
            tempfile.TemporaryFile(dir=args.out).close()
        except OSError as e:
            ap.error(f"--out {args.out}: cannot write there: {e.strerror or e}")
    if args.indices is not None and not args.prompts:
        ap.error("--indices picks questions of --prompts; add --prompts FILE.jsonl")
    args.indices = list(range(8)) if args.indices is None else args.indices
    if len(set(args.indices)) < len(args.indices):
        ap.error(f"--indices {args.indices}: each question once")
    if args.prompts:
        sys.path.insert(0, ROOT)
        from lp_runtime.config import DatasetConfig
        from lp_runtime.data import DatasetError, load_questions

        try:
            n = len(load_questions(DatasetConfig(name="jsonl", path=args.prompts, first_turn_only=True)))
        except DatasetError as e:
            ap.error(str(e).replace("dataset.path=", "--prompts ", 1))
        bad = [i for i in args.indices if not 0 <= i < n]
        if bad:
            ap.error(f"--indices {bad}: {args.prompts} holds questions 0..{n - 1}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mkl_mode.py", description=__doc__.split("\n")[0])
    ap.add_argument("--modes", nargs="+", default=["default", "AUTO"], help="MKL_CBWR values; 'default' = empty")
    ap.add_argument("--qs", nargs="+", type=int, default=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--out", help="folder for mkl_mode.json")
    ap.add_argument("--prompts", help="Spec-Bench JSONL: time whole answers instead of the curve")
    ap.add_argument("--indices", nargs="+", type=int, help="questions of --prompts (default 0-7)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if args.child:
        return child(args.qs, args.dtype, args.reps)
    if args.worker:
        return worker(args.dtype, args.prompts, args.max_new_tokens)
    check(ap, args)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if args.prompts:
        print(f"{started}: whole answers, {args.dtype}, {args.max_new_tokens} new tokens", flush=True)
        rows = bench(args)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "mkl_mode_answers.json"), "w") as f:
                json.dump({"started": started, "dtype": args.dtype, "rows": rows}, f, indent=1)
        return
    rounds: dict[str, list[dict]] = {m: [] for m in args.modes}
    for r in range(args.rounds):
        for mode in args.modes[r % len(args.modes):] + args.modes[:r % len(args.modes)]:
            env = dict(os.environ, MKL_CBWR="" if mode == "default" else mode)
            cmd = [sys.executable, __file__, "--child", "--dtype", args.dtype, "--reps", str(args.reps), "--qs",
                   *map(str, args.qs)]
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)  # its stderr shows here
            if proc.returncode:
                raise SystemExit(f"mkl_mode: the child of mode {mode} failed (exit {proc.returncode}; error above)")
            out = proc.stdout
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
