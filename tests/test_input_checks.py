"""Bad input a new user met on a fresh clone, checked without the command line (that is test_cli.py): every conf
file composes, keys no setting has, values only the loaded model can bound, answers files that are not one,
messages that name the key. Each is checked for its kind, with the exact message, in seconds: config composition
goes through Hydra's compose API (no model); the rest use the tiny model folder of ``conftest.tiny_model_dir`` or
no model at all.
"""
from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lp_runtime.cli import CONF_DIR
from lp_runtime.config import ConfigError, GenerationConfig, ModelConfig, RunConfig, to_object
from scripts.bench import BenchConfig
from fakes import lookahead

CONF = Path(CONF_DIR)


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
DECODING_KEYS = "guess_set_size, max_depth, method, ngram_size, pool_from_prompt, seed, successors, window_size"


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


@pytest.mark.parametrize("config_name,override,message", [
    ("generate", "bogus=1", "bogus is not a setting; the top level has: dataset, decoding, generation, model, "
                            "model_id, output, parallel, progress, sampling"),
    ("generate", "bogus.deeper=1", "bogus is not a setting; the top level has: dataset, decoding, generation, model, "
                                   "model_id, output, parallel, progress, sampling"),
    ("generate", "decoding.window_init=lookup", f"decoding.window_init is not a setting; decoding has: {DECODING_KEYS}"),
    ("bench", "datasets.0.bogus=1", "datasets[0].bogus is not a setting; datasets[0] has: first_turn_only, limit, "
                                    "name, path"),
])
def test_unknown_key_without_plus_is_one_line_listing_its_groups_keys(config_name, override, message):
    """Without +, Hydra refuses the key itself ("Could not override 'bogus'", OmegaConf's "Key 'bogus' not in
    'RunConfig'"), naming no key that exists: the command line's line is to_object's for +bogus=1."""
    from hydra.errors import ConfigCompositionException

    from lp_runtime.cli import one_line

    with pytest.raises(ConfigCompositionException) as e:
        _compose(config_name, [override])
    assert one_line(e.value) == message


# ------------------------------------------------------------------ 2. a dict override into a null dict field
@pytest.mark.parametrize("sampling", ["greedy", "default", "model", "mt_bench"])
def test_category_temperature_override(sampling):
    cfg = _compose("generate", [f"sampling={sampling}", "sampling.category_temperature={writing: 0.3}"])
    if sampling == "model":  # the model's temperature applies: one beside it was ignored (a new user, 2026-12-04)
        with pytest.raises(ConfigError, match=r"^sampling.category_temperature=\{'writing': 0.3\} is not allowed "
                                              r"with sampling.from_model=true \(sampling=model\), which takes "):
            OmegaConf.to_object(cfg)
        return
    assert OmegaConf.to_object(cfg).sampling.category_temperature["writing"] == 0.3
    cfg = _compose("generate", [f"sampling={sampling}", "sampling.category_temperature={writing: -1}"])
    with pytest.raises(ConfigError) as e:
        OmegaConf.to_object(cfg)
    assert str(e.value) == "sampling.category_temperature['writing']=-1 is not allowed; it must be 0 (greedy) or >= 1e-06"


def test_category_temperature_not_a_table():
    cfg = _compose("generate", ["sampling.category_temperature=[1]"])
    with pytest.raises(ConfigError) as e:
        OmegaConf.to_object(cfg)
    assert str(e.value) == ("sampling.category_temperature=[1] is not allowed; give null or {category: temperature}, "
                            "e.g. sampling.category_temperature='{writing: 0.7, math: 0}'")
    # one bad entry in a preset's table of 8: that entry named, not the whole table (a new user, 2026-12-03)
    cfg = _compose("generate", ["sampling=mt_bench", "sampling.category_temperature.writing=abc"])
    with pytest.raises(ConfigError) as e:
        OmegaConf.to_object(cfg)
    assert str(e.value) == ("sampling.category_temperature['writing']='abc' is not allowed; a temperature is a "
                            "finite number: 0 (greedy) or >= 1e-06")
    # inf was refused as "sampling.temperature=inf", a key the user had not set (a new user, 2026-12-04)
    cfg = _compose("generate", ["sampling.category_temperature={writing: inf}"])
    with pytest.raises(ConfigError) as e:
        OmegaConf.to_object(cfg)
    assert str(e.value) == ("sampling.category_temperature['writing']=inf is not allowed; a temperature is a finite "
                            "number: 0 (greedy) or >= 1e-06")


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


def test_model_folder_with_broken_weights(tiny_model_dir, tmp_path):
    """A folder whose files transformers cannot read (a truncated download: not an OSError but a safetensors
    error) is a ModelLoadError naming the folder and the reason, not a traceback, and does not advise a local
    folder (the user gave one)."""
    import shutil

    from lp_runtime.models import ModelLoadError, load_model

    folder = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelConfig(path=str(folder), dtype="float32"))
    assert str(e.value) == (f"model.path={str(folder)!r} is a local folder but could not be loaded: Error while "
                            "deserializing header: header too small; check that its files are complete (download "
                            "or save_pretrained the model again)")


@pytest.mark.parametrize("name, text, error", [
    ("tokenizer.json", "this is not json", "Expecting value: line 1 column 1 (char 0)"),
    ("tokenizer.json", "{", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ("tokenizer_config.json", "this is not json", "Expecting value: line 1 column 1 (char 0)"),
    ("config.json", '{"model_type": "llama",', "Expecting property name enclosed in double quotes: line 1 column "
                                               "24 (char 23)"),
])
def test_model_folder_with_a_file_that_is_not_json(tiny_model_dir, tmp_path, name, text, error):
    """A config or tokenizer JSON file of a local folder that does not parse is named, with the parser's error
    (transformers' own message names no file, or is the parser's line and column alone)."""
    import shutil

    from lp_runtime.models import ModelLoadError, load_model

    folder = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, folder)
    (folder / name).write_text(text)
    with pytest.raises(ModelLoadError) as e:
        load_model(ModelConfig(path=str(folder), dtype="float32"))
    assert str(e.value) == (f"model.path={str(folder)!r} is a local folder whose {name} is not valid JSON ({error}); "
                            "replace that file with the model's own (download or save_pretrained the model again)")


def test_gguf_file_with_the_bundled_model():
    from lp_runtime.models import ModelLoadError, check_model_files

    with pytest.raises(ModelLoadError) as e:
        check_model_files(ModelConfig(gguf_file="nosuch.gguf"))
    assert str(e.value) == ("model.gguf_file='nosuch.gguf' is not used with model.path='bundled:smollm2' (the bundled "
                            "model is its own GGUF); leave model.gguf_file unset, or set model.path to the folder that "
                            "holds that file")


# ------------------------------------------------------------------ 4, 12c. an answers file that is not one
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
    # a question answered twice (a line appended by hand, or by an unlocked run of an older version): the re-run
    # listed it twice as done and the report counted it twice (a new user, 2026-12-02); ids "7" and 7 are one id
    line = {"choices": [{"output_ids": [], "new_tokens": [], "decoding_steps": [], "wall_time": [], "accept_lengths": []}]}
    for first, second in ((81, 81), ("7", 7)):
        a.write_text("".join(json.dumps({"question_id": q, **line}) + "\n" for q in (first, 5, second)))
        before = a.read_bytes()
        with pytest.raises(OutputError) as e:
            load_answers(a, trim=True)
        assert str(e.value) == (f"{a} line 3 answers question {second!r} again ({a} line 1 did); keep one of the two "
                                "lines, or move the file away or choose another output.path")
        assert a.read_bytes() == before


def _answers(tmp_path: Path, first: dict, second: dict) -> Path:
    """An answers file of two one-turn answers (2 tokens in 2 steps each), ``first`` / ``second`` edited in."""
    good = {"output_ids": [[1, 2]], "new_tokens": [2], "decoding_steps": [2], "wall_time": [0.5],
            "accept_lengths": [[1, 1]]}
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps({"question_id": i, "choices": [{**good, **edit}]}) + "\n"
                         for i, edit in ((1, first), (2, second))))
    return a


def _refused(a: Path, problem: str) -> None:
    """``load_answers(a)`` (trimming or not) raises ``problem`` + the hand-edit advice; ``a`` is left as it was."""
    from lp_runtime.answers import OutputError, load_answers

    before = a.read_bytes()
    for trim in (False, True):
        with pytest.raises(OutputError) as e:
            load_answers(a, trim=trim)
        assert str(e.value) == (f"{problem}; the file was changed by hand: restore that line or remove it (its question "
                                "is answered again), or move the file away or choose another output.path")
        assert a.read_bytes() == before


@pytest.mark.parametrize("qid, shown", [(True, "true"), (None, "null"), (1.5, "1.5"), (" ", '" "'), ([81], "[81]")])
def test_answers_line_with_an_id_a_question_file_refuses(tmp_path, qid, shown):
    """question_id edited to true was taken: question 81 was answered again beside it, and the summary and report
    counted 9 of 8 questions (a new user, 2026-12-07); refused as a question file refuses it."""
    a = _answers(tmp_path, {}, {})
    a.write_text(a.read_text().replace('{"question_id": 1,', '{"question_id": ' + json.dumps(qid) + ",", 1))
    _refused(a, f"{a} line 1: question_id is {shown}, not an int or a non-blank string")


@pytest.mark.parametrize("key, value, shown, what", [
    ("new_tokens", ["x"], '["x"]', "token counts"),
    ("new_tokens", 5, "5", "token counts"),
    ("decoding_steps", [True], "[true]", "step counts"),
    ("wall_time", [-1.0], "[-1.0]", "seconds"),
    ("accept_lengths", [[1, "2"]], '[[1, "2"]]', "lists of token counts"),
    ("output_ids", [["x"] + [1] * 30], '[["x", ' + "1, " * 16 + "1,...", "lists of token ids"),  # shown shortened
    # the texts a judge reads and the finish reasons, where a line has them: [5, 6] passed and the re-run died in
    # an AttributeError traceback, null was printed as "[81] " (a new user, 2026-12-05)
    ("turns", [5], "[5]", "texts"),
    ("turns", None, "null", "texts"),
    ("finish_reason", ["bogus"], '["bogus"]', '"stop" or "length"'),
])
def test_an_answer_line_edited_into_wrong_types_is_refused_before_anything_is_appended(tmp_path, key, value, shown,
                                                                                         what):
    """A new user set line 1's ``choices[0].new_tokens`` to "x": the resumed run appended a new answer, then died
    in the summary with a TypeError traceback (exit 1), as did every re-run and the report. One OutputError naming
    the file, line and field, the file unchanged."""
    a = _answers(tmp_path, {key: value}, {})
    _refused(a, f"{a} line 1: choices[0].{key} is {shown}, not a list of {what} (one a turn)")


@pytest.mark.parametrize("edit, what", [
    ({"new_tokens": [999]}, "turn 1 has 2 output_ids, new_tokens 999, accept_lengths summing to 2 over 2 steps and "
                            "decoding_steps 2"),
    ({"output_ids": [[1, 2, 3]]}, "turn 1 has 3 output_ids, new_tokens 2, accept_lengths summing to 2 over 2 steps "
                                  "and decoding_steps 2"),
    ({"decoding_steps": [1]}, "turn 1 has 2 output_ids, new_tokens 2, accept_lengths summing to 2 over 2 steps and "
                              "decoding_steps 1"),
    ({"wall_time": [0.5, 0.5]}, "the lists output_ids, new_tokens, decoding_steps, wall_time, accept_lengths have "
                                "1 / 1 / 1 / 2 / 1 turns"),
    ({"turns": ["a", "b"]}, "the lists output_ids, new_tokens, decoding_steps, wall_time, accept_lengths, turns "
                            "have 1 / 1 / 1 / 1 / 1 / 2 turns"),
])
def test_an_answer_line_with_counts_edited_out_of_agreement_is_refused(tmp_path, edit, what):
    """A new user changed line 2's new_tokens from 16 to 999: the re-run accepted it and its summary reported a step
    compression of 7.3 (1.19 true), and the report then measured every real run against it (2026-12-03). The
    counts a run writes agree; an edit that breaks them is one OutputError naming the line, the file unchanged."""
    a = _answers(tmp_path, {}, edit)
    _refused(a, f"{a} line 2: {what}, which a run never writes (one count a turn, all equal)")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_full_disk_is_one_line_naming_the_file_and_the_resume():
    """A full disk while appending an answer: ``error: [Errno 28] No space left on device``, naming no file and
    saying nothing of the answers kept (a new user, 2026-12-03). /dev/full fails every write with ENOSPC."""
    from lp_runtime.answers import append_line
    from lp_runtime.cli import one_line

    with pytest.raises(OSError) as e:
        append_line(Path("/dev/full"), {"question_id": 1})
    assert one_line(e.value) == ("cannot write /dev/full: No space left on device; free space there, then re-run the "
                                 "same command: the answers written so far are complete and a re-run resumes")


def test_a_write_that_fails_midway_is_cut_back_to_the_last_whole_line(tmp_path):
    """A full disk mid-line (a new user's 24 KiB tmpfs, 2026-12-03) left a 515-byte fragment after the message "the
    answers written so far are complete". A file-size limit (RLIMIT_FSIZE, in a child process) fails the write of
    the second line partway, as a full disk does: the file keeps the first line only."""
    path = tmp_path / "a.jsonl"
    child = f"""
import resource, signal
from pathlib import Path
from lp_runtime.answers import append_line
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = Path({str(path)!r})
append_line(path, {{"question_id": 1}})
resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 100, resource.RLIM_INFINITY))
try:
    append_line(path, {{"question_id": 2, "text": "x" * 5000}})
except OSError as e:
    print(e.errno, e.filename)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [str(errno.EFBIG), str(path)], out.stderr
    assert path.read_text() == '{"question_id": 1}\n'


def test_an_answers_file_with_a_byte_order_mark_resumes_and_loses_the_mark(tmp_path):
    """Notepad saves UTF-8 with a byte-order mark: 'line 1 is not JSON' refused a file a user had only trimmed as
    README's Resume section says (a new user, 2026-12-03). Read past; the resuming rank writes the file without it."""
    from lp_runtime.answers import load_answers

    line = {"choices": [{"output_ids": [], "new_tokens": [], "decoding_steps": [], "wall_time": [], "accept_lengths": []}]}
    one, two = (json.dumps({"question_id": q, **line}) + "\n" for q in (1, 2))
    a = tmp_path / "a.jsonl"
    a.write_bytes(b"\xef\xbb\xbf" + (one + two).encode())
    before = a.read_bytes()
    assert [r["question_id"] for r in load_answers(a, trim=False)] == [1, 2] and a.read_bytes() == before
    assert [r["question_id"] for r in load_answers(a, trim=True)] == [1, 2]
    assert a.read_text() == one + two and not list(tmp_path.glob("*.tmp*"))


def test_blank_lines_in_an_answers_file_are_dropped_on_resume(tmp_path):
    """A blank line added by hand was kept through every resume ({...}\n\n{...}\n), which strict JSONL readers
    (FastChat's) refuse (a new user, 2026-12-02): the resuming rank drops blank lines (and a partial last line);
    a read-only load leaves the file as it is."""
    from lp_runtime.answers import load_answers

    line = {"choices": [{"output_ids": [], "new_tokens": [], "decoding_steps": [], "wall_time": [], "accept_lengths": []}]}
    one, two = (json.dumps({"question_id": q, **line}) + "\n" for q in (1, 2))
    a = tmp_path / "a.jsonl"
    a.write_text(one + "\n  \n" + two + '{"question_id": 3, "cho')
    before = a.read_bytes()
    assert [r["question_id"] for r in load_answers(a, trim=False)] == [1, 2] and a.read_bytes() == before
    assert [r["question_id"] for r in load_answers(a, trim=True)] == [1, 2]
    assert a.read_text() == one + two and not list(tmp_path.glob("*.tmp*"))


def test_a_whole_last_answer_without_its_newline_is_kept_on_resume(tmp_path):
    """An answers file whose last line lost only its newline (an edit by hand): that answer was dropped and the
    question answered again, without a word (a new user, 2026-12-02). Kept, the newline added by the resuming
    rank; alone, and after blank lines (the file rewritten)."""
    from lp_runtime.answers import load_answers

    line = {"choices": [{"output_ids": [], "new_tokens": [], "decoding_steps": [], "wall_time": [], "accept_lengths": []}]}
    one, two = (json.dumps({"question_id": q, **line}) for q in (1, 2))
    a = tmp_path / "a.jsonl"
    for text in (f"{one}\n{two}", f"{one}\n\n{two}"):
        a.write_text(text)
        assert [r["question_id"] for r in load_answers(a, trim=False)] == [1, 2] and a.read_text() == text
        assert [r["question_id"] for r in load_answers(a, trim=True)] == [1, 2]
        assert a.read_text() == f"{one}\n{two}\n"
    a.write_text(f"{one}\n{two[:-1]}")  # a partial line is still cut off
    assert [r["question_id"] for r in load_answers(a, trim=True)] == [1] and a.read_text() == f"{one}\n"


def test_a_last_line_without_newline_that_starts_no_answer_is_refused_not_cut(tmp_path):
    """output.path naming a file whose only line had no newline (notes, a question file, binary bytes) was taken
    for a killed run's partial line and erased, exit 0 (a new user, 2026-12-03). Only the start of an answer line
    (what append_line writes first) is a partial line; anything else is refused, the file left as it was."""
    from lp_runtime.answers import ANSWER_KEYS, OUTPUT_ADVICE, OutputError, load_answers

    line = {"choices": [{"output_ids": [], "new_tokens": [], "decoding_steps": [], "wall_time": [], "accept_lengths": []}]}
    one = json.dumps({"question_id": 1, **line}) + "\n"
    a = tmp_path / "a.jsonl"
    no_answer = ("has no newline and is neither an answer nor the start of one a stopped run leaves "
                 '({"question_id": ...)')
    question = "is a question (an answer line has question_id and choices[0] with " + ", ".join(ANSWER_KEYS) + ")"
    for before, num, what in ((b"my notes, a whole paragraph without a final newline", 1, no_answer),
                              (b'{"question_id": 1, "turns": ["hi"]}', 1, question),  # whole JSON: checked as such
                              (b"\x00\x01\xff binary", 1, no_answer), (one.encode() + b"notes", 2, no_answer)):
        a.write_bytes(before)
        for trim in (False, True):
            with pytest.raises(OutputError) as e:
                load_answers(a, trim=trim)
            assert str(e.value) == f"{a} line {num} {what}, so {a} is not an answers file; {OUTPUT_ADVICE}"
            assert a.read_bytes() == before
    a.write_bytes(b"\x00\x01\xff\nnotes")  # a bad byte before the last line is named first (the report's case)
    with pytest.raises(OutputError) as e:
        load_answers(a, trim=False)
    assert str(e.value) == (f"{a} line 1: byte 3 (b'\\xff') is not UTF-8; an answers file is written as UTF-8, so "
                            f"this one was changed elsewhere; {OUTPUT_ADVICE}")
    for partial in ('{"ques', '{"question_id": 2, "cho'):  # a stopped run's partial line: still cut
        a.write_text(one + partial)
        assert [r["question_id"] for r in load_answers(a, trim=True)] == [1] and a.read_text() == one


def test_a_category_temperature_key_in_another_case_is_refused():
    """sampling.category_temperature={Writing: 0.7} answered MT-Bench's writing questions greedily, exit 0 (a new
    user, 2026-12-02); a key for a category this run does not reach (dataset.limit) stays allowed."""
    from lp_runtime.data import Question
    from lp_runtime.generate import check_category_keys

    qs = [Question(question_id=81, category="writing", turns=["a"]), Question(question_id=91, category="roleplay",
                                                                             turns=["b"])]
    with pytest.raises(ConfigError) as e:
        check_category_keys({"Writing": 0.7}, qs)
    assert str(e.value) == ("sampling.category_temperature key 'Writing' matches no question's category (matched "
                            "exactly); did you mean 'writing'? This run's categories: roleplay, writing")
    # one typo away ({wrting: 0.7}: decoded greedily, exit 0; a new user, 2026-12-03)
    with pytest.raises(ConfigError, match=r"^sampling.category_temperature key 'wrting' matches no question's category "
                                          r"\(matched exactly\); did you mean 'writing'\?"):
        check_category_keys({"wrting": 0.7}, qs)
    check_category_keys({"writing": 0.7, "math": 0.0}, qs)  # math: past this run's questions, allowed
    check_category_keys({"coding": 0.0, "stem": 0.1, "humanities": 0.1}, qs)  # far from every category: allowed
    check_category_keys(None, qs)


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
    from lp_runtime.config import SamplingConfig
    from lp_runtime.checks import check_limits

    model = _tiny()
    with pytest.raises(ConfigError) as e:
        check_limits(model, lookahead(), generation=GenerationConfig(eos_token_ids=[2, 99999999]))
    assert str(e.value) == ("generation.eos_token_ids=[2, 99999999] is not allowed: token id 99999999 is outside the "
                            "model's vocabulary of 96 ids (0..95)")
    with pytest.raises(ConfigError) as e:
        check_limits(model, lookahead(), SamplingConfig(suppress_tokens=[96]))
    assert str(e.value) == ("sampling.suppress_tokens=[96] is not allowed: token id 96 is outside the model's "
                            "vocabulary of 96 ids (0..95)")
    check_limits(model, lookahead(), SamplingConfig(suppress_tokens=[95]), GenerationConfig(eos_token_ids=[0]))
    for every in (list(range(96)), list(range(96)) + [5]):  # every id suppressed: id 0 came out every step
        with pytest.raises(ConfigError) as e:
            check_limits(model, lookahead(), SamplingConfig(suppress_tokens=every))
        assert str(e.value) == ("sampling.suppress_tokens suppresses all 96 token ids of the model's vocabulary; leave "
                                "at least one")
    check_limits(model, lookahead(), SamplingConfig(suppress_tokens=list(range(1, 96))))  # one left: decodable


@pytest.mark.parametrize("over,step", [
    (dict(window_size=100000), 1 + 99999 + 2 * 100000 + 2 * 10),
    (dict(ngram_size=100000, method="paper"), 1 + 2 + 99998 * 3 + 2 * 99999),
    (dict(guess_set_size=100000), 1 + 2 + 2 * 3 + 100000 * 10),
    (dict(max_depth=100000, window_size=0), 1 + 2 * 100000),
])
def test_lookahead_step_must_fit_the_context(over, step):
    from lp_runtime.checks import check_limits

    cfg = lookahead(**{"window_size": 3, "ngram_size": 4, "guess_set_size": 2, **over})
    with pytest.raises(ConfigError) as e:
        check_limits(_tiny(), cfg)
    depth = cfg.candidate_depth
    depth_key = "" if cfg.method == "paper" else f", decoding.max_depth={cfg.max_depth}"
    assert str(e.value) == (
        f"decoding.window_size={cfg.window_size}, decoding.ngram_size={cfg.ngram_size}, decoding.guess_set_size="
        f"{cfg.guess_set_size}{depth_key} make a lookahead step of {step} tokens ("
        f"{'1 + (W-1) + (N-2)*W window tokens' if cfg.window_size else '1 pending token'} + G candidates of {depth} tokens), more than the model's "
        "context of 256 tokens (max_position_embeddings); lower them so that a step fits")


def test_largest_step_that_fits_is_accepted():
    from lp_runtime.checks import check_limits

    check_limits(_tiny(ctx=1 + 2 + 2 * 3 + 2 * 10), lookahead(window_size=3, ngram_size=4, guess_set_size=2))
    with pytest.raises(ConfigError):
        check_limits(_tiny(ctx=2 + 2 * 3 + 2 * 10), lookahead(window_size=3, ngram_size=4, guess_set_size=2))


# ------------------------------------------------------------------ 10. one output file for several jobs of a sweep
def test_sweep_jobs_that_would_write_one_file_are_refused_with_a_per_job_path_to_give(tmp_path, monkeypatch):
    """Two jobs' files compared as the files they name (``./out/a.jsonl`` is ``out/a.jsonl``); the command line's
    fixed path was refused before Hydra started, which refused a relative path under hydra.job.chdir too, and let
    ``${hydra:sweep.dir}/a.jsonl`` through (the sweeps themselves: tests/test_sweeps.py)."""
    from lp_runtime.config import OutputConfig, RunConfig
    from lp_runtime.jobs import _check_own_files

    monkeypatch.chdir(tmp_path)
    given = [["decoding.window_size=0", "output.path=a"], ["decoding.window_size=3", "output.path=a"]]

    def check(*outputs):
        _check_own_files(given, {"decoding.window_size"}, [RunConfig(output=o) for o in outputs],
                         [str(tmp_path / "0"), str(tmp_path / "1")])  # the jobs' folders

    with pytest.raises(ConfigError) as e:
        check(OutputConfig(path="out/a.jsonl"), OutputConfig(path="./out/a.jsonl"))
    assert str(e.value) == (
        f"sweep jobs 0 (decoding.window_size=0) and 1 (decoding.window_size=3) would both write output.path="
        f"{tmp_path / 'out' / 'a.jsonl'}, but one answers file holds the answers of one setting; drop output.path so "
        "that each job writes into its own folder (<hydra.sweep.dir>/<job number>/), or put the job number in it: "
        "'output.path=${hydra:sweep.dir}/${hydra:job.num}/answers.jsonl'; no job was run")
    # the summary's advice named an answers file: followed, the summary path became job 0's answers file (a new
    # user, 2026-12-05)
    with pytest.raises(ConfigError) as e:
        check(OutputConfig(path="0/a.jsonl", summary_path="s.json"),
              OutputConfig(path="3/a.jsonl", summary_path="s.json"))
    assert str(e.value) == (
        f"sweep jobs 0 (decoding.window_size=0) and 1 (decoding.window_size=3) would both write output.summary_path="
        f"{tmp_path / 's.json'}, but one summary file holds the figures of one setting; drop output.summary_path so "
        "that each job writes into its own folder (<hydra.sweep.dir>/<job number>/), or put the job number in it: "
        "'output.summary_path=${hydra:sweep.dir}/${hydra:job.num}/answers.summary.json'; no job was run")
    check(OutputConfig(path="out/0/a.jsonl"), OutputConfig(path="out/3/a.jsonl"))  # per job
    check(OutputConfig(path="out/a.jsonl"))  # one job


# ------------------------------------------------------------------ 12b, 12d, 12e. messages that name the key
def test_summary_path_folder_names_its_key(tmp_path):
    from lp_runtime.answers import OutputError, check_output_path

    with pytest.raises(OutputError) as e:
        check_output_path(tmp_path, key="output.summary_path")
    assert str(e.value) == f"output.summary_path={tmp_path} is a folder; give a file path such as {tmp_path / 'summary.json'}"


def test_numeric_stop_string_says_how_to_quote():
    with pytest.raises(ConfigError) as e:
        GenerationConfig(stop_strings=10)
    assert str(e.value) == ("generation.stop_strings=10 is not allowed; give a list of strings, e.g. "
                            "generation.stop_strings=[hello] or, for a blank line, $'generation.stop_strings=[\"\\n\\n\"]' "
                            "(bash's $'...' makes \\n a newline; Hydra keeps a backslash as it is); quote a number to "
                            "make it a string: "
                            "generation.stop_strings='[\"10\"]'")


def test_api_prompt_of_the_wrong_kind(tiny_model_dir):
    from lp_runtime.api import LookaheadGenerator

    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"))
    with pytest.raises(ConfigError) as e:
        gen.generate(None, max_new_tokens=4)
    assert str(e.value) == ("the prompt is NoneType; give text (str), a list of messages ({'role', 'content'} dicts) "
                            "or a list (or 1-D tensor) of token ids")
    ids = [1, 504, 3250]  # a 1-D tensor of ids, as Decoder.generate takes it (a new user found them refused here)
    want = gen.generate(ids, max_new_tokens=4).output_ids
    assert gen.generate(torch.tensor(ids), max_new_tokens=4).output_ids == want
    # what transformers' tutorials make: tok(text, return_tensors="pt") (a BatchEncoding of (1, n) tensors)
    from transformers import BatchEncoding
    assert gen.generate(torch.tensor([ids]), max_new_tokens=4).output_ids == want
    assert gen.generate(BatchEncoding({"input_ids": torch.tensor([ids])}), max_new_tokens=4).output_ids == want
    # Decoder.generate takes what the API takes (it said "prompt token 0 is tensor([...]); token ids must be
    # integers" for a (1, n) tensor and "prompt token 0 is 'input_ids'" for a BatchEncoding: a new user, 2026-12-04)
    assert gen.decoder.generate(torch.tensor([ids]), max_new_tokens=4).output_ids == want
    assert gen.decoder.generate(BatchEncoding({"input_ids": torch.tensor([ids])}), max_new_tokens=4).output_ids == want
    # a padded encoding (tok(..., padding="max_length")): its padding was decoded as prompt (a new user's second
    # pass, 2026-12-04); left or right, the masked positions are dropped
    for padded, mask in (([2, 2] + ids, [0, 0, 1, 1, 1]), (ids + [2], [1, 1, 1, 0])):
        enc = BatchEncoding({"input_ids": torch.tensor([padded]), "attention_mask": torch.tensor([mask])})
        assert gen.generate(enc, max_new_tokens=4).output_ids == want
        assert gen.decoder.generate(enc, max_new_tokens=4).output_ids == want
    batch = "give one sequence of token ids (a list, a 1-D or (1, n) tensor): a step decodes one sequence at a time"
    for call in (gen.generate, gen.decoder.generate):
        with pytest.raises(ConfigError) as e:
            call(torch.tensor([ids, ids]), max_new_tokens=4)
        assert str(e.value) == f"the prompt is a batch of 2 sequences (shape (2, 3)); {batch}"
        with pytest.raises(ConfigError) as e:
            call([[1, 2], [3, 4]], max_new_tokens=4)
        assert str(e.value) == f"the prompt is a batch of 2 sequences; {batch}"
        with pytest.raises(ConfigError) as e:  # was "prompt token 0 is tensor([[...]])" / "the prompt is Tensor"
            call(torch.tensor([[ids]]), max_new_tokens=4)
        assert str(e.value) == ("the prompt has 3 dimensions (shape (1, 1, 3)); give one sequence of token ids (a "
                                "list, a 1-D or (1, n) tensor)")
    with pytest.raises(ConfigError) as e:
        gen.generate("", max_new_tokens=4)
    assert str(e.value) == "the prompt is empty text; give a non-empty user turn"
    with pytest.raises(ConfigError) as e:
        gen.generate(" \n\t", max_new_tokens=4)  # as a blank turn in a question file
    assert str(e.value) == "the prompt is only whitespace; give a non-empty user turn"
    for prompt, held in [("\u200b\u200c\u200d\u2060\ufeff", "only invisible characters (U+200B, U+200C, U+200D, "
                          "U+2060, U+FEFF)"), (" \u200b\n", "only whitespace and invisible characters (U+200B)")]:
        with pytest.raises(ConfigError) as e:  # as a question turn of only such characters (tests/test_data.py)
            gen.generate(prompt, max_new_tokens=4)
        assert str(e.value) == f"the prompt is {held}; give a non-empty user turn"
    for prompt, where in [("a\ud800b", "the prompt"),  # JSON's "\ud800" makes one; the tokenizer raised a TypeError
                          ([{"role": "user", "content": "hi \udfff"}], "prompt message 0")]:  # a str: no "message 0"
        with pytest.raises(ConfigError) as e:
            gen.generate(prompt, max_new_tokens=4)
        bad, at = ("\ud800", 1) if isinstance(prompt, str) else ("\udfff", 3)
        assert str(e.value) == (f"{where} holds a lone UTF-16 surrogate {bad!r} at character {at}; give valid "
                                "Unicode text")
    # a message of blank content, as a blank turn in a question file (a new user, 2026-12-04: it was decoded)
    for prompt, held in [([{"role": "user", "content": ""}], "empty text"),
                         ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": " \u200b"}],
                          "only whitespace and invisible characters (U+200B)")]:
        with pytest.raises(ConfigError) as e:
            gen.generate(prompt, max_new_tokens=4)
        assert str(e.value) == f"prompt message {len(prompt) - 1} is {held}; give every message non-empty content"


def test_api_stop_strings_are_checked_as_the_config_checks_them(tiny_model_dir):
    """generate(stop_strings=[5]) raised AttributeError ('int' has no 'encode'), and [""] stopped after one
    token; the config refused both. Decoder and the generator now check them in StopChecker."""
    from lp_runtime.api import LookaheadGenerator

    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"))
    for bad, message in [([5], "stop_strings=[5] is not allowed; give a list of strings, e.g. stop_strings=[\"\\n\\n\"]"),
                         ([None], "stop_strings=[None] is not allowed; give a list of strings, e.g. "
                                  "stop_strings=[\"\\n\\n\"]"),
                         ("", "stop_strings=[''] contains an empty string, which every text ends with (a run would "
                              'stop after its first token); give non-empty strings, e.g. stop_strings=["\\n\\n"]'),
                         (["a", ""], "stop_strings=['a', ''] contains an empty string, which every text ends with (a "
                                     "run would stop after its first token); give non-empty strings, e.g. "
                                     'stop_strings=["\\n\\n"]')]:
        with pytest.raises(ConfigError) as e:
            gen.generate("hi", max_new_tokens=4, stop_strings=bad)
        assert str(e.value) == message
    assert gen.generate("hi", max_new_tokens=4, stop_strings="zzzz").finish_reason == "length"




def test_api_message_without_content(tiny_model_dir):
    from lp_runtime.api import LookaheadGenerator

    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"), lookahead())
    for prompt, shown in [([{"role": "user"}], "{'role': 'user'}"),
                          ([{"role": "user", "content": "Hi"}, "Hi"], "'Hi'"),
                          ([{"role": "user", "content": 5}], "{'role': 'user', 'content': 5}")]:
        with pytest.raises(ConfigError) as e:
            gen.generate(prompt, max_new_tokens=4)
        assert str(e.value) == (f"prompt message {len(prompt) - 1} is {shown}; every message must be a dict with a "
                                "str 'role' and a str 'content', e.g. {'role': 'user', 'content': 'Hi'}")


def test_api_samples_per_generator_and_per_call(tiny_model_dir):
    """``sampling=`` on the generator is every call's default, and a call's own replaces it: the same seed draws the
    same tokens either way (and the Decoder's), another seed or greedy other ones; ids are checked per call."""
    from lp_runtime.api import LookaheadGenerator
    from lp_runtime.config import SamplingConfig
    from lp_runtime.decoder import Decoder

    hot = SamplingConfig(temperature=1.5, seed=3)
    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"), lookahead(),
                                         GenerationConfig(max_new_tokens=12, eos_token_ids=[]), sampling=hot)
    ids = gen.encode("Hi")
    drawn = gen.generate(ids).output_ids
    ref = Decoder(gen.model, lookahead(), sampling=hot).generate(ids, max_new_tokens=12).output_ids
    greedy = Decoder(gen.model, lookahead()).generate(ids, max_new_tokens=12).output_ids
    plain = LookaheadGenerator(gen.model, gen.tokenizer, lookahead(), gen.generation)
    assert drawn == ref == plain.generate(ids, sampling=hot).output_ids
    assert plain.generate(ids).output_ids == greedy != drawn
    assert gen.generate(ids, sampling=SamplingConfig(temperature=1.5, seed=4)).output_ids != drawn
    with pytest.raises(ConfigError) as e:
        gen.generate(ids, sampling=SamplingConfig(suppress_tokens=[49152]))
    assert str(e.value) == ("sampling.suppress_tokens=[49152] is not allowed: token id 49152 is outside the model's "
                            "vocabulary of 49152 ids (0..49151)")


def test_api_arguments_of_the_wrong_kind_get_one_config_error(tiny_model_dir):
    """A new user's calls (2026-12-02), each a bare TypeError or AttributeError before: one ConfigError naming the
    argument; an EOS id outside the vocabulary is refused as the main job refuses it."""
    from lp_runtime.api import LookaheadGenerator
    from lp_runtime.config import DecodingConfig, SamplingConfig
    from lp_runtime.decoder import Decoder
    from lp_runtime.proposers import SuffixProposer

    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"),
                                         DecodingConfig(method="lookahead"))
    model, vocab = gen.model, gen.model.config.vocab_size
    for call, message in [
        (lambda: Decoder(model, None), "decoding is NoneType; give a DecodingConfig"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), sampling={"temperature": 0.7}),
         "sampling is dict; give a SamplingConfig"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), eos_token_ids=[-3]),
         f"eos_token_ids holds -3, outside the model's vocabulary of {vocab} ids (0..{vocab - 1})"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), eos_token_ids=["2"]),
         "eos_token_ids holds '2'; token ids must be integers"),
        (lambda: gen.generate("Hi", sampling={"temperature": 0.7}), "sampling is dict; give a SamplingConfig"),
        (lambda: gen.generate("Hi", streamer=object()),
         "streamer is object, without put() and end(); give a transformers TextStreamer or TextIteratorStreamer, or "
         "an object with those two methods"),
        (lambda: LookaheadGenerator.from_config({"path": str(tiny_model_dir)}), "model is dict; give a ModelConfig"),
        (lambda: LookaheadGenerator(model, gen.tokenizer, {"method": "lookahead"}), "decoding is dict; give a "
                                                                                      "DecodingConfig"),
        (lambda: Decoder("gpt2", DecodingConfig(method="lookahead")),
         "model is str; give a transformers causal LM, e.g. AutoModelForCausalLM.from_pretrained(...)"),
        (lambda: ModelConfig(path=5), "model.path=5 is not allowed; give a HuggingFace id, a local folder or "
                                      "'bundled:smollm2'"),
        # a stop string no decoded text holds was taken and never matched, where a prompt holding one is refused
        (lambda: gen.generate("Hi", stop_strings=["ok", "a\ud800"]), "stop_strings=['ok', 'a\\ud800']: 'a\\ud800' "
         "holds a lone UTF-16 surrogate at character 1, which no generated text holds (the stop would never match); "
         "give valid Unicode text"),
        # refused before the model loads (a nonexistent path would fail the load first)
        (lambda: LookaheadGenerator.from_config(ModelConfig(path="/nonexistent"), {"method": "lookahead"}),
         "decoding is dict; give a DecodingConfig"),
        # a field set after construction is checked when the object is used (a new user's second pass)
        (lambda: gen.generate("Hi", sampling=_set(SamplingConfig(temperature=0.7), temperature=float("inf"))),
         "sampling.temperature=inf is not allowed; it must be a finite number"),
        (lambda: Decoder(model, _set(DecodingConfig(method="lookahead"), window_size="3")),
         "decoding.window_size='3' is not allowed; it must be an integer"),
        # the duck-typed parts (session 22; before: "no" a true flag, the others AttributeErrors mid-decode)
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), copy_kv="no"),
         "copy_kv='no' is not allowed; give True, False, or None for the method's default"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), lp=2),
         "lp is int, without plan(), merge() and check_consistent(); give the LPGroup of parallel.setup_parallel(), "
         "or leave it out for one process"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), step_policy="auto"),
         "step_policy is str, without choose() and observe(); give a policy.StepPolicy, e.g. "
         "lp_runtime.auto.auto_policy(model)"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), proposers="suffix"),
         "proposers is str; give a list of proposers.Proposer objects (e.g. proposers.SuffixProposer), or leave it "
         "out for the decoding setting's own"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), proposers=[object()]),
         "proposers[0] is object, without begin(), observe(), propose(), end() and reset(); give a "
         "proposers.Proposer (docs/architecture.md)"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), step=model),
         "step is LlamaForCausalLM, without new_cache(), prefill(), commit() and fits(); give step.EagerStep(model), "
         "compiled.CapturedStep, or leave it out for the eager step"),
        (lambda: Decoder(model, DecodingConfig(method="lookahead"), proposers=[_set(SuffixProposer(4, 2), topk="8")]),
         "proposers[0].topk='8' is not allowed; it must be an integer >= 0"),
        (lambda: RunConfig(output={"path": "a"}),
         "output={'path': 'a'} is not allowed; give an OutputConfig"),
    ]:
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value) == message
    assert Decoder(model, DecodingConfig(method="lookahead"), eos_token_ids=2).eos_token_ids == [2]  # one id: a list


def test_a_decoding_field_set_after_the_generator_was_built_is_checked_at_the_next_call(tiny_model_dir):
    """README: config fields set after construction are checked again when used; a DecodingConfig changed after
    the generator was built was not (window_size="3" and a step far past the context decoded; a new user)."""
    from lp_runtime.api import LookaheadGenerator
    from lp_runtime.config import DecodingConfig

    dc = DecodingConfig(method="lookahead")
    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"), dc)
    dc.window_size = "3"
    with pytest.raises(ConfigError) as e:
        gen.generate("Hi", max_new_tokens=2)
    assert str(e.value) == "decoding.window_size='3' is not allowed; it must be an integer"
    with pytest.raises(ConfigError) as e:
        gen.decoder.generate([1, 2, 3], max_new_tokens=2)
    assert str(e.value) == "decoding.window_size='3' is not allowed; it must be an integer"
    ctx = gen.model.config.max_position_embeddings
    dc.window_size = ctx
    with pytest.raises(ConfigError) as e:
        gen.generate("Hi", max_new_tokens=2)
    assert str(e.value).startswith(f"decoding.window_size={ctx}, decoding.ngram_size=4, decoding.guess_set_size=2")
    assert str(e.value).endswith(f"more than the model's context of {ctx} tokens (max_position_embeddings); lower "
                                 "them so that a step fits")


def test_a_sampling_field_set_after_the_generator_was_built_is_used_and_checked_at_the_next_call(tiny_model_dir):
    """The SamplingConfig given to from_config, changed after: temperature=nan was ignored (the output stayed as at
    0.9) while a GenerationConfig change was seen (a new user, 2026-12-03). Now both are read at every call."""
    from lp_runtime.api import LookaheadGenerator
    from lp_runtime.config import DecodingConfig, SamplingConfig

    sc = SamplingConfig(temperature=0.9, seed=7)
    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"),
                                         DecodingConfig(method="lookahead"), sampling=sc)
    sampled = gen.generate("Hi", max_new_tokens=12).output_ids
    sc.temperature = float("nan")
    with pytest.raises(ConfigError) as e:
        gen.generate("Hi", max_new_tokens=12)
    assert str(e.value) == "sampling.temperature=nan is not allowed; it must be a finite number"
    sc.temperature = 0.0  # greedy now
    greedy = LookaheadGenerator(gen.model, gen.tokenizer, DecodingConfig(method="lookahead"))
    assert gen.generate("Hi", max_new_tokens=12).output_ids == greedy.generate("Hi", max_new_tokens=12).output_ids
    sc.temperature = 0.9
    assert gen.generate("Hi", max_new_tokens=12).output_ids == sampled


def _set(obj, **fields):
    """``obj`` with ``fields`` assigned after construction (its checks skipped), as a user may do."""
    for k, v in fields.items():
        setattr(obj, k, v)
    return obj


def test_a_temperature_too_small_to_sample_with_is_refused():
    """sampling.temperature=1e-300 (any t <= 1e-38) overflowed logits / t to inf and emitted token 0 every step,
    exit 0 (a new user, 2026-12-02): a positive temperature below 1e-6 is refused; 0 is greedy."""
    from lp_runtime.config import SamplingConfig

    for t in (1e-300, 1e-38, 5e-7):
        with pytest.raises(ConfigError) as e:
            SamplingConfig(temperature=t)
        assert str(e.value) == (f"sampling.temperature={t} is too small to sample with (logits / temperature "
                                "overflow); give 0 for greedy decoding or a temperature >= 1e-06")
    with pytest.raises(ConfigError) as e:
        SamplingConfig(category_temperature={"writing": 1e-9})
    assert str(e.value) == ("sampling.category_temperature['writing']=1e-09 is not allowed; it must be 0 (greedy) "
                            "or >= 1e-06")
    assert SamplingConfig(temperature=1e-6).temperature == 1e-6 and SamplingConfig(temperature=0.0).temperature == 0


def test_a_cache_folder_under_a_file_is_named(tmp_path, monkeypatch):
    """LP_RUNTIME_CACHE naming a file said "[Errno 17] File exists" (a new user, 2026-12-02): one ConfigError
    naming the variable and the file."""
    from lp_runtime.bundled import cache_root

    (tmp_path / "f").write_text("")
    for value in (tmp_path / "f", tmp_path / "f" / "sub"):
        monkeypatch.setenv("LP_RUNTIME_CACHE", str(value))
        with pytest.raises(ConfigError) as e:
            cache_root()
        assert str(e.value) == (f"LP_RUNTIME_CACHE={value}: {tmp_path / 'f'} is a file; give LP_RUNTIME_CACHE a "
                                "folder (lp_runtime keeps the converted bundled model and the latency profiles there)")
    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path / "new" / "cache"))
    assert cache_root() == str(tmp_path / "new" / "cache")


def test_the_generator_refuses_a_model_or_tokenizer_of_another_kind():
    """A new user (2026-12-04): LookaheadGenerator(model, None) answered a text prompt with "TypeError: 'NoneType'
    object is not callable", a str tokenizer with "'str' object is not callable", a None model with an
    AttributeError."""
    from fakes import llama, lookahead

    from lp_runtime import LookaheadGenerator
    from lp_runtime.config import ConfigError
    from lp_runtime.decoder import Decoder

    model = llama()
    with pytest.raises(ConfigError, match=r"^a text or messages prompt needs a tokenizer; this generator has none "
                                          r"\(tokenizer=None\): give token ids$"):
        LookaheadGenerator(model, None, lookahead()).generate("hi", max_new_tokens=3)
    assert len(LookaheadGenerator(model, None, lookahead()).generate([5, 6, 7], max_new_tokens=3).output_ids) == 3
    tokenizer_refusal = ("tokenizer is {}; give the model's transformers tokenizer (AutoTokenizer.from_pretrained(...)), "
                         "or None for token-id prompts")
    for bad in ("tok", b"tok", model):  # and to Decoder, whose stop strings failed on it mid-decode (a second pass)
        for build in (lambda: LookaheadGenerator(model, bad, lookahead()),
                      lambda: Decoder(model, lookahead(), tokenizer=bad)):
            with pytest.raises(ConfigError) as e:
                build()
            assert str(e.value) == tokenizer_refusal.format(type(bad).__name__)
    for bad in (None, torch.nn.Linear(2, 2)):  # a Module without a config: "'Linear' object has no attribute 'config'"
        with pytest.raises(ConfigError) as e:
            LookaheadGenerator(bad, None, lookahead())
        assert str(e.value) == (f"model is {type(bad).__name__}; give a transformers causal LM, e.g. "
                                "AutoModelForCausalLM.from_pretrained(...)")
    with pytest.raises(ConfigError) as e:  # a base model: "LlamaForCausalLM ... a tree step fails (AttributeError)"
        Decoder(model.model, lookahead())
    assert str(e.value).startswith("LlamaModel (model_type 'llama') is not supported by lp_runtime: it returns no "
                                   "logits (a model without an LM head: load its causal-LM class, AutoModelForCausalLM)")
    for bad in (None, 5):  # "'NoneType' object is not iterable"
        with pytest.raises(ConfigError) as e:
            Decoder(model, lookahead()).generate(bad, max_new_tokens=3)
        assert str(e.value) == f"the prompt is {type(bad).__name__}; give a list (or 1-D tensor) of token ids"
    gen = LookaheadGenerator(model, None, lookahead())
    gen.decoder.cfg.window_size = 10**6  # set after construction: checked at the call
    with pytest.raises(ConfigError, match=r"^decoding.window_size=1000000, .* make a lookahead step of 3000020 "):
        gen.generate([5, 6, 7], max_new_tokens=3)
    # Decoder, the lower-level class, feeds a step only what the context leaves room for: generate's tokens
    out = Decoder(model, lookahead(window_size=10**3), eos_token_ids=()).generate([5, 6, 7], max_new_tokens=6)
    assert out.output_ids == Decoder(model, lookahead(), eos_token_ids=()).generate([5, 6, 7], max_new_tokens=6).output_ids


def test_decoder_stops_where_transformers_generate_stops_by_default():
    """A new user (2026-12-04): Decoder without eos_token_ids ran past the model's EOS into a made-up next turn,
    where transformers' generate stops. Its default is now the model's generation_config EOS; () turns it off."""
    from fakes import llama, lookahead

    from lp_runtime.decoder import Decoder

    model, prompt = llama(), [5, 17, 3, 44, 9, 61]
    free = Decoder(model, lookahead(), eos_token_ids=()).generate(prompt, max_new_tokens=20).output_ids
    model.generation_config.eos_token_id = free[6]  # a token greedy reaches 7th
    ids = torch.tensor([prompt])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=20)[0, 6:].tolist()
    out = Decoder(model, lookahead()).generate(prompt, max_new_tokens=20)
    assert out.output_ids == want == free[:free.index(free[6]) + 1] and out.finish_reason == "stop"
    assert Decoder(model, lookahead(), eos_token_ids=()).generate(prompt, max_new_tokens=20).output_ids == free
    # a model without an EOS of its own: generate ignores the tokenizer's, and so does Decoder (a review, session 22)
    model.generation_config.eos_token_id = None
    from fakes import char_tokenizer

    tok = char_tokenizer()  # its </s> is 2
    assert tok.eos_token_id == 2 and Decoder(model, lookahead(), tokenizer=tok).eos_token_ids == []


def test_generation_eos_set_after_construction_applies_and_progress_must_be_a_bool(tiny_model_dir):
    """A new user (session 22): ``gen.generation.eos_token_ids = []`` after construction was ignored (the EOS chosen
    at construction still stopped the call) and ``[10**9]`` was not refused, where max_new_tokens and stop strings
    set so are read anew; ``progress="no"`` showed the bars."""
    from lp_runtime.api import LookaheadGenerator
    from lp_runtime.config import DecodingConfig

    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"),
                                         DecodingConfig(method="lookahead"), GenerationConfig(max_new_tokens=24))
    ids = [1, 504, 3250]
    free = gen.decoder.generate(ids, max_new_tokens=24)  # the tokenizer's EOS stops it, or the budget
    gen.generation.eos_token_ids = [free.output_ids[2]]  # the third token is now an EOS
    out = gen.generate(ids)
    assert (out.output_ids, out.finish_reason) == (free.output_ids[:free.output_ids.index(free.output_ids[2]) + 1],
                                                   "stop")
    gen.generation.eos_token_ids = [10 ** 9]
    with pytest.raises(ConfigError) as e:
        gen.generate(ids)
    vocab = gen.model.config.vocab_size
    assert str(e.value) == f"eos_token_ids holds {10 ** 9}, outside the model's vocabulary of {vocab} ids (0..{vocab - 1})"
    for call in (lambda: LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir)), progress="no"),
                 lambda: LookaheadGenerator(gen.model, gen.tokenizer, DecodingConfig(method="lookahead"), progress=1)):
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value).startswith("progress=") and str(e.value).endswith("is not allowed; it must be True or False")


def test_decoder_parts_take_numpy_integers_and_a_generator_of_proposers(tiny_model_dir):
    """The part checks of session 22 refused a proposer whose max_depth was np.int64(10) ("it must be an integer >=
    0") and a generator of proposers, both decoded before; and a numpy EOS id set on a generator's config after
    construction raised a TypeError (a review)."""
    import numpy as np

    from lp_runtime.api import LookaheadGenerator
    from lp_runtime.config import DecodingConfig
    from lp_runtime.decoder import Decoder
    from lp_runtime.proposers import SuffixProposer

    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"),
                                         DecodingConfig(method="lookahead"), GenerationConfig(max_new_tokens=12))
    ids = [1, 504, 3250]
    plain = Decoder(gen.model, DecodingConfig(method="greedy"), eos_token_ids=()).generate(ids, max_new_tokens=12)
    prop = SuffixProposer(4, 2)
    prop.max_depth, prop.topk = np.int64(prop.max_depth), np.int64(0)
    dec = Decoder(gen.model, DecodingConfig(method="lookahead"), eos_token_ids=(), proposers=(p for p in [prop]))
    assert len(dec.proposers) == 1 and dec.generate(ids, max_new_tokens=12).output_ids == plain.output_ids
    gen.generation.eos_token_ids = np.int64(plain.output_ids[3])
    out = gen.generate(ids)
    assert out.output_ids == plain.output_ids[:plain.output_ids.index(plain.output_ids[3]) + 1]
