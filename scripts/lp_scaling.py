"""Strong scaling of lookahead parallelism on CPU (gloo): K ranks with W and G grown K times.

    .venv/bin/python scripts/lp_scaling.py --ks 1 2 4 --window 3 --ngram 4 --guess 3 --limit 5 --max-new-tokens 64

For each K it runs ``torchrun --standalone --nproc-per-node=K -m lp_runtime.generate parallel=lpK`` with
W = K x window, G = K x guess on the bundled SmolLM2 (MT-Bench first turns), one after the other, and reads
each run's summary: step compression S, decoding steps, tokens/s, collectives / bytes / seconds of
communication per step. It adds the per-rank input tokens of a full step from ``parallel.shard_plan``
(what carries over to GPUs, where each rank has its own device). On a 2-core CPU the K ranks share the
cores, so wall time does not scale here. Writes ``OUT/lp_scaling.json`` and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lp_runtime.config import DecodingConfig  # noqa: E402
from lp_runtime.parallel import rank_tokens, shard_plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--window", type=int, default=3)
    ap.add_argument("--ngram", type=int, default=4)
    ap.add_argument("--guess", type=int, default=3)
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="outputs/lp_scaling")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    rows = []
    for k in args.ks:
        w, g, n = args.window * k, args.guess * k, args.ngram
        answers = out / f"k{k}.jsonl"
        for p in (answers, answers.with_suffix(".summary.json")):
            p.unlink(missing_ok=True)
        cmd = [torchrun, "--standalone", f"--nproc-per-node={k}", "-m", "lp_runtime.generate",
               f"parallel.lp={k}", "parallel.backend=gloo", f"decoding.window_size={w}", f"decoding.ngram_size={n}",
               f"decoding.guess_set_size={g}", "dataset=mt_bench", f"dataset.limit={args.limit}",
               "dataset.first_turn_only=true", f"generation.max_new_tokens={args.max_new_tokens}",
               f"output.path={answers}", "progress=false", f"hydra.run.dir={out / 'hydra' / f'k{k}'}"]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        summary = json.loads(answers.with_suffix(".summary.json").read_text())
        comm = summary.get("lp_communication", {})
        levels = n - 2
        sizes = (n - 1,) * g  # a full step of G separate chains (the tree's nodes vary per step; see s_table.py)
        plan = shard_plan(1, w, levels, sizes, k)
        per_rank = [rank_tokens(p, 1, levels, sizes) for p in plan]
        rows.append({
            "K": k, "W": w, "N": n, "G": g,
            "step_tokens_one_process": DecodingConfig(window_size=w, ngram_size=n, guess_set_size=g).step_tokens(1, g),
            "per_rank_tokens": per_rank,
            "S": summary["step_compression"], "decoding_steps": summary["decoding_steps"],
            "new_tokens": summary["new_tokens"], "tokens_per_s": summary["tokens_per_s"],
            "collectives_per_step": comm.get("collectives_per_step", 0.0),
            "bytes_per_step": comm.get("bytes_per_step", 0.0),
            "comm_ms_per_step": 1000 * comm.get("comm_seconds_per_step", 0.0),
        })
    (out / "lp_scaling.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| K | W | N | G | tokens/step (1 process) | per-rank tokens | S | steps | tokens/s | "
          "collectives/step | bytes/step | comm ms/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['K']} | {r['W']} | {r['N']} | {r['G']} | {r['step_tokens_one_process']} | "
              f"{r['per_rank_tokens']} | {r['S']:.3f} | {r['decoding_steps']} | {r['tokens_per_s']:.2f} | "
              f"{r['collectives_per_step']:.2f} | {r['bytes_per_step']:.0f} | {r['comm_ms_per_step']:.2f} |")


if __name__ == "__main__":
    main()
