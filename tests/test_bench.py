"""The benchmark harness (fake clock) and a CLI smoke (the tuner: tests/test_latency.py, tests/test_auto.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lp_runtime.report import format_table
from scripts.bench import (TABLE_COLUMNS, Method, Prompt, Result, aggregate, check_partings, is_rounding_tie,
                              run_benchmark)
from fakes import llama, lookahead

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
    assert "fast" in format_table(list(table.values()), columns=TABLE_COLUMNS)


def test_warm_up_answer_is_forgotten_before_the_timed_runs(tiny_model_dir):
    """Our method's cross-question store must not hold the warm-up's answer when the same prompt is timed."""
    from scripts.bench import ours_method
    from lp_runtime.config import ModelConfig
    from lp_runtime.models import load_model

    model, _ = load_model(ModelConfig(path=str(tiny_model_dir), device="cpu", dtype="float32"))
    ours = ours_method("ours", model, lookahead(window_size=0, ngram_size=3, guess_set_size=2),
                       max_new_tokens=12, eos_token_ids=[])
    clock = FakeClock()
    rows = run_benchmark([Prompt("a/1/0", "a", "a/x", [5, 6, 7, 5, 6])], [ours], clock=clock, warmup=True)
    fresh = ours_method("fresh", model, lookahead(window_size=0, ngram_size=3, guess_set_size=2),
                        max_new_tokens=12, eos_token_ids=[]).run([5, 6, 7, 5, 6])
    assert rows[0]["steps"] == fresh.steps and rows[0]["output_ids"] == fresh.output_ids  # as if never warmed up
    again = ours.run([5, 6, 7, 5, 6])  # the store now holds the timed answer: the same prompt takes fewer steps
    assert again.output_ids == fresh.output_ids and again.steps < fresh.steps


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


def test_per_method_baseline_and_tokens_fed():
    """Two dtypes in one run: each method is compared with the baseline of its own dtype."""
    clock = FakeClock()
    prompts = [Prompt("a/1/0", "a", "a/x", [1])]

    def method(label, out, steps, seconds, fed=None, baseline=None):
        def run(ids):
            clock.t += seconds
            return Result(out, steps, [1] * steps, fed)
        return Method(label, run, 1, baseline=baseline)

    ms = [method("f32 base", [5, 6], 2, 2.0), method("f32 ours", [5, 6], 1, 1.0, [4], "f32 base"),
          method("bf16 base", [5, 7], 2, 1.0, None, "bf16 base"), method("bf16 ours", [5, 7], 2, 0.5, [1, 3], "bf16 base")]
    rows = run_benchmark(prompts, ms, baseline="f32 base", clock=clock, warmup=False)
    assert [r["identical"] for r in rows] == [True, True, True, True]   # bf16 compared with bf16's greedy
    assert [r["fed_tokens"] for r in rows] == [None, 4, None, 4]
    table = {r["method"]: r for r in aggregate(rows, ms, "f32 base") if r["group"] == "all"}
    assert table["f32 ours"]["speedup_mean_ratio"] == pytest.approx(2.0)
    assert table["bf16 ours"]["speedup_mean_ratio"] == pytest.approx(2.0)   # over bf16 greedy (4 vs 2 tok/s)
    assert table["bf16 base"]["speedup_mean_ratio"] == pytest.approx(1.0)
    assert table["f32 ours"]["fed_per_step"] == 4.0 and table["bf16 ours"]["fed_per_step"] == 2.0
    assert table["f32 base"]["fed_per_step"] is None and table["bf16 ours"]["partings"] == 0


def test_rounding_tie_rule():
    assert is_rounding_tie(5e-5, 10.0, "float32") and not is_rounding_tie(2e-4, 10.0, "float32")
    # bfloat16 has 8 significant bits: ulp(20.0) = 2**(4 - 7) = 0.125, so ties are gaps <= 1.0
    assert is_rounding_tie(1.0, 20.0, "bfloat16") and not is_rounding_tie(1.01, 20.0, "bfloat16")
    assert is_rounding_tie(0.0, -3.0, "bfloat16") and not is_rounding_tie(0.07, 1.5, "bfloat16")  # ulp 1/128
    assert is_rounding_tie(8 * 2.0 ** -10, 1.0, "float16") and not is_rounding_tie(0.01, 1.0, "float16")


def test_check_partings_measures_the_gap_in_the_methods_dtype():
    import torch
    from transformers import LlamaForCausalLM

    from exactness import hf_greedy, top2_gap

    model = llama(max_position_embeddings=2048)
    model16 = LlamaForCausalLM(model.config).eval().to(torch.bfloat16)
    model16.load_state_dict(model.state_dict())
    prompt = [3, 4, 5]
    ref = hf_greedy(model16, prompt, 8)
    ours = ref[:5] + [(ref[5] + 1) % 96] + ref[6:]
    ms = [Method("bf16 base", None, dtype="bfloat16"), Method("bf16 ours", None, dtype="bfloat16", baseline="bf16 base"),
          Method("f32 ours", None, dtype="float32")]
    rows = [{"key": "k", "method": "bf16 base", "output_ids": ref, "identical": True},
            {"key": "k", "method": "bf16 ours", "output_ids": ours, "identical": False},
            {"key": "k", "method": "f32 ours", "output_ids": ref[:6], "identical": False}]
    check_partings(rows, ms, {"bfloat16": model16, "float32": model}, {"k": prompt}, "bf16 base")
    assert "parting" not in rows[0]
    part = rows[1]["parting"]
    assert (part["index"], part["ours"], part["theirs"]) == (5, ours[5], ref[5])
    assert part["gap"] == pytest.approx(top2_gap(model16, prompt + ref[:5]))   # in bfloat16, on the reference prefix
    assert part["tie"] == is_rounding_tie(part["gap"], part["top"], "bfloat16")
    assert rows[2]["parting"]["index"] == 6 and rows[2]["parting"]["ours"] is None   # stopped early: parts at the end


def test_mt_bench_prompts_spread_over_categories(tiny_model_dir):
    from transformers import AutoTokenizer

    from scripts.bench import BenchConfig, load_prompts
    from lp_runtime.config import DatasetConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = BenchConfig(datasets=[DatasetConfig(name="mt_bench", first_turn_only=True),
                                DatasetConfig(name="humaneval", limit=20)], per_category={"mt_bench": 3})
    prompts, _ = load_prompts(cfg, tok)
    cats = [p.category for p in prompts]
    assert len(prompts) == 44 and cats.count("humaneval/coding") == 20
    mt = [c for c in cats if c.startswith("mt_bench/")]
    assert len(mt) == 24 and len(set(mt)) == 8 and all(mt.count(c) == 3 for c in set(mt))
    assert [p.key for p in prompts[:4]] == ["mt_bench/81/0", "mt_bench/82/0", "mt_bench/83/0", "mt_bench/91/0"]


def test_bench_config_errors():
    from scripts.bench import BenchConfig
    from lp_runtime.config import ConfigError

    with pytest.raises(ConfigError, match=r"per_category=\{'mt_bench': 0\} is not allowed"):
        BenchConfig(per_category={"mt_bench": 0})
    with pytest.raises(ConfigError, match="dtypes entry 'auto' is not allowed"):
        BenchConfig(dtypes=["auto"])
    with pytest.raises(ConfigError, match="ablation=true switches decoding=auto's levers off"):
        BenchConfig(ablation=True, decoding=lookahead())
    # a setting given twice ran twice and counted both rows (a new user, session 22)
    with pytest.raises(ConfigError) as e:
        BenchConfig(lookahead=[[0, 4, 2], [7, 5, 7], [0, 4, 2]])
    assert str(e.value) == "lookahead=[[0, 4, 2], [7, 5, 7], [0, 4, 2]] gives [0, 4, 2] twice; give each setting once"


def test_a_paper_run_is_labelled_apart_from_lookahead_at_the_same_w_n_g():
    """decoding=paper at (15, 5, 15) was labelled "lookahead W15 N5 G15", so beside lookahead=[[15,5,15]] it was
    dropped as a duplicate and alone it was mislabelled (a new user, session 22)."""
    from scripts.bench import decoding_label
    from lp_runtime.config import DecodingConfig

    assert decoding_label(DecodingConfig(method="paper")) == "paper W15 N5 G15"
    assert decoding_label(lookahead(window_size=15, ngram_size=5, guess_set_size=15)) == "lookahead W15 N5 G15"
    assert decoding_label(DecodingConfig(method="greedy")) == "greedy"


NOTHING = ("methods=[], lookahead=[] and include_decoding=false: nothing to benchmark; give at least one of methods "
           "(hf_greedy, hf_prompt_lookup, greedy), a lookahead [W, N, G] setting or include_decoding=true")


def test_nothing_to_benchmark_is_refused():
    from scripts.bench import BenchConfig
    from lp_runtime.config import ConfigError

    with pytest.raises(ConfigError) as e:
        BenchConfig(methods=[], lookahead=[], include_decoding=False)
    assert str(e.value) == NOTHING
    for ok in (dict(methods=["greedy"]), dict(lookahead=[[0, 3, 1]]), dict(include_decoding=True)):  # one is enough
        BenchConfig(**{**dict(methods=[], lookahead=[], include_decoding=False), **ok})


BAD_TRIPLE = ("lookahead=[[0, 3, 1], [0, 1, 1]]: (W, N, G) = (0, 1, 1): decoding.ngram_size=1 is too small; N must "
              "be >= 2")


def test_bad_lookahead_triple_is_named():
    """A lookahead entry DecodingConfig refuses is named by the bench setting and the triple, not decoding.*."""
    from scripts.bench import BenchConfig
    from lp_runtime.config import ConfigError

    with pytest.raises(ConfigError) as e:
        BenchConfig(lookahead=[[0, 3, 1], [0, 1, 1]])
    assert str(e.value) == BAD_TRIPLE


def test_output_dir_on_a_file_is_refused(tmp_path):
    from scripts.bench import BenchConfig
    from lp_runtime.config import ConfigError

    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError) as e:
        BenchConfig(output_dir=str(afile))
    assert str(e.value) == f"output_dir={afile} is a file; give a folder path"
    with pytest.raises(ConfigError) as e:
        BenchConfig(output_dir=str(afile / "sub" / "deeper"))
    assert str(e.value) == f"output_dir={afile / 'sub' / 'deeper'}: {afile} is a file; give a folder path"
    assert afile.read_text() == "x"
    BenchConfig(output_dir=str(tmp_path / "new" / "out"))  # a folder that does not exist yet: made by the run


@pytest.mark.parametrize("override,expected", [
    ("per_category={mt_bench: 1}", {"mt_bench": 1}),  # conf/bench.yaml's documented form (its default is null)
    ("+per_category={mt_bench: 1}", {"mt_bench": 1}),
    ("+per_category.humaneval=2", {"humaneval": 2}),
    ("per_category=null", {}),
])
def test_per_category_overrides(override, expected):
    from hydra import compose, initialize_config_dir

    from scripts.bench import register_schema
    from lp_runtime.cli import CONF_DIR
    from lp_runtime.config import to_object

    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        assert to_object(compose("bench", overrides=[override])).per_category == expected
        issue9 = to_object(compose("bench_issue9", overrides=[override])).per_category  # {mt_bench: 3} there
        assert issue9 == ({} if override.endswith("null") else {"mt_bench": 3, **expected})


def test_per_category_of_the_wrong_type_is_refused():
    from scripts.bench import BenchConfig
    from lp_runtime.config import ConfigError

    for bad, shown in ((3, "3"), ({"mt_bench": "x"}, "{'mt_bench': 'x'}"), ({"mt_bench": True}, "{'mt_bench': True}")):
        with pytest.raises(ConfigError) as e:
            BenchConfig(per_category=bad)
        assert str(e.value) == (f"per_category={shown} is not allowed; give null or {{dataset: k}}, "
                                "e.g. per_category='{mt_bench: 3}'")


def test_settings_that_would_select_nothing_are_refused():
    """per_category naming no prompt set, and levers without the ablation they select from, ran with no effect
    and exit 0 (a new user, 2026-12-02)."""
    from scripts.bench import BenchConfig
    from lp_runtime.config import ConfigError, DecodingConfig

    with pytest.raises(ConfigError) as e:
        BenchConfig(per_category={"nope": 1})
    assert str(e.value) == ("per_category names ['nope'], which is not among datasets (mt_bench, humaneval); give "
                            "{dataset name: k} for one of them")
    with pytest.raises(ConfigError) as e:
        BenchConfig(levers=["+successors"])
    assert str(e.value) == ("levers=['+successors'] selects rows of the ablation, which is off; add ablation=true "
                            "(with decoding=auto)")
    BenchConfig(per_category={"mt_bench": 1}, levers=["+successors"], ablation=True,
                decoding=DecodingConfig(method="auto"))


def test_run_two_dtypes_in_one_run(tiny_model_dir, tmp_path, monkeypatch):
    from scripts.bench import BenchConfig, run
    from lp_runtime.config import DatasetConfig, GenerationConfig, ModelConfig

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path / "cache"))
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Write a haiku."]}) + "\n")
    cfg = BenchConfig(model=ModelConfig(name="tiny", path=str(tiny_model_dir), device="cpu"),
                      generation=GenerationConfig(max_new_tokens=6),
                      datasets=[DatasetConfig(name="jsonl", path=str(questions))], dtypes=["float32", "bfloat16"],
                      methods=["hf_greedy", "greedy"], lookahead=[[0, 3, 1]], include_decoding=False,
                      figures=False, progress=False, output_dir=str(tmp_path / "out"))
    res = run(cfg)
    labels = ["float32 hf_greedy", "float32 greedy", "float32 lookahead W0 N3 G1",
              "bfloat16 hf_greedy", "bfloat16 greedy", "bfloat16 lookahead W0 N3 G1"]
    assert list(res["methods"]) == labels
    assert [res["methods"][m]["baseline"] for m in labels] == ["float32 hf_greedy"] * 3 + ["bfloat16 hf_greedy"] * 3
    alls = {r["method"]: r for r in res["table"] if r["group"] == "all"}
    for m in labels[:3]:
        assert alls[m]["identical"] == 1, m
    for m in labels[3:]:  # bfloat16: identical, or a parting that was checked
        assert alls[m]["identical"] + alls[m]["partings"] == 1, m
    assert (tmp_path / "out" / "table.txt").read_text().count("q/writing") == 6


def test_run_auto_with_its_ablation(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from scripts.bench import BenchConfig, run
    from lp_runtime.config import DatasetConfig, DecodingConfig, GenerationConfig, ModelConfig

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path / "cache"))
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "code", "turns": ["def f(x): return x + x"]}) + "\n")
    cfg = BenchConfig(model=ModelConfig(name="tiny", path=str(tiny_model_dir), device="cpu"),
                      decoding=DecodingConfig(method="auto", ngram_size=4, guess_set_size=2),
                      generation=GenerationConfig(max_new_tokens=6), ablation=True,
                      datasets=[DatasetConfig(name="jsonl", path=str(questions))], methods=["hf_greedy"],
                      lookahead=[], figures=False, progress=False, output_dir=str(tmp_path / "out"))
    import torch

    from lp_runtime import latency, models

    float32 = {1: 0.0385, 2: 0.0618, 3: 0.0758, 4: 0.0589, 8: 0.0592, 16: 0.0706, 32: 0.095, 64: 0.1428}
    latency.latency_profile(models.model_id(cfg.model), latency.cpu_key(torch.get_num_threads()), "float32",
                            measure=lambda: float32)  # as if measured on this curve
    res = run(cfg)
    auto = "auto W0 N4 G2"  # the window does not pay on this (float32, 2-core CPU) curve
    assert list(res["methods"]) == ["hf_greedy", auto, f"{auto} -copy_kv", f"{auto} -policy",
                                    f"{auto} -cross_question", f"{auto} -chain",
                                    f"{auto} W->3 always", f"{auto} +successors"]
    assert res["auto_decoding"]["float32"]["chosen"]["method"] == "auto"
    assert capsys.readouterr().out.count("decoding=auto: ") == 1
    cfg.levers = ["+successors"]  # only the levers asked for
    assert list(run(cfg)["methods"]) == ["hf_greedy", auto, f"{auto} +successors"]
    alls = {r["method"]: r for r in res["table"] if r["group"] == "all"}
    for label in res["methods"]:
        assert alls[label]["identical"] == 1, label
    # the window lever feeds W = 3's window every step (row 0's 2 tokens, then + 3 per level as it warms up to 8):
    # more than auto, which fed none
    assert alls[f"{auto} W->3 always"]["fed_per_step"] > alls[auto]["fed_per_step"] + 2


# ---------------------------------------------------------------------------------------- CLI

REFUSALS = ["nothing", "file", "under a file", "bad triple"]


def _refusal(case: str, folder: Path) -> tuple[list[str], str]:
    """(overrides, message) of a refused command line; its files under ``folder``."""
    afile = folder / "afile"
    return {
        "nothing": (["methods=[]", "lookahead=[]", "include_decoding=false"], NOTHING),
        "file": ([f"output_dir={afile}"], f"output_dir={afile} is a file; give a folder path"),
        "under a file": ([f"output_dir={afile / 'sub'}"], f"output_dir={afile / 'sub'}: {afile} is a file; "
                                                          "give a folder path"),
        "bad triple": (["lookahead=[[0,3,1],[0,1,1]]"], BAD_TRIPLE),
    }[case]


@pytest.fixture(scope="module")
def bench_cli(tiny_model_dir, tmp_path_factory):
    """scripts/bench.py's command lines, in ONE fresh interpreter (tests/cli_batch.py; a process apiece paid its
    start-up): the refusals of REFUSALS, each in its folder (a file ``afile`` there), then the smoke run on the tiny
    model, with an LP_RUNTIME_CACHE of its own. {case: (folder, result)}, the smoke's case "smoke"."""
    from cli_batch import Call, run_cli

    tmp = tmp_path_factory.mktemp("bench_cli")
    calls = {}
    for case in REFUSALS:
        folder = tmp / case.replace(" ", "_")
        folder.mkdir()
        (folder / "afile").write_text("x")
        calls[case] = (folder, Call([f"hydra.run.dir={folder / 'hydra'}", f"model.path={folder / 'no_model'}",
                                     *_refusal(case, folder)[0]], module="scripts.bench"))
    folder = tmp / "smoke"
    folder.mkdir()
    questions = folder / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in [
        {"question_id": 1, "category": "writing", "turns": ["Write a haiku about the sea."]},
        {"question_id": 2, "category": "math", "turns": ["What is 2 + 3?", "And 4 + 5?"]},
    ]))
    smoke = [f"hydra.run.dir={folder / 'hydra'}", "progress=false", f"model.path={tiny_model_dir}", "model.name=tiny",
             "generation.max_new_tokens=8", f"datasets=[{{name:jsonl,path:'{questions}',first_turn_only:true}}]",
             "lookahead=[[0,3,1],[2,3,2]]",
             "decoding.ngram_size=3", "decoding.guess_set_size=1",  # the decoding group's setting: one of the list
             f"output_dir={folder / 'bench'}"]
    calls["smoke"] = (folder, Call(smoke, module="scripts.bench", env={"LP_RUNTIME_CACHE": str(folder / "cache")}))
    results = run_cli([call for _, call in calls.values()], dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
    return {case: (folder, res) for (case, (folder, _)), res in zip(calls.items(), results)}


@pytest.mark.parametrize("case", REFUSALS)
def test_bench_cli_refuses_before_loading(case, bench_cli):
    """``error: <message>``, exit 2, no run folder left; model.path names no model, so a refusal that came after
    loading would read differently."""
    folder, res = bench_cli[case]
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.strip().splitlines() == [f"error: {_refusal(case, folder)[1]}"]
    assert not (folder / "hydra").exists() and (folder / "afile").read_text() == "x"


def test_bench_cli_smoke(bench_cli):
    folder, res = bench_cli["smoke"]
    out = folder / "bench"
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
    partial = [json.loads(line) for line in (out / "rows_partial.jsonl").read_text().splitlines()]
    assert [(r["key"], r["method"], r["output_ids"]) for r in partial] == \
        [(r["key"], r["method"], r["output_ids"]) for r in result["rows"]]  # every prompt's rows, kept as it ran


def test_device_checks_lp_host_part_grows_full_trees_and_times_the_host():
    """scripts/device_check.py part f (run on the GPU machine): with every token table filled, the product's tree
    reaches its budget at K = 1 and 8 even with random weights, and the host's and the step's ms are both counted."""
    from argparse import Namespace

    from fakes import llama
    from scripts.device_check import LP_BUDGET, lp_host

    rec = {}
    lp_host(llama(max_position_embeddings=1024, vocab_size=8192), "tiny", Namespace(quick=True), rec)
    one, eight = rec["lp_host"][1], rec["lp_host"][8]
    assert one["fed_per_step"] > 0.9 * LP_BUDGET and eight["fed_per_step"] > 0.9 * 8 * LP_BUDGET
    assert min(one["host_ms_per_step"], one["step_ms_per_step"], eight["host_ms_per_step"]) > 0
    assert one["steps"] >= 2 and 1 <= one["S"] <= 16


def test_device_checks_exactness_part_runs_the_products_full_tree_through_the_buckets():
    """scripts/device_check.py part a (run on the GPU machine) checks the product's successor-table tree too: with
    its tables filled, ~80 nodes a step go through the eager step and the captured bucket of 128, and every output
    equals transformers' greedy."""
    from argparse import Namespace

    from fakes import llama
    from scripts.device_check import LP_BUDGET, exactness

    model = llama(max_position_embeddings=1024, vocab_size=8192)
    rows = exactness(model, "tiny", Namespace(quick=True, backend="aot_eager"), (1, 16, 128))
    table = [r for r in rows if r["path"].endswith("+table")]
    assert [r["path"] for r in table] == ["eager+table", "captured+table"]
    assert all(r["identical"] == r["prompts"] == 2 and r["fed_per_step"] > 0.9 * LP_BUDGET for r in table), table


def test_lp_scaling_groups_a_question_without_a_category_as_chat():
    """scripts/lp_scaling.py on a Spec-Bench file whose questions have no category: AttributeError on None after
    its first K, and no lp_scaling.json (a new user, 2026-12-07)."""
    from scripts.lp_scaling import category_groups

    rows = [{"category": None}, {"category": "humaneval"}, {"category": "writing"}, {"category": "humaneval/x"}]
    assert category_groups(rows) == {"mt_bench": [rows[0], rows[2]], "humaneval": [rows[1], rows[3]]}
    assert category_groups(rows[:1]) == {"mt_bench": rows[:1]}


@pytest.mark.parametrize("levers, why", [
    ({"k": 10 ** 6}, "k=1000000 (need at most the vocabulary, 96)"), ({"k": 2.5}, "k=2.5 (need an int >= 1)"),
    ({"width": 0}, "width=0 (need an int >= 1)"), ({"width": -1}, "width=-1 (need an int >= 1)"),
    ({"max_depth": 0}, "max_depth=0 (need an int >= 1)"), ({"context": True}, "context=True (need one of 1, 2)"),
    ({"rank_budget": 1.5}, "rank_budget=1.5 (need None or an int >= 1)"),
    ({"rank_tables": "false"}, "rank_tables='false' (need True or False)")])
def test_lp_scaling_refuses_odd_table_levers(levers, why):
    """k=10**6 ended in a 183 GiB MemoryError; k=2.5, width 0 or -1, max_depth 0, context true, rank_budget 1.5 and
    "false" for a flag were taken silently (new users, 2026-12-07)."""
    import argparse

    from scripts.lp_scaling import check_levers

    args = argparse.Namespace(ks=[1], window=0, ngram=5, guess=15, budget=80, context=None, topk=None, width=None,
                              max_depth=None, rank_cap=None, levers=levers)
    assert check_levers(96, args) == f"K = 1: ValueError: SuccessorProposer: {why}"


@pytest.mark.parametrize("levers, ks, why", [
    ({}, [1, 8], ""),
    ({"store_min_key": 0}, [1], "K = 1: ValueError: successor_proposers: store_min_key=0 (need an int >= 1)"),
    ({"nosuchkey": 1}, [1], "K = 1: TypeError: SuccessorProposer.__init__() got an unexpected keyword argument "
                            "'nosuchkey'"),
    ({"lp_size": 3}, [2], "K = 2: TypeError: lp_runtime.successors.successor_proposers() got multiple values for "
                          "keyword argument 'lp_size'"),
    ({"context": 3}, [1, 2], "K = 1: ValueError: SuccessorProposer: context=3 (need one of 1, 2)"),
])
def test_lp_scaling_refuses_a_bad_lever_before_any_work(levers, ks, why):
    """A bad --set lever gave a traceback after the references were computed and --out was made (a new user,
    2026-12-07); check_levers names it, for main's one error line."""
    import argparse

    from scripts.lp_scaling import check_levers

    args = argparse.Namespace(ks=ks, window=0, ngram=5, guess=15, budget=80, context=None, topk=None, width=None,
                              max_depth=None, rank_cap=None, levers=levers)
    assert check_levers(96, args) == why


def test_lp_scaling_checks_its_output_folder_before_any_reference(tmp_path):
    """A folder where a result file goes, or a place that cannot be written, gave a traceback after the references
    were computed (a new user, 2026-12-07)."""
    import argparse

    from scripts.lp_scaling import check_out, out_files

    args = argparse.Namespace(ks=[1, 8], trees=True, stops=False)
    assert out_files(args) == ["refs.json", "lp_scaling.json", "partial_k1.json", "trees_k1.jsonl", "partial_k8.json",
                               "trees_k8.jsonl"]
    assert check_out(tmp_path / "new" / "run", args) == "" and (tmp_path / "new" / "run").is_dir()
    (tmp_path / "new" / "run" / "trees_k8.jsonl").mkdir()
    assert check_out(tmp_path / "new" / "run", args) == (
        f"{tmp_path / 'new' / 'run' / 'trees_k8.jsonl'} is a folder where the run writes a file; move it away")
    assert check_out(tmp_path / ("x" * 300), args) == "cannot write there (File name too long)"
    (tmp_path / "afile").write_text("")
    assert check_out(tmp_path / "afile" / "sub", args) == f"{tmp_path / 'afile'} is a file; give a folder"


@pytest.mark.parametrize("text, flags, why", [
    ('{"context": 1}', {}, ""),
    ('{"context": 1}', {"context": 2}, "--set '{\"context\": 1}' and a flag set the same lever ('context' and "
                                       "--context); give it once"),
    ('{"k": 8, "rank_budget": null}', {"topk": 8, "rank_cap": 0}, "--set '{\"k\": 8, \"rank_budget\": null}' "
     "and a flag set the same lever ('k' and --topk; 'rank_budget' and --rank-cap); give it once"),
    ('{"context": 1, "context": 2}', {}, "--set '{\"context\": 1, \"context\": 2}' gives 'context' more than once; "
                                         "give each once"),
    ('{"topk": 8}', {}, "--set '{\"topk\": 8}': 'topk' is no lever; the levers: context, k, max_depth, prefill, "
                        "rank_budget, rank_tables, store_min_key, table_when_sampling, width"),
    ("[1]", {}, "--set '[1]' is not a JSON object of SuccessorProposer arguments"),
    ("nope", {}, "--set 'nope' is not a JSON object"),
])
def test_lp_scaling_set_names_each_lever_once(text, flags, why):
    """--set '{"context": 1}' --context 2 ran with 1 and said nothing; a key given twice took the last; "topk" (the
    flag's name) gave a TypeError listing nothing (new users, 2026-12-07)."""
    import argparse

    from scripts.lp_scaling import parse_levers

    args = argparse.Namespace(**{"context": None, "topk": None, "width": None, "max_depth": None, "rank_cap": None,
                                 **flags})
    if not why:
        assert parse_levers(text, args) == json.loads(text)
        return
    with pytest.raises(ValueError) as e:
        parse_levers(text, args)
    assert str(e.value) == why


def test_lp_scaling_checks_its_references_and_fails_when_greedy_is_not_reproduced(tmp_path):
    """A refs.json whose entry was damaged ("x" for a reference) ran, printed "identical False" everywhere and
    exited 0, and a run whose outputs differ from greedy exited 0 too (a new user, 2026-12-07)."""
    import hashlib

    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"question_id": 1, "category": "writing", "turns": ["Hi"]}\n')
    key = f"q.jsonl:{hashlib.sha256(prompts.read_bytes()).hexdigest()[:16]}:2"
    out = tmp_path / "out"
    out.mkdir()

    def run_with(refs):
        (out / "refs.json").write_text(json.dumps({key: refs}))
        return subprocess.run([sys.executable, "scripts/lp_scaling.py", "--prompts", str(prompts), "--ks", "1",
                               "--max-new-tokens", "2", "--out", str(out)], capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})

    bad = run_with(["x"])
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1] == (
        f"lp_scaling.py: error: {out / 'refs.json'} is not a JSON object of references (its entry {key!r} is not a "
        "list of token id lists); delete it and they are computed again")
    wrong = run_with([[0, 0]])  # well formed, but not what greedy gives
    assert wrong.returncode == 1 and (out / "lp_scaling.json").is_file()
    assert wrong.stderr.splitlines()[-1] == (f"error: 1 output(s) differ from transformers' greedy (K = 1: 1); "
                                             f"{out / 'lp_scaling.json'} holds the rows")


def test_lp_scaling_refuses_a_repeated_k(tmp_path):
    """--ks 2 2 ran K = 2 twice and wrote it twice into lp_scaling.json (a new user, 2026-12-07)."""
    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"question_id": 1, "category": "writing", "turns": ["Hi"]}\n')
    run = subprocess.run([sys.executable, "scripts/lp_scaling.py", "--prompts", str(prompts), "--ks", "2", "1", "2",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 2 and not (tmp_path / "out").exists()
    assert run.stderr.splitlines()[-1] == ("lp_scaling.py: error: --ks 2 1 2 gives K = 2 more than once; give each K "
                                           "once")


def test_a_new_bench_run_keeps_the_stopped_runs_rows(tmp_path, capsys):
    """A re-run into the same output_dir deleted the stopped run's rows_partial.jsonl before measuring anything (a
    new user, 2026-12-07); it is moved aside to the next free rows_partial-N.jsonl."""
    from scripts.bench import keep_earlier_rows

    partial = tmp_path / "rows_partial.jsonl"
    assert keep_earlier_rows(str(partial)) is None  # nothing there
    partial.write_text("")
    assert keep_earlier_rows(str(partial)) is None and partial.exists()  # an empty file: the new run appends to it
    for n in (2, 3):
        partial.write_text(f'{{"run": {n}}}\n')
        kept = tmp_path / f"rows_partial-{n}.jsonl"
        assert keep_earlier_rows(str(partial)) == str(kept) and not partial.exists()
        assert kept.read_text() == f'{{"run": {n}}}\n'
    assert capsys.readouterr().out.splitlines()[-1] == (f"an earlier stopped run's rows (rows_partial.jsonl) are kept "
                                                        f"as {tmp_path / 'rows_partial-3.jsonl'}")
