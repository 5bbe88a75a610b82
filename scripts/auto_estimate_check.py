"""How close decoding=auto's start-up estimate comes to the speedup its policy then achieves (issue 20; no timing).

On a given latency curve, ``auto.calibrate`` (what the start-up line prints) is compared with a "bench": other
MT-Bench / HumanEval prompts decoded by a fresh ``Decoder`` with a fresh ``CostPolicy``, as a run decodes, priced
on the same curve (speedup = tokens x latency(1) / sum latency(tokens fed per step); ``auto.expected_speedup``).
Step counts and tokens fed do not depend on the machine's speed, so this may run on a busy machine. Also prints
the old estimate (3 prompts x 32 tokens, nothing warm) for comparison::

    python scripts/auto_estimate_check.py --curve h200 --bench 6 --new 128      # ~10 min on the shared 2-core CPU
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime import auto, data  # noqa: E402
from lp_runtime.config import DatasetConfig, DecodingConfig, ModelConfig  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402
from lp_runtime.policy import CostPolicy  # noqa: E402

CURVES = {  # seconds; SmolLM2-135M float32: a 2-core CPU (docs/design.md 7b), one H200 (results/device_h200)
    "cpu": {1: 0.0385, 2: 0.0618, 3: 0.0758, 4: 0.0589, 8: 0.0592, 16: 0.0706, 32: 0.095, 64: 0.1428},
    "h200": {1: 0.0365, 2: 0.0408, 3: 0.0441, 4: 0.0413, 8: 0.0427, 16: 0.0417, 32: 0.0422, 64: 0.0428,
             128: 0.0430, 256: 0.0432},
}


def bench_prompts(tok, n: int, skip: set) -> list[list[int]]:
    """n first turns of MT-Bench and HumanEval (half each) not among the calibration prompts."""
    out = []
    for name in ("mt_bench", "humaneval"):
        qs = data.load_questions(DatasetConfig(name=name, first_turn_only=True))
        ids = [data.build_prompt(tok, q, []) for q in qs[1::7]]
        out += [p for p in ids if tuple(p) not in skip][: (n + 1) // 2]
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--curve", choices=sorted(CURVES), default="h200")
    ap.add_argument("--bench", type=int, default=6)
    ap.add_argument("--new", type=int, default=auto.CALIBRATION_TOKENS)
    ap.add_argument("--ngram-size", type=int, default=6)
    ap.add_argument("--guess-set-size", type=int, default=4)
    ap.add_argument("--max-depth", type=int, default=24)
    args = ap.parse_args()
    model, tok = load_model(ModelConfig(dtype="float32", device="cpu"))
    eos, curve = eos_token_ids(model, tok, None), CURVES[args.curve]
    limits = DecodingConfig(method="auto", ngram_size=args.ngram_size, guess_set_size=args.guess_set_size,
                            max_depth=args.max_depth)  # conf/decoding/auto.yaml's bounds by default
    decoding = auto.auto_decoding(curve, limits)

    def fresh():
        return Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, step_policy=CostPolicy(curve))

    calib_prompts = auto.calibration_prompts(tok)
    est = auto.calibrate(fresh(), calib_prompts, curve, max_new_tokens=args.new, budget_s=1e9)
    old = auto.calibrate(fresh(), auto.calibration_prompts(tok, num_chat=2, num_code=1), curve, max_new_tokens=32,
                         warm=0, budget_s=1e9)
    bench = fresh()
    outs = [bench.generate(p, max_new_tokens=args.new) for p in bench_prompts(tok, args.bench, {tuple(p) for p in calib_prompts})]
    achieved = auto.expected_speedup(curve, sum(len(o.output_ids) for o in outs), [q for o in outs for q in o.step_tokens])
    print(json.dumps({"curve": args.curve, "setting": [decoding.window_size, decoding.ngram_size, decoding.guess_set_size],
                      "estimate": est, "old_estimate": old, "achieved": achieved,
                      "estimate_over_achieved": est["expected_speedup"] / achieved,
                      "old_over_achieved": old["expected_speedup"] / achieved}, indent=1))


if __name__ == "__main__":
    main()
