"""Tree candidates and copy-KV commit end to end (issue 10, issue 9 lever 1).

Copy-KV output == re-feed output == transformers' greedy (tiny model; SmolLM2 in test_exactness_smollm2.py), same steps; the
candidate variants all stay exact; the step policy hook sees every step; the config rejects bad variants.
"""
import sys
from pathlib import Path

import pytest
import torch

from lp_runtime.config import ConfigError, DecodingConfig
from lp_runtime.decoder import Decoder
from lp_runtime.kv import commit, new_cache
from lp_runtime.lookup import FeedAll, StepChoice

sys.path.insert(0, str(Path(__file__).parent))
from exactness import hf_greedy  # noqa: E402
from lp_driver import tiny_model  # noqa: E402

PROMPTS = [
    [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4, 5, 6, 9],
    [7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 1, 2, 3, 1, 2, 3, 1, 2],
]


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    model = tiny_model()
    return model, [hf_greedy(model, p, 40) for p in PROMPTS]


def test_commit_gathers_rows_into_place():
    cache = new_cache()
    kv = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1).repeat(1, 2, 1, 3)
    cache.update(kv, kv + 100, 0)
    commit(cache, num_fed=6, num_keep=2, gather=[3, 5])  # step = entries 4..9; keep 4, 5, then 7, 9
    layer = cache.layers[0]
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
    assert layer.values[0, 1, :, 0].tolist() == [100, 101, 102, 103, 104, 105, 107, 109]
    commit(cache, num_fed=3, num_keep=1)  # re-feed commit: keep a prefix only
    assert cache.get_seq_length() == 6


@pytest.mark.parametrize("wng", [(0, 3, 2), (2, 3, 1), (4, 4, 3), (7, 5, 4), (3, 2, 2)])
@pytest.mark.parametrize("variant", [{}, {"lookup": "pool"}, {"tree": False}, {"ranking": "recency"},
                                     {"max_depth": 3}])
def test_copy_equals_refeed_equals_generate(tiny, wng, variant):
    model, refs = tiny
    w, n, g = wng
    for p, ref in zip(PROMPTS, refs):
        outs = {}
        for mode in ("copy", "refeed"):
            cfg = DecodingConfig(window_size=w, ngram_size=n, guess_set_size=g, commit=mode, **variant)
            outs[mode] = Decoder(model, cfg).generate(p, max_new_tokens=40)
            assert outs[mode].output_ids == ref, (mode, variant)
        assert outs["copy"].accept_lengths == outs["refeed"].accept_lengths
        # copy-KV feeds one pending token after the first step; re-feed feeds every accepted token again
        assert sum(outs["copy"].step_tokens) <= sum(outs["refeed"].step_tokens)
    assert any(max(Decoder(model, DecodingConfig(window_size=w, ngram_size=n, guess_set_size=g, **variant))
                   .generate(p, max_new_tokens=40).accept_lengths) > 1 for p in PROMPTS)  # candidates accepted


@pytest.mark.parametrize("wng", [(2, 3, 1), (4, 4, 3), (7, 5, 4)])
@pytest.mark.parametrize("variant", [{"ngram_keys": "head"}, {"ngram_keys": "all"}])
def test_candidate_sources_keep_greedy_exact(tiny, wng, variant):
    """Issue 10's candidate sources (how window n-grams are keyed) change steps, not tokens."""
    model, refs = tiny
    w, n, g = wng
    for mode in ("copy", "refeed"):
        cfg = DecodingConfig(window_size=w, ngram_size=n, guess_set_size=g, commit=mode, **variant)
        for p, ref in zip(PROMPTS, refs):
            assert Decoder(model, cfg).generate(p, max_new_tokens=40).output_ids == ref, (mode, variant)


class Recorder(FeedAll):
    """FeedAll that records what it was shown, and feeds only the first node when asked to."""

    def __init__(self, first_only=False):
        self.seen, self.first_only = [], first_only

    def choose(self, tree, *, num_pending, window_tokens):
        if self.first_only:
            return StepChoice(nodes=tuple(range(min(1, len(tree)))), use_window=False)
        return super().choose(tree, num_pending=num_pending, window_tokens=window_tokens)

    def observe(self, tree, fed_nodes, accepted_nodes):
        assert set(accepted_nodes) <= set(fed_nodes)
        for n in accepted_nodes:  # accepted nodes form a path in the proposed tree
            assert tree.parents[n] < 0 or tree.parents[n] in accepted_nodes
        self.seen.append((len(tree), len(fed_nodes), len(accepted_nodes)))


def test_step_policy_hook(tiny):
    model, refs = tiny
    rec = Recorder()
    out = Decoder(model, DecodingConfig(window_size=2, ngram_size=3, guess_set_size=2), step_policy=rec).generate(
        PROMPTS[1], max_new_tokens=40)
    assert out.output_ids == refs[1] and len(rec.seen) == out.decoding_steps
    assert [s[2] + 1 for s in rec.seen][:-1] == out.accept_lengths[:-1]
    small = Recorder(first_only=True)
    out = Decoder(model, DecodingConfig(window_size=2, ngram_size=3, guess_set_size=2), step_policy=small).generate(
        PROMPTS[1], max_new_tokens=40)
    assert out.output_ids == refs[1]
    assert max(out.step_tokens[1:]) <= 2 and max(out.accept_lengths) == 2  # 1 pending + 1 node: at most 2 tokens


def test_config_rejects_bad_variants():
    for kwargs, msg in (
        ({"lookup": "trie"}, "decoding.lookup='trie' is not allowed; use one of suffix, pool"),
        ({"ranking": "size"}, "decoding.ranking='size' is not allowed; use one of counts, recency"),
        ({"commit": "move"}, "decoding.commit='move' is not allowed; use one of copy, refeed"),
        ({"max_depth": 0}, "decoding.max_depth=0 is not allowed; it must be >= 1"),
    ):
        with pytest.raises(ConfigError) as err:
            DecodingConfig(**kwargs)
        assert str(err.value) == msg



@pytest.mark.parametrize("wng", [(0, 3, 2), (4, 4, 3)])
def test_cross_question_store_changes_steps_never_tokens(tiny, wng):
    """One Decoder answering the prompts twice: the second pass matches its own earlier answers in the store
    (fewer steps); every output stays transformers' greedy; a fresh Decoder starts with an empty store."""
    model, refs = tiny
    w, n, g = wng
    levers = dict(window_size=w, ngram_size=n, guess_set_size=g)
    dec = Decoder(model, DecodingConfig(cross_question=True, **levers))
    first = [dec.generate(p, max_new_tokens=40) for p in PROMPTS]
    second = [dec.generate(p, max_new_tokens=40) for p in PROMPTS]
    for out, ref in zip(first + second, refs + refs):
        assert out.output_ids == ref
    assert len(dec.store.docs) == 2 * len(PROMPTS)
    assert sum(o.decoding_steps for o in second) < sum(o.decoding_steps for o in first)
    alone = Decoder(model, DecodingConfig(**levers)).generate(PROMPTS[0], max_new_tokens=40)
    assert alone.decoding_steps == first[0].decoding_steps  # the store was empty for the first prompt
    assert Decoder(model, DecodingConfig(**levers, cross_question=False)).store is None
    assert Decoder(model, DecodingConfig(window_size=w, ngram_size=n, guess_set_size=g, lookup="pool")).store is None
    assert Decoder(model, DecodingConfig(**levers)).store is not None  # the default: on with the suffix lookup


def test_config_rejects_bad_sources():
    with pytest.raises(ConfigError, match="decoding.cross_question=true needs decoding.lookup=suffix"):
        DecodingConfig(cross_question=True, lookup="pool")
    with pytest.raises(ConfigError, match=r"decoding.ngram_keys='tail' is not allowed; use one of head, all"):
        DecodingConfig(ngram_keys="tail")
