"""decoding=auto inside real decodes: the cost policy's choices on synthetic latency curves, exactness against
transformers' greedy (tiny models; SmolLM2: test_exactness_smollm2.py), and the levers the benchmark switches off."""
from __future__ import annotations

import pytest

from lp_runtime import auto, latency, models
from lp_runtime.config import DecodingConfig
from lp_runtime.decoder import Decoder
from lp_runtime.policy import CostPolicy, FeedAll

from exactness import hf_greedy
from fakes import llama, lookahead

FLAT = {1: 0.010, 256: 0.010}                    # a GPU-like curve: every node with any chance pays
STEEP = {1: 0.010, 2: 0.020, 256: 2.560}         # cost proportional to tokens: nothing ever pays
FLOAT32 = {1: 38.5, 2: 61.8, 3: 75.8, 4: 58.9, 8: 59.2, 16: 70.6, 32: 95.0, 64: 142.8}  # docs/design.md 7b
AUTO = DecodingConfig(method="auto", window_size=0, ngram_size=4, guess_set_size=3, max_depth=10)  # = FeedAll's limits below
PROMPTS = [
    [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4, 5, 6, 9, 11, 3, 4, 5],  # repetitive: candidates get accepted
    [5, 9, 5],
    [7],
]
NEW = 40


@pytest.fixture(scope="module")
def tiny():
    return llama()


def decode(model, decoding, policy, prompt, new=NEW, **options):
    return Decoder(model, decoding, step_policy=policy, **options).generate(prompt, max_new_tokens=new)


@pytest.mark.parametrize("curve", [FLAT, STEEP, FLOAT32], ids=["flat", "steep", "float32"])
def test_auto_equals_transformers_greedy_on_any_curve(tiny, curve):
    policy = CostPolicy(curve)  # one policy across prompts: it keeps learning, as in a run
    for prompt in PROMPTS:
        out = decode(tiny, AUTO, policy, prompt)
        assert out.output_ids == hf_greedy(tiny, prompt, NEW), prompt
        assert sum(out.accept_lengths) == NEW


def test_flat_curve_feeds_more_than_a_steep_one_and_steep_is_greedy(tiny):
    prompt = PROMPTS[0]
    flat = decode(tiny, AUTO, CostPolicy(FLAT), prompt)
    steep = decode(tiny, AUTO, CostPolicy(STEEP), prompt)
    greedy = Decoder(tiny, DecodingConfig(method="greedy")).generate(prompt, max_new_tokens=NEW)
    # nothing pays on the steep curve: exactly greedy's steps, one token fed each
    assert steep.decoding_steps == greedy.decoding_steps == NEW and set(steep.step_tokens) == {1}
    # the flat curve feeds candidates and saves steps
    assert sum(flat.step_tokens) / flat.decoding_steps > 1.5 and flat.decoding_steps < NEW
    # FeedAll with the same limits feeds at least as much as the flat-curve policy
    feed_all = decode(tiny, DecodingConfig(method="lookahead", window_size=0, ngram_size=4, guess_set_size=3),
                      FeedAll(), prompt)
    assert sum(feed_all.step_tokens) >= sum(flat.step_tokens)


def test_policy_learns_inside_a_decode(tiny):
    policy = CostPolicy(FLAT)
    out = decode(tiny, AUTO, policy, PROMPTS[0])
    assert policy.steps == out.decoding_steps  # observe() after every step
    assert sum(policy.calibration.trials.values()) > 0
    assert max(out.step_tokens) > 1  # the flat curve made candidates pay


def test_levers_do_not_change_the_tokens(tiny):
    ref = hf_greedy(tiny, PROMPTS[0], NEW)
    out = decode(tiny, AUTO, CostPolicy(FLAT), PROMPTS[0], copy_kv=False)  # re-feed commit
    assert out.output_ids == ref
    windowed = DecodingConfig(method="auto", window_size=3, ngram_size=4, guess_set_size=3)
    out = decode(tiny, windowed, CostPolicy(FLAT), PROMPTS[0])
    assert out.output_ids == ref and max(out.step_tokens) > 1 + 2 + 2 * 3  # the window was fed on the flat curve
    out = decode(tiny, windowed, CostPolicy(STEEP), PROMPTS[0])
    assert out.output_ids == ref and set(out.step_tokens) == {1}  # ... and never on the steep one


def test_auto_policy_is_the_cost_policy_on_the_cached_profile(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    latency.latency_profile(models.model_id_of(tiny), latency.device_key(tiny), "float32", measure=lambda: FLAT)
    policy = auto.auto_policy(tiny, log=lambda line: pytest.fail(f"measured: {line}"))  # as if measured before
    assert isinstance(policy, CostPolicy) and policy.curve(64) == 0.010
    out = Decoder(tiny, AUTO, step_policy=policy).generate(PROMPTS[0], max_new_tokens=NEW)
    assert out.output_ids == hf_greedy(tiny, PROMPTS[0], NEW) and out.decoding_steps < NEW
    assert isinstance(Decoder(tiny, lookahead()).step_policy, FeedAll)

