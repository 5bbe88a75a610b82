"""The generate entry point: answers JSONL, resume, summary metrics, and one-line errors on bad input."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lp_runtime import metrics
from lp_runtime.config import (DatasetConfig, DecodingConfig, GenerationConfig, ModelConfig, OutputConfig,
                               RunConfig)

REPO = Path(__file__).resolve().parents[1]
CHOICE_KEYS = {"index", "turns", "output_ids", "new_tokens", "decoding_steps", "wall_time", "accept_lengths",
               "finish_reason", "seed", "temperature"}


# ---------------------------------------------------------------------------------------------- metrics

def _record(qid, new_tokens, steps, wall, accepts):
    return {"question_id": qid, "choices": [{"index": 0, "new_tokens": new_tokens, "decoding_steps": steps,
                                             "wall_time": wall, "accept_lengths": accepts}]}


def test_summarize_exact_numbers():
    records = [
        _record(1, [5, 3], [3, 2], [1.0, 0.5], [[1, 2, 2], [2, 1]]),
        _record(2, [4], [1], [0.5], [[4]]),
    ]
    assert metrics.summarize(records) == {
        "num_questions": 2,
        "num_turns": 3,
        "new_tokens": 12,
        "decoding_steps": 6,
        "wall_time": 2.0,
        "step_compression": 2.0,
        "mean_accepted_tokens": 2.0,
        "accept_length_histogram": {1: 2, 2: 3, 4: 1},
        "tokens_per_s": 6.0,
        "seconds_per_step": 2.0 / 6,
    }


def test_summarize_mean_accepted_differs_from_compression_when_lengths_do_not_sum_to_tokens():
    s = metrics.summarize([_record(1, [4], [2], [2.0], [[1, 2]])])
    assert s["step_compression"] == 2.0
    assert s["mean_accepted_tokens"] == 1.5


def test_summarize_empty_has_no_ratios():
    s = metrics.summarize([])
    assert (s["num_questions"], s["new_tokens"], s["accept_length_histogram"]) == (0, 0, {})
    assert s["step_compression"] is s["tokens_per_s"] is s["seconds_per_step"] is s["mean_accepted_tokens"] is None


def test_run_summary_has_config_and_versions():
    s = metrics.run_summary([_record(1, [2], [2], [1.0], [[1, 1]])], RunConfig(), "a.jsonl")
    assert s["answers"] == "a.jsonl" and s["step_compression"] == 1.0
    assert s["config"]["decoding"]["ngram_size"] == RunConfig().decoding.ngram_size
    assert set(s["versions"]) == {"python", "torch", "transformers", "lp_runtime"}
    json.dumps(s)  # serialisable as is


# ------------------------------------------------------------------------------------- end to end (run)

def _questions_file(path: Path) -> Path:
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["Write a haiku about the sea.", "Now make it rhyme."]},
        {"question_id": 82, "category": "math", "turns": ["What is 2 + 3?"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run_config(model_dir: Path, tmp: Path, method: str = "lookahead") -> RunConfig:
    return RunConfig(
        model=ModelConfig(name="tiny-llama", path=str(model_dir)),
        decoding=DecodingConfig(method=method, window_size=2, ngram_size=3, guess_set_size=2),
        generation=GenerationConfig(max_new_tokens=8),
        dataset=DatasetConfig(name="jsonl", path=str(_questions_file(tmp / "questions.jsonl"))),
        output=OutputConfig(path=str(tmp / "out" / "answers.jsonl")),
        progress=False,
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_writes_answers_resumes_and_trims_a_partial_line(tiny_model_dir, tmp_path):
    from lp_runtime.generate import run

    cfg = _run_config(tiny_model_dir, tmp_path)
    answers = Path(cfg.output.path)
    summary = run(cfg)

    records = _lines(answers)
    assert [r["question_id"] for r in records] == [81, 82]
    for r, num_turns in zip(records, (2, 1)):
        assert set(r) == {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
        assert r["model_id"] == "tiny-llama"
        (choice,) = r["choices"]
        assert set(choice) == CHOICE_KEYS and choice["index"] == 0
        assert choice["seed"] == 0 and choice["temperature"] == 0.0  # per question, not per turn
        for key in CHOICE_KEYS - {"index", "seed", "temperature"}:
            assert len(choice[key]) == num_turns, key
        for ids, n, steps, accepts, reason in zip(choice["output_ids"], choice["new_tokens"],
                                                  choice["decoding_steps"], choice["accept_lengths"],
                                                  choice["finish_reason"]):
            assert n == len(ids) and 1 <= n <= 8
            assert steps == len(accepts) and sum(accepts) == n
            assert reason in ("stop", "length")
    assert records[0]["category"] == "writing"
    assert summary["num_questions"] == 2 and summary["num_turns"] == 3
    assert json.loads(Path(cfg.output.resolved_summary_path).read_text())["new_tokens"] == summary["new_tokens"]

    # A second run finds everything done: nothing is appended, the summary is kept as it is (other settings are
    # refused: tests/test_sweeps.py).
    before = answers.read_bytes()
    summary_before = Path(cfg.output.resolved_summary_path).read_bytes()
    cfg.progress = True  # display only
    again = run(cfg)
    cfg.progress = False
    assert answers.read_bytes() == before
    assert Path(cfg.output.resolved_summary_path).read_bytes() == summary_before
    assert again["new_tokens"] == summary["new_tokens"] and again["num_turns"] == 3
    assert again["config"]["generation"]["max_new_tokens"] == 8

    # A killed run leaves half a line: it is cut off and that question answered again, identically (greedy).
    lines = before.decode().splitlines(keepends=True)
    answers.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    third = run(cfg)
    records3 = _lines(answers)
    assert [r["question_id"] for r in records3] == [81, 82]
    assert records3[0] == records[0]
    assert records3[1]["choices"][0]["output_ids"] == records[1]["choices"][0]["output_ids"]
    assert third["new_tokens"] == summary["new_tokens"]


def test_greedy_and_lookahead_answers_match(tiny_model_dir, tmp_path):
    from lp_runtime.generate import run

    (tmp_path / "g").mkdir()
    (tmp_path / "l").mkdir()
    run(_run_config(tiny_model_dir, tmp_path / "g", method="greedy"))
    run(_run_config(tiny_model_dir, tmp_path / "l", method="lookahead"))
    ids = [[r["choices"][0]["output_ids"] for r in _lines(tmp_path / d / "out" / "answers.jsonl")] for d in "gl"]
    assert ids[0] == ids[1]


# ------------------------------------------------------------------------------- bad input, as the CLI
# Every case below fails before a model is loaded. All run as `python -m lp_runtime.generate ...` command lines in
# one fresh interpreter (tests/cli_batch.py), each with its own files, run folder and output path under tmp/<case>.

FORMAT = 'each line must be a JSON object {{"question_id": int or str, "category": str, "turns": [str, ...]}}'
EMPTY_DATASET_MESSAGE = "dataset.path='{path}' holds no questions; " + FORMAT
BAD_LINE_MESSAGE = "{path}, line 2: not valid JSON (Expecting property name enclosed in double quotes); " + FORMAT

BAD_CONFIGS = [
    (["decoding.window_size=-1"], "decoding.window_size=-1 is negative; W must be >= 0"),
    (["decoding.ngram_size=1"], "decoding.ngram_size=1 is too small; N must be >= 2"),
    (["generation.max_new_tokens=abc"], "Error merging override generation.max_new_tokens=abc: "
                                        "Value 'abc' of type 'str' could not be converted to Integer"),
    (["decoding.windw_size=3"], "Could not override 'decoding.windw_size': "
                                "Key 'windw_size' not in 'DecodingConfig'"),
    (["dataset=jsonl"], "dataset=jsonl needs dataset.path=<question file .jsonl>"),
]


def _folder(tmp: Path, name: str) -> Path:
    (tmp / name).mkdir()
    return tmp / name


def _bad_input_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """case -> (overrides, the expected one-line error); the case's files are made under tmp/<case>."""
    from lp_runtime.data import _FORMAT

    cases = {f"bad_config_{i}": (overrides, message) for i, (overrides, message) in enumerate(BAD_CONFIGS)}
    d = _folder(tmp, "output_under_a_file")
    (d / "afile").write_text("x")
    path = d / "afile" / "answers.jsonl"
    cases[d.name] = ([f"output.path={path}", "model.path=/nonexistent"],
                     f"cannot create the folder for output path {path}: {d / 'afile'} is a file")
    d = _folder(tmp, "output_path_is_a_folder")
    cases[d.name] = ([f"output.path={d}", "model.path=/nonexistent"],
                     f"output path {d} is a folder; give a file path such as {d / 'answers.jsonl'}")
    d = _folder(tmp, "missing_model")
    cases[d.name] = (["model.path=/nonexistent", "dataset.limit=1", f"output.path={d / 'out' / 'deeper' / 'answers.jsonl'}"],
                     "model.path='/nonexistent' is not an existing folder. "
                     "Use a local folder, a HuggingFace id, or bundled:smollm2")
    d = _folder(tmp, "empty_dataset")
    (d / "empty.jsonl").write_text("")
    cases[d.name] = (["dataset=jsonl", f"dataset.path={d / 'empty.jsonl'}", "model.path=/nonexistent"],
                     EMPTY_DATASET_MESSAGE.format(path=d / "empty.jsonl"))
    d = _folder(tmp, "malformed_dataset")
    (d / "bad.jsonl").write_text('{"question_id": 1, "category": "x", "turns": ["hi"]}\n{"question_id": 2, \n')
    cases[d.name] = (["dataset=jsonl", f"dataset.path={d / 'bad.jsonl'}", "model.path=/nonexistent"],
                     BAD_LINE_MESSAGE.format(path=d / "bad.jsonl"))
    # As root os.access() says yes everywhere; /proc refuses new files even to root.
    cases["unwritable_output"] = (["output.path=/proc/lp_runtime_answers.jsonl", "model.path=/nonexistent"],
                                  "output path /proc/lp_runtime_answers.jsonl is not writable: No such file or directory")
    for name, overrides, message in _summary_path_cases(tmp) + _auto_and_sweep_cases(tmp):
        cases[name] = (overrides, message)
    d = _folder(tmp, "dataset_path_is_a_folder")
    cases[d.name] = (["dataset=jsonl", f"dataset.path={d}", "model.path=/nonexistent"],
                     f"dataset.path={str(d)!r} is a folder; give a question file in JSONL format ({_FORMAT})")
    return cases


def _summary_path_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """A summary path that would overwrite the answers, the questions or a file of the user's."""
    out = []
    d = _folder(tmp, "summary_is_the_answers_file")
    a = d / "answers.jsonl"
    out.append((d.name, [f"output.path={a}", f"output.summary_path={a}", "model.path=/nonexistent"],
                f"output.summary_path={a} is the answers file (output.path); the summary would overwrite it: give "
                f"another file, e.g. output.summary_path={d / 'answers.summary.json'}"))
    d = _folder(tmp, "summary_is_the_question_file")
    (d / "q.jsonl").write_text('{"question_id": 1, "turns": ["hi"]}\n')
    out.append((d.name, ["dataset=jsonl", f"dataset.path={d / 'q.jsonl'}", f"output.path={d / 'a.jsonl'}",
                         f"output.summary_path={d / 'q.jsonl'}", "model.path=/nonexistent"],
                f"output.summary_path={d / 'q.jsonl'} is the question file (dataset.path); the summary would "
                f"overwrite it: give another file, e.g. output.summary_path={d / 'a.summary.json'}"))
    d = _folder(tmp, "summary_is_another_file")
    (d / "notes.txt").write_text("mine\n")
    out.append((d.name, [f"output.summary_path={d / 'notes.txt'}", "model.path=/nonexistent"],
                f"output.summary_path={d / 'notes.txt'} exists and is not a run summary; the summary would overwrite "
                f"it: give another file, e.g. output.summary_path={d / 'out' / 'answers.summary.json'}"))
    return out


def _auto_and_sweep_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """Settings decoding=auto would ignore; sweeps with a bad job (checked before job 0 runs)."""
    out = [("auto_window", ["decoding.window_size=7"],
            "decoding.window_size=7 is ignored under decoding=auto, which chooses W itself from this machine's "
            "latency curve; add decoding=lookahead to run decoding.window_size=7"),
           ("auto_pool", ["decoding.pool_from_prompt=false"],
            "decoding.pool_from_prompt=false is ignored under decoding=auto, which always seeds the n-gram pool from "
            "the prompt; add decoding=lookahead to run decoding.pool_from_prompt=false")]
    for name, sweep, message in [
        ("sweep_bad_last_job", ["decoding=lookahead", "decoding.guess_set_size=1,-1"],
         "sweep job 1 (decoding.guess_set_size=-1): decoding.guess_set_size=-1 is negative; G must be >= 0"),
        ("sweep_auto_key", ["decoding.window_size=0,3"],
         "sweep job 0 (decoding.window_size=0): decoding.window_size=0 is ignored under decoding=auto, which chooses "
         "W itself from this machine's latency curve; add decoding=lookahead to run decoding.window_size=0"),
    ]:
        d = _folder(tmp, name)
        out.append((name, ["-m", *sweep, f"hydra.sweep.dir={d / 'sweep'}", "model.path=/nonexistent",
                           f"output.path={d}/${{hydra:job.num}}/answers.jsonl"], message + "; no job was run"))
    return out


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory):
    """case -> (the case's folder, the CLI's result, the expected one-line error)."""
    from cli_batch import run_cli

    tmp = tmp_path_factory.mktemp("cli")
    cases = _bad_input_cases(tmp)
    calls = []
    for name, (overrides, _) in cases.items():
        (tmp / name).mkdir(exist_ok=True)
        flags = [o for o in overrides if o == "-m"]  # Hydra's flags go before the overrides
        args = [*flags, f"hydra.run.dir={tmp / name / 'hydra'}", "progress=false", *[o for o in overrides if o != "-m"]]
        if not any(a.startswith("output.path=") for a in overrides):
            args.append(f"output.path={tmp / name / 'out' / 'answers.jsonl'}")
        calls.append(args)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("HYDRA_FULL_ERROR", None)
    results = run_cli(calls, env)
    return {name: (tmp / name, res, message) for (name, (_, message)), res in zip(cases.items(), results)}


def _assert_fails_with(result: subprocess.CompletedProcess, message: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"error: {message}"]


def _check(bad_input, case: str) -> Path:
    folder, result, message = bad_input[case]
    _assert_fails_with(result, message)
    return folder


@pytest.mark.parametrize("case", [f"bad_config_{i}" for i in range(len(BAD_CONFIGS))],
                         ids=[o[0] for o, _ in BAD_CONFIGS])
def test_bad_config_fails_in_one_line(bad_input, case):
    _check(bad_input, case)


def test_output_under_a_file_fails_before_loading_the_model(bad_input):
    _check(bad_input, "output_under_a_file")


def test_output_path_is_a_folder(bad_input):
    _check(bad_input, "output_path_is_a_folder")


def test_missing_model_fails_in_one_line(bad_input):
    folder = _check(bad_input, "missing_model")
    assert not (folder / "out").exists()  # no empty answers file, summary or folder left behind


def test_empty_dataset_fails_before_loading_the_model(bad_input):
    _check(bad_input, "empty_dataset")


def test_malformed_dataset_line_fails_before_loading_the_model(bad_input):
    _check(bad_input, "malformed_dataset")


def test_unwritable_output_fails_before_loading_the_model(bad_input):
    _check(bad_input, "unwritable_output")


def test_dataset_path_is_a_folder(bad_input):
    _check(bad_input, "dataset_path_is_a_folder")


@pytest.mark.parametrize("case", ["summary_is_the_answers_file", "summary_is_the_question_file",
                                  "summary_is_another_file"])
def test_summary_path_that_would_overwrite_another_file(bad_input, case):
    folder = _check(bad_input, case)
    assert {p.name: p.read_text() for p in folder.iterdir() if p.is_file()} == {
        "summary_is_the_answers_file": {},
        "summary_is_the_question_file": {"q.jsonl": '{"question_id": 1, "turns": ["hi"]}\n'},
        "summary_is_another_file": {"notes.txt": "mine\n"}}[case]  # left as they were, nothing new


@pytest.mark.parametrize("case", ["auto_window", "auto_pool"])
def test_setting_that_auto_ignores_is_refused(bad_input, case):
    _check(bad_input, case)


@pytest.mark.parametrize("case", ["sweep_bad_last_job", "sweep_auto_key"])
def test_sweep_checks_every_job_before_the_first(bad_input, case):
    folder = _check(bad_input, case)
    assert sorted(p.name for p in folder.iterdir()) == []  # no sweep folder, no job folder, no answers
