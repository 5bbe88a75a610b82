"""The main job in this process: answers JSONL, resume, summary metrics (the command line: test_cli.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lp_runtime import metrics, models
from lp_runtime.answers import OutputError
from lp_runtime.config import (DatasetConfig, DecodingConfig, GenerationConfig, ModelConfig, OutputConfig,
                               RunConfig)

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
        decoding=DecodingConfig(method=method, window_size=2, ngram_size=3, guess_set_size=2, max_depth=10),
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
        assert set(r) == {"question_id", "category", "question_digest", "answer_id", "model_id", "choices", "tstamp"}
        # model.name plus the model's fingerprint, as README says (it was written bare; a new user, 2026-12-04)
        assert r["model_id"] == f"tiny-llama-{models.model_fingerprint(cfg.model)[:8]}"
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
    # A file labelled before the fingerprint was added (model.name bare) resumes under its own label.
    answers.write_text(lines[0].replace(records[0]["model_id"], "tiny-llama"))
    run(cfg)
    assert [r["model_id"] for r in _lines(answers)] == ["tiny-llama", "tiny-llama"]
    answers.write_text("".join(lines))

    # A question edited since it was answered was taken as answered (its old answer kept; a new user): refused,
    # the file untouched; an answer written before the digest existed is not checked.
    rows = [json.loads(line) for line in Path(cfg.dataset.path).read_text().splitlines()]
    rows[1]["turns"] = ["What is 2 + 4?"]
    Path(cfg.dataset.path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = answers.read_bytes()
    with pytest.raises(OutputError) as e:
        run(cfg)
    assert str(e.value) == (f"{answers} answers question 82 as it read then, and its text in {cfg.dataset.path} has "
                            "changed since; remove that answer's line to answer the question as it reads now, or "
                            f"write to a new output path (output.path={answers.with_name('answers-2.jsonl')})")
    assert answers.read_bytes() == before
    answers.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "question_digest"}) + "\n"
                               for r in records3))
    assert run(cfg)["num_questions"] == 2 and [r["question_id"] for r in _lines(answers)] == [81, 82]


def test_greedy_and_lookahead_answers_match(tiny_model_dir, tmp_path):
    from lp_runtime.generate import run

    (tmp_path / "g").mkdir()
    (tmp_path / "l").mkdir()
    run(_run_config(tiny_model_dir, tmp_path / "g", method="greedy"))
    run(_run_config(tiny_model_dir, tmp_path / "l", method="lookahead"))
    ids = [[r["choices"][0]["output_ids"] for r in _lines(tmp_path / d / "out" / "answers.jsonl")] for d in "gl"]
    assert ids[0] == ids[1]


def test_a_run_prints_no_loading_weights_bar(tiny_model_dir, tmp_path, capsys):
    """transformers' "Loading weights" bar appeared in every job's output (cosmetic, issue 20): the job turns
    transformers' bars off while it loads (the hub's download bars stay on where the job shows bars, ``progress``),
    and leaves both switches as they were."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    from lp_runtime import models
    from lp_runtime.generate import run

    hf_logging.enable_progress_bar()  # as a new process starts
    models.load_model(ModelConfig(path=str(tiny_model_dir)))
    assert "Loading weights" in capsys.readouterr().err  # what a job printed before
    cfg = _run_config(tiny_model_dir, tmp_path, method="greedy")
    cfg.progress = True
    run(cfg)
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "questions: 100%" in err
    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
    cfg.progress, cfg.output.path = False, str(tmp_path / "quiet" / "answers.jsonl")
    run(cfg)
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()


@pytest.mark.parametrize("qid, shown", [
    (81, "[81] Hello there"), ("writing-1", "[writing-1] Hello there"),
    # a new user (2026-12-03): an id holding a newline split the line, a 100,000-character id printed 100 KB, an
    # empty id showed as "[]"
    ("a\nb", '["a\\nb"] Hello there'), ("", '[""] Hello there'),
    ("x" * 200, '["' + "x" * 116 + '...] Hello there'),
])
def test_an_answer_is_shown_on_one_short_line(qid, shown):
    from lp_runtime.answers import first_line

    assert first_line({"question_id": qid, "choices": [{"turns": ["Hello there\nmore"]}]}) == shown


def test_sampling_model_records_the_temperature_it_applied_and_refuses_values_beside_it(tiny_model_dir, tmp_path):
    """sampling=model decoded with the model's generation_config while the answers recorded the config's
    temperature (0.0 for a sampling model, so report compared sampled answers as greedy), and a temperature given
    beside it was ignored but recorded (a new user, 2026-12-04)."""
    import shutil

    from lp_runtime.config import ConfigError, SamplingConfig
    from lp_runtime.generate import run
    from lp_runtime.report import is_greedy, load_run

    with pytest.raises(ConfigError) as err:
        SamplingConfig(from_model=True, temperature=1.5, seed=1)
    assert str(err.value) == (
        "sampling.temperature=1.5 is not allowed with sampling.from_model=true (sampling=model), which takes "
        "temperature, top_k, top_p, min_p, repetition_penalty, suppress_tokens from the model's generation_config; "
        "use sampling=model alone, or sampling=default to set them (sampling.seed applies to both)")
    sampled = tmp_path / "sampled"
    shutil.copytree(tiny_model_dir, sampled)
    gen = json.loads((sampled / "generation_config.json").read_text())
    (sampled / "generation_config.json").write_text(json.dumps({**gen, "do_sample": True, "temperature": 0.6}))
    for model_dir, want in ((tiny_model_dir, 0.0), (sampled, 0.6)):
        (tmp_path / str(want)).mkdir()
        cfg = _run_config(model_dir, tmp_path / str(want), method="greedy")
        cfg.sampling = SamplingConfig(from_model=True, seed=1)
        run(cfg)
        got = load_run(Path(cfg.output.path))
        assert [r["choices"][0]["temperature"] for r in got["records"]] == [want, want]
        assert is_greedy(got) is (want == 0.0)
        # the settings record what it applied (they said temperature 0.0, top_k 0, top_p 1.0 for the sampling model:
        # a new user, session 22), and the report shows those values in the sampling.* columns
        settings = json.loads(Path(cfg.output.path).with_suffix(".settings.json").read_text())["settings"]
        assert settings["sampling.applied.temperature"] == want and settings["sampling.temperature"] == 0.0
        assert got["settings"]["sampling.temperature"] == want and "sampling.applied.temperature" not in got["settings"]
        if want:  # generate's top_k of 50 when sampling with none set
            assert got["settings"]["sampling.top_k"] == settings["sampling.applied.top_k"] == 50
        run(cfg)  # a resume compares the applied values too, and they are the same
