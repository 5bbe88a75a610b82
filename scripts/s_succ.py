"""Step compression S with the successor table and tree growth (issue 18), model in the loop, deterministic.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/s_succ.py --variants succ11 succ79 --out results/s_succ
    OMP_NUM_THREADS=1 .venv/bin/python scripts/s_succ.py --variants succ79 --ks 1 2 4 8 --mt-limit 4 --he-limit 4 \\
        --max-new-tokens 64 --out results/s_succ

Same prompts, model, references and S definition as ``scripts/s_table.py`` (16 MT-Bench first turns, chat
template, + HumanEval 0-7; SmolLM2-135M float32 greedy; references in ``results/s_table/refs_128.json``).
The decode loop here is a compact copy of ``Decoder.generate`` for one process (greedy only, no streaming) that
also takes each kept logits row's top-k into a ``successors.SuccessorTable`` and grows the candidate tree with
``successors.grow_tree``; it will be replaced by the ``Decoder`` with a successor proposer once the core exposes
the rows. Each variant is a named set of options (``VARIANTS``): node budget, window (W, N), suffix lookup on/off,
the table on/off, which rows fill the table (kept rows, every window cell, the prompt's rows at prefill), the
table kept across the prompts of a set or reset per prompt. ``--ks`` multiplies the budget (and W) by K and runs
with re-feed commit as K LP ranks would (one process gives the same tokens and steps as K ranks); per-rank tokens
come from ``parallel.tree_plan`` of every step's tree.

Every output is compared with transformers' greedy (a difference is a near-tie only when the top-2 logit gap at
the first differing token is below 1e-4). Runs land in ``OUT/runs/NAME.json`` (skipped when present), the
summary in ``OUT/s_succ.json``, and a markdown table is printed.
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

from lp_runtime.config import ModelConfig  # noqa: E402
from lp_runtime.kv import commit, new_cache  # noqa: E402
from lp_runtime.layout import LayoutCache, MaskBuffer  # noqa: E402
from lp_runtime.lookup import AnswerStore, SuffixLookup  # noqa: E402
from lp_runtime.models import eos_token_ids, load_model  # noqa: E402
from lp_runtime.parallel import shard_plan, tree_plan  # noqa: E402
from lp_runtime.stopping import StopChecker  # noqa: E402
from lp_runtime.successors import SuccessorProposer, SuccessorTable  # noqa: E402
from lp_runtime.support import vocab_size  # noqa: E402
from lp_runtime.verify import greedy_verify  # noqa: E402
from lp_runtime.window import JacobiWindow  # noqa: E402
from s_table import NEAR_TIE, hf_greedy, prompt_set, summarize, top2_gap  # noqa: E402

BASE = dict(budget=11, W=0, N=4, G=2, suffix=True, table=True, rows="kept", prefill=False, across=True, store=True,
            k=8, width=8, max_depth=16, probs=False, split=True)
VARIANTS = {
    # <= 12 tokens a step (1 pending + 11 nodes)
    "suffix11": dict(table=False),  # the suffix lookup's tree alone, regrown by calibrated estimates
    "table11": dict(suffix=False, store=False),
    "succ11": dict(),
    "succ11_prefill": dict(prefill=True),
    "succ11_reset": dict(across=False),
    "succ11_probs": dict(probs=True),
    # ~80 tokens a step
    "suffix79": dict(budget=79, G=15, N=5, table=False),
    "table79": dict(budget=79, suffix=False, store=False),
    "succ79": dict(budget=79, G=15, N=5),
    "succ79_prefill": dict(budget=79, G=15, N=5, prefill=True),
    "succ79_reset": dict(budget=79, G=15, N=5, across=False),
    "succ79_probs": dict(budget=79, G=15, N=5, probs=True),
    "succ42_w7": dict(budget=42, W=7, N=5, G=7),
    "succ42_w7_allrows": dict(budget=42, W=7, N=5, G=7, rows="all"),
}


def split_plan(num_pending, num_columns, num_levels, parents, world, max_units=64):
    """``parallel.tree_plan`` with heavy subtrees split: while the largest unit (a subtree plus the ancestor chain
    above it, fed again on its rank) exceeds the even share, it is replaced by its root's child subtrees, each
    carrying the chain and the root. Returns each rank's (columns, node indices ascending, ancestor-closed)."""
    kids = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)

    def subtree(r):
        out, stack = [], [r]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(kids.get(n, ()))
        return out

    units = [((), r, len(subtree(r))) for r in kids.get(-1, ())]
    window = (num_columns - 1 + num_levels * num_columns) if num_columns else 0
    target = -(-(window + len(parents)) // world)
    while units and len(units) < max_units:
        i = max(range(len(units)), key=lambda u: (units[u][2], -u))
        chain, r, size = units[i]
        if size <= target or not kids.get(r):
            break
        units[i : i + 1] = [(chain + (r,), c, len(chain) + 1 + len(subtree(c))) for c in kids[r]]
    plan = shard_plan(num_pending, num_columns, num_levels, tuple(u[2] for u in units), world)
    out = []
    for cols, idx in plan:
        nodes = set()
        for u in idx:
            nodes.update(units[u][0])
            nodes.update(subtree(units[u][1]))
        out.append((cols, tuple(sorted(nodes))))
    return tuple(out)


def _forward(model, cache, past, layouts, masks, pending, window, cols, tree, all_rows):
    num_levels = window.num_levels if cols else 0
    layout, depth, inner, keep = layouts.get(len(pending), cols, num_levels, tree.parents)
    ids = layout.input_ids(pending, window.row0, window.levels, tree.tokens)
    extra = [i for i in range(layout.tree_start) if i not in set(keep.tolist())] if all_rows else []
    keep_all = torch.cat([keep, torch.tensor(extra, dtype=torch.long)]) if extra else keep
    out = model(input_ids=torch.tensor([ids]), position_ids=(depth + past)[None],
                attention_mask=None if layout.is_chain else masks.view(inner, past), past_key_values=cache,
                use_cache=True, logits_to_keep=keep_all)
    logits = out.logits[0]
    argmax = logits[: keep.numel()].argmax(-1).tolist()
    return ids, keep_all.tolist(), argmax, logits, len(ids), layout.tree_start


@torch.inference_mode()
def decode(model, prompt, max_new, eos, opt, proposer, store, lp_k, refeed=False):
    """One prompt; returns (output ids, steps, fed tokens, per-rank tokens summed over steps)."""
    layouts, masks = LayoutCache(torch.device("cpu"), model.dtype), MaskBuffer(model.dtype, "cpu")
    stopper, cache = StopChecker(max_new, eos, (), None), new_cache()
    out = model(input_ids=torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True,
                logits_to_keep=len(prompt) - 1 if opt["prefill"] else torch.empty(0, dtype=torch.long))
    if opt["prefill"]:
        top = out.logits[0].float().softmax(-1).topk(opt["k"])
        proposer.record(prompt[:-1], top.indices.numpy(), top.values.numpy())
    past, pending = len(prompt) - 1, [prompt[-1]]
    lookup = SuffixLookup(opt["N"], opt["G"], store=store, ngram_keys="all") if opt["suffix"] else None
    if lookup is not None:
        lookup.extend(prompt)
    window = JacobiWindow(opt["W"], opt["N"])
    if window.active:
        window.reset(prompt, 0)
    steps, fed, ranks = 0, 0, [0] * lp_k
    while True:
        grown = proposer.propose(pending[-1], lookup.propose() if lookup is not None else None)
        tree, cols = grown.tree, list(range(opt["W"])) if window.active else []
        ids, keep, argmax, logits, num_fed, tree_start = _forward(model, cache, past, layouts, masks, pending, window,
                                                                  cols, tree, opt["rows"] == "all")
        x1, new_window, node_out = argmax[0], argmax[1 : 1 + len(cols)], argmax[1 + len(cols):]
        accepted, path = greedy_verify(x1, tree.tokens, tree.parents, node_out)
        if not refeed:  # copy-KV
            commit(cache, num_fed, len(pending), [tree_start + n for n in path])
            past += len(pending) + len(path)
        else:
            commit(cache, num_fed, len(pending))
            past += len(pending)
        plan = split_plan if opt["split"] else tree_plan
        for r, (c, nodes) in enumerate(plan(len(pending), len(cols), window.num_levels if cols else 0,
                                            tree.parents, lp_k)):
            ranks[r] += len(pending) + (max(c) if c else 0) + (window.num_levels if cols else 0) * len(c) + len(nodes)
        steps, fed = steps + 1, fed + num_fed
        proposer.observe(grown, range(len(tree)), path)
        # table rows in time order: window cells, rejected nodes, c, the accepted path last (the truest context)
        on_path = {tree_start + n for n in path}
        first = [j for j, i in enumerate(keep) if i != len(pending) - 1 and i not in on_path]
        last = [keep.index(len(pending) - 1)] + [keep.index(tree_start + n) for n in path]
        order = first + last
        top = logits[order].float().softmax(-1).topk(opt["k"]) if opt["probs"] else logits[order].topk(opt["k"])
        proposer.record([ids[keep[j]] for j in order], top.indices.numpy(), top.values.numpy())
        stopper.push(accepted)
        if stopper.finish_reason is not None:
            break
        for ngram in window.advance(pending[-1], new_window) if cols else []:
            lookup.add_ngram(ngram) if lookup is not None else None
        if lookup is not None:
            lookup.extend(accepted)
        pending = accepted if refeed else accepted[-1:]
    return list(stopper.output), steps, fed, ranks


def run_variant(model, eos, prompts, refs, name, opt, max_new, out_dir, lp_k, refeed):
    path = out_dir / "runs" / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    rows, t0 = [], time.time()
    proposer, store, group = None, None, None
    for (grp, qid, prompt), ref in zip(prompts, refs):
        if grp != group or not opt["across"] or proposer is None:
            table = SuccessorTable(vocab_size(model), opt["k"], opt["probs"]) if opt["table"] else None
            proposer = SuccessorProposer(table, opt["budget"] * lp_k, max_depth=opt["max_depth"], width=opt["width"])
        if grp != group:
            store = AnswerStore() if opt["store"] else None
        group = grp
        output, steps, fed, ranks = decode(model, prompt, max_new, eos, opt, proposer, store, lp_k, refeed)
        if store is not None:
            store.add(prompt, output)
        status = "identical"
        if output != ref:
            i = next((j for j, (a, b) in enumerate(zip(output, ref)) if a != b), None)
            gap = top2_gap(model, list(prompt) + ref[:i]) if i is not None else float("inf")
            status = "near-tie" if gap < NEAR_TIE else f"DIFFERENT (gap {gap:.3g})"
        rows.append({"group": grp, "id": qid, "new_tokens": len(output), "steps": steps, "fed_tokens": fed,
                     "status": status, "rank_tokens": ranks})
        print(f"  {name} {grp} {qid}: S {len(output) / steps:.2f} fed/step {fed / steps:.1f} {status}", flush=True)
    res = {"name": name, "options": opt, "lp_k": lp_k, "refeed": refeed, "rows": rows, "seconds": time.time() - t0,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "max_new_tokens": max_new}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["succ11"], choices=list(VARIANTS))
    ap.add_argument("--ks", type=int, nargs="*", default=[], help="LP degrees: budget and W x K, re-feed commit "
                    "(what K ranks run; K = 1 included when given); without --ks one process with copy-KV")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--mt-limit", type=int, default=16)
    ap.add_argument("--he-limit", type=int, default=8)
    ap.add_argument("--set", default="{}", help='JSON of option overrides, e.g. {"width": 4} (added to the name)')
    ap.add_argument("--out", default="results/s_succ")
    args = ap.parse_args()
    if not 1 <= args.max_new_tokens <= 128 or min(args.mt_limit, args.he_limit) < 0 or min(args.ks, default=1) < 1:
        ap.error("--max-new-tokens 1..128 (the cached references), limits >= 0, --ks >= 1")
    extra = json.loads(args.set)
    if set(extra) - set(BASE):
        ap.error(f"--set {args.set}: options are {sorted(BASE)}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out_dir = ROOT / args.out
    model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
    eos = eos_token_ids(model, tok, None)
    prompts = prompt_set(tok)
    ref_path = ROOT / "results" / "s_table" / "refs_128.json"
    refs = json.loads(ref_path.read_text()) if ref_path.exists() else [hf_greedy(model, p, 128, eos) for _, _, p in prompts]
    keep = [i for i, (grp, _, _) in enumerate(prompts)
            if sum(g == grp for g, _, _ in prompts[: i + 1]) <= (args.mt_limit if grp == "mt_bench" else args.he_limit)]
    prompts, refs = [prompts[i] for i in keep], [refs[i][: args.max_new_tokens] for i in keep]
    tag = "" if (args.mt_limit, args.he_limit, args.max_new_tokens) == (16, 8, 128) else \
        f"_mt{args.mt_limit}he{args.he_limit}t{args.max_new_tokens}"
    tag += "".join(f"_{k}{v}" for k, v in extra.items())
    for v in args.variants:
        for k in args.ks or [1]:
            opt = {**BASE, **VARIANTS[v], **extra}
            if k > 1:
                opt["W"] = opt["W"] * k
                opt["G"] = opt["G"] * k
            name = f"{v}{f'_k{k}' if args.ks else ''}{tag}"
            res = run_variant(model, eos, prompts, refs, name, opt, args.max_new_tokens, out_dir, k, bool(args.ks))
            s = summarize(res)
            print(f"{name}: " + "  ".join(
                f"{g} S {x['S']:.3f} fed/step {x['fed_per_step']:.1f} ranks/step "
                f"{[round(t, 1) for t in x.get('rank_tokens_per_step', [])]} identical {x['identical']}/{x['prompts']}"
                for g, x in s.items() if x["prompts"]), flush=True)


if __name__ == "__main__":
    main()
