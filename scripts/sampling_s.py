"""Step compression S (tokens / decoding steps) of lookahead sampling vs greedy on MT-Bench first turns.

    .venv/bin/python scripts/sampling_s.py --limit 20 --max-new-tokens 256 --temperatures 0 0.7 1.0 \\
        --window 0 --ngram 3 --guess 1 --seed 0 --output results/sampling_s/w0n3g1.json

Prints one line per temperature (0 = greedy): S, mean accepted tokens per step, tokens/s; and a JSON summary.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime.config import DatasetConfig, DecodingConfig, ModelConfig, SamplingConfig  # noqa: E402
from lp_runtime.data import build_prompt, load_questions  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled:smollm2")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--ngram", type=int, default=3)
    ap.add_argument("--guess", type=int, default=1)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default=None, help="also write the JSON summary to this file")
    args = ap.parse_args()

    model, tok = load_model(ModelConfig(path=args.model, dtype="float32", device="auto"))
    eos = eos_token_ids(model, tok, None)
    questions = load_questions(DatasetConfig(name="mt_bench", limit=args.limit, first_turn_only=True))
    prompts = [build_prompt(tok, q, []) for q in questions]
    decoding = DecodingConfig(method="lookahead", max_depth=10, window_size=args.window, ngram_size=args.ngram, guess_set_size=args.guess)
    dec = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok)
    rows = []
    for temp in args.temperatures:
        tokens = steps = 0
        wall = 0.0
        for i, prompt in enumerate(prompts):
            cfg = SamplingConfig(temperature=temp, top_p=args.top_p, seed=args.seed + i)
            start = time.perf_counter()
            out = dec.generate(prompt, max_new_tokens=args.max_new_tokens, sampling=cfg)
            wall += time.perf_counter() - start
            tokens, steps = tokens + len(out.output_ids), steps + out.decoding_steps
        row = {"temperature": temp, "S": tokens / steps, "tokens": tokens, "steps": steps,
               "tokens_per_s": tokens / wall}
        rows.append(row)
        print(f"T={temp:<4} S={row['S']:.3f} tokens={tokens} steps={steps} tok/s={row['tokens_per_s']:.1f}", flush=True)
    summary = {"model": args.model, "W": args.window, "N": args.ngram, "G": args.guess, "top_p": args.top_p,
               "questions": len(prompts), "max_new_tokens": args.max_new_tokens, "seed": args.seed,
               "threads": torch.get_num_threads(), "results": rows}
    print(json.dumps(summary))
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
