"""The answers file of a run (``output.path``, one JSON line per question, FastChat / Spec-Bench format) and
the files beside it: ``.settings.json`` (the settings that made the answers: a later run with other settings is
refused), ``.summary.json`` (``lp_runtime.metrics``) and ``.lock`` while a run holds the file (docs/design.md 5)."""
from __future__ import annotations

import codecs
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import shlex
import socket
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from lp_runtime import data
from lp_runtime.config import MODEL_TAKEN, PRESETS, DecodingConfig, RunConfig, is_int, jsonl_base

T = TypeVar("T")


class OutputError(ValueError):
    """``output.path`` or ``output.summary_path`` cannot hold what the run writes."""


class SettingsMismatchError(ValueError):
    """A re-run's settings differ from those recorded for its answers file (or none were recorded)."""


def beside(answers_path: Path, suffix: str) -> Path:
    """The file named ``suffix`` beside an answers file: ``beside(Path("a.jsonl"), ".lock") == Path("a.lock")``."""
    return Path(jsonl_base(str(answers_path)) + suffix)


def answers_of(record: Path) -> Path:
    """``beside``'s inverse: the answers file a ``.summary.json`` / ``.settings.json`` record describes, ``X`` for
    ``X.settings.json`` when ``X`` is a file not ending in .jsonl (``output.path=a.txt``), else ``X.jsonl``."""
    base = Path(str(record)[: -len(record.suffixes[-2] + ".json")])
    return base if base.suffix != ".jsonl" and base.is_file() else base.with_name(base.name + ".jsonl")


def write_json(path: Path, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as JSON atomically: to a temporary file beside ``path`` (per process), then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=indent) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:  # a full disk: no half-written temporary left, and the error names the file
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from e


def check_output_path(path: Path, *, key: str = "output.path") -> None:
    """Raise ``OutputError`` unless ``path`` can be a file we append to (messages name ``key``): really try (make the
    folders, open for append), then remove what the try made, so a failed run leaves nothing."""
    name = f"output path {path}" if key == "output.path" else f"{key}={path}"
    _check_link(path, name, key)
    if path.is_dir():
        example = path / ("answers.jsonl" if key == "output.path" else "summary.json")
        raise OutputError(f"{name} is a folder; give a file path such as {example}")
    if path.exists() and not path.is_file():  # a device such as /dev/null, a pipe, a socket: replaced or unwritable
        raise OutputError(f"{name} is not a regular file (a device, pipe or socket); give a file path such as "
                          f"{Path('outputs') / ('answers.jsonl' if key == 'output.path' else 'answers.summary.json')}")
    nearest = next((p for p in path.parents if p.exists()), None)  # the nearest ancestor that exists
    if nearest is not None and not nearest.is_dir():
        raise OutputError(f"cannot create the folder for {name}: {nearest} is a file")
    made = [p for p in path.parents if not p.exists()]  # innermost first
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create the folder for {name}: {e.strerror}") from None
        target = path if path.exists() else path.parent
        if not os.access(target, os.W_OK):
            why = "a read-only file system" if os.statvfs(target).f_flag & os.ST_RDONLY else "permission denied"
            raise OutputError(f"{name} is not writable ({why})")
        existed = path.exists()
        try:
            _making_folder(path, lambda: open(path, "a", encoding="utf-8")).close()
        except OSError as e:
            raise OutputError(f"{name} is not writable: {e.strerror}") from None
        if not existed:
            path.unlink(missing_ok=True)  # that run's check may have removed it first
    finally:
        for folder in made:  # only folders this check made, and only if still empty
            with contextlib.suppress(OSError):
                folder.rmdir()


def _making_folder(path: Path, create: Callable[[], T]) -> T:
    """``create()`` (which makes ``path``), again after making its folder when that folder is gone: a run started
    at the same time removes the folders its own output check made (``check_output_path``)."""
    try:
        return create()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return create()


def _check_link(path: Path, name: str, key: str) -> None:
    """``OutputError`` when ``path`` is a symbolic link that loops or leads to nothing: opening it failed with
    "Too many levels of symbolic links" or "No such file or directory", or made its target and removed the link."""
    try:
        if path.is_symlink():
            path.stat()
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputError(f"{name} is a symbolic link that loops (it points to {os.readlink(path)}, and no link "
                              f"on the way leads to a file); remove it or point it at a file, or choose another "
                              f"{key}") from None
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            target = os.path.realpath(path)
            raise OutputError(f"{name} is a symbolic link to {target}, which does not exist; give {key}={target} "
                              "to write there, or remove the link") from None


def check_summary_target(cfg: RunConfig) -> None:
    """``OutputError`` when the summary path is the answers file, the settings record or the question file: paths
    compared (``real_path``; a looping link is named by ``check_output_path``), no file opened, so ``--cfg job``
    makes this check too (``jobs.check_printed_config``)."""
    base, summary = Path(cfg.output.path), Path(cfg.output.resolved_summary_path)
    others = {"the answers file (output.path)": base, "the settings record": Path(cfg.output.resolved_settings_path)}
    if cfg.dataset.name == "jsonl" and cfg.dataset.path:
        others["the question file (dataset.path)"] = Path(cfg.dataset.path)
    for what, other in others.items():
        if real_path(str(summary)) == real_path(str(other)):
            raise OutputError(f"output.summary_path={summary} is {what}; the summary would overwrite it: give another "
                              f"file, e.g. output.summary_path={beside(base, '.summary.json')}")


def check_summary_path(cfg: RunConfig) -> None:
    """``OutputError`` when the run's summary (``output.summary_path``, or the default beside the answers) would
    overwrite the answers, the question file, the settings record, an existing file that is not a run summary or
    (``output.summary_path`` given) the summary of another answers file that still exists; when the settings
    record, the lock or the default summary beside the answers is a folder, or an existing file that is not one;
    or when another answers file shares them (``_check_own_stem``)."""
    base, settings = Path(cfg.output.path), Path(cfg.output.resolved_settings_path)
    _check_own_stem(cfg)
    records = [(settings, "a settings record", lambda p: read_settings(p) is not None),
               (beside(base, ".lock"), "a lock file", lambda p: re.fullmatch(r"(pid \d+ on host .*\n)?",
                                                                            p.read_text(errors="replace")) is not None)]
    if not cfg.output.summary_path:  # the default summary: its content is checked below
        records.append((beside(base, ".summary.json"), "a run summary", lambda p: True))
    for path, kind, looks_right in records:
        if path.is_dir():  # a settings record: was reported as missing
            raise OutputError(f"{path}, which this run writes beside output path {base}, is a folder; move it away "
                              "or choose another output.path")
        if path.is_file() and not looks_right(path):
            raise OutputError(f"{path}, which this run writes beside output path {base}, exists and is not {kind}; "
                              f"move it away or choose another output.path")
    check_summary_target(cfg)
    summary = Path(cfg.output.resolved_summary_path)
    advice = f"give another file, e.g. output.summary_path={beside(base, '.summary.json')}"
    record = read_json(summary) if summary.is_file() else None
    if summary.is_file() and not (isinstance(record, dict) and {"answers", "num_questions"} <= record.keys()):
        if not cfg.output.summary_path:
            raise OutputError(f"{summary}, the summary this run writes beside output path {base}, exists and is not "
                              "a run summary; move it away, choose another output.path, or give output.summary_path")
        raise OutputError(f"output.summary_path={summary} exists and is not a run summary; the summary would "
                          f"overwrite it: {advice}")
    other = Path(str(record["answers"])) if cfg.output.summary_path and record is not None else None
    if other is not None and os.path.abspath(other) != os.path.abspath(base) and other.is_file():
        raise OutputError(f"output.summary_path={summary} is the summary of another answers file, {other}; the "
                          f"summary would overwrite it: {advice}")


def _check_own_stem(cfg: RunConfig) -> None:
    """``OutputError`` when another answers file shares the records beside ``output.path``: ``X`` and ``X.jsonl``
    both write ``X.settings.json``, ``X.lock`` and (by default) ``X.summary.json`` (``beside``), so a run on one
    overwrote the other's record, and a resume of the other then mixed settings in one file."""
    base = Path(cfg.output.path)
    stem = jsonl_base(str(base))
    twin = Path(stem if str(base) != stem else stem + ".jsonl")
    if jsonl_base(str(twin)) != stem or not _holds_answers(twin) or (base.exists() and twin.samefile(base)):
        return
    shared = {"settings record": ".settings.json", "lock": ".lock"}
    if not cfg.output.summary_path:
        shared["summary"] = ".summary.json"
    *first, last = shared
    raise OutputError(f"output path {base} would write its {', '.join(first)} and {last} "
                      f"({', '.join(stem + s for s in shared.values())}) over those of {twin}, which holds answers; "
                      f"move one of the two away, or give another output path, e.g. {new_output_arg(base)}")


def _holds_answers(path: Path) -> bool:
    """Whether the first line of ``path`` is an answer record (a JSON object with ``question_id`` and ``choices``),
    not just any text (a question file, notes)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        line = f.readline()
    try:
        record = json.loads(line.decode("utf-8-sig"))
    except ValueError:
        return False
    return isinstance(record, dict) and {"question_id", "choices"} <= record.keys()


class AnswersLock:
    """Exclusive lock on an answers file for a run: ``fcntl.flock`` on ``<answers>.lock``, which names its holder
    (pid and host) and is removed on release; a killed run leaves no stale lock. Entering raises ``OutputError``
    naming the holder when another process holds it."""

    def __init__(self, answers_path: Path) -> None:
        self.answers_path = answers_path
        self.path = beside(answers_path, ".lock")
        self._fd: Optional[int] = None
        self._made: list[Path] = []

    def __enter__(self) -> "AnswersLock":
        self._made = [p for p in self.path.parents if not p.exists()]  # innermost first
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = _making_folder(self.path, lambda: os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "an unknown process"
                os.close(fd)
                raise OutputError(f"output path {self.answers_path} is in use by another run ({holder}); wait for "
                                  f"it to finish or choose another output.path") from None
            # the holder before us may have removed the file after we opened it: lock the one on disk
            with contextlib.suppress(FileNotFoundError):
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)  # releases the lock
            self._fd = None
            for folder in self._made:  # a refused or failed run leaves no folder the lock made; answers keep theirs
                try:
                    folder.rmdir()
                except OSError:
                    break


def lock_holder(answers_path: Path) -> Optional[str]:
    """Who holds ``answers_path``'s ``AnswersLock`` ("pid N on host H"), or None when no run does."""
    try:
        fd = os.open(beside(answers_path, ".lock"), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # taken (and released at close) when the holder has gone
        return None
    except BlockingIOError:
        return os.read(fd, 200).decode("utf-8", "replace").strip() or "an unknown process"
    finally:
        os.close(fd)


ANSWER_KEYS = ("output_ids", "new_tokens", "decoding_steps", "wall_time", "accept_lengths")
OUTPUT_ADVICE = "move the file away or choose another output.path"
LINE_START = b'{"question_id": '  # how append_line's answer lines begin (the record's first key)


def load_answers(path: Path, *, trim: bool, advice: str = OUTPUT_ADVICE) -> list[dict]:
    """Answers already in ``path`` (empty if it does not exist).

    A final line without its newline is checked as any line when it is whole JSON (``trim`` adds the newline), and
    ignored when it is the start of an answer line (``LINE_START``: a killed run's partial line); ``trim`` cuts it
    off, as it does blank lines and a leading UTF-8 byte-order mark (strict JSONL readers such as FastChat's refuse
    them). ``OutputError`` naming the file and line, then ``advice``, for a line that is not UTF-8, not JSON, not an
    answer (a final line without its newline: nor the start of one), or a second answer to a question; the file
    is then left as it was."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    data.check_first_bytes(raw, str(path), OutputError)
    bom = raw.startswith(codecs.BOM_UTF8)  # an editor's (Notepad's)
    raw = raw[len(codecs.BOM_UTF8):] if bom else raw
    complete = raw[: raw.rfind(b"\n") + 1]
    tail = raw[len(complete):]
    whole = bool(tail.strip()) and _is_json(tail)
    if whole:
        complete = raw + b"\n"
    foreign = bool(tail.strip()) and not whole and not (tail.startswith(LINE_START) or LINE_START.startswith(tail))
    records: list = []
    for num, line_bytes in enumerate(complete.splitlines(), 1):
        where = f"{path} line {num}"
        utf8 = f"an answers file is written as UTF-8, so this one was changed elsewhere; {advice}"
        line = data.decode_line(line_bytes, where, OutputError, advice=utf8)
        if not line.strip():
            continue
        try:
            records.append((where, json.loads(line)))
        except json.JSONDecodeError:
            raise OutputError(f"{where} is not JSON; {advice}") from None
    if foreign:  # after the lines are decoded, so a bad byte in them is named first
        num = complete.count(b"\n") + 1
        raise OutputError(f"{path} line {num} has no newline and is neither an answer nor the "
                          f"start of one a stopped run leaves ({LINE_START.decode()}...), so {path} is not an answers "
                          f"file; {advice}")
    first: dict[str, str] = {}
    for where, record in records:  # after every line decoded: a bad byte anywhere is named first
        _check_answer(record, where, path, advice)
        qid = str(record["question_id"])
        if first.setdefault(qid, where) != where:  # a run answers a question once: the file was changed elsewhere
            raise OutputError(f"{where} answers question {record['question_id']!r} again ({first[qid]} did); "
                              f"keep one of the two lines, or {advice}")
    kept = [line for line in complete.splitlines(keepends=True) if line.strip()] if trim else []
    if trim and (bom or len(kept) < complete.count(b"\n")):  # blank lines, a BOM: strict JSONL readers refuse them
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)  # the answers as they were, without the blank lines (and a partial last line)
    elif trim and len(complete) < len(raw):
        with open(path, "r+b") as f:
            f.truncate(len(complete))
            os.fsync(f.fileno())
    elif trim and whole:
        with open(path, "ab") as f:
            f.write(b"\n")
            os.fsync(f.fileno())
    return [record for _, record in records]


def cut_last_line(path: Path) -> bool:
    """Whether ``path`` ends in a line without its newline that is not whole JSON: the start of an answer line a
    stopped run left, which ``load_answers`` ignores (it refuses any other such line)."""
    raw = path.read_bytes() if path.exists() else b""
    tail = raw[raw.rfind(b"\n") + 1:]
    return bool(tail.strip()) and not _is_json(tail)


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return True


def _is_seconds(x: Any) -> bool:
    return (is_int(x) or isinstance(x, float)) and 0 <= x < float("inf")


# What each of ANSWER_KEYS holds, one entry a turn (what the summary and the report add up).
ANSWER_TYPES = {"output_ids": ("lists of token ids", lambda v: isinstance(v, list) and all(map(is_int, v))),
                "new_tokens": ("token counts", lambda v: is_int(v) and v >= 0),
                "decoding_steps": ("step counts", lambda v: is_int(v) and v >= 0),
                "wall_time": ("seconds", _is_seconds),
                "accept_lengths": ("lists of token counts", lambda v: isinstance(v, list) and all(map(is_int, v)))}


TEXT_TYPES = {"turns": ("texts", lambda v: isinstance(v, str)),
              "finish_reason": ('"stop" or "length"', lambda v: v in ("stop", "length"))}


def _check_answer(record: Any, where: str, path: Path, advice: str) -> None:
    choices = record.get("choices") if isinstance(record, dict) else None
    if not (isinstance(record, dict) and "question_id" in record and isinstance(choices, list) and choices
            and isinstance(choices[0], dict) and all(k in choices[0] for k in ANSWER_KEYS)):
        question = isinstance(record, dict) and "turns" in record and "choices" not in record
        what = "a question" if question else "not an answer"
        raise OutputError(f"{where} is {what} (an answer line has question_id and choices[0] with "
                          f"{', '.join(ANSWER_KEYS)}), so {path} is not an answers file; {advice}")
    qid = record["question_id"]  # as a question file's: true would answer question 81 again beside it
    if not data.is_question_id(qid):
        raise OutputError(f"{where}: question_id is {data.short(qid)}, not an int or a non-blank string; the file was "
                          f"changed by hand: restore that line or remove it (its question is answered again), or "
                          f"{advice}")
    # An edit by hand: refused here, not as a TypeError in the summary after a new answer was appended. The texts
    # (what FastChat's judges read) and finish reasons where present, as a hand-made file may leave them out.
    for key, (what, ok) in {**ANSWER_TYPES, **{k: v for k, v in TEXT_TYPES.items() if k in choices[0]}}.items():
        value = choices[0][key]
        if not (isinstance(value, list) and all(map(ok, value))):
            raise OutputError(f"{where}: choices[0].{key} is {data.short(value)}, not a list of {what} (one a turn); "
                              f"the file was changed by hand: restore that line or remove it (its question is "
                              f"answered again), or {advice}")
    # The counts a run writes agree with each other; an edited one would go into every summary and report.
    c = choices[0]
    keys = (*ANSWER_KEYS, *(k for k in TEXT_TYPES if k in c))
    turns = {len(c[key]) for key in keys}
    bad = next((i for i, (ids, n, steps, acc) in enumerate(zip(c["output_ids"], c["new_tokens"], c["decoding_steps"],
                                                               c["accept_lengths"]))
                if not len(ids) == n == sum(acc) or steps != len(acc)), None)
    if len(turns) > 1 or bad is not None:
        what = (f"the lists {', '.join(keys)} have {' / '.join(str(len(c[k])) for k in keys)} turns"
                if len(turns) > 1 else
                f"turn {bad + 1} has {len(c['output_ids'][bad])} output_ids, new_tokens {c['new_tokens'][bad]}, "
                f"accept_lengths summing to {sum(c['accept_lengths'][bad])} over {len(c['accept_lengths'][bad])} "
                f"steps and decoding_steps {c['decoding_steps'][bad]}")
        raise OutputError(f"{where}: {what}, which a run never writes (one count a turn, all equal); the file was "
                          f"changed by hand: restore that line or remove it (its question is answered again), or "
                          f"{advice}")


def append_line(path: Path, record: dict) -> None:
    """Append one JSON line in a single write, then fsync (a kill leaves at most a partial last line; a failed
    write, e.g. a full disk, is cut back off: the file ends with its last whole line). ``OSError`` naming ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = path.stat().st_size if path.exists() else 0
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        with contextlib.suppress(OSError):  # shrinking needs no space
            if path.stat().st_size > size:
                os.truncate(path, size)
        raise OSError(e.errno, e.strerror, str(path)) from e


def first_line(record: dict, width: int = 120) -> str:
    """``[question id] first line of the first turn``: how the job shows an answer, on one line (an id that is not
    one short printable line is shown as its JSON, cut to ``width``).

        >>> print(first_line({"question_id": "a\\nb", "choices": [{"turns": ["Hi.\\nMore"]}]}))
        ["a\\nb"] Hi.
    """
    text = (record["choices"][0].get("turns") or [""])[0]
    qid = str(record["question_id"])
    if not qid.isprintable() or not qid or len(qid) > width:
        qid = json.dumps(record["question_id"], ensure_ascii=False)
        qid = qid if len(qid) <= width else qid[: width - 3] + "..."
    return f"[{qid}] {(text.strip().splitlines() or [''])[0][:width]}"


FORMAT = 1
# Display and bookkeeping keys; dataset.limit only extends or shortens the list of questions answered; the LP
# collectives' backend and the debug check move the same small outputs, so the answers are the same.
NOT_COMPARED = ("progress", "output.path", "output.summary_path", "parallel.timeout_s", "dataset.limit",
                "parallel.backend", "parallel.debug_check")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves, values JSON-normalised."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.loads(json.dumps(tree))}


def run_settings(cfg: RunConfig, *, model_fingerprint: str, world_size: int) -> dict[str, Any]:
    """The compared settings of ``cfg`` (sorted dotted keys, JSON values), model.fingerprint and parallel.world_size."""
    flat = {k: v for k, v in flatten(dataclasses.asdict(cfg)).items() if k not in NOT_COMPARED}
    flat["model.fingerprint"] = model_fingerprint
    if cfg.model.dtype != "auto":  # auto's choice is added once the model is loaded
        flat["model.resolved_dtype"] = cfg.model.dtype
    flat["parallel.world_size"] = world_size
    return dict(sorted(flat.items()))


# Settings that left the configuration, with the value that is today's behaviour: a record holding it resumes.
RETIRED = {"decoding.lookup": "suffix", "decoding.tree": True, "decoding.ranking": "counts", "decoding.commit": "copy",
           "decoding.cross_question": None, "decoding.ngram_keys": "all", "decoding.chain": True}
# Every decoding setting but the method: greedy decoding reads none of them.
GREEDY_IGNORES = tuple(f"decoding.{f.name}" for f in dataclasses.fields(DecodingConfig) if f.name != "method")
# What decoding=paper does not read: its candidates are the pool's separate n-grams (no tree, no successor table).
PAPER_IGNORES = ("decoding.max_depth", "decoding.successors")
SAME_FILE = ("dataset.path",)  # settings that name a file: compared as the file they name
TABLES = ("sampling.category_temperature.",)  # settings holding a {key: value} table: one flat key an entry
# What run_settings writes whatever the values (a table setting's entries aside)
_DEFAULT_KEYS = frozenset(flatten(dataclasses.asdict(RunConfig()))) | {"model.fingerprint", "parallel.world_size"}
# Known once the model is loaded (what model.dtype=auto chose): compared when both sides have them; a record from
# before them, and the check made before the model loads, skip them. Where model.dtype is auto on either side of a
# record that has it, it decides instead of model.dtype.
# model.mkl_mode: the mode MKL runs in on a CPU (blas.mkl_mode; 'default' for MKL's own): it changes the numerics.
AFTER_LOAD = ("model.resolved_dtype", "model.mkl_mode")
# sampling=model: what the model's generation_config gave (``applied_sampling``), known once it is loaded, as
# AFTER_LOAD; the report shows these in place of the sampling.* settings, which then hold only their defaults.
APPLIED = "sampling.applied."


def applied_sampling(applied) -> dict[str, Any]:
    """``{"sampling.applied.<key>": value}`` for each setting ``sampling=model`` takes (``config.MODEL_TAKEN``)
    from ``applied``, the ``SamplingConfig`` it resolved to (``sampling.model_sampling``)."""
    return {APPLIED + k: json.loads(json.dumps(getattr(applied, k))) for k in MODEL_TAKEN}


def real_path(path: str) -> str:
    """One spelling of ``path`` (relative to this directory, ``./``, absolute, ``~``): the file it names."""
    return os.path.realpath(os.path.expanduser(path))


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, recorded, current)`` for every compared key that differs; a key absent from ``recorded`` counts
    as its default (a decoding key: the recorded method's, ``DecodingConfig(method=...)``), a ``RETIRED`` key
    absent from ``current`` as its retired value. Between two greedy runs ``GREEDY_IGNORES`` are not compared, between
    two paper runs ``PAPER_IGNORES``."""
    method = recorded.get("decoding.method")
    decoding = DecodingConfig(method=method) if isinstance(method, str) and method in PRESETS else DecodingConfig()
    defaults = flatten(dataclasses.asdict(RunConfig(decoding=decoding)))
    missing = object()
    greedy = method == current.get("decoding.method") == "greedy"
    paper = method == current.get("decoding.method") == "paper"
    out = []
    for key in sorted(set(recorded) | set(current)):
        if key in NOT_COMPARED or (key not in current and key in RETIRED and recorded[key] == RETIRED[key]):
            continue
        if (key in AFTER_LOAD or key.startswith(APPLIED)) and (key not in recorded or key not in current):
            continue
        if key == "model.dtype" and "auto" in (recorded.get(key), current.get(key)) and AFTER_LOAD[0] in recorded:
            continue  # the dtype loaded is compared instead
        if (greedy and (key in GREEDY_IGNORES or key in RETIRED)) or (paper and key in PAPER_IGNORES):
            continue
        old = recorded.get(key, defaults.get(key, missing))
        new = current.get(key, missing)
        if key in SAME_FILE and isinstance(old, str) and isinstance(new, str) and real_path(old) == real_path(new):
            continue  # q.jsonl, ./q.jsonl and /abs/q.jsonl name one question file
        if old != new:
            out.append((key, None if old is missing else old, None if new is missing else new))
    return out


def has_answers(answers_path: Path) -> bool:
    """True when ``answers_path`` holds at least one complete line."""
    if not answers_path.is_file():
        return False
    with open(answers_path, "rb") as f:
        return any(line.endswith(b"\n") and line.strip() for line in f)


def next_free(base: str, suffix: str = "") -> str:
    """``<base>-N<suffix>`` for the smallest N >= 2 that names nothing yet (a new output path or sweep folder)."""
    n = 2
    while Path(f"{base}-{n}{suffix}").exists():
        n += 1
    return f"{base}-{n}{suffix}"


def new_sweep_hint(sweep_dir: str) -> str:
    """Where a sweep job writes instead of answers made with other settings: a new sweep folder."""
    folder = override_arg("hydra.sweep.dir", next_free(str(sweep_dir).rstrip("/")))
    return f"{folder}: each job of the sweep writes into its own folder there"


def new_output_arg(answers_path: Path) -> str:
    """``output.path=<the next free <name>-N.jsonl>`` for a refusal to suggest (``override_arg``)."""
    return override_arg("output.path", next_free(jsonl_base(str(answers_path)), ".jsonl"))


def override_arg(key: str, value: str) -> str:
    """``key=value`` as one shell word that Hydra parses back to ``value`` (a suggested path pasted into a command
    line): the value in Hydra's double quotes where it holds a character its grammar does not take bare (a space,
    a comma, which would make a sweep, brackets, non-ASCII letters), then quoted for the shell.

        >>> print(override_arg("output.path", "runs/a-2.jsonl"), override_arg("output.path", "my runs/a-2.jsonl"))
        output.path=runs/a-2.jsonl 'output.path="my runs/a-2.jsonl"'
    """
    if not re.fullmatch(r"[A-Za-z0-9_./+@%:-]*", value):
        backslashes = len(value) - len(value.rstrip("\\"))  # a closing quote after them must stay one
        value = '"' + value.replace('"', '\\"') + "\\" * backslashes + '"'
    return shlex.quote(f"{key}={value}")


def check_settings(answers_path: Path, settings_path: Path, current: dict[str, Any],
                   new_path_hint: Optional[str] = None) -> None:
    """``SettingsMismatchError`` unless the answers in ``answers_path`` were made with ``current``; a file without
    answers passes; reads only. ``new_path_hint``: where to write instead (default: the next free <name>-N.jsonl)."""
    if not has_answers(answers_path):
        return
    hint = new_path_hint or new_output_arg(answers_path)
    if not settings_path.is_file():
        raise SettingsMismatchError(
            f"{answers_path} holds answers but no record of the settings that made them ({settings_path} is "
            f"missing: the file was written before lp_runtime recorded settings, or by another tool), so a resumed "
            f"run could mix settings; choose a new output path ({hint}) or move the file away")
    recorded = read_settings(settings_path)
    if recorded is None:
        raise SettingsMismatchError(f"{settings_path} is not a settings record written by lp_runtime; "
                                    f"choose a new output path ({hint}) or move both files away")
    unknown = [key for key in recorded if not _written(key, current)]
    if unknown:  # no setting of this version gives it: "re-run with the file's settings" cannot help
        keys = f"the key{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}"
        raise SettingsMismatchError(
            f"{settings_path} holds {keys}, which this version of lp_runtime never writes: the record was written "
            f"by another version of lp_runtime, or edited; write to a new output path ({hint}), or resume the file "
            "with the version that wrote it")
    diffs = differences(recorded, current)
    if diffs:
        listed = "; ".join(f"{k}: {_as_typed(old)} in the file, {_as_typed(new)} now" for k, old, new in diffs)
        raise SettingsMismatchError(
            f"{answers_path} was made with other settings ({settings_path}): {listed}; re-run with "
            f"{_resume_how(diffs)} to resume it, or write to a new output path ({hint})")


def recorded_dtype(answers_path: Path, settings_path: Path) -> Optional[str]:
    """The dtype a file with answers was made in (``model.resolved_dtype`` of its record), or None (no answers, no
    readable record, or a record from before the key): what ``model.dtype=auto`` resumes it in, as its choice can
    differ between runs (a machine under load when the dtypes were first timed)."""
    if not has_answers(answers_path) or not settings_path.is_file():
        return None
    dtype = (read_settings(settings_path) or {}).get("model.resolved_dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else None


def _written(key: str, current: dict[str, Any]) -> bool:
    """Whether this version of lp_runtime writes ``key`` into a settings record (``run_settings``, the keys known
    once the model is loaded, an entry of a table setting) or did once (``RETIRED``)."""
    return (key in current or key in _DEFAULT_KEYS or key in RETIRED or key in AFTER_LOAD
            or key.startswith((APPLIED, *TABLES)))


def _resume_how(diffs: list[tuple[str, Any, Any]]) -> str:
    """What a resume needs: model.dtype=X where another dtype was given (``model.dtype=auto`` loads the file's), the
    ``MKL_CBWR`` value where only MKL's mode differs, the version that made the file where a setting it
    recorded is gone (``RETIRED``), else the file's settings."""
    recorded = {key: old for key, old, _ in diffs}
    gone = [key for key in recorded if key in RETIRED]
    if gone:
        return f"the version of lp_runtime that made it (this one has no setting {', '.join(gone)})"
    if "model.resolved_dtype" in recorded:
        return f"model.dtype={recorded['model.resolved_dtype']}"
    if list(recorded) == ["model.mkl_mode"]:
        env = mkl_env(recorded["model.mkl_mode"])
        return f"MKL_CBWR={env} in the environment" if env else "MKL_CBWR set empty in the environment (MKL's default)"
    return "the file's settings"


def mkl_env(mode: str) -> str:
    """The ``MKL_CBWR`` value that gives a recorded ``model.mkl_mode`` ('default' -> '', 'auto-strict' ->
    'AUTO,STRICT')."""
    return "" if mode == "default" else mode.replace("-strict", ",strict").upper()


def write_settings(settings_path: Path, current: dict[str, Any]) -> None:
    """Record ``current`` (atomically, ``write_json``)."""
    write_json(settings_path, {"format": FORMAT, "settings": current}, indent=1)


def read_settings(settings_path: Path, *, any_format: bool = False) -> Optional[dict[str, Any]]:
    """The recorded settings, or None when there is no readable record. ``SettingsMismatchError`` for a record
    whose ``format`` is not ``FORMAT`` (written by another version of lp_runtime, or edited; "1" and true too),
    unless ``any_format`` (a report shows what any record holds)."""
    record = read_json(settings_path)
    settings = record.get("settings") if isinstance(record, dict) else None
    if not (isinstance(settings, dict) and settings):  # edited into {}, a list, a string
        return None
    found = record.get("format")
    if not (any_format or (is_int(found) and found == FORMAT)):
        shown = data.short(found) if "format" in record else "none (no \"format\" key)"
        raise SettingsMismatchError(
            f"{settings_path} is a settings record of format {shown}, and this version of lp_runtime reads format "
            f"{FORMAT} only: it was written by another version of lp_runtime, or edited; use the version that wrote "
            "it, or move the record and its answers file away (or choose another output.path)")
    return settings


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _as_typed(value) -> str:
    """A setting's value as a user writes it on the command line: true/false/null, numbers, quoted strings."""
    return json.dumps(value) if value is None or isinstance(value, (bool, int, float)) else repr(value)
