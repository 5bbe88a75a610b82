"""Which window columns' n-grams are accepted: step compression S when only columns 0 .. w-1 feed the lookup.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/window_columns.py --columns 0 1 2 4 8 15 --out results/s_chain

The explanation of docs/benchmarks.md section 6c for S not growing with the LP degree: at (W, N, G) = (15, 5, 15)
the window is fed and advanced exactly as usual (so the Jacobi iteration is unchanged), but only the n-grams
harvested from its first w columns are added to the suffix lookup. If S stops rising at some w < W, the far
columns (those that LP adds more of) contribute no accepted tokens. Same prompts and setting as ``s_table.py
--ks 1`` (2 MT-Bench + 2 HumanEval prompts x 64 tokens, SmolLM2-135M float32, greedy, re-feed commit); every
output is checked against transformers' greedy. Deterministic (no timing): may run on a busy machine.

The restriction is a proposer wrapper (``FirstColumns``) handed to ``Decoder(..., proposers=...)``: it passes the
first w n-grams of each step (the window harvests them in column order) to the product's suffix proposer; a
measurement device only, not a decoding option.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lp_runtime.config import DecodingConfig, ModelConfig  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402
from lp_runtime.proposers import proposers_for  # noqa: E402
from s_table import hf_greedy, prompt_set  # noqa: E402


class FirstColumns:
    """A proposer that sees only the n-grams of window columns 0 .. w-1 (``Proposer`` around ``inner``)."""

    def __init__(self, inner, w: int) -> None:
        self.inner, self.w = inner, w
        self.topk, self.max_depth = inner.topk, inner.max_depth

    def begin(self, prompt, *, do_sample):
        self.inner.begin(prompt, do_sample=do_sample)

    def observe(self, accepted, ngrams, rows=None):
        self.inner.observe(accepted, list(ngrams)[: self.w], rows)

    def propose(self):
        return self.inner.propose()

    def end(self, prompt, output):
        self.inner.end(prompt, output)

    def reset(self):
        self.inner.reset()

    def state(self):
        return self.inner.state()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--columns", type=int, nargs="+", default=[0, 1, 2, 4, 8, 15])
    ap.add_argument("--out", default="results/s_chain")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
    eos = eos_token_ids(model, tok, None)
    prompts = prompt_set(tok)
    chosen = [p for p in prompts if p[0] == "mt_bench"][:2] + [p for p in prompts if p[0] == "humaneval"][:2]
    out_path = ROOT / args.out / "window_columns.json"
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    refs = [hf_greedy(model, p, 64, eos) for _, _, p in chosen]
    for w in args.columns:
        cfg = DecodingConfig(method="lookahead", window_size=15, ngram_size=5, guess_set_size=15, max_depth=10)
        dec = Decoder(model, cfg, eos_token_ids=eos, tokenizer=tok, copy_kv=False,
                      proposers=[FirstColumns(p, w) for p in proposers_for(cfg)])
        rows = []
        for i, ((group, qid, prompt), ref) in enumerate(zip(chosen, refs)):
            if i and group != chosen[i - 1][0]:
                dec.forget_answers()  # one store per prompt set, as s_table.py holds it
            res = dec.generate(prompt, max_new_tokens=64)
            rows.append({"group": group, "id": qid, "new_tokens": len(res.output_ids),
                         "steps": res.decoding_steps, "identical": res.output_ids == ref})
        s = {}
        for g in ("mt_bench", "humaneval"):
            mine = [r for r in rows if r["group"] == g]
            s[g] = sum(r["new_tokens"] for r in mine) / sum(r["steps"] for r in mine)
        results[str(w)] = {"S": s, "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        print(f"columns 0..{w - 1}: S {s['mt_bench']:.2f} MT-Bench, {s['humaneval']:.2f} HumanEval, "
              f"identical {sum(r['identical'] for r in rows)}/{len(rows)}", flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
