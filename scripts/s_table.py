"""Step compression S of lookahead decoding per setting and candidate variant, and its LP scaling (issue 10).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/s_table.py --settings 15,5,15 7,5,7 0,4,2 \\
        --variants counts tree suffix pool --ks 1 2 4 8 --out results/s_table

Prompts (fixed, so anyone can repeat it): the first turn of the first 2 MT-Bench questions of each of the 8
categories (16 prompts, SmolLM2 chat template via ``data.build_prompt``) and HumanEval problems 0-7 (raw
prompt). SmolLM2-135M float32, greedy, ``--max-new-tokens`` (128). S = new tokens / forward passes (every
step emits tokens); no timing is taken, so S and tokens fed per step are deterministic and can be measured
on a busy machine. Every output is compared with transformers' greedy ``generate`` (cached in
``OUT/refs_128.json``, in prompt order); a difference counts as a near-tie only when the plain model's top-2 logit gap at the
first differing token is below 1e-4.

Variants (candidate-source levers, passed to the decoder's proposers, ``proposers.proposers_for``; recorded
under their former ``DecodingConfig`` names): ``pool`` = the reference code's n-gram pool keyed by the newest
token, separate chains (``decoding=paper``'s ``PoolProposer``); ``suffix`` = suffix lookup, separate chains,
recency ranking; ``tree`` = suffix lookup as a token tree, recency ranking; ``counts`` = tree + counts ranking
(the default). Candidate-source variant (issue 10's levers, docs/benchmarks.md section 6b): ``xq`` = counts +
the answer store in sampled calls too (one store per prompt set, filled in prompt order); the other levers
measured there were removed after the measurement (commit 01c5f01 still has them and their variants).
``--lookup-kw`` passes ``SuffixProposer`` arguments to every suffix proposer (e.g. ``{"ngram_keys": "head"}``),
``--seed`` the window's random seed (the noise control), ``--start k`` skips the first k selected prompts (their
reference outputs, identical to the decoder's, fill the store), so a long run can be split over processes.
``--commit`` chooses copy-KV (default; the next step feeds only the bonus token) or re-feed.

LP scaling (``--ks``): W = G = K x 15, N = 5, the ``counts`` variant with re-feed commit (what K ranks run),
in ONE process (K ranks give the same tokens and steps); per-rank input tokens come from the shard plan
(``parallel.tree_plan``) of every step's actual candidate tree, averaged over steps.

Each run is saved as ``OUT/runs/<name>.json`` and skipped when present (rerun to resume); the script ends by
printing the markdown tables of every run in ``OUT`` and writing ``OUT/s_table.json``.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lp_runtime.config import ConfigError, DatasetConfig, DecodingConfig, ModelConfig  # noqa: E402
from lp_runtime.data import build_prompt, load_questions  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402
from lp_runtime.parallel import LocalGroup, tree_plan  # noqa: E402
from lp_runtime.proposers import SuffixProposer, proposers_for  # noqa: E402
from lp_runtime.verify import greedy_verify  # noqa: E402

VARIANTS = {
    "pool": dict(lookup="pool", tree=False, ranking="recency"),
    "suffix": dict(lookup="suffix", tree=False, ranking="recency"),
    "tree": dict(lookup="suffix", tree=True, ranking="recency"),
    "counts": dict(lookup="suffix", tree=True, ranking="counts"),
    # a candidate source on top of counts (issue 10's levers)
    "xq": dict(lookup="suffix", tree=True, ranking="counts", cross_question=True),
}
NEAR_TIE = 1e-4
KNOWN_FIELDS = {f.name for f in dataclasses.fields(DecodingConfig)} | {"lookup", "tree", "ranking", "commit",
                                                                      "cross_question"}
SUFFIX_KW = set(inspect.signature(SuffixProposer).parameters) - {"ngram_size", "num_leaves"}


def variant_config(w, n, g, variant, commit="copy", seed=0):
    """(DecodingConfig, the record of the run's setting: its fields plus the variant's levers and commit)."""
    cfg = DecodingConfig(method="paper" if VARIANTS[variant]["lookup"] == "pool" else "lookahead", window_size=w,
                         ngram_size=n, guess_set_size=g, seed=seed, max_depth=10)
    return cfg, {**vars(cfg), "lookup": "suffix", "cross_question": None, **VARIANTS[variant], "commit": commit}


def variant_proposers(cfg, record, lookup_kw=None, cross_question=None):
    """The proposers of a recorded variant (``variant_config``), ``lookup_kw`` passed to a suffix proposer."""
    levers = {"tree": record["tree"]} if record["lookup"] == "pool" else \
        {"tree": record["tree"], "ranking": record["ranking"], **(lookup_kw or {})}
    xq = record["cross_question"] if cross_question is None else cross_question
    return proposers_for(cfg, cross_question=xq, **levers)


def prompt_set(tok):
    """[(group, id, token ids)]: 16 MT-Bench first turns (the first 2 questions of each category, listed
    first-of-each-category then second-of-each, so a prefix of 8 covers every category) + HumanEval 0-7."""
    mt = load_questions(DatasetConfig(name="mt_bench", first_turn_only=True))
    per_cat: dict[str, list] = {}
    for q in mt:
        per_cat.setdefault(q.category, [])
        if len(per_cat[q.category]) < 2:
            per_cat[q.category].append(q)
    assert len(per_cat) == 8, sorted(per_cat)
    out = [("mt_bench", qs[i].question_id, build_prompt(tok, qs[i], [])) for i in range(2) for qs in per_cat.values()]
    he = load_questions(DatasetConfig(name="humaneval", limit=8))
    return out + [("humaneval", q.question_id, build_prompt(tok, q, [])) for q in he]


@torch.inference_mode()
def hf_greedy(model, prompt, n, eos):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         eos_token_id=eos, pad_token_id=eos[0] if eos else 0)
    return out[0, len(prompt):].tolist()


def exactness(model, prompt, ids, ref) -> str:
    """"identical", "near-tie" (the first difference is a top-2 logit gap < NEAR_TIE) or "DIFFERENT (gap ...)"."""
    if ids == ref:
        return "identical"
    i = next((j for j, (a, b) in enumerate(zip(ids, ref)) if a != b), None)
    gap = top2_gap(model, list(prompt) + ref[:i]) if i is not None else float("inf")
    return "near-tie" if gap < NEAR_TIE else f"DIFFERENT (gap {gap:.3g})"


@torch.inference_mode()
def top2_gap(model, prefix):
    logits = model(torch.tensor([prefix])).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


class PlanProbe(LocalGroup):
    """One process that also records, per step, each of K ranks' input tokens under the shard plan."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k, self.rank_tokens = k, []

    def plan(self, num_pending, num_columns, num_levels, parents):
        row = []
        for cols, nodes in tree_plan(num_pending, num_columns, num_levels, parents, self.k):
            row.append(num_pending + (max(cols) if cols else 0) + num_levels * len(cols) + len(nodes))
        self.rank_tokens.append(row)
        return super().plan(num_pending, num_columns, num_levels, parents)


def run(model, tok, eos, prompts, refs, name, decoding, max_new, out_dir, probe_k=None, lookup_kw=None, start=0):
    path = out_dir / "runs" / f"{name}.json"
    partial = path.with_suffix(".partial.json")
    if path.exists():
        return json.loads(path.read_text())
    return _run(model, tok, eos, prompts, refs, name, decoding, max_new, out_dir, probe_k, lookup_kw, path, partial,
                start)


def _run(model, tok, eos, prompts, refs, name, decoding, max_new, out_dir, probe_k, lookup_kw, path, partial, start):
    probe = PlanProbe(probe_k) if probe_k else None
    cfg, record = decoding
    dec = Decoder(model, cfg, eos_token_ids=eos, tokenizer=tok, lp=probe, copy_kv=record["commit"] == "copy",
                  proposers=variant_proposers(cfg, record, lookup_kw))
    has_store = any(getattr(p, "store", None) is not None for p in dec.proposers)
    rows = json.loads(partial.read_text())["rows"] if partial.exists() else []
    done = start + len(rows)
    if done and has_store:
        # --start or a resumed run: the store is rebuilt from the earlier prompts' outputs (token-identical to
        # the references), exactly what an unbroken run holds
        print("  (the store is rebuilt from the reference outputs of the earlier prompts)")
        for (group, _, prompt), ref in zip(prompts[:done], refs[:done]):
            if group == prompts[done - 1][0]:
                for p in dec.proposers:
                    p.end(prompt, ref)
    prev_group = prompts[done - 1][0] if done else None
    prompts, refs = prompts[start:], refs[start:]
    t0 = time.time()
    path.parent.mkdir(parents=True, exist_ok=True)
    for (group, qid, prompt), ref in list(zip(prompts, refs))[len(rows):]:
        if probe:
            probe.rank_tokens = []
        if prev_group not in (None, group):
            dec.forget_answers()  # one store per prompt set, as one generate run per dataset would hold
        prev_group = group
        out = dec.generate(prompt, max_new_tokens=max_new)
        status = exactness(model, prompt, out.output_ids, ref)
        row = {"group": group, "id": qid, "new_tokens": len(out.output_ids), "steps": out.decoding_steps,
               "fed_tokens": sum(out.step_tokens), "status": status}
        if probe:
            row["rank_tokens"] = [sum(r[k] for r in probe.rank_tokens) for k in range(probe_k)]
        rows.append(row)
        print(f"  {name} {group} {qid}: S {row['new_tokens'] / row['steps']:.2f} {status}", flush=True)
        res = {"name": name, "decoding": record, "rows": rows, "seconds": time.time() - t0,
               "lookup_kw": lookup_kw or {},
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "max_new_tokens": max_new}
        partial.write_text(json.dumps(res, indent=1) + "\n")  # a long run can be stopped and resumed
    partial.rename(path)
    return res


def replay(prompts, refs, name, decoding, max_new, out_dir, lookup_kw=None):
    """S of a pool-only (W = 0) setting without the model: with no window the candidates depend only on the
    accepted text, and greedy verification accepts the longest tree path that matches the greedy continuation
    plus the bonus token, so replaying transformers' greedy output gives the decoder's exact steps (whenever
    its output is token-identical, which the model-in-the-loop runs and tests check). Fed tokens assume
    copy-KV (1 pending token + the tree)."""
    cfg, record = decoding
    assert cfg.window_size == 0
    path = out_dir / "runs" / f"{name}.json"
    rows, sets = [], {}
    for (group, qid, prompt), ref in zip(prompts, refs):  # a store (xq only) per prompt set, as one run holds
        lk = sets.setdefault(group, variant_proposers(cfg, record, lookup_kw, bool(record["cross_question"])))[0]
        lk.begin(prompt, do_sample=False)
        pos = steps = fed = 0
        while pos < len(ref):
            tree = lk.propose()
            out = []
            for i in range(len(tree)):
                toks = [tree.tokens[m] for m in tree.path(i)]
                end = pos + len(toks)
                out.append(ref[end] if end < len(ref) and ref[pos:end] == toks else -1)
            accepted, _ = greedy_verify(ref[pos], tree.tokens, tree.parents, out)
            accepted = accepted[: len(ref) - pos]
            lk.observe(accepted, ())
            pos, steps, fed = pos + len(accepted), steps + 1, fed + 1 + len(tree)
        rows.append({"group": group, "id": qid, "new_tokens": len(ref), "steps": steps, "fed_tokens": fed,
                     "status": "replay"})
        lk.end(prompt, ref)
    res = {"name": name, "decoding": record, "rows": rows, "seconds": 0.0, "max_new_tokens": max_new,
           "lookup_kw": lookup_kw or {},
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "replay": True}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    return res


def summarize(res):
    out = {}
    for group in ("mt_bench", "humaneval"):
        rows = [r for r in res["rows"] if r["group"] == group]
        steps = sum(r["steps"] for r in rows) or float("nan")
        out[group] = {"S": sum(r["new_tokens"] for r in rows) / steps, "fed_per_step": sum(r["fed_tokens"] for r in rows) / steps,
                      "identical": sum(r["status"] == "identical" for r in rows),
                      "near_tie": sum(r["status"] == "near-tie" for r in rows), "prompts": len(rows)}
        if rows and "rank_tokens" in rows[0]:
            k = len(rows[0]["rank_tokens"])
            out[group]["rank_tokens_per_step"] = [sum(r["rank_tokens"][i] for r in rows) / steps for i in range(k)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="*", default=["15,5,15", "7,5,7", "0,4,2"], help="W,N,G triples")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--commit", default="copy", choices=["copy", "refeed"])
    ap.add_argument("--ks", type=int, nargs="*", default=[], help="LP scaling: W = G = K x 15, N = 5")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--replay", action="store_true",
                    help="W = 0 settings only: replay transformers' greedy output through the lookup (no model)")
    ap.add_argument("--mt-limit", type=int, default=16, help="first k MT-Bench prompts (8 = one per category)")
    ap.add_argument("--he-limit", type=int, default=8, help="first k HumanEval prompts")
    ap.add_argument("--out", default="results/s_table")
    ap.add_argument("--seed", type=int, default=0, help="decoding.seed (the window's random initial guesses)")
    ap.add_argument("--start", type=int, default=0,
                    help="model runs: skip the first k selected prompts (their outputs still fill the cross-question "
                         "store), so one run can be split over processes")
    ap.add_argument("--lookup-kw", default="{}", help='JSON of SuffixProposer arguments, e.g. {"max_key": 6}')
    args = ap.parse_args()
    settings = []  # checked before the model loads: a typo fails at once, not after the references
    for setting in args.settings:
        try:
            w, n, g = (int(x) for x in setting.split(","))
            DecodingConfig(method="lookahead", window_size=w, ngram_size=n, guess_set_size=g)
        except (ValueError, ConfigError) as e:
            ap.error(f"--settings {setting!r}: give W,N,G as three integers, e.g. 15,5,15 ({e})")
        if args.replay and w:
            ap.error(f"--settings {setting!r} with --replay: replay needs W = 0 (no window)")
        settings.append((w, n, g))
    try:
        lookup_kw = json.loads(args.lookup_kw)
    except ValueError as e:
        ap.error(f"--lookup-kw {args.lookup_kw!r} is not JSON ({e})")
    if not isinstance(lookup_kw, dict) or set(lookup_kw) - SUFFIX_KW:
        ap.error(f"--lookup-kw {args.lookup_kw!r}: give a JSON object of SuffixProposer arguments, any of "
                 f"{', '.join(sorted(SUFFIX_KW))}")
    if min(args.mt_limit, args.he_limit, args.start) < 0 or not 1 <= args.max_new_tokens <= 128:
        ap.error("--mt-limit, --he-limit and --start must be >= 0, --max-new-tokens 1..128 (the cached references)")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out_dir = ROOT / args.out
    out_dir.mkdir(parents=True, exist_ok=True)

    model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
    eos = eos_token_ids(model, tok, None)
    prompts = prompt_set(tok)
    ref_path = out_dir / "refs_128.json"  # greedy is prefix-consistent: shorter runs compare with a prefix
    if ref_path.exists():
        refs = json.loads(ref_path.read_text())
    else:
        refs = [hf_greedy(model, p, 128, eos) for _, _, p in prompts]
        ref_path.write_text(json.dumps(refs) + "\n")
    keep = [i for i, (grp, _, _) in enumerate(prompts)
            if sum(g == grp for g, _, _ in prompts[: i + 1]) <= (args.mt_limit if grp == "mt_bench" else args.he_limit)]
    prompts = [prompts[i] for i in keep]
    refs = [refs[i][: args.max_new_tokens] for i in keep]
    tag = "" if (args.mt_limit, args.he_limit, args.max_new_tokens) == (16, 8, 128) else \
        f"_mt{args.mt_limit}he{args.he_limit}t{args.max_new_tokens}"

    for w, n, g in settings:
        for v in args.variants:
            dec = variant_config(w, n, g, v, args.commit, args.seed)
            if args.replay:
                kw = lookup_kw
                kw_tag = "".join(f"_{k}{v}" for k, v in kw.items())
                replay(prompts, refs, f"w{w}n{n}g{g}_{v}{kw_tag}_replay{tag}", dec, args.max_new_tokens, out_dir, kw)
                continue
            kw = lookup_kw
            kw_tag = "".join(f"_{k}{v}" for k, v in kw.items()) + (f"_from{args.start}" if args.start else "") + \
                (f"_seed{args.seed}" if args.seed else "")
            run(model, tok, eos, prompts, refs, f"w{w}n{n}g{g}_{v}{kw_tag}_{args.commit}{tag}", dec, args.max_new_tokens,
                out_dir, lookup_kw=kw, start=args.start)
    for k in args.ks:
        dec = variant_config(15 * k, 5, 15 * k, "counts", "refeed")
        run(model, tok, eos, prompts, refs, f"lp_k{k}{tag}", dec, args.max_new_tokens, out_dir, probe_k=k)

    table = {}
    for path in sorted((out_dir / "runs").glob("*.json")):  # finished runs, then what a stopped run got through
        res = json.loads(path.read_text())
        name = res["name"] + (" (partial)" if path.name.endswith(".partial.json") else "")
        table[name] = {"decoding": res["decoding"], "date": res["date"], "lookup_kw": res.get("lookup_kw", {}),
                       **summarize(res)}
    (out_dir / "s_table.json").write_text(json.dumps(table, indent=1) + "\n")

    print("\n| setting (W, N, G) | variant | commit | MT-Bench S | fed/step | HumanEval S | fed/step | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for name, t in table.items():
        if name.startswith("lp_"):
            continue
        d, m, h = t["decoding"], t["mt_bench"], t["humaneval"]
        variant = max((v for v, kw in VARIANTS.items() if all(d.get(key, False) == val for key, val in kw.items())),
                      key=lambda v: len(VARIANTS[v]), default="?")
        # runs saved with a lever DecodingConfig no longer has (removed after section 6b; commit 01c5f01) show it
        variant += "".join(f" {k}={v}" for k, v in d.items() if k not in KNOWN_FIELDS and v not in (False, "random"))
        variant += "".join(f" {k}={v}" for k, v in t.get("lookup_kw", {}).items())
        ident = "replay" if name.count("_replay") else f"{m['identical'] + h['identical']}/{m['prompts'] + h['prompts']}"
        print(f"| ({d['window_size']}, {d['ngram_size']}, {d['guess_set_size']}) | {variant} | "
              f"{'copy' if 'replay' in name else d['commit']} | {m['S']:.2f} ({m['prompts']}) | {m['fed_per_step']:.1f} | "
              f"{h['S']:.2f} ({h['prompts']}) | {h['fed_per_step']:.1f} | {ident} |")
    lp = {name: t for name, t in table.items() if name.startswith("lp_")}
    if lp:
        print("\n| K | (W, N, G) | MT-Bench S | HumanEval S | tokens/step, 1 process (MT / HE) | "
              "per-rank tokens/step (MT) | per-rank tokens/step (HE) | identical |")
        print("|---|---|---|---|---|---|---|---|")
        for name, t in sorted(lp.items(), key=lambda kv: kv[1]["decoding"]["window_size"]):
            d, m, h = t["decoding"], t["mt_bench"], t["humaneval"]
            ranks = lambda x: "[" + ", ".join(f"{v:.0f}" for v in x.get("rank_tokens_per_step", [])) + "]"  # noqa: E731
            print(f"| {d['window_size'] // 15} | ({d['window_size']}, 5, {d['guess_set_size']}) | {m['S']:.2f} | "
                  f"{h['S']:.2f} | {m['fed_per_step']:.0f} / {h['fed_per_step']:.0f} | {ranks(m)} | {ranks(h)} | "
                  f"{m['identical'] + h['identical']}/{m['prompts'] + h['prompts']} |")


if __name__ == "__main__":
    main()
