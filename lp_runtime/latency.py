"""The machine's latency curve: seconds of one forward pass of q tokens, cached as a profile per
(``models.model_id_of``, ``device_key``, dtype) for ``policy.CostPolicy`` (docs/benchmarks.md "First-run cost";
``LP_RUNTIME_RETUNE=1`` measures again). Noise only adds time: ``ROUNDS`` interleaved rounds timed in parts under a
budget (``round_parts``; a round-short profile is provisional, measured again at the next start), combined by
``robust_curve`` and measured once more when they disagree; a cached profile is re-checked at start-up (``recheck``)."""
from __future__ import annotations

import functools
import itertools
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from . import blas
from .answers import read_json, write_json
from .bundled import cache_root, check_writable

LATENCY_QS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
CACHE_TOKENS = 200
ROUNDS = 3  # interleaved rounds over all q (robust_curve); REPS passes per q and round, their median
REPS = 2
DIP_MARGIN = 0.05  # robust_curve keeps a dearer smaller q only when every round put it this much above
OUTLIER_RATIO = 1.5  # rounds disagree when a q's slowest round took this many times its fastest
LOADED_RATIO = 3.0  # ... and were timed under load when this many times: robust_curve then trusts no dip
RECHECK_QS = (1, 8)  # what a cached profile is re-timed at on start-up
RECHECK_RATIO = 1.5  # ... and replaced when a q now takes this many times more, or less, than cached
DTYPE_MARGIN = 1.2  # model.dtype=auto keeps float32 unless another dtype's greedy step is this many times faster
MEASURE_BUDGET_S = 60.0  # no part of a round starts after this many seconds of measuring (the first always runs)
PARTS = 3  # a round times its q in this many parts (round_parts), the budget checked before each
VARIANTS = ("dynamic", "static_mask", "compile")
DEFAULT_VARIANT = "static_mask"
PROFILE_VERSION = 5  # 5: keyed by models.model_id_of; re-measured when rounds disagree (4: robust_curve)

Measure = Callable[..., dict]  # measure(qs, reps=, warmup=) -> {q: seconds}


def random_step(vocab: int, q: int, past: int, dtype, device, gen):
    """A timed step's inputs: random ids (1, q) int64, positions past..past+q-1 (1, q), the causal (q, q) float
    mask in ``dtype`` and the kept rows (the last ceil(q/2), int64), on ``device``; ids drawn from ``gen``."""
    import torch

    ids = torch.randint(0, vocab, (1, q), generator=gen).to(device)
    pos = torch.arange(past, past + q, device=device)[None]
    inner = torch.full((q, q), torch.finfo(dtype).min, dtype=dtype, device=device).triu_(1)
    return ids, pos, inner, torch.arange(q - (q + 1) // 2, q, device=device)


def step_latency(step, qs: Sequence[int], *, cache_tokens: int = CACHE_TOKENS, reps: int = 5, warmup: int = 2,
                 dynamic_mask: bool = False, clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Median seconds of one step of q random tokens after a ``cache_tokens``-token prefix, per q in ``qs``, through
    any step with ``step.py``'s methods, after ``warmup`` untimed passes. Timed: building the causal (1, 1, q,
    past + q) float mask as the decoder does (``layout.MaskBuffer``, with ``dynamic_mask`` ``layout.full_mask``),
    the step (logits of the last ceil(q/2) rows) and the device sync; each step is then committed away."""
    import torch

    from .layout import MaskBuffer, full_mask
    from .step import StepInputs

    model, device = step.model, step.device
    vocab = model.config.get_text_config(decoder=True).vocab_size
    gen = torch.Generator().manual_seed(0)
    cache, buffer, curve = step.new_cache(), MaskBuffer(model.dtype, device), {}
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    step.prefill(cache, torch.randint(0, vocab, (cache_tokens,), generator=gen).tolist())
    with torch.inference_mode():
        for q in qs:
            ids, pos, inner, keep = random_step(vocab, q, cache_tokens, model.dtype, device, gen)
            times = []
            for rep in range(warmup + reps):
                sync()
                start = clock()
                mask = None
                if q > 1:
                    mask = full_mask(inner, cache_tokens) if dynamic_mask else buffer.view(inner, cache_tokens)
                step(cache, StepInputs(ids, pos, mask, keep))
                sync()
                if rep >= warmup:
                    times.append(clock() - start)
                step.commit(cache, q, 0)
            curve[q] = statistics.median(times)
    return curve


def measure_latency(model, qs: Sequence[int] = LATENCY_QS, *, cache_tokens: int = CACHE_TOKENS, reps: int = 5,
                    variant: str = DEFAULT_VARIANT, warmup: int = 1,
                    clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """``step_latency`` of the model's eager step (``step.EagerStep``). ``variant``: the mask as the decoder
    builds it, ``dynamic`` (``layout.full_mask``), ``static_mask`` (``layout.MaskBuffer``) or ``compile``
    (``static_mask`` under ``torch.compile(dynamic=True)``). Raises ``ValueError`` for an unknown variant."""
    import torch

    from .step import EagerStep

    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not allowed; use one of {', '.join(VARIANTS)}")
    step = EagerStep(torch.compile(model, dynamic=True) if variant == "compile" else model)
    return step_latency(step, qs, cache_tokens=cache_tokens, reps=reps, warmup=warmup,
                        dynamic_mask=variant == "dynamic", clock=clock)


def round_parts(qs: Sequence[int], buckets: Sequence[int] = ()) -> list[tuple[int, ...]]:
    """``qs`` in the parts ``measure_rounds`` times one by one. A q runs as one shape: the smallest of ``buckets``
    >= q (a captured step's), else q itself. A shape's q share a part, so every round, even one cut short, times a
    shape once for all its q (the captured curve stays a step function). The first part holds the shapes of the
    smallest, the largest and ``RECHECK_QS`` q (a round stopped after it still spans every q), then come the
    others in ``PARTS - 1`` interleaved parts.

    >>> round_parts(LATENCY_QS)
    [(1, 8, 64), (2, 4, 12, 24, 48), (3, 6, 16, 32)]
    >>> round_parts((1, 2, 4, 5, 8), buckets=(1, 4, 8))    # q = 2 runs as bucket 4, q = 5 as bucket 8
    [(1, 5, 8), (2, 4)]
    """
    shape = {q: min((b for b in buckets if b >= q), default=q) for q in sorted(set(qs))}
    ends = {shape[q] for q in shape if q in (min(shape), max(shape), *RECHECK_QS)}
    rest = sorted(set(shape.values()) - ends)
    groups = [ends] + [set(rest[i :: PARTS - 1]) for i in range(PARTS - 1)]
    return [tuple(q for q in shape if shape[q] in g) for g in groups if g]


def measure_rounds(measure: Measure, qs: Sequence[int] = LATENCY_QS, *, budget_s: float = MEASURE_BUDGET_S,
                   first_warmup: int = 1, buckets: Sequence[int] = (),
                   clock: Callable[[], float] = time.monotonic) -> list[dict[int, float]]:
    """Up to ``ROUNDS`` curves over ``qs``, timed part by part (``round_parts``) as ``measure(part, reps=REPS,
    warmup=...)``, warm-up passes in the first round only. No part but the very first starts after ``budget_s``
    seconds of ``clock``, so a busy machine's last round is cut short; the part under way runs past the budget."""
    parts, start, out = round_parts(qs, buckets), clock(), []
    for r, i in itertools.product(range(ROUNDS), range(len(parts))):
        if (r or i) and clock() - start > budget_s:
            break
        times = measure(parts[i], reps=REPS, warmup=first_warmup if r == 0 else 0)
        if i == 0:
            out.append({})
        out[-1].update({int(q): float(t) for q, t in times.items()})
    return out


def robust_curve(rounds: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """One curve from several rounds: per q the fastest round, then lifted to the fastest time of every smaller
    q it does not undercut by more than ``DIP_MARGIN`` in every round (a dip all rounds saw is kept). Rounds more
    than ``LOADED_RATIO`` apart (``disagreement``), or a q more than ``LOADED_RATIO`` times faster than a smaller q
    (no step shape does that; the parts of one round were timed in different spells of load), were timed under
    load, and no dip is trusted: each q takes the fastest time of any q >= it (noise only adds time, and a larger
    step costs at least as much). Raises ``ValueError`` when there is no point.

    >>> robust_curve([{1: 22.0, 8: 21.0}, {1: 30.0, 8: 24.0}])      # q = 8 below q = 1 in one round only
    {1: 22.0, 8: 22.0}
    >>> robust_curve([{3: 75.0, 4: 59.0}, {3: 78.0, 4: 60.0}])      # far below in every round: kept
    {3: 75.0, 4: 59.0}
    >>> robust_curve([{1: 2.2, 2: 0.3, 8: 2.2}, {1: 2.2, 2: 2.1, 8: 2.2}])   # q = 2 7x apart: q = 1 was loaded
    {1: 0.3, 2: 0.3, 8: 2.2}
    >>> robust_curve([{1: 2.43, 12: 2.34, 24: 0.38, 48: 0.74}])   # one round, q = 24 6x under q = 1: loaded
    {1: 0.38, 12: 0.38, 24: 0.38, 48: 0.74}
    """
    if not any(rounds):
        raise ValueError("robust_curve needs at least one round with at least one point")
    times: dict[int, list[float]] = {}
    for r in rounds:
        for q, t in r.items():
            times.setdefault(int(q), []).append(float(t))
    lo = {q: min(ts) for q, ts in times.items()}
    qs = sorted(lo)
    dip = max((max(lo[p] for p in qs[:i]) / lo[q] for i, q in enumerate(qs) if i), default=1.0)
    if max(disagreement(rounds)[1], dip) > LOADED_RATIO:
        return {q: min(t for p, t in lo.items() if p >= q) for q in sorted(lo)}
    hi = {q: max(ts) for q, ts in times.items()}
    out: dict[int, float] = {}
    for q in sorted(times):
        out[q] = max([lo[q]] + [lo[p] for p in out if lo[p] <= hi[q] * (1.0 + DIP_MARGIN)])
    return out


def complete_rounds(rounds: Sequence[Mapping[int, float]]) -> int:
    """How many of ``rounds`` timed every q that any of them timed (the budget cuts a round short: fewer q).

        >>> complete_rounds([{1: 0.1, 8: 0.2}, {1: 0.1, 8: 0.2}, {1: 0.1}])
        2
    """
    full = max(map(len, rounds), default=0)
    return sum(len(r) == full for r in rounds)


def disagreement(rounds: Sequence[Mapping[int, float]]) -> tuple[int, float]:
    """(q, slowest / fastest round at q) where the rounds disagree most; (0, 1.0) for < 2 rounds.

    >>> disagreement([{1: 0.11, 2: 0.70}, {1: 0.10, 2: 0.11}])
    (2, 6.363636363636363)
    """
    worst = (0, 1.0)
    for q in sorted(set().union(*rounds)):
        ts = [r[q] for r in rounds if q in r]
        if len(ts) > 1 and max(ts) / min(ts) > worst[1]:
            worst = (q, max(ts) / min(ts))
    return worst


def dtype_name(model) -> str:
    """``float32`` / ``bfloat16`` / ... of a loaded model."""
    return str(model.dtype).replace("torch.", "")


def cpu_key(threads: int) -> str:
    """``cpu-<threads>t``, and ``-mkl-<mode>`` when MKL runs in a mode other than its default (``blas.mkl_mode``,
    asked of MKL; it changes the curve)."""
    mode = blas.mkl_mode()
    return f"cpu-{threads}t" + (f"-mkl-{mode}" if mode else "")


def device_key(model_or_device) -> str:
    """``cuda:0``, or on a CPU ``cpu_key`` of torch's threads (a torchrun rank runs one), of a model or device."""
    import torch

    device = model_or_device if isinstance(model_or_device, torch.device) else next(model_or_device.parameters()).device
    return cpu_key(torch.get_num_threads()) if device.type == "cpu" else str(device)


def profile_path(model_id: str, device: str, dtype: str, root: Optional[str] = None) -> str:
    """``<cache_root>/tuner/<model_id>__<device>__<dtype>.json`` (unsafe characters replaced by '_')."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model_id}__{device}__{dtype}")
    return os.path.join(root or cache_root(), "tuner", safe + ".json")


def check_profile_folder(path: str) -> None:
    """``ConfigError`` (``bundled.check_writable``) unless the folder of profile ``path`` can be written: checked
    before measuring (up to minutes), not when saving after it."""
    check_writable(os.path.dirname(path), "decoding=auto keeps this machine's latency profiles")


def _fingerprint(variant: str = DEFAULT_VARIANT, qs: Sequence[int] = LATENCY_QS) -> dict[str, Any]:
    return {"version": PROFILE_VERSION, "variant": variant, "qs": list(qs), "cache_tokens": CACHE_TOKENS}


def load_profile(path: str, fingerprint: Optional[dict] = None) -> Optional[dict[str, Any]]:
    """The profile at ``path`` (plus ``reused=True`` and ``path``), or None when absent, unreadable, taken another
    way than ``fingerprint`` (default: the current way), or holding a curve or round (``rounds_s``) that is not
    {q >= 1: finite seconds > 0} (an edited or corrupted file)."""
    saved = read_json(Path(path))
    want = fingerprint or _fingerprint()
    rounds = saved.get("rounds_s", []) if isinstance(saved, dict) else None
    ok = (isinstance(saved, dict) and saved.get("fingerprint") == want and _valid_curve(saved.get("latency_s"))
          and isinstance(rounds, list) and all(map(_valid_curve, rounds)))
    return {**saved, "reused": True, "path": path} if ok else None


def _valid_times(times: Any) -> bool:
    """True when every value of the mapping ``times`` is finite seconds > 0."""
    return all(0 < float(t) < math.inf for t in times.values())


def _valid_curve(points: Any) -> bool:
    try:
        return bool(points) and all(int(q) >= 1 for q in points) and _valid_times(points)
    except (AttributeError, TypeError, ValueError):
        return False


def latency_profile(model_id: str, device: str, dtype: str, *, measure: Callable[[], dict[int, float]],
                    variant: str = DEFAULT_VARIANT, qs: Sequence[int] = LATENCY_QS, root: Optional[str] = None,
                    retune: bool = False) -> dict[str, Any]:
    """The saved profile of (model, device, dtype) when taken the same way, else ``measure()``'s curve, saved
    atomically. Keys: model, device, dtype, fingerprint, ``latency_s`` ({q as str: seconds}), measure_seconds,
    tstamp, reused, path. ``ConfigError`` (``check_profile_folder``) before measuring."""
    path = profile_path(model_id, device, dtype, root)
    fingerprint = _fingerprint(variant, qs)
    saved = None if retune else load_profile(path, fingerprint)
    if saved is not None:
        return saved
    check_profile_folder(path)
    t0 = time.perf_counter()
    curve = {int(k): float(v) for k, v in measure().items()}
    profile = {"model": model_id, "device": device, "dtype": dtype, "fingerprint": fingerprint,
               "latency_s": {str(q): t for q, t in sorted(curve.items())},
               "measure_seconds": time.perf_counter() - t0, "tstamp": time.time()}
    save_profile(path, profile)
    return {**profile, "reused": False, "path": path}


def save_profile(path: str, profile: dict[str, Any]) -> None:
    """Write ``profile`` (minus ``reused``/``path``) to ``path`` atomically."""
    write_json(Path(path), {k: v for k, v in profile.items() if k not in ("reused", "path")}, indent=1)


def curve_of(profile: dict[str, Any]) -> dict[int, float]:
    """{q: seconds} of a profile."""
    return {int(q): float(t) for q, t in profile["latency_s"].items()}


def recheck(curve: Mapping[int, float], measure: Measure) -> tuple[str, str]:
    """Re-time a cached curve at ``RECHECK_QS``: ``("stale", reason)`` when some q now runs ``RECHECK_RATIO`` times
    faster, ``("busy", reason)`` when that much slower (the quieter profile is kept), else ``("ok", "")``."""
    now = measure(tuple(q for q in RECHECK_QS if q in curve), reps=REPS, warmup=1)
    verdict = ("ok", "")
    for q, t in sorted(now.items()):
        reason = f"q={q} now takes {1e3 * t:.1f} ms, cached {1e3 * curve[q]:.1f} ms"
        if t * RECHECK_RATIO < curve[q]:
            return "stale", reason
        if t > RECHECK_RATIO * curve[q] and verdict[0] == "ok":
            verdict = ("busy", reason)
    return verdict


def _measure_robust(measure: Measure, log: Callable[[str], None], budget_s: float,
                    clock: Callable[[], float], qs: Sequence[int] = LATENCY_QS,
                    buckets: Sequence[int] = ()) -> list[dict[int, float]]:
    """``measure_rounds`` at ``qs``, and once more within the budget left when its rounds disagree."""
    start = clock()
    rounds = measure_rounds(measure, qs, budget_s=budget_s, clock=clock, buckets=buckets)
    q, ratio = disagreement(rounds)
    left = budget_s - (clock() - start)
    if ratio > OUTLIER_RATIO and left > 0:
        log(f"the latency rounds disagree (q={q}: slowest {ratio:.1f}x the fastest; the machine was busy?): "
            "measuring once more")
        again = measure_rounds(measure, qs, budget_s=left, clock=clock, first_warmup=0, buckets=buckets)
        rounds = again if disagreement(again)[1] <= OUTLIER_RATIO else rounds + again
    return rounds


def model_profile(model, model_id: str, *, measure: Optional[Measure] = None, retune: Optional[bool] = None,
                  root: Optional[str] = None, log: Callable[[str], None] = print,
                  budget_s: float = MEASURE_BUDGET_S, clock: Callable[[], float] = time.monotonic,
                  qs: Sequence[int] = LATENCY_QS, variant: str = DEFAULT_VARIANT,
                  buckets: Sequence[int] = ()) -> dict[str, Any]:
    """The latency profile of a loaded model under (``model_id``, ``device_key``, dtype), measured on first use
    (rounds kept as ``rounds_s``; fewer than ``ROUNDS`` complete ones: saved ``provisional``) or as ``_why_measure``
    decides. ``measure`` defaults to ``measure_latency``, ``retune`` to ``LP_RUNTIME_RETUNE=1``; ``log`` gets one
    line when it measures. A captured step passes its ``measure``, ``qs``, ``variant`` (which keys its own
    profile) and ``buckets``. ``ConfigError`` (``check_profile_folder``) before measuring."""
    measure = measure or functools.partial(measure_latency, model)
    retune = os.environ.get("LP_RUNTIME_RETUNE") == "1" if retune is None else retune
    device, dtype = device_key(model), dtype_name(model)
    device = device if variant == DEFAULT_VARIANT else f"{device}+{variant}"
    path = profile_path(model_id, device, dtype, root)
    cached = None if retune else load_profile(path, _fingerprint(variant, qs))
    why, earlier = _why_measure(cached, measure, log)
    if why is None:
        return cached
    check_profile_folder(path)
    log(f"measuring this machine's step latency for decoding=auto, {why}: {model_id}, {dtype} on {device}, "
        f"{ROUNDS} rounds x {len(qs)} step sizes in parts, no part started after ~{budget_s:.0f} s (a busy machine "
        f"measures fewer rounds, and the part under way finishes); cached in {path}")
    t0 = clock()
    rounds = earlier + _measure_robust(measure, log, budget_s, clock, qs, buckets)
    profile = latency_profile(model_id, device, dtype, root=root, retune=True, measure=lambda: robust_curve(rounds),
                              variant=variant, qs=qs)
    profile.update(rounds_s=[{str(q): t for q, t in sorted(r.items())} for r in rounds], source="measured",
                   provisional=complete_rounds(rounds) < ROUNDS, measure_seconds=clock() - t0)
    save_profile(path, profile)
    return profile


def _why_measure(cached: Optional[dict], measure: Measure,
                 log: Callable[[str], None]) -> tuple[Optional[str], list[dict[int, float]]]:
    """(why ``model_profile`` measures, None to keep ``cached``; the saved rounds the new ones join). A cached
    profile measured here is measured again when provisional, else ``recheck``-ed: replaced when stale, kept with a
    line to ``log`` when busy. A profile given, not measured, is kept as is."""
    if cached is None:
        return "once", []
    if cached.get("source") != "measured":
        return None, []
    if cached.get("provisional"):
        earlier = [{int(q): float(t) for q, t in r.items()} for r in cached.get("rounds_s", [])]
        return (f"again (its cached profile holds {complete_rounds(earlier)} of {ROUNDS} rounds: the budget stopped "
                "a busy machine; the rounds are kept and more added)"), earlier
    verdict, reason = recheck(curve_of(cached), measure)
    if verdict == "busy":
        log(f"this machine is busier than when its latency profile was measured ({reason}): decoding=auto keeps "
            f"the cached profile ({cached['path']}); LP_RUNTIME_RETUNE=1 measures again")
    if verdict == "stale":
        return f"the cached profile no longer matches this machine ({reason})", []
    return None, []


def _busy_record(model_id: str, device: str, step_s: Mapping[str, float], root: Optional[str]) -> Optional[str]:
    """Why the dtype record ``step_s`` looks timed on a busy machine: a dtype's greedy step in it took
    ``RECHECK_RATIO`` times or more the q = 1 step of that dtype's latency profile, measured here in rounds and
    re-checked on every start; None when no profile says so."""
    for dtype, seconds in sorted(step_s.items()):
        profile = load_profile(profile_path(model_id, device, dtype, root))
        q1 = curve_of(profile).get(1) if profile and profile.get("source") == "measured" else None
        if q1 and seconds > RECHECK_RATIO * q1:
            return (f"its {dtype} step took {1e3 * seconds:.1f} ms, against {1e3 * q1:.1f} ms at q=1 in the latency "
                    "profile measured since")
    return None


DTYPES_TIMED = ("float32", "bfloat16")  # what model.dtype=auto times (models._auto_dtype) and a record holds


def choose_dtype(model_id: str, device: str, timings: Callable[[], Mapping[str, float]], *,
                 root: Optional[str] = None, retune: Optional[bool] = None, log: Callable[[str], None] = print,
                 method: str = "") -> str:
    """``model.dtype=auto``: float32 (exact against transformers' float32 greedy) unless another dtype's greedy
    step is more than ``DTYPE_MARGIN`` times faster. ``timings()`` -> {dtype: seconds} runs once per (model,
    device), cached beside the profiles with ``method``; a record of another method, or holding a time that is not
    finite and > 0 or other dtypes than ``DTYPES_TIMED``, or one that a dtype's latency profile shows was timed on
    a busy machine (``_busy_record``), is timed again. ``log`` gets one line naming the choice. ``ValueError`` for
    no timings;
    ``ConfigError`` before timing when the record's folder cannot be written."""
    retune = os.environ.get("LP_RUNTIME_RETUNE") == "1" if retune is None else retune
    path = profile_path(model_id, device, "dtype-auto", root)
    record = None if retune else read_json(Path(path))
    try:
        saved = {str(k): float(v) for k, v in record["step_s"].items()} if record.get("method", "") == method else None
    except (ValueError, KeyError, TypeError, AttributeError):
        saved = None
    if saved and (not _valid_times(saved) or sorted(saved) != sorted(DTYPES_TIMED)):
        saved = None  # NaN, inf, 0, negative, a dtype missing or another one: an edited or corrupted record
    busy = _busy_record(model_id, device, saved, root) if saved else None
    if busy:
        log(f"model.dtype=auto: its cached timings look taken on a busy machine ({busy}): timing the dtypes again")
        saved = None
    if not saved:
        check_writable(os.path.dirname(path), "model.dtype=auto keeps this machine's dtype timings")
    step_s = saved or {str(k): float(v) for k, v in timings().items()}
    if not step_s:
        raise ValueError("choose_dtype: timings() measured no dtype")
    if not saved:  # an empty record ({"step_s": {}}) too: it was timed again on every start, never saved
        save_profile(path, {"model": model_id, "device": device, "step_s": step_s, "method": method,
                            "tstamp": time.time()})
    fastest = min(step_s, key=lambda d: (step_s[d], d))
    exact = step_s.get("float32")  # float32 output equals transformers' float32 greedy: kept unless clearly slower
    best = "float32" if exact is not None and exact <= step_s[fastest] * DTYPE_MARGIN else fastest
    others = ", ".join(f"{1e3 * t:.1f} ms in {d}" for d, t in step_s.items() if d != best)
    why = "the fastest" if best == fastest else f"within {DTYPE_MARGIN:.2f}x of the fastest, and exact"
    log(f"model.dtype=auto: {best}, whose greedy step is {why} on {device} ({1e3 * step_s[best]:.1f} ms "
        f"against {others}; {'cached in' if saved else 'measured now, cached in'} {path})")
    return best
