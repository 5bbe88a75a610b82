"""GPU check of lp_runtime without Hydra: exactness on CUDA, the per-step latency curve, a speedup prediction.

Needs only torch + transformers (lp_runtime's core modules are imported directly, not lp_runtime.generate)::

    python scripts/device_check.py OUTDIR                      # on a GPU: < 8 minutes
    python scripts/device_check.py OUTDIR --device cpu --quick # smoke test anywhere (~1-2 minutes)

(a) exactness: lookahead (several W, N, G) against transformers' greedy ``generate`` on randomly initialised
    Llama models of real shapes (SmolLM2-135M, Llama-3.2-1B, Llama-2-7B) in float32 (TF32 off), random prompts;
    a divergence reports the top-2 logit gap at the first differing token (DESIGN.md section 6: < 1e-4 is a tie).
(b) latency: seconds per forward pass against input tokens per step q = 1..256 over a 200-token cache, bf16
    (``lp_runtime.latency.measure_latency``: median of reps, logits for half the step).
(c) prediction: for each method of a benchmark results JSON (``--results``, from ``python -m lp_runtime.bench``
    on CPU), predicted speedup over greedy = S * latency(1) / latency(tokens fed per step of that method, its
    cap where the bench did not count them), per shape.
    It assumes S carries over from the CPU run's model to these shapes (it is a property of the model's
    predictions, not of the hardware).

Writes OUTDIR/device_check.json and OUTDIR/device_check.md; scripts/device_check.sh adds the log.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lp_runtime import latency  # noqa: E402
from lp_runtime.policy import interpolate  # noqa: E402
from lp_runtime.config import DecodingConfig  # noqa: E402
from lp_runtime.decoder import Decoder  # noqa: E402

SHAPES = {  # LlamaConfig fields of the real models
    "smollm2_135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0),
    "llama_1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True, rope_theta=500000.0),
    "llama_7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False, rope_theta=10000.0),
}
SETTINGS = ((0, 4, 2), (3, 4, 3), (7, 5, 7), (15, 5, 15))  # the CPU default, the bench's windowed one, the paper's
QS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def build(name: str, device: str, quick: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(SHAPES[name])
    if quick:  # CPU smoke: real widths, few layers
        shape["num_hidden_layers"] = 2
    config = LlamaConfig(**shape, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    return model


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


def exactness(model, name: str, num_prompts: int, n_new: int, settings=SETTINGS) -> list[dict]:
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    rows = []
    prompts = []
    for i in range(num_prompts):  # half random ids, half with repeats (so the prompt pool has matches)
        p = torch.randint(0, vocab, (48,), generator=gen).tolist()
        prompts.append(p if i % 2 == 0 else p[:24] * 2)
    refs = [hf_greedy(model, p, n_new) for p in prompts]
    for w, n, g in settings:
        dec = Decoder(model, DecodingConfig(method="lookahead", window_size=w, ngram_size=n, guess_set_size=g))
        same = steps = tokens = 0
        worst = None
        for p, ref in zip(prompts, refs):
            out = dec.generate(p, max_new_tokens=n_new)
            tokens += len(out.output_ids)
            steps += out.decoding_steps
            if out.output_ids == ref:
                same += 1
                continue
            i = next((k for k, (a, b) in enumerate(zip(out.output_ids, ref)) if a != b), min(len(ref), len(out.output_ids)))
            gap = top2_gap(model, p + ref[:i])
            worst = {"first_diff": i, "top2_gap": gap} if worst is None or gap > worst["top2_gap"] else worst
        row = {"model": name, "W": w, "N": n, "G": g, "identical": same, "prompts": len(prompts),
               "S": tokens / max(steps, 1), "divergence": worst,
               "ok": same == len(prompts) or (worst is not None and worst["top2_gap"] < 1e-4)}
        log(f"exactness {name} W{w} N{n} G{g}: {same}/{len(prompts)} identical, S={row['S']:.2f}"
            + (f", worst divergence {worst}" if worst else ""))
        rows.append(row)
    return rows


def predict(curve: dict[int, float], results_path: str) -> list[dict]:
    """Predicted speedup over greedy per method of a bench results JSON (group "all")."""
    with open(results_path, encoding="utf-8") as f:
        res = json.load(f)
    out = []
    for r in res["table"]:
        if r["group"] != "all" or not r.get("step_tokens") or not r.get("step_compression"):
            continue
        # tokens actually fed per step where the bench measured it (a policy feeds fewer than its cap), else the cap
        q = r.get("fed_per_step") or r["step_tokens"]
        lat = interpolate(curve, q)
        out.append({"method": r["method"], "S_cpu": r["step_compression"], "step_tokens": q,
                    "step_latency_ratio": lat / curve[1],
                    "predicted_speedup": r["step_compression"] * curve[1] / lat,
                    "cpu_speedup_mean_ratio": r.get("speedup_mean_ratio")})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="few layers, small q range, few prompts (CPU smoke)")
    ap.add_argument("--results", default="results/bench_cpu/results.json", help="bench results JSON (S measured on CPU)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip remaining work past this many seconds")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of " + ",".join(SHAPES))
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    t_start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
           "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None, "quick": args.quick,
           "threads": torch.get_num_threads()}
    log("environment", env)
    shapes = args.shapes.split(",") if args.shapes else (["smollm2_135m"] if args.quick else list(SHAPES))
    qs = [1, 2, 4, 8, 16] if args.quick else list(QS)
    report = {"env": env, "exactness": [], "latency_s": {}, "prediction": {}, "skipped": []}
    for name in shapes:
        if time.perf_counter() - t_start > args.budget_s:
            report["skipped"].append(name)
            log(f"budget spent: skipping {name}")
            continue
        t0 = time.perf_counter()
        model = build(name, args.device, args.quick)
        log(f"{name}: built in {time.perf_counter() - t0:.1f}s, "
            f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params")
        report["exactness"] += exactness(model, name, 2 if args.quick else 4, 12 if args.quick else 48,
                                         SETTINGS[:2] if args.quick else SETTINGS)
        model.to(torch.bfloat16 if args.device.startswith("cuda") or not args.quick else torch.float32)
        curve = latency.measure_latency(model, qs, cache_tokens=200, reps=2 if args.quick else 5)
        report["latency_s"][name] = {str(q): t for q, t in curve.items()}
        log(f"latency {name} ({model.dtype}): " + ", ".join(f"q={q} {1e3 * t:.2f}ms" for q, t in curve.items()))
        if os.path.isfile(args.results):
            report["prediction"][name] = predict(curve, args.results)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        with open(os.path.join(args.outdir, "device_check.json"), "w") as f:  # partial results survive a kill
            json.dump(report, f, indent=1)
    if not os.path.isfile(args.results):
        log(f"no {args.results}: no speedup prediction (run python -m lp_runtime.bench first and carry it)")
    report["seconds"] = time.perf_counter() - t_start
    report["all_exact"] = all(r["ok"] for r in report["exactness"])
    with open(os.path.join(args.outdir, "device_check.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = [f"# device check ({env['gpu'] or env['device']}, torch {env['torch']}, transformers {env['transformers']})",
          "", "## exactness (float32, lookahead vs transformers greedy)", "",
          "| model | W | N | G | identical | S | worst divergence |", "|---|---|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['W']} | {r['N']} | {r['G']} | {r['identical']}/{r['prompts']} | {r['S']:.2f} | "
           f"{r['divergence'] or '-'} |" for r in report["exactness"]]
    md += ["", "## seconds per step against input tokens q (ms)", "",
           "| q | " + " | ".join(report["latency_s"]) + " |", "|---|" + "---|" * len(report["latency_s"])]
    md += [f"| {q} | " + " | ".join(f"{1e3 * c[str(q)]:.2f}" for c in report["latency_s"].values()) + " |" for q in qs]
    for name, rows in report["prediction"].items():
        md += ["", f"## predicted speedup over greedy on {name} (S from {args.results})", "",
               "| method | S (CPU) | tokens/step | latency ratio | predicted speedup | CPU speedup |",
               "|---|---|---|---|---|---|"]
        md += [f"| {r['method']} | {r['S_cpu']:.2f} | {r['step_tokens']:.1f} | {r['step_latency_ratio']:.2f} | "
               f"{r['predicted_speedup']:.2f}x | {r['cpu_speedup_mean_ratio'] or 0:.2f}x |" for r in rows]
    md += ["", f"all exact: {report['all_exact']}; skipped: {report['skipped'] or 'none'}; "
               f"{report['seconds']:.0f} s"]
    with open(os.path.join(args.outdir, "device_check.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    sys.exit(0 if report["all_exact"] else 1)


if __name__ == "__main__":
    main()
