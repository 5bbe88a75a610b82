"""Per-rank tokens of recorded LP steps under two shard plans: the one before issue 18's preorder cut (commit
3c66c01: root subtrees, the heaviest cut into its children's subtrees, then largest-first placement) and today's
``parallel.tree_plan`` (contiguous runs of the tree's preorder), on the same trees (deterministic, no model).

    .venv/bin/python scripts/lp_replan.py results/lp_scaling/he_pair_cap_k8/trees_k8.jsonl.gz

Input: ``lp_scaling.py --trees`` output, one JSON line per step [pending, columns, levels, parents] (``.gz`` ok);
K from the file name (``trees_kK``). Prints, per plan, the mean tokens per step of each rank (pending included),
the busiest rank per step averaged, and what one process feeds. Needs this repository's git history.
"""
from __future__ import annotations

import functools
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lp_runtime.parallel import tree_plan  # noqa: E402
from lp_runtime.tree import subtrees  # noqa: E402
from lp_runtime.window import step_tokens  # noqa: E402

OLD = "3c66c01"


def old_tree_plan():
    """``tree_plan`` as of commit ``OLD`` (its source from git, run in a namespace of its own)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD}:lp_runtime/parallel.py"], capture_output=True,
                         text=True, check=True).stdout
    ns = {"functools": functools, "Optional": Optional, "Sequence": Sequence, "step_tokens": step_tokens,
          "Plan": tuple, "subtrees": subtrees}
    for name in ("_pack_columns", "shard_plan", "split_units", "_descendants", "tree_plan"):
        start = src.rfind("\n\n", 0, src.index(f"def {name}(")) + 2
        exec(src[start : src.index("\n\n\n", start)], ns)  # noqa: S102 (this repository's own code)
    return ns["tree_plan"]


def main() -> None:
    plans = {"before (3c66c01)": old_tree_plan(), "preorder cut (now)": tree_plan}
    for path in sys.argv[1:]:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            steps = [json.loads(line) for line in f if line.strip()]
        k = int(Path(path).name.split("trees_k")[1].split(".")[0])
        whole = sum(p + step_tokens(w, lv) + len(par) for p, w, lv, par in steps) / len(steps)
        for name, fn in plans.items():
            per = [[p + (max(c) if c else 0) + lv * len(c) + len(n) for c, n in fn(p, w, lv, par, k)]
                   for p, w, lv, par in steps]
            mean = [sum(r[i] for r in per) / len(per) for i in range(k)]
            print(f"{path} | {name} | {len(steps)} steps | per rank [{', '.join(f'{m:.1f}' for m in mean)}] | "
                  f"busiest {sum(max(r) for r in per) / len(per):.1f} | one process {whole:.1f}")


if __name__ == "__main__":
    main()
