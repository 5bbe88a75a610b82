"""The command line, end to end: every refusal as one line (exit 2, no new file or folder), a run's answers
file (one run at a time, resume, a re-run that shows the answers), prompts checked before the first question,
Ctrl-C and SIGTERM (plain and under torchrun), sweeps and torchrun, the launch scripts, the report over a sweep.

The refusals run as command lines in ONE fresh interpreter (tests/cli_batch.py): each fails before a model loads,
so a process apiece would spend its time importing torch; a --multirun sweep (Hydra's own launcher, two jobs on the
tiny model) is that batch's last command line. The rest are real processes on the tiny model.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cli_batch import Call
from lp_runtime.answers import AnswersLock, OutputError
from lp_runtime.generate import INTERRUPTED

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _questions(folder: Path, n: int, long_index: int = -1, long_words: int = 0) -> Path:
    q = folder / "q.jsonl"
    q.write_text("".join(json.dumps({"question_id": i, "turns": ["word " * long_words if i == long_index
                                                                  else f"Count to {i}."]}) + "\n" for i in range(n)))
    return q


def _args(model_dir: Path, questions: Path, out: Path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", "model.dtype=float32", "decoding=greedy", "dataset=jsonl",
            f"dataset.path={questions}", "generation.max_new_tokens=64", f"output.path={out}", *extra]


def _lines(out: Path) -> int:
    try:
        return out.read_bytes().count(b"\n")
    except FileNotFoundError:  # the run's writability probe creates and removes the file before its first answer
        return 0


def _wait_for_answers(out: Path, proc: subprocess.Popen, n: int = 1, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while _lines(out) < n:
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


def test_a_folder_removed_between_check_and_open_is_made_again(tmp_path):
    """A run started at the same time removes the folders its own output check made; the lock and the check make
    the folder again and open once more (answers._making_folder), and a second failure is the caller's."""
    from lp_runtime.answers import _making_folder

    path, calls = tmp_path / "gone" / "answers.lock", []

    def create():
        calls.append(path.parent.is_dir())
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    os.close(_making_folder(path, create))
    assert calls == [False, True] and path.is_file()
    with pytest.raises(FileNotFoundError):
        _making_folder(path, lambda: open(tmp_path / "other" / "deeper" / "x", "a"))


def test_an_output_in_use_stops_every_rank_at_once(tmp_path, tiny_model_dir):
    """Two ranks started as a launcher that does not stop the others when one fails starts them (lp_local's tasks;
    torchrun's variables), their answers file held by another run: rank 0 refused at once, and rank 1 waited in the
    rendezvous for rank 0 until its timeout (2 x 120 s under lp_local). Rank 0's refusal now reaches every rank in a
    broadcast: both exit 2 with its line, within seconds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = tmp_path / "answers.jsonl"
    args = _args(tiny_model_dir, _questions(tmp_path, 1), out, "parallel=lp2", "parallel.backend=gloo",
                 "parallel.timeout_s=90", f"hydra.run.dir={tmp_path / 'run'}", "progress=false")
    with AnswersLock(out):
        procs = [subprocess.Popen([PY, "-m", "lp_runtime.generate", *args], cwd=tmp_path, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env={**ENV, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}) for r in (0, 1)]
        try:
            ended = [procs[0].communicate(timeout=120), procs[1].communicate(timeout=30)]  # was: 90 s more
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    line = (f"error: output path {out} is in use by another run (pid {os.getpid()} on host {socket.gethostname()}); "
            "wait for it to finish or choose another output.path")
    assert [(p.returncode, err.splitlines()) for p, (_, err) in zip(procs, ended)] == [(2, [line])] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl"]  # no answers, no run folder, the lock released


def test_second_run_is_refused_and_sigterm_keeps_complete_lines_and_resumes(tmp_path, tiny_model_dir, capsys):
    """A run holding its answers file: a second run on the same output is refused in one line; SIGTERM then stops
    the first with exit 143 and one line of its own (not on the progress bar's), every line it wrote complete; the
    same command resumes, and a re-run shows the answers already there. (One run for both checks.)"""
    questions = _questions(tmp_path, 40)
    out = tmp_path / "out" / "answers.jsonl"
    args = _args(tiny_model_dir, questions, out, "progress=true")
    first = subprocess.Popen([sys.executable, "-m", "lp_runtime.generate", *args], cwd=tmp_path, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_answers(out, first)
        first.send_signal(signal.SIGSTOP)  # paused mid-run, holding the file: no race, no CPU taken meanwhile
        second = subprocess.run([sys.executable, "-m", "lp_runtime.generate", *args], cwd=tmp_path, env=ENV,
                                capture_output=True, text=True, timeout=300)
    finally:
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert second.returncode == 2, second.stderr[-3000:]
    assert second.stderr.strip().splitlines() == [
        f"error: output path {out} is in use by another run (pid {first.pid} on host {socket.gethostname()}); "
        "wait for it to finish or choose another output.path"]
    assert first.returncode == 143, err[-3000:]
    assert err.endswith("\ninterrupted; the answers written so far are complete: re-run the same command to "
                        "resume\n")  # on a line of its own, not on the progress bar's
    assert "questions:" in err and "Traceback" not in err  # the bar was there
    done = _ids(out)
    assert done == list(range(len(done))) and 1 <= len(done) < 40  # each answer once, in order; stopped part-way
    assert not (tmp_path / "out" / "answers.lock").exists()  # released by the interrupted run
    # The file is free again: the same command resumes it, and every answer is still there once (the interrupted
    # run's lines were complete).
    run_config([*args, f"dataset.limit={len(done) + 2}"])
    assert _ids(out) == list(range(len(done) + 2))
    capsys.readouterr()
    run_config([*args, "dataset.limit=1"])
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == f"already answered in {out}:" and shown[1].startswith("[0] ")  # the answer in the file
    assert shown[2:] == [f"the 1 question asked (dataset.limit=1) is already in {out}; nothing to do "
                         f"(summary kept: {tmp_path / 'out' / 'answers.summary.json'})"]


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


def _stub_torchrun(folder: Path) -> Path:
    """A torchrun that is never to start: it leaves ``started`` beside itself if it does."""
    stub = folder / "torchrun"
    stub.write_text("#!/usr/bin/env bash\necho started > \"$(dirname \"$0\")/started\"\n")
    stub.chmod(0o755)
    return stub


@pytest.mark.parametrize("script, var, value", [("torchrun_single_node.sh", "NPROC", "0"),
                                               ("torchrun_single_node.sh", "NPROC", "abc"),
                                               ("slurm_single_node.sbatch", "NPROC_PER_NODE", "two"),
                                               ("slurm_multi_node.sbatch", "NPROC_PER_NODE", "0")])
def test_a_rank_count_that_is_not_a_positive_integer_is_refused(tmp_path, script, var, value):
    """NPROC=0 gave torchrun's AssertionError traceback, NPROC=abc its ValueError (a new user, 2026-12-02). The
    Slurm scripts get Slurm's variables (their own check passes) and stop at the rank count."""
    stub = _stub_torchrun(tmp_path)
    env = {**ENV, var: value, "TORCHRUN": str(stub), "LP_RUNTIME_TORCHRUN": str(stub), "SLURM_JOB_ID": "t",
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[01-02]", "LP_RUNTIME_SRUN": ""}
    proc = subprocess.run(["bash", str(REPO / "launch" / script), "dataset.limit=1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    what = ("give the number of ranks, an integer >= 1 (e.g. NPROC=2)" if var == "NPROC" else
            f"give the ranks of {'each' if 'multi' in script else 'this'} node, an integer >= 1")
    assert proc.returncode == 2 and proc.stderr.splitlines() == [f"error: {var}={value} is not allowed; {what}"]
    assert not (tmp_path / "started").exists() and not (tmp_path / "outputs").exists()


# NPROC_PER_NODE named: following the hint without it started 8 ranks on a 2-core machine (a new user, 2026-12-07)
@pytest.mark.parametrize("script", ["torchrun_single_node.sh", "slurm_single_node.sbatch"])
def test_a_hydra_flag_given_first_to_a_launch_script_stays_before_its_overrides(tmp_path, script):
    """``launch/torchrun_single_node.sh --cfg job decoding=greedy`` was refused ("--cfg job stands between
    overrides"): the script put its hydra.run.dir before the user's arguments, flag included (a review, 2026-12-05).
    The stub torchrun records the arguments it is given (``-cn generate``: a flag that runs the job)."""
    stub = tmp_path / "torchrun"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$(dirname "$0")/args"\n')
    stub.chmod(0o755)
    env = {**ENV, "TORCHRUN": str(stub), "LP_RUNTIME_TORCHRUN": str(stub), "SLURM_JOB_ID": "local",
           "NPROC_PER_NODE": "1", "RUN_DIR": "run"}
    proc = subprocess.run(["bash", str(REPO / "launch" / script), "-cn", "generate", "decoding=greedy"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / "args").read_text().splitlines()
    ours = ["hydra.run.dir=run"] if script.startswith("torchrun") else ["parallel.lp=1", "hydra.run.dir=run"]
    assert args[args.index("lp_runtime.generate") + 1:] == ["-cn", "generate", *ours, "decoding=greedy"]


@pytest.mark.parametrize("args", [["--cfg", "job", "parallel.lp=2"], ["parallel.lp=2", "--cfg", "job"]])
def test_a_flag_that_prints_the_config_runs_once_not_once_a_rank(tmp_path, args):
    """``NPROC=2 launch/torchrun_single_node.sh --cfg job parallel.lp=2`` printed the job's config twice, one copy a
    rank run together: not one YAML document (a new user, 2026-12-07); so did the flag after the overrides (a
    review). It runs in one process; torchrun is a stub that would fail."""
    env = {**ENV, "TORCHRUN": "/bin/false", "NPROC": "2", "RUN_DIR": "run"}
    proc = subprocess.run(["bash", str(REPO / "launch" / "torchrun_single_node.sh"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)  # one document: a key repeated would not load as this
    assert config["parallel"]["lp"] == 2 and proc.stdout.count("\nparallel:") == 1 and not list(tmp_path.iterdir())


SINGLE_HINT = ("(to run it here without Slurm: set NPROC_PER_NODE=<ranks> (default 8) and SLURM_JOB_ID=local or "
               "RUN_DIR=<run folder>)")
MULTI_HINT = ("(a one-node test here without Slurm: set NPROC_PER_NODE=<ranks> (default 8) SLURM_JOB_ID=local "
              "SLURM_NNODES=1 HEAD_NODE=127.0.0.1 LP_RUNTIME_SRUN=)")


@pytest.mark.parametrize("script, given, missing, hint", [
    ("slurm_single_node.sbatch", {}, "SLURM_JOB_ID is", SINGLE_HINT),
    ("slurm_multi_node.sbatch", {}, "SLURM_JOB_ID, SLURM_NNODES, SLURM_JOB_NODELIST are", MULTI_HINT),
    ("slurm_multi_node.sbatch", {"HEAD_NODE": "node1"}, "SLURM_JOB_ID, SLURM_NNODES are", MULTI_HINT),
    ("slurm_multi_node.sbatch", {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]"}, "SLURM_NNODES is",
     MULTI_HINT)])
def test_a_slurm_script_run_outside_slurm_is_one_line(tmp_path, script, given, missing, hint):
    """`bash launch/slurm_*.sbatch` (not sbatch): bash's 'SLURM_JOB_ID: set SLURM_JOB_ID (sbatch does)', exit 1, after
    the rank count was checked; now the missing variables and the sbatch command line, exit 2, nothing started."""
    stub = _stub_torchrun(tmp_path)
    env = {k: v for k, v in ENV.items() if not k.startswith(("SLURM_", "LP_RUNTIME_")) and k not in (
        "RUN_DIR", "HEAD_NODE", "NPROC_PER_NODE")}
    env.update(given, LP_RUNTIME_TORCHRUN=str(stub), NPROC_PER_NODE="none")  # the rank count is checked after
    path = REPO / "launch" / script
    proc = subprocess.run(["bash", str(path), "model=tiny", "model.name=a (b)"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"error: {missing} not set, so this is not a Slurm job; submit it with: sbatch {path} model=tiny "
        rf"model.name=a\ \(b\) {hint}"], proc.stderr
    assert not (tmp_path / "started").exists() and not (tmp_path / "outputs").exists()


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


def test_decoding_auto_with_an_unwritable_cache_folder_is_one_line_before_measuring(bad_input):
    """LP_RUNTIME_CACHE=/proc/... (no new folder there, even for root): decoding=auto measured the latency curve,
    then saving it was a traceback (a new user). Now one line, exit 2, no answers file. (A command line of the
    bad-input batch, with that LP_RUNTIME_CACHE for it alone: a process of its own paid ~8 s of start-up.)"""
    folder, res, _ = bad_input["auto_unwritable_cache"]
    assert res.returncode == 2 and res.stderr.splitlines() == [
        "error: the cache folder /proc/lp-runtime-test/tuner, where decoding=auto keeps this machine's latency "
        "profiles, cannot be written (cannot make /proc/lp-runtime-test: No such file or directory); set "
        "LP_RUNTIME_CACHE to a writable folder"], res.stderr[-3000:]
    assert "measuring" not in res.stdout and not (folder / "answers.jsonl").exists()


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
    # a summary a Ctrl-C left behind (it counts 1 of the 2 answers): a run with nothing to do counts it again from the
    # answers (a new user: a later run that answered nothing kept the stale summary), keeping the other entries
    path = tmp_path / "answers.summary.json"
    whole = json.loads(path.read_text())
    path.write_text(json.dumps({**whole, "num_questions": 1, "new_tokens": 1, "note": "kept"}))
    run_config(args)
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"all 2 questions of the dataset are already in {out}; nothing to do (summary counted again from the "
        f"answers: {path})")
    assert json.loads(path.read_text()) == {**whole, "note": "kept"}


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


def test_report_names_a_lone_job_by_its_folder_and_notes_a_run_still_writing(tmp_path):
    """A sweep with one answered job was reported as "answers.jsonl (baseline)", and a run still writing its file
    gave a table without a word of it (a new user, 2026-12-04)."""
    from lp_runtime.answers import AnswersLock
    from lp_runtime.report import report

    _job(tmp_path / "0", ["decoding.guess_set_size=1"], answered=True)
    _job(tmp_path / "1", ["decoding.guess_set_size=2"], answered=False)
    assert [r["run"] for r in report([str(tmp_path)], figure=False)["rows"]] == ["0"]
    path = tmp_path / "0" / "answers.jsonl"
    with AnswersLock(path):  # as a running job holds it
        text = report([str(tmp_path)], figure=False)["text"]
    assert (f"still being written by a running job, counted as far as written: {path} (pid {os.getpid()} on host "
            f"{socket.gethostname()})") in text.splitlines()
    assert "still being written" not in report([str(tmp_path)], figure=False)["text"]


def test_report_notes_an_answers_file_whose_last_line_was_cut(tmp_path):
    from lp_runtime.report import report

    _job(tmp_path / "0", ["decoding.guess_set_size=1"], answered=True)
    result = report([str(tmp_path)], figure=False)
    assert "cut off" not in result["text"] and result["rows"][0]["questions"] == 1
    path = tmp_path / "0" / "answers.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(_answer(2))[:30])  # a run killed while writing its second answer
    result = report([str(tmp_path)], figure=False)
    assert result["rows"][0]["questions"] == 1
    assert result["text"].splitlines()[-1] == (f"the last line of {path} was cut off (a run stopped while writing "
                                               "it) and is not counted: re-run that job to finish it")


def test_report_refuses_an_empty_answers_file_and_a_file_for_out(tmp_path):
    """A new user's finds (2026-12-02): an empty file became a "0 0 -" baseline row with the report written beside
    it, and --out naming a file gave "[Errno 17] File exists"; neither may write anything."""
    from lp_runtime.report import ReportError, report

    _job(tmp_path / "0", ["decoding.guess_set_size=1"], answered=True)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "afile").write_text("mine\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    for paths, out, message in [
        ([tmp_path / "empty.jsonl"], None,
         f"{tmp_path / 'empty.jsonl'} holds no answers; give answers files of python -m lp_runtime.generate"),
        ([tmp_path / "0"], tmp_path / "afile",
         f"--out {tmp_path / 'afile'}: {tmp_path / 'afile'} is a file; give a folder for report.csv/.json/.md/.png"),
        ([tmp_path / "0"], tmp_path / "afile" / "sub",
         f"--out {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is a file; give a folder for "
         "report.csv/.json/.md/.png"),
        ([tmp_path / "0"], Path("/dev/null"),  # a device (session 22: it was called "a file")
         "--out /dev/null: /dev/null is not a folder; give a folder for report.csv/.json/.md/.png"),
        ([tmp_path / "nosuch.jsonl"], None, f"{tmp_path / 'nosuch.jsonl'} does not exist; give answers files of "
                                            "python -m lp_runtime.generate, or a folder holding them"),
    ]:
        with pytest.raises(ReportError) as e:
            report([str(p) for p in paths], out_dir=out and str(out), figure=False)
        assert str(e.value) == message
    assert sorted(p.name for p in tmp_path.iterdir()) == before and (tmp_path / "afile").read_text() == "mine\n"
    # one file named two ways is one run (it made two rows)
    a = tmp_path / "0" / "answers.jsonl"
    rows = report([str(a), os.path.relpath(a)], out_dir=str(tmp_path / "r"), figure=False)["rows"]
    assert len(rows) == 1


def test_report_names_every_path_that_holds_no_run(tmp_path):
    """Several PATHs without a run (a new user's typos) were refused one at a time, naming the first: one line names
    them all, up to 5 and a count of the rest, and the empty answers files among several likewise."""
    from lp_runtime.report import ReportError, report

    _job(tmp_path / "0", ["decoding.guess_set_size=1"], answered=True)
    (tmp_path / "none").mkdir()
    for name in ("e1", "e2"):
        (tmp_path / f"{name}.jsonl").write_text("")
    good, none, advice = str(tmp_path / "0"), tmp_path / "none", ("give answers files of python -m "
                                                                 "lp_runtime.generate, or a folder holding them")
    for paths, message in [
        ([tmp_path / "nosuch", good, none, "/dev/null"],
         f"3 PATHs hold no run: {tmp_path / 'nosuch'} does not exist; {none} holds no answers file with a summary or "
         f"settings beside it; /dev/null is neither an answers file nor a folder; {advice}"),
        ([tmp_path / f"n{i}" for i in range(7)],
         "7 PATHs hold no run: " + "; ".join(f"{tmp_path / f'n{i}'} does not exist" for i in range(5))
         + f"; and 2 more; {advice}"),
        ([good, tmp_path / "e1.jsonl", tmp_path / "e2.jsonl"],
         f"2 answers files are empty: {tmp_path / 'e1.jsonl'} holds no answers; {tmp_path / 'e2.jsonl'} holds no "
         "answers; give answers files of python -m lp_runtime.generate"),
    ]:
        with pytest.raises(ReportError) as e:
            report([str(p) for p in paths], figure=False)
        assert str(e.value) == message


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no folder can be made")
def test_report_names_an_out_it_cannot_write(tmp_path, capsys):
    """A new user's find (2026-12-02): --out /proc/foo gave "[Errno 2] No such file or directory: '/proc/foo'",
    naming no option."""
    from lp_runtime.report import main

    _job(tmp_path / "0", ["decoding.guess_set_size=1"], answered=True)
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "0"), "--out", "/proc/lp_runtime_no_such_folder", "--no-figure"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("error: --out /proc/lp_runtime_no_such_folder: cannot write there: No such file "
                                       "or directory; give --out a folder you can write\n")


def test_report_names_the_default_folder_it_cannot_write(tmp_path):
    """Without --out the report goes to the first PATH's folder: a file there that cannot be written (here a folder
    named report.csv) is named, with that folder and how to write elsewhere."""
    from lp_runtime.report import ReportError, report

    _job(tmp_path / "0", ["decoding.guess_set_size=1"], answered=True)
    (tmp_path / "0" / "report.csv").mkdir()
    with pytest.raises(ReportError) as e:
        report([str(tmp_path / "0")], figure=False)
    assert str(e.value) == (f"{tmp_path / '0'} (the first PATH's folder, where the report goes without --out): cannot "
                            "write report.csv there: Is a directory; give --out a folder you can write")


# ------------------------------------------------------------------------------ SIGTERM like Ctrl-C; resume; the count
RUN_FOLDER_CASES = ["run_folders", "run_folders_own"]  # in the bad-input batch, in this order


def test_runs_that_answer_nothing_leave_no_run_folder(tmp_path, tiny_model_dir, bad_input):
    """Ctrl-C before the first answer (here while torch is imported, the run folder made) and a re-run that finds
    every question answered leave no outputs/hydra/<time>/ behind; the run that answered keeps its own."""
    (tmp_path / "q.jsonl").write_text('{"question_id": 1, "turns": ["Count to 3."]}\n')
    out = tmp_path / "out" / "answers.jsonl"
    cmd = [PY, "-m", "lp_runtime.generate", f"model.path={tiny_model_dir}", "model.dtype=float32",
           "decoding=greedy", "dataset=jsonl", "dataset.path=q.jsonl", "generation.max_new_tokens=4",
           f"output.path={out}", "progress=false"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # Ctrl-C's default action in the run: a job started in the background (a CI runner's `cmd &`) inherits SIGINT
    # ignored, and Python then leaves it ignored (a clean-clone .ci/run started that way failed here with exit 0).
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not list(tmp_path.glob("outputs/hydra/*/.hydra/overrides.yaml")) and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # Hydra has called the job, which imports torch for seconds
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    # -2: the process ended by SIGINT after printing the line (7 of 81 Ctrl-Cs at 0-3 s, 2026-12-04; cause not
    # traced, likely CPython's exit after a KeyboardInterrupt inside code a C extension ran); a shell shows 130.
    assert proc.returncode in (130, -signal.SIGINT) and err.splitlines()[-1] == INTERRUPTED, err[-2000:]
    assert not out.exists() and not (tmp_path / "outputs").exists()  # nothing answered: no folder left
    # The same command answers the question in a fixed run folder (kept), finds it answered in a run folder of its
    # own (removed): two command lines of the bad-input batch, in its folder run_folders, where a process apiece
    # would pay its start-up; then here, in a process of its own (a run keeps a folder made before it started),
    # finds it answered in the fixed folder (an earlier run's: kept).
    folder = bad_input["run_folders"][0]
    out = folder / "out" / "answers.jsonl"
    again = subprocess.run(cmd[:-2] + [f"output.path={out}", "progress=false", "hydra.run.dir=outputs/hydra/fixed"],
                           cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    for done in [bad_input[case][1] for case in RUN_FOLDER_CASES] + [again]:
        assert done.returncode == 0, done.stderr[-2000:]
    assert [p.name for p in (folder / "outputs" / "hydra").iterdir()] == ["fixed"]
    assert (folder / "outputs" / "hydra" / "fixed" / ".hydra" / "config.yaml").is_file()
    for done in (bad_input[RUN_FOLDER_CASES[1]][1], again):
        assert done.stdout.splitlines()[0] == f"already answered in {out}:"
    assert len(out.read_text().splitlines()) == 1


def test_ctrl_c_under_torchrun_shows_only_rank0s_line():
    """launch/until_interrupted.py on what torchrun 2.13 writes after Ctrl-C (lines copied from a gloo run of 2
    ranks): the progress bar and rank 0's line pass; torchrun's own lines about the signal, before and after it,
    are dropped; exit 130."""
    torchrun = (
        "questions:   3%|3         | 2/60 [00:00<00:19,  3.04q/s]\r"
        "questions:   3%|3         | 2/60 [00:01<00:23,  2.49q/s]\n"
        "W1202 04:42:09.292000 9387 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 9452 "
        "closing signal SIGINT\n"
        "W1202 04:42:09.292000 9387 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 9453 "
        "closing signal SIGINT\n"
        f"{INTERRUPTED}\n"
        "Traceback (most recent call last):\n  ...\ntorch.distributed.elastic.multiprocessing.api.SignalException: "
        "Process 9387 got signal: 2\n")
    proc = subprocess.run([PY, str(REPO / "launch" / "until_interrupted.py")], input=torchrun.encode(),
                          capture_output=True, timeout=60)
    assert proc.returncode == 130
    assert proc.stderr.decode().split("\n") == [
        "questions:   3%|3         | 2/60 [00:00<00:19,  3.04q/s]\r"
        "questions:   3%|3         | 2/60 [00:01<00:23,  2.49q/s]", INTERRUPTED, ""]


def test_ctrl_c_as_the_ranks_end_is_the_interrupted_line_not_torchruns_traceback():
    """Ctrl-C reaching torchrun after its ranks wrote the summary: torchrun's SignalException traceback and exit 1
    under launch/torchrun_single_node.sh (a new user, 2026-12-07). The traceback becomes the interrupted line, exit
    130; a rank's own traceback still passes."""
    ending = ("summary: outputs/a.summary.json\n"
              "W1207 10:40:01.000000 1 torch/distributed/elastic/agent/server/api.py:719] Received 2 death signal, "
              "shutting down workers\n"
              'Traceback (most recent call last):\n  File "/x/bin/torchrun", line 8, in <module>\n    sys.exit(main())\n'
              "torch.distributed.elastic.multiprocessing.api.SignalException: Process 27344 got signal: 2\n")
    def filtered(text: str) -> tuple[int, str]:
        proc = subprocess.run([PY, str(REPO / "launch" / "until_interrupted.py")], input=text.encode(),
                              capture_output=True, timeout=60)
        return proc.returncode, proc.stderr.decode()

    assert filtered(ending) == (130, f"summary: outputs/a.summary.json\n{INTERRUPTED}\n")
    chained = ending.replace("signal: 2", "signal: 15") + (  # SIGTERM, then a second one as torchrun shut down
        "\nDuring handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File \"/x/bin/torchrun\", line 8, in <module>\n"
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 27344 got signal: 15\n")
    assert filtered(chained) == (143, f"summary: outputs/a.summary.json\n{INTERRUPTED}\n")
    rank = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: boom\nafter\n'
    assert filtered(rank) == (0, rank)


# What torchrun 2.13 printed (gloo, 2 ranks, 2026-12-03) after rank 1 was killed with SIGKILL mid-run, from its
# "failed" line on; it stopped rank 0 with SIGTERM.
KILLED_REPORT = "\n".join([
    "E1203 14:44:40.838000 1932 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
    "local_rank: 1 (pid: 1943) of binary: /work/main/.venv/bin/python",
    "Traceback (most recent call last):", '  File "/work/main/.venv/bin/torchrun", line 8, in <module>',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 54, "lp_runtime.generate FAILED",
    "-" * 54, "Failures:", "[1]:", "  time      : 2026-12-03_14:44:40", "  host      : localhost",
    "  rank      : 0 (local_rank: 0)", "  exitcode  : -15 (pid: 1942)  (SIGTERM)", "  error_file: <N/A>",
    "  traceback : Signal 15 (SIGTERM) received by PID 1942", "-" * 54, "Root Cause (first observed failure):",
    "[0]:", "  time      : 2026-12-03_14:44:40", "  host      : localhost", "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -9 (pid: 1943)  (SIGKILL)", "  error_file: <N/A>",
    "  traceback : Signal 9 (SIGKILL) received by PID 1943", "=" * 54, ""])
RESUME = "the answers written so far are complete: re-run the same command to resume"
PEER_LINE = ("error: rank 0: all_gather failed (a peer rank died, or did not reach it within the 120.0 s timeout "
             "parallel.timeout_s): RuntimeError: Connection reset by peer; " + RESUME)
KILLED_LINE = ("error: rank 1 was killed by signal 9 (SIGKILL: kill -9, or the kernel's out-of-memory killer) and "
               "torchrun stopped the other ranks; " + RESUME)


@pytest.mark.parametrize("before", [
    "",  # torchrun saw the death first and stopped rank 0 before it printed anything
    INTERRUPTED + "\n",  # rank 0 took torchrun's SIGTERM for an interrupt (was shown, with exit 130: a new user)
    PEER_LINE + "\n" + PEER_LINE.replace("rank 0", "rank 1") + "\n",  # rank 0's all-gather failed first
])
def test_a_rank_killed_by_a_signal_is_named_in_one_line_and_exit_1(before):
    """A rank killed with SIGKILL mid-run under torchrun (a new user, 2026-12-03): whatever the survivors printed,
    the one line names the killed rank and its signal, from torchrun's report, exit 1."""
    torchrun = "questions:   3%|3         | 2/60 [00:01<00:23,  2.49q/s]\n" + before + KILLED_REPORT
    proc = subprocess.run([PY, str(REPO / "launch" / "until_interrupted.py")], input=torchrun.encode(),
                          capture_output=True, timeout=60)
    assert (proc.returncode, proc.stderr.decode().splitlines()) == (
        1, ["questions:   3%|3         | 2/60 [00:01<00:23,  2.49q/s]", KILLED_LINE])


def test_the_line_after_a_progress_bar_starts_a_line_of_its_own():
    """A rank killed while rank 0's bar was drawn: "questions:  33%|...| 1/3 [...]error: rank 0 was killed ..." on
    one line (a new user, 2026-12-07). The filter shows the bar at a pause, then the line on a line of its own."""
    bar = "questions:  33%|###3      | 1/3 [00:04<00:08,  4.42s/q]"
    proc = subprocess.Popen([PY, str(REPO / "launch" / "until_interrupted.py")], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdin.write(bar.encode())
    proc.stdin.flush()
    time.sleep(0.5)  # the filter's 50 ms pause: it shows the partial line
    proc.stdin.write(KILLED_REPORT.encode())
    proc.stdin.close()
    assert (proc.wait(timeout=60), proc.stderr.read().decode().splitlines()) == (1, [bar, KILLED_LINE])


def test_a_dead_peers_line_keeps_its_exit_code_and_a_silent_failure_gets_one_line():
    """The filter passes a rank's own ``error:`` line with that rank's exit code (1: a dead or hung peer; 2 is a
    bad setting); a rank that exited with an error and no line of its own (its output above) gets one line."""
    report = KILLED_REPORT.replace("-9 (pid: 1943)  (SIGKILL)", "1 (pid: 1943)").replace("exitcode: -9", "exitcode: 1")
    # a refused setting: rank 0 exited 2 and rank 1, its peer gone, 1 -- first seen by torchrun (2 of 27 runs under
    # load gave exit 1: a new user, 2026-12-03)
    refused = report.replace("-15 (pid: 1942)  (SIGTERM)", "2 (pid: 1942)")
    bad = "error: sampling.top_p=5 is not allowed; it must be in (0, 1]"
    for before, rest, expected in ((PEER_LINE + "\n", report, (1, [PEER_LINE])),
                                   ("", report, (1, [f"error: rank 1 exited with code 1 (its output is above); {RESUME}"])),
                                   (bad + "\n", refused, (2, [bad]))):
        report = rest
        proc = subprocess.run([PY, str(REPO / "launch" / "until_interrupted.py")], input=(before + report).encode(),
                              capture_output=True, timeout=60)
        assert (proc.returncode, proc.stderr.decode().splitlines()) == expected


def test_bad_setting_under_the_torchrun_script_is_one_line_and_exit_2(tmp_path):
    """launch/torchrun_single_node.sh with a torchrun that replays what torchrun 2.13 printed for
    ``NPROC=2 ... parallel.lp=3`` (gloo, 2026-12-02; 41 lines, exit 1): one error line, exit 2."""
    error = ("error: parallel.lp=3 does not divide the world size 2; start a multiple of 3 ranks (world = dp x lp) "
             "or choose parallel.lp among the divisors of 2")
    printed = "\n".join([
        error, error,
        "E1202 04:56:59.353000 12991 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) "
        "local_rank: 0 (pid: 12996) of binary: /work/fresh4/.venv/bin/python",
        "Traceback (most recent call last):", '  File "/work/fresh4/.venv/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60, "lp_runtime.generate FAILED", "-" * 60, "Failures:", "[1]:", "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 2 (pid: 12997) ", "=" * 60])
    # torchrun prints a 4-line banner first when OMP_NUM_THREADS is unset and it starts > 1 rank (a new user saw it
    # above the error line); the script sets it as torchrun would, so no banner
    banner = "\n".join(["W1202 12:40:01.000000 1 torch/distributed/run.py:851] ", "*" * 60,
                        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, ...",
                        "*" * 60])
    stub = tmp_path / "torchrun"
    # as a slower rank's Hydra can: the run folder written again after the first rank removed it (a new user)
    rewrite = 'for a in "$@"; do case "$a" in hydra.run.dir=*) mkdir -p "${a#hydra.run.dir=}/.hydra";; esac; done\n'
    stub.write_text(f"#!/usr/bin/env bash\n{rewrite}[ -n \"${{OMP_NUM_THREADS:-}}\" ] || cat >&2 <<'EOF'\n{banner}\nEOF\n"
                    f"cat >&2 <<'EOF'\n{printed}\nEOF\nexit 1\n")
    (tmp_path / "outputs").mkdir()  # there before: kept
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"TORCHRUN": str(stub), "NPROC": "2"}
    proc = subprocess.run(["bash", str(REPO / "launch" / "torchrun_single_node.sh"), "parallel.lp=3"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, error + "\n", "")
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["outputs"] and not any((tmp_path / "outputs").iterdir())


def _started_script(tmp_path: Path, stub_body: str) -> subprocess.Popen:
    """launch/torchrun_single_node.sh in a session of its own, with a stub torchrun running ``stub_body`` (bash),
    once the stub has printed its first line, "started"."""
    stub = tmp_path / "torchrun"
    stub.write_text("#!/usr/bin/env bash\n" + stub_body)
    stub.chmod(0o755)
    proc = subprocess.Popen(["bash", str(REPO / "launch" / "torchrun_single_node.sh")], cwd=tmp_path,
                            env={**os.environ, "TORCHRUN": str(stub)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "started\n"
    return proc


# What rank 0 prints with decoding=auto: the calibration's bar (stderr, closed without leaving a line), the line of
# the setting chosen (stdout), then the questions' bar with each answer's line (tqdm.write, stdout).
RANK0_LINES = """
import time
from tqdm import tqdm
with tqdm(total=3, desc="decoding=auto calibration", leave=False, mininterval=0) as bar:
    for _ in range(3):
        time.sleep(0.2)  # a prompt: longer than the filter's 50 ms pause, so the bar is shown meanwhile
        bar.update(1)
print("decoding=auto: the setting chosen", flush=True)
with tqdm(total=2, desc="questions", mininterval=0) as bar:
    for i in range(2):
        time.sleep(0.2)
        tqdm.write(f"[{i}] an answer")
        bar.update(1)
"""


def test_rank0s_stdout_lines_start_on_a_line_of_their_own_under_the_torchrun_script(tmp_path):
    """Under launch/torchrun_single_node.sh on a terminal, decoding=auto's line came out on the calibration bar's
    line (``...4/6 [00:00<00:00, 32.65prompt/s]decoding=auto: ...``), as did the answers' lines on the questions'
    bar: stdout went straight to the terminal while the filter held the bar's partial line (a review, 2026-12-05).
    A stub torchrun prints what rank 0 prints; stdout and stderr are one file, as on a terminal."""
    stub = tmp_path / "torchrun"
    (tmp_path / "rank0.py").write_text(RANK0_LINES)
    stub.write_text(f"#!/usr/bin/env bash\nexec {PY} {tmp_path / 'rank0.py'}\n")
    stub.chmod(0o755)
    with open(tmp_path / "terminal", "w") as terminal:
        proc = subprocess.run(["bash", str(REPO / "launch" / "torchrun_single_node.sh")], cwd=tmp_path, timeout=60,
                              env={**os.environ, "TORCHRUN": str(stub)}, stdout=terminal, stderr=subprocess.STDOUT)
    shown = (tmp_path / "terminal").read_bytes().decode()  # carriage returns kept
    assert proc.returncode == 0, shown
    for line in ("decoding=auto: the setting chosen", "[0] an answer", "[1] an answer"):
        at = shown.index(line + "\n")
        assert shown[at - 1] in "\r\n", repr(shown[max(at - 120, 0):at + len(line)])  # the cursor at a line start


def test_sigterm_to_the_torchrun_scripts_group_keeps_rank0s_line(tmp_path):
    """SIGTERM to the launch script's whole process group (``timeout``; a new user, 2026-12-02): the filter, which
    ignores SIGTERM, still passes rank 0's line and drops torchrun's "closing signal SIGTERM" lines (it was killed
    with the rest, and the line was lost). A stub torchrun prints what torchrun 2.13 printed then. The script
    exits 143 only once torchrun and the filter have ended (it returned at once, before them, and the line came
    after the shell's prompt; a new user, session 22)."""
    proc = _started_script(tmp_path, "trap 'echo \"W1202 17:15:30.693000 1 api.py:1028] Sending process 2 closing "
                           f"signal SIGTERM\" >&2; echo \"{INTERRUPTED}\" >&2; echo Traceback >&2; kill $! 2>/dev/null; "
                           "wait $!; exit 1' TERM\nsleep 0.5\necho started\nsleep 60 & wait\n")  # start-up takes seconds
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, err, out) == (143, INTERRUPTED + "\n", "")
    with pytest.raises(ProcessLookupError):  # nothing of the group left running (the stub reaps its own sleep)
        os.killpg(proc.pid, 0)


# ------------------------------------------------------------------------------ launch scripts: paths are the caller's
@pytest.mark.parametrize("script", ["torchrun_single_node.sh", "slurm_single_node.sbatch", "slurm_multi_node.sbatch"])
def test_launch_scripts_keep_the_callers_directory(tmp_path, script):
    repo, caller = tmp_path / "repo", tmp_path / "caller"
    (repo / "launch").mkdir(parents=True)
    (repo / "lp_runtime").mkdir()
    for name in (script, "until_interrupted.py"):
        (repo / "launch" / name).write_text((REPO / "launch" / name).read_text())
    stub = repo / ".venv" / "bin" / "torchrun"  # the repository's venv, found from the script, not the cwd
    stub.parent.mkdir(parents=True)
    stub.write_text('#!/usr/bin/env bash\necho "cwd=$PWD"\necho "args=$*"\n')
    stub.chmod(0o755)
    caller.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LP_RUNTIME_", "TORCHRUN"))}
    # 6 ranks a node: the default LP degree is parallel.lp=6 (it was parallel=lp6, a config group that exists only
    # for 1, 2, 3, 4 and 8 ranks; a new user, session 22)
    env.update(SLURM_JOB_ID="7", SLURM_NNODES="1", HEAD_NODE="127.0.0.1", LP_RUNTIME_SRUN="", NPROC_PER_NODE="6")
    proc = subprocess.run(["bash", str(repo / "launch" / script), "output.path=rel/answers.jsonl"], cwd=caller,
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"cwd={caller}"
    assert "-m lp_runtime.generate" in lines[1] and lines[1].endswith("output.path=rel/answers.jsonl")
    if script != "torchrun_single_node.sh":
        assert "--nproc-per-node=6" in lines[1] and " parallel.lp=6 " in lines[1]


# ------------------------------------------------------------------------------- bad input, as the CLI
# Every case below fails before a model is loaded. All run as `python -m lp_runtime.generate ...` (or the report,
# or scripts/bench.py) command lines in one fresh interpreter, each with its own files, run folder and output path
# under tmp/<case>.

FORMAT = 'each line must be a JSON object {{"question_id": int or str, "category": str or null (optional), "turns": [str, ...]}}'
EMPTY_DATASET_MESSAGE = "dataset.path='{path}' holds no questions; " + FORMAT
BAD_LINE_MESSAGE = "{path}, line 2: not valid JSON (Expecting property name enclosed in double quotes); " + FORMAT

QUOTE_HINT = (" (every override is key=value; quote one whose value holds spaces or brackets as a whole, e.g. "
              "'output.path=my answers.jsonl' or 'model.name=\"a (b)\"')")
BAD_CONFIGS = [
    (["decoding.window_size=-1"], "decoding.window_size=-1 is negative; W must be >= 0"),
    # a key given twice: Hydra kept the last value (a review, 2026-12-05); refused before the model path is looked at
    (["sampling.category_temperature={writing:0.7,writing:0.2}", "model.path=/nonexistent"],
     "sampling.category_temperature={writing:0.7,writing:0.2}: the key 'writing' appears twice in one {key: value} "
     "dict, and Hydra would keep only its last value; give each key once"),
    (["decoding.ngram_size=1"], "decoding.ngram_size=1 is too small; N must be >= 2"),
    # inf passed the check and crashed every rank in timedelta() under torchrun (a new user, 2026-12-03)
    (["parallel.timeout_s=inf"], "parallel.timeout_s=inf is not allowed; it must be a number of seconds >= 1 and "
                                 "<= 604800 (a week)"),
    # an integer too large for a float: OmegaConf's OverflowError, a traceback (a new user, 2026-12-05)
    (["sampling.temperature=1" + "0" * 400], "sampling.temperature is given an integer too large for a float; it "
                                             "must be a finite number"),
    (["generation.max_new_tokens=abc"], "Error merging override generation.max_new_tokens=abc: "
                                        "Value 'abc' of type 'str' could not be converted to Integer"),
    # a key no setting has, without +: was Hydra's "Could not override ... not in 'DecodingConfig'", no keys listed
    (["decoding.windw_size=3"], "decoding.windw_size is not a setting; decoding has: guess_set_size, max_depth, "
                                "method, ngram_size, pool_from_prompt, seed, successors, window_size"),
    (["foo=1"], "foo is not a setting; the top level has: dataset, decoding, generation, model, model_id, output, "
                "parallel, progress, sampling"),
    (["dataset=jsonl"], "dataset=jsonl needs dataset.path=<question file .jsonl>"),
    # a new category over sampling=mt_bench's keys: was Hydra's "Key 'wrting' is not in struct" (a new user, 2026-12-03)
    (["sampling=mt_bench", "sampling.category_temperature={wrting: 0.7}"],
     "sampling.category_temperature has no key 'wrting' (did you mean 'writing'?); it holds writing, roleplay, "
     "extraction, math, coding, reasoning, stem, humanities, arena-hard-200; add a new one with "
     "+sampling.category_temperature.wrting=VALUE"),
    (["sampling.category_temperature.poetry=0.7"], "sampling.category_temperature has no key 'poetry'; add a new one "
                                                   "with +sampling.category_temperature.poetry=VALUE"),
    # an unquoted space split one override in two, a bracket in a value: Hydra's parse error gets the way out
    (["output.path=my", "answers.jsonl"], "Error parsing override 'answers.jsonl'" + QUOTE_HINT),
    (["model.name=a (b)"], "Error parsing override 'model.name=a (b)'" + QUOTE_HINT),
    # a new user, 2026-12-02: no word on ~ (which the shell does not expand after '='), a summary given as the
    # answers file ("line 1 is not JSON"), and a device that "does not exist"
    (["output.path=~/x.jsonl"], "output.path=~/x.jsonl" + QUOTE_HINT[:-1]
     + "; a path starting with ~ too: 'output.path=\"~/answers.jsonl\"')"),
    (["output.path=a.summary.json"], "output.path='a.summary.json' names a run's summary record (written beside its "
                                     "answers file); give the answers file, e.g. output.path=a.jsonl"),
    # an integer other than 0 / 1 for a true/false setting: OmegaConf read it as true, and the run went on (a new user)
    (["dataset.first_turn_only=2"], "dataset.first_turn_only=2 is not allowed; dataset.first_turn_only is true or false"),
    # a key into a list by a name: was a ValueError / TypeError traceback from OmegaConf, exit 1
    (["generation.stop_strings.x=1"], "generation.stop_strings.x=1: generation.stop_strings is a list, whose items "
                                      "are numbered from 0; give the whole list (generation.stop_strings=[...]) or "
                                      "one item by its number (generation.stop_strings.0=...)"),
    (["generation.stop_strings.x.y=1"], "generation.stop_strings.x.y=1: generation.stop_strings is a list, whose "
                                        "items are numbered from 0; give the whole list (generation.stop_strings=[...])"
                                        " or one item by its number (generation.stop_strings.0=...)"),
    # an override where --info's topic goes: was argparse's usage text and "invalid choice"
    (["--info", "decoding=lookahead", "dataset.limit=1"],
     "--info decoding=lookahead: Hydra reads the word after --info as what to show (all, config, defaults, "
     "defaults-tree, plugins, searchpath); name one first (--info config decoding=lookahead) or put the overrides "
     "before --info"),
    # an empty model_id: the answers said "smollm2-174b85b4", the settings record "" (a new user, 2026-12-04)
    (["model_id=''"], "model_id is empty; give the label the answers are to carry (model_id=my-model), or leave it "
                      "null for the model's label and fingerprint"),
    (["model_id=' '"], "model_id=' ' is only whitespace; give the label the answers are to carry (model_id=my-model), "
                       "or leave it null for the model's label and fingerprint"),
    (["dataset=jsonl", "dataset.path=/dev/null"], "dataset.path='/dev/null' is not a regular file (a device, pipe or "
                                                  "socket); give a question file in JSONL format ("
                                                  + FORMAT.format() + ")"),
]


def test_an_unquoted_value_outside_ascii_is_named_with_its_way_out():
    """A new user (2026-12-03): output.path=outputs/é/a.jsonl gave 'LexerNoViableAltException: ...' and a hint on
    spaces and brackets only."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lp_runtime.cli import one_line

    with pytest.raises(Exception) as e:
        OverridesParser.create().parse_overrides(["output.path=outputs/é/a.jsonl"])
    assert one_line(e.value) == ("output.path=outputs/é/a.jsonl" + QUOTE_HINT[:-1] + "; a value with characters "
                                 "outside ASCII too: 'output.path=\"outputs/é/a.jsonl\"')")


@pytest.mark.parametrize("argv, message", [
    (["decoding=lookahead", "-m", "decoding.window_size=0,3", "dataset.limit=1"],
     "-m stands between overrides; put it before them (or after all of them): -m decoding=lookahead "
     "decoding.window_size=0,3 dataset.limit=1"),
    (["a=1", "--multirun", "b=2"], "--multirun stands between overrides; put it before them (or after all of them): "
                                   "--multirun a=1 b=2"),
    (["-m", "a=1", "b=2"], None), (["a=1", "b=2", "--multirun"], None), (["--config-name", "bench", "-m", "a=1"], None),
    (["a=1", "b=2"], None),
    # every flag of Hydra's parser but --version breaks there (tried one by one: "unrecognized arguments: b=2")
    (["dataset.limit=1", "--cfg", "job", "decoding.seed=3"], "--cfg job stands between overrides; put it before them "
                                                              "(or after all of them): --cfg job dataset.limit=1 "
                                                              "decoding.seed=3"),
    (["a=1", "-c", "job", "b=2"], "-c job stands between overrides; put it before them (or after all of them): "
                                  "-c job a=1 b=2"),
    (["a=1", "--cfg=job", "b=2"], "--cfg=job stands between overrides; put it before them (or after all of them): "
                                  "--cfg=job a=1 b=2"),
    (["a=1", "--info", "config", "b=2"], "--info config stands between overrides; put it before them (or after all "
                                         "of them): --info config a=1 b=2"),
    (["a=1", "--resolve", "b=2"], "--resolve stands between overrides; put it before them (or after all of them): "
                                  "--resolve a=1 b=2"),
    (["a=1", "--package", "x", "b=2"], "--package x stands between overrides; put it before them (or after all of "
                                       "them): --package x a=1 b=2"),
    (["a=1", "--config-name", "bench", "b=2"], "--config-name bench stands between overrides; put it before them (or "
                                               "after all of them): --config-name bench a=1 b=2"),
    (["a=1", "--help", "b=2"], "--help stands between overrides; put it before them (or after all of them): "
                               "--help a=1 b=2"),
    # the other flags keep their place in the command line given back
    (["-cn", "bench", "a=1", "-m", "b=2"], "-m stands between overrides; put it before them (or after all of them): "
                                           "-cn bench -m a=1 b=2"),
    (["--cfg", "job", "--resolve", "a=1", "b=2"], None), (["a=1", "b=2", "--cfg", "job", "--resolve"], None),
    (["a=1", "--version", "b=2"], None),  # Hydra prints its version and exits 0
])
def test_a_hydra_flag_between_overrides_is_one_line(argv, message):
    """A new user (2026-12-03): `generate decoding=lookahead -m decoding.window_size=0,3` printed argparse's 8-line
    usage and 'unrecognized arguments: decoding.window_size=0,3 dataset.limit=1', not naming -m; likewise
    `generate dataset.limit=1 --cfg job decoding.seed=3` (a new user, 2026-12-04)."""
    from lp_runtime.cli import check_flag_order
    from lp_runtime.config import ConfigError

    if message is None:
        check_flag_order(argv)
        return
    with pytest.raises(ConfigError) as e:
        check_flag_order(argv)
    assert str(e.value) == message


TWICE = "appears twice in one {key: value} dict, and Hydra would keep only its last value; give each key once"


@pytest.mark.parametrize("argv, key", [
    (["sampling.category_temperature={writing:0.7,writing:0.2}"], "'writing'"),
    (["sampling.category_temperature={writing: 0.7, math: 0, writing : 0.2}"], "'writing'"),
    (["-m", "x={a:1},{b:1,b:2}"], "'b'"), (["x=[{a:{c:1,c:2}}]"], "'c'"), (["x={1:2,1:3}"], "1"),
    (["sampling.category_temperature={writing:0.7,math:0.2}", "-m", "x={a:1},{a:2}"], None),
    (["x={a:1,a:2"], None), (["--cfg", "job", "x={a:1}"], None),  # Hydra's own line for what it cannot parse
    (["x=nosuchfn({a:1,a:2})"], None), (["x=tag(t1,{a:1,a:2})"], None)])  # ... and for what it refuses first
def test_a_dict_override_that_gives_a_key_twice_is_refused(argv, key):
    """``'sampling.category_temperature={writing:0.7,writing:0.2}'`` ran at 0.2: Hydra's override parser keeps the
    last value of a key given twice without a word (a review, 2026-12-05)."""
    from lp_runtime.cli import check_dict_keys
    from lp_runtime.config import ConfigError

    if key is None:
        check_dict_keys(argv)
        return
    with pytest.raises(ConfigError) as e:
        check_dict_keys(argv)
    assert str(e.value) == f"{argv[-1]}: the key {key} {TWICE}"


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
    d = _folder(tmp, "cr_only_dataset")  # old-Mac line ends: was "line 1: not valid JSON (Extra data)", no word on them
    (d / "q.jsonl").write_bytes(b'{"question_id": 1, "turns": ["hi"]}\r{"question_id": 2, "turns": ["ho"]}\r')
    cases[d.name] = (["dataset=jsonl", f"dataset.path={d / 'q.jsonl'}", "model.path=/nonexistent"],
                     f"{d / 'q.jsonl'}, line 1: not valid JSON (Extra data); the file's lines are separated by CR "
                     "alone (old Mac line ends): save it with LF (or CRLF) line ends; " + FORMAT.format())
    # As root os.access() says yes everywhere; /proc refuses new files even to root.
    cases["unwritable_output"] = (["output.path=/proc/lp_runtime_answers.jsonl", "model.path=/nonexistent"],
                                  "output path /proc/lp_runtime_answers.jsonl is not writable: No such file or directory")
    # a symbolic link that loops or leads to nothing: was "is not writable: No such file or directory" (a new user,
    # 2026-12-04), and a link to a missing file in an existing folder made that file and removed the link
    d = _folder(tmp, "output_link_loops")
    os.symlink("loop.jsonl", d / "loop.jsonl")
    cases[d.name] = ([f"output.path={d / 'loop.jsonl'}", "model.path=/nonexistent"],
                     f"output path {d / 'loop.jsonl'} is a symbolic link that loops (it points to loop.jsonl, and no "
                     "link on the way leads to a file); remove it or point it at a file, or choose another output.path")
    d = _folder(tmp, "output_link_to_nothing")
    os.symlink("gone.jsonl", d / "a.jsonl")
    cases[d.name] = ([f"output.path={d / 'a.jsonl'}", "model.path=/nonexistent"],
                     f"output path {d / 'a.jsonl'} is a symbolic link to {d / 'gone.jsonl'}, which does not exist; "
                     f"give output.path={d / 'gone.jsonl'} to write there, or remove the link")
    for name, overrides, message in _summary_path_cases(tmp) + _auto_and_sweep_cases(tmp) + _own_folder_cases(tmp):
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
    # another run's summary, its answers still there: overwritten, exit 0 (a new user, 2026-12-03)
    d = _folder(tmp, "summary_is_another_runs")
    (d / "b.jsonl").write_text(json.dumps(_answer(1)) + "\n")
    (d / "b.summary.json").write_text(json.dumps({"answers": str(d / "b.jsonl"), "num_questions": 1}))
    out.append((d.name, [f"output.path={d / 'a.jsonl'}", f"output.summary_path={d / 'b.summary.json'}",
                         "model.path=/nonexistent"],
                f"output.summary_path={d / 'b.summary.json'} is the summary of another answers file, {d / 'b.jsonl'}; "
                f"the summary would overwrite it: give another file, e.g. output.summary_path={d / 'a.summary.json'}"))
    # not a regular file: output.summary_path=/dev/null, renamed over, replaced the device (a new user's run as root,
    # 2026-12-02); a FIFO here stands for every such file (the answers path's open() would wait on it for ever)
    d = _folder(tmp, "summary_is_a_device")
    os.mkfifo(d / "fifo")
    out.append((d.name, [f"output.path={d / 'a.jsonl'}", f"output.summary_path={d / 'fifo'}",
                         "model.path=/nonexistent"],
                f"output.summary_path={d / 'fifo'} is not a regular file (a device, pipe or socket); give a file path "
                "such as outputs/answers.summary.json"))
    # the files a run writes beside its answers, already there and not its own kind (another run's answers named
    # a.summary.json / a.lock, the user's notes): the run replaced them, exit 0 (a new user, 2026-12-02)
    line = json.dumps(_answer(1)) + "\n"
    for name, beside, content, kind in [("summary_beside_is_answers", "a.summary.json", line, None),
                                        ("lock_beside_is_answers", "a.lock", line, "a lock file"),
                                        ("settings_beside_is_notes", "a.settings.json", "notes\n", "a settings record")]:
        d = _folder(tmp, name)
        (d / beside).write_text(content)
        a = d / "a.jsonl"
        out.append((d.name, [f"output.path={a}", "model.path=/nonexistent"],
                    f"{d / beside}, the summary this run writes beside output path {a}, exists and is not a run "
                    "summary; move it away, choose another output.path, or give output.summary_path" if kind is None
                    else f"{d / beside}, which this run writes beside output path {a}, exists and is not {kind}; move "
                    "it away or choose another output.path"))
    # X and X.jsonl share X.settings.json / .summary.json / .lock: a run on one overwrote the other's record and a
    # resume of the other then mixed settings in one file (a new user, 2026-12-07)
    for name, given, twin in [("twin_of_jsonl", "a", "a.jsonl"), ("twin_of_bare", "a.jsonl", "a")]:
        d = _folder(tmp, name)
        (d / twin).write_text(line)
        out.append((d.name, [f"output.path={d / given}", "model.path=/nonexistent"],
                    f"output path {d / given} would write its settings record, lock and summary ({d / 'a'}.settings."
                    f"json, {d / 'a'}.lock, {d / 'a'}.summary.json) over those of {d / twin}, which holds answers; "
                    f"move one of the two away, or give another output path, e.g. output.path={d / 'a-2.jsonl'}"))
    # a folder where a record beside the answers goes: the settings record's was reported as "missing", the
    # summary's as "output path .../a.summary.json is a folder; give a file path such as .../answers.jsonl"
    for name, record in [("settings_beside_is_a_folder", "a.settings.json"), ("lock_beside_is_a_folder", "a.lock"),
                         ("summary_beside_is_a_folder", "a.summary.json")]:
        d = _folder(tmp, name)
        (d / record).mkdir()
        out.append((d.name, [f"output.path={d / 'a.jsonl'}", "model.path=/nonexistent"],
                    f"{d / record}, which this run writes beside output path {d / 'a.jsonl'}, is a folder; move it "
                    "away or choose another output.path"))
    d = _folder(tmp, "answers_path_ends_in_slash")
    out.append((d.name, [f"output.path={d}/x/", "model.path=/nonexistent"],
                f"output.path='{d}/x/' ends in a folder separator; give a file path such as {d}/x/answers.jsonl"))
    d = _folder(tmp, "summary_path_ends_in_slash")  # the summary was written as a file named like the folder
    out.append((d.name, [f"output.summary_path={d}/s/", f"output.path={d}/a.jsonl", "model.path=/nonexistent"],
                f"output.summary_path='{d}/s/' ends in a folder separator; give a file path such as "
                f"{d}/s/summary.json"))
    d = _folder(tmp, "answers_path_has_no_name")  # its summary and settings would be hidden files
    out.append((d.name, [f"output.path={d}/.jsonl", "model.path=/nonexistent"],
                f"output.path='{d}/.jsonl' has no name before .jsonl; give a file path such as {d}/answers.jsonl"))
    d = _folder(tmp, "answers_is_a_device")
    os.mkfifo(d / "fifo")
    out.append((d.name, [f"output.path={d / 'fifo'}", "model.path=/nonexistent"],
                f"output path {d / 'fifo'} is not a regular file (a device, pipe or socket); give a file path such as "
                "outputs/answers.jsonl"))
    return out


def _auto_and_sweep_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """Settings decoding=auto would ignore; sweeps with a bad job (checked before job 0 runs)."""
    out = [("auto_window", ["decoding.window_size=7"],
            "decoding.window_size=7 is ignored under decoding=auto, which chooses W itself from this machine's "
            "latency curve; add decoding=lookahead to run decoding.window_size=7"),
           ("auto_pool", ["decoding.pool_from_prompt=false"],
            "decoding.pool_from_prompt=false is ignored under decoding=auto, which always seeds the n-gram pool from "
            "the prompt; add decoding=lookahead to run decoding.pool_from_prompt=false"),
           # decoding=paper reads no max_depth: 30 was taken and ignored (a new user, 2026-12-04); the default group's
           # 24 under decoding.method=paper is not given, so it runs (a review, 2026-12-05: the first version refused it)
           ("paper_depth", ["decoding=paper", "decoding.max_depth=30"],
            "decoding.max_depth=30 is ignored under decoding=paper, which proposes the n-gram pool's candidates of N-1 "
            "tokens (max_depth bounds the suffix lookup's continuations); add decoding=lookahead to run "
            "decoding.max_depth=30"),
           # a value beside sampling=model equal to the default: the model's temperature applied, the settings
           # recorded 0.0 (a new user, 2026-12-04)
           ("model_sampling_default", ["sampling=model", "sampling.temperature=0", "sampling.top_p=1.0"],
            "sampling.temperature=0, sampling.top_p=1.0 are not allowed with sampling.from_model=true "
            "(sampling=model), which takes temperature, top_k, top_p, min_p, repetition_penalty, suppress_tokens "
            "from the model's generation_config; use sampling=model alone, or sampling=default to set them "
            "(sampling.seed applies to both)")]
    for name, sweep, message in [
        ("sweep_bad_last_job", ["decoding=lookahead", "decoding.guess_set_size=1,-1"],
         "sweep job 1 (decoding.guess_set_size=-1): decoding.guess_set_size=-1 is negative; G must be >= 0"),
        ("sweep_auto_key", ["decoding.window_size=0,3"],
         "sweep job 0 (decoding.window_size=0): decoding.window_size=0 is ignored under decoding=auto, which chooses "
         "W itself from this machine's latency curve; add decoding=lookahead to run decoding.window_size=0"),
        # a value Hydra cannot compose for one job: was Hydra's callback warning, then job 0 ran (a new user)
        ("sweep_wrong_type", ["decoding=lookahead", "decoding.guess_set_size=1,x"],
         "sweep job 1 (decoding.guess_set_size=x): Error merging override decoding.guess_set_size=x: Value 'x' of "
         "type 'str' could not be converted to Integer"),
        ("sweep_unknown_option", ["decoding=lookahead,foo"],
         "sweep job 1 (decoding=foo): In 'generate': Could not find 'decoding/foo' (Available options in "
         "'decoding': auto, greedy, lookahead, paper)"),
        # a model folder that does not exist: job 0 ran first (a new user's second pass); job 0 loads nothing here
        ("sweep_missing_model", ["model.path=bundled:smollm2,/nonexistent"],
         "sweep job 1 (model.path=/nonexistent): model.path='/nonexistent' is not an existing folder. Use a local "
         "folder, a HuggingFace id, or bundled:smollm2"),
        # a value swept twice: two jobs of one setting (a new user, session 22)
        ("sweep_repeated_value", ["decoding=lookahead", "decoding.window_size=0,3,00"],
         "sweep jobs 0 (decoding.window_size=0) and 2 (decoding.window_size=00) would run the same setting (equal "
         "values, or values it does not read, e.g. decoding.* under decoding=greedy): give each job a setting of its "
         "own (a greedy baseline beside a W sweep: run it on its own)"),
        ("sweep_greedy_twice", ["decoding=greedy,lookahead", "decoding.window_size=0,3"],
         "sweep jobs 0 (decoding=greedy decoding.window_size=0) and 1 (decoding=greedy decoding.window_size=3) would "
         "run the same setting (equal values, or values it does not read, e.g. decoding.* under decoding=greedy): give "
         "each job a setting of its own (a greedy baseline beside a W sweep: run it on its own)"),
        # LP degrees the launcher's ranks cannot hold: each job's ranks refused it, as a launcher traceback (a new
        # user's third pass); here with Hydra's launcher, whose jobs run in this one process
        ("sweep_lp_over_ranks", ["decoding=lookahead", "parallel.lp=1,2"],
         "sweep job 1 (parallel.lp=2): parallel.lp=2 does not divide the 1 rank(s) of each job (this launcher runs "
         "each job in this one process); set hydra.launcher.tasks_per_node (hydra/launcher=lp_local or lp_slurm) to "
         "a multiple of it"),
    ]:
        d = _folder(tmp, name)
        # a model no job can load (offline hub id), yet one the sweep's checks pass: job 0 would fail at once
        model = [] if any(o.startswith("model.path=") for o in sweep) else ["model.path=nosuchorg/nosuchmodel"]
        out.append((name, ["-m", *sweep, f"hydra.sweep.dir={d / 'sweep'}", *model,
                           f"output.path={d}/${{hydra:job.num}}/answers.jsonl"], message + "; no job was run"))
    return out


DECODING_KEYS = "guess_set_size, max_depth, method, ngram_size, pool_from_prompt, seed, successors, window_size"


def _own_folder_cases(tmp: Path) -> list:
    """Command lines run in a folder of their own (the folders a refusal may leave are checked), the report and
    the bench among them."""
    out = []
    d = _folder(tmp, "unknown_key")
    out.append((d.name, Call(["+decoding.branch_ngrams=true", "dataset.limit=1"], cwd=str(d)),
                f"decoding.branch_ngrams is not a setting; decoding has: {DECODING_KEYS}"))
    d = _folder(tmp, "empty_model_folder")
    (d / "empty").mkdir()
    (d / "outputs" / "hydra").mkdir(parents=True)  # existed before: kept (its new run folder is not)
    out.append((d.name, Call(["model.path=empty", "progress=false"], cwd=str(d)),
                "model.path='empty' holds neither config.json (a transformers model folder) nor a .gguf file (for "
                "model.gguf_file); give a folder saved by save_pretrained, a HuggingFace id, or bundled:smollm2"))
    d = _folder(tmp, "refused_run_dir_elsewhere")  # hydra.run.dir outside the folder the command runs in
    (d / "here").mkdir()
    out.append((d.name, Call([f"hydra.run.dir={d / 'elsewhere' / 'a' / 'b'}", "dataset.limit=0"], cwd=str(d / "here")),
                "dataset.limit=0 is not allowed; it must be >= 1"))
    d = _folder(tmp, "refused_run_dir_in_an_empty_folder")  # a folder of the user's 3 levels down, empty: kept
    (d / "a" / "b" / "c").mkdir(parents=True)
    out.append((d.name, Call(["hydra.run.dir=a/b/c/run", "dataset.limit=0"], cwd=str(d)),
                "dataset.limit=0 is not allowed; it must be >= 1"))
    d = _folder(tmp, "refused_setting")
    out.append((d.name, Call(["decoding.window_size=-1"], cwd=str(d)),
                "decoding.window_size=-1 is negative; W must be >= 0"))
    d = _folder(tmp, "refused_setting_own_run_dir")
    (d / "mine").mkdir()
    (d / "mine" / "keep.txt").write_text("x")
    out.append((d.name, Call(["decoding.window_size=-1", f"hydra.run.dir={d / 'mine'}"], cwd=str(d)),
                "decoding.window_size=-1 is negative; W must be >= 0"))
    d = _folder(tmp, "refused_bench")
    out.append((d.name, Call(["ablation=true"], cwd=str(d), module="scripts.bench"),
                "ablation=true switches decoding=auto's levers off one at a time; add decoding=auto"))
    d = _folder(tmp, "bench_list_by_name")  # was OmegaConf's ValueError traceback, exit 1
    out.append((d.name, Call(["lookahead.x=1"], cwd=str(d), module="scripts.bench"),
                "lookahead.x=1: lookahead is a list, whose items are numbered from 0; give the whole list "
                "(lookahead=[...]) or one item by its number (lookahead.0=...)"))
    d = _folder(tmp, "bench_dict_key_twice")
    out.append((d.name, Call(["per_category={mt_bench:3,mt_bench:2}", "ablation=true"], cwd=str(d),
                             module="scripts.bench"),  # refused before the bench's own checks
                "per_category={mt_bench:3,mt_bench:2}: the key 'mt_bench' appears twice in one {key: value} dict, and "
                "Hydra would keep only its last value; give each key once"))
    d = _folder(tmp, "report_on_a_question_file")
    (d / "q.jsonl").write_text('{"question_id": 1, "turns": ["hi"]}\n')
    out.append((d.name, Call([str(d / "q.jsonl")], cwd=str(d), module="lp_runtime.report"),
                f"{d / 'q.jsonl'} line 1 is a question (an answer line has question_id and choices[0] with "
                "output_ids, new_tokens, decoding_steps, wall_time, accept_lengths), so "
                f"{d / 'q.jsonl'} is not an answers file; give answers files of python -m lp_runtime.generate, or "
                "a folder holding them"))
    # Hydra makes the run / sweep folder before the job: a folder under a file was Hydra's traceback, exit 1
    # (a new user, 2026-12-02); and a launcher of no processes (submitit's IndexError, a multirun.yaml left)
    where = "(set by hydra.run.dir, or hydra.sweep.dir with -m; the launch scripts' RUN_DIR)"
    for name, args, message in [
        ("run_dir_under_a_file", ["hydra.run.dir=f.jsonl/run"],
         f"cannot make the run folder f.jsonl/run: Not a directory {where}"),
        ("sweep_dir_under_a_file", ["-m", "hydra.sweep.dir=f.jsonl/sweep"],
         f"cannot make the run folder f.jsonl/sweep: Not a directory {where}"),
        ("launcher_of_no_tasks", ["-m", "hydra/launcher=lp_local", "hydra.launcher.tasks_per_node=0"],
         "hydra.launcher.tasks_per_node=0 is not allowed; give an integer >= 1 (processes of each job: nodes x "
         "tasks_per_node, one rank each)"),
        ("launcher_of_no_nodes", ["-m", "hydra/launcher=lp_local", "hydra.launcher.nodes=0"],
         "hydra.launcher.nodes=0 is not allowed; give an integer >= 1 (processes of each job: nodes x "
         "tasks_per_node, one rank each)")]:
        d = _folder(tmp, name)
        (d / "f.jsonl").write_text("")
        out.append((name, Call([*args, "decoding=greedy", "dataset.limit=1"], cwd=str(d)), message))
    # --cfg / --info print the composed config and exit: a value a run refuses was printed, exit 0 (a new user)
    for name, args, message in [
        ("cfg_job_bad_value", ["--cfg", "job", "decoding.window_size=-3"],
         "decoding.window_size=-3 is negative; W must be >= 0"),
        ("info_config_bad_value", ["--info", "config", "decoding=lookahead", "decoding.guess_set_size=-1"],
         "decoding.guess_set_size=-1 is negative; G must be >= 0"),
        ("cfg_all_unknown_key", ["--cfg=all", "decoding.windw_size=3"],
         "decoding.windw_size is not a setting; decoding has: guess_set_size, max_depth, method, ngram_size, "
         "pool_from_prompt, seed, successors, window_size"),
        # two paths compared, no file opened: printed with exit 0, refused by the run (a new user, 2026-12-07)
        ("cfg_job_summary_is_the_answers", ["--cfg", "job", "output.path=o/a.jsonl", "output.summary_path=o/a.jsonl"],
         "output.summary_path=o/a.jsonl is the answers file (output.path); the summary would overwrite it: give "
         "another file, e.g. output.summary_path=o/a.summary.json"),
        # G = 0 with the table off: printed with exit 0, refused by the run (a new user, 2026-12-07)
        ("cfg_job_g0_table_off", ["--cfg", "job", "decoding=lookahead", "decoding.window_size=3",
                                  "decoding.guess_set_size=0"],
         "decoding.guess_set_size=0 with the successor table off leaves decoding=lookahead nothing to verify (the "
         "window's n-grams reach the output only as candidates), so it would decode as plain greedy; set G > 0, "
         "decoding.successors=true, or use decoding=greedy"),
        ("cfg_job_with_multirun", ["--cfg", "job", "-m", "decoding=greedy,lookahead"],  # was Hydra's traceback
         "--cfg prints the config of one run and -m/--multirun runs a sweep: give only one of them"),
        ("cfg_job_good", ["--cfg", "job", "decoding=lookahead", "decoding.window_size=3",
                          "output.path=out/${hydra:job.name}.jsonl"], None),
        # a flag between overrides: was argparse's 7-line usage and "unrecognized arguments: decoding.seed=3"
        ("cfg_job_between_overrides", ["dataset.limit=1", "--cfg", "job", "decoding.seed=3"],
         "--cfg job stands between overrides; put it before them (or after all of them): --cfg job dataset.limit=1 "
         "decoding.seed=3")]:
        d = _folder(tmp, name)
        out.append((name, Call(args, cwd=str(d)), message))
    d = _folder(tmp, "sweep_with_one_output_file")
    out.append((d.name, Call(["-m", "decoding=lookahead", "decoding.window_size=0,3", "output.path=out/a.jsonl"],
                             cwd=str(d)),
                f"sweep jobs 0 (decoding.window_size=0) and 1 (decoding.window_size=3) would both write output.path="
                f"{d / 'out' / 'a.jsonl'}, but one answers file holds the answers of one setting; drop output.path "
                "so that each job writes into its own folder (<hydra.sweep.dir>/<job number>/), or put the job number "
                "in it: 'output.path=${hydra:sweep.dir}/${hydra:job.num}/answers.jsonl'; no job was run"))
    return out


RECORD_FORMATS = {"record_format_99": 99, "record_format_text": "1", "record_format_true": True,
                  "record_format_real": 1.5}


def _record_cases(tmp: Path, model_dir: Path) -> dict:
    """Answers files whose settings record this version of lp_runtime did not write: of another ``format``, or
    holding a key it never writes (the refusal advised a re-run "with the file's settings", which cannot give one)."""
    cases = {}
    for name, fmt in [*RECORD_FORMATS.items(), ("record_unknown_key", 1)]:
        d = _folder(tmp, name)
        (d / "q.jsonl").write_text('{"question_id": 1, "turns": ["Count to 3."]}\n')
        (d / "a.jsonl").write_text(json.dumps(_answer(1)) + "\n")
        settings = {"decoding.method": "greedy", **({"decoding.branch_ngrams": 2} if name.endswith("key") else {})}
        (d / "a.settings.json").write_text(json.dumps({"format": fmt, "settings": settings}))
        args = [f"model.path={model_dir}", "model.dtype=float32", "decoding=greedy", "dataset=jsonl",
                f"dataset.path={d / 'q.jsonl'}", f"output.path={d / 'a.jsonl'}"]
        cases[name] = (args, f"{d / 'a.settings.json'} holds the key 'decoding.branch_ngrams', which this version "
                       "of lp_runtime never writes: the record was written by another version of lp_runtime, or "
                       f"edited; write to a new output path (output.path={d / 'a-2.jsonl'}), or resume the file with "
                       "the version that wrote it" if name.endswith("key") else
                       f"{d / 'a.settings.json'} is a settings record of format {json.dumps(fmt)}, and "
                       "this version of lp_runtime reads format 1 only: it was written by another version of "
                       "lp_runtime, or edited; use the version that wrote it, or move the record and its answers file "
                       "away (or choose another output.path)")
    return cases


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory, tiny_model_dir):
    """case -> (the case's folder, the CLI's result, the expected one-line error). The batch's last command lines
    load the tiny model, and pay no interpreter start-up of their own: a two-job --multirun sweep with Hydra's own
    launcher (case "sweep", no error), decoding=auto refused after loading, LP_RUNTIME_CACHE unwritable for that
    call alone (case "auto_unwritable_cache"), and the two runs of RUN_FOLDER_CASES (no error)."""
    from cli_batch import run_cli

    tmp = tmp_path_factory.mktemp("cli")
    cases = {**_bad_input_cases(tmp), **_record_cases(tmp, tiny_model_dir)}
    d = _folder(tmp, "sweep")
    (d / "q.jsonl").write_text(json.dumps({"question_id": 81, "category": "writing",
                                           "turns": ["Write a haiku about the sea, 0."]}) + "\n")
    cases[d.name] = (Call(["--multirun", "decoding=greedy,lookahead", "decoding.window_size=2",
                           f"model.path={tiny_model_dir}", "model.dtype=float32", "dataset=jsonl",
                           f"dataset.path={d / 'q.jsonl'}", "generation.max_new_tokens=16", "progress=false",
                           f"hydra.sweep.dir={d / 'sweep'}"]), None)
    d = _folder(tmp, "sweep_refused_at_load")  # test_a_sweep_job_refused_once_its_model_loaded_is_named
    (d / "q.jsonl").write_text(json.dumps({"question_id": 1, "turns": ["Hi"]}) + "\n")
    cases[d.name] = (Call(["--multirun", "decoding=lookahead", "decoding.window_size=0,2000", "decoding.ngram_size=5",
                           f"model.path={tiny_model_dir}", "model.dtype=float32", "dataset=jsonl",
                           f"dataset.path={d / 'q.jsonl'}", "generation.max_new_tokens=4", "progress=false",
                           f"hydra.sweep.dir={d / 'sweep'}"]), None)
    d = _folder(tmp, "auto_unwritable_cache")  # test_decoding_auto_with_an_unwritable_cache_folder_is_one_line_...
    cases[d.name] = (Call([f"model.path={tiny_model_dir}", "model.dtype=float32", "decoding=auto", "dataset=jsonl",
                           f"dataset.path={_questions(d, 1)}", "generation.max_new_tokens=4",
                           f"output.path={d / 'answers.jsonl'}", "progress=false"], cwd=str(d),
                          env={"LP_RUNTIME_CACHE": "/proc/lp-runtime-test"}), None)
    d = _folder(tmp, "job_chdir")  # test_a_run_in_its_job_folder_names_its_files_from_where_it_was_started
    cases[d.name] = (Call([f"model.path={tiny_model_dir}", "model.dtype=float32", "decoding=greedy", "dataset=jsonl",
                           f"dataset.path={_questions(d, 1)}", "generation.max_new_tokens=4", "output.path=a.jsonl",
                           "hydra.run.dir=run", "hydra.job.chdir=true", "progress=false"], cwd=str(d)), None)
    d = _folder(tmp, RUN_FOLDER_CASES[0])  # two runs of test_runs_that_answer_nothing_leave_no_run_folder
    (d / "q.jsonl").write_text('{"question_id": 1, "turns": ["Count to 3."]}\n')
    run = [f"model.path={tiny_model_dir}", "model.dtype=float32", "decoding=greedy", "dataset=jsonl",
           "dataset.path=q.jsonl", "generation.max_new_tokens=4", f"output.path={d / 'out' / 'answers.jsonl'}",
           "progress=false"]
    for case, run_dir in zip(RUN_FOLDER_CASES, ["hydra.run.dir=outputs/hydra/fixed", None]):
        cases[case] = (Call(run + [run_dir] * bool(run_dir), cwd=str(d)), None)
    calls = []
    for name, (overrides, _) in cases.items():
        if isinstance(overrides, Call):
            calls.append(overrides)
            continue
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


def test_a_sweep_job_refused_once_its_model_loaded_is_named(bad_input):
    """Hydra's own launcher runs a sweep's jobs in this process: a job refused once its model loaded (a step longer
    than the context) printed its error without saying which job, nor that job 0 had finished (a new user,
    2026-12-04)."""
    folder, res, _ = bad_input["sweep_refused_at_load"]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: sweep job 1 (decoding.window_size=2000): decoding.window_size=2000, "), line
    assert line.endswith("; the jobs before it finished (their answers are kept), the later ones were not run"), line
    assert len((folder / "sweep" / "0" / "answers.jsonl").read_text().splitlines()) == 1


def test_a_run_in_its_job_folder_names_its_files_from_where_it_was_started(bad_input):
    """``hydra.job.chdir=true output.path=a.jsonl``: the run printed ``answers: a.jsonl``, a file that is not where
    the user started it but in the run folder (a new user, 2026-12-07); the paths are shown absolute there."""
    folder, result, _ = bad_input["job_chdir"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == [f"answers: {folder / 'run' / 'a.jsonl'}",
                                               f"summary: {folder / 'run' / 'a.summary.json'}"]
    assert (folder / "run" / "a.jsonl").is_file()


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


@pytest.mark.parametrize("case", ["malformed_dataset", "cr_only_dataset"])
def test_malformed_dataset_line_fails_before_loading_the_model(bad_input, case):
    _check(bad_input, case)


def test_unwritable_output_fails_before_loading_the_model(bad_input):
    _check(bad_input, "unwritable_output")


@pytest.mark.parametrize("case, link, target", [("output_link_loops", "loop.jsonl", "loop.jsonl"),
                                                 ("output_link_to_nothing", "a.jsonl", "gone.jsonl")])
def test_output_path_that_is_a_broken_link_says_so(bad_input, case, link, target):
    folder = _check(bad_input, case)
    assert [p.name for p in folder.iterdir()] == [link] and os.readlink(folder / link) == target  # as it was


def test_dataset_path_is_a_folder(bad_input):
    _check(bad_input, "dataset_path_is_a_folder")


@pytest.mark.parametrize("case", ["summary_is_the_answers_file", "summary_is_the_question_file",
                                  "summary_is_another_file", "summary_is_a_device", "answers_is_a_device",
                                  "summary_beside_is_answers", "lock_beside_is_answers", "settings_beside_is_notes",
                                  "answers_path_ends_in_slash", "summary_path_ends_in_slash", "answers_path_has_no_name",
                                  "summary_is_another_runs",
                                  "twin_of_jsonl", "twin_of_bare", "settings_beside_is_a_folder",
                                  "lock_beside_is_a_folder", "summary_beside_is_a_folder"])
def test_summary_path_that_would_overwrite_another_file(bad_input, case):
    folder = _check(bad_input, case)
    line = json.dumps(_answer(1)) + "\n"
    assert {p.name: p.read_text() for p in folder.iterdir() if p.is_file()} == {
        "summary_is_the_answers_file": {},
        "summary_is_the_question_file": {"q.jsonl": '{"question_id": 1, "turns": ["hi"]}\n'},
        "summary_is_another_file": {"notes.txt": "mine\n"},
        "summary_is_a_device": {}, "answers_is_a_device": {}, "answers_path_ends_in_slash": {},
        "answers_path_has_no_name": {},
        "summary_beside_is_answers": {"a.summary.json": line}, "lock_beside_is_answers": {"a.lock": line},
        "settings_beside_is_notes": {"a.settings.json": "notes\n"}, "twin_of_jsonl": {"a.jsonl": line},
        "twin_of_bare": {"a": line}, "settings_beside_is_a_folder": {}, "lock_beside_is_a_folder": {},
        "summary_beside_is_a_folder": {}, "summary_path_ends_in_slash": {},
        "summary_is_another_runs": {"b.jsonl": line, "b.summary.json": json.dumps(
            {"answers": str(folder / "b.jsonl"), "num_questions": 1})}}[case]  # left as they were, nothing new
    folders = {"settings": ["a.settings.json"], "lock_b": ["a.lock"], "summary_b": ["a.summary.json"]}
    assert [p.name for p in folder.iterdir() if p.is_dir()] == next(
        (names for start, names in folders.items() if case.startswith(start) and case.endswith("a_folder")), [])
    if case.endswith("device"):
        assert [p.name for p in folder.iterdir()] == ["fifo"] and (folder / "fifo").is_fifo()


def test_a_file_beside_the_output_that_holds_no_answers_is_not_its_twin(tmp_path):
    """``_check_own_stem`` refuses ``output.path=a`` only where ``a.jsonl`` holds answers: a question file
    ``q.jsonl`` beside ``output.path=q``, notes in ``n`` beside ``n.jsonl``, and a link ``b -> b.jsonl`` (one file, one
    set of records) were refused as "holds answers" (a review, 2026-12-07)."""
    from lp_runtime.answers import OutputError, check_summary_path
    from lp_runtime.config import OutputConfig, RunConfig

    (tmp_path / "q.jsonl").write_text('{"question_id": 1, "turns": ["hi"]}\n')
    (tmp_path / "n").write_text("my notes\nmore\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(_answer(1)) + "\n")
    os.symlink("b.jsonl", tmp_path / "b")
    for path in ("q", "n.jsonl", "b.jsonl"):
        check_summary_path(RunConfig(output=OutputConfig(path=str(tmp_path / path))))
    (tmp_path / "n").write_text(json.dumps(_answer(1)) + "\n")  # an answers file: refused, the summary given apart
    with pytest.raises(OutputError) as e:
        check_summary_path(RunConfig(output=OutputConfig(path=str(tmp_path / "n.jsonl"),
                                                         summary_path=str(tmp_path / "s.json"))))
    assert str(e.value).startswith(f"output path {tmp_path / 'n.jsonl'} would write its settings record and lock "
                                   f"({tmp_path / 'n'}.settings.json, {tmp_path / 'n'}.lock) over those of ")


@pytest.mark.parametrize("case", [*RECORD_FORMATS, "record_unknown_key"])
def test_a_settings_record_this_version_did_not_write_is_refused_and_kept(bad_input, case):
    folder = _check(bad_input, case)
    settings = {"decoding.method": "greedy", **({"decoding.branch_ngrams": 2} if case.endswith("key") else {})}
    assert {p.name: p.read_text() for p in folder.iterdir()} == {  # as they were; no run folder, no lock left
        "q.jsonl": '{"question_id": 1, "turns": ["Count to 3."]}\n', "a.jsonl": json.dumps(_answer(1)) + "\n",
        "a.settings.json": json.dumps({"format": RECORD_FORMATS.get(case, 1), "settings": settings})}


@pytest.mark.parametrize("case", ["auto_window", "auto_pool", "paper_depth", "model_sampling_default"])
def test_setting_that_the_method_does_not_read_is_refused(bad_input, case):
    _check(bad_input, case)


@pytest.mark.parametrize("case", ["sweep_bad_last_job", "sweep_auto_key", "sweep_wrong_type", "sweep_unknown_option",
                                  "sweep_missing_model", "sweep_lp_over_ranks"])
def test_sweep_checks_every_job_before_the_first(bad_input, case):
    folder = _check(bad_input, case)
    assert sorted(p.name for p in folder.iterdir()) == []  # no sweep folder, no job folder, no answers


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("case", ["run_dir_under_a_file", "sweep_dir_under_a_file", "launcher_of_no_tasks",
                                  "launcher_of_no_nodes"])
def test_hydra_folder_or_launcher_setting_that_cannot_work_is_one_line(bad_input, case):
    folder = _check(bad_input, case)
    assert sorted(p.name for p in folder.iterdir()) == ["f.jsonl"]


def test_refusal_leaves_no_new_folder_above_a_run_folder_outside_the_working_one(bad_input):
    """hydra.run.dir=/tmp/x/a/b refused: b was removed and the new /tmp/x/a left (a new user, 2026-12-07)."""
    folder = _check(bad_input, "refused_run_dir_elsewhere")
    assert [p.name for p in folder.iterdir()] == ["here"] and not list((folder / "here").iterdir())
    # an empty folder of the user's above hydra.run.dir was removed with the run's (a review, 2026-12-07)
    folder = _check(bad_input, "refused_run_dir_in_an_empty_folder")
    assert [str(p.relative_to(folder)) for p in sorted(folder.rglob("*"))] == ["a", "a/b", "a/b/c"]


@pytest.mark.parametrize("case", ["unknown_key", "refused_setting", "refused_bench", "bench_list_by_name",
                                  "bench_dict_key_twice",
                                  "sweep_with_one_output_file", "cfg_job_between_overrides"])
def test_refusal_leaves_no_new_folder(bad_input, case):
    assert _tree(_check(bad_input, case)) == []  # neither outputs/hydra/<time>/ nor outputs/


@pytest.mark.parametrize("case", ["cfg_job_bad_value", "info_config_bad_value", "cfg_all_unknown_key",
                                  "cfg_job_with_multirun", "cfg_job_summary_is_the_answers", "cfg_job_g0_table_off"])
def test_printed_config_is_checked_as_a_run_would_check_it(bad_input, case):
    assert _tree(_check(bad_input, case)) == []


def test_printed_config_of_good_settings_is_hydras(bad_input):
    folder, result, _ = bad_input["cfg_job_good"]
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "  window_size: 3\n" in result.stdout and "  path: out/${hydra:job.name}.jsonl\n" in result.stdout
    assert _tree(folder) == []


def test_refusal_keeps_folders_that_were_there(bad_input):
    folder = _check(bad_input, "empty_model_folder")
    assert _tree(folder) == ["empty", "outputs", "outputs/hydra"]
    folder = _check(bad_input, "refused_setting_own_run_dir")
    assert (folder / "mine" / "keep.txt").read_text() == "x" and (folder / "mine" / ".hydra" / "config.yaml").is_file()


def test_report_on_a_question_file(bad_input):
    folder = _check(bad_input, "report_on_a_question_file")
    assert _tree(folder) == ["q.jsonl"]  # no report.csv


def test_sweep_writes_one_answers_file_per_job_and_the_report_has_both_rows(bad_input):
    from lp_runtime.report import report

    folder, res, _ = bad_input["sweep"]
    assert res.returncode == 0, res.stderr[-3000:]
    for job in ("0", "1"):
        job_folder = folder / "sweep" / job
        answers = [json.loads(x) for x in (job_folder / "answers.jsonl").read_text().splitlines()]
        assert [a["question_id"] for a in answers] == [81]
        summary = json.loads((job_folder / "answers.summary.json").read_text())
        assert summary["num_questions"] == 1 and summary["answers"] == str(job_folder / "answers.jsonl")
        assert (job_folder / "answers.settings.json").is_file()

    out = report([str(folder / "sweep")], figure=False)
    rows = out["rows"]
    assert out["keys"] == ["decoding.method"]
    assert [(r["run"], r["decoding.method"], r["baseline"]) for r in rows] == [("0", "greedy", True),
                                                                              ("1", "lookahead", False)]
    greedy, lookahead = rows
    assert greedy["step_compression"] == 1.0 and greedy["speedup"] == 1.0
    assert lookahead["step_compression"] >= 1.0
    assert lookahead["speedup"] == pytest.approx(lookahead["tokens_per_s"] / greedy["tokens_per_s"])
    assert (lookahead["identical"], lookahead["compared"]) == (1, 1)  # float32 greedy: token-identical
    lines = out["text"].splitlines()
    assert lines[0].split() == ["run", "decoding.method", "questions", "turns", "S", "acc/step", "tok/s", "ms/step",
                                "speedup", "identical"]
    assert lines[2].split()[:5] == ["0", "(baseline)", "greedy", "1", "1"]
    assert lines[3].split()[:4] == ["1", "lookahead", "1", "1"]
    assert lines[3].split()[4] == f"{lookahead['step_compression']:.3f}"
    for name in ("report.csv", "report.json", "report.md"):
        assert (folder / "sweep" / name).is_file()
    assert (folder / "sweep" / "report.csv").read_text().splitlines()[0].startswith("run,decoding.method,questions")


LIBRARY_CATCHES_THE_INTERRUPT = """
import os, signal, sys, time
from lp_runtime import cli

def app():  # a library that catches the KeyboardInterrupt and raises its own error instead
    try:
        os.kill(os.getpid(), signal.SIG{sig})
        time.sleep(30)
    except KeyboardInterrupt as e:
        raise {error}("Could not import module 'AttentionInterface'") from e

cli.main(app, interrupted="interrupted; re-run to resume")
"""


@pytest.mark.parametrize("sig,error,code", [("INT", "ModuleNotFoundError", 130), ("TERM", "OSError", 143)])
def test_an_interrupt_a_library_turns_into_another_error_still_ends_the_run_as_an_interrupt(sig, error, code):
    """transformers' lazy imports turn a KeyboardInterrupt raised mid-import into ModuleNotFoundError (a clean
    clone's suite, 2026-12-02: Ctrl-C while the job imported the model code gave that traceback and exit 1). After
    Ctrl-C or SIGTERM, any error ends the run with the interrupted line and 130 / 143; OSError, a bad-input kind,
    too (no "error:" line)."""
    proc = subprocess.run([PY, "-c", LIBRARY_CATCHES_THE_INTERRUPT.format(sig=sig, error=error)], env=ENV,
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stderr.splitlines()) == (code, ["interrupted; re-run to resume"]), proc.stderr


SIGNAL_AFTER_THE_RUN = """
import os, signal, time
from lp_runtime import cli

cli.main(lambda: print("run complete", flush=True), interrupted="interrupted; re-run to resume")
os.kill(os.getpid(), signal.SIG{sig})  # what the interpreter's exit then does (~0.7 s with torch loaded)
time.sleep(0.2)
"""


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_a_signal_once_the_run_completed_changes_nothing(sig):
    """Ctrl-C in the ~0.7 s between a run's summary and the process's end: killed by the signal, 130 and no line,
    although every answer and the summary were written (a new user, 2026-12-07). The run is complete: exit 0."""
    proc = subprocess.run([PY, "-c", SIGNAL_AFTER_THE_RUN.format(sig=sig)], env=ENV, capture_output=True, text=True,
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "run complete\n", "")


TWO_RUNS_IN_ONE_INTERPRETER = """
import os, signal, time
from lp_runtime import cli

def second():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)

cli.main(lambda: None, interrupted="interrupted first")
cli.main(second, interrupted="interrupted second")
"""


def test_a_later_run_in_the_same_interpreter_still_takes_ctrl_c():
    """The first run's ignored SIGINT (above) outlived it: a second ``main`` in one interpreter (tests/cli_batch.py)
    ran through a Ctrl-C (a review, 2026-12-07). Its handlers are restored."""
    proc = subprocess.run([PY, "-c", TWO_RUNS_IN_ONE_INTERPRETER], env=ENV, capture_output=True, text=True,
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stderr) == (130, "interrupted second\n")


LIBRARY_SWALLOWS_THE_INTERRUPT = """
import os, signal, sys, time
from lp_runtime import cli

def app():  # a library that catches the KeyboardInterrupt and goes on; the job checks between answers ({where})
    try:
        os.kill(os.getpid(), signal.SIG{sig})
        time.sleep(30)
    except KeyboardInterrupt:
        pass
    if "{where}" == "between answers":
        cli.check_interrupted()
        print("answered after the interrupt")

cli.main(app, interrupted="interrupted; re-run to resume")
"""


@pytest.mark.parametrize("where", ["between answers", "at the end"])
@pytest.mark.parametrize("sig,code", [("INT", 130), ("TERM", 143)])
def test_an_interrupt_a_library_swallows_still_stops_the_run(sig, code, where):
    """A Ctrl-C while a run loaded once ended with exit 0 and no line (1 of 81 tries, 2026-12-04): a library caught
    the KeyboardInterrupt and the run went on. The job's check between answers stops it, and a run that ends
    anyway exits as interrupted."""
    proc = subprocess.run([PY, "-c", LIBRARY_SWALLOWS_THE_INTERRUPT.format(sig=sig, where=where)], env=ENV,
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (
        code, "", ["interrupted; re-run to resume"]), proc.stderr


INTERRUPT_IN_A_CALLBACK = """
import os, signal, threading, time, weakref
from lp_runtime import cli

class Tensor:
    pass

def callback(_):  # torch's compiler cleaning a weak-key dictionary: Python drops what is raised in here
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIG{sig})).start()
    start = time.time()
    while time.time() - start < 1.0:
        pass

def app():  # a long load with no check in it (torch compiling the step buckets)
    tensor = Tensor()
    ref = weakref.ref(tensor, callback)
    del tensor
    start = time.time()
    while time.time() - start < 30:
        time.sleep(0.01)
    print("ran on")

cli.main(app, interrupted="interrupted; re-run to resume")
"""


INTERRUPT_AS_THE_APP_RETURNS = """
import os, signal, time, weakref
from lp_runtime import cli

class Tensor:
    pass

def callback(_):
    os.kill(os.getpid(), signal.SIG{sig})
    start = time.time()
    while time.time() - start < 0.5:
        pass

def app():  # returns at once, before the signal is sent again: still an interrupted run
    tensor = Tensor()
    ref = weakref.ref(tensor, callback)
    del tensor

cli.main(app, interrupted="interrupted; re-run to resume")
"""

SIGTERM_IN_A_FINALIZER_WHILE_EXITING = """
import os, signal, time
from lp_runtime import cli

class Buffers:
    def __del__(self):  # freed while Ctrl-C unwinds; torchrun's SIGTERM to its workers lands in here
        os.kill(os.getpid(), signal.SIGTERM)
        start = time.time()
        while time.time() - start < 0.3:
            pass

def app():
    buffers = Buffers()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    finally:
        del buffers

cli.main(app, interrupted="interrupted; re-run to resume")
"""


@pytest.mark.parametrize("script, sig, code", [
    (INTERRUPT_AS_THE_APP_RETURNS, "INT", 130), (INTERRUPT_AS_THE_APP_RETURNS, "TERM", 143),
    (SIGTERM_IN_A_FINALIZER_WHILE_EXITING, None, 143)])
def test_an_interrupt_inside_a_callback_is_not_lost_nor_sent_to_an_exiting_process(script, sig, code):
    """The signal sent again (below) once was taken off the record for its 10 ms: a run that returned then exited 0
    with no line; and sent to a process already exiting on an interrupt it killed it (-15; a review, 2026-12-07)."""
    proc = subprocess.run([PY, "-c", script.format(sig=sig)], env=ENV, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stderr.splitlines()) == (code, ["interrupted; re-run to resume"]), proc.stderr


@pytest.mark.parametrize("sig,code", [("INT", 130), ("TERM", 143)])
def test_an_interrupt_inside_a_weakref_callback_still_stops_the_run_at_once(sig, code):
    """A SIGTERM while model.compile=true captured the step buckets was raised inside a weakref callback of torch's,
    where Python drops exceptions: "Exception ignored ... Terminated", and the run went on for 7 minutes (a new
    user, 2026-12-07). The signal comes again outside it: one line, the interrupt's exit, in well under 30 s."""
    start = time.monotonic()
    proc = subprocess.run([PY, "-c", INTERRUPT_IN_A_CALLBACK.format(sig=sig)], env=ENV, capture_output=True,
                          text=True, timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (
        code, "", ["interrupted; re-run to resume"]), proc.stderr
    assert time.monotonic() - start < 20


PEER_FAILS = """
from lp_runtime import cli
from lp_runtime.config import PeerFailure

def app():
    raise PeerFailure("rank 0: all_gather failed (a peer rank died, or did not reach it within the 15.0 s timeout "
                      "parallel.timeout_s): DistBackendError: Timed out waiting 15000ms")

cli.main(app, interrupted="interrupted; re-run to resume")
"""


def test_a_dead_or_hung_peer_rank_is_one_error_line_and_exit_1():
    """A rank stopped (kill -STOP) under torchrun: rank 0's all-gather timed out and every rank printed a
    60-line traceback, the message inside it (a new user, 2026-12-03). Now the rank's one line and exit 1."""
    proc = subprocess.run([PY, "-c", PEER_FAILS], env=ENV, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr.splitlines()) == (1, [
        "error: rank 0: all_gather failed (a peer rank died, or did not reach it within the 15.0 s timeout "
        "parallel.timeout_s): DistBackendError: Timed out waiting 15000ms; the answers written so far are complete: "
        "re-run the same command to resume"]), proc.stderr


def test_a_later_turn_that_the_earlier_answers_push_past_the_context_is_kept_unanswered(tmp_path, tiny_model_dir,
                                                                                       capsys):
    """Turn 1 answered with up to max_new_tokens fills the 1024-token context, so turn 2's prompt (which holds it)
    does not fit. The run stopped there, losing turn 1's answer (a new user, 2026-12-04): now turn 1 is kept, turn 2
    is written with no tokens and finish_reason "length", and one line says why."""
    q = tmp_path / "q.jsonl"
    # turn 1's prompt is 631 tokens and turn 2's, with an empty answer, 743: both fit. Turn 1's answer, capped at the
    # context (~390 tokens; a short turn 1 made it decode ~950 for the same overflow), pushes turn 2 past it.
    q.write_text(json.dumps({"question_id": 5, "turns": ["word " * 600, "word " * 100]}) + "\n"
                 + json.dumps({"question_id": 6, "turns": ["Hi", "Bye"]}) + "\n")
    out = tmp_path / "answers.jsonl"
    run_config(_args(tiny_model_dir, q, out, "progress=false", "generation.max_new_tokens=5000",
                     "decoding=lookahead"))
    first, second = [json.loads(line)["choices"][0] for line in out.read_text().splitlines()]
    assert first["new_tokens"][1] == 0 and first["output_ids"][1] == [] and first["turns"][1] == ""
    assert first["decoding_steps"][1] == 0 and first["accept_lengths"][1] == []
    assert first["finish_reason"] == ["length", "length"]
    assert 631 + first["new_tokens"][0] == 1024  # turn 1 decoded up to the context's end
    assert all(second["new_tokens"])  # the next question is answered as usual
    assert ("[5] turn 2 not answered: the earlier turns' answers fill the model's context; a smaller "
            "generation.max_new_tokens (now 5000) leaves it room") in capsys.readouterr().out.splitlines()
    # a later turn whose own text fills the context: no budget helps, and it was written unanswered with exit 0 (a
    # new user, session 22): refused before any question, as a first turn is
    from lp_runtime.config import ConfigError

    q.write_text(json.dumps({"question_id": 8, "turns": ["Say hi.", "word " * 1100]}) + "\n")
    with pytest.raises(ConfigError, match=r"^question 8, turn 2 with the earlier turns' answers left empty: the prompt "
                                          r"\(\d+ tokens\) fills the model's context of 1024 tokens; it leaves no "
                                          r"room for a new token: shorten it; no question was answered"):
        run_config(_args(tiny_model_dir, q, tmp_path / "b.jsonl", "progress=false", "decoding=lookahead"))
    assert not (tmp_path / "b.jsonl").exists()


def test_the_python_apis_decoding_auto_decodes_as_the_main_job(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """``LookaheadGenerator``'s default ``DecodingConfig()`` (decoding=auto) took the preset's W = 0 and never the
    successor table, while the main job takes W from the latency curve and the table where its calibration says
    so (a review, 2026-12-04): the API was not "the main job's default" its README says. Now the same tokens and
    the same steps, and the same one start-up line."""
    from lp_runtime import LookaheadGenerator, latency, models
    from lp_runtime.config import ModelConfig

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path / "cache"))
    model_cfg = ModelConfig(path=str(tiny_model_dir), dtype="float32")
    gen_model, _ = models.load_model(model_cfg, progress=False)
    flat = {1: 0.01, 64: 0.01}  # a GPU-like curve: auto_window chooses W > 0 on it
    latency.latency_profile(models.model_id_of(gen_model), latency.device_key(gen_model), "float32",
                            measure=lambda: flat)
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "turns": ["Write a haiku about the sea."]}) + "\n")
    out = tmp_path / "answers.jsonl"
    run_config(_args(tiny_model_dir, q, out, "progress=false", "decoding=auto", "generation.max_new_tokens=48"))
    job_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("decoding=auto:"))
    choice = json.loads(out.read_text())["choices"][0]
    gen = LookaheadGenerator.from_config(model_cfg, progress=False)
    api_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert gen.decoder.cfg.window_size > 0  # from the flat curve, not the preset's 0
    res = gen.generate("Write a haiku about the sea.", max_new_tokens=48)
    assert (res.output_ids, res.decoding_steps) == (choice["output_ids"][0], choice["decoding_steps"][0])
    assert api_line.split(", cost policy")[1] == job_line.split(", cost policy")[1]  # the same setting and estimate


def test_report_says_why_a_bfloat16_greedy_run_may_not_be_identical(tmp_path):
    """A bfloat16 sweep showed "identical 0/2" with no word why (a new user, session 22; README's Precision): a line
    says a 16-bit greedy run may part at a rounding tie; none for float32 runs, or for 16-bit runs identical on all."""
    from lp_runtime.report import report

    def run(name: str, method: str, dtype: str, ids: list) -> None:
        (tmp_path / name).mkdir()
        rec = _answer(1)
        rec["choices"][0]["output_ids"] = [ids]
        (tmp_path / name / "answers.jsonl").write_text(json.dumps(rec) + "\n")
        (tmp_path / name / "answers.settings.json").write_text(json.dumps(
            {"format": 1, "settings": {"decoding.method": method, "model.resolved_dtype": dtype}}))

    run("greedy", "greedy", "bfloat16", [1, 2])
    run("lookahead", "lookahead", "bfloat16", [1, 3])
    run("float16_same", "lookahead", "float16", [1, 2])  # identical: its dtype is no part of the note
    lines = report([str(tmp_path)], figure=False)["text"].splitlines()
    assert lines[-1] == ("lookahead: not identical on every question, with bfloat16 in the comparison: greedy in a "
                         "16-bit dtype may part at a rounding tie (the two largest logits within its rounding) without "
                         "a fault; README, Precision (scripts/bench.py checks each parting)")
    for dtype, ids in (("float32", [1, 3]), ("bfloat16", [1, 2])):
        for name in ("greedy", "lookahead"):
            settings = tmp_path / name / "answers.settings.json"
            record = json.loads(settings.read_text())
            record["settings"]["model.resolved_dtype"] = dtype
            settings.write_text(json.dumps(record))
        rec = _answer(1)
        rec["choices"][0]["output_ids"] = [ids]
        (tmp_path / "lookahead" / "answers.jsonl").write_text(json.dumps(rec) + "\n")
        assert "rounding tie" not in report([str(tmp_path)], figure=False)["text"]


def test_sigterm_to_the_torchrun_script_alone_is_held_and_a_completed_run_exits_0(tmp_path):
    """SIGTERM to the launch script's pid alone: bash holds it until torchrun ends; the run completed, but the
    script exited 143 as if stopped (a new user, 2026-12-05). Now torchrun's 0 and a note saying how to stop a run."""
    proc = _started_script(tmp_path, "echo started\nsleep 1\necho done\n")
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "done\n")
    assert err == ("note: a SIGTERM reached this script while torchrun ran, and the run completed (the script holds "
                   "a SIGTERM sent to it alone until torchrun ends); to stop a run, send SIGTERM to torchrun and its "
                   "ranks too, e.g. to their process group, as timeout does\n")


def test_report_shows_a_run_whose_settings_record_is_of_another_format(tmp_path):
    """A settings record of another format refuses a resume (answers.read_settings), but the report shows what it
    holds: the whole report failed on one such record (exit 2, advising another output.path)."""
    from lp_runtime.report import report

    for name, method, fmt in (("greedy", "greedy", 1), ("lookahead", "lookahead", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "answers.jsonl").write_text(json.dumps(_answer(1)) + "\n")
        (tmp_path / name / "answers.settings.json").write_text(json.dumps(
            {"format": fmt, "settings": {"decoding.method": method}}))
    rows = report([str(tmp_path)], figure=False)["rows"]
    assert [(r["run"], r["decoding.method"]) for r in rows] == [("greedy", "greedy"), ("lookahead", "lookahead")]


def test_an_answers_folder_deleted_mid_run_stops_the_run(tmp_path, tiny_model_dir):
    """``rm -rf`` of the output folder while a run went on: it made the folder again, wrote the later answers
    without the earlier ones or a settings record, and ended with exit 0 and a summary counting all of them; the
    next run refused the file (a new user, 2026-12-07). The run now stops at its next answer, saying so."""
    out = tmp_path / "out" / "answers.jsonl"
    cmd = [PY, "-m", "lp_runtime.generate", *_args(tiny_model_dir, _questions(tmp_path, 400), out, "progress=false",
                                                   "generation.max_new_tokens=32", "hydra.run.dir=run")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out.is_file() and out.read_text().count("\n") >= 1) and time.time() < deadline:
        time.sleep(0.01)
    shutil.rmtree(out.parent)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and err.splitlines()[-1].startswith(
        f"error: the answers file {out} is gone (deleted or moved while the run went on; "), err[-2000:]
    assert not out.exists()


SWEEP_JOB_STOPPED = """
import sys
from lp_runtime import cli

class UncompletedJobError(RuntimeError):  # submitit's, as the launcher raises it with the job's stderr
    pass

def app():
    raise UncompletedJobError("Job 12 (task: 0) failed\\nstderr:\\nerror: " + sys.argv[1])

cli.main(app, interrupted="interrupted")
"""


@pytest.mark.parametrize("line, code", [
    ("rank 0: all_gather failed (a peer rank died, or did not reach it within the 15.0 s timeout "
     "parallel.timeout_s): RuntimeError: Connection reset by peer; " + RESUME, 1),
    ("output path a.jsonl is in use by another run (pid 1 on host h); wait for it to finish or choose another "
     "output.path", 2)])
def test_a_sweep_job_that_stopped_exits_as_its_rank_did(line, code):
    """A rank killed in an lp_local sweep job: "a sweep job stopped: rank 0: ... a peer rank died ..." with exit 2,
    the code of refused input (a new user, 2026-12-07); a dead or hung peer is 1, as in a single run."""
    proc = subprocess.run([PY, "-c", SWEEP_JOB_STOPPED, line], env=ENV, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr.splitlines()) == (code, [f"error: a sweep job stopped: {line}"])
