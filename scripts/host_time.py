"""Host time per decoding step under LP: what a step spends outside the model, at each K, optionally side by side
with a base revision (interleaved per prompt, two processes).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/host_time.py --ks 1 8 --limit 4 [--base HEAD~1]

On a GPU the model's step runs on the device while the host waits; everything else a step does (grow the tree,
cut it to the ranks, lay it out, merge, verify, update the tables) adds to every step's time. Under LP at K = 8
every rank grows and lays out the whole ~630-node tree (``scripts/lp_scaling.py``'s per-rank budget of 80), so
the host's share grows with K while the device's does not. This script decodes ``--limit`` prompts (first turns,
chat template, SmolLM2-135M float32 greedy, ``--max-new-tokens``) with the product's proposer for K ranks in one
process (``lp_scaling.proposer_for``; one ``Decoder`` per K, the tables kept across prompts) through a step that
times itself (``TimedStep``: the forward pass, its argmax / top-k and the cache's prefill and commit, the previous
step's logits freed inside it), and prints per K: host ms per step = (the call's wall time - the step's) / steps.

``--base REV``: the same runs through ``REV``'s package (``git archive`` into a temporary folder) in a second
process, the prompts alternating between the two (this first, then base, then base first for the next prompt), and
whether both took the same steps and tokens. Figures from one run only: the machine's speed moves between runs.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class TimedStep:
    """Any step (``step.py``'s methods, e.g. ``EagerStep(model)``) that adds the wall time of its forward passes,
    prefills and commits to ``seconds``, device work waited for (CUDA: synchronized before and after). The previous
    step's outputs are freed inside it, not in the caller: on a CPU freeing ~100 MB of logits takes milliseconds
    that a GPU's caching allocator never spends. Other attributes are the wrapped step's."""

    def __init__(self, step) -> None:
        self.step, self.seconds, self.last = step, 0.0, None

    def __getattr__(self, name):
        return getattr(self.step, name)

    def _sync(self) -> None:
        if self.step.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.step.device)

    def _timed(self, fn, *a, **kw):
        self._sync()
        t0 = time.perf_counter()
        self.last = None
        out = fn(*a, **kw)
        self._sync()
        self.last = out
        self.seconds += time.perf_counter() - t0
        return out

    def __call__(self, *a, **kw):
        return self._timed(self.step, *a, **kw)

    def prefill(self, *a, **kw):
        return self._timed(self.step.prefill, *a, **kw)

    def commit(self, *a, **kw):
        return self._timed(self.step.commit, *a, **kw)


PARTS = ("_plan", "_forward", "_verify_commit", "_observe")  # the decoder's step methods


def parts_decoder(step: TimedStep, times: dict):
    """A ``Decoder`` subclass whose step methods (``PARTS``) add their host seconds (wall time less ``step``'s own
    forward, prefill and commit time) to ``times[name]``: where a step's host time goes (docs/benchmarks.md 6d)."""
    from lp_runtime.decoder import Decoder

    def timed(name: str):
        method = getattr(Decoder, name)

        def run(self, *a, **kw):
            step_before, start = step.seconds, time.perf_counter()
            out = method(self, *a, **kw)
            times[name] = times.get(name, 0.0) + time.perf_counter() - start - (step.seconds - step_before)
            return out
        return run

    return type("PartsDecoder", (Decoder,), {name: timed(name) for name in PARTS})


def worker(root: str) -> None:
    """Answer ``{"k": K, "prompt": i}`` lines on stdin with one JSON line each, through the package in ``root``."""
    sys.path[:0] = [root, os.path.join(root, "scripts")]
    import torch

    from lp_runtime.config import DatasetConfig, ModelConfig
    from lp_runtime.data import build_prompt, load_questions
    from lp_runtime.decoder import Decoder
    from lp_runtime.checks import eos_token_ids
    from lp_runtime.models import load_model
    from lp_runtime.parallel import LocalGroup
    from lp_runtime.step import EagerStep
    from lp_scaling import proposer_for

    if not sys.modules["lp_runtime"].__file__.startswith(root):
        raise SystemExit(f"host_time: imported {sys.modules['lp_runtime'].__file__}, not the package in {root}")

    args = json.loads(sys.stdin.readline())
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
    eos = eos_token_ids(model, tok, None)
    questions = load_questions(DatasetConfig(name="jsonl", path=args["prompts"], first_turn_only=True))
    flags = argparse.Namespace(budget=80, window=0, ngram=5, guess=15, levers={}, context=None, topk=None,
                               width=None, max_depth=None, rank_cap=None)
    decoders = {}
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        k = job["k"]
        if k not in decoders:
            decoding, prop = proposer_for(model, k, flags)
            step = TimedStep(EagerStep(model))
            decoders[k] = step, Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, lp=LocalGroup(),
                                        proposers=[prop], copy_kv=False, step=step)
        step, dec = decoders[k]
        step.seconds = 0.0
        t0 = time.perf_counter()
        out = dec.generate(build_prompt(tok, questions[job["prompt"]], []), max_new_tokens=args["max_new_tokens"])
        wall = time.perf_counter() - t0
        print(json.dumps({"steps": out.decoding_steps, "host_s": wall - step.seconds, "step_s": step.seconds,
                          "ids": out.output_ids}), flush=True)


def start(root: str, args) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "--worker", root], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=root)
    proc.stdin.write(json.dumps({"prompts": os.path.abspath(args.prompts),
                                 "max_new_tokens": args.max_new_tokens}) + "\n")
    proc.stdin.flush()
    while (line := proc.stdout.readline()).strip() != "ready":
        if not line:
            raise SystemExit(f"host_time: the worker for {root} stopped before it was ready")
    return proc


def ask(proc: subprocess.Popen, k: int, prompt: int) -> dict:
    proc.stdin.write(json.dumps({"k": k, "prompt": prompt}) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("host_time: a worker stopped (its error is above)")
    return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=str(ROOT / "results/lp_scaling/prompts_he.jsonl"))
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--base", help="git revision timed beside this checkout, interleaved per prompt")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    roots = {"this": str(ROOT)}
    if args.base:
        folder = tempfile.mkdtemp(prefix="host_time_base_")
        archive = subprocess.run(["git", "archive", args.base, "lp_runtime", "scripts"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")
        roots["base"] = folder
    procs = {name: start(root, args) for name, root in roots.items()}
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: host ms per step (median over prompts; mean), "
          f"{args.limit} prompts of {os.path.basename(args.prompts)}, {args.max_new_tokens} new tokens", flush=True)
    for k in args.ks:
        rows = {name: [] for name in procs}
        for i in range(args.limit):
            order = list(procs) if i % 2 == 0 else list(procs)[::-1]
            for name in order:
                rows[name].append(ask(procs[name], k, i))
        line = [f"K = {k}:"]
        for name, rs in rows.items():
            per_step = [1e3 * r["host_s"] / r["steps"] for r in rs]
            total = 1e3 * sum(r["host_s"] for r in rs) / sum(r["steps"] for r in rs)
            model_ms = 1e3 * sum(r["step_s"] for r in rs) / sum(r["steps"] for r in rs)
            line.append(f"{name} {statistics.median(per_step):.2f} ({total:.2f}; model {model_ms:.0f}, "
                        f"{sum(r['steps'] for r in rs)} steps)")
        if "base" in rows:
            same = all((a["steps"], a["ids"]) == (b["steps"], b["ids"]) for a, b in zip(rows["this"], rows["base"]))
            ratio = statistics.median(b["host_s"] / b["steps"] / (a["host_s"] / a["steps"])
                                      for a, b in zip(rows["this"], rows["base"]))
            line.append(f"base / this {ratio:.2f}x; same steps and tokens: {same}")
        print("  ".join(line), flush=True)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()


if __name__ == "__main__":
    main()
