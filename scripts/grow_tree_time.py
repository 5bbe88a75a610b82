"""Host time of the tree a step proposes under LP, this checkout's against ``--base``'s, side by side in one run.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/grow_tree_time.py --base HEAD~1 --k 8 \\
        --prompts results/lp_scaling/prompts_he.jsonl --limit 2

The tree a step proposes (``successors.grow_tree``, then ``cap_ranks``) is grown on the host before the forward
pass; under LP at K = 8 it has about 600 nodes (``scripts/lp_scaling.py``'s per-rank budget of 80), so its time adds
to every step whatever the GPU does. This script decodes ``--limit`` prompts (first turns, chat template,
SmolLM2-135M float32 greedy, ``--max-new-tokens``) with the product's proposer for K ranks
(``lp_scaling.proposer_for``) and records each step's arguments to ``grow_tree`` (root, the suffix lookup's tree,
the token before the root). Then it replays every recorded step with the tables and calibrations as the run left
them, through this checkout's ``grow_tree`` and ``cap_ranks`` (the cut to the per-rank budget, K > 1) and through
``--base``'s (``git show BASE:lp_runtime/successors.py``, loaded as a module of the package), interleaved,
``--reps`` times, and prints the median milliseconds per step of each and whether the trees, grown and cut, are
identical on every step.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lp_runtime import parallel, successors  # noqa: E402
from lp_runtime.config import DatasetConfig, ModelConfig  # noqa: E402
from lp_runtime.data import build_prompt, load_questions  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402
from lp_runtime.parallel import LocalGroup  # noqa: E402
from lp_scaling import proposer_for  # noqa: E402


class Recorder:
    """Wraps the ``SuccessorProposer``: records each step's ``grow_tree`` inputs before proposing."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self):
        p = self.inner
        suffix = p.suffix.propose() if p.suffix is not None else None  # the suffix proposer's tree is pure
        self.calls.append((p._root, suffix, p._prev))
        return p.propose()


def base_module(rev: str):
    """``lp_runtime/successors.py`` at ``rev``, imported as ``lp_runtime.successors_base``."""
    source = subprocess.run(["git", "show", f"{rev}:lp_runtime/successors.py"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "successors_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("lp_runtime.successors_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision whose grow_tree is timed beside this checkout's")
    ap.add_argument("--k", type=int, default=8, help="LP degree (tree of about K x (budget - 1) nodes)")
    ap.add_argument("--prompts", default="results/lp_scaling/prompts_he.jsonl")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    # lp_scaling.proposer_for's other flags, at lp_scaling's defaults
    args.budget, args.window, args.ngram, args.guess, args.levers = 80, 0, 5, 15, {}
    args.context = args.topk = args.width = args.max_depth = args.rank_cap = None
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    base = base_module(args.base)
    model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
    eos = eos_token_ids(model, tok, None)
    decoding, prop = proposer_for(model, args.k, args)
    rec = Recorder(prop)
    dec = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, lp=LocalGroup(), proposers=[rec],
                  copy_kv=False)
    questions = load_questions(DatasetConfig(name="jsonl", path=args.prompts, first_turn_only=True))[:args.limit]
    for q in questions:
        dec.generate(build_prompt(tok, q, []), max_new_tokens=args.max_new_tokens)
    kw = dict(suffix_cal=prop.suffix_cal, succ_cal=prop.succ_cal, max_depth=prop.max_depth, width=prop.width,
              pair=prop._pair)
    times = {(name, part): [] for name in ("this", "base") for part in ("grow", "cap")}
    same, capped = True, prop.rank_budget is not None and args.k > 1
    for _ in range(args.reps):
        for name, mod in (("this", successors), ("base", base)):
            parallel._tree_plan.cache_clear()  # each step's tree is new: no plan is cached in a run
            t0 = time.perf_counter()
            trees = [mod.grow_tree(root, suffix, prop._table, prop.budget, root_prev=prev, **kw)
                     for root, suffix, prev in rec.calls]
            t1 = time.perf_counter()
            cut = [mod.cap_ranks(t, args.k, prop.rank_budget) if capped else t for t in trees]
            times[name, "grow"].append((t1 - t0) / len(rec.calls))
            times[name, "cap"].append((time.perf_counter() - t1) / len(rec.calls))
            if name == "this":
                mine = trees + cut
            else:
                same = same and all((a.tree.tokens, a.tree.parents, a.tree.prob, a.succ_rank, a.pair_rank)
                                    == (b.tree.tokens, b.tree.parents, b.tree.prob, b.succ_rank, b.pair_rank)
                                    for a, b in zip(mine, trees + cut))
    ms = {key: 1e3 * statistics.median(v) for key, v in times.items()}
    nodes = statistics.mean(len(t.tree) for t in mine[: len(rec.calls)])
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, K = {args.k}, {len(rec.calls)} steps of "
          f"{len(questions)} prompts, {nodes:.0f} nodes a tree, median of {args.reps}: grow_tree this "
          f"{ms['this', 'grow']:.2f} ms, {args.base} {ms['base', 'grow']:.2f} ms "
          f"({ms['base', 'grow'] / ms['this', 'grow']:.2f}x); cap_ranks this {ms['this', 'cap']:.2f} ms, "
          f"{args.base} {ms['base', 'cap']:.2f} ms; identical trees: {same}")


if __name__ == "__main__":
    main()
