"""Deterministic check of the cost policy (no timing): S, tokens fed per step and the speedup each setting would
have on given latency curves, plus how well the lookup's raw acceptance estimates are calibrated.

Decodes the same prompts with fixed settings (FeedAll) and with ``CostPolicy`` on each curve; step counts and
tokens fed do not depend on the machine's speed, so this may run on a busy machine. The predicted speedup of a
run on a curve is (tokens / sum of latency(tokens fed) over its steps) x latency(1) (``auto.expected_speedup``).
The calibration table feeds every proposed node (a flat curve) and counts, per (depth, raw-probability bucket),
how often a node whose parent was accepted was accepted itself::

    python scripts/policy_check.py --chat 4 --code 3 --new 64         # ~10 min on the shared 2-core CPU
    python scripts/policy_check.py --curve results/latency/latency_curves.json   # the measured curves instead
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime import auto, data  # noqa: E402
from scripts.bench import select_per_category  # noqa: E402
from lp_runtime.config import DatasetConfig, DecodingConfig, ModelConfig  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.policy import FeedAll  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402
from lp_runtime.policy import AcceptanceCalibration, CostPolicy  # noqa: E402

# The issue-9 curves (ms; SmolLM2, 2-core CPU, 2026-11-30; docs/design.md section 7b).
CURVES = {"float32": {1: 38.5, 2: 61.8, 3: 75.8, 4: 58.9, 8: 59.2, 16: 70.6, 32: 95.0, 64: 142.8},
          "bfloat16": {1: 21.9, 2: 21.5, 3: 21.0, 4: 22.1, 8: 24.4, 16: 28.0, 32: 36.8, 64: 52.6}}


class _Recording(AcceptanceCalibration):
    """Calibration that also sums the raw estimates per bucket (to compare raw with observed)."""

    def __init__(self) -> None:
        super().__init__(strength=1e-9)
        self.raw: dict[tuple[int, int], float] = {}

    def update(self, depth: int, raw: float, accepted: bool) -> None:
        super().update(depth, raw, accepted)
        k = self.bucket(depth, raw)
        self.raw[k] = self.raw.get(k, 0.0) + raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chat", type=int, default=4, help="MT-Bench first turns, one per category")
    ap.add_argument("--code", type=int, default=3, help="HumanEval problems")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--curve", default=None, help="latency_curves.json (scripts/latency_curve.py): its static_mask curves")
    args = ap.parse_args()
    curves = CURVES
    if args.curve:
        with open(args.curve, encoding="utf-8") as f:
            every = json.load(f)["curves_s"]
        curves = {k.split("/")[0]: {int(q): t for q, t in c.items()} for k, c in every.items() if k.endswith("static_mask")}
    model, tok = load_model(ModelConfig(device="cpu", dtype="float32"))
    eos = eos_token_ids(model, tok, None)
    qs = select_per_category(data.load_questions(DatasetConfig(name="mt_bench", first_turn_only=True)), 1)[: args.chat]
    qs += data.load_questions(DatasetConfig(name="humaneval", limit=args.code))
    prompts = [data.build_prompt(tok, q, []) for q in qs]
    auto = DecodingConfig(method="auto", window_size=0, ngram_size=6, guess_set_size=4)
    settings = [("FeedAll W0 N4 G2", DecodingConfig(method="lookahead", window_size=0, ngram_size=4, guess_set_size=2, max_depth=10), FeedAll),
                ("FeedAll W0 N6 G4", DecodingConfig(method="lookahead", window_size=0, ngram_size=6, guess_set_size=4, max_depth=10), FeedAll)]
    settings += [(f"CostPolicy on {name} N6 G4", auto, lambda c=c: CostPolicy(c)) for name, c in curves.items()]
    print("| setting | S | fed/step | " + " | ".join(f"predicted speedup on {n}" for n in curves) + " |")
    print("|---|---|---|" + "---|" * len(curves))
    for label, decoding, make in settings:
        dec = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, step_policy=make())
        tokens, fed = 0, []
        for p in prompts:
            out = dec.generate(p, max_new_tokens=args.new)
            tokens += len(out.output_ids)
            fed += out.step_tokens
        preds = " | ".join(f"{auto.expected_speedup(c, tokens, fed):.3f}" for c in curves.values())
        print(f"| {label} | {tokens / len(fed):.3f} | {sum(fed) / len(fed):.2f} | {preds} |", flush=True)

    cal = _Recording()
    dec = Decoder(model, auto, eos_token_ids=eos, tokenizer=tok, step_policy=CostPolicy({1: 1.0, 512: 1.0}, calibration=cal))
    for p in prompts:
        dec.generate(p, max_new_tokens=args.new)
    print("\n| depth | raw bucket | trials | mean raw estimate | accepted |\n|---|---|---|---|---|")
    for k in sorted(cal.trials):
        n = cal.trials[k]
        print(f"| {k[0]} | {k[1]} | {n} | {cal.raw[k] / n:.3f} | {cal.successes[k] / n:.3f} |")


if __name__ == "__main__":
    main()
