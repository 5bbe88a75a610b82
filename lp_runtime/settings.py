"""The settings an answers file was made with, recorded beside it, and the check that a resumed run matches them.

An answers file ``answers.jsonl`` gets ``answers.settings.json`` (``OutputConfig.resolved_settings_path``) when
its first answer is written: the resolved run config flattened to dotted keys (``decoding.window_size``), plus
``model.fingerprint`` (``models.model_fingerprint``: what the files of ``model.path`` hold) and
``parallel.world_size`` (ranks). A later run on the same file compares its own settings before loading the model
and refuses, naming each differing key with both values, so one file never mixes answers of two settings and its
summary describes the one setting that made it.

Every config field counts (new fields added to the dataclasses are compared without being listed here), except
the few in ``NOT_COMPARED``: they change neither the tokens nor the speed, or (``dataset.limit``) only choose how
many questions to answer. A key missing from an older record is taken as its default value.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from lp_runtime.config import RunConfig

FORMAT = 1
# Display and bookkeeping keys; dataset.limit only extends or shortens the list of questions answered.
NOT_COMPARED = ("progress", "output.path", "output.summary_path", "parallel.timeout_s", "dataset.limit")


class SettingsMismatchError(ValueError):
    """A re-run's settings differ from those recorded for its answers file (or none were recorded)."""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves, values JSON-normalised."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.loads(json.dumps(tree))}


def run_settings(cfg: RunConfig, *, model_fingerprint: str, world_size: int) -> dict[str, Any]:
    """The compared settings of ``cfg``: flat dotted keys, sorted, JSON values."""
    flat = {k: v for k, v in flatten(dataclasses.asdict(cfg)).items() if k not in NOT_COMPARED}
    flat["model.fingerprint"] = model_fingerprint
    flat["parallel.world_size"] = world_size
    return dict(sorted(flat.items()))


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, recorded value, current value)`` for every compared key that differs; a key absent from
    ``recorded`` (a field added after the file was written) counts as its default."""
    defaults = flatten(dataclasses.asdict(RunConfig()))
    missing = object()
    out = []
    for key in sorted(set(recorded) | set(current)):
        if key in NOT_COMPARED:
            continue
        old = recorded.get(key, defaults.get(key, missing))
        new = current.get(key, missing)
        if old != new:
            out.append((key, None if old is missing else old, None if new is missing else new))
    return out


def has_answers(answers_path: Path) -> bool:
    """True when ``answers_path`` holds at least one complete line."""
    if not answers_path.is_file():
        return False
    with open(answers_path, "rb") as f:
        return any(line.endswith(b"\n") and line.strip() for line in f)


def _new_path_hint(answers_path: Path) -> str:
    base = str(answers_path)[: -len(".jsonl")] if str(answers_path).endswith(".jsonl") else str(answers_path)
    n = 2
    while Path(f"{base}-{n}.jsonl").exists():
        n += 1
    return f"output.path={base}-{n}.jsonl"


def check(answers_path: Path, settings_path: Path, current: dict[str, Any]) -> None:
    """Raise ``SettingsMismatchError`` (one line) unless the answers in ``answers_path`` were made with ``current``.

    A file without answers passes (there is nothing to mix). Reads only; the files are left as they are.
    """
    if not has_answers(answers_path):
        return
    hint = _new_path_hint(answers_path)
    if not settings_path.is_file():
        raise SettingsMismatchError(
            f"{answers_path} holds answers but no record of the settings that made them ({settings_path} is "
            f"missing: the file was written before lp_runtime recorded settings, or by another tool), so a resumed "
            f"run could mix settings; choose a new output path ({hint}) or move the file away")
    try:
        recorded = json.loads(settings_path.read_text(encoding="utf-8"))["settings"]
    except (ValueError, KeyError, TypeError):
        raise SettingsMismatchError(f"{settings_path} is not a settings record written by lp_runtime; "
                                    f"choose a new output path ({hint}) or move both files away") from None
    diffs = differences(recorded, current)
    if diffs:
        listed = "; ".join(f"{k}: {_as_typed(old)} in the file, {_as_typed(new)} now" for k, old, new in diffs)
        raise SettingsMismatchError(
            f"{answers_path} was made with other settings ({settings_path}): {listed}; re-run with the file's "
            f"settings to resume it, or write to a new output path ({hint})")


def write(settings_path: Path, current: dict[str, Any]) -> None:
    """Record ``current`` (atomically: written to a temporary file, then renamed)."""
    settings_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = settings_path.with_name(settings_path.name + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "settings": current}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, settings_path)


def read(settings_path: Path) -> dict[str, Any]:
    """The recorded settings (``{}`` when there is no readable record)."""
    try:
        return json.loads(settings_path.read_text(encoding="utf-8"))["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _as_typed(value) -> str:
    """A setting's value as a user writes it on the command line: true/false/null, numbers, quoted strings."""
    return json.dumps(value) if value is None or isinstance(value, (bool, int, float)) else repr(value)
