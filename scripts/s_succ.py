"""Step compression S with the successor table and tree growth (issue 18): ``Decoder`` in the loop, deterministic.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/s_succ.py --variants succ11 succ79 --out results/s_succ
    OMP_NUM_THREADS=1 .venv/bin/python scripts/s_succ.py --variants succ11 --mt-limit 4 --he-limit 4 \\
        --max-new-tokens 64 --out results/s_succ

Same prompts, model, references and S definition as ``scripts/s_table.py`` (16 MT-Bench first turns, chat
template, + HumanEval 0-7, raw; SmolLM2-135M float32 greedy; references in ``results/s_table/refs_128.json``).
Each variant (``VARIANTS``, options over ``BASE``; ``--set`` overrides) is a ``Decoder`` whose one proposer is a
``successors.SuccessorProposer``: node budget, window (W, N), suffix lookup (with the answer store) on or off, the
table kept across the prompts of a set (one decoder per set, as one run holds it) or a new decoder per prompt, the
pair table (``context`` 2), and a step policy: feed the whole tree, or (``curve``) ``policy.CostPolicy`` on a FIXED
latency curve (``results/s_succ/curve_cpu2t_float32.json``, the float32 profile decoding=auto used on this
machine), so what decoding=auto would feed is replayed deterministically.
One process, copy-KV; ``--ks`` runs each variant at K x the budget, W and G with re-feed commit, as K LP ranks run
it (one process gives the same tokens and steps as K ranks: tests/test_successors.py), recording each rank's
tokens per step under ``parallel.tree_plan``. The 4 + 4 x 64 runs of 2026-12-01 19:05-19:40 UTC were taken with a
copy of the decode loop in this script before the core exposed the rows (commit df6fc5c); the Decoder gives the
same steps (checked on a subset, docs/benchmarks.md section 6d).

Every output is compared with transformers' greedy (a difference is a near-tie only when the top-2 logit gap at
the first differing token is below 1e-4). Runs land in ``OUT/runs/NAME.json`` (skipped when present) and a
summary line per run is printed.
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

from lp_runtime.checks import vocab_size  # noqa: E402
from lp_runtime.config import DecodingConfig, ModelConfig  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402
from lp_runtime.parallel import LocalGroup, tree_plan  # noqa: E402
from lp_runtime.policy import CostPolicy, LatencyCurve  # noqa: E402
from lp_runtime.proposers import AnswerStore, SuffixProposer  # noqa: E402
from lp_runtime.successors import SuccessorProposer, successor_proposers  # noqa: E402
from s_table import exactness, hf_greedy, prompt_set, summarize  # noqa: E402

BASE = dict(budget=11, W=0, N=4, G=2, suffix=True, across=True, k=8, width=8, max_depth=16, context=1,
            curve=None, suffix_depth=10, table=True, prefill=False)
CURVE = "results/s_succ/curve_cpu2t_float32.json"  # decoding=auto's float32 profile of this machine, fixed
CURVE_MKL_AUTO = "results/s_succ/curves/cpu2t_float32_mklauto_2026-12-04.json"
VARIANTS = {
    # <= 12 tokens a step (1 pending + 11 nodes)
    "table11": dict(suffix=False),
    "succ11": dict(),
    "succ11_pf": dict(prefill=True),  # + the prompt's rows at prefill, only into empty rows (2026-12-02)
    "pair11": dict(context=2),
    "pair11_top16": dict(context=2, k=16),  # the product's one-process table before 2026-12-02 11:30 UTC
    "pair11_pf": dict(context=2, k=16, prefill=True),  # the pair table's top 16 + the prompt's rows (2026-12-03)
    # decoding=lookahead decoding.successors=true in one process: the product's own proposer
    # (successors.successor_proposers; the other options are ignored but W, N, G)
    "product11": dict(product=True),
    "succ11_reset": dict(across=False),
    # ~80 tokens a step
    "table79": dict(budget=79, suffix=False),
    "succ79": dict(budget=79, G=15, N=5),
    "pair79": dict(budget=79, G=15, N=5, context=2),
    "succ79_reset": dict(budget=79, G=15, N=5, across=False),
    "succ42_w7": dict(budget=42, W=7, N=5, G=7),
    # decoding=auto's setting (conf/decoding/auto.yaml: (0, 6, 4), max_depth 24) with the successor table, as the
    # bench's +successors lever builds it (successor_proposers: budget = the suffix proposer's 24-node cap + 1), the
    # cost policy on the fixed float32 curve choosing what to feed
    "auto25": dict(budget=25, N=6, G=4, suffix_depth=24, max_depth=24, curve=CURVE),
    "auto": dict(budget=25, N=6, G=4, suffix_depth=24, max_depth=24, curve=CURVE, table=False),  # the default today
    "auto25_pair": dict(budget=25, N=6, G=4, suffix_depth=24, max_depth=24, curve=CURVE, context=2),
    # the same two on the curve decoding=auto measured under MKL_CBWR=AUTO on an AMD EPYC (docs 6e)
    "auto_mklauto": dict(budget=25, N=6, G=4, suffix_depth=24, max_depth=24, curve=CURVE_MKL_AUTO, table=False),
    "auto25_mklauto": dict(budget=25, N=6, G=4, suffix_depth=24, max_depth=24, curve=CURVE_MKL_AUTO),
    "auto49_mklauto": dict(budget=49, N=6, G=4, suffix_depth=24, max_depth=24, curve=CURVE_MKL_AUTO),
    "auto25_mklauto_direct": dict(budget=25, N=6, G=4, suffix_depth=24, max_depth=24, curve=CURVE_MKL_AUTO),
}


class RankProbe(LocalGroup):
    """One process that records, per step, each of K ranks' input tokens under ``parallel.tree_plan``."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k, self.rank_tokens = k, []

    def plan(self, num_pending, num_columns, num_levels, parents):
        plans = tree_plan(num_pending, num_columns, num_levels, parents, self.k)
        self.rank_tokens.append([num_pending + (max(c) if c else 0) + num_levels * len(c) + len(n) for c, n in plans])
        return super().plan(num_pending, num_columns, num_levels, parents)


def fixed_curve(path: str = CURVE) -> LatencyCurve:
    """The fixed latency curve at ``path`` (``latency_s``: {q: seconds of a forward pass of q tokens})."""
    return LatencyCurve({int(q): float(t) for q, t in json.loads((ROOT / path).read_text())["latency_s"].items()})


def make_decoder(model, eos, opt, lp_k, refeed):
    """A ``Decoder`` with one ``SuccessorProposer`` (over a suffix proposer with an answer store, or alone)."""
    cfg = DecodingConfig(method="lookahead", window_size=opt["W"], ngram_size=opt["N"], guess_set_size=max(opt["G"], 1),
                         max_depth=10, successors="true")
    suffix = SuffixProposer(opt["N"], opt["G"], store=AnswerStore(), max_depth=opt.get("suffix_depth", 10)) \
        if opt["suffix"] else None
    if opt.get("product"):
        (prop,) = successor_proposers(cfg, vocab_size(model), lp_size=lp_k)
    else:
        prop = SuccessorProposer(vocab_size(model), opt["budget"] * lp_k, suffix=suffix, k=opt["k"],
                                 max_depth=opt["max_depth"], width=opt["width"],
                                 context=opt.get("context", 1), prefill=opt.get("prefill", False)) \
            if opt.get("table", True) else suffix
    probe = RankProbe(lp_k)
    policy = CostPolicy(fixed_curve(opt["curve"])) if opt["curve"] else None
    dec = Decoder(model, cfg,
                  eos_token_ids=eos, lp=probe, proposers=[prop], copy_kv=not refeed, step_policy=policy)
    return dec, probe


def run_variant(model, eos, prompts, refs, name, opt, max_new, out_dir, lp_k, refeed):
    path = out_dir / "runs" / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    rows, t0, group, dec, curve = [], time.time(), None, None, fixed_curve(opt["curve"] or CURVE)
    for (grp, qid, prompt), ref in zip(prompts, refs):
        if grp != group or not opt["across"]:  # one decoder (table, store, policy) per prompt set, as one run holds
            dec, probe = make_decoder(model, eos, opt, lp_k, refeed)
        group = grp
        probe.rank_tokens = []
        out = dec.generate(prompt, max_new_tokens=max_new)
        status = exactness(model, prompt, out.output_ids, ref)
        steps, fed = out.decoding_steps, sum(out.step_tokens)
        rows.append({"group": grp, "id": qid, "new_tokens": len(out.output_ids), "steps": steps, "fed_tokens": fed,
                     "status": status, "modeled_s": sum(curve(q) for q in out.step_tokens),
                     "rank_tokens": [sum(r[i] for r in probe.rank_tokens) for i in range(lp_k)]})
        print(f"  {name} {grp} {qid}: S {len(out.output_ids) / steps:.2f} fed/step {fed / steps:.1f} modeled "
              f"{len(out.output_ids) * curve(1) / rows[-1]['modeled_s']:.3f}x {status}", flush=True)
    res = {"name": name, "options": opt, "lp_k": lp_k, "refeed": refeed, "rows": rows, "seconds": time.time() - t0,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "max_new_tokens": max_new}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    return res


def modeled_speedup(res, group: str) -> float:
    """Greedy's modeled time over the run's on the run's fixed curve (its ``curve`` option, else ``CURVE``): new
    tokens x curve(1) / the sum over steps of curve(tokens fed) (prefill left out; nan for runs recorded before
    ``modeled_s``)."""
    rows = [r for r in res["rows"] if r["group"] == group]
    if not rows or any("modeled_s" not in r for r in rows):
        return float("nan")
    curve = fixed_curve(res["options"].get("curve") or CURVE)
    return sum(r["new_tokens"] for r in rows) * curve(1) / sum(r["modeled_s"] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["succ11"], choices=list(VARIANTS))
    ap.add_argument("--ks", type=int, nargs="*", default=[], help="LP degrees: budget and W x K, re-feed commit "
                    "(what K ranks run; K = 1 included when given); without --ks one process with copy-KV")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--mt-limit", type=int, default=16)
    ap.add_argument("--he-limit", type=int, default=8)
    ap.add_argument("--mt-skip", type=int, default=0, help="leave out the first k of the selected MT-Bench prompts "
                    "(--mt-limit 16 --mt-skip 8: the second of each category)")
    ap.add_argument("--set", default="{}", help='JSON of option overrides, e.g. {"width": 4} (added to the name)')
    ap.add_argument("--out", default="results/s_succ")
    args = ap.parse_args()
    if not 1 <= args.max_new_tokens <= 128 or min(args.mt_limit, args.he_limit, args.mt_skip) < 0 \
            or min(args.ks, default=1) < 1:
        ap.error("--max-new-tokens 1..128 (the cached references), limits and --mt-skip >= 0, --ks >= 1")
    extra = json.loads(args.set)
    if set(extra) - set(BASE):
        ap.error(f"--set {args.set}: options are {sorted(BASE)}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out_dir = ROOT / args.out
    model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
    eos = eos_token_ids(model, tok, None)
    prompts = prompt_set(tok)
    ref_path = ROOT / "results" / "s_table" / "refs_128.json"
    if ref_path.exists():
        refs = json.loads(ref_path.read_text())
    else:
        refs = [hf_greedy(model, p, 128, eos) for _, _, p in prompts]
    rank = [sum(g == grp for g, _, _ in prompts[: i + 1]) for i, (grp, _, _) in enumerate(prompts)]  # 1-based
    keep = [i for i, (grp, _, _) in enumerate(prompts) if (rank[i] <= args.he_limit if grp != "mt_bench"
                                                           else args.mt_skip < rank[i] <= args.mt_limit)]
    prompts, refs = [prompts[i] for i in keep], [refs[i][: args.max_new_tokens] for i in keep]
    tag = "" if (args.mt_limit, args.he_limit, args.max_new_tokens) == (16, 8, 128) else \
        f"_mt{args.mt_limit}he{args.he_limit}t{args.max_new_tokens}"
    tag += f"_skip{args.mt_skip}" if args.mt_skip else ""
    tag += "".join(f"_{k}{v}" for k, v in extra.items())
    for v in args.variants:
        for k in args.ks or [1]:
            opt = {**BASE, **VARIANTS[v], **extra}
            opt["W"], opt["G"] = opt["W"] * k, opt["G"] * k
            name = f"{v}{f'_k{k}' if args.ks else ''}{tag}"
            res = run_variant(model, eos, prompts, refs, name, opt, args.max_new_tokens, out_dir, k, bool(args.ks))
            s = summarize(res)
            print(f"{name}: " + "  ".join(
                f"{g} S {x['S']:.3f} fed/step {x['fed_per_step']:.1f} modeled {modeled_speedup(res, g):.3f}x "
                f"ranks/step {[round(t, 1) for t in x.get('rank_tokens_per_step', [])]} "
                f"identical {x['identical']}/{x['prompts']}"
                for g, x in s.items() if x["prompts"]), flush=True)


if __name__ == "__main__":
    main()
