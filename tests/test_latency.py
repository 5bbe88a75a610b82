"""The latency curve and its cached profile (lp_runtime.latency): measured in bounded, interleaved rounds,
re-measured when rounds disagree, re-checked on reuse; model.dtype=auto by measured greedy steps. Every timing is
injected (a fake ``measure`` or clock): nothing here depends on how fast this machine is."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from lp_runtime import latency, models
from lp_runtime.config import ConfigError, ModelConfig
from lp_runtime.layout import LayoutCache, MaskBuffer, full_mask
from fakes import llama

BFLOAT16 = {1: 21.9, 2: 21.5, 3: 21.0, 4: 22.1, 8: 24.4, 16: 28.0, 32: 36.8, 64: 52.6}


@pytest.fixture(scope="module")
def tiny_llama():
    return llama(bos_token_id=1, eos_token_id=2)


class Rounds:
    """A fake ``measure(qs, reps=, warmup=)``: a call holding q = 1 (a round's first part, ``round_parts``, or the
    start-up re-check) takes the next of ``curves`` (the last repeats), a round's other parts the same one; every
    call recorded in ``calls``, those holding q = 1 in ``starts``."""

    def __init__(self, *curves):
        self.curves, self.calls, self.starts = list(curves), [], []

    def __call__(self, qs, reps, warmup):
        self.calls.append((tuple(qs), reps, warmup))
        if 1 in qs:
            self.starts.append(self.calls[-1])
        curve = self.curves[min(max(len(self.starts), 1), len(self.curves)) - 1]
        return {q: curve[q] for q in qs if q in curve}


# ------------------------------------------------------------------------------------------ measuring

def test_measure_latency_times_each_variant_with_the_clock_given(tiny_llama):
    for variant in ("dynamic", "static_mask"):
        ticks = itertools.count()  # every timed pass takes exactly one tick
        curve = latency.measure_latency(tiny_llama, (1, 3), cache_tokens=8, reps=3, variant=variant,
                                        clock=lambda: next(ticks))
        assert curve == {1: 1, 3: 1}
    with pytest.raises(ValueError, match="variant='static' is not allowed; use one of dynamic, static_mask, compile"):
        latency.measure_latency(tiny_llama, (1,), variant="static")


def test_measure_rounds_stops_within_a_round_after_the_budget():
    """A busy machine (50 s a part; the fresh-clone demo of 2026-12-02 took 259 s for one round of 12 q under a
    60 s budget): the first round stops after two of its parts, whose q still span 1..64; nothing more starts."""
    now, calls = [0.0], []

    def busy(qs, reps, warmup):
        calls.append(qs)
        now[0] += 50.0
        return {q: 0.001 * q for q in qs}

    rounds = latency.measure_rounds(busy, latency.LATENCY_QS, budget_s=60.0, clock=lambda: now[0])
    assert calls == [(1, 8, 64), (2, 4, 12, 24, 48)] and now[0] == 100.0
    assert rounds == [{q: 0.001 * q for q in (1, 8, 64, 2, 4, 12, 24, 48)}]
    # a captured step's buckets (1, 4, 8): q = 2 runs as bucket 4 and q = 5 as bucket 8, each timed in one part
    now[0], calls[:] = 0.0, []
    rounds = latency.measure_rounds(busy, (1, 2, 4, 5, 8), buckets=(1, 4, 8), budget_s=60.0, clock=lambda: now[0])
    assert calls == [(1, 5, 8), (2, 4)] and len(rounds) == 1
    assert latency.round_parts((1, 2, 3, 4, 5, 8, 9, 16), buckets=(1, 2, 4, 8, 16)) == [(1, 5, 8, 9, 16), (2,),
                                                                                         (3, 4)]


def test_measure_rounds_stops_starting_rounds_after_the_budget():
    measure, now = Rounds({1: 0.1}), [0.0]

    def slow(qs, reps, warmup):  # each round takes 40 s of the fake clock
        now[0] += 40.0
        return measure(qs, reps=reps, warmup=warmup)

    assert len(latency.measure_rounds(slow, (1,), budget_s=60.0, clock=lambda: now[0])) == 2  # 0 s, 40 s; not 80
    assert [c[2] for c in measure.calls] == [1, 0]  # warm-up passes in the first round only
    now[0] = 0.0
    assert len(latency.measure_rounds(slow, (1,), budget_s=1000.0, clock=lambda: now[0])) == latency.ROUNDS
    now[0] = 0.0
    assert len(latency.measure_rounds(slow, (1,), budget_s=0.0, clock=lambda: now[0])) == 1  # the first always


def _monotone(curve):
    ts = [curve[q] for q in sorted(curve)]
    return all(a <= b for a, b in zip(ts, ts[1:]))


def test_robust_curve_lifts_noise_and_keeps_a_dip_every_round_saw():
    import random

    rng = random.Random(0)
    true = {q: t / 1e3 for q, t in BFLOAT16.items()}
    true = {q: max(t for p, t in true.items() if p <= q) for q in true}  # a monotone truth
    for trial in range(100):
        spells = [1 + rng.uniform(0, 0.5) for _ in range(3)]  # a slow spell per round, jitter per pass
        rounds = [{q: t * f * (1 + rng.uniform(0, 0.05)) for q, t in true.items()} for f in spells]
        rounds[trial % 3][1] *= 1.6  # once a spike at q = 1
        out = latency.robust_curve(rounds)
        assert _monotone(out), (trial, out)
        for q, t in out.items():  # never below the truth, never above the slowest round
            assert true[q] <= t <= max(r[q] for r in rounds) * 1.05, (trial, q)
    f32 = [{1: 38.5, 2: 61.8, 3: 75.8, 4: 58.9, 8: 59.2, 16: 70.6},
           {1: 40.0, 2: 63.0, 3: 77.0, 4: 60.0, 8: 59.9, 16: 71.0}]
    assert latency.robust_curve(f32) == {1: 38.5, 2: 61.8, 3: 75.8, 4: 61.8, 8: 61.8, 16: 70.6}
    assert latency.robust_curve([{1: 2.0, 8: 1.0}]) == {1: 2.0, 8: 1.0}  # one round, a far dip: kept
    assert latency.robust_curve([{1: 2.0}, {8: 1.95, 1: 3.0}]) == {1: 2.0, 8: 2.0}  # within 5%: lifted
    with pytest.raises(ValueError, match="at least one round"):
        latency.robust_curve([])


def test_rounds_that_disagree_trust_no_dip():
    """A new user's first start under load (2026-12-03): parts timed in a loaded spell in both rounds made q = 1, 8
    and 32 dearer than q = 2 and 12 (2188 ms against 295 and 478 ms); the lift carried 2188 ms to every q, a flat
    curve, and decoding=auto expected 6.00x at W = 7 (the next start measured 64 ms at q = 1, 112 ms at q = 8)."""
    loaded = [{1: 2.188, 2: 0.295, 8: 2.188, 12: 0.478, 32: 1.999, 64: 2.188},
              {1: 2.190, 2: 2.050, 8: 2.200, 12: 2.100, 32: 2.010, 64: 2.190}]
    assert latency.disagreement(loaded)[1] > latency.LOADED_RATIO
    assert latency.robust_curve(loaded) == {1: 0.295, 2: 0.295, 8: 0.478, 12: 0.478, 32: 1.999, 64: 2.188}


def test_one_round_with_a_step_far_faster_than_a_smaller_one_trusts_no_dip():
    """A new user's first make demo under load (2026-12-03, session 16): one round, its parts timed in different
    spells, put q = 24 at 0.38 s under q = 1's 2.43 s (a greedy step took 35.6 ms a minute before); kept as a dip,
    decoding=auto expected 11.10x. No step shape is 3x faster than a smaller one: the round was loaded."""
    one = [{1: 2.43, 2: 2.40, 8: 2.38, 12: 2.34, 24: 0.38, 48: 0.74, 64: 8.45}]
    assert latency.robust_curve(one) == {1: 0.38, 2: 0.38, 8: 0.38, 12: 0.38, 24: 0.38, 48: 0.74, 64: 8.45}
    fast = [{1: 2.43, 24: 2.43 / latency.LOADED_RATIO * 1.01}]  # a dip just within the ratio: kept
    assert latency.robust_curve(fast) == fast[0]


def test_disagreement_names_the_worst_q():
    assert latency.disagreement([{1: 0.11, 2: 0.70}, {1: 0.10, 2: 0.11}]) == (2, pytest.approx(0.70 / 0.11))
    assert latency.disagreement([{1: 0.10, 2: 0.11}, {1: 0.12, 2: 0.12}]) == (1, pytest.approx(1.2))
    assert latency.disagreement([{1: 0.1}]) == (0, 1.0)


# ------------------------------------------------------------------------------------------ the profile

def test_profile_saved_and_reused(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return {1: 0.03, 4: 0.04}

    kw = dict(measure=measure, root=str(tmp_path))
    p1 = latency.latency_profile("m/x", "cpu", "float32", **kw)
    path = latency.profile_path("m/x", "cpu", "float32", str(tmp_path))
    assert p1["path"] == path and path == str(tmp_path / "tuner" / "m_x__cpu__float32.json") and not p1["reused"]
    p2 = latency.latency_profile("m/x", "cpu", "float32", **kw)
    assert p2["reused"] is True and len(calls) == 1 and latency.curve_of(p2) == {1: 0.03, 4: 0.04}
    saved = json.loads(Path(path).read_text())
    assert saved["latency_s"] == {"1": 0.03, "4": 0.04} and saved["fingerprint"]["variant"] == "static_mask"
    assert "reused" not in saved and "path" not in saved
    for args, extra in ((("m/x", "cpu", "bfloat16"), {}), (("m/x", "cuda:0", "float32"), {}),
                        (("m/x", "cpu", "float32"), {"variant": "dynamic"}), (("m/x", "cpu", "float32"), {"retune": True})):
        latency.latency_profile(*args, **extra, **kw)  # another dtype, device or variant, or retune: measured
    assert len(calls) == 5
    # a cached curve edited into values no curve has (a new user: a traceback in the job, exit 1): measured again
    for bad in ({"1": -1.0, "4": 0.04}, {"1": 0.03, "8": 0.0}, {"1": "fast"}, {"0": 0.03}, ["x"]):
        Path(path).write_text(json.dumps({**saved, "latency_s": bad}))
        assert latency.latency_profile("m/x", "cpu", "float32", **kw)["reused"] is False
    assert len(calls) == 10
    # ... or corrupted into times no step takes: NaN, inf (JSON's NaN, Infinity, or as strings) are measured again
    for bad in ({"1": float("nan"), "4": 0.04}, {"1": 0.03, "4": float("inf")}, {"1": "-inf"}, {"1": "nan"}):
        Path(path).write_text(json.dumps({**saved, "latency_s": bad}))
        assert latency.load_profile(path, saved["fingerprint"]) is None
        assert latency.latency_profile("m/x", "cpu", "float32", **kw)["reused"] is False
    assert len(calls) == 14 and latency.load_profile(path, saved["fingerprint"])["latency_s"] == saved["latency_s"]


def test_model_profile_measures_once_says_so_and_keeps_the_rounds(tiny_llama, tmp_path):
    noisy = Rounds({1: 0.030, 8: 0.020}, {1: 0.021, 8: 0.022}, {1: 0.022, 8: 0.021}, {1: 0.021, 8: 0.021})
    lines = []
    p = latency.model_profile(tiny_llama, "tiny-1234abcd", measure=noisy, root=str(tmp_path), retune=False,
                              log=lines.append)
    assert [c[2] for c in noisy.starts] == [1, 0, 0] and {c[1] for c in noisy.calls} == {latency.REPS}
    assert [c[0] for c in noisy.calls] == [(1, 8, 64), (2, 4, 12, 24, 48), (3, 6, 16, 32)] * 3  # round_parts
    assert latency.curve_of(p) == {1: 0.021, 8: 0.021}  # fastest round per q, then monotone
    device = latency.cpu_key(torch.get_num_threads())  # cpu-2t, or cpu-2t-mkl-auto on an AMD CPU (blas.py)
    assert lines == [f"measuring this machine's step latency for decoding=auto, once: tiny-1234abcd, float32 on "
                     f"{device}, 3 rounds x 12 step sizes in parts, no part started after ~60 s (a busy machine measures "
                     f"fewer rounds, and the part under way finishes); cached in {p['path']}"]
    assert p["path"].endswith(f"tiny-1234abcd__{device}__float32.json")
    saved = json.loads(Path(p["path"]).read_text())
    assert saved["rounds_s"] == [{"1": 0.030, "8": 0.020}, {"1": 0.021, "8": 0.022}, {"1": 0.022, "8": 0.021}]
    # reused: re-checked at q = 1 and 8 only (within 1.5x of the cached 21 ms), nothing said
    again = latency.model_profile(tiny_llama, "tiny-1234abcd", measure=noisy, root=str(tmp_path), log=lines.append)
    assert again["reused"] and noisy.calls[9] == ((1, 8), latency.REPS, 1) and len(noisy.calls) == 10
    assert len(lines) == 1


def test_rounds_that_disagree_are_measured_again(tiny_llama, tmp_path):
    # round 1 measured q = 8 at 0.70 s against 0.11 s next (another process held the cores), then quiet rounds
    busy = Rounds({1: 0.10, 8: 0.70}, {1: 0.10, 8: 0.11}, {1: 0.10, 8: 0.11}, {1: 0.10, 8: 0.11})
    lines = []
    p = latency.model_profile(tiny_llama, "m-1", measure=busy, root=str(tmp_path), retune=True, log=lines.append)
    assert lines[1] == ("the latency rounds disagree (q=8: slowest 6.4x the fastest; the machine was busy?): "
                        "measuring once more")
    assert len(busy.starts) == 6 and [c[2] for c in busy.starts[3:]] == [0, 0, 0]
    assert p["rounds_s"] == [{"1": 0.10, "8": 0.11}] * 3  # the agreeing re-measurement replaces them
    # a second input of the kind: the re-measurement disagrees too -> every round kept, fastest per q
    busy = Rounds({1: 0.10, 8: 0.70}, {1: 0.10, 8: 0.11}, {1: 0.10, 8: 0.11},
                  {1: 0.30, 8: 0.11}, {1: 0.10, 8: 0.11}, {1: 0.10, 8: 0.11})
    p = latency.model_profile(tiny_llama, "m-2", measure=busy, root=str(tmp_path), retune=True, log=lines.append)
    assert len(p["rounds_s"]) == 6 and latency.curve_of(p) == {1: 0.10, 8: 0.11}
    # no time left in the budget: no second measurement, the rounds kept as they are
    now = [0.0]

    def slow(qs, reps, warmup):  # 40 s a round (of 3 parts) on the fake clock
        now[0] += 40.0 / 3
        return busy(qs, reps=reps, warmup=warmup)

    busy = Rounds({1: 0.10, 8: 0.70}, {1: 0.10, 8: 0.11}, {1: 0.10, 8: 0.11})
    p = latency.model_profile(tiny_llama, "m-5", measure=slow, root=str(tmp_path), retune=True, log=lines.append,
                              clock=lambda: now[0])  # round 2's parts at 40 and 53 s, none at 67 s; nothing left
    assert len(busy.calls) == 5 and len(p["rounds_s"]) == 2 and latency.curve_of(p) == {1: 0.10, 8: 0.11}
    assert p["measure_seconds"] == pytest.approx(200 / 3) and lines[-1].startswith("measuring this machine")


def test_a_profile_the_budget_cut_short_is_provisional_and_measured_again_at_the_next_start(tiny_llama, tmp_path):
    """One round on a busy machine (50 s a part: the budget stops it after two parts) keeps its dips, which only
    other rounds can lift: the profile is saved provisional, and the next start measures again, joining its
    rounds to the saved one, until the profile holds ``ROUNDS`` rounds."""
    now, busy = [0.0], Rounds({1: 0.10, 8: 0.05})  # q = 8 below q = 1: a dip one busy round saw

    def slow(qs, reps, warmup):
        now[0] += 50.0
        return busy(qs, reps=reps, warmup=warmup)

    p = latency.model_profile(tiny_llama, "m-6", measure=slow, root=str(tmp_path), retune=True,
                              log=lambda _: None, clock=lambda: now[0])
    assert p["provisional"] and p["rounds_s"] == [{"1": 0.10, "8": 0.05}] and latency.curve_of(p) == {1: 0.10, 8: 0.05}
    quiet, lines = Rounds({1: 0.10, 8: 0.11}), []
    again = latency.model_profile(tiny_llama, "m-6", measure=quiet, root=str(tmp_path), log=lines.append)
    assert not again["reused"] and not again["provisional"] and quiet.calls[0][0] == (1, 8, 64)  # no re-check
    assert again["rounds_s"] == [{"1": 0.10, "8": 0.05}] + [{"1": 0.10, "8": 0.11}] * 3
    assert latency.curve_of(again) == {1: 0.10, 8: 0.10}  # the dip lifted: the quiet rounds did not see it
    assert lines == [f"measuring this machine's step latency for decoding=auto, again (its cached profile holds 1 "
                     f"of 3 rounds: the budget stopped a busy machine; the rounds are kept and more added): m-6, "
                     f"float32 on {latency.device_key(tiny_llama)}, 3 rounds x 12 step sizes in parts, no part "
                     f"started after ~60 s (a busy machine measures fewer rounds, and the part under way finishes); "
                     f"cached in {p['path']}"]
    third = latency.model_profile(tiny_llama, "m-6", measure=quiet, root=str(tmp_path), log=lines.append)
    assert third["reused"] and quiet.calls[-1] == ((1, 8), latency.REPS, 1) and len(lines) == 1  # re-checked only


def test_a_provisional_profile_with_a_corrupted_round_is_measured_afresh(tiny_llama, tmp_path):
    """A saved round holding NaN, inf, 0 or a negative time would join the new rounds (``robust_curve`` takes the
    fastest): the profile is not used, and measured again from nothing, with no re-check."""
    now, busy = [0.0], Rounds({1: 0.10, 8: 0.11})

    def slow(qs, reps, warmup):  # 50 s a part: one round, cut short, provisional
        now[0] += 50.0
        return busy(qs, reps=reps, warmup=warmup)

    p = latency.model_profile(tiny_llama, "m-9", measure=slow, root=str(tmp_path), retune=True,
                              log=lambda _: None, clock=lambda: now[0])
    assert p["provisional"]
    saved = json.loads(Path(p["path"]).read_text())
    for bad in (float("nan"), float("inf"), 0.0, -0.01):
        Path(p["path"]).write_text(json.dumps({**saved, "rounds_s": [{"1": 0.10, "8": bad}]}))
        quiet, lines = Rounds({1: 0.12, 8: 0.13}), []
        again = latency.model_profile(tiny_llama, "m-9", measure=quiet, root=str(tmp_path), log=lines.append)
        assert lines[0].startswith("measuring this machine's step latency for decoding=auto, once: m-9, ")
        assert again["rounds_s"] == [{"1": 0.12, "8": 0.13}] * 3 and latency.curve_of(again) == {1: 0.12, 8: 0.13}


def test_a_cached_profile_that_no_longer_matches_the_machine_is_replaced(tiny_llama, tmp_path):
    slow = Rounds({1: 0.70, 8: 0.80})  # measured while another process held the cores
    latency.model_profile(tiny_llama, "m-3", measure=slow, root=str(tmp_path), retune=True, log=lambda _: None)
    quiet, lines = Rounds({1: 0.11, 8: 0.12}), []
    p = latency.model_profile(tiny_llama, "m-3", measure=quiet, root=str(tmp_path), log=lines.append)
    assert quiet.calls[0] == ((1, 8), latency.REPS, 1) and not p["reused"]
    assert lines[0].startswith("measuring this machine's step latency for decoding=auto, the cached profile no "
                               "longer matches this machine (q=1 now takes 110.0 ms, cached 700.0 ms): m-3, ")
    assert latency.curve_of(p) == {1: 0.11, 8: 0.12}
    # a profile given rather than measured here (a script's, a test's) is kept without a re-check
    latency.latency_profile("m-4", latency.device_key(tiny_llama), "float32", measure=lambda: {1: 9.0},
                            root=str(tmp_path))
    never = Rounds()
    assert latency.model_profile(tiny_llama, "m-4", measure=never, root=str(tmp_path))["reused"] and not never.calls


def test_a_quiet_profile_is_kept_when_the_machine_is_busy_now(tiny_llama, tmp_path):
    latency.model_profile(tiny_llama, "m-5", measure=Rounds({1: 0.11, 8: 0.12}), root=str(tmp_path), retune=True,
                          log=lambda _: None)
    busy, lines = Rounds({1: 0.70, 8: 0.80}), []  # another process holds the cores now: only the re-check runs
    p = latency.model_profile(tiny_llama, "m-5", measure=busy, root=str(tmp_path), log=lines.append)
    assert busy.calls == [((1, 8), latency.REPS, 1)] and p["reused"] and latency.curve_of(p) == {1: 0.11, 8: 0.12}
    assert lines == [f"this machine is busier than when its latency profile was measured (q=1 now takes 700.0 ms, "
                     f"cached 110.0 ms): decoding=auto keeps the cached profile ({p['path']}); LP_RUNTIME_RETUNE=1 "
                     "measures again"]


def test_an_unwritable_cache_folder_is_refused_before_measuring(tiny_llama):
    """LP_RUNTIME_CACHE=/proc/... measured the curve for minutes, then saving it raised a raw OSError (a new user):
    one ConfigError naming the folder, the reason and the way out, and nothing measured. /proc takes no new folder
    or file, even for root."""
    root = "/proc/lp-runtime-test"
    want = (f"the cache folder {root}/tuner, where decoding=auto keeps this machine's latency profiles, cannot be "
            f"written (cannot make {root}: No such file or directory); set LP_RUNTIME_CACHE to a writable folder")
    never = Rounds()
    for call in (lambda: latency.model_profile(tiny_llama, "m-8", measure=never, root=root, log=pytest.fail),
                 lambda: latency.latency_profile("m-8", "cpu", "float32", measure=pytest.fail, root=root)):
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value) == want
    assert never.calls == []
    with pytest.raises(ConfigError) as e:
        latency.choose_dtype("m-8", "cpu-2t", lambda: pytest.fail("timed"), root=root, log=pytest.fail)
    assert str(e.value) == want.replace("decoding=auto keeps this machine's latency profiles",
                                        "model.dtype=auto keeps this machine's dtype timings")
    with pytest.raises(ConfigError) as e:  # the folder is there, but takes no file
        latency.check_profile_folder("/proc/m-8.json")
    assert str(e.value) == ("the cache folder /proc, where decoding=auto keeps this machine's latency profiles, "
                            "cannot be written (cannot create a file in it: No such file or directory); set "
                            "LP_RUNTIME_CACHE to a writable folder")


# ------------------------------------------------------------------------------------------ model.dtype=auto

def test_choose_dtype_takes_the_faster_greedy_step_and_says_why(tmp_path):
    lines, calls = [], []

    def timings():
        calls.append(1)
        return {"float32": 0.0122 * 1.53, "bfloat16": 0.0122}  # bfloat16 1.53x faster (an AVX2-only EPYC)

    kw = dict(root=str(tmp_path), log=lines.append)
    assert latency.choose_dtype("m-1", "cpu-16t", timings, **kw) == "bfloat16"
    path = str(tmp_path / "tuner" / "m-1__cpu-16t__dtype-auto.json")
    assert lines == [f"model.dtype=auto: bfloat16, whose greedy step is the fastest on cpu-16t (12.2 ms against "
                     f"18.7 ms in float32; measured now, cached in {path})"]
    assert latency.choose_dtype("m-1", "cpu-16t", timings, **kw) == "bfloat16" and len(calls) == 1
    assert lines[1].endswith(f"18.7 ms in float32; cached in {path})")
    # a record of another measurement method (one round, before interleaving: a new user's 1918.7 ms record was
    # trusted for good) is measured again, and the new record replaces it
    assert latency.choose_dtype("m-1", "cpu-16t", timings, method="interleaved-3", **kw) == "bfloat16"
    assert len(calls) == 2 and lines.pop().endswith(f"measured now, cached in {path})")
    assert latency.choose_dtype("m-1", "cpu-16t", timings, method="interleaved-3", **kw) == "bfloat16"
    assert len(calls) == 2 and lines.pop().endswith(f"18.7 ms in float32; cached in {path})")
    # the other way round (a CPU that only emulates bfloat16)
    assert latency.choose_dtype("m-1", "cpu-2t", lambda: {"float32": 0.038, "bfloat16": 0.066}, **kw) == "float32"
    assert lines[2].startswith("model.dtype=auto: float32, whose greedy step is the fastest on cpu-2t (38.0 ms "
                               "against 66.0 ms in bfloat16;")
    # bfloat16 faster, but by less than DTYPE_MARGIN: float32, whose output is exact
    assert latency.choose_dtype("m-1", "cpu-4t", lambda: {"float32": 0.0110, "bfloat16": 0.0100}, **kw) == "float32"
    assert lines[3].startswith("model.dtype=auto: float32, whose greedy step is within 1.20x of the fastest, and "
                               "exact on cpu-4t (11.0 ms against 10.0 ms in bfloat16;")
    # a record corrupted into times no step takes (NaN, inf, 0, negative) is timed again, not chosen from
    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        Path(path).write_text(json.dumps({"step_s": {"float32": 0.0187, "bfloat16": bad}, "method": ""}))
        assert latency.choose_dtype("m-1", "cpu-16t", timings, **kw) == "bfloat16"
        assert lines.pop().endswith(f"18.7 ms in float32; measured now, cached in {path})")
    assert len(calls) == 6
    # a record edited to hold one dtype, or another (int8 was then refused as a model.dtype the user never gave,
    # float16 loaded on a CPU; a new user, 2026-12-05), is timed again
    for edited in ({"float32": 0.05}, {"float32": 0.0187, "bfloat16": 0.0122, "int8": 0.001},
                   {"float32": 0.0187, "float16": 0.001}):
        Path(path).write_text(json.dumps({"step_s": edited, "method": ""}))
        assert latency.choose_dtype("m-1", "cpu-16t", timings, **kw) == "bfloat16"
        assert lines.pop().endswith(f"18.7 ms in float32; measured now, cached in {path})")
    assert len(calls) == 9
    # a record holding no timings was timed again on every start and never saved (a review, 2026-12-05)
    Path(path).write_text(json.dumps({"step_s": {}, "method": ""}))
    assert latency.choose_dtype("m-1", "cpu-16t", timings, **kw) == "bfloat16"
    assert lines.pop().endswith(f"measured now, cached in {path})") and len(calls) == 10
    assert latency.choose_dtype("m-1", "cpu-16t", timings, **kw) == "bfloat16"
    assert lines.pop().endswith(f"18.7 ms in float32; cached in {path})") and len(calls) == 10


@pytest.mark.parametrize("faster", ["bfloat16", "float32"])
def test_dtype_auto_loads_the_measured_faster_dtype(tiny_model_dir, tmp_path, monkeypatch, capsys, faster):
    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    seen = []

    def step_seconds(model):  # the injected timing: the dtype named `faster` takes 10 ms, the other 20 ms
        seen.append(model.dtype)
        return 0.010 if model.dtype == getattr(torch, faster) else 0.020

    model, _ = models.load_model(ModelConfig(path=str(tiny_model_dir), device="cpu", dtype="auto"),
                                 step_seconds=step_seconds)
    assert model.dtype == getattr(torch, faster)  # then loaded again in it
    assert seen == [torch.float32, torch.bfloat16] * models.DTYPE_ROUNDS  # interleaved rounds
    assert capsys.readouterr().out.startswith(f"model.dtype=auto: {faster}, whose greedy step is the fastest on cpu-")
    assert latency.dtype_name(model) == faster
    with pytest.raises(ConfigError, match="model.dtype='auto' has no torch dtype here; use float32, bfloat16 or"):
        models.resolve_dtype("auto")


def test_dtype_auto_is_not_decided_by_a_burst_of_load(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A dtype timed once during a burst of load (a new user saw 1918.7 ms cached for a 34 ms step) decided for
    good: the dtypes are timed in turn, DTYPE_ROUNDS times, and the fastest time of each is kept."""
    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    times = iter([2.000, 0.020, 0.010, 0.020, 0.010, 0.020])  # float32's first round ran under load

    model, _ = models.load_model(ModelConfig(path=str(tiny_model_dir), device="cpu", dtype="auto"),
                                 step_seconds=lambda m: next(times))
    out = capsys.readouterr().out
    assert model.dtype == torch.float32 and next(times, None) is None  # three rounds of two timings
    assert out.startswith("model.dtype=auto: float32, whose greedy step is the fastest on cpu-")
    assert "(10.0 ms against 20.0 ms in bfloat16;" in out


# ------------------------------------------------------------------------------------------ the mask the timing uses

def test_mask_buffer_equals_full_mask_in_values_and_logits(tiny_llama):
    from lp_runtime.kv import new_cache

    layouts = LayoutCache(torch.device("cpu"), torch.float32)
    buf = MaskBuffer(torch.float32, "cpu", rows=4, cols=8)  # small: the steps below make it grow
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for past, shape in ((5, (2, [1, 2], 1, [-1, 0, -1])), (9, (1, [], 0, [-1, 0])),
                            (30, (2, [1, 2], 1, [-1, 0, 0, 1])), (31, (1, [1], 1, []))):
            lay, depth, inner, _ = layouts.get(*shape)
            view = buf.view(inner, past)
            assert torch.equal(view, full_mask(inner, past)), (past, shape)  # old blocks were cleared
            ids = torch.randint(0, 96, (1, past), generator=gen)
            step = torch.randint(0, 96, (1, lay.num_tokens), generator=gen)
            logits = []
            for mask in (full_mask(inner, past), view):
                cache = new_cache()
                tiny_llama(input_ids=ids, past_key_values=cache, use_cache=True)
                logits.append(tiny_llama(input_ids=step, position_ids=(depth + past)[None], attention_mask=mask,
                                         past_key_values=cache, use_cache=True).logits)
            assert torch.equal(logits[0], logits[1])
    assert buf.buf.shape[2] >= 7 and buf.buf.shape[3] >= 37


def test_dtype_auto_takes_bfloat16_unmeasured_when_only_it_fits(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    cfg = ModelConfig(path=str(tiny_model_dir), device="cpu", dtype="auto")
    params = models.weight_bytes(cfg, "float32")[0]
    model, _ = models.load_model(cfg, free_bytes=3 * params, step_seconds=lambda m: pytest.fail("measured"))
    assert model.dtype == torch.bfloat16
    assert capsys.readouterr().out == "model.dtype=auto: bfloat16, since the float32 weights would not fit\n"


def test_a_round_the_budget_cut_short_does_not_count_as_a_round(tiny_llama, tmp_path):
    """9 s a part, 3 parts a round: parts start at 0, 9, ..., 54 s and none after the ~60 s budget, so the third
    round times only its first part. Two complete rounds of three: the profile stays provisional, and the next
    start says it holds 2 of 3 rounds."""
    now, busy = [0.0], Rounds({q: 0.10 for q in latency.LATENCY_QS})

    def slow(qs, reps, warmup):
        now[0] += 9.0
        return busy(qs, reps=reps, warmup=warmup)

    p = latency.model_profile(tiny_llama, "m-7", measure=slow, root=str(tmp_path), retune=True,
                              log=lambda _: None, clock=lambda: now[0])
    assert len(busy.calls) == 7 and len(p["rounds_s"]) == 3 and len(p["rounds_s"][2]) < len(latency.LATENCY_QS)
    assert p["provisional"] and latency.complete_rounds(p["rounds_s"]) == 2
    lines = []
    latency.model_profile(tiny_llama, "m-7", measure=Rounds({q: 0.10 for q in latency.LATENCY_QS}),
                          root=str(tmp_path), log=lines.append)
    assert lines[0].startswith("measuring this machine's step latency for decoding=auto, again (its cached profile "
                               "holds 2 of 3 rounds")


def test_choose_dtype_times_again_a_record_taken_on_a_busy_machine(tmp_path):
    """A new user's first run timed float32 and bfloat16 under load (229.7 / 206.4 ms: float32, within 1.2x) and
    every later run kept float32, though the float32 latency profile measured since gave 60 ms at q=1 and, timed
    quietly, bfloat16 took 36.5 ms against 59.3 (2026-12-04): the record is timed again when a dtype's profile
    shows it took RECHECK_RATIO x its step."""
    lines, calls = [], []
    kw = dict(root=str(tmp_path), log=lines.append)
    busy = {"float32": 0.2297, "bfloat16": 0.2064}
    assert latency.choose_dtype("m-1", "cpu-2t", lambda: busy, **kw) == "float32"
    # no profile yet: the record stands
    assert latency.choose_dtype("m-1", "cpu-2t", lambda: pytest.fail("timed"), **kw) == "float32"
    latency.latency_profile("m-1", "cpu-2t", "float32", root=str(tmp_path), measure=lambda: {1: 0.060, 8: 0.065})
    given = latency.load_profile(latency.profile_path("m-1", "cpu-2t", "float32", str(tmp_path)))
    assert latency.choose_dtype("m-1", "cpu-2t", lambda: pytest.fail("timed"), **kw) == "float32"  # given, not measured
    latency.save_profile(given["path"], {**given, "source": "measured"})

    def quiet():
        calls.append(1)
        return {"float32": 0.0593, "bfloat16": 0.0365}

    assert latency.choose_dtype("m-1", "cpu-2t", quiet, **kw) == "bfloat16" and calls == [1]
    assert lines[-2] == ("model.dtype=auto: its cached timings look taken on a busy machine (its float32 step took "
                         "229.7 ms, against 60.0 ms at q=1 in the latency profile measured since): timing the dtypes "
                         "again")
    assert latency.choose_dtype("m-1", "cpu-2t", quiet, **kw) == "bfloat16" and calls == [1]  # the new record stands
