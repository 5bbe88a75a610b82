"""S against the lookahead-parallel degree K with the successor table (issue 18), deterministic, one process.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/lp_scaling.py --prompts results/lp_scaling/prompts.jsonl \\
        --ks 1 2 4 8 --max-new-tokens 64 --out results/lp_scaling

An LP run of K ranks gives the same tokens and steps as one process with the same total budget (every rank
proposes the same tree from the same state, computes its share and the merge reassembles the step; the successor
table's rows travel in the step's one all-gather; tests/test_parallel.py checks K = 2 and 3 real ranks against one
process, tests/test_lp_auto.py the lp2 job with the default decoding.successors=auto). So S(K) is measured here in ONE process: a ``Decoder`` with re-feed commit (what LP runs) and the proposer the
product builds for K ranks (``successors.successor_proposers``, as ``Decoder`` does under ``parallel.lp=K`` with
``decoding.successors=auto``; at K = 1 the table is on as with ``decoding.successors=true``): a
``successors.SuccessorProposer`` (suffix lookup + answer store + the pair table, top-16 rows, 16 successors tried
per node when K > 1 and 8 at K = 1) whose node budget is K x (``--budget`` - 1), cut so that no rank feeds more than
``--budget`` - 1 nodes; the suffix lookup's G is K x ``--guess`` and the window K x ``--window`` columns; and a
``LocalGroup`` that records, for every step, the tokens each of K ranks would feed under ``parallel.tree_plan``
(pending + row 0 prefix + levels x columns + nodes, an ancestor chain counted on every rank that repeats it).
``--context``, ``--topk``, ``--width``, ``--max-depth`` and ``--rank-cap`` override the product's values, ``--set``
passes other ``SuccessorProposer`` arguments and the suffix lookup's ``store_min_key`` (JSON), and ``--stops``
records where each step's acceptance stopped (``StopProbe``; ``OUT/stops_k{K}.json``).

``--prompts``: a question file in the Spec-Bench / FastChat format (``{"question_id", "category", "turns"}``
per line); first turns, chat template (``data.build_prompt``); SmolLM2-135M float32 greedy. Every output is
compared with transformers' greedy ``generate`` (cached in ``OUT/refs.json``). Writes ``OUT/lp_scaling.json``: a
list, one object per K with ``k``, ``S``, ``tokens_per_step`` (one process), ``per_rank_tokens`` (mean per step,
per rank), ``max_rank_tokens`` (the busiest rank per step, averaged), ``bytes_per_step`` (the all-gather: K slots
of (1 + top-k) int64 per kept row of the largest rank share), ``identical``, and the same per category group
(``groups``: "humaneval" for categories starting with it, "mt_bench" for the rest, a question without one
included). Prints a markdown table.
After every prompt the rows so far go to ``OUT/partial_k{K}.json`` (what a stopped run measured).
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lp_runtime.checks import vocab_size  # noqa: E402
from lp_runtime.config import DatasetConfig, DecodingConfig, ModelConfig, is_int  # noqa: E402
from lp_runtime.data import DatasetError, build_prompt, load_questions  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402
from lp_runtime.parallel import LocalGroup, tree_plan  # noqa: E402
from lp_runtime.successors import SuccessorProposer, accepted_path, successor_proposers  # noqa: E402
from s_table import hf_greedy  # noqa: E402


class RankProbe(LocalGroup):
    """One process that records, per step, each of K ranks' input tokens and kept rows under ``tree_plan``."""

    def __init__(self, k: int, trees=None) -> None:
        super().__init__()
        self.k, self.rank_tokens, self.rank_rows, self.trees = k, [], [], trees

    def plan(self, num_pending, num_columns, num_levels, parents):
        plans = tree_plan(num_pending, num_columns, num_levels, parents, self.k)
        if self.trees is not None:  # each step's shape, to price other plans offline
            self.trees.write(json.dumps([num_pending, num_columns, num_levels, list(parents)]) + "\n")
        self.rank_tokens.append([num_pending + (max(c) if c else 0) + num_levels * len(c) + len(n) for c, n in plans])
        self.rank_rows.append(max(1 + len(c) + len(n) for c, n in plans))
        return super().plan(num_pending, num_columns, num_levels, parents)


class StopProbe:
    """Wraps the ``SuccessorProposer`` (``--stops``): before each ``observe``, where the step's acceptance stopped
    and whether the bonus token was in a table row there: ``expected`` (the tree's expected accepted nodes under
    its own estimates: the sum over nodes of the product of the estimates along the path), ``depth`` (accepted
    tree nodes), ``kids`` (children the
    stop node had in the tree), ``rank`` / ``pair_rank`` (the bonus token's rank in the stop node's token-table /
    pair-table row, -1 when absent), ``rows`` (the two rows' lengths); and whether the bonus was in a row the
    tables no longer hold: ``older`` = (how many rows back, rank there) in the newest of the stop token's last 16
    rows that holds it ((-1, -1): none), ``tri`` = whether it was in the newest row computed in the same 3-token
    context."""

    def __init__(self, inner) -> None:
        self.inner, self.stops = inner, []
        self.seq, self.older, self.tri = [], {}, {}  # the text; token -> its last 16 rows; 3 tokens -> newest row

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def begin(self, prompt, *, do_sample):
        self.seq = [int(t) for t in prompt]
        return self.inner.begin(prompt, do_sample=do_sample)

    def _remember(self, rows) -> None:
        """Every row of the step under its token, and c's and the fed nodes' rows under their 3-token context."""
        tree, top = self.inner._last.tree, rows.topk.cpu().numpy().tolist()
        fed = list(rows.nodes) if rows.nodes else list(range(len(tree)))
        first = len(rows.tokens) - len(fed)
        self.tri[tuple(self.seq[-3:])] = top[0]
        for i, n in enumerate(fed):
            path = []
            while n >= 0:
                path.append(tree.tokens[n])
                n = tree.parents[n]
            self.tri[tuple((self.seq + path[::-1])[-3:])] = top[first + i]
        for t, row in zip(rows.tokens, top):
            self.older.setdefault(int(t), []).append(row)
            del self.older[int(t)][:-16]

    def observe(self, accepted, ngrams, rows=None):
        p = self.inner
        tree = p._last.tree
        path = accepted_path(tree, accepted)
        m = path[-1] if path else -1
        tok = tree.tokens[m] if m >= 0 else p._root
        prev = (tree.tokens[tree.parents[m]] if tree.parents[m] >= 0 else p._root) if m >= 0 else p._prev
        row = p._table.successors(tok)
        pair = p._pair.successors(tok, prev) if p._pair is not None else []
        b = int(accepted[-1])
        path_p = []  # each node's estimated P(accepted) = the product of the estimates along its path
        for q, est in zip(tree.parents, tree.prob):
            path_p.append(est * (path_p[q] if q >= 0 else 1.0))
        depth = []
        for q in tree.parents:
            depth.append(depth[q] + 1 if q >= 0 else 1)
        by_depth = [0.0] * (max(depth, default=0) + 1)
        for d, pp in zip(depth, path_p):
            by_depth[d] += pp
        g = p._last
        roots = [[tree.prob[i], int(bool(path) and path[0] == i), g.suffix_raw[i] is not None,
                  g.succ_rank[i], g.pair_rank[i]] for i, q in enumerate(tree.parents) if q < 0]
        ctx = self.seq + [tree.tokens[n] for n in path]
        older = next(((j, r.index(b)) for j, r in enumerate(reversed(self.older.get(tok, []))) if b in r), (-1, -1))
        tri = b in self.tri.get(tuple(ctx[-3:]), ())
        if rows is not None:
            self._remember(rows)
        self.seq += [int(t) for t in accepted]
        self.stops.append({"older": older, "tri": tri, "roots": roots, "expected": sum(path_p), "expected_by_depth": by_depth[1:], "depth": len(path), "kids": sum(1 for q in tree.parents if q == m),
                           "rank": row.index(b) if b in row else -1, "pair_rank": pair.index(b) if b in pair else -1,
                           "rows": [len(row), len(pair)]})
        return p.observe(accepted, ngrams, rows)


def stop_summary(stops: list) -> dict:
    """Shares of the steps by why acceptance stopped (``StopProbe`` records)."""
    n = max(len(stops), 1)
    kinds = {"in_a_row_rank_0_7": 0, "in_a_row_rank_8_plus": 0, "no_row": 0, "not_in_the_rows": 0}
    for x in stops:
        ranks = [r for r in (x["rank"], x["pair_rank"]) if r >= 0]
        kind = (("in_a_row_rank_0_7" if min(ranks) < 8 else "in_a_row_rank_8_plus") if ranks
                else "no_row" if not any(x["rows"]) else "not_in_the_rows")
        kinds[kind] += 1
    miss = [x for x in stops if x["rank"] < 0 and x["pair_rank"] < 0 and any(x["rows"])]
    kinds["not_in_the_rows_but_in_an_older_row"] = sum(x["older"][0] >= 0 for x in miss)
    kinds["not_in_the_rows_but_in_the_3_token_row"] = sum(x["tri"] for x in miss)
    return {"steps": len(stops), **{k: v / n for k, v in kinds.items()},
            "stop_depth_mean": sum(x["depth"] for x in stops) / n, "expected_mean": sum(x["expected"] for x in stops) / n, "stop_kids_mean": sum(x["kids"] for x in stops) / n}


# the --set levers that a flag also sets
FLAG_LEVERS = {"context": ("--context", "context"), "k": ("--topk", "topk"), "width": ("--width", "width"),
               "max_depth": ("--max-depth", "max_depth"), "rank_budget": ("--rank-cap", "rank_cap")}


def proposer_for(vocab, k, args):
    """The product's proposer for K = ``k`` ranks at a per-rank budget of ``--budget`` - 1 nodes, the flags given
    replacing its values (``successors.successor_proposers``); ``vocab``: the model's vocabulary size."""
    decoding = DecodingConfig(method="lookahead", window_size=args.window * k, ngram_size=args.ngram,
                              guess_set_size=args.guess * k, max_depth=10, successors="true")
    levers = {name: getattr(args, attr) for name, (_, attr) in FLAG_LEVERS.items() if getattr(args, attr) is not None}
    if args.rank_cap is not None:
        levers["rank_budget"] = args.rank_cap or None  # 0 = no cap
    levers.update(args.levers)
    (prop,) = successor_proposers(decoding, vocab, lp_size=k, budget=args.budget - 1, **levers)
    return decoding, prop


def run_k(model, tok, eos, questions, refs, k, args):
    probe = RankProbe(k, open(Path(args.out) / f"trees_k{k}.jsonl", "w") if args.trees else None)
    decoding, prop = proposer_for(vocab_size(model), k, args)
    if args.stops:
        prop = StopProbe(prop)
    dec = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tok, lp=probe, proposers=[prop], copy_kv=False)
    rows = []
    for q, ref in zip(questions, refs):
        probe.rank_tokens, probe.rank_rows = [], []
        out = dec.generate(build_prompt(tok, q, []), max_new_tokens=args.max_new_tokens)
        rows.append({"id": q.question_id, "category": q.category, "new_tokens": len(out.output_ids),
                     "steps": out.decoding_steps, "fed": sum(out.step_tokens), "identical": out.output_ids == ref,
                     "rank_tokens": [sum(r[i] for r in probe.rank_tokens) for i in range(k)],
                     "max_rank_tokens": sum(max(r) for r in probe.rank_tokens),
                     "bytes": sum(k * n * (1 + prop.k) * 8 for n in probe.rank_rows) if k > 1 else 0})
        print(f"  K={k} {q.category} {q.question_id}: S {rows[-1]['new_tokens'] / rows[-1]['steps']:.2f} "
              f"steps {rows[-1]['steps']} identical {rows[-1]['identical']}", flush=True)
        (Path(args.out) / f"partial_k{k}.json").write_text(json.dumps(rows) + "\n")  # a stopped run keeps its rows
    if args.stops:
        (Path(args.out) / f"stops_k{k}.json").write_text(json.dumps({"summary": stop_summary(prop.stops),
                                                                     "steps": prop.stops}) + "\n")
    return rows, {"context": prop.context, "topk": prop.k, "width": prop.width, "max_depth": prop.max_depth,
                  "rank_cap": prop.rank_budget or 0}


def category_groups(rows: list[dict]) -> dict[str, list[dict]]:
    """The rows by group, the non-empty ones: "humaneval" for a category starting with it, "mt_bench" for the rest
    (a question without a category too: it crashed the run after its first K, a new user, 2026-12-07)."""
    code = [str(r["category"] or "").startswith("humaneval") for r in rows]
    groups = {"mt_bench": [r for r, c in zip(rows, code) if not c], "humaneval": [r for r, c in zip(rows, code) if c]}
    return {name: part for name, part in groups.items() if part}


def summary(rows, k):
    steps = sum(r["steps"] for r in rows) or float("nan")
    return {"k": k, "S": sum(r["new_tokens"] for r in rows) / steps,
            "tokens_per_step": sum(r["fed"] for r in rows) / steps,
            "per_rank_tokens": [sum(r["rank_tokens"][i] for r in rows) / steps for i in range(k)],
            "max_rank_tokens": sum(r["max_rank_tokens"] for r in rows) / steps,
            "bytes_per_step": sum(r["bytes"] for r in rows) / steps,
            "identical": all(r["identical"] for r in rows), "prompts": len(rows)}


def check_levers(vocab: int, args) -> str:
    """Why the flags and ``--set`` levers build no proposer for some K of ``--ks`` ("" when they all do): checked
    before any reference is computed or ``--out`` is made, so a bad lever costs one line, not a traceback."""
    for k in args.ks:
        try:
            proposer_for(vocab, k, args)
        except (TypeError, ValueError, MemoryError) as e:  # ConfigError is a ValueError
            return f"K = {k}: {type(e).__name__}: {e}"
    return ""


def parse_levers(text: str, args) -> dict:
    """``--set``'s JSON object of levers: ``SuccessorProposer`` arguments (not those the script sets: vocab_size,
    budget, suffix, lp_size) and the suffix lookup's store_min_key. ``ValueError`` for text that is not a JSON
    object, a key given twice, a key that is no lever (the levers listed), or one whose flag is given too (which
    one wins was silent: --set; new users, 2026-12-07)."""
    def no_repeats(pairs: list) -> dict:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"--set {text!r} gives {', '.join(map(repr, twice))} more than once; give each once")
        return dict(pairs)

    try:
        levers = json.loads(text, object_pairs_hook=no_repeats)
    except json.JSONDecodeError:
        raise ValueError(f"--set {text!r} is not a JSON object") from None
    if not isinstance(levers, dict):
        raise ValueError(f"--set {text!r} is not a JSON object of SuccessorProposer arguments")
    known = sorted({*inspect.signature(SuccessorProposer).parameters} - {"vocab_size", "budget", "suffix", "lp_size"}
                   | {"store_min_key"})
    unknown = [k for k in levers if k not in known]
    if unknown:
        raise ValueError(f"--set {text!r}: {', '.join(map(repr, unknown))} is no lever; the levers: {', '.join(known)}")
    both = [f"{key!r} and {flag}" for key, (flag, attr) in FLAG_LEVERS.items()
            if key in levers and getattr(args, attr) is not None]
    if both:
        raise ValueError(f"--set {text!r} and a flag set the same lever ({'; '.join(both)}); give it once")
    return levers


def out_files(args) -> list[str]:
    """The files a run writes in ``--out``."""
    per_k = ["partial_k{}.json"] + ["trees_k{}.jsonl"] * args.trees + ["stops_k{}.json"] * args.stops
    return ["refs.json", "lp_scaling.json"] + [name.format(k) for k in args.ks for name in per_k]


def check_out(out: Path, args) -> str:
    """Why ``out`` cannot take this run's files ("" when it can): made if missing, then probed with a file of
    its own (a read-only or unwritable place, or a folder where a result file goes, gave a traceback after the
    references were computed; a new user, 2026-12-07)."""
    try:
        blocked = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            return f"{blocked} is a file; give a folder"
        taken = [name for name in out_files(args) if (out / name).exists() and not (out / name).is_file()]
        if taken:
            return f"{out / taken[0]} is a folder where the run writes a file; move it away"
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        return f"cannot write there ({e.strerror or e})"
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True, help="question file (JSONL, Spec-Bench format); first turns")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=80, help="tokens per rank per step (nodes = K x (budget - 1))")
    ap.add_argument("--window", type=int, default=0, help="window columns per rank (W = K x window)")
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--guess", type=int, default=15, help="suffix lookup leaves per rank (G = K x guess)")
    ap.add_argument("--context", type=int, default=None, choices=(1, 2), help="successor table context: 1 = the "
                    "token table (Token Recycling), 2 = also the pair table (default: the product's, 2)")
    ap.add_argument("--topk", type=int, default=None, help="successors kept per table row (default: the product's, 16)")
    ap.add_argument("--width", type=int, default=None, help="successors of a row tried per tree node (default: the "
                    "product's, 16 when K > 1, 8 at K = 1)")
    ap.add_argument("--max-depth", type=int, default=None, help="deepest node of the successor tree "
                    "(SuccessorProposer's max_depth, not decoding.max_depth; default: the product's, 16)")
    ap.add_argument("--rank-cap", type=int, default=None, help="most tree nodes a rank feeds (repeated ancestor "
                    "chains included; SuccessorProposer(rank_budget=...)); default --budget - 1, 0 = no cap")
    ap.add_argument("--trees", action="store_true", help="write every step's (pending, columns, levels, parents) "
                    "to OUT/trees_kK.jsonl")
    ap.add_argument("--stops", action="store_true", help="record where each step's acceptance stopped and whether "
                    "the bonus token was in a table row there (OUT/stops_kK.json)")
    ap.add_argument("--set", default="{}", help="other SuccessorProposer arguments, and the suffix lookup's "
                    "store_min_key, as JSON (measurement levers)")
    ap.add_argument("--out", default="results/lp_scaling")
    args = ap.parse_args()
    small = [(name, value, least) for name, value, least in (
        ("--ks", min(args.ks), 1), ("--budget", args.budget, 2), ("--max-new-tokens", args.max_new_tokens, 1),
        ("--guess", args.guess, 1), ("--window", args.window, 0), ("--ngram", args.ngram, 2),
        ("--topk", args.topk, 1), ("--width", args.width, 1), ("--max-depth", args.max_depth, 1),
        ("--rank-cap", args.rank_cap, 0)) if value is not None and value < least]
    if small:
        ap.error("; ".join(f"{name} {value} is too small (at least {least})" for name, value, least in small))
    try:
        args.levers = parse_levers(args.set, args)
        questions = load_questions(DatasetConfig(name="jsonl", path=args.prompts, first_turn_only=True))
    except (ValueError, DatasetError) as e:  # a bad --set, a missing or malformed --prompts file
        ap.error(str(e))
    repeated = sorted({k for k in args.ks if args.ks.count(k) > 1})
    if repeated:
        ap.error(f"--ks {' '.join(map(str, args.ks))} gives K = {', '.join(map(str, repeated))} more than once; "
                 "give each K once")
    out = Path(args.out)
    why = check_out(out, args)  # before the model loads: it needs only the flags
    if why:
        ap.error(f"--out {args.out}: {why}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, tok = load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"), weight_bars=False)
    why = check_levers(vocab_size(model), args)
    if why:
        ap.error(f"the flags and --set {args.set!r} build no proposer: {why}")
    eos = eos_token_ids(model, tok, None)
    ref_path = out / "refs.json"
    try:
        cached = json.loads(ref_path.read_text()) if ref_path.exists() else {}
        if not isinstance(cached, dict):
            raise ValueError(f"a JSON {type(cached).__name__}, not an object")
        # the file's content in the key: another file of the same name, or this one edited, gets its own references
        digest = hashlib.sha256(Path(args.prompts).read_bytes()).hexdigest()[:16]
        key = f"{Path(args.prompts).name}:{digest}:{args.max_new_tokens}"
        found = cached.get(key, [])
        if not (isinstance(found, list) and all(isinstance(r, list) and all(is_int(t) and t >= 0 for t in r)
                                                for r in found)):
            raise ValueError(f"its entry {key!r} is not a list of token id lists")
    except ValueError as e:  # json.JSONDecodeError too
        ap.error(f"{ref_path} is not a JSON object of references ({e}); delete it and they are computed again")
    if len(found) != len(questions):
        cached[key] = [hf_greedy(model, build_prompt(tok, q, []), args.max_new_tokens, eos) for q in questions]
        ref_path.write_text(json.dumps(cached) + "\n")
    refs = cached[key]
    results = []
    for k in args.ks:
        rows, table = run_k(model, tok, eos, questions, refs, k, args)
        groups = {name: summary(part, k) for name, part in category_groups(rows).items()}
        results.append({**summary(rows, k), "groups": groups, "budget_per_rank": args.budget,
                        "window_per_rank": args.window, "ngram": args.ngram, "guess_per_rank": args.guess, **table,
                        "levers": args.levers,
                        "max_new_tokens": args.max_new_tokens, "prompts_file": args.prompts,
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows})
        (out / "lp_scaling.json").write_text(json.dumps(results, indent=1) + "\n")
    first = next((r for r in results if r["k"] == 1), results[0])  # S against K = 1, or the first K given
    print(f"\n| K | group | S | S / S(K={first['k']}) | tokens/step (1 process) | per-rank tokens/step | busiest rank "
          "| bytes/step | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {g: s["S"] for g, s in first["groups"].items()}
    for r in results:
        for g, s in r["groups"].items():
            ranks = "[" + ", ".join(f"{t:.0f}" for t in s["per_rank_tokens"]) + "]"
            print(f"| {r['k']} | {g} | {s['S']:.2f} | {s['S'] / base[g]:.2f} | {s['tokens_per_step']:.0f} | {ranks} | "
                  f"{s['max_rank_tokens']:.0f} | {s['bytes_per_step']:.0f} | {s['identical']} |")
    parted = [f"K = {r['k']}: {row['id']}" for r in results for row in r["rows"] if not row["identical"]]
    if parted:  # the figures are kept, but a scripted run must see that greedy was not reproduced
        sys.exit(f"error: {len(parted)} output(s) differ from transformers' greedy ({', '.join(parted[:8])}"
                 f"{', ...' if len(parted) > 8 else ''}); {out / 'lp_scaling.json'} holds the rows")


if __name__ == "__main__":
    main()
