"""Steps per prompt group and K for every run folder beside this script (python3 sum.py)."""
import glob
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
for d in sorted(glob.glob(os.path.join(here, "*", ""))):
    for k in (1, 8):
        try:
            rows = json.load(open(d + f"partial_k{k}.json"))
        except OSError:
            continue
        parts = []
        for name, code in (("MT", False), ("HE", True)):
            g = [r for r in rows if str(r["category"]).startswith("humaneval") == code]
            if g:
                steps, new = sum(r["steps"] for r in g), sum(r["new_tokens"] for r in g)
                parts.append(f"{name} {len(g)} prompts: {steps} steps, S {new / steps:.3f}")
        busiest = sum(r["max_rank_tokens"] for r in rows) / sum(r["steps"] for r in rows)
        print(f"{os.path.basename(d[:-1]):8s} K={k}  " + "; ".join(parts) +
              f"; busiest rank {busiest:.1f} tokens/step; identical {all(r['identical'] for r in rows)}")
