"""Compare model-in-the-loop S runs of ``s_table.py`` prompt by prompt on the prompts every run finished.

    .venv/bin/python scripts/s_compare.py results/s_table/runs/w15n5g15_counts_copy.json results/s_accept/runs/*.json

Runs of a chaotic window differ prompt by prompt even for a change that does nothing systematic (a different
``decoding.seed`` moves single prompts by +-0.15 S), so a lever is read on the common prompts' pooled S
(tokens / steps), with the per-prompt S beside it. Partial runs (``*.partial.json``) count with the prompts
they finished. Prints a markdown table; the first file is the baseline.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    runs = []
    for p in sys.argv[1:]:
        res = json.loads(Path(p).read_text())
        runs.append((res["name"] + (" (partial)" if p.endswith(".partial.json") else ""), res["rows"]))
    for group in ("mt_bench", "humaneval"):
        per = [{r["id"]: r for r in rows if r["group"] == group} for _, rows in runs]
        have = [i for i, p in enumerate(per) if p]
        if len(have) < 2 or 0 not in have:
            continue
        for i in have[1:]:
            common = [q for q in per[0] if q in per[i]]
            s = [sum(per[k][q]["new_tokens"] for q in common) / sum(per[k][q]["steps"] for q in common) for k in (0, i)]
            f = [sum(per[k][q]["fed_tokens"] for q in common) / sum(per[k][q]["steps"] for q in common) for k in (0, i)]
            ident = sum(per[i][q]["status"] == "identical" for q in common)
            each = " ".join(f"{per[i][q]['new_tokens'] / per[i][q]['steps']:.2f}" for q in common)
            base = " ".join(f"{per[0][q]['new_tokens'] / per[0][q]['steps']:.2f}" for q in common)
            print(f"| {group} | {runs[i][0]} | {len(common)} | {s[0]:.3f} -> {s[1]:.3f} ({s[1] / s[0] - 1:+.1%}) | "
                  f"{f[0]:.1f} -> {f[1]:.1f} | {ident}/{len(common)} | {base} | {each} |")


if __name__ == "__main__":
    main()
