"""GPU check of lp_runtime's eager and captured steps (issue 19), without Hydra: needs only torch + transformers.

    python scripts/device_check.py OUTDIR                                   # one H200: 5 minutes (2026-12-04)
    python scripts/device_check.py OUTDIR --device cpu --quick --backend aot_eager --buckets 1,4,16  # CPU dry run

Per model shape (random Llama weights of SmolLM2-135M, Llama-3.2-1B, Llama-2-7B):

(a) exactness in float32 (TF32 off): transformers' greedy ``generate`` against lookahead (several W, N, G, and the
    product's successor-table tree of ~80 nodes with its tables filled) through the eager step AND through
    ``compiled.CapturedStep`` (CUDA graphs per bucket over the static cache, split attention); a divergence
    reports the top-2 logit gap at the first differing token (< 1e-4 is a tie).
(b) bfloat16 step latency per bucket q = 1, 2, 4, ..., 256 over a 200-token cache, eager and captured
    (``step_latency``: the same timing for both), plus the capture time.
(c) greedy tokens/s in bfloat16: transformers' ``generate`` (eager) against our captured 1-token step.
(d) predicted speedup of each method of a CPU bench run (``--results``: S and tokens fed per step) on the
    captured curve: over our compiled greedy S * t(1) / t(bucket of the step), over transformers' greedy
    S * t_hf / t(bucket). It assumes S carries over from the CPU run (a property of the model's predictions).
(e) if time is left: ``torch.compile(mode="reduce-overhead")`` buckets 1, 16, 64 for one shape
    (``--reduce-overhead-shape``, default the smallest; compile time, latency, greedy tokens/s), against the plain
    CUDA-graph capture. ``--shapes '' --reduce-overhead-shape llama_7b`` runs it alone on the 7B shape (278 s on an
    H200, 2026-12-04).
(g) the product's default step: ``compiled.step_for(model, "auto")`` with nothing recorded (the captured path on
    CUDA since 2026-12-04; eager on a CPU), its capture time and its bfloat16 latency at q = 1, 16, 128 with the
    product's cache size (``default_max_len``: min(the model's context, 8192) + 256 slots, every one read by a
    captured step), beside part (b)'s captured step over a cache sized for the check.
(f) lookahead parallelism's host time on this machine's CPU (7B shape; SmolLM2's in a dry run): the product's tree
    for K = 1 and 8 ranks at a per-rank budget of ``LP_BUDGET`` tokens (``successors.successor_proposers``), K
    ranks simulated in one process through the eager step, every token table filled with random rows first (so
    the tree reaches its budget, as with a real model); host ms per step = the call's wall time - the step's
    (device work waited for), beside the step's own ms. With weights this random, S means nothing; the host's
    share is what LP on a GPU depends on (docs/benchmarks.md: LP at K over one GPU ~ S(K)/S(1) x (t + h(1)) / (t
    + h(K) + the all-gather), t the per-rank step).

Checks of issue 19 are stated at the end (7B captured q=1 <= 9 ms, q=64 <= 12 ms, compiled greedy >= 3x
transformers' greedy). Writes OUTDIR/device_check.json (after every shape, so a kill keeps what was done) and
OUTDIR/device_check.md; scripts/device_check.sh adds the log, ``pip list`` and the GPU's name.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lp_runtime.compiled import BUCKETS, CapturedStep, bucket_for, step_latency  # noqa: E402
from lp_runtime.config import DecodingConfig  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402
from lp_runtime.step import EagerStep  # noqa: E402
from host_time import TimedStep  # noqa: E402

SHAPES = {  # LlamaConfig fields of the real models
    "smollm2_135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0),
    "llama_1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True, rope_theta=500000.0),
    "llama_7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False, rope_theta=10000.0),
}
SETTINGS = ((0, 4, 2), (3, 4, 3), (15, 5, 15))  # the CPU default, the bench's windowed one, the paper's
LP_KS, LP_BUDGET = (1, 8), 80  # (f): ranks simulated, tree tokens per rank (scripts/host_time.py's)
TABLE_SETTING = (0, 5, 15)  # (a): the suffix lookup's (W, N, G) beside the successor table
PROMPT_LEN, CACHE_TOKENS = 48, 200


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def build(name: str, device: str, quick: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(SHAPES[name])
    if quick:  # CPU dry run: real widths, few layers
        shape["num_hidden_layers"] = 2
    config = LlamaConfig(**shape, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config).to(torch.float32).eval()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    from transformers import GenerationConfig

    ids = torch.tensor([prompt], device=model.device)
    cfg = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1, eos_token_id=None,
                           pad_token_id=0)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
    return out[0, len(prompt):].tolist()


def top2_gap(model, ids: list[int]) -> float:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids], device=model.device), logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def prompts_for(vocab: int, num: int) -> list[list[int]]:
    """Half random ids, half with repeats (so the prompt has matches for the suffix lookup)."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(num):
        p = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()
        out.append(p if i % 2 == 0 else p[: PROMPT_LEN // 2] * 2)
    return out


def compare(model, name, path, decoder, prompts, refs, setting) -> dict:
    """One exactness row: ``decoder``'s tokens against transformers' greedy ``refs``."""
    same = steps = tokens = fed = 0
    worst = None
    for p, ref in zip(prompts, refs):
        out = decoder.generate(p, max_new_tokens=len(ref))
        tokens, steps, fed = tokens + len(out.output_ids), steps + out.decoding_steps, fed + sum(out.step_tokens)
        if out.output_ids == ref:
            same += 1
            continue
        i = next((k for k, (a, b) in enumerate(zip(out.output_ids, ref)) if a != b),
                 min(len(ref), len(out.output_ids)))
        gap = top2_gap(model, p + ref[:i])
        worst = {"first_diff": i, "top2_gap": gap} if worst is None or gap > worst["top2_gap"] else worst
    w, n, g = setting
    row = {"model": name, "path": path, "W": w, "N": n, "G": g, "identical": same, "prompts": len(prompts),
           "S": tokens / max(steps, 1), "fed_per_step": fed / max(steps, 1), "divergence": worst,
           "ok": same == len(prompts) or (worst is not None and worst["top2_gap"] < 1e-4)}
    log(f"exactness {name} {path} W{w} N{n} G{g}: {same}/{len(prompts)} identical, S={row['S']:.2f}, "
        f"{row['fed_per_step']:.1f} tokens fed a step"
        + (f", worst divergence {worst}" if worst else ""))
    return row


def exactness(model, name, args, buckets) -> list[dict]:
    """(a): eager and captured lookahead against transformers' greedy, float32."""
    prompts = prompts_for(model.config.vocab_size, 2 if args.quick else 4)
    n_new = 12 if args.quick else 48
    refs = [hf_greedy(model, p, n_new) for p in prompts]
    settings = SETTINGS[:2] if args.quick else SETTINGS
    rows = []
    for s in settings:
        dec = Decoder(model, DecodingConfig(method="lookahead", window_size=s[0], ngram_size=s[1], guess_set_size=s[2], max_depth=10))
        rows.append(compare(model, name, "eager", dec, prompts, refs, s))
    captured = CapturedStep(model, max_len=PROMPT_LEN + n_new + buckets[-1] + 8, buckets=buckets, backend=args.backend)
    captured.warm_up(log=lambda line: log(f"{name} float32: {line}"))
    for s in settings:
        cfg = DecodingConfig(method="lookahead", window_size=s[0], ngram_size=s[1], guess_set_size=s[2], max_depth=10)
        dec = Decoder(model, cfg, step=captured)
        rows.append(compare(model, name, "captured", dec, prompts, refs, s))
    for path, step in (("eager+table", None), ("captured+table", captured)):  # the product's tree, ~80 nodes
        rows.append(compare(model, name, path, table_decoder(model, step), prompts, refs, TABLE_SETTING))
    model.set_attn_implementation("sdpa")  # the eager timings below run transformers' own attention
    return rows


def table_decoder(model, step) -> Decoder:
    """A decoder with the product's successor-table tree at ``LP_BUDGET`` tokens a step in one process, its token
    tables filled (``fill_table``), so trees of ~80 nodes (bucket 128) go through ``step``."""
    from lp_runtime.successors import successor_proposers

    w, n, g = TABLE_SETTING
    decoding = DecodingConfig(method="lookahead", window_size=w, ngram_size=n, guess_set_size=g, max_depth=10,
                              successors="true")
    (prop,) = successor_proposers(decoding, model.config.vocab_size, budget=LP_BUDGET - 1)
    fill_table(prop.table, model.config.vocab_size)
    return Decoder(model, decoding, proposers=[prop], step=step)


def greedy_rate(fn, n: int, device) -> float:
    """Tokens/s of ``fn()`` generating n tokens (after one untimed call)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n / (time.perf_counter() - start)


def speed(model, name, args, buckets, rec) -> None:
    """(b) and (c) in bfloat16: eager vs captured step latency per bucket, greedy tokens/s."""
    reps = 2 if args.quick else 5
    model.to(torch.bfloat16 if not args.quick else torch.float32)
    n = 16 if args.quick else 128
    prompt = prompts_for(model.config.vocab_size, 1)[0]
    rec["hf_greedy_tokens_s"] = greedy_rate(lambda: hf_greedy(model, prompt, n), n, model.device)
    rec["eager_s"] = step_latency(EagerStep(model), buckets, cache_tokens=CACHE_TOKENS, reps=reps)
    log(f"latency {name} eager ({model.dtype}): "
        + ", ".join(f"q={q} {1e3 * t:.2f}ms" for q, t in rec["eager_s"].items()))
    captured = CapturedStep(model, max_len=max(CACHE_TOKENS, PROMPT_LEN + n) + buckets[-1] + 8, buckets=buckets,
                            backend=args.backend)
    rec["capture_s"] = captured.warm_up(log=lambda line: log(f"{name} {model.dtype}: {line}"))
    rec["captured_s"] = step_latency(captured, buckets, cache_tokens=CACHE_TOKENS, reps=reps)
    log(f"latency {name} captured: " + ", ".join(f"q={q} {1e3 * t:.2f}ms" for q, t in rec["captured_s"].items()))
    rec["compiled_greedy_tokens_s"] = greedy_rate(lambda: captured.greedy(prompt, n), n, model.device)
    log(f"greedy {name}: transformers {rec['hf_greedy_tokens_s']:.1f} tokens/s, captured "
        f"{rec['compiled_greedy_tokens_s']:.1f} tokens/s")
    model.set_attn_implementation("sdpa")


def default_step(model, name, args, rec) -> None:
    """(g): the step ``model.compile=auto`` builds with nothing recorded, timed at the product's cache size."""
    import tempfile

    from lp_runtime.compiled import default_max_len, step_for

    model.to(torch.bfloat16 if not args.quick else torch.float32)
    with tempfile.TemporaryDirectory() as root:  # no verdict recorded: the default of a fresh machine
        start = time.perf_counter()
        step = step_for(model, "auto", root=root, log=lambda line: log(f"{name}: {line}"))
        rec["default_path"] = type(step).__name__ if step is not None else "eager"
        rec["default_build_s"] = time.perf_counter() - start
    rec["default_max_len"] = default_max_len(model)
    if step is not None:
        rec["default_s"] = step_latency(step, (1, 16, 128), cache_tokens=CACHE_TOKENS, reps=2 if args.quick else 5)
    log(f"default step {name}: {rec['default_path']} over {rec['default_max_len']} slots, built in "
        f"{rec['default_build_s']:.1f} s, " + ", ".join(f"q={q} {1e3 * t:.2f}ms" for q, t in rec.get("default_s", {}).items()))
    model.set_attn_implementation("sdpa")


def predict(rec: dict, results_path: str, buckets) -> list[dict]:
    """(d): predicted speedups per method of a bench results JSON (group "all") on the captured curve."""
    with open(results_path, encoding="utf-8") as f:
        res = json.load(f)
    curve = rec["captured_s"]
    t_hf = 1.0 / rec["hf_greedy_tokens_s"]
    out = []
    for r in res["table"]:
        if r["group"] != "all" or not r.get("step_tokens") or not r.get("step_compression"):
            continue
        q = r.get("fed_per_step") or r["step_tokens"]  # tokens fed per step where counted, else the cap
        b = bucket_for(min(max(1, round(q)), buckets[-1]), buckets)
        s = r["step_compression"]
        out.append({"method": r["method"], "S_cpu": s, "tokens_per_step": q, "bucket": b,
                    "over_compiled_greedy": s * curve[1] / curve[b], "over_hf_greedy": s * t_hf / curve[b]})
    return out


def fill_table(table, vocab: int) -> None:
    """A row of random successors for every token id in each of ``table``'s token tables, as a real model's
    table holds after a few prompts: with random weights most ids would have no row, and the tree would stop far
    below its budget."""
    import numpy as np

    tables = getattr(table, "tables", [table])  # RankTables: one table per rank, filled in one update
    ids = np.tile(np.arange(vocab), len(tables))
    rows = np.random.default_rng(0).integers(0, vocab, (ids.size, tables[0].k))
    table.update(ids, rows, **({"owners": np.repeat(np.arange(len(tables)), vocab)} if len(tables) > 1 else {}))


def lp_host(model, name, args, rec) -> None:
    """(f): host and step ms per step of the product's tree for K ranks in one process (``LP_KS``)."""
    from lp_runtime.parallel import LocalGroup
    from lp_runtime.successors import successor_proposers

    prompts = prompts_for(model.config.vocab_size, 3)
    n = 16 if args.quick else 64
    rec["lp_host"] = {}
    for k in LP_KS:
        decoding = DecodingConfig(method="lookahead", window_size=0, ngram_size=5, guess_set_size=15 * k,
                                  max_depth=10, successors="true")
        (prop,) = successor_proposers(decoding, model.config.vocab_size, lp_size=k, budget=LP_BUDGET - 1)
        fill_table(prop.table, model.config.vocab_size)
        step = TimedStep(EagerStep(model))
        dec = Decoder(model, decoding, lp=LocalGroup(), proposers=[prop], copy_kv=False, step=step)
        dec.generate(prompts[2], max_new_tokens=n)  # warm-up: the table, calibrations and allocator fill
        step.seconds, start = 0.0, time.perf_counter()
        outs = [dec.generate(p, max_new_tokens=n) for p in prompts[:2]]
        wall = time.perf_counter() - start
        steps = sum(o.decoding_steps for o in outs)
        rec["lp_host"][k] = {"host_ms_per_step": 1e3 * (wall - step.seconds) / steps,
                             "step_ms_per_step": 1e3 * step.seconds / steps, "steps": steps,
                             "S": sum(len(o.output_ids) for o in outs) / steps,
                             "fed_per_step": sum(sum(o.step_tokens) for o in outs) / steps}
        log(f"lp host {name} K={k}: " + ", ".join(f"{key} {v:.2f}" for key, v in rec["lp_host"][k].items()))


def reduce_overhead(model, name, args, rec) -> None:
    """(e): torch.compile(mode="reduce-overhead") for buckets 1, 16 and 64: compile time, greedy tokens/s."""
    model.to(torch.bfloat16)
    n = 128
    prompt = prompts_for(model.config.vocab_size, 1)[0]
    step = CapturedStep(model, max_len=max(CACHE_TOKENS // 2, PROMPT_LEN + n) + 72, buckets=(1, 16, 64),
                        backend="reduce-overhead")
    rec["reduce_overhead_compile_s"] = step.warm_up(log=lambda line: log(f"{name}: {line}"))
    rec["reduce_overhead_s"] = step_latency(step, (1, 16, 64), cache_tokens=CACHE_TOKENS // 2, reps=5)
    rec["reduce_overhead_greedy_tokens_s"] = greedy_rate(lambda: step.greedy(prompt, n), n, model.device)
    log(f"reduce-overhead {name}: {rec['reduce_overhead_s']}, greedy {rec['reduce_overhead_greedy_tokens_s']:.1f} t/s")


def checks(report: dict) -> list[str]:
    """Issue 19's targets, stated as met / missed / not measured."""
    out = []
    seven = report["shapes"].get("llama_7b", {})
    cap = seven.get("captured_s", {})
    for q, limit in ((1, 9.0), (64, 12.0)):
        t = cap.get(q)
        verdict = None if t is None else f"{1e3 * t:.2f} ms ({'met' if 1e3 * t <= limit else 'MISSED'}: <= {limit} ms)"
        out.append(f"7B captured step q={q}: {verdict or 'not measured'}")
    for name, rec in report["shapes"].items():
        if rec.get("compiled_greedy_tokens_s"):
            ratio = rec["compiled_greedy_tokens_s"] / rec["hf_greedy_tokens_s"]
            out.append(f"{name} compiled greedy / transformers' greedy: {ratio:.2f}x "
                       f"({'met' if ratio >= 3 else 'MISSED'}: >= 3x)")
    return out


def markdown(report: dict, buckets) -> str:
    env = report["env"]
    md = [f"# device check ({env['gpu'] or env['device']}, torch {env['torch']}, transformers {env['transformers']})",
          "", "## exactness (float32, lookahead vs transformers greedy; eager step and captured buckets)", "",
          "| model | step | W | N | G | identical | S | fed / step | worst divergence |",
          "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['path']} | {r['W']} | {r['N']} | {r['G']} | {r['identical']}/{r['prompts']} | "
           f"{r['S']:.2f} | {r['fed_per_step']:.1f} | {r['divergence'] or '-'} |" for r in report["exactness"]]
    shapes = {n: r for n, r in report["shapes"].items() if "captured_s" in r}
    md += ["", f"## step latency per bucket, eager / captured (ms, {env['speed_dtype']}, {CACHE_TOKENS}-token cache)",
           "", "| q | " + " | ".join(shapes) + " |", "|---|" + "---|" * len(shapes)]
    md += [f"| {q} | " + " | ".join(f"{1e3 * r['eager_s'][q]:.2f} / {1e3 * r['captured_s'][q]:.2f}"
                                     for r in shapes.values()) + " |" for q in buckets]
    md += ["", "| model | capture (s) | transformers greedy (tokens/s) | captured greedy (tokens/s) |",
           "|---|---|---|---|"]
    md += [f"| {n} | {r['capture_s']:.1f} | {r['hf_greedy_tokens_s']:.1f} | {r['compiled_greedy_tokens_s']:.1f} |"
           for n, r in shapes.items()]
    for name, rows in report["prediction"].items():
        md += ["", f"## predicted speedup on {name}'s captured curve (S from {report['results']})", "",
               "| method | S (CPU) | tokens/step | bucket | over our compiled greedy | over transformers' greedy |",
               "|---|---|---|---|---|---|"]
        md += [f"| {r['method']} | {r['S_cpu']:.2f} | {r['tokens_per_step']:.1f} | {r['bucket']} | "
               f"{r['over_compiled_greedy']:.2f}x | {r['over_hf_greedy']:.2f}x |" for r in rows]
    for name, r in report["shapes"].items():
        if "default_path" in r:
            qs = ", ".join(f"q={q} {1e3 * t:.2f} ms" for q, t in r.get("default_s", {}).items())
            md += ["", f"default step ({name}, model.compile=auto, nothing recorded): {r['default_path']} over "
                       f"{r['default_max_len']} slots, built in {r['default_build_s']:.1f} s{', ' + qs if qs else ''}"]
    ro = {n: r for n, r in report["shapes"].items() if "reduce_overhead_s" in r}
    for name, r in ro.items():
        qs = ", ".join(f"q={q} {1e3 * t:.2f} ms" for q, t in r["reduce_overhead_s"].items())
        md += ["", f"reduce-overhead ({name}): compile {r['reduce_overhead_compile_s']:.1f} s, {qs}, greedy "
                   f"{r['reduce_overhead_greedy_tokens_s']:.1f} tokens/s"]
    for name, r in report["shapes"].items():
        if r.get("lp_host"):
            md += ["", f"## lookahead parallelism's host time ({name}, {LP_BUDGET} tree tokens per rank, K ranks in "
                       "one process, eager step; random weights: S means nothing)", "",
                   "| K | host ms / step | step ms / step | steps | tokens fed / step |", "|---|---|---|---|---|"]
            md += [f"| {k} | {v['host_ms_per_step']:.2f} | {v['step_ms_per_step']:.2f} | {v['steps']} | "
                   f"{v['fed_per_step']:.0f} |" for k, v in r["lp_host"].items()]
    md += ["", "## issue 19 checks", ""] + [f"- {c}" for c in checks(report)]
    md += ["", f"all exact: {report['all_exact']}; skipped: {report['skipped'] or 'none'}; errors: "
               f"{report['errors'] or 'none'}; {report['seconds']:.0f} s"]
    return "\n".join(md) + "\n"


def save(report: dict, outdir: str, buckets, start: float) -> str:
    """Write device_check.json and .md as they stand; returns the markdown."""
    report["seconds"] = time.perf_counter() - start
    report["all_exact"] = all(r["ok"] for r in report["exactness"])
    with open(os.path.join(outdir, "device_check.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = markdown(report, buckets)
    with open(os.path.join(outdir, "device_check.md"), "w") as f:
        f.write(md)
    return md


def run_shape(name, args, buckets, report) -> None:
    t0 = time.perf_counter()
    model = build(name, args.device, args.quick)
    log(f"{name}: built in {time.perf_counter() - t0:.1f}s, "
        f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params")
    rec = report["shapes"].setdefault(name, {})
    parts = [("exactness", lambda: report["exactness"].extend(exactness(model, name, args, buckets))),
             ("speed", lambda: speed(model, name, args, buckets, rec)),
             ("default step", lambda: default_step(model, name, args, rec))]
    if name == "llama_7b" or args.quick:
        parts.append(("lp host time", lambda: lp_host(model, name, args, rec)))
    for part, fn in parts:
        try:
            fn()
        except Exception as e:  # a failed part is recorded and the check goes on
            report["errors"].append(f"{name} {part}: {type(e).__name__}: {e}")
            log(f"ERROR {name} {part}: {type(e).__name__}: {e}")
            model.set_attn_implementation("sdpa")
    if "captured_s" in rec and os.path.isfile(args.results):
        report["prediction"][name] = predict(rec, args.results, buckets)
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="2 layers, few prompts and tokens, float32 (CPU dry run)")
    ap.add_argument("--backend", default=None,
                    help="CapturedStep backend (default: cudagraph on CUDA, inductor on CPU)")
    ap.add_argument("--buckets", default=",".join(map(str, BUCKETS)), help="comma-separated step buckets")
    ap.add_argument("--results", default="results/bench_zen4_2026-12-04b/results.json",
                    help="bench results JSON (S measured on CPU)")
    ap.add_argument("--budget-s", type=float, default=400.0, help="start no new shape or part past this many seconds")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of " + ",".join(SHAPES) + " ('' for none)")
    ap.add_argument("--reduce-overhead-shape", default="smollm2_135m", choices=list(SHAPES),
                    help="the shape part (e) compiles with torch.compile(mode='reduce-overhead')")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import transformers

    buckets = tuple(int(b) for b in args.buckets.split(","))
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
           "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None, "quick": args.quick,
           "threads": torch.get_num_threads(), "backend": args.backend, "buckets": buckets,
           "speed_dtype": "float32" if args.quick else "bfloat16"}
    log("environment", env)
    report = {"env": env, "exactness": [], "shapes": {}, "prediction": {}, "skipped": [], "errors": [],
              "results": args.results}
    names = [n for n in args.shapes.split(",") if n] if args.shapes is not None else (["smollm2_135m"] if args.quick else list(SHAPES))
    for name in names:
        if time.perf_counter() - start > args.budget_s:
            report["skipped"].append(name)
            log(f"budget spent: skipping {name}")
            continue
        run_shape(name, args, buckets, report)
        save(report, args.outdir, buckets, start)  # partial results survive a kill
    if args.device.startswith("cuda") and time.perf_counter() - start < args.budget_s - 90:
        name = args.reduce_overhead_shape
        model = build(name, args.device, args.quick)
        try:
            reduce_overhead(model, name, args, report["shapes"].setdefault(name, {}))
        except Exception as e:
            report["errors"].append(f"reduce-overhead: {type(e).__name__}: {e}")
            log(f"ERROR reduce-overhead: {type(e).__name__}: {e}")
    else:
        report["skipped"].append("reduce-overhead")
    print(save(report, args.outdir, buckets, start))
    sys.exit(0 if report["all_exact"] and not report["errors"] else 1)


if __name__ == "__main__":
    main()
