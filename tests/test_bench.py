"""The benchmark harness (fake clock), the tuner's choice (synthetic numbers), profile reuse, and a CLI smoke."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lp_runtime import tuner
from lp_runtime.bench import Method, Prompt, Result, aggregate, format_table, run_benchmark
from lp_runtime.config import DecodingConfig

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


# ---------------------------------------------------------------------------------------- tuner choice

CURVE = {1: 0.030, 2: 0.034, 3: 0.035, 4: 0.045, 8: 0.049, 16: 0.059, 32: 0.074, 64: 0.104}


def test_interpolate():
    assert tuner.interpolate(CURVE, 3) == 0.035
    assert tuner.interpolate(CURVE, 6) == pytest.approx(0.047)
    assert tuner.interpolate(CURVE, 96) == pytest.approx(0.104 + 0.030)  # linear past the end
    assert tuner.interpolate({1: 1.0, 3: 2.0, 5: 6.0}, 2) == 1.5


def test_choose_hand_computed():
    table = [
        # W0 N3 G1: pending round(1.3)=1, q = 1 + 2 = 3 -> 1.30 / 0.035 = 37.14 tok/s
        tuner.Acceptance(0, 3, 1, 1.30, 1.30),
        # W3 N3 G2: pending 2, q = 2 + 2 + 3 + 4 = 11 -> 0.049 + 3/8*0.010 = 0.05275; 1.9 / 0.05275 = 36.02
        tuner.Acceptance(3, 3, 2, 1.90, 1.90),
        # W7 N5 G7: pending 2, q = 2 + 6 + 21 + 28 = 57 -> 0.074 + 25/32*0.030 = 0.0974; 2.4 / 0.0974 = 24.6
        tuner.Acceptance(7, 5, 7, 2.40, 2.40),
    ]
    choice = tuner.choose(CURVE, table)
    assert choice["decoding"] == DecodingConfig(method="lookahead", window_size=0, ngram_size=3, guess_set_size=1)
    assert choice["expected_tokens_per_s"] == pytest.approx(1.30 / 0.035)
    assert choice["greedy_tokens_per_s"] == pytest.approx(1 / 0.030)
    assert [s["step_tokens"] for s in choice["scores"]] == [3, 11, 57]
    assert choice["scores"][1]["expected_tokens_per_s"] == pytest.approx(1.9 / 0.05275)

    # On a flat (GPU-like) curve the big window wins.
    flat = {q: 0.010 for q in (1, 2, 4, 8, 16, 32, 64)}
    assert tuner.choose(flat, table)["decoding"].window_size == 7


def test_choose_uses_measured_step_sizes():
    # W0 N4 G2 with S = 1.5: as a full step (pending round(1.5) = 2, q = 2 + 2 * 3 = 8) it costs 0.049 s, 30.6 tok/s,
    # under greedy's 33.3. Measured: 6 steps of 1 token (no candidate), 3 of 4 (one), 1 of 7 (two):
    # (6 * 0.030 + 3 * 0.045 + 1 * (0.045 + 3/4 * 0.004)) / 10 = 0.0363 s, mean q = (6 + 12 + 7) / 10 = 2.5,
    # 1.5 / 0.0363 = 41.3 tok/s: it beats greedy.
    full = tuner.Acceptance(0, 4, 2, 1.5, 1.5)
    measured = tuner.Acceptance(0, 4, 2, 1.5, 1.5, {1: 6, 4: 3, 7: 1})
    assert tuner.choose(CURVE, [full])["decoding"].method == "greedy"
    choice = tuner.choose(CURVE, [measured])
    assert choice["decoding"] == DecodingConfig(method="lookahead", window_size=0, ngram_size=4, guess_set_size=2)
    assert choice["scores"][0]["step_tokens"] == pytest.approx(2.5)
    assert choice["expected_tokens_per_s"] == pytest.approx(1.5 / 0.0363)


def test_choose_falls_back_to_greedy():
    steep = {1: 0.030, 2: 0.060, 3: 0.090, 64: 1.92}  # cost proportional to tokens: nothing can pay
    choice = tuner.choose(steep, [tuner.Acceptance(0, 3, 1, 1.3, 1.3), tuner.Acceptance(7, 5, 7, 2.4, 2.4)])
    assert choice["decoding"].method == "greedy" and choice["expected_speedup"] == 1.0
    # within the 3% margin: still greedy; above it: lookahead
    curve = {1: 0.030, 3: 0.030 * 1.2}
    assert tuner.choose(curve, [tuner.Acceptance(0, 3, 1, 1.22, 1.0)])["decoding"].method == "greedy"
    assert tuner.choose(curve, [tuner.Acceptance(0, 3, 1, 1.25, 1.0)])["decoding"].method == "lookahead"
    assert tuner.choose(curve, [])["decoding"].method == "greedy"


# ---------------------------------------------------------------------------------------- profile reuse

def test_profile_saved_and_reused(tmp_path):
    counts = {"latency": 0, "acceptance": 0}

    def latency():
        counts["latency"] += 1
        return CURVE

    def acceptance(cands):
        counts["acceptance"] += 1
        return [tuner.Acceptance(*c, 1.3, 1.3) for c in cands]

    kw = dict(latency_fn=latency, acceptance_fn=acceptance, candidates=[(0, 3, 1)], root=str(tmp_path))
    d1, p1 = tuner.tune("m/x", "cpu", "float32", **kw)
    path = tuner.profile_path("m/x", "cpu", "float32", str(tmp_path))
    assert os.path.isfile(path) and path.startswith(str(tmp_path / "tuner"))
    assert p1["reused"] is False and counts == {"latency": 1, "acceptance": 1}
    d2, p2 = tuner.tune("m/x", "cpu", "float32", **kw)
    assert p2["reused"] is True and counts == {"latency": 1, "acceptance": 1} and d2 == d1
    assert d1.window_size == 0 and d1.method == "lookahead"
    saved = json.loads(Path(path).read_text())
    assert saved["latency_s"]["3"] == 0.035 and saved["choice"]["decoding"]["ngram_size"] == 3
    # another candidate set, another device, or retune: measured again
    tuner.tune("m/x", "cpu", "float32", **{**kw, "candidates": [(0, 3, 2)]})
    tuner.tune("m/x", "cuda:0", "float32", **kw)
    tuner.tune("m/x", "cpu", "float32", **kw, retune=True)
    assert counts == {"latency": 4, "acceptance": 4}


# ---------------------------------------------------------------------------------------- tiny model

def test_resolve_auto_on_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    """The real measurement path end to end (tiny sizes); the choice itself is tested above."""
    from lp_runtime.config import ModelConfig
    from lp_runtime.models import load_model

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    model, tok = load_model(ModelConfig(name="tiny", path=str(tiny_model_dir), device="cpu"))
    curve = tuner.measure_latency(model, (1, 2, 4), cache_tokens=16, reps=1)
    assert sorted(curve) == [1, 2, 4] and all(t > 0 for t in curve.values())
    table = tuner.measure_acceptance(model, tok, [[1, 2, 3, 1, 2]], [(0, 3, 1), (2, 3, 1)], max_new_tokens=4)
    assert [(r.window_size, r.guess_set_size) for r in table] == [(0, 1), (2, 1)]
    assert all(1.0 <= r.step_compression <= 3.0 for r in table)
    for r in table:  # every step counted once (steps * S = the 1-4 tokens made), none larger than a full step
        tokens = sum(r.step_tokens_hist.values()) * r.step_compression
        assert round(tokens, 6) in (1, 2, 3, 4)
        assert 1 <= min(r.step_tokens_hist) and max(r.step_tokens_hist) <= r.decoding().step_tokens(3, 1)


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
