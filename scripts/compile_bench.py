"""Eager vs static-cache vs compiled steps, greedy and lookahead, side by side (issue 19, item 5).

Every prompt runs every (path, method) pair in turn (interleaved, so a slow spell of the machine hits all pairs
alike); outputs must be token-identical across paths. Paths: ``eager`` (``step.EagerStep``, a growing
DynamicCache), ``static`` (``static_cache.SlotStep``: the eager forward on a SlotCache), ``compiled``
(``compiled.CapturedStep``: one compiled step per bucket; inductor on CPU, CUDA graphs on a GPU; compiled
before timing, the time printed). Methods: ``greedy`` (one token a step), ``lookahead`` (the fixed preset of
conf/decoding/lookahead.yaml) and ``auto`` (the default, decoding=auto: the cost policy on each path's own latency
profile; the compiled path's is measured per bucket on its captured step). ``--record`` stores the verdict ``model.compile=auto`` reads
(the path with the most tokens/s over all methods).

Run it alone on a quiet machine (timings under load mean nothing)::

    OMP_NUM_THREADS=2 python scripts/compile_bench.py --prompts 16 --max-new-tokens 128 --out results/compile_cpu
    python scripts/compile_bench.py --prompts 1 --max-new-tokens 8          # smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime.auto import auto_policy  # noqa: E402
from lp_runtime.compiled import BUCKETS, CapturedStep, default_max_len, record_verdict  # noqa: E402
from lp_runtime.config import DatasetConfig, DecodingConfig, ModelConfig  # noqa: E402
from lp_runtime.data import build_prompt, load_questions  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.checks import eos_token_ids  # noqa: E402
from lp_runtime.models import load_model  # noqa: E402
from lp_runtime.static_cache import SlotStep  # noqa: E402

METHODS = {m: DecodingConfig(method=m) for m in ("greedy", "lookahead", "auto")}  # conf/decoding/'s presets


def prompts(tokenizer, num: int) -> list[list[int]]:
    """``num`` prompts: MT-Bench first turns and HumanEval prompts, alternating."""
    mt = load_questions(DatasetConfig(name="mt_bench", limit=num, first_turn_only=True))
    he = load_questions(DatasetConfig(name="humaneval", limit=num))
    mixed = [q for pair in zip(mt, he) for q in pair][:num]
    return [build_prompt(tokenizer, q, []) for q in mixed]


def steps_for(model, paths, max_len: int, buckets) -> dict:
    """One step object per path (None = the Decoder's default eager step); the compiled one warmed up."""
    out = {}
    for path in paths:
        if path == "eager":
            out[path] = None
        elif path == "static":
            out[path] = SlotStep(model, max_len)
        else:
            step = CapturedStep(model, max_len, buckets=buckets)
            step.warm_up(log=lambda line: print(f"compiled path: {line}", flush=True))
            out[path] = step
    return out


def run(args) -> dict:
    model, tok = load_model(ModelConfig(path=args.model, dtype=args.dtype, device=args.device))
    eos = eos_token_ids(model, tok, None)
    todo = prompts(tok, args.prompts)
    # the slots generate's compiled step gets (every captured step reads them all), unless --max-len says otherwise
    max_len = args.max_len or max(default_max_len(model), max(len(p) for p in todo) + args.max_new_tokens + 264)
    steps = steps_for(model, args.paths, max_len, args.buckets)
    # decoding=auto prices each path on its own profile (the captured step's per bucket: auto.auto_policy)
    decoders = {(p, m): Decoder(model, METHODS[m], eos_token_ids=eos, tokenizer=tok, step=steps[p],
                                step_policy=auto_policy(model, step=steps[p]) if m == "auto" else None)
                for p in args.paths for m in args.methods}
    for dec in decoders.values():  # untimed: kernels, allocator, the compiled graphs' first runs
        dec.generate(todo[0], max_new_tokens=min(8, args.max_new_tokens))
    totals = {key: [0, 0.0, 0] for key in decoders}  # tokens, seconds, steps
    mismatches = []
    for i, prompt in enumerate(todo):
        for m in args.methods:
            ref = None
            for p in args.paths:
                start = time.perf_counter()
                out = decoders[(p, m)].generate(prompt, max_new_tokens=args.max_new_tokens)
                seconds = time.perf_counter() - start
                t = totals[(p, m)]
                t[0], t[1], t[2] = t[0] + len(out.output_ids), t[1] + seconds, t[2] + out.decoding_steps
                ref = out.output_ids if ref is None else ref
                if out.output_ids != ref:
                    mismatches.append({"prompt": i, "method": m, "path": p})
    rows = [{"path": p, "method": m, "tokens": t[0], "seconds": t[1], "tokens_s": t[0] / t[1],
             "S": t[0] / max(t[2], 1)} for (p, m), t in totals.items()]
    return {"rows": rows, "mismatches": mismatches, "threads": torch.get_num_threads(), "model": args.model,
            "dtype": str(model.dtype), "device": str(model.device), "prompts": len(todo),
            "max_new_tokens": args.max_new_tokens, "max_len": max_len, "model_obj": model}


def table(res: dict) -> str:
    base = next((r["tokens_s"] for r in res["rows"] if r["path"] == "eager" and r["method"] == "greedy"), None)
    lines = [f"# eager vs static vs compiled ({res['model']}, {res['dtype']}, {res['device']}, {res['threads']} "
             f"threads, {res['prompts']} prompts x {res['max_new_tokens']} tokens)", "",
             "| path | method | tokens/s | vs eager greedy | S |", "|---|---|---|---|---|"]
    lines += [f"| {r['path']} | {r['method']} | {r['tokens_s']:.1f} | "
              f"{r['tokens_s'] / base if base else float('nan'):.2f}x | {r['S']:.2f} |" for r in res["rows"]]
    lines += ["", f"token-identical across paths: {not res['mismatches']} {res['mismatches'] or ''}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bundled:smollm2")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--paths", default="eager,static,compiled")
    ap.add_argument("--methods", default="greedy,lookahead,auto")
    ap.add_argument("--buckets", default=",".join(map(str, BUCKETS)), help="compiled step buckets")
    ap.add_argument("--max-len", type=int, default=None,
                    help="static cache slots (default: compiled.default_max_len, what model.compile=true uses)")
    ap.add_argument("--out", default=None, help="folder for compile_bench.json / .md")
    ap.add_argument("--record", action="store_true", help="store the verdict model.compile=auto reads")
    args = ap.parse_args()
    args.paths, args.methods = args.paths.split(","), args.methods.split(",")
    args.buckets = tuple(int(b) for b in args.buckets.split(","))
    res = run(args)
    model = res.pop("model_obj")
    md = table(res)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "compile_bench.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(args.out, "compile_bench.md"), "w") as f:
            f.write(md)
    if args.record:
        rate = {p: sum(r["tokens"] for r in res["rows"] if r["path"] == p)
                / sum(r["seconds"] for r in res["rows"] if r["path"] == p) for p in args.paths}
        print("recorded:", record_verdict(model, rate))


if __name__ == "__main__":
    main()
