"""Behaviour lock for refactors of the decode core: a fixed set of decodes, their tokens and step counts as JSON.

Runs (float32, CPU, no timing anywhere):

* one process, a tiny random Llama (vocab 64): plain greedy, fixed (W, N, G) = (3, 4, 3) and (7, 5, 7), the
  paper's candidates (``decoding=paper``: the single-key pool, re-feed), and ``decoding=auto``'s cost policy on a
  SAVED latency curve (``CURVE`` below), each over 4 prompts answered by one decoder in order (so the answer
  store and the policy's calibration carry over as in a run);
* seeded sampling on a peaked vocab-8 Llama at (3, 4, 3) and under the cost policy, 4 seeds each;
* lookahead parallelism: the same tiny runs (re-feed commit, as LP does) under ``torchrun --nproc-per-node=2``
  (gloo), and in one process priced as 2 ranks;
* SmolLM2-135M (bundled): 2 short chat prompts x 48 tokens at (3, 4, 3) and under the cost policy.

Each run records output token ids, ``decoding_steps`` and ``accept_lengths``. Usage::

    python scripts/equivalence.py --out results/equivalence/before.json
    python scripts/equivalence.py --compare results/equivalence/before.json   # exit 1 on any difference

The JSON is written with sorted keys, so "the same runs" means byte-identical files.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

# A saved float32 2-core CPU-like curve {q: seconds}: dearer per token past q = 8, flat below.
CURVE = {1: 0.020, 2: 0.021, 4: 0.022, 8: 0.024, 16: 0.034, 32: 0.055, 64: 0.100}
FIXED = {"w3n4g3": (3, 4, 3), "w7n5g7": (7, 5, 7)}
NEW_TOKENS = 40


def tiny_prompts() -> list[list[int]]:
    """4 prompts over vocab 64 with repeats (so the suffix lookup finds matches)."""
    rng = random.Random(0)
    out = []
    for n in (12, 20, 28, 36):
        base = [rng.randrange(64) for _ in range(n // 2)]
        out.append(base + base[: n - len(base)])
    return out


def make_decoder(model, run: str, *, lp=None, price_lp: int = 1, eos=(), tokenizer=None):
    """The decoder of one named run (the only part of this script that follows the core's API)."""
    from lp_runtime.config import DecodingConfig
    from lp_runtime.decoder import Decoder
    from lp_runtime.policy import CostPolicy

    copy_kv = lp is None and price_lp == 1  # LP re-feeds; one process priced as LP re-feeds too
    # successors=false: the lock's runs predate the successor table, which decoding.successors=auto adds under LP
    if run == "greedy":
        return Decoder(model, DecodingConfig(method="greedy"), eos_token_ids=eos, tokenizer=tokenizer, lp=lp)
    if run == "pool":  # the paper's candidates: single-key pool, newest first, separate chains, re-feed
        cfg = DecodingConfig(method="paper", window_size=3, ngram_size=4, guess_set_size=3, max_depth=10)
        return Decoder(model, cfg, eos_token_ids=eos, tokenizer=tokenizer, lp=lp)
    if run == "auto":
        policy = CostPolicy(CURVE)
        if lp is None and price_lp > 1:
            policy.price_lp(price_lp, 3)
        cfg = DecodingConfig(method="auto", window_size=3, ngram_size=6, guess_set_size=4, max_depth=24,
                             successors="false")
        return Decoder(model, cfg, eos_token_ids=eos, tokenizer=tokenizer, lp=lp, step_policy=policy, copy_kv=copy_kv)
    w, n, g = FIXED[run]
    cfg = DecodingConfig(method="lookahead", window_size=w, ngram_size=n, guess_set_size=g, max_depth=10,
                         successors="false")
    return Decoder(model, cfg, eos_token_ids=eos, tokenizer=tokenizer, lp=lp, copy_kv=copy_kv)


def record(out) -> dict:
    return {"output_ids": list(out.output_ids), "decoding_steps": out.decoding_steps,
            "accept_lengths": list(out.accept_lengths)}


def decode_runs(model, runs, prompts, max_new_tokens, *, lp=None, price_lp=1, eos=(), tokenizer=None) -> dict:
    out = {}
    for run in runs:
        dec = make_decoder(model, run, lp=lp, price_lp=price_lp, eos=eos, tokenizer=tokenizer)
        for i, p in enumerate(prompts):
            out[f"{run}/{i}"] = record(dec.generate(p, max_new_tokens=max_new_tokens))
    return out


def decode_sampling(model, *, lp=None, price_lp=1) -> dict:
    from dataclasses import replace

    from lp_runtime.config import SamplingConfig

    prompt, out = [1, 2, 3, 4, 1, 2, 3, 4, 5], {}
    settings = {"t1": SamplingConfig(temperature=1.0),
                "t07k5p9r": SamplingConfig(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.2)}
    for run in ("w3n4g3", "auto"):
        dec = make_decoder(model, run, lp=lp, price_lp=price_lp)
        for name, cfg in settings.items():
            for seed in range(4):
                o = dec.generate(prompt, max_new_tokens=24, sampling=replace(cfg, seed=seed))
                out[f"{run}/{name}/{seed}"] = record(o)
    return out


def tiny_part(lp=None, price_lp: int = 1) -> dict:
    from lp_driver import build_tiny8, tiny_model

    runs = ("greedy", "w3n4g3", "w7n5g7", "pool", "auto") if price_lp == 1 and lp is None else ("w3n4g3", "w7n5g7",
                                                                                                "pool", "auto")
    return {"greedy": decode_runs(tiny_model(), runs, tiny_prompts(), NEW_TOKENS, lp=lp, price_lp=price_lp),
            "sampling": decode_sampling(build_tiny8(), lp=lp, price_lp=price_lp)}


def smollm2_part() -> dict:
    from lp_runtime.config import ModelConfig
    from lp_runtime.checks import eos_token_ids
    from lp_runtime.models import load_model

    model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
    prompts = []
    for text in ("Name three colours of the rainbow and say one thing about each.",
                 "Write a Python function that returns the sum of a list of numbers."):
        enc = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    eos = eos_token_ids(model, tok, None)
    return {"greedy": decode_runs(model, ("w3n4g3", "auto"), prompts, 48, eos=eos, tokenizer=tok)}


def lp_worker(out_path: str) -> None:
    """Under torchrun: every rank decodes the tiny runs with LP 2; rank 0 writes them."""
    from lp_runtime.config import ParallelConfig
    from lp_runtime.parallel import setup_parallel

    torch.set_num_threads(1)
    ctx = setup_parallel(ParallelConfig(lp=2, backend="gloo", timeout_s=120, debug_check=True))
    result = tiny_part(lp=ctx.lp_group)
    if ctx.is_writer:
        with open(out_path, "w") as f:
            json.dump(result, f)
    ctx.teardown()


def lp_part() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lp.json")
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        os.path.abspath(__file__), "--lp-worker", out], check=True, env=env, cwd=ROOT)
        with open(out) as f:
            return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--compare", help="a JSON written before: exit 1 unless this run's JSON is byte-identical")
    ap.add_argument("--lp-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.lp_worker:
        lp_worker(args.lp_worker)
        return 0
    torch.set_num_threads(1)
    result = {"one_process": tiny_part(), "priced_lp2": tiny_part(price_lp=2), "lp2": lp_part(),
              "smollm2": smollm2_part()}
    text = json.dumps(result, sort_keys=True, indent=1) + "\n"
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    if args.compare:
        with open(args.compare) as f:
            before = f.read()
        if before != text:
            old = json.loads(before)
            diff = [f"{part}/{kind}/{key}" for part in sorted(set(old) | set(result))
                    for kind in sorted(set(old.get(part, {})) | set(result.get(part, {})))
                    for key in sorted(set(old.get(part, {}).get(kind, {})) | set(result.get(part, {}).get(kind, {})))
                    if old.get(part, {}).get(kind, {}).get(key) != result.get(part, {}).get(kind, {}).get(key)]
            shown = ", ".join(diff[:20]) + (f", ... ({len(diff) - 20} more)" if len(diff) > 20 else "")
            print(f"DIFFERENT from {args.compare}: {len(diff)} runs differ: {shown}", file=sys.stderr)
            return 1
        print(f"identical to {args.compare}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
