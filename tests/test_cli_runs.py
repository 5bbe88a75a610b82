"""A run of the main job as a process: one run per answers file, Ctrl-C under torchrun (plain Ctrl-C and SIGTERM:
test_user_faults), prompts checked before the first question, a re-run that shows the answers, jobs of a sweep
without answers in the report.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lp_runtime.answers import AnswersLock, OutputError
from lp_runtime.generate import INTERRUPTED

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _questions(folder: Path, n: int, long_index: int = -1, long_words: int = 0) -> Path:
    q = folder / "q.jsonl"
    q.write_text("".join(json.dumps({"question_id": i, "turns": ["word " * long_words if i == long_index
                                                                  else f"Count to {i}."]}) + "\n" for i in range(n)))
    return q


def _args(model_dir: Path, questions: Path, out: Path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", "model.dtype=float32", "decoding=greedy", "dataset=jsonl",
            f"dataset.path={questions}", "generation.max_new_tokens=64", f"output.path={out}", *extra]


def _wait_for_answers(out: Path, proc: subprocess.Popen, n: int = 1, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not (out.exists() and out.read_bytes().count(b"\n") >= n):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)


def run_config(args: list[str]) -> dict:
    """The main job in this process on ``conf/generate.yaml`` + ``args`` (as the command line would compose it)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lp_runtime.cli import CONF_DIR
    from lp_runtime.generate import run

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return run(OmegaConf.to_object(compose("generate", overrides=args)))


def _ids(out: Path) -> list:
    return [json.loads(line)["question_id"] for line in out.read_text().splitlines()]


# ------------------------------------------------------------------------------ one run per answers file
def test_lock_names_its_holder_and_is_released(tmp_path):
    out = tmp_path / "answers.jsonl"
    with AnswersLock(out):
        assert (tmp_path / "answers.lock").read_text() == f"pid {os.getpid()} on host {socket.gethostname()}\n"
        with pytest.raises(OutputError) as e:  # another open of the same file: the same refusal as another process
            with AnswersLock(out):
                pass
        assert str(e.value) == (f"output path {out} is in use by another run (pid {os.getpid()} on host "
                                f"{socket.gethostname()}); wait for it to finish or choose another output.path")
    assert not (tmp_path / "answers.lock").exists()
    with AnswersLock(out):  # free again
        pass


def test_second_run_on_the_same_output_is_refused(tmp_path, tiny_model_dir):
    questions = _questions(tmp_path, 400)
    out = tmp_path / "out" / "answers.jsonl"
    args = _args(tiny_model_dir, questions, out, "progress=false")
    first = subprocess.Popen([sys.executable, "-m", "lp_runtime.generate", *args], cwd=tmp_path, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_answers(out, first)
        second = subprocess.run([sys.executable, "-m", "lp_runtime.generate", *args], cwd=tmp_path, env=ENV,
                                capture_output=True, text=True, timeout=300)
        assert first.poll() is None, "the first run ended before the second tried; give it more questions"
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert second.returncode == 2, second.stderr[-3000:]
    assert second.stderr.strip().splitlines() == [
        f"error: output path {out} is in use by another run (pid {first.pid} on host {socket.gethostname()}); "
        "wait for it to finish or choose another output.path"]
    assert first.returncode == 143, err[-3000:]
    done = _ids(out)
    assert done == list(range(len(done))) and done  # each answer once, in order: the second run wrote nothing
    assert not (tmp_path / "out" / "answers.lock").exists()  # released by the interrupted run
    # The file is free again: a third run resumes it, and every answer is still there once.
    run_config([*args, f"dataset.limit={len(done) + 2}"])
    assert _ids(out) == list(range(len(done) + 2))


# ------------------------------------------------------------------------------ Ctrl-C
def _interrupt(cmd: list[str], out: Path, cwd: Path, extra_env: dict) -> tuple[int, str]:
    """Start ``cmd`` in its own process group, press Ctrl-C (SIGINT to the group, as a terminal does) once it
    wrote its first answer; (exit status, stderr)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env={**ENV, **extra_env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _wait_for_answers(out, proc)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err


def test_ctrl_c_under_torchrun_exits_130_with_one_line(tmp_path, tiny_model_dir):
    out = tmp_path / "answers.jsonl"
    cmd = ["bash", str(REPO / "launch" / "torchrun_single_node.sh"),
           *_args(tiny_model_dir, _questions(tmp_path, 400), out), "progress=false"]
    code, err = _interrupt(cmd, out, tmp_path, {"NPROC": "1", "RUN_DIR": str(tmp_path / "run")})
    assert code == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == INTERRUPTED
    for noise in ("Traceback", "SignalException", "ChildFailedError"):
        assert noise not in err, err[-3000:]
    assert _ids(out) == list(range(len(_ids(out))))


@pytest.mark.parametrize("flag", ["-m", "--multirun"])
def test_sweep_under_torchrun_is_refused(tmp_path, flag):
    stub = tmp_path / "torchrun"  # never started
    stub.write_text("#!/usr/bin/env bash\necho started > \"$(dirname \"$0\")/started\"\n")
    stub.chmod(0o755)
    proc = subprocess.run(["bash", str(REPO / "launch" / "torchrun_single_node.sh"), flag, "decoding=greedy,lookahead"],
                          cwd=tmp_path, env={**ENV, "TORCHRUN": str(stub)}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: sweeps (-m/--multirun) and torchrun do not mix: every rank would run the whole sweep; launch torchrun "
        "once per setting, or sweep from one process with hydra/launcher=lp_local (or lp_slurm), which starts each "
        "job's ranks itself"]
    assert not (tmp_path / "started").exists()


def test_sweep_in_a_torchrun_rank_is_refused(monkeypatch):
    from lp_runtime.config import ConfigError
    from lp_runtime.jobs import TORCHRUN_SWEEP, check_torchrun_sweep

    check_torchrun_sweep(["-m", "decoding=greedy,lookahead"])  # not under torchrun: Hydra sweeps
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    check_torchrun_sweep(["decoding=greedy"])  # under torchrun, one setting
    with pytest.raises(ConfigError) as e:
        check_torchrun_sweep(["hydra.mode=MULTIRUN", "decoding=greedy,lookahead"])
    assert str(e.value) == TORCHRUN_SWEEP


# ------------------------------------------------------------------------------ before the first question
def test_over_long_prompt_is_found_before_the_first_question(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from lp_runtime.config import ConfigError
    from lp_runtime.data import Question, build_prompt
    questions = _questions(tmp_path, 3, long_index=2, long_words=1100)  # the last one: past the 1024-token context
    n = len(build_prompt(AutoTokenizer.from_pretrained(tiny_model_dir), Question(2, "default", ["word " * 1100]), []))
    out = tmp_path / "answers.jsonl"
    with pytest.raises(ConfigError) as e:
        run_config(_args(tiny_model_dir, questions, out, "progress=false"))
    assert str(e.value) == (f"question 2, turn 1: the prompt ({n} tokens) fills the model's context of 1024 tokens; "
                            "it leaves no room for a new token: shorten it; no question was answered (remove or "
                            "shorten it, then re-run)")
    assert not out.exists()
    # Resuming a file: the questions left are checked before the next is answered.
    short = _questions(tmp_path, 2)
    run_config(_args(tiny_model_dir, short, out, "progress=false"))
    assert _ids(out) == [0, 1]
    with pytest.raises(ConfigError, match=r"^question 2, turn 1: the prompt \(\d+ tokens\) fills"):
        run_config(_args(tiny_model_dir, _questions(tmp_path, 3, long_index=2, long_words=1100), out,
                         "progress=false", "dataset.limit=3"))
    assert _ids(out) == [0, 1]


# ------------------------------------------------------------------------------ a re-run shows the answers
def test_rerun_shows_the_answers_already_there(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "answers.jsonl"
    args = _args(tiny_model_dir, _questions(tmp_path, 2), out, "progress=false", "generation.max_new_tokens=8")
    run_config(args)
    texts = [json.loads(line)["choices"][0]["turns"][0] for line in out.read_text().splitlines()]
    capsys.readouterr()
    run_config(args)
    shown = capsys.readouterr().out.splitlines()
    assert shown == [f"already answered in {out}:",
                     *[f"[{i}] {(t.strip().splitlines() or [''])[0][:120]}" for i, t in enumerate(texts)],
                     f"all 2 questions of the dataset are already in {out}; nothing to do (summary kept: "
                     f"{tmp_path / 'answers.summary.json'})"]


# ------------------------------------------------------------------------------ report: jobs without answers
def _answer(qid) -> dict:
    return {"question_id": qid, "choices": [{"turns": ["x"], "output_ids": [[1, 2]], "new_tokens": [2],
                                             "decoding_steps": [2], "wall_time": [1.0], "accept_lengths": [[1, 1]]}]}


def _job(folder: Path, overrides: list[str], answered: bool) -> None:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if answered:
        (folder / "answers.jsonl").write_text(json.dumps(_answer(1)) + "\n")
        (folder / "answers.settings.json").write_text(json.dumps({"format": 1, "settings": {"x": overrides}}))


def test_report_lists_jobs_without_answers(tmp_path):
    from lp_runtime.report import ReportError, report

    _job(tmp_path / "0", ["decoding.guess_set_size=1"], answered=True)
    _job(tmp_path / "1", ["decoding.guess_set_size=-1"], answered=False)
    _job(tmp_path / "10", ["decoding.guess_set_size=9"], answered=False)
    result = report([str(tmp_path)], figure=False)
    assert result["missing"] == ["1 (decoding.guess_set_size=-1)", "10 (decoding.guess_set_size=9)"]
    assert result["text"].splitlines()[-1] == ("jobs without answers (refused, failed or not run yet): "
                                               "1 (decoding.guess_set_size=-1); 10 (decoding.guess_set_size=9)")
    # A sweep none of whose jobs answered: the error says which jobs there were.
    empty = tmp_path / "empty"
    _job(empty / "0", ["decoding.guess_set_size=-1"], answered=False)
    with pytest.raises(ReportError) as e:
        report([str(empty)], figure=False)
    assert str(e.value) == (f"{empty} holds no answers file with a summary or settings beside it; jobs without "
                            "answers: 0 (decoding.guess_set_size=-1)")
