"""Multi-rank driver for tests/test_sampling.py: lookahead SAMPLING with LP over K ranks (gloo, CPU).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 tests/sampling_lp_driver.py --spec s.json --out r.json

``spec``: {"prompt": [...], "W": 2, "N": 3, "G": 3, "max_new_tokens": 3, "seeds": [0, 1, ...],
"sampling": {SamplingConfig fields}}. Every rank builds the tiny vocab-8 model of ``build_tiny8`` and decodes
each seed with LP degree = world size and the per-step consistency check on; rank 0 writes
{"outputs": [[ids...], ...], "accept_lengths": [...], "stats": {"collectives": n}}; a list of specs (one launch)
gives a list of those.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime.config import DecodingConfig, ParallelConfig, SamplingConfig  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.parallel import setup_parallel  # noqa: E402

TINY = dict(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
            pad_token_id=None)


def build_tiny8():
    """A tiny Llama with an 8-token vocabulary and peaked distributions (same weights in every process)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model


def decode_seeds(model, spec, lp=None):
    dec = Decoder(model, DecodingConfig(window_size=spec["W"], ngram_size=spec["N"], guess_set_size=spec["G"],
                                        commit="refeed"), lp=lp)  # LP re-feeds; one process must match it
    outs, lens = [], []
    for s in spec["seeds"]:
        o = dec.generate(spec["prompt"], max_new_tokens=spec["max_new_tokens"],
                         sampling=SamplingConfig(**{**spec["sampling"], "seed": s}))
        outs.append(o.output_ids)
        lens.append(o.accept_lengths)
    return outs, lens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = json.loads(open(args.spec).read())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ctx = setup_parallel(ParallelConfig(lp=world, backend="gloo", timeout_s=60.0, debug_check=True))
    model = build_tiny8()
    results = []
    for one in spec if isinstance(spec, list) else [spec]:  # a list: several specs in one launch
        before = ctx.lp_group.stats.as_dict()["collectives"]
        outs, lens = decode_seeds(model, one, lp=ctx.lp_group)
        results.append({"outputs": outs, "accept_lengths": lens,
                        "stats": {"collectives": ctx.lp_group.stats.as_dict()["collectives"] - before}})
    if ctx.is_writer:
        with open(args.out, "w") as f:
            json.dump(results if isinstance(spec, list) else results[0], f)
    ctx.teardown()


if __name__ == "__main__":
    main()
