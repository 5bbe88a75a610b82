"""Faults a new user met on a fresh clone: each is checked for its kind, with the exact message, in seconds.

Config composition goes through Hydra's compose API (no model); command-line checks run
``python -m lp_runtime.generate`` on faults refused before the model loads; the rest use the tiny model folder
of ``conftest.tiny_model_dir`` or no model at all.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from scripts.bench import BenchConfig
from lp_runtime.config import ConfigError, GenerationConfig, ModelConfig, RunConfig, to_object
from lp_runtime.cli import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
CONF = Path(CONF_DIR)
PY = sys.executable


def cli(*args: str, cwd=None, module: str = "lp_runtime.generate", timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([PY, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a refused run (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


def _compose(config_name: str, overrides: list[str], hydra: bool = False):
    from scripts.bench import register_schema

    register_schema()  # run_schema and bench_schema
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name, overrides=overrides, return_hydra_config=hydra)


# ------------------------------------------------------------------ 1. every conf file composes and validates
GROUP_OPTIONS = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml") if p.parent.name != "hydra")


@pytest.mark.parametrize("group,option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes(group, option):
    extra = ["dataset.path=questions.jsonl"] if (group, option) == ("dataset", "jsonl") else []
    cfg = _compose("generate", [f"{group}={option}", *extra])
    assert isinstance(to_object(cfg), RunConfig)  # no YAML key the schema lacks


@pytest.mark.parametrize("launcher", sorted(p.stem for p in (CONF / "hydra" / "launcher").glob("*.yaml")))
def test_every_launcher_composes(launcher):
    cfg = _compose("generate", [f"hydra/launcher={launcher}"], hydra=True)
    assert cfg.hydra.launcher.nodes == 1


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_every_top_level_config_composes(name):
    cfg = _compose(name, [])
    assert isinstance(to_object(cfg), BenchConfig if name.startswith("bench") else RunConfig)


# ------------------------------------------------------------------ 1b. a key no setting has (Hydra's +key=value)
DECODING_KEYS = ("chain, commit, cross_question, guess_set_size, lookup, max_depth, method, ngram_keys, ngram_size, "
                 "pool_from_prompt, ranking, seed, tree, window_size")


@pytest.mark.parametrize("config_name,override,message", [
    ("generate", "+decoding.window_init=lookup",  # removed this session: must not be ignored silently
     f"decoding.window_init is not a setting; decoding has: {DECODING_KEYS}"),
    ("generate", "+bogus=1", "bogus is not a setting; the top level has: dataset, decoding, generation, model, "
                             "model_id, output, parallel, progress, sampling"),
    ("bench", "+datasets.0.bogus=1", "datasets[0].bogus is not a setting; datasets[0] has: first_turn_only, "
                                     "limit, name, path"),
])
def test_unknown_key_is_refused(config_name, override, message):
    cfg = _compose(config_name, [override])
    with pytest.raises(ConfigError) as e:
        to_object(cfg)
    assert str(e.value) == message


def test_unknown_key_on_the_command_line():
    assert error_line(cli("+decoding.branch_ngrams=true", "dataset.limit=1")) == (
        f"error: decoding.branch_ngrams is not a setting; decoding has: {DECODING_KEYS}")


# ------------------------------------------------------------------ 2. a dict override into a null dict field
@pytest.mark.parametrize("sampling", ["greedy", "default", "model", "mt_bench"])
def test_category_temperature_override(sampling):
    cfg = _compose("generate", [f"sampling={sampling}", "sampling.category_temperature={writing: 0.3}"])
    assert OmegaConf.to_object(cfg).sampling.category_temperature["writing"] == 0.3
    cfg = _compose("generate", [f"sampling={sampling}", "sampling.category_temperature={writing: -1}"])
    with pytest.raises(ConfigError) as e:
        OmegaConf.to_object(cfg)
    assert str(e.value) == "sampling.category_temperature['writing']=-1 is not allowed; it must be >= 0"


def test_category_temperature_not_a_table():
    cfg = _compose("generate", ["sampling.category_temperature=[1]"])
    with pytest.raises(ConfigError) as e:
        OmegaConf.to_object(cfg)
    assert str(e.value) == ("sampling.category_temperature=[1] is not allowed; give null or {category: temperature}, "
                            "e.g. sampling.category_temperature='{writing: 0.7, math: 0}'")


# ------------------------------------------------------------------ 3, 6. a model folder or GGUF file that is not there
def test_model_folder_without_a_model(tmp_path):
    from lp_runtime.models import ModelLoadError, check_model_files

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError) as e:
        check_model_files(ModelConfig(path=str(empty)))
    assert str(e.value) == (f"model.path={str(empty)!r} holds neither config.json (a transformers model folder) nor a "
                            ".gguf file (for model.gguf_file); give a folder saved by save_pretrained, a HuggingFace "
                            "id, or bundled:smollm2")
    (empty / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError) as e:
        check_model_files(ModelConfig(path=str(empty)))
    assert str(e.value) == (f"model.path={str(empty)!r} holds no config.json; to load a GGUF file there set "
                            "model.gguf_file (its .gguf files: m.gguf)")
    with pytest.raises(ModelLoadError) as e:
        check_model_files(ModelConfig(path=str(empty), gguf_file="nosuch.gguf"))
    assert str(e.value) == f"model.gguf_file='nosuch.gguf' is not a file in model.path={str(empty)!r} (its .gguf files: m.gguf)"
    check_model_files(ModelConfig(path=str(empty), gguf_file="m.gguf"))  # there: loading decides


def test_gguf_file_with_the_bundled_model():
    from lp_runtime.models import ModelLoadError, check_model_files

    with pytest.raises(ModelLoadError) as e:
        check_model_files(ModelConfig(gguf_file="nosuch.gguf"))
    assert str(e.value) == ("model.gguf_file='nosuch.gguf' is not used with model.path='bundled:smollm2' (the bundled "
                            "model is its own GGUF); leave model.gguf_file unset, or set model.path to the folder that "
                            "holds that file")


# ------------------------------------------------------------------ 3, 7. the command line: one line, no new folder
def test_empty_model_folder_on_the_command_line_leaves_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "outputs" / "hydra").mkdir(parents=True)  # existed before: kept (its new run folder is not)
    proc = cli("model.path=empty", "progress=false", cwd=tmp_path)
    assert error_line(proc) == ("error: model.path='empty' holds neither config.json (a transformers model folder) nor "
                                "a .gguf file (for model.gguf_file); give a folder saved by save_pretrained, a "
                                "HuggingFace id, or bundled:smollm2")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["empty", "outputs", "outputs/hydra"]


def test_refused_setting_removes_only_hydra_records(tmp_path):
    proc = cli("decoding.window_size=-1", cwd=tmp_path)
    assert error_line(proc) == "error: decoding.window_size=-1 is negative; W must be >= 0"
    assert list(tmp_path.iterdir()) == []  # neither outputs/hydra/<time>/ nor outputs/
    run_dir = tmp_path / "mine"
    (run_dir / "keep.txt").parent.mkdir()
    (run_dir / "keep.txt").write_text("x")
    proc = cli("decoding.window_size=-1", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert error_line(proc) == "error: decoding.window_size=-1 is negative; W must be >= 0"
    assert (run_dir / "keep.txt").read_text() == "x" and (run_dir / ".hydra" / "config.yaml").is_file()


def test_refused_bench_leaves_no_hydra_folder(tmp_path):
    proc = cli("ablation=true", cwd=tmp_path, module="scripts.bench")
    assert error_line(proc) == ("error: ablation=true switches decoding=auto's levers off one at a time; "
                                "add decoding=auto")
    assert list(tmp_path.iterdir()) == []  # neither outputs/bench/hydra/<time>/ nor outputs/


# ------------------------------------------------------------------ 4, 12c. an answers file that is not one
def test_report_on_a_question_file(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"question_id": 1, "turns": ["hi"]}\n')
    proc = cli(str(q), module="lp_runtime.report")
    assert error_line(proc) == (f"error: {q} line 1 is a question (an answer line has question_id and choices[0] with "
                                "output_ids, new_tokens, decoding_steps, wall_time, accept_lengths), so "
                                f"{q} is not an answers file; give answers files of python -m lp_runtime.generate, "
                                "or a folder holding them")
    assert not (tmp_path / "report.csv").exists()


def test_answers_file_checks_name_the_answers_file(tmp_path):
    from lp_runtime.answers import OutputError, load_answers

    a = tmp_path / "a.jsonl"
    a.write_text('{"question_id": 1, "choices": []}\n')
    with pytest.raises(OutputError) as e:
        load_answers(a, trim=True)
    assert str(e.value) == (f"{a} line 1 is not an answer (an answer line has question_id and choices[0] with "
                            f"output_ids, new_tokens, decoding_steps, wall_time, accept_lengths), so {a} is not an "
                            "answers file; move the file away or choose another output.path")
    a.write_bytes(b'{"question_id": 1}\n\xff\n')
    with pytest.raises(OutputError) as e:
        load_answers(a, trim=True)
    assert str(e.value) == (f"{a} line 2: byte 1 (b'\\xff') is not UTF-8; an answers file is written as UTF-8, so this "
                            "one was changed elsewhere; move the file away or choose another output.path")
    assert a.read_bytes() == b'{"question_id": 1}\n\xff\n'


# ------------------------------------------------------------------ 5. dataset.path without dataset=jsonl
@pytest.mark.parametrize("name", ["mt_bench", "humaneval"])
def test_dataset_path_needs_jsonl(name):
    from lp_runtime.config import DatasetConfig

    with pytest.raises(ConfigError) as e:
        DatasetConfig(name=name, path="nosuch.jsonl")
    assert str(e.value) == (f"dataset.path='nosuch.jsonl' is only read with dataset=jsonl (now dataset={name}); add "
                            "dataset=jsonl to answer the questions in that file, or drop dataset.path")


# ------------------------------------------------------------------ 11. values only the loaded model can bound
def _tiny(ctx=256, vocab=96):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=ctx))


def test_token_ids_outside_the_vocabulary():
    from lp_runtime.config import DecodingConfig, SamplingConfig
    from lp_runtime.models import check_limits

    model = _tiny()
    with pytest.raises(ConfigError) as e:
        check_limits(model, DecodingConfig(), generation=GenerationConfig(eos_token_ids=[2, 99999999]))
    assert str(e.value) == ("generation.eos_token_ids=[2, 99999999] is not allowed: token id 99999999 is outside the "
                            "model's vocabulary of 96 ids (0..95)")
    with pytest.raises(ConfigError) as e:
        check_limits(model, DecodingConfig(), SamplingConfig(suppress_tokens=[96]))
    assert str(e.value) == ("sampling.suppress_tokens=[96] is not allowed: token id 96 is outside the model's "
                            "vocabulary of 96 ids (0..95)")
    check_limits(model, DecodingConfig(), SamplingConfig(suppress_tokens=[95]), GenerationConfig(eos_token_ids=[0]))


@pytest.mark.parametrize("over,step", [
    (dict(window_size=100000), 1 + 99999 + 2 * 100000 + 2 * 10),
    (dict(ngram_size=100000, lookup="pool"), 1 + 2 + 99998 * 3 + 2 * 99999),
    (dict(guess_set_size=100000), 1 + 2 + 2 * 3 + 100000 * 10),
    (dict(max_depth=100000, window_size=0), 1 + 2 * 100000),
])
def test_lookahead_step_must_fit_the_context(over, step):
    from lp_runtime.config import DecodingConfig
    from lp_runtime.models import check_limits

    cfg = DecodingConfig(**{"window_size": 3, "ngram_size": 4, "guess_set_size": 2, **over})
    with pytest.raises(ConfigError) as e:
        check_limits(_tiny(), cfg)
    depth = 3 if cfg.lookup == "pool" else max(cfg.max_depth, cfg.ngram_size - 1)
    depth_key = "" if cfg.lookup == "pool" else f", decoding.max_depth={cfg.max_depth}"
    assert str(e.value) == (
        f"decoding.window_size={cfg.window_size}, decoding.ngram_size={cfg.ngram_size}, decoding.guess_set_size="
        f"{cfg.guess_set_size}{depth_key} make a lookahead step of {step} tokens ("
        f"{'1 + (W-1) + (N-2)*W window tokens' if cfg.window_size else '1 pending token'} + G candidates of {cfg.ngram_size - 1 if cfg.lookup == 'pool' else depth} tokens), more than the model's "
        "context of 256 tokens (max_position_embeddings); lower them so that a step fits")


def test_largest_step_that_fits_is_accepted():
    from lp_runtime.config import DecodingConfig
    from lp_runtime.models import check_limits

    check_limits(_tiny(ctx=1 + 2 + 2 * 3 + 2 * 10), DecodingConfig(window_size=3, ngram_size=4, guess_set_size=2))
    with pytest.raises(ConfigError):
        check_limits(_tiny(ctx=2 + 2 * 3 + 2 * 10), DecodingConfig(window_size=3, ngram_size=4, guess_set_size=2))


# ------------------------------------------------------------------ 10. one fixed output file for a whole sweep
def test_sweep_with_one_fixed_output_path_is_refused_up_front(tmp_path):
    from lp_runtime.jobs import check_sweep_outputs

    with pytest.raises(ConfigError) as e:
        check_sweep_outputs(["-m", "decoding.window_size=0,3", "output.path=out/a.jsonl", "progress=false"])
    assert str(e.value) == (
        "output.path=out/a.jsonl names one file for every job of this --multirun sweep (decoding.window_size=0,3), "
        "but one answers file holds the answers of one setting; drop output.path so that each job writes into its "
        "own folder (<hydra.sweep.dir>/<job number>/), or put the job number in it: "
        "'output.path=outputs/sweep/${hydra:job.num}/answers.jsonl'")
    check_sweep_outputs(["-m", "decoding.window_size=0,3", "output.path=out/${hydra:job.num}/a.jsonl"])  # per job
    check_sweep_outputs(["-m", "decoding.window_size=3", "output.path=out/a.jsonl"])  # one job
    check_sweep_outputs(["decoding.window_size=3", "output.path=out/a.jsonl"])  # not a sweep
    check_sweep_outputs(["-m", "--config-name", "generate", "decoding.window_size=0,3"])  # no output.path
    with pytest.raises(ConfigError):
        check_sweep_outputs(["--cfg", "job", "--multirun", "output.path=a.jsonl", "decoding.window_size=0,3"])
    proc = cli("-m", "decoding.window_size=0,3", "output.path=out/a.jsonl", cwd=tmp_path)
    assert error_line(proc).startswith("error: output.path=out/a.jsonl names one file for every job")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ 12a, 12f. SIGTERM like Ctrl-C; resume; the count
def test_sigterm_keeps_complete_lines_and_resumes(tmp_path, tiny_model_dir, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "turns": [f"Count to {i}."]}) + "\n"
                                 for i in range(8)))
    out = tmp_path / "out" / "answers.jsonl"
    args = [f"model.path={tiny_model_dir}", "model.dtype=float32", "decoding=greedy", "dataset=jsonl",
            f"dataset.path={questions}", "generation.max_new_tokens=48", f"output.path={out}", "progress=true"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([PY, "-m", "lp_runtime.generate", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out.exists() and out.read_bytes().count(b"\n") >= 1) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert err.endswith("\ninterrupted; the answers written so far are complete: re-run the same command to "
                        "resume\n")  # on a line of its own, not on the progress bar's
    assert "questions:" in err  # the bar was there
    assert "Traceback" not in err
    done = len(out.read_bytes().split(b"\n")[:-1])
    assert 1 <= done < 8  # stopped part-way
    from lp_runtime.generate import run

    run(OmegaConf.to_object(_compose("generate", args)))  # the same config as the command line's; resumes
    ids = [json.loads(line)["question_id"] for line in out.read_text().splitlines()]
    assert ids == list(range(8))  # each once, in order: the interrupted run's lines were complete
    capsys.readouterr()
    run(OmegaConf.to_object(_compose("generate", [*args, "dataset.limit=1"])))
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == f"already answered in {out}:" and shown[1].startswith("[0] ")  # the answer in the file
    assert shown[2:] == [f"all 1 questions of the dataset are already in {out}; nothing to do "
                         f"(summary kept: {tmp_path / 'out' / 'answers.summary.json'})"]


# ------------------------------------------------------------------ 12b, 12d, 12e. messages that name the key
def test_summary_path_folder_names_its_key(tmp_path):
    from lp_runtime.answers import OutputError, check_output_path

    with pytest.raises(OutputError) as e:
        check_output_path(tmp_path, create=True, key="output.summary_path")
    assert str(e.value) == f"output.summary_path={tmp_path} is a folder; give a file path such as {tmp_path / 'summary.json'}"


def test_numeric_stop_string_says_how_to_quote():
    with pytest.raises(ConfigError) as e:
        GenerationConfig(stop_strings=10)
    assert str(e.value) == ("generation.stop_strings=10 is not allowed; give a list of strings, e.g. "
                            "generation.stop_strings=[hello] or '[\"\\n\\n\"]'; quote a number to make it a string: "
                            "generation.stop_strings='[\"10\"]'")


def test_api_prompt_of_the_wrong_kind(tiny_model_dir):
    from lp_runtime.api import LookaheadGenerator

    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"))
    with pytest.raises(ConfigError) as e:
        gen.generate(None, max_new_tokens=4)
    assert str(e.value) == ("the prompt is NoneType; give text (str), a list of messages ({'role', 'content'} dicts) "
                            "or a list of token ids")
    with pytest.raises(ConfigError) as e:
        gen.generate("", max_new_tokens=4)
    assert str(e.value) == "the prompt is empty text; give a non-empty user turn"


# ------------------------------------------------------------------ 8. launch scripts: paths are the caller's
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
    env.update(SLURM_JOB_ID="7", SLURM_NNODES="1", HEAD_NODE="127.0.0.1", LP_RUNTIME_SRUN="", NPROC_PER_NODE="1")
    proc = subprocess.run(["bash", str(repo / "launch" / script), "output.path=rel/answers.jsonl"], cwd=caller,
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"cwd={caller}"
    assert "-m lp_runtime.generate" in lines[1] and lines[1].endswith("output.path=rel/answers.jsonl")
