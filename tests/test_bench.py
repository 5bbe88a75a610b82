"""The benchmark harness (fake clock) and a CLI smoke (the tuner: tests/test_tuner.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lp_runtime.bench import Method, Prompt, Result, aggregate, format_table, run_benchmark

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------- harness metrics

class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _method(label, clock, table):
    """A runner returning table[prompt first id] = (output ids, steps, accept lengths, seconds it takes)."""
    calls = []

    def run(ids):
        out, steps, accepts, seconds = table[ids[0]]
        clock.t += seconds
        calls.append(ids[0])
        return Result(out, steps, accepts)

    m = Method(label, run, 1)
    m.calls = calls
    return m


def test_harness_metrics_on_a_fake_clock():
    clock = FakeClock()
    prompts = [Prompt("a/1/0", "a", "a/x", [1]), Prompt("a/2/0", "a", "a/y", [2]), Prompt("b/3/0", "b", "b/x", [3])]
    base = _method("base", clock, {1: ([5] * 4, 4, None, 2.0), 2: ([6] * 2, 2, None, 1.0), 3: ([7] * 6, 6, None, 3.0)})
    fast = _method("fast", clock, {1: ([5] * 4, 2, [2, 2], 1.0),             # 4 tok/s vs 2: ratio 2
                                   2: ([6, 0], 1, [2], 1.0),                 # 2 tok/s vs 2: ratio 1, differs
                                   3: ([7] * 6, 4, [1, 2, 1, 2], 1.5)})     # 4 tok/s vs 2: ratio 2
    rows = run_benchmark(prompts, [base, fast], baseline="base", clock=clock, warmup=True)
    # warm-up: one call each on the first prompt, not counted; then order rotates per prompt
    assert base.calls == [1, 1, 2, 3] and fast.calls == [1, 1, 2, 3]
    assert len(rows) == 6 and [r["identical"] for r in rows if r["method"] == "fast"] == [True, False, True]
    table = {(r["method"], r["group"]): r for r in aggregate(rows, [base, fast], "base")}
    assert [g for m, g in table if m == "fast"] == ["a/x", "a/y", "b/x", "a", "b", "all"]

    allf = table[("fast", "all")]
    assert allf["new_tokens"] == 12 and allf["seconds"] == 3.5 and allf["steps"] == 7
    assert allf["tokens_per_s"] == pytest.approx(12 / 3.5)
    assert allf["speedup_mean_ratio"] == pytest.approx((2 + 1 + 2) / 3)
    assert allf["speedup_total"] == pytest.approx((12 / 3.5) / (12 / 6.0))
    assert allf["step_compression"] == pytest.approx(12 / 7)
    assert allf["mean_accepted"] == pytest.approx(12 / 7)
    assert allf["seconds_per_step"] == pytest.approx(3.5 / 7)
    assert (allf["identical"], allf["compared"]) == (2, 3)

    a = table[("fast", "a")]
    assert a["speedup_mean_ratio"] == pytest.approx(1.5)
    assert a["speedup_total"] == pytest.approx((6 / 2.0) / (6 / 3.0))
    assert table[("fast", "b/x")]["speedup_mean_ratio"] == pytest.approx(2.0)
    b = table[("base", "all")]
    assert b["speedup_mean_ratio"] == 1.0 and b["step_compression"] == 1.0 and b["mean_accepted"] == 1.0
    assert "fast" in format_table(list(table.values()))


def test_harness_follow_up_turns_use_the_baseline_answer():
    clock = FakeClock()
    seen = []

    def run(ids):
        seen.append(tuple(ids))
        return Result([9, 9], 2, [1, 1])

    m = Method("m", run)
    follow = lambda p, ref: Prompt(p.key[:-1] + "1", p.dataset, p.category, p.ids + ref) if p.key.endswith("0") else None  # noqa: E731
    rows = run_benchmark([Prompt("d/1/0", "d", "d/c", [1])], [m], baseline="m", clock=clock, warmup=False,
                         follow_up=follow)
    assert [r["key"] for r in rows] == ["d/1/0", "d/1/1"] and seen == [(1,), (1, 9, 9)]


# ---------------------------------------------------------------------------------------- CLI

def test_bench_cli_smoke(tiny_model_dir, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in [
        {"question_id": 1, "category": "writing", "turns": ["Write a haiku about the sea."]},
        {"question_id": 2, "category": "math", "turns": ["What is 2 + 3?", "And 4 + 5?"]},
    ]))
    out = tmp_path / "bench"
    env = dict(os.environ, HF_HUB_OFFLINE="1", LP_RUNTIME_CACHE=str(tmp_path / "cache"))
    args = [sys.executable, "-m", "lp_runtime.bench", f"hydra.run.dir={tmp_path / 'hydra'}", "progress=false",
            f"model.path={tiny_model_dir}", "model.name=tiny", "generation.max_new_tokens=8",
            f"datasets=[{{name:jsonl,path:'{questions}',first_turn_only:true}}]", "lookahead=[[0,3,1],[2,3,2]]",
            "decoding.ngram_size=3", "decoding.guess_set_size=1",  # the decoding group's setting: one of the list
            f"output_dir={out}"]
    res = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("results.csv", "results.json", "speedup_per_category.png", "scaling.png", "step_latency.png"):
        assert (out / name).is_file(), name
    result = json.loads((out / "results.json").read_text())
    labels = list(result["methods"])
    assert labels == ["hf_greedy", "hf_prompt_lookup", "greedy", "lookahead W0 N3 G1", "lookahead W2 N3 G2"]
    alls = {r["method"]: r for r in result["table"] if r["group"] == "all"}
    assert {r["group"] for r in result["table"]} == {"q/writing", "q/math", "q", "all"}
    for label in labels:  # greedy methods: every output identical to transformers' greedy
        assert alls[label]["prompts"] == 2 and alls[label]["identical"] == 2, label
    assert alls["hf_greedy"]["step_compression"] == 1.0 and alls["greedy"]["step_compression"] == 1.0
    assert "speedup(mean ratio)" in res.stdout
