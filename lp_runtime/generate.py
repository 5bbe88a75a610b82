"""Main job: answer a prompt set with lookahead decoding; write answers JSONL and a run summary.

Run from the repository root (config groups in ``conf/``; overrides are Hydra's ``key=value``)::

    python -m lp_runtime.generate dataset.limit=3
    python -m lp_runtime.generate model=llama2_7b_chat decoding=paper dataset=humaneval generation.max_new_tokens=256
    torchrun --standalone --nproc-per-node=1 -m lp_runtime.generate hydra.run.dir=outputs/hydra/run1 dataset.limit=3

(``launch/torchrun_single_node.sh`` wraps the torchrun line.) Answers go to ``output.path`` (default
``outputs/answers.jsonl``, relative to the launch directory), one JSON line per question, written and fsynced as
each question finishes; re-running with the same path skips the questions already there. The summary
(``lp_runtime.metrics``) goes next to it. A bad setting, model, dataset or output path ends the job with
``error: <message>`` on stderr and exit code 2.
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from lp_runtime import data, metrics
from lp_runtime.config import ConfigError, RunConfig, register_configs

register_configs()


class OutputError(ValueError):
    """``output.path`` cannot hold the answers (a folder, unwritable, or a corrupt earlier answers file)."""


def _rank() -> int:
    """Global rank of this process (0 when not launched by torchrun). Only rank 0 writes or prints."""
    # TODO: replace with lp_runtime.distributed once it exists.
    return int(os.environ.get("RANK", 0))


def check_output_path(path: Path, *, create: bool) -> None:
    """Raise ``OutputError`` unless ``path`` can be a file we append to; create its folder if ``create``."""
    if path.is_dir():
        raise OutputError(f"output path {path} is a folder; give a file path such as {path / 'answers.jsonl'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"cannot create the folder for output path {path}: {parent} is a file")
            break
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create the folder for output path {path}: {e.strerror}") from None
    target = path if path.exists() else path.parent
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputError(f"output path {path} is not writable")


def load_answers(path: Path, *, trim: bool) -> list[dict]:
    """Answers already in ``path`` (empty if it does not exist).

    A final line without its newline is what a killed run leaves: it is ignored, and with ``trim`` cut off the
    file so the next append starts on a fresh line. Any other line that is not JSON raises ``OutputError``.
    """
    if not path.exists():
        return []
    raw = path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    if trim and len(complete) < len(raw):
        with open(path, "r+b") as f:
            f.truncate(len(complete))
            os.fsync(f.fileno())
    records = []
    for num, line in enumerate(complete.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise OutputError(f"{path} line {num} is not JSON; move the file away or choose another output.path") from None
    return records


def append_line(path: Path, record: dict) -> None:
    """Append one JSON line with a single write, then flush and fsync (a kill leaves at most a partial last line)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def answer_question(decoder: Any, tokenizer: Any, question: data.Question, cfg: RunConfig) -> dict:
    """Decode every turn of ``question`` (each turn's prompt holds the answers so far); the FastChat ``choices[0]``."""
    choice: dict[str, Any] = {"index": 0, "turns": [], "output_ids": [], "new_tokens": [], "decoding_steps": [],
                              "wall_time": [], "accept_lengths": [], "finish_reason": []}
    for _ in question.turns:
        prompt_ids = data.build_prompt(tokenizer, question, choice["turns"])
        out = decoder.generate(prompt_ids, max_new_tokens=cfg.generation.max_new_tokens,
                               stop_strings=cfg.generation.stop_strings)
        choice["turns"].append(tokenizer.decode(out.output_ids, skip_special_tokens=True))
        choice["output_ids"].append(list(out.output_ids))
        choice["new_tokens"].append(len(out.output_ids))
        choice["decoding_steps"].append(out.decoding_steps)
        choice["wall_time"].append(out.wall_time)
        choice["accept_lengths"].append(list(out.accept_lengths))
        choice["finish_reason"].append(out.finish_reason)
    return choice


def run(cfg: RunConfig) -> dict:
    """Answer every question of ``cfg.dataset`` not yet in ``cfg.output.path``; write and return the summary.

    Cheap checks (output path, dataset) come before the model loads, so bad input fails in about a second.
    Raises ``ConfigError``, ``OutputError``, ``data.DatasetError``, ``models.ModelLoadError`` or ``OSError`` on bad input.
    """
    rank = _rank()
    is_main = rank == 0
    answers_path = Path(cfg.output.path)
    summary_path = Path(cfg.output.resolved_summary_path)
    check_output_path(answers_path, create=is_main)
    check_output_path(summary_path, create=is_main)
    records = load_answers(answers_path, trim=is_main)
    done = {str(r["question_id"]) for r in records}
    todo = [q for q in data.load_questions(cfg.dataset) if str(q.question_id) not in done]

    if todo:
        # Imported here so that bad input is reported before torch and transformers load (seconds).
        from lp_runtime import models
        from lp_runtime.decoder import Decoder

        model, tokenizer = models.load_model(cfg.model)
        eos = models.eos_token_ids(model, tokenizer, cfg.generation.eos_token_ids)
        decoder = Decoder(model, cfg.decoding, eos_token_ids=eos, tokenizer=tokenizer)
        model_id = cfg.model_id or cfg.model.name
        for question in tqdm(todo, desc="questions", unit="q", disable=not (cfg.progress and is_main)):
            choice = answer_question(decoder, tokenizer, question, cfg)
            record = {
                "question_id": question.question_id,
                "category": question.category,
                # Deterministic: the same model and outputs give the same id.
                "answer_id": uuid.uuid5(uuid.NAMESPACE_OID, json.dumps([model_id, question.question_id,
                                                                        choice["output_ids"]])).hex,
                "model_id": model_id,
                "choices": [choice],
                "tstamp": time.time(),
            }
            records.append(record)
            if is_main:
                append_line(answers_path, record)
                first_line = (choice["turns"][0].strip().splitlines() or [""])[0]
                tqdm.write(f"[{question.question_id}] {first_line[:120]}")

    summary = metrics.run_summary(records, cfg, str(answers_path))
    if is_main:
        tmp = summary_path.with_name(summary_path.name + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, summary_path)
        shown = {k: v for k, v in summary.items() if k not in ("config", "versions")}
        print(json.dumps(shown, indent=2))
        print(f"answers: {answers_path}\nsummary: {summary_path}")
    return summary


def _is_bad_input(e: BaseException) -> bool:
    """Errors that come from what the user gave (reported in one line) rather than from a bug (traceback)."""
    kinds: tuple[type, ...] = (ConfigError, OutputError, data.DatasetError, OmegaConfBaseException, OSError)
    models = sys.modules.get("lp_runtime.models")  # ModelLoadError can only be raised once models is imported
    return isinstance(e, kinds + ((models.ModelLoadError,) if models else ()))


def _one_line(e: BaseException) -> str:
    """``e``'s message in one line: its first line, Hydra's list of available options if any, and the first line
    of an OmegaConf cause (Hydra wraps OmegaConf's errors)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    msg = lines[0]
    if len(lines) > 2 and lines[1].endswith(":"):  # "Available options in 'model':" then one option a line
        options = next((lines[2:i] for i in range(2, len(lines)) if lines[i].endswith(":")), lines[2:])
        msg += f" ({lines[1]} {', '.join(options)})"
    if isinstance(e.__cause__, OmegaConfBaseException) and str(e.__cause__).strip():
        msg = msg.rstrip(".") + ": " + str(e.__cause__).strip().splitlines()[0]
    return msg


def _fail(e: BaseException) -> NoReturn:
    print(f"error: {_one_line(e)}", file=sys.stderr)
    sys.exit(2)


# An absolute path: "../conf" would resolve as the Python module `conf` under `python -m`, found only when the
# launch directory is the repository root.
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(config_path=CONF_DIR, config_name="generate", version_base=None)
def _hydra_main(dict_cfg: DictConfig) -> None:
    try:
        cfg = OmegaConf.to_object(dict_cfg)
        assert isinstance(cfg, RunConfig)
        run(cfg)
    except Exception as e:
        if not _is_bad_input(e):
            raise
        _fail(e)


def main() -> None:
    # Without HYDRA_FULL_ERROR, Hydra prints composition errors (a wrong type or an unknown key in an override)
    # itself and exits with 1; with it they reach us and are reported like every other bad input.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _hydra_main()
    except (HydraException, OmegaConfBaseException) as e:
        _fail(e)


if __name__ == "__main__":
    main()
