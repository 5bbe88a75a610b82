"""Run summaries: the one place where tokens, steps and seconds become S, tokens/s and seconds/step
(docs/design.md section 5). Pure functions over the answers records, so a resumed run's summary covers the file."""
from __future__ import annotations

import dataclasses
import platform
from collections import Counter
from importlib import metadata
from typing import Any, Iterable, Optional


def _ratio(num: float, den: float) -> Optional[float]:
    """``num / den``, or None when ``den`` is 0 (JSON has no NaN)."""
    return num / den if den else None


def rates(new_tokens: float, steps: float, seconds: float, accepted: Optional[float] = None,
          accept_steps: Optional[float] = None) -> dict[str, Optional[float]]:
    """``step_compression`` S = new_tokens / steps (the paper's step compression ratio), ``mean_accepted_tokens``
    = accepted / accept_steps (tokens per step; new_tokens / steps when ``accepted`` is None), ``tokens_per_s``
    and ``seconds_per_step`` (prefill time included, so an upper bound); None where a denominator is 0.

    >>> rates(12, 4, 2.0)["step_compression"], rates(12, 4, 2.0)["tokens_per_s"]
    (3.0, 6.0)
    """
    return {
        "step_compression": _ratio(new_tokens, steps),
        "mean_accepted_tokens": (_ratio(new_tokens, steps) if accepted is None
                                 else _ratio(accepted, accept_steps or 0)),
        "tokens_per_s": _ratio(new_tokens, seconds),
        "seconds_per_step": _ratio(seconds, steps),
    }


def summarize(records: Iterable[dict]) -> dict[str, Any]:
    """Aggregate metrics over all turns of all records: ``num_questions``, ``num_turns``, ``new_tokens``,
    ``decoding_steps`` (forward passes after prefill), ``wall_time`` (s, prefill included), ``rates``' four and
    ``accept_length_histogram`` ({length: steps})."""
    num_questions = num_turns = new_tokens = steps = 0
    wall_time = 0.0
    histogram: Counter[int] = Counter()
    for record in records:
        choice = record["choices"][0]
        num_questions += 1
        num_turns += len(choice["new_tokens"])
        new_tokens += sum(choice["new_tokens"])
        steps += sum(choice["decoding_steps"])
        wall_time += sum(choice["wall_time"])
        for lengths in choice["accept_lengths"]:
            histogram.update(lengths)
    return {"num_questions": num_questions, "num_turns": num_turns, "new_tokens": new_tokens,
            "decoding_steps": steps, "wall_time": wall_time,
            **rates(new_tokens, steps, wall_time, sum(k * n for k, n in histogram.items()), sum(histogram.values())),
            "accept_length_histogram": dict(sorted(histogram.items()))}


def versions() -> dict[str, str]:
    """Versions of python and of the packages that decide the numbers (``"not installed"`` when missing)."""
    out = {"python": platform.python_version()}
    for package in ("torch", "transformers", "lp_runtime"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def run_summary(records: Iterable[dict], config: Any, answers_path: str,
                settings: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """``summarize(records)`` plus the answers file, the resolved config (a dataclass), ``versions()`` and, when
    given, the compared settings (``lp_runtime.answers.run_settings``: flat keys, model fingerprint included)."""
    out = {"answers": answers_path, **summarize(records), "config": dataclasses.asdict(config), "versions": versions()}
    return out if settings is None else {**out, "settings": settings}
