import json
import re

import pytest

from lp_runtime.config import DatasetConfig
from lp_runtime.data import DatasetError, Question, build_prompt, load_questions


def test_mt_bench():
    qs = load_questions(DatasetConfig(name="mt_bench"))
    assert len(qs) == 80 and all(len(q.turns) == 2 and not q.raw for q in qs)
    assert qs[0].question_id == 81 and qs[0].category == "writing"
    assert {q.category for q in qs} == {
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"
    }


def test_humaneval():
    qs = load_questions(DatasetConfig(name="humaneval"))
    assert len(qs) == 164 and all(q.raw and q.category == "coding" and len(q.turns) == 1 for q in qs)
    assert qs[12].question_id == "HumanEval/12" and qs[12].turns[0].startswith("from typing import")


def test_limit_and_first_turn_only():
    qs = load_questions(DatasetConfig(name="mt_bench", limit=5, first_turn_only=True))
    assert [q.question_id for q in qs] == [81, 82, 83, 84, 85]
    assert all(len(q.turns) == 1 for q in qs)


def _write(tmp_path, lines):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_jsonl_valid(tmp_path):
    path = _write(tmp_path, [
        json.dumps({"question_id": 1, "category": "math", "turns": ["a", "b"]}),
        "",
        json.dumps({"question_id": "x2", "turns": ["c"]}),
        json.dumps({"question_id": 3, "category": None, "turns": ["d"]}),  # Python's json.dump of None
    ])
    assert load_questions(DatasetConfig(name="jsonl", path=path)) == [
        Question(1, "math", ["a", "b"], False),
        Question("x2", None, ["c"], False),  # no category: written as null (it was "default", which README's
        Question(3, None, ["d"], False),     # "no category" was not, and which a category "default" would merge with)
    ]


FORMAT = 'each line must be a JSON object {"question_id": int or str, "category": str or null (optional), "turns": [str, ...]}'


def _error(path):
    with pytest.raises(DatasetError) as e:
        load_questions(DatasetConfig(name="jsonl", path=path))
    return str(e.value)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_jsonl_with_a_byte_order_mark(tmp_path, newline):
    """What Notepad and Excel write: a UTF-8 BOM first (and CRLF line ends), read like plain UTF-8."""
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": 1, "category": "c", "turns": ["héllo"]}, {"question_id": "b", "turns": ["x", "y"]}]
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps(r, ensure_ascii=False).encode() + newline for r in rows))
    qs = load_questions(DatasetConfig(name="jsonl", path=str(path)))
    assert [(q.question_id, q.category, q.turns) for q in qs] == [(1, "c", ["héllo"]), ("b", None, ["x", "y"])]
    # Only a file's first bytes are a BOM: one inside a later line is still what it is, a bad character.
    path.write_bytes(json.dumps(rows[0]).encode() + newline + b"\xef\xbb\xbf" + json.dumps(rows[1]).encode() + newline)
    with pytest.raises(DatasetError, match=r"line 2: not valid JSON"):
        load_questions(DatasetConfig(name="jsonl", path=str(path)))


def test_jsonl_missing_file(tmp_path):
    path = str(tmp_path / "nope.jsonl")
    assert _error(path) == f"dataset.path={path!r} does not exist; give a question file in JSONL format ({FORMAT})"


def test_jsonl_missing_relative_file_names_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    """Under hydra.job.chdir=true a relative dataset.path is the run folder's: "does not exist" while the file sat
    where the command ran (a new user, 2026-12-07). The message names the folder it looked in."""
    monkeypatch.chdir(tmp_path)
    assert _error("q.jsonl") == (f"dataset.path='q.jsonl' does not exist in {tmp_path}; give a question file in JSONL "
                                 f"format ({FORMAT})")


def test_jsonl_empty(tmp_path):
    path = _write(tmp_path, ["", "  "])
    assert _error(path) == f"dataset.path={path!r} holds no questions; {FORMAT}"


def test_jsonl_malformed(tmp_path):
    path = _write(tmp_path, [json.dumps({"question_id": 1, "turns": ["a"]}), '{"question_id": 2,'])
    assert _error(path) == f"{path}, line 2: not valid JSON (Expecting property name enclosed in double quotes); {FORMAT}"


def test_jsonl_not_object(tmp_path):
    path = _write(tmp_path, ['["a"]'])
    assert _error(path) == f"{path}, line 1: expected a JSON object, got list; {FORMAT}"


@pytest.mark.parametrize("row, message", [
    ({"turns": ["a"]}, "field 'question_id' is missing; it must be an int or a string"),
    ({"question_id": 1.5, "turns": ["a"]}, "field 'question_id' is 1.5; it must be an int or a string"),
    ({"question_id": True, "turns": ["a"]}, "field 'question_id' is true; it must be an int or a string"),
    ({"question_id": " ", "turns": ["a"]}, "field 'question_id' is \" \", blank; it must name the question (an int "
                                          "or a non-blank string: answers are matched to questions by it)"),
    # values as JSON spells them (a new user, 2026-12-04: "is None"; a null category is now no category)
    ({"question_id": 1, "category": 3, "turns": ["a"]},
     "field 'category' is 3; it must be a string (or null, or left out)"),
    ({"question_id": 1, "category": [], "turns": ["a"]},
     "field 'category' is []; it must be a string (or null, or left out)"),
    ({"question_id": 1}, "field 'turns' is missing; it must be a non-empty list of non-blank strings"),
    ({"question_id": 1, "turns": "a"}, "field 'turns' is \"a\"; it must be a non-empty list of non-blank strings"),
    ({"question_id": 1, "turns": []}, "field 'turns' is []; it must be a non-empty list of non-blank strings"),
    ({"question_id": 1, "turns": ["a", ""]},
     "field 'turns' is [\"a\", \"\"]; it must be a non-empty list of non-blank strings"),
    ({"question_id": 1, "turns": ["ok", "a\ud800b"]},  # valid JSON ("\\ud800"); the tokenizer raised a TypeError
     "turn 2 holds a lone UTF-16 surrogate '\\ud800' at character 1; a turn must be valid Unicode text (a pair "
     "such as \\ud83d\\ude00 is one character and fine)"),
    ({"question_id": 1, "turns": [" \n\t"]},
     "field 'turns' is [\" \\n\\t\"]; it must be a non-empty list of non-blank strings"),
    # invisible format characters show nothing, as whitespace: a zero-width space alone was accepted (a new user)
    ({"question_id": 1, "turns": ["\u200b"]},
     "field 'turns' is [\"\\u200b\"]; it must be a non-empty list of non-blank strings (turn 1 is only invisible "
     "characters (U+200B))"),
    ({"question_id": 1, "turns": ["ok", " \u200c\u200d\u2060\ufeff\u200c "]},
     "field 'turns' is [\"ok\", \" \\u200c\\u200d\\u2060\\ufeff\\u200c \"]; it must be a non-empty list of "
     "non-blank strings (turn 2 is only whitespace and invisible characters (U+200C, U+200D, U+2060, U+FEFF))"),
    # a control character other than whitespace shows nothing either: a turn of one NUL was answered (a new user)
    ({"question_id": 1, "turns": ["\u0000"]},
     "field 'turns' is [\"\\u0000\"]; it must be a non-empty list of non-blank strings (turn 1 is only invisible "
     "characters (U+0000))"),
])
def test_jsonl_bad_field(tmp_path, row, message):
    path = _write(tmp_path, [json.dumps(row)])
    assert _error(path) == f"{path}, line 1: {message}"


def test_jsonl_key_given_twice_is_refused(tmp_path):
    """{"question_id": 1, "turns": ["hi"], "question_id": 2} was answered as question 2 without a word (a new user,
    2026-12-03): JSON allows the repeat and Python keeps the last value."""
    path = _write(tmp_path, ['{"question_id": 1, "turns": ["hi"]}',
                             '{"question_id": 1, "turns": ["hi"], "question_id": 2}'])
    assert _error(path) == f"{path}, line 2: key 'question_id' appears twice in one object; keep one of them"
    path = _write(tmp_path, ['{"question_id": 1, "turns": [{"a": 1, "a": 2}]}'])  # nested objects too
    assert _error(path) == f"{path}, line 1: key 'a' appears twice in one object; keep one of them"


def test_jsonl_turn_with_invisible_characters_and_text_is_kept(tmp_path):
    """Only a turn that shows nothing is blank: a zero-width joiner inside an emoji sequence, or a zero-width space
    beside text, is part of the text."""
    turns = ["\U0001f469\u200d\U0001f4bb", "\u200bhi\ufeff"]
    path = _write(tmp_path, [json.dumps({"question_id": 1, "turns": turns})])
    assert load_questions(DatasetConfig(name="jsonl", path=path))[0].turns == turns


@pytest.mark.parametrize("ids, shown", [((7, 7), "7 repeats 7"), (("7", 7), '7 repeats "7"'),
                                        ((7, "7"), '"7" repeats 7')])
def test_jsonl_duplicate_id(tmp_path, ids, shown):
    """Ids are compared as text, as resume matches answers to questions: 7 and "7" would be one question there."""
    path = _write(tmp_path, [json.dumps({"question_id": i, "turns": ["a"]}) for i in ids])
    assert _error(path) == (f"{path}, line 2: question_id {shown} on line 1; question ids must be unique "
                            '(compared as text: 1 and "1" are the same id)')


def test_build_prompt_chat_multi_turn(smollm2):
    _, tok = smollm2
    q = Question(1, "writing", ["Name a color.", "Name another one."], raw=False)
    first = build_prompt(tok, q, [])
    assert isinstance(first, list) and all(type(t) is int for t in first)
    assert tok.decode(first).endswith("<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n")
    second = build_prompt(tok, q, ["Blue is a color."])
    text = tok.decode(second)
    assert "Blue is a color." in text and "Name a color." in text
    assert text.endswith("<|im_start|>user\nName another one.<|im_end|>\n<|im_start|>assistant\n")
    assert second[: len(first)] == first
    with pytest.raises(ValueError, match=re.escape("question 1 has 2 turn(s); no turn 2 to build a prompt for")):
        build_prompt(tok, q, ["a", "b"])


def test_build_prompt_raw(smollm2):
    _, tok = smollm2
    q = load_questions(DatasetConfig(name="humaneval", limit=1))[0]
    ids = build_prompt(tok, q, [])
    assert ids == tok(q.turns[0], return_tensors="pt").input_ids[0].tolist()
    assert tok.decode(ids) == q.turns[0]


def test_build_prompt_without_chat_template(smollm2):
    _, tok = smollm2
    q = Question(1, "writing", ["Hi.", "Again."], raw=False)
    saved = tok.chat_template
    tok.chat_template = None
    try:
        assert build_prompt(tok, q, ["Hello."]) == tok("Hi.\nHello.\nAgain.").input_ids
    finally:
        tok.chat_template = saved


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz", "zip"])
def test_a_compressed_question_file_is_named_as_such(tmp_path, kind):
    """A gzipped question file was told "byte 2 (b'\\x8b') is not UTF-8; save the file as UTF-8 (e.g. iconv -f
    latin1 ...)" (a new user, 2026-12-04)."""
    import bz2
    import gzip
    import lzma
    import zipfile

    text = json.dumps({"question_id": 1, "turns": ["a"]}).encode() + b"\n"
    path = tmp_path / "q.jsonl.packed"
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("q.jsonl", text)
    else:
        path.write_bytes({"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}[kind](text))
    article = "an" if kind == "xz" else "a"
    assert _error(str(path)) == (f"dataset.path={str(path)!r} is {article} {kind} file; unpack it first, then give "
                                 "the JSONL file inside")


@pytest.mark.parametrize("encoding, name", [("utf-16", "UTF-16"), ("utf-16-be", None), ("utf-32", "UTF-32")])
def test_a_utf16_or_utf32_question_file_is_named_as_such(tmp_path, encoding, name):
    """A UTF-16 question file (Windows' "Unicode") was told "byte 1 (b'\\xff') is not UTF-8; save the file as UTF-8
    (e.g. iconv -f latin1 ...)", which would garble it (a new user, 2026-12-04)."""
    path = tmp_path / "q.jsonl"
    text = json.dumps({"question_id": 1, "turns": ["a"]}) + "\n"
    path.write_bytes(("\ufeff" + text).encode(encoding) if name is None else text.encode(encoding))
    name = name or "UTF-16"
    assert _error(str(path)) == (f"dataset.path={str(path)!r} is {name} text (it starts with a {name} byte-order "
                                 f"mark); save it as UTF-8 (e.g. iconv -f {name} -t UTF-8)")


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le"])
def test_a_utf16_question_file_without_a_mark_is_named_as_such(tmp_path, encoding):
    """Without a byte-order mark the same file was "line 1: not valid JSON (Expecting property name ...)" (a second
    new-user pass, 2026-12-04)."""
    path = tmp_path / "q.jsonl"
    path.write_bytes((json.dumps({"question_id": 1, "turns": ["a"]}) + "\n").encode(encoding))
    assert _error(str(path)) == (f"dataset.path={str(path)!r} holds NUL bytes in its first line, as UTF-16 or UTF-32 "
                                 "text does; save it as UTF-8 (e.g. iconv -f UTF-16LE -t UTF-8)")


def test_a_compressed_answers_file_is_named_as_such(tmp_path):
    """A gzipped answers file given to the report (or as output.path) was "byte 2 (b'\\x8b') is not UTF-8; an
    answers file is written as UTF-8, so this one was changed elsewhere" (a new user's second pass, 2026-12-04)."""
    import gzip

    from lp_runtime.answers import OutputError, load_answers

    path = tmp_path / "answers.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"question_id": 1}\n'))
    with pytest.raises(OutputError) as e:
        load_answers(path, trim=False)
    assert str(e.value) == f"{path} is a gzip file; unpack it first, then give the JSONL file inside"
