"""decoding=auto's setting and its start-up line (lp_runtime.auto): the window bound from the curve, the expected
speedup from a calibration that resembles a run, and how close that estimate comes to what the policy then
achieves (on a synthetic curve: the step time is the curve's, no wall clock)."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lp_runtime import auto, latency, models
from lp_runtime.config import DecodingConfig, ModelConfig
from lp_runtime.decoder import Decoder
from lp_runtime.policy import CostPolicy
from fakes import llama

FLOAT32 = {1: 38.5, 2: 61.8, 3: 75.8, 4: 58.9, 8: 59.2, 16: 70.6, 32: 95.0, 64: 142.8}
BFLOAT16 = {1: 21.9, 2: 21.5, 3: 21.0, 4: 22.1, 8: 24.4, 16: 28.0, 32: 36.8, 64: 52.6}
GPU = {1: 0.0100, 8: 0.0102, 16: 0.0105, 32: 0.0112, 64: 0.0130, 128: 0.0190}  # an H200-like, nearly flat curve


@pytest.fixture(scope="module")
def tiny():
    return llama(max_position_embeddings=512)


def test_auto_window_from_the_curve():
    # N = 6: W = 3 is 2 + 4 * 3 = 14 window tokens. float32: q = 15 costs 69.2 ms vs 38.5: never pays.
    assert auto.auto_window(FLOAT32, 6) == 0
    assert auto.auto_window(BFLOAT16, 6) == 0  # 27.6 ms vs 21.9 for 0.15 more tokens on 1.5: not either
    assert auto.auto_window({1: 10.0, 201: 12.0}, 6) == 15  # nearly flat: W = 15, +7.4% cost for +10% tokens
    assert auto.auto_window({1: 10.0, 101: 20.0}, 6) == 0  # W = 3 costs +14% for +10%
    d = auto.auto_decoding({1: 1.0, 64: 1.0}, DecodingConfig(method="auto", ngram_size=5, guess_set_size=3))
    assert d == DecodingConfig(method="auto", window_size=15, ngram_size=5, guess_set_size=3)


def test_auto_window_under_lp_prices_the_busiest_rank_and_keeps_the_variants():
    curve = {1: 50.0, 201: 250.0}  # 1 ms a token on 50 ms: one process, W = 3 at N = 4 is 9 tokens, +16% for +10%
    assert auto.auto_window(curve, 4) == 0
    assert auto.auto_window(curve, 4, lp_size=3) == 3  # 3 ranks: at most 1 + 2 + 2 = 5 tokens each, +8%
    d = auto.auto_decoding(curve, DecodingConfig(method="auto", ngram_size=4, max_depth=5), 3)
    assert (d.window_size, d.max_depth, d.method) == (3, 5, "auto")


def test_expected_speedup():
    # 10 tokens in 4 steps of q = 1, 4, 8, 8 on float32: 10 * 38.5 / (38.5 + 58.9 + 2 * 59.2)
    assert auto.expected_speedup(FLOAT32, 10, [1, 4, 8, 8]) == pytest.approx(385 / 215.8)
    assert auto.expected_speedup(FLOAT32, 0, []) == 1.0


class Out:
    def __init__(self, tokens, steps):
        self.output_ids, self.step_tokens = [0] * tokens, steps


class Scripted:
    """A fake decoder: prompt i makes ``outs[i]`` (tokens, step sizes); the calls are recorded."""

    def __init__(self, outs, clock=None, seconds=0.0):
        self.outs, self.calls, self.clock, self.seconds = outs, [], clock, seconds

    def generate(self, prompt, max_new_tokens):
        self.calls.append((prompt, max_new_tokens))
        if self.clock is not None:
            self.clock[0] += self.seconds
        return Out(*self.outs[len(self.calls) - 1])


def test_calibrate_skips_the_warm_prompt_and_reports_the_spread():
    flat = {1: 1.0, 64: 1.0}
    dec = Scripted([(5, [1] * 5), (8, [4, 4]), (6, [4, 4, 4])])
    c = auto.calibrate(dec, [[1], [2], [3]], flat, max_new_tokens=8)
    assert [p for p, _ in dec.calls] == [[1], [2], [3]] and {n for _, n in dec.calls} == {8}
    # counted: prompts 2 and 3 (14 tokens in 5 steps of cost 1 against 14 plain steps)
    assert c == {"tokens": 14, "steps": 5, "mean_step_tokens": 4.0, "expected_speedup": 14 / 5, "low": 2.0,
                 "high": 4.0, "prompts": 2, "max_new_tokens": 8}
    # one prompt only: it is counted (nothing to warm with); the time budget stops after two counted prompts
    assert auto.calibrate(Scripted([(3, [1, 1, 1])]), [[1]], flat)["prompts"] == 1
    now = [0.0]
    dec = Scripted([(2, [1, 1])] * 6, clock=now, seconds=50.0)
    c = auto.calibrate(dec, [[i] for i in range(6)], flat, budget_s=90.0, clock=lambda: now[0])
    assert len(dec.calls) == 3 and c["prompts"] == 2  # 0 s, 50 s, 100 s: then over budget


def test_calibrate_ticks_a_bar_on_stderr_a_prompt_only_with_progress(capsys):
    """The calibration of a fresh demo on a busy machine took minutes with nothing printed (2026-12-02): with
    ``progress`` each prompt ticks a bar on stderr (stdout keeps the one start-up line); without, nothing."""
    flat = {1: 1.0, 64: 1.0}
    c = auto.calibrate(Scripted([(2, [1, 1])] * 3), [[1], [2], [3]], flat, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and c["prompts"] == 2
    shown = [line for line in err.split("\r") if line.strip()]  # tqdm redraws its line with "\r"
    assert [line.rsplit("| ", 1)[1].split(" [")[0] for line in shown] == ["0/3", "1/3", "2/3", "3/3"]
    assert {line.split(":")[0] for line in shown} == {"decoding=auto calibration"} and err.endswith(" \r")  # cleared
    auto.calibrate(Scripted([(2, [1, 1])] * 3), [[1], [2], [3]], flat)
    assert capsys.readouterr() == ("", "")


def test_expected_speedup_is_within_25_percent_of_what_the_policy_then_achieves(tiny):
    """The start-up line's estimate (calibrate) against a 'bench' on other prompts with a fresh policy, as the run
    decodes: the step time is the synthetic curve's (so speedup = tokens x latency(1) / sum latency(fed))."""
    limits = DecodingConfig(method="auto", ngram_size=4, guess_set_size=3)
    decoding = auto.auto_decoding(GPU, limits)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 96, (12,), generator=gen).tolist() for _ in range(10)]
    calib = auto.calibrate(Decoder(tiny, decoding, step_policy=CostPolicy(GPU)), prompts[:5], GPU,
                           max_new_tokens=96)
    bench = Decoder(tiny, decoding, step_policy=CostPolicy(GPU))
    outs = [bench.generate(p, max_new_tokens=96) for p in prompts[5:]]
    achieved = auto.expected_speedup(GPU, sum(len(o.output_ids) for o in outs), [q for o in outs for q in o.step_tokens])
    assert achieved > 1.2, achieved  # lookahead pays on this curve and model: the check has something to miss
    assert abs(calib["expected_speedup"] / achieved - 1) <= 0.25, (calib, achieved)
    assert calib["low"] <= calib["expected_speedup"] <= calib["high"]


def test_resolve_auto_prints_one_line_and_reuses_the_calibration(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from transformers import AutoTokenizer

    from lp_runtime.data import Question

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    model, _ = models.load_model(ModelConfig(name="tiny", path=str(tiny_model_dir), device="cpu"))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    flat = {1: 0.01, 64: 0.01}
    latency.latency_profile(models.model_id_of(model), latency.device_key(model), "float32", measure=lambda: flat)
    fallback = [Question(1, "writing", ["Write a haiku about the sea."]), Question(2, "code", ["def f(x):"])]
    limits = DecodingConfig(method="auto", ngram_size=4, guess_set_size=2, successors="false")  # one setting: below
    made = []

    def make_decoder(d, policy):
        made.append((d, policy))
        return Decoder(model, d, tokenizer=tok, step_policy=policy)

    d1, e1 = auto.resolve_auto(model, tok, limits, model_name="tiny", make_decoder=make_decoder,
                               fallback_questions=fallback, max_new_tokens=4)
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("decoding=auto: tiny, cost policy, (W, N, G) <= (15, 4, 2)")
    assert re.search(r"decoding=auto calibration of W=\d+ N=\d+ G=\d+:", err)  # its bar, named with the setting
    c = e1["calibration"]
    assert (f"expected speedup over greedy {c['expected_speedup']:.2f}x (per prompt {c['low']:.2f}-{c['high']:.2f}x;"
            in lines[0]) and f"over {c['prompts']} calibration prompts of up to 4 tokens)" in lines[0]
    assert d1 == DecodingConfig(method="auto", window_size=15, ngram_size=4, guess_set_size=2, successors="false")
    assert made[0][0] == d1 and isinstance(made[0][1], CostPolicy) and made[0][1].curve(64) == 0.01
    # MT-Bench and HumanEval prompts (the fallback where those packages are missing), the first only warming up
    n = len(auto.calibration_prompts(tok, fallback))
    assert e1["reused_profile"] is True and c["prompts"] == n - 1 and c["tokens"] == 4 * (n - 1)
    assert json.loads(Path(e1["profile"]).read_text())["calibration"]["W15 N4 G2 T4"] == c
    d2, e2 = auto.resolve_auto(model, tok, limits, make_decoder=lambda *a: pytest.fail("calibrated again"),
                               fallback_questions=fallback, max_new_tokens=4)
    assert d2 == d1 and e2["calibration"] == c
    out, err = capsys.readouterr()
    assert out.startswith(f"decoding=auto: {models.model_id_of(model)}, cost policy") and err == ""
    # another setting is calibrated, with progress off (the job's `progress=false`): no bar
    auto.resolve_auto(model, tok, replace(limits, guess_set_size=3), make_decoder=make_decoder,
                      fallback_questions=fallback, max_new_tokens=4, progress=False)
    assert len(made) == 2 and capsys.readouterr().err == ""
    # the successor table in the calibrating process is another setting: calibrated again, under its own key
    auto.resolve_auto(model, tok, replace(limits, successors="true"), make_decoder=make_decoder,
                      fallback_questions=fallback, max_new_tokens=4, progress=False)
    assert len(made) == 3 and made[2][0].successors == "true"
    assert "W15 N4 G2 T4 succ1b" in json.loads(Path(e1["profile"]).read_text())["calibration"]


class StepsDecoder:
    """A decoder that makes 4 tokens in steps of the given sizes, whatever the prompt (for ``auto.calibrate``)."""

    def __init__(self, step_tokens):
        self.step_tokens = list(step_tokens)

    def generate(self, prompt, max_new_tokens):
        from types import SimpleNamespace

        return SimpleNamespace(output_ids=[7] * 4, step_tokens=self.step_tokens)


@pytest.mark.parametrize("plain, table, calibrated, chosen", [
    ([6, 6, 6, 6], [8, 8], ["auto", "true"], "true"),           # 6 tokens a step: the table is tried, 2x: kept
    ([6, 6, 6, 6], [8, 8, 8, 8], ["auto", "true"], "auto"),     # tried, no faster (below TABLE_MARGIN): not kept
    ([6, 6, 6, 6], [5, 5, 5], ["auto", "true"], "true"),        # 4/3 x: kept
    ([2, 2, 2, 2], [8, 8], ["auto"], "auto"),                   # 2 tokens a step (a steep curve): not tried
])
def test_auto_tries_the_successor_table_in_one_process_and_keeps_it_when_faster(
        tiny_model_dir, tmp_path, monkeypatch, capsys, plain, table, calibrated, chosen):
    from transformers import AutoTokenizer

    from lp_runtime.data import Question

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    model, _ = models.load_model(ModelConfig(name="tiny", path=str(tiny_model_dir), device="cpu"))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    latency.latency_profile(models.model_id_of(model), latency.device_key(model), "float32",
                            measure=lambda: {1: 0.01, 64: 0.01})
    made = []

    def make_decoder(d, policy):
        made.append(d.successors)
        return StepsDecoder(table if d.successors == "true" else plain)

    fallback = [Question(1, "writing", ["Write a haiku."]), Question(2, "code", ["def f(x):"]),
                Question(3, "math", ["1 + 1?"])]
    limits = DecodingConfig(method="auto", ngram_size=4, guess_set_size=2)
    d, entry = auto.resolve_auto(model, tok, limits, make_decoder=make_decoder, fallback_questions=fallback,
                                 max_new_tokens=4, progress=False)
    assert made == calibrated and d.successors == chosen
    tried = entry["successor_table_tried"]  # kept for a bench to set its measured ratio against
    assert tried is None if len(calibrated) == 1 else (
        tried["expected_ratio"] == pytest.approx(len(plain) / len(table)) and tried["margin"] == auto.TABLE_MARGIN
        and tried["without"]["mean_step_tokens"] == sum(plain) / len(plain))
    assert entry["chosen"]["successors"] == chosen and entry["calibration"]["mean_step_tokens"] == (
        sum(table) / len(table) if chosen == "true" else 6.0 if plain[0] == 6 else 2.0)
    assert (" + successor table, (W, N, G)" in capsys.readouterr().out) == (chosen == "true")
    # under LP the table is on anyway (successors "auto"): one calibration, in one process without it
    made.clear()
    d, _ = auto.resolve_auto(model, tok, limits, make_decoder=make_decoder, fallback_questions=fallback,
                             max_new_tokens=4, progress=False, lp_size=2)
    assert made == [] and d.successors == "auto" and d.successors_on(2)  # the first call's calibration is reused
    assert " + successor table, (W, N, G)" in capsys.readouterr().out  # on under LP: the line says so


@pytest.mark.parametrize("speedup, advice", [(0.9659862992215469, True), (0.994, True), (0.996, False), (1.34, False)])
def test_start_line_advises_when_auto_is_expected_to_be_slower(speedup, advice):
    """The start-up line of a run whose profile was measured on a busy machine (the fresh-clone demo of
    2026-12-02: 0.97x) says what to do; one that shows 1.00x or more does not."""
    profile = {"latency_s": {"1": 1.0356, "8": 10.0716}, "device": "cpu-2t", "path": "/c/p.json", "reused": False,
               "measure_seconds": 259.3}
    calib = {"expected_speedup": speedup, "low": speedup, "high": speedup, "tokens": 136, "steps": 115,
             "mean_step_tokens": 1.77, "prompts": 2, "max_new_tokens": 128}
    line = auto._start_line("smollm2-174b85b4", DecodingConfig(method="auto"), "float32", profile, calib)
    assert line == (f"decoding=auto: smollm2-174b85b4, cost policy, (W, N, G) <= (0, 6, 4), float32 on cpu-2t, step "
                    f"latency 1035.6 ms (q=1) / 10071.6 ms (q=8); expected speedup over greedy {speedup:.2f}x (per "
                    f"prompt {speedup:.2f}-{speedup:.2f}x; S 1.18 at 1.8 tokens/step over 2 calibration prompts of up "
                    "to 128 tokens); profile /c/p.json (measured now in 259 s)" + (
                        "; below 1x, lookahead is not expected to pay here: decoding=greedy is as fast, or, if the "
                        "machine was busy while its profile was measured, LP_RUNTIME_RETUNE=1 measures it again"
                        if advice else ""))


def test_the_run_prints_the_latency_curve_short_and_keeps_it_whole_in_the_summary_file(tmp_path, capsys):
    """The printed run summary showed every point of the curve (cosmetic, issue 20): it shows the q range and
    the end points; the summary file, which a later run's policy can read, keeps every point."""
    from lp_runtime import generate
    from lp_runtime.config import OutputConfig, RunConfig

    curve = {str(q): 0.001 * q for q in latency.LATENCY_QS}
    entry = {"expected_speedup": 1.2, "profile": "/c/p.json", "latency_s": curve}
    cfg = RunConfig(output=OutputConfig(path=str(tmp_path / "answers.jsonl")), progress=False)
    generate._report(cfg, {"num_questions": 0, "auto_decoding": entry}, [], [], True, answered_now=True)
    out = capsys.readouterr().out
    assert json.loads(out[: out.rindex("}") + 1]) == {"num_questions": 0, "auto_decoding": {
        "expected_speedup": 1.2, "profile": "/c/p.json",
        "latency": "12 step sizes, q=1: 1.0 ms .. q=64: 64.0 ms (the whole curve: the summary file)"}}
    assert out.endswith(f"summary: {cfg.output.resolved_summary_path}\n")
    assert json.loads(Path(cfg.output.resolved_summary_path).read_text())["auto_decoding"] == entry


@pytest.mark.parametrize("successors, lp, said", [
    ("auto", 2, " 1.20x for one process without the table, LP itself not estimated"),
    ("true", 2, " 1.20x for one process with the table, LP itself not estimated"),
    ("auto", 1, " 1.20x"), ("true", 1, " 1.20x")])
def test_start_line_under_lp_says_the_expected_speedup_is_one_processs(successors, lp, said):
    """Under LP the line said '+ successor table' beside a speedup calibrated without it (successors=auto: 1.33x)
    and another with it (true: 1.31x), for runs that decode the same (a new user, 2026-12-07)."""
    profile = {"latency_s": {"1": 0.05, "8": 0.06}, "device": "cpu-2t", "path": "/c/p.json", "reused": True}
    calib = {"expected_speedup": 1.2, "low": 1.1, "high": 1.3, "tokens": 120, "steps": 100,
             "mean_step_tokens": 3.0, "prompts": 2, "max_new_tokens": 128}
    line = auto._start_line("m", DecodingConfig(method="auto", successors=successors), "float32", profile, calib, lp)
    assert f"; expected speedup over greedy{said} (per prompt 1.10-1.30x;" in line
    assert (", cost policy + successor table, " in line) == (successors == "true" or lp > 1)


def test_start_line_names_a_provisional_profile():
    """A profile the measuring budget cut short (latency.model_profile) is measured again at the next start:
    the line says so, with the rounds it holds."""
    profile = {"latency_s": {"1": 0.05, "8": 0.06}, "device": "cpu-2t", "path": "/c/p.json", "reused": False,
               "measure_seconds": 101.0, "provisional": True, "rounds_s": [{"1": 0.05, "8": 0.06}]}
    calib = {"expected_speedup": 1.2, "low": 1.1, "high": 1.3, "tokens": 120, "steps": 100,
             "mean_step_tokens": 3.0, "prompts": 2, "max_new_tokens": 128}
    line = auto._start_line("m", DecodingConfig(method="auto"), "float32", profile, calib)
    assert line.endswith("profile /c/p.json (measured now in 101 s; provisional, 1 of 3 rounds: more at the next "
                         "start)")
    assert auto._start_line("m", DecodingConfig(method="auto"), "float32", {**profile, "provisional": False},
                            calib).endswith("profile /c/p.json (measured now in 101 s)")
    # a second round cut short is not a round: the count is what the next start measures on from (a new user saw
    # "2 of 3 rounds" here, then "holds 1 of 3 rounds" at the next start)
    cut = {**profile, "rounds_s": [{"1": 0.05, "8": 0.06}, {"1": 0.05}]}
    assert "; provisional, 1 of 3 rounds: more at the next start)" in auto._start_line(
        "m", DecodingConfig(method="auto"), "float32", cut, calib)
