"""Multi-rank driver for tests/test_parallel.py: decode a grid of (W, N, G) configs x prompts with LP.

Run under torchrun (gloo on CPU, one thread per rank)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 tests/lp_driver.py --lp 2 \\
        --spec spec.json --out result.json

``spec.json``: {"configs": [{"W": 2, "N": 3, "G": 1}, ...] (optionally with "curve" for decoding=auto), "prompts": [[3, 4, ...], ...], "max_new_tokens": 32}.
Every rank builds the same tiny random Llama (fixed seed), joins LP groups of ``--lp`` (world = dp x lp), and
decodes its data-parallel share of the prompts with the debug consistency check on; global rank 0 writes
{"results": {"<config>/<prompt>": {output_ids, decoding_steps, accept_lengths}}, "stats": ...}.
``--fail`` injects a failure on ``--fail-rank`` after ``--fail-after`` merges: raise, exit (os._exit),
kill (SIGKILL on itself), hang (sleep forever, never entering the collective) or corrupt (a wrong x1).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime import distributed  # noqa: E402
from lp_runtime.config import DecodingConfig, ParallelConfig  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.parallel import setup_parallel, shard_questions  # noqa: E402


def tiny_model():
    """The same tiny random Llama in every process (fixed seed, float32, eval)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval()


def decode_grid(model, configs, prompts, max_new_tokens, lp=None, prompt_ids=None):
    """{"<ci>/<pi>": {output_ids, decoding_steps, accept_lengths}} for every config and the given prompts.

    Re-feed commit everywhere: LP always re-feeds, and K ranks must equal one process in that mode.
    A config with ``"curve": {q: seconds}`` decodes with ``decoding.method=auto`` and one ``CostPolicy`` on that
    curve for all its prompts (as a run does); without ``lp`` it prices steps as ``"price_lp"`` ranks would."""
    from lp_runtime.policy import CostPolicy

    out = {}
    for ci, c in enumerate(configs):
        policy = None
        if "curve" in c:
            policy = CostPolicy({int(q): float(t) for q, t in c["curve"].items()})
            if lp is None:
                policy.price_lp(c.get("price_lp", 1), c["W"])
        dec = Decoder(model, DecodingConfig(method="auto" if policy else "lookahead", window_size=c["W"],
                                            ngram_size=c["N"], guess_set_size=c["G"], commit="refeed"),
                      lp=lp, step_policy=policy)
        for pi in (prompt_ids if prompt_ids is not None else range(len(prompts))):
            g = dec.generate(prompts[pi], max_new_tokens=max_new_tokens)
            out[f"{ci}/{pi}"] = {"output_ids": g.output_ids, "decoding_steps": g.decoding_steps,
                                 "accept_lengths": g.accept_lengths}
    return out


class _Failing:
    """Wraps an LP group; after ``after`` merges on ``rank`` it fails the way ``mode`` says."""

    def __init__(self, inner, mode: str, rank: int, after: int) -> None:
        self.inner, self.mode, self.fail_rank, self.after, self.count = inner, mode, rank, after, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def merge(self, *args, **kwargs):
        self.count += 1
        if distributed.rank() == self.fail_rank and self.count > self.after:
            if self.mode == "raise":
                raise ValueError(f"injected failure on rank {self.fail_rank} at merge {self.count}")
            if self.mode == "exit":
                os._exit(3)
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "hang":
                time.sleep(3600)
            if self.mode == "corrupt":  # a silently wrong merge: the debug consistency check must catch it
                x1, window, cands = self.inner.merge(*args, **kwargs)
                return (x1 + 1) % 64, window, cands
        return self.inner.merge(*args, **kwargs)


@distributed.record
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lp", type=int, required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--fail", choices=["raise", "exit", "kill", "hang", "corrupt"])
    ap.add_argument("--fail-rank", type=int, default=1)
    ap.add_argument("--fail-after", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with open(args.spec) as f:
        spec = json.load(f)

    ctx = setup_parallel(ParallelConfig(lp=args.lp, backend="gloo", timeout_s=args.timeout, debug_check=True))
    model = tiny_model().to(ctx.device)
    lp = ctx.lp_group if args.fail is None else _Failing(ctx.lp_group, args.fail, args.fail_rank, args.fail_after)
    mine = shard_questions(list(range(len(spec["prompts"]))), ctx.dp_rank, ctx.dp_size)
    start = time.perf_counter()
    results = decode_grid(model, spec["configs"], spec["prompts"], spec["max_new_tokens"], lp=lp, prompt_ids=mine)
    elapsed = time.perf_counter() - start
    stats = dict(ctx.lp_group.stats.as_dict(), decode_seconds=elapsed, rank=ctx.rank)
    gathered = distributed.gather_objects_to_rank0({"results": results, "stats": stats})
    if ctx.is_writer:
        merged = {}
        for part in gathered:
            merged.update(part["results"])
        with open(args.out, "w") as f:
            json.dump({"results": merged, "stats": [p["stats"] for p in gathered],
                       "world_size": ctx.world_size, "dp_size": ctx.dp_size}, f)
    ctx.teardown()


if __name__ == "__main__":
    main()
