"""Sweeps: one output per job, resume that checks settings, the report over runs, the submitit launcher, model identity."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lp_runtime import answers, jobs, models
from lp_runtime.config import (ConfigError, DatasetConfig, GenerationConfig, ModelConfig, OutputConfig,
                               RunConfig)
from fakes import lookahead

REPO = Path(__file__).resolve().parents[1]


def _questions(path: Path, n: int = 1) -> Path:
    rows = [{"question_id": 81 + i, "category": "writing", "turns": [f"Write a haiku about the sea, {i}."]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sweep_args(tiny_model_dir: Path, tmp: Path, sweep: str = "sweep") -> list[str]:
    return [f"model.path={tiny_model_dir}", "model.dtype=float32", "dataset=jsonl",
            f"dataset.path={_questions(tmp / 'q.jsonl')}",
            "generation.max_new_tokens=16", "progress=false", f"hydra.sweep.dir={tmp / sweep}"]


# ------------------------------------------------------------------------------------ sweep + report

# A --multirun sweep with Hydra's own launcher and the report over it: tests/test_cli.py (its batch of command lines).


def test_report_baseline_by_flag_and_errors(tmp_path):
    from lp_runtime.report import ReportError, pick_baseline

    mt, q = {"dataset.name": "mt_bench"}, {"dataset.name": "jsonl", "dataset.path": "q.jsonl"}
    runs = [{"path": Path("a.jsonl"), "records": [{"question_id": 1}],
             "settings": {"decoding.method": "lookahead", "sampling.temperature": 0.0, **mt}},
            {"path": Path("b/answers.jsonl"), "records": [{"question_id": 1}],
             "settings": {"decoding.method": "greedy", "sampling.temperature": 0.7, **mt}},
            {"path": Path("c/answers.jsonl"), "records": [{"question_id": 1}],
             "settings": {"decoding.method": "greedy", "sampling.temperature": 0.0, **mt}}]
    assert pick_baseline(runs, None) == 2  # the first greedy run with greedy tokens
    # a greedy run of other prompts first (a question file whose ids coincide): the one on the others' prompts wins
    runs.insert(0, {"path": Path("0/answers.jsonl"), "records": [{"question_id": 1}],
                    "settings": {"decoding.method": "greedy", "sampling.temperature": 0.0, **q}})
    assert pick_baseline(runs, None) == 3
    runs.pop(0)
    assert pick_baseline(runs, "1") == 1 and pick_baseline(runs, "a.jsonl") == 0 and pick_baseline(runs, "b/") == 1
    # paths as a shell gives them (a new user, 2026-12-04: './b/answers.jsonl' and absolute paths were refused, a
    # mere suffix such as 'y' or '1/answers.jsonl' for '11/answers.jsonl' picked a run)
    assert pick_baseline(runs, "./b/answers.jsonl") == 1 and pick_baseline(runs, str(Path("c").resolve())) == 2
    for wrong in ("zz", "y", "answers.jsonl"):
        with pytest.raises(ReportError, match=rf"^--baseline '{wrong}' is neither a run as the table names it "
                                              r"\(a.jsonl, b, c\), a row number \(0\.\.2\) nor the path of one of the "
                                              r"runs: \S+, \S+, \S+$"):
            pick_baseline(runs, wrong)
    # the run as the table names it: a sweep whose job 0 has no answers shows rows "1" and "greedy"; --baseline 1 took
    # row 1, the greedy run (a new user, 2026-12-07), and --baseline greedy was refused
    sweep = [{**runs[0], "path": Path("s/1/answers.jsonl")}, {**runs[2], "path": Path("s/greedy/answers.jsonl")}]
    assert pick_baseline(sweep, "1") == 0 and pick_baseline(sweep, "greedy") == 1 and pick_baseline(sweep, "0") == 0
    two = [{**runs[0], "path": Path("d/x.jsonl")}, {**runs[0], "path": Path("d/y.jsonl")}]
    with pytest.raises(ReportError, match=r"^--baseline 'd' is the folder of 2 runs; give one of their files: "
                                          r"d/x.jsonl, d/y.jsonl$"):
        pick_baseline(two, "d")
    with pytest.raises(ReportError, match="holds no answers file"):
        from lp_runtime.report import find_runs
        find_runs([str(tmp_path)])


def test_report_given_a_record_beside_answers_reports_that_run(tmp_path):
    """A new user (2026-12-03) gave the report a run's settings record: "line 1 is not JSON" (it is JSON, pretty
    printed); a summary record was already read as its run. Either record names its answers file."""
    from lp_runtime.report import find_runs

    d = tmp_path / "run.v2"
    d.mkdir()
    for name in ("answers.jsonl", "answers.settings.json", "answers.summary.json"):
        (d / name).write_text("{}\n")
    assert find_runs([str(d / "answers.settings.json"), str(d / "answers.summary.json")]) == [d / "answers.jsonl"]
    # output.path=a.txt (which a run takes) writes a.txt.settings.json: its folder "held no answers file" (a new
    # user, 2026-12-04); a record whose answers file is gone names no run
    e = tmp_path / "od"
    e.mkdir()
    for name in ("a.txt", "a.txt.settings.json", "gone.summary.json"):
        (e / name).write_text("{}\n")
    assert find_runs([str(e)]) == find_runs([str(e / "a.txt.settings.json")]) == [e / "a.txt"]


def test_report_speedup_counts_only_the_questions_shared_with_the_baseline():
    """A baseline on other prompts gave a speedup of 0.311 and "identical 0/0" without a word (a new user,
    2026-12-02): speedups are taken over the questions both runs answered from the same dataset, '-' when none."""
    from lp_runtime import metrics
    from lp_runtime.report import baseline_note, build_table, shared_note, table_columns

    def run(path, method, dataset, answers, tokens=16):  # answers: {question id: (new tokens, seconds)}
        records = [{"question_id": q, "choices": [{"output_ids": [[7] * n], "new_tokens": [n], "decoding_steps": [n],
                                                    "wall_time": [t], "accept_lengths": [[1] * n]}]}
                   for q, (n, t) in answers.items()]
        return {"path": Path(path), "records": records, "metrics": metrics.summarize(records),
                "settings": {"decoding.method": method, "sampling.temperature": 0.0, "dataset.name": dataset,
                             "generation.max_new_tokens": tokens}}

    base = run("g/answers.jsonl", "greedy", "mt_bench", {81: (10, 1.0), 82: (10, 10.0)})
    fast = run("l/answers.jsonl", "lookahead", "mt_bench", {81: (10, 0.5)})  # answered only 81, twice as fast there
    other = run("o/answers.jsonl", "lookahead", "humaneval", {81: (10, 0.1)})  # an id that names another prompt
    # 32 new tokens against the 16 of the baseline: not the same request ("identical 0/2" before, a new user)
    longer = run("m/answers.jsonl", "lookahead", "mt_bench", {81: (20, 0.5)}, tokens=32)
    rows, keys = build_table([base, fast, other, longer], 0)
    identical_cell = dict(table_columns(keys))["identical"]
    assert [identical_cell(r) for r in rows] == ["2/2", "1/1", "-", "-"]  # none compared: '-', not "0/0"
    assert [(r["speedup"], r["shared"], r["identical"], r["compared"]) for r in rows] == [
        (1.0, 2, 2, 2), (2.0, 1, 1, 1), (None, 0, 0, 0), (None, 0, 0, 0)]  # over all of base: 20 tok / 11 s"
    # the line under the table: which runs share fewer than all, which none (it said "fewer than all" for both);
    # fast shares 1 of the baseline's 2 (it was not named: its tok/s counted question 81 and its speedup too, but
    # the baseline's tok/s both; a new user's report showed 2.3x the baseline's tok/s beside a speedup of 0.49)
    names = [r["run"] for r in rows]
    assert shared_note(rows) == (
        f"speedup and identical count only the questions a run shares with the baseline {names[0]} (the same "
        f"dataset, question id, dataset.first_turn_only and generation.max_new_tokens): fewer than all for "
        f"{names[1]} (tok/s and ms/step count all of a run's questions); none for {names[2]}, {names[3]} ('-')")
    rows[0]["questions"] = 1  # as if the baseline had answered 81 only: fast shares all
    assert shared_note(rows).endswith(f": none for {names[2]}, {names[3]} ('-')")
    assert shared_note(build_table([base, base], 0)[0]) == ""
    # no greedy run: the first run is the baseline, its speedup 1.000 over itself (a sampled or lookahead run's
    # report said nothing of it); a greedy baseline or one chosen with --baseline needs no line
    assert baseline_note(fast, "l", None) == (
        "no plain greedy run (decoding=greedy, greedy sampling) among these: speedup is over l, the first run; give "
        "a decoding=greedy run of the same questions for speedup over greedy, or choose with --baseline")
    assert baseline_note(base, "g", None) == baseline_note(fast, "l", "l") == ""
    assert baseline_note({**base, "settings": {**base["settings"], "sampling.temperature": 0.7}}, "g", None) != ""


def test_report_does_not_list_a_run_folder_whose_answers_went_elsewhere(tmp_path):
    """A single run keeps its Hydra record in outputs/hydra/<time>/ and writes its answers to output.path: the
    report over a folder holding both listed that record under "jobs without answers (refused, failed or not run
    yet)" (a new user, 2026-12-02); a job folder whose recorded output.path holds answers is not listed."""
    from lp_runtime.report import jobs_without_answers

    job = tmp_path / "outputs" / "hydra" / "2026-12-02_14-58-27"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- output.path=out/a.jsonl\n")
    (job / ".hydra" / "config.yaml").write_text("output:\n  path: out/a.jsonl\n")
    (job / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  runtime:\n    cwd: {tmp_path}\n")
    listed = ["outputs/hydra/2026-12-02_14-58-27 (output.path=out/a.jsonl)"]
    assert jobs_without_answers([str(tmp_path)]) == listed  # no answers there yet: refused, failed or not run
    (tmp_path / "out").mkdir()
    line = {"question_id": 1, "choices": [{"output_ids": [[1]], "new_tokens": [1], "decoding_steps": [1],
                                           "wall_time": [0.1], "accept_lengths": [[1]]}]}
    (tmp_path / "out" / "a.jsonl").write_text(json.dumps(line) + "\n")
    assert jobs_without_answers([str(tmp_path)]) == []


def test_report_lists_the_jobs_a_stopped_sweep_never_started_and_drops_an_old_figure(tmp_path):
    """A sweep of 3 jobs stopped during job 1: the report named job 1 (its folder, no answers) but not job 2, whose
    folder Hydra never made, though README says it lists the jobs "not run yet"; and ``--no-figure`` kept an
    earlier report's report.png beside the new table (a new user, 2026-12-04)."""
    from lp_runtime.report import jobs_without_answers, report

    sweep = tmp_path / "sweep"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- decoding.window_size=0\n- dataset.limit=1\n")
    line = {"question_id": 1, "choices": [{"output_ids": [[1]], "new_tokens": [1], "decoding_steps": [1],
                                           "wall_time": [0.1], "accept_lengths": [[1]]}]}
    (sweep / "0" / "answers.jsonl").write_text(json.dumps(line) + "\n")
    (sweep / "0" / "answers.settings.json").write_text('{"decoding.method": "greedy"}\n')
    (sweep / "1" / ".hydra").mkdir(parents=True)
    (sweep / "1" / ".hydra" / "overrides.yaml").write_text("- decoding.window_size=3\n- dataset.limit=1\n")
    (sweep / "multirun.yaml").write_text("hydra:\n  sweep:\n    dir: sweep\n    subdir: ${hydra.job.num}\n"
                                         "  overrides:\n    task:\n    - decoding.window_size=0,3,5\n"
                                         "    - dataset.limit=1\n")
    assert jobs_without_answers([str(sweep)]) == ["1 (decoding.window_size=3 dataset.limit=1)",
                                                  "2 (decoding.window_size=5 dataset.limit=1, not started)"]
    (sweep / "report.png").write_bytes(b"an earlier report's figure")
    out = report([str(sweep)], figure=False)
    assert "png" not in out["files"] and not (sweep / "report.png").exists()


# ------------------------------------------------------------------------------ resume checks settings

def _cfg(model_dir: Path, tmp: Path, **decoding) -> RunConfig:
    return RunConfig(
        model=ModelConfig(path=str(model_dir)),
        decoding=lookahead(**{"window_size": 0, "ngram_size": 3, "guess_set_size": 2, **decoding}),
        generation=GenerationConfig(max_new_tokens=8),
        dataset=DatasetConfig(name="jsonl", path=str(_questions(tmp / "q.jsonl", 2)), limit=1),
        output=OutputConfig(path=str(tmp / "out" / "answers.jsonl")),
        progress=False,
    )


def test_a_resume_under_dtype_auto_keeps_the_files_dtype(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """model.dtype=auto in two sweep jobs timed at once on a loaded machine chose bfloat16 in one and float32 in
    the other, and the settings recorded "auto" only: a resume could mix dtypes in one answers file (a new user,
    2026-12-03). Then a resume where auto chose again was refused, so "the same command resumes" depended on the
    load when the dtypes were first timed (a new user, 2026-12-07): it now loads the dtype the file was made in.
    Another dtype given is refused before the model loads; a bad value is named as bad, not as a difference."""
    from lp_runtime import latency
    from lp_runtime.generate import run

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path / "cache"))
    cfg = _cfg(tiny_model_dir, tmp_path)
    cfg.model.dtype = "auto"
    record = Path(latency.profile_path(models.model_id(cfg.model), latency.device_key(torch.device("cpu")),
                                       "dtype-auto"))
    record.parent.mkdir(parents=True)

    def timed(float32_s: float, bfloat16_s: float) -> None:  # what the jobs measured, as choose_dtype caches it
        record.write_text(json.dumps({"step_s": {"float32": float32_s, "bfloat16": bfloat16_s},
                                      "method": f"interleaved-{models.DTYPE_ROUNDS}"}))

    timed(0.090, 0.030)
    run(cfg)
    out = tmp_path / "out"
    settings = json.loads((out / "answers.settings.json").read_text())["settings"]
    assert (settings["model.dtype"], settings["model.resolved_dtype"]) == ("auto", "bfloat16")
    timed(0.030, 0.090)  # auto would choose float32 now
    cfg.dataset.limit = None
    capsys.readouterr()
    assert run(cfg)["num_questions"] == 2 and len((out / "answers.jsonl").read_text().splitlines()) == 2
    assert (f"model.dtype=auto: bfloat16, the dtype {out / 'answers.jsonl'} was made in (a resume keeps it)"
            in capsys.readouterr().out.splitlines())
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    cfg.model.dtype = "float32"  # refused before the model loads
    with pytest.raises(answers.SettingsMismatchError) as e:
        run(cfg)
    assert str(e.value) == (
        f"{out / 'answers.jsonl'} was made with other settings ({out / 'answers.settings.json'}): "
        "model.resolved_dtype: 'bfloat16' in the file, 'float32' now; re-run with model.dtype=bfloat16 to resume "
        f"it, or write to a new output path (output.path={out / 'answers-2.jsonl'})")
    cfg.model.dtype, cfg.model.path = "auto", "/nonexistent"
    with pytest.raises(models.ModelLoadError, match=r"^model.path='/nonexistent' is not an existing folder"):
        run(cfg)
    cfg.model.path, cfg.model.attn_implementation = str(tiny_model_dir), "bogus"
    with pytest.raises(ConfigError, match=r"^model.attn_implementation='bogus' is not allowed"):
        run(cfg)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


def test_changed_settings_refuse_before_loading_and_same_settings_resume(tiny_model_dir, tmp_path):
    from lp_runtime.generate import run

    cfg = _cfg(tiny_model_dir, tmp_path)
    run(cfg)
    out = tmp_path / "out"
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(files) == ["answers.jsonl", "answers.settings.json", "answers.summary.json"]
    recorded = json.loads(files["answers.settings.json"])["settings"]
    assert recorded["decoding.window_size"] == 0 and recorded["parallel.world_size"] == 1
    assert recorded["model.fingerprint"] == models.model_fingerprint(cfg.model)
    assert "progress" not in recorded and "output.path" not in recorded

    changed = _cfg(tiny_model_dir, tmp_path, window_size=2)
    broken = tmp_path / "broken_model"  # passes the checks before loading, cannot load: the refusal must come first
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    changed.model.path = str(broken)
    changed.generation.max_new_tokens = 4
    with pytest.raises(answers.SettingsMismatchError) as e:
        run(changed)
    fp_new = models.model_fingerprint(changed.model)
    assert str(e.value) == (
        f"{out / 'answers.jsonl'} was made with other settings ({out / 'answers.settings.json'}): "
        f"decoding.window_size: 0 in the file, 2 now; generation.max_new_tokens: 8 in the file, 4 now; "
        f"model.fingerprint: {recorded['model.fingerprint']!r} in the file, {fp_new!r} now; "
        f"model.path: {str(tiny_model_dir)!r} in the file, {str(broken)!r} now; re-run with the file's settings to "
        f"resume it, or write to a new output path (output.path={out / 'answers-2.jsonl'})")
    changed.model.path = "/nonexistent"  # a bad value is named as bad (test_a_resume_under_dtype_auto_...), first
    with pytest.raises(models.ModelLoadError, match=r"^model.path='/nonexistent' is not an existing folder"):
        run(changed)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files  # byte-identical

    # Same settings (a display setting and the question count may change): resumes with the second question.
    cfg.progress, cfg.dataset.limit = True, None
    summary = run(cfg)
    assert summary["num_questions"] == 2
    lines = (out / "answers.jsonl").read_bytes()
    assert lines.startswith(files["answers.jsonl"]) and len(lines.splitlines()) == 2
    assert (out / "answers.settings.json").read_bytes() == files["answers.settings.json"]

    # A file written before settings were recorded: a clear refusal, nothing touched.
    (out / "answers.settings.json").unlink()
    with pytest.raises(answers.SettingsMismatchError, match=r"holds answers but no record of the settings .*"
                                                           r"choose a new output path \(output.path=.*answers-2.jsonl\)"):
        run(cfg)
    assert (out / "answers.jsonl").read_bytes() == lines


def test_a_resume_under_another_mkl_mode_is_refused_with_the_variable_to_set(tiny_model_dir, tmp_path):
    """MKL's mode changes a CPU's numerics (bfloat16 answers differed under MKL_CBWR=COMPATIBLE, a new user,
    2026-12-04): the settings record the mode MKL runs in, a resume under another is refused naming the variable,
    and a record from before the key resumes."""
    from lp_runtime import blas
    from lp_runtime.generate import run

    mode = blas.mkl_mode()
    if mode is None:
        pytest.skip("this torch build carries no MKL")
    cfg = _cfg(tiny_model_dir, tmp_path)
    run(cfg)
    out = tmp_path / "out"
    path = out / "answers.settings.json"
    record = json.loads(path.read_text())
    assert record["settings"]["model.mkl_mode"] == (mode or "default")
    other = "compatible" if mode != "compatible" else "default"
    record["settings"]["model.mkl_mode"] = other
    path.write_text(json.dumps(record))
    cfg.dataset.limit = None
    with pytest.raises(answers.SettingsMismatchError) as e:
        run(cfg)
    assert str(e.value) == (
        f"{out / 'answers.jsonl'} was made with other settings ({path}): model.mkl_mode: {other!r} in the file, "
        f"{mode or 'default'!r} now; re-run with MKL_CBWR={answers.mkl_env(other)} in the environment to "
        f"resume it, or write to a new output path (output.path={out / 'answers-2.jsonl'})")
    assert answers.mkl_env("default") == "" and answers.mkl_env("auto-strict") == "AUTO,STRICT"
    del record["settings"]["model.mkl_mode"]  # a record from before the key: resumes
    path.write_text(json.dumps(record))
    assert run(cfg)["num_questions"] == 2


def test_settings_differences_cover_new_fields_and_skip_display_ones():
    cfg = RunConfig()
    current = answers.run_settings(cfg, model_fingerprint="ab", world_size=2)
    assert current["parallel.world_size"] == 2 and current["sampling.category_temperature"] is None
    assert not set(answers.NOT_COMPARED) & set(current)
    old = dict(current)
    del old["sampling.min_p"]  # a field the older record did not have: its default is assumed
    assert answers.differences(old, current) == []
    old["sampling.min_p"] = 0.1
    old["progress"] = False
    assert answers.differences(old, current) == [("sampling.min_p", 0.1, 0.0)]
    # the LP backend (auto is gloo on a CPU) and the debug check change no answer: a resume under torchrun with
    # parallel.backend=gloo was refused over answers written with auto (a new user, 2026-12-04)
    old = {**current, "parallel.backend": "auto", "parallel.debug_check": False}
    assert answers.differences(old, {**current, "parallel.backend": "gloo", "parallel.debug_check": True}) == []


def test_a_question_file_spelled_another_way_is_the_same_file(tmp_path, monkeypatch):
    """dataset.path=./q.jsonl refused to resume answers made with q.jsonl (and the report found no shared
    questions with the absolute spelling; a new user, 2026-12-02): paths are compared as the files they name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.jsonl").write_text("")
    (tmp_path / "r.jsonl").write_text("")
    base = {"decoding.method": "greedy", "dataset.name": "jsonl", "dataset.path": "q.jsonl"}
    for same in ("./q.jsonl", str(tmp_path / "q.jsonl"), f"{tmp_path}/sub/../q.jsonl"):
        assert answers.differences(base, {**base, "dataset.path": same}) == []
    assert answers.differences(base, {**base, "dataset.path": "r.jsonl"}) == [("dataset.path", "q.jsonl", "r.jsonl")]
    from lp_runtime.report import shared

    runs = [{"settings": {**base, "dataset.path": p}, "records": [{"question_id": 1}]}
            for p in ("q.jsonl", str(tmp_path / "q.jsonl"), "r.jsonl")]
    assert [len(shared(r, runs[0])) for r in runs] == [1, 1, 0]


def test_settings_of_retired_levers_resume_only_at_todays_behaviour():
    current = answers.run_settings(RunConfig(), model_fingerprint="ab", world_size=1)
    old = {**current, **{k: v for k, v in answers.RETIRED.items() if k not in current}}  # a record from before
    assert answers.differences(old, current) == []
    old["decoding.chain"], old["decoding.lookup"] = False, "pool"  # levers that were switched: other tokens/steps
    assert answers.differences(old, current) == [("decoding.chain", False, None), ("decoding.lookup", "pool", None)]


def test_greedy_runs_do_not_compare_lookahead_parameters():
    """A greedy answers file resumes whatever W, N, G the record holds (greedy does not read them: a record
    written under older defaults still resumes); anything greedy reads is still compared."""
    cfg = RunConfig()
    cfg.decoding.method = "greedy"
    current = answers.run_settings(cfg, model_fingerprint="ab", world_size=1)
    old = {**current, "decoding.ngram_size": 4, "decoding.guess_set_size": 2, "decoding.max_depth": 10,
           "decoding.window_size": 3, "decoding.chain": False}
    assert answers.differences(old, current) == []
    old["sampling.temperature"] = 0.7
    assert answers.differences(old, current) == [("sampling.temperature", 0.7, current["sampling.temperature"])]
    lookahead = {**old, "decoding.method": "lookahead"}
    assert ("decoding.method", "lookahead", "greedy") in answers.differences(lookahead, current)


def test_model_fingerprint_follows_the_files_not_the_name(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text('{"hidden_size": 8}')
    (a / "model.safetensors").write_bytes(b"\0" * 100)
    (a / "notes.txt").write_text("x")
    fp = models.model_fingerprint(ModelConfig(path=str(a)))
    assert fp == models.model_fingerprint(ModelConfig(path=str(a), name="other", dtype="bfloat16"))
    (a / "notes.txt").write_text("y")  # not part of the model
    assert models.model_fingerprint(ModelConfig(path=str(a))) == fp
    (a / "model.safetensors").write_bytes(b"\1" + b"\0" * 99)
    fp2 = models.model_fingerprint(ModelConfig(path=str(a)))
    assert fp2 != fp and len(fp2) == 16
    assert models.model_label(ModelConfig(path=str(a)), fp2) == f"a-{fp2[:8]}"
    assert models.model_label(ModelConfig(path=str(a), name="mine"), fp2) == f"mine-{fp2[:8]}"
    assert models.model_label(ModelConfig(path="bundled:smollm2"), fp2) == f"smollm2-{fp2[:8]}"


def test_port_for_job():
    assert jobs.port_for_job("4242") == 24242 and jobs.port_for_job("4242_3") == 20000 + 42423 % 20000
    assert jobs.port_for_job("local") == 20000


def test_no_schema_among_the_choices_and_the_slurm_preset_composes():
    """--help and Hydra's "Available options" errors list these options (the CLI's one-line error for a failed run
    leaving no folder is in test_cli.py::test_missing_model_fails_in_one_line)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lp_runtime.cli import CONF_DIR
    from lp_runtime.config import register_configs

    register_configs()  # generate.yaml's schema (an earlier test of the module registered it: alone this failed)
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        loader = GlobalHydra.instance().config_loader()
        for group in ("model", "decoding", "sampling", "dataset", "parallel"):
            options = loader.get_group_options(group)
            assert options and not [o for o in options if o.endswith("_schema")], (group, options)
        assert {"lp_slurm", "lp_local"} <= set(loader.get_group_options("hydra/launcher"))
        assert "smollm2_135m" in loader.get_group_options("model")
        from hydra import compose

        cfg = compose("generate", overrides=["hydra/launcher=lp_slurm", "hydra.launcher.tasks_per_node=4"],
                      return_hydra_config=True)
        launcher = cfg.hydra.launcher
        assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
        assert (launcher.tasks_per_node, launcher.nodes, launcher.setup) == (4, 1, ["export HYDRA_FULL_ERROR=1",
                                                                          "export SLURM_KILL_BAD_EXIT=1"])
        # lp_local's job logs: the sweep's .submitit, no %j (submitit's local controller made an empty '%j' folder)
        cfg = compose("generate", overrides=["hydra/launcher=lp_local", "hydra.sweep.dir=/tmp/sweep"],
                      return_hydra_config=True)
        assert cfg.hydra.launcher._target_.endswith("submitit_launcher.LocalLauncher")
        assert cfg.hydra.launcher.submitit_folder == "/tmp/sweep/.submitit"


# ---------------------------------------------------------------------------- submitit launcher, locally

NO_SLURM = shutil.which("sbatch") is None
LOCAL_SWEEP = ["--multirun", "hydra/launcher=lp_local", "hydra.launcher.tasks_per_node=2", "parallel=lp2",
               "parallel.backend=gloo", "parallel.timeout_s=60", "decoding=lookahead"]


@pytest.fixture(scope="module")
def sweep_cli(tiny_model_dir, tmp_path_factory):
    """The module's command lines, in ONE fresh interpreter (tests/cli_batch.py: each ``python -m
    lp_runtime.generate`` here paid ~5 s of start-up; the sweeps' ranks are still processes of their own, started by
    submitit): (folder, [results]) of the lp_local sweep of two jobs, a copy of its job 0's answers (answers0.jsonl),
    the same sweep folder with another setting, and (without Slurm) -m hydra/launcher=lp_slurm."""
    from cli_batch import Call, run_cli

    tmp = tmp_path_factory.mktemp("sweeps")
    calls = [Call([*LOCAL_SWEEP, "decoding.window_size=0,2", *_sweep_args(tiny_model_dir, tmp)]),
             Call(["copy", str(tmp / "sweep" / "0" / "answers.jsonl"), str(tmp / "answers0.jsonl")],
                  module="cli_batch"),
             Call([*LOCAL_SWEEP, "decoding.window_size=0", *_sweep_args(tiny_model_dir, tmp),
                   "generation.max_new_tokens=8"])]
    if NO_SLURM:
        calls.append(Call(["-m", "hydra/launcher=lp_slurm", "decoding=lookahead,greedy", "dataset.limit=1",
                           f"hydra.sweep.dir={tmp / 'slurm_sweep'}"]))
        # a Slurm whose sbatch refuses the job array, and one without srun: stand-ins on PATH
        for name, tools in (("refusing", ("sbatch", "srun")), ("no_srun", ("sbatch",))):
            (tmp / name).mkdir()
            for tool in tools:
                script = tmp / name / tool
                script.write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n")
                script.chmod(0o755)
            calls.append(Call(["-m", "hydra/launcher=lp_slurm", "hydra.launcher.partition=gpu",
                               "decoding=lookahead", "decoding.window_size=0,2", *_sweep_args(tiny_model_dir, tmp),
                               f"hydra.sweep.dir={tmp / name / 'sweep'}"],
                              env={"PATH": f"{tmp / name}:{os.environ['PATH']}"}))
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return tmp, run_cli(calls, env, timeout=900)


def test_submitit_local_launcher_sweep_with_two_ranks_per_job(sweep_cli):
    tmp_path, (res, copied, again, *_) = sweep_cli
    assert res.returncode == 0, res.stderr[-3000:]
    outputs = []
    for job in ("0", "1"):
        folder = tmp_path / "sweep" / job
        summary = json.loads((folder / "answers.summary.json").read_text())
        assert summary["num_questions"] == 1
        assert summary["lp_communication"]["lp_degree"] == 2  # both tasks of the job joined one LP group
        assert summary["settings"]["parallel.world_size"] == 2
        (answer,) = [json.loads(x) for x in (folder / "answers.jsonl").read_text().splitlines()]
        outputs.append(answer["choices"][0]["output_ids"])
    assert outputs[0] == outputs[1]  # W = 0 and W = 2: the same greedy tokens
    # each job's two ranks' logs, no folder named '%j' beside them: this sweep's two jobs (the one below is refused
    # before any job starts), read once both sweeps have run
    logs = tmp_path / "sweep" / ".submitit"
    names = sorted(p.name for p in logs.glob("*_log.out"))
    ids = {n.split("_")[0] for n in names}
    assert len(ids) == 2 and names == sorted(f"{i}_{r}_log.out" for i in ids for r in (0, 1)), names
    assert [p for p in logs.iterdir() if p.is_dir()] == []
    # the same sweep folder with another setting: job 0's answers file is refused before any job starts (it was
    # refused by the job's ranks once launched, a new user's third pass; and a re-run sweep whose jobs changed order
    # ran job 0 before refusing job 1, a new user, 2026-12-05), one error line, exit 2, not the launcher's
    # UncompletedJobError traceback; the answers stay (as the first sweep left them: the batch's copy between the
    # two command lines)
    assert copied.returncode == 0, copied.stderr
    last = again.stderr.strip().splitlines()[-1]
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert last.startswith(f"error: sweep job 0: {tmp_path / 'sweep' / '0' / 'answers.jsonl'} was made with "
                           "other settings") and "generation.max_new_tokens: 16 in the file, 8 now" in last, last
    assert last.endswith("; no job was run"), last
    last = last[: -len("; no job was run")]
    # where to write instead: a new sweep folder (the output.path=...-2.jsonl it advised is refused for a sweep)
    assert last.endswith(f"or write to a new output path (hydra.sweep.dir={tmp_path / 'sweep'}-2: each job of the "
                         "sweep writes into its own folder there)"), last
    assert (tmp_path / "sweep" / "0" / "answers.jsonl").read_bytes() == (tmp_path / "answers0.jsonl").read_bytes()


@pytest.mark.skipif(not NO_SLURM, reason="this machine has Slurm")
def test_slurm_launcher_without_slurm_is_one_line(sweep_cli):
    """-m hydra/launcher=lp_slurm on a machine without Slurm: submitit's 41-line traceback, exit 1, and a
    multirun.yaml left behind (a new user, 2026-12-02)."""
    tmp_path, results = sweep_cli
    res = results[3]
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: hydra/launcher=lp_slurm submits each job with Slurm's sbatch, which this machine does not have; run "
        "the sweep on a Slurm login node, or try it here with hydra/launcher=lp_local"]
    assert not (tmp_path / "slurm_sweep").exists()


@pytest.mark.skipif(not NO_SLURM, reason="this machine has Slurm")
def test_a_submission_slurm_refuses_and_a_missing_srun_are_one_line(sweep_cli):
    """sbatch refusing the sweep's job array (a bad partition) gave submitit's 57-line traceback, exit 1, and left
    the sweep folder holding multirun.yaml and .submitit/ for jobs that never existed; sbatch without srun gave
    submitit's "Could not detect srun" traceback (a new user, 2026-12-04)."""
    tmp_path, results = sweep_cli
    refused, no_srun = results[4], results[5]
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        "error: Slurm's sbatch refused the sweep's jobs: sbatch: error: invalid partition specified: gpu; no job was "
        "submitted (the hydra.launcher.* settings are sbatch's options)"), refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "refusing" / "sweep").exists()
    assert no_srun.returncode == 2 and no_srun.stderr.strip().splitlines() == [
        "error: hydra/launcher=lp_slurm starts each job's ranks with Slurm's srun, which this machine does not have "
        "(sbatch is here); run the sweep on a Slurm login node, or try it here with hydra/launcher=lp_local"]


def test_a_refused_sweeps_folder_is_removed_only_when_it_holds_nothing_else(tmp_path, monkeypatch):
    """What remove_refused_sweep_dir removes (cli._remove_made): the launcher's files of this run only; a sweep
    folder holding an earlier job's answers, or not changed by this run, stays."""
    from lp_runtime import cli

    monkeypatch.chdir(tmp_path)
    def made(name, *files):
        for f in files:
            (tmp_path / name / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / f).write_text("x")
        return tmp_path / name
    allowed = lambda rel, p: rel == "multirun.yaml" or rel.split("/")[0] == ".submitit"  # noqa: E731
    cli._remove_made(made("a/b/sweep", "multirun.yaml", ".submitit/x.pkl"), None, allowed)
    assert not (tmp_path / "a").exists()  # and the empty folders above it that the run made
    cli._remove_made(made("old", "multirun.yaml", ".submitit/x.pkl", "0/answers.jsonl"), None, allowed)
    assert (tmp_path / "old" / "0" / "answers.jsonl").exists() and (tmp_path / "old" / "multirun.yaml").exists()
    before = made("before", "multirun.yaml")
    os.utime(before, (cli._STARTED - 60, cli._STARTED - 60))
    cli._remove_made(before, None, allowed)
    assert (before / "multirun.yaml").exists()


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_submitit_task_becomes_a_rank(monkeypatch, executor):
    from lp_runtime import distributed

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        # set, then removed: monkeypatch records the variable, so what submitit_rank_env sets below is undone after
        # the test (a bare delenv of an absent variable records nothing: RANK=1 leaked into later tests' processes)
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", executor)
    if executor == "slurm":  # what srun gives task 3 of a 2-node x 2-task job
        for k, v in dict(SLURM_JOB_ID="4242", SLURM_PROCID="3", SLURM_NTASKS="4", SLURM_LOCALID="1",
                         SLURM_NODEID="1", SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="gpu[01-02]").items():
            monkeypatch.setenv(k, v)
        want = distributed.RankInfo(3, 4, 1, "slurm")
    else:  # what submitit's local controller gives its second task
        for k, v in dict(SUBMITIT_LOCAL_JOB_ID="4242", SUBMITIT_LOCAL_NTASKS="2", SUBMITIT_LOCAL_GLOBALID="1",
                         SUBMITIT_LOCAL_LOCALID="1", SUBMITIT_LOCAL_NODEID="0", SUBMITIT_LOCAL_JOB_NUM_NODES="1").items():
            monkeypatch.setenv(k, v)
        want = distributed.RankInfo(1, 2, 1, "torchrun")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        jobs.submitit_rank_env()
        # local tasks share this machine: one thread each, as torchrun gives (all cores each ran 8x slower)
        assert torch.get_num_threads() == (1 if executor == "local" else 2)
    finally:
        torch.set_num_threads(threads)
    assert distributed.detect() == want
    assert os.environ["MASTER_PORT"] == "24242" and os.environ["LOCAL_RANK"] == "1"
    assert executor == "slurm" or os.environ["MASTER_ADDR"] == "127.0.0.1"


def test_the_suggested_new_output_path_is_quoted_for_the_shell(tmp_path):
    """A path with a space was suggested bare, "(output.path=/x/my answers-2.jsonl)", which a shell splits when
    pasted (a new user, session 22); README asks for such overrides quoted."""
    from lp_runtime import answers

    path = tmp_path / "my answers.jsonl"
    path.write_text(json.dumps({"question_id": 1, "choices": [{"turns": ["a"]}]}) + "\n")
    with pytest.raises(answers.SettingsMismatchError) as e:
        answers.check_settings(path, tmp_path / "my answers.settings.json", {})
    assert str(e.value).endswith(f"choose a new output path ('output.path=\"{tmp_path / 'my answers-2.jsonl'}\"') "
                                 "or move the file away")
    # pasted into a shell, Hydra reads the path back (a review: shell quotes alone left "runs (old)/a" unparsable
    # and a comma made a sweep)
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    for name in ("runs (old)/a.jsonl", "a,b/résumé.jsonl", 'q"uote/x.jsonl', "plain/a.jsonl", "end\\"):
        (word,) = shlex.split(answers.override_arg("output.path", name))
        (parsed,) = OverridesParser.create().parse_overrides([word])
        assert (parsed.value(), parsed.is_sweep_override()) == (name, False)


def test_sweep_jobs_of_one_setting_are_refused_and_jobs_apart_only_in_unrecorded_settings_run():
    """Two jobs that would write the same answers are refused (a value given twice as 0 and 00, W under greedy; a
    new user, session 22); jobs that differ only in settings an answers file does not compare on resume (a quick
    and a full run, gloo against nccl) or in model.dtype=float32 against auto still run (a review: both were
    refused by the first version)."""
    from lp_runtime.config import ConfigError, DatasetConfig, DecodingConfig, ModelConfig, ParallelConfig, RunConfig
    from lp_runtime.jobs import _check_distinct, _job_setting

    def check(*cfgs):
        _check_distinct([[f"job={i}"] for i in range(len(cfgs))], {"job"}, [_job_setting(c, 1) for c in cfgs])

    look = DecodingConfig(method="lookahead")
    check(RunConfig(decoding=look, dataset=DatasetConfig(limit=5)), RunConfig(decoding=look, dataset=DatasetConfig(limit=80)))
    check(RunConfig(decoding=look, parallel=ParallelConfig(backend="gloo")),
          RunConfig(decoding=look, parallel=ParallelConfig(backend="nccl")))
    check(RunConfig(decoding=look, model=ModelConfig(dtype="float32")), RunConfig(decoding=look, model=ModelConfig(dtype="auto")))
    for pair in ((RunConfig(decoding=look), RunConfig(decoding=DecodingConfig(method="lookahead"))),
                 (RunConfig(decoding=DecodingConfig(method="greedy", window_size=0)),
                  RunConfig(decoding=DecodingConfig(method="greedy", window_size=3))),
                 (RunConfig(decoding=DecodingConfig(method="paper", max_depth=10)),  # paper reads no max_depth
                  RunConfig(decoding=DecodingConfig(method="paper", max_depth=20, successors="auto")))):
        with pytest.raises(ConfigError, match=r"^sweep jobs 0 \(job=0\) and 1 \(job=1\) would run the same setting"):
            check(*pair)


@pytest.mark.parametrize("summary, settings", [("null", None), ('{"settings": [1], "config": 3}', '{"settings": 7}'),
                                               ("[]", '{"format": 1, "settings": {"decoding.window_size": 3}}')])
def test_report_reads_records_that_hold_json_but_no_object(tmp_path, summary, settings):
    """A .summary.json holding valid JSON that is not an object (``null``) ended the report in an AttributeError
    traceback (a review, 2026-12-05): such a record holds no settings; a readable .settings.json still counts."""
    from lp_runtime.report import load_run

    path = tmp_path / "answers.jsonl"
    path.write_text("")
    (tmp_path / "answers.summary.json").write_text(summary)
    if settings is not None:
        (tmp_path / "answers.settings.json").write_text(settings)
    expected = {"decoding.window_size": 3} if settings and "window_size" in settings else {}
    assert load_run(path)["settings"] == expected


@pytest.mark.parametrize("settings", [[1, 2], "x", 5, None, {}])  # {}: compared with defaults it never held
def test_a_settings_record_edited_into_no_object_refuses_the_resume_in_one_line(tmp_path, settings):
    """A settings record whose "settings" was edited into a list, a string or a number: an AttributeError traceback
    on resume (a new user, 2026-12-05); now the line a record that is not lp_runtime's gets."""
    from lp_runtime.answers import SettingsMismatchError, check_settings

    path, record = tmp_path / "a.jsonl", tmp_path / "a.settings.json"
    path.write_text(json.dumps({"question_id": 1, "choices": [{"turns": ["x"]}]}) + "\n")
    record.write_text(json.dumps({"format": 1, "settings": settings}))
    with pytest.raises(SettingsMismatchError) as e:
        check_settings(path, record, {"decoding.method": "greedy"})
    assert str(e.value) == (f"{record} is not a settings record written by lp_runtime; choose a new output path "
                            f"(output.path={tmp_path}/a-2.jsonl) or move both files away")


@pytest.mark.parametrize("fmt", [99, "1", True, 1.5, None, "no key"])
def test_a_settings_record_of_another_format_refuses_even_the_same_settings(tmp_path, fmt):
    """``"format": 99`` (and "1", true, 1.5) with settings equal to the run's: the resume went ahead, the record read
    as this version's own. The format this version writes is the only one it reads."""
    from lp_runtime.answers import SettingsMismatchError, check_settings

    path, record = tmp_path / "a.jsonl", tmp_path / "a.settings.json"
    path.write_text(json.dumps({"question_id": 1, "choices": [{"turns": ["x"]}]}) + "\n")
    settings = {"decoding.method": "greedy"}
    record.write_text(json.dumps({"settings": settings, **({} if fmt == "no key" else {"format": fmt})}))
    with pytest.raises(SettingsMismatchError) as e:
        check_settings(path, record, settings)
    shown = 'none (no "format" key)' if fmt == "no key" else json.dumps(fmt)
    assert str(e.value) == (f"{record} is a settings record of format {shown}, and this version of lp_runtime reads "
                            "format 1 only: it was written by another version of lp_runtime, or edited; use the "
                            "version that wrote it, or move the record and its answers file away (or choose another "
                            "output.path)")
    record.write_text(json.dumps({"format": 1, "settings": settings}))
    check_settings(path, record, settings)  # this version's own: resumes


def test_a_setting_this_version_no_longer_has_is_not_advised_as_the_files_setting(tmp_path):
    """A record holding a retired setting at another value than today's (``decoding.chain: false``): "re-run with the
    file's settings" advised a setting no command line can give; now the version that made the file."""
    from lp_runtime.answers import SettingsMismatchError, check_settings

    path, record = tmp_path / "a.jsonl", tmp_path / "a.settings.json"
    path.write_text(json.dumps({"question_id": 1, "choices": [{"turns": ["x"]}]}) + "\n")
    record.write_text(json.dumps({"format": 1, "settings": {"decoding.method": "lookahead", "decoding.chain": False}}))
    with pytest.raises(SettingsMismatchError) as e:
        check_settings(path, record, {"decoding.method": "lookahead"})
    assert str(e.value) == (f"{path} was made with other settings ({record}): decoding.chain: false in the file, null "
                            "now; re-run with the version of lp_runtime that made it (this one has no setting "
                            f"decoding.chain) to resume it, or write to a new output path (output.path={tmp_path}/"
                            "a-2.jsonl)")


def test_a_settings_value_edited_into_a_list_is_a_difference():
    """``"decoding.method": ["greedy"]`` in a record: a TypeError (unhashable) traceback on resume (a new user,
    2026-12-05); now a difference like any other."""
    from lp_runtime.answers import differences

    assert differences({"decoding.method": ["greedy"]}, {"decoding.method": "greedy"}) == [
        ("decoding.method", ["greedy"], "greedy")]


def test_a_sweep_job_whose_answers_file_holds_other_settings_is_refused_before_any_job_runs(tmp_path):
    """A finished sweep re-run with its jobs in another order: job 0 loaded the model and answered, then job 1 was
    refused for its file's settings (a new user, 2026-12-05). ``validate_sweep`` now checks every job's file first,
    as a single run does before loading."""
    from lp_runtime.answers import SettingsMismatchError, run_settings
    from lp_runtime.config import DecodingConfig, OutputConfig, RunConfig
    import dataclasses

    from lp_runtime.jobs import _check_resumable, _job_files
    from lp_runtime.models import model_fingerprint
    from omegaconf import OmegaConf

    path = tmp_path / "sweep" / "1" / "answers.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(ANSWER)  # an answer line: the check reads the file as the job does
    made = RunConfig(decoding=DecodingConfig(method="lookahead", guess_set_size=2), output=OutputConfig(path=str(path)))
    recorded = run_settings(made, model_fingerprint=model_fingerprint(made.model), world_size=1)
    (path.parent / "answers.settings.json").write_text(json.dumps({"format": 1, "settings": recorded}))
    def hydra(job: int, chdir: bool = False):  # the job's hydra node: its folder, as validate_sweep sets it
        return OmegaConf.create({"sweep": {"dir": str(tmp_path / "sweep")}, "job": {"chdir": chdir},
                                 "runtime": {"output_dir": str(tmp_path / "sweep" / str(job))}})

    def check(cfg, job_hydra, overrides):  # as validate_sweep: the job's files, then what they hold
        _check_resumable(_job_files(cfg, job_hydra, overrides), 1, job_hydra)

    check(made, hydra(1), ["output.path=x"])  # the same setting: resumes
    check(made, hydra(0), [])  # job 0's folder holds no answers
    now = RunConfig(decoding=DecodingConfig(method="lookahead", guess_set_size=3))  # output.path: the job's folder
    # a relative output.path under hydra.job.chdir is the job folder's (a review: it was checked in the launch folder)
    check(dataclasses.replace(now, output=OutputConfig(path="answers.jsonl")), hydra(0, chdir=True),
          ["output.path=answers.jsonl"])
    with pytest.raises(SettingsMismatchError):
        check(dataclasses.replace(now, output=OutputConfig(path="answers.jsonl")), hydra(1, chdir=True),
              ["output.path=answers.jsonl"])
    with pytest.raises(SettingsMismatchError) as e:
        check(now, hydra(1), ["decoding.guess_set_size=3"])
    assert str(e.value) == (
        f"{path} was made with other settings ({path.parent / 'answers.settings.json'}): decoding.guess_set_size: 2 in "
        f"the file, 3 now; re-run with the file's settings to resume it, or write to a new output path "
        f"(hydra.sweep.dir={tmp_path / 'sweep-2'}: each job of the sweep writes into its own folder there)")


@pytest.fixture(scope="module")
def refused_sweeps(tiny_model_dir, tmp_path_factory):
    """Sweeps of Hydra's own launcher in ONE fresh interpreter (tests/cli_batch.py), each in a sweep folder of its
    own under tmp: case -> result. Two jobs, decoding=greedy,lookahead, unless the case says otherwise; the files a
    case finds are made here, before the batch (a duplicated answer: by the batch, after a sweep that answered)."""
    from cli_batch import Call, run_cli

    tmp = tmp_path_factory.mktemp("refused")
    two = ["-m", "decoding=greedy,lookahead"]
    (tmp / "shared_again").mkdir()
    (tmp / "shared_again" / "answers.jsonl").write_text(ANSWER)
    for name, file, text in (("foreign_summary", "answers.summary.json", "notes\n"),
                             ("foreign_lock", "answers.lock", "mine\n")):
        (tmp / name / "1").mkdir(parents=True)
        (tmp / name / "1" / file).write_text(text)
    (tmp / "job_id").mkdir()
    (tmp / "job_id" / "1.json").write_text("notes\n")
    dup = str(tmp / "duplicate" / "1" / "answers.jsonl")
    (tmp / "launch_dir").mkdir()  # a file there named as a chdir job's summary names its answers: not the job's
    (tmp / "launch_dir" / "answers.jsonl").write_text(ANSWER)
    (tmp / "linked").mkdir()
    for n in "01":
        (tmp / f"link{n}").symlink_to(tmp / "linked")
    calls = {"shared": [*two, "output.path=${hydra:sweep.dir}/answers.jsonl"],
             "shared_again": [*two, "output.path=${hydra:sweep.dir}/answers.jsonl"],
             "shared_summary": [*two, "output.summary_path=${hydra:sweep.dir}/s.json"],
             "shared_folder": [*two, "hydra.sweep.subdir=all"],
             "fixed_path": [*two, "output.path=out/a.jsonl"],
             "job_id": [*two, "hydra/launcher=lp_local", "output.path=${hydra:sweep.dir}/${hydra:job.id}/answers.jsonl",
                        "output.summary_path=${hydra:sweep.dir}/${hydra:job.num}.json"],
             "chdir": [*two, "hydra.job.chdir=true", "output.path=answers.jsonl"],
             "chdir_one_folder": [*two, "hydra.job.chdir=true", "output.path=answers.jsonl", "hydra.sweep.subdir=all"],
             "links": [*two, f"output.path={tmp}/link${{hydra:job.num}}/a.jsonl"],
             "subdir_job_num": [*two, "hydra.sweep.subdir=${hydra:job.num}"],
             "foreign_summary": two, "foreign_lock": two, "answered": two,
             "range_step_0": ["-m", "decoding=lookahead", "decoding.window_size=range(0,3,0)"]}
    batch = [Call([*args, *_sweep_args(tiny_model_dir, tmp, "duplicate" if name == "answered" else name)],
                  cwd=str(tmp)) for name, args in calls.items()]
    batch += [Call(["append", dup, dup], module="cli_batch"),
              Call([*two, *_sweep_args(tiny_model_dir, tmp, "duplicate")], cwd=str(tmp))]
    chdir_summary = [*two, "hydra.job.chdir=true", "output.path=answers.jsonl", "output.summary_path=s.json",
                     *_sweep_args(tiny_model_dir, tmp, "chdir_summary")]
    batch += [Call(chdir_summary, cwd=str(tmp / "launch_dir"))] * 2  # answered, then resumed
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    results = run_cli(batch, env)
    return tmp, dict(zip([*calls, "append", "duplicate", "chdir_summary", "chdir_summary_again"], results))


ANSWER = json.dumps({"question_id": 81, "choices": [{"turns": ["x"], "output_ids": [[1, 2]], "new_tokens": [2],
                                                     "decoding_steps": [2], "wall_time": [1.0],
                                                     "accept_lengths": [[1, 1]]}]}) + "\n"
TWO_JOBS = "sweep jobs 0 (decoding=greedy) and 1 (decoding=lookahead) would both write"


def _refused_with(result, line: str, code: int = 2) -> None:
    assert (result.returncode, result.stderr.strip().splitlines()) == (code, [f"error: {line}"]), result.stderr[-3000:]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_sweep_jobs_that_would_write_one_file_are_refused_before_any_job_runs(refused_sweeps):
    """output.path='${hydra:sweep.dir}/answers.jsonl' passed the check of a fixed path (it has ${): job 0 answered,
    then job 1 was refused at its turn for job 0's settings, with the advice of a new sweep folder, where the two
    jobs share a file again (session 24). The jobs' files are compared as each job opens them, whatever
    made them one: an interpolation that does not depend on the job, a fixed path, one hydra.sweep.subdir."""
    tmp, results = refused_sweeps
    advice = ("drop {0} so that each job writes into its own folder (<hydra.sweep.dir>/<job number>/), or put the job "
              "number in it: '{0}=${{hydra:sweep.dir}}/${{hydra:job.num}}/{1}'; no job was run")
    for name, key, path in (("shared", "output.path", tmp / "shared" / "answers.jsonl"),
                            ("shared_again", "output.path", tmp / "shared_again" / "answers.jsonl"),
                            ("shared_summary", "output.summary_path", tmp / "shared_summary" / "s.json"),
                            ("fixed_path", "output.path", tmp / "out" / "a.jsonl")):
        kind, file = jobs.SWEEP_FILES[key]
        _refused_with(results[name], f"{TWO_JOBS} {key}={path}, but one {kind} of one setting; "
                                     f"{advice.format(key, file)}")
    _refused_with(results["shared_folder"], f"{TWO_JOBS} {tmp / 'shared_folder' / 'all' / 'answers.jsonl'} "
                  "(hydra.sweep.subdir is one folder for both), but one answers file holds the answers of one setting; "
                  "put the job number in hydra.sweep.subdir (its default: '${hydra.job.num}'); no job was run")
    # nothing written, and the answers already there (no settings record: refused for that before) as they were
    _refused_with(results["chdir_one_folder"], f"{TWO_JOBS} {tmp / 'chdir_one_folder' / 'all' / 'answers.jsonl'} "
                  "(hydra.sweep.subdir is one folder for both), but one answers file holds the answers of one setting; "
                  "put the job number in hydra.sweep.subdir (its default: '${hydra.job.num}'); no job was run")
    key, (kind, file) = "output.path", jobs.SWEEP_FILES["output.path"]
    _refused_with(results["links"], f"{TWO_JOBS} {key}={tmp / 'link1' / 'a.jsonl'} (the file "
                                     f"{tmp / 'linked' / 'a.jsonl'}), but one {kind} of one setting; "
                                     f"{advice.format(key, file)}")
    # a job number in hydra.sweep.subdir is each job's (it did not resolve up front: "HydraConfig was not set")
    assert results["subdir_job_num"].returncode == 0, results["subdir_job_num"].stderr[-3000:]
    assert sorted(p.name for p in (tmp / "subdir_job_num").iterdir() if p.is_dir()) == ["0", "1"]
    assert not any((tmp / name).exists() for name in ("shared", "shared_summary", "shared_folder", "out",
                                                       "chdir_one_folder", "linked/a.jsonl"))
    assert _files(tmp / "shared_again") == {"answers.jsonl": ANSWER.encode()}
    # submitit's job ids are not known up front: a path of one is each job's own (here job 1 is refused for a file
    # its summary would overwrite, a check made after the jobs' files were compared)
    summary = tmp / "job_id" / "1.json"
    _refused_with(results["job_id"], f"sweep job 1 (decoding=lookahead): output.summary_path={summary} exists and is "
                  "not a run summary; the summary would overwrite it: give another file, e.g. output.summary_path="
                  f"{tmp / 'job_id' / '<id of job 1>' / 'answers.summary.json'}; no job was run")
    assert _files(tmp / "job_id") == {"1.json": b"notes\n"}


def test_a_relative_output_path_under_hydra_job_chdir_is_each_jobs_own(refused_sweeps):
    """hydra.job.chdir=true runs each job in its own folder, so output.path=answers.jsonl is one file per job: it was
    refused as one file for every job (session 24)."""
    tmp, results = refused_sweeps
    assert results["chdir"].returncode == 0, results["chdir"].stderr[-3000:]
    for job in ("0", "1"):
        assert len((tmp / "chdir" / job / "answers.jsonl").read_text().splitlines()) == 1
    assert not (tmp / "answers.jsonl").exists()
    # its summary names its answers as the job opens them, from its folder: a file of that name where the sweep was
    # launched is not them (the resume was refused up front as "the summary of another answers file")
    for run in ("chdir_summary", "chdir_summary_again"):
        assert results[run].returncode == 0, results[run].stderr[-3000:]
    assert json.loads((tmp / "chdir_summary" / "1" / "s.json").read_text())["answers"] == "answers.jsonl"
    assert (tmp / "launch_dir" / "answers.jsonl").read_text() == ANSWER


@pytest.mark.parametrize("name, file, problem", [
    ("foreign_summary", "answers.summary.json", "{file}, the summary this run writes beside output path {answers}, "
                                                "exists and is not a run summary; move it away, choose another "
                                                "output.path, or give output.summary_path"),
    ("foreign_lock", "answers.lock", "{file}, which this run writes beside output path {answers}, exists and is not "
                                     "a lock file; move it away or choose another output.path"),
    ("duplicate", "answers.jsonl", "{answers} line 2 answers question 81 again ({answers} line 1 did); keep one of "
                                   "the two lines, or move the file away or choose another output.path")])
def test_a_job_folder_holding_what_the_job_would_refuse_is_refused_before_any_job_runs(refused_sweeps, name, file,
                                                                                       problem):
    """A summary or a lock file beside job 1's answers that lp_runtime did not write, or job 1's answers file holding
    an answer twice: job 0 ran (or resumed) first, then job 1 was refused at its turn (session 24). The
    up-front check now makes the job's own checks of the files it finds."""
    tmp, results = refused_sweeps
    folder = tmp / name
    _refused_with(results[name], f"sweep job 1 (decoding=lookahead): "
                                 f"{problem.format(file=folder / '1' / file, answers=folder / '1' / 'answers.jsonl')}"
                                 "; no job was run")
    if name == "duplicate":  # the sweep that answered, then the batch's append; the re-run changed no answer
        assert results["answered"].returncode == 0 and results["append"].returncode == 0
        first, second = (folder / "1" / "answers.jsonl").read_text().splitlines()
        assert first == second and len((folder / "0" / "answers.jsonl").read_text().splitlines()) == 1
    else:  # no job ran: job 0's folder was never made, job 1's file is as the fixture made it
        assert _files(folder) == {f"1/{file}": {"foreign_summary": b"notes\n", "foreign_lock": b"mine\n"}[name]}


def test_an_unexpected_error_in_the_up_front_check_stops_the_sweep(refused_sweeps):
    """An error the sweep's checks did not expect, raised in Hydra's callback, became Hydra's warning and the sweep
    went on unchecked (here Hydra's own sweeper then failed on the same value in a traceback)."""
    tmp, results = refused_sweeps
    _refused_with(results["range_step_0"], "the up-front check of the sweep's jobs failed (ValueError: range() arg 3 "
                                           "must not be zero); no job was run", code=1)
    assert not (tmp / "range_step_0").exists()


SUBMITIT_JOB_GETS_SIGTERM = """
import os, signal, time
from lp_runtime import cli, jobs

signal.signal(signal.SIGTERM, lambda *a: print("bypassed", flush=True))  # submitit's handler in a job: "bypass"
jobs.submitit_rank_env()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("ran on", flush=True)
except cli.Terminated:
    print("stopped", flush=True)
"""


def test_a_submitit_job_stops_on_sigterm_as_a_single_run():
    """An lp_local sweep stopped by SIGTERM (timeout, scancel) printed "interrupted" and exit 143 while its jobs ran
    on to the end, holding their answers' locks, so the advised re-run was refused (a new user, 2026-12-07):
    submitit takes SIGTERM as a preemption to ignore. A job now stops as a single run does."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "SUBMITIT_EXECUTOR": "local",
           "RANK": "0"}  # RANK: as under torchrun, no submitit JobEnvironment needed here
    proc = subprocess.run([sys.executable, "-c", SUBMITIT_JOB_GETS_SIGTERM], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout == "stopped\n", proc.stdout + proc.stderr


def test_report_plot_of_a_run_named_in_a_script_the_font_lacks_warns_nothing(tmp_path):
    """A run named 'ä 日本' printed four matplotlib "Glyph ... missing from font(s)" warnings with their source lines
    on stderr (a new user, 2026-12-07); the figure is written, without them."""
    import warnings

    pytest.importorskip("matplotlib")
    from lp_runtime.report import plot

    rows = [{"run": "ä 日本", "step_compression": 1.5, "speedup": 1.2}, {"run": "b", "step_compression": 1.0,
                                                                        "speedup": None}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot(rows, str(tmp_path)) == str(tmp_path / "report.png")
    assert (tmp_path / "report.png").stat().st_size > 0
