"""How often tests/test_sampling.py::test_lookahead_sampling_law_is_exact would catch a wrong sampling law.

Samples are drawn from the exact law of a WRONG setting (temperature 1.2x or 1.5x, a repetition penalty off) and
tested against the right one, as the test does: the joint law of 3 tokens alone at 1e-3 (the test before
2026-12-02, 1500 runs), and the joint plus each token's law and the first pair's, each at 1e-3 / 5 (the test now,
with its runs per setting: 1000, or 1500 under top-k). Prints the fraction of 300 simulated tests that fail, per setting of the test's E2E list ("right law":
the false-failure rate).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python results/test_time/sampling_power.py
"""
import sys
from dataclasses import replace

import torch

sys.path.insert(0, "tests")
from exactness import hf_greedy  # noqa: E402
from fakes import build_tiny8  # noqa: E402
from test_sampling import E2E, chi2_pvalue, exact_joint, marginal  # noqa: E402

torch.set_num_threads(1)
GEN = torch.Generator().manual_seed(0)
VIEWS = [(0, 1, 2), (0,), (1,), (2,), (0, 1)]


def fails(counts, probs, alpha):
    """Whether the test's chi-square (``test_sampling.chi2_pvalue``) rejects: p below ``alpha``, or an outcome the
    right law gives probability 0 (the test's assertion)."""
    try:
        return chi2_pvalue(counts, probs)[0] < alpha
    except AssertionError:
        return True


def caught(right, wrong, n, views, reps=300):
    keys = list(set(right) | set(wrong))
    q = torch.tensor([wrong.get(k, 0.0) for k in keys], dtype=torch.float64)
    hits = 0
    for _ in range(reps):
        c = torch.bincount(torch.multinomial(q, n, replacement=True, generator=GEN), minlength=len(keys)).tolist()
        counts = {k: o for k, o in zip(keys, c) if o}
        if views:
            hits += any(fails(marginal(counts, v), marginal(right, v), 1e-3 / len(VIEWS)) for v in VIEWS)
        else:
            hits += fails(counts, right, 1e-3)
    return hits / reps


def main():
    model = build_tiny8()
    base = [1, 2, 3]
    cont = hf_greedy(model, base, 6)
    prompt = base + cont + [5, 3] + cont[:1] + [4] + base  # test_sampling.py's tiny8 prompt
    for cfg, _, runs in E2E:
        right = exact_joint(model, prompt, cfg, 3)
        pen = 1.1 if cfg.repetition_penalty == 1.0 else 1.0
        for name, bad in [("T x1.2", replace(cfg, temperature=cfg.temperature * 1.2)),
                          ("T x1.5", replace(cfg, temperature=cfg.temperature * 1.5)),
                          (f"penalty {pen}", replace(cfg, repetition_penalty=pen)),
                          ("right law", cfg)]:
            wrong = exact_joint(model, prompt, bad, 3)
            tv = 0.5 * sum(abs(right.get(k, 0) - wrong.get(k, 0)) for k in set(right) | set(wrong))
            print(f"T{cfg.temperature} k{cfg.top_k} p{cfg.top_p} r{cfg.repetition_penalty}, {name}: TV {tv:.3f}; "
                  f"caught: joint alone, 1500 runs {caught(right, wrong, 1500, False):.3f}; "
                  f"joint + views, {runs} runs {caught(right, wrong, runs, True):.3f}", flush=True)


if __name__ == "__main__":
    main()
