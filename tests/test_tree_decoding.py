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
from lp_runtime.policy import FeedAll, StepChoice
from lp_runtime.proposers import proposers_for
from lp_runtime.tree import CandidateTree

sys.path.insert(0, str(Path(__file__).parent))
from exactness import hf_greedy  # noqa: E402
from lp_driver import tiny_model  # noqa: E402
from fakes import lookahead  # noqa: E402

PROMPTS = [
    [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4, 5, 6, 9],
    [7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 1, 2, 3, 1, 2, 3, 1, 2],
]


@pytest.fixture(scope="module")
def tiny():
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


def decoder(model, w, n, g, levers, copy_kv=True):
    """A decoder at (W, N, G) whose proposer takes ``levers`` (``{"method": "paper"}``: the paper's pool)."""
    levers = dict(levers)
    cfg = DecodingConfig(method=levers.pop("method", "lookahead"), window_size=w, ngram_size=n, guess_set_size=g,
                         max_depth=levers.pop("max_depth", 10))
    return Decoder(model, cfg, proposers=proposers_for(cfg, **levers), copy_kv=copy_kv)


@pytest.mark.parametrize("wng", [(0, 3, 2), (2, 3, 1), (4, 4, 3), (7, 5, 4), (3, 2, 2)])
@pytest.mark.parametrize("levers", [{}, {"method": "paper"}, {"tree": False}, {"ranking": "recency"}, {"max_depth": 3},
                                    {"ngram_keys": "head"}, {"chain": False}], ids=str)
def test_copy_equals_refeed_equals_generate(tiny, wng, levers):
    """Every candidate source and shape, copy-KV or re-feed: transformers' greedy tokens, the same steps."""
    model, refs = tiny
    decoders = {copy_kv: decoder(model, *wng, levers, copy_kv) for copy_kv in (True, False)}
    longest = 0
    for p, ref in zip(PROMPTS, refs):
        outs = {copy_kv: dec.generate(p, max_new_tokens=40) for copy_kv, dec in decoders.items()}
        for copy_kv, out in outs.items():
            assert out.output_ids == ref, (copy_kv, levers)
        assert outs[True].accept_lengths == outs[False].accept_lengths
        # copy-KV feeds one pending token after the first step; re-feed feeds every accepted token again
        assert sum(outs[True].step_tokens) <= sum(outs[False].step_tokens)
        longest = max(longest, *outs[True].accept_lengths)
    assert longest > 1  # candidates accepted


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
    out = Decoder(model, lookahead(window_size=2, ngram_size=3, guess_set_size=2), step_policy=rec).generate(
        PROMPTS[1], max_new_tokens=40)
    assert out.output_ids == refs[1] and len(rec.seen) == out.decoding_steps
    assert [s[2] + 1 for s in rec.seen][:-1] == out.accept_lengths[:-1]
    small = Recorder(first_only=True)
    out = Decoder(model, lookahead(window_size=2, ngram_size=3, guess_set_size=2), step_policy=small).generate(
        PROMPTS[1], max_new_tokens=40)
    assert out.output_ids == refs[1]
    assert max(out.step_tokens[1:]) <= 2 and max(out.accept_lengths) == 2  # 1 pending + 1 node: at most 2 tokens


def test_config_rejects_bad_values_and_levers():
    for kwargs, msg in (
        ({"method": "fast"}, "decoding.method='fast' is not allowed; use one of greedy, lookahead, auto, paper"),
        ({"max_depth": 0}, "decoding.max_depth=0 is not allowed; it must be >= 1"),
    ):
        with pytest.raises(ConfigError) as err:
            DecodingConfig(**kwargs)
        assert str(err.value) == msg
    with pytest.raises(TypeError, match="unexpected keyword argument 'lookup'"):  # levers are proposer arguments
        DecodingConfig(lookup="pool")


@pytest.mark.parametrize("wng", [(0, 3, 2), (4, 4, 3)])
def test_cross_question_store_changes_steps_never_tokens(tiny, wng):
    """One Decoder answering the prompts twice: the second pass matches its own earlier answers in the store
    (fewer steps); every output stays transformers' greedy; a fresh Decoder starts with an empty store."""
    model, refs = tiny
    w, n, g = wng
    cfg = lookahead(window_size=w, ngram_size=n, guess_set_size=g)
    dec = Decoder(model, cfg, proposers=proposers_for(cfg, cross_question=True))
    first = [dec.generate(p, max_new_tokens=40) for p in PROMPTS]
    second = [dec.generate(p, max_new_tokens=40) for p in PROMPTS]
    for out, ref in zip(first + second, refs + refs):
        assert out.output_ids == ref
    assert len(dec.proposers[0].store.docs) == 2 * len(PROMPTS)
    assert sum(o.decoding_steps for o in second) < sum(o.decoding_steps for o in first)
    alone = Decoder(model, cfg).generate(PROMPTS[0], max_new_tokens=40)
    assert alone.decoding_steps == first[0].decoding_steps  # the store was empty for the first prompt
    assert proposers_for(cfg, cross_question=False)[0].store is None
    assert not hasattr(proposers_for(DecodingConfig(method="paper", ngram_size=n, guess_set_size=g))[0], "store")
    assert proposers_for(cfg)[0].store is not None  # the default: on with the suffix lookup
    dec.forget_answers()
    assert dec.generate(PROMPTS[0], max_new_tokens=40).decoding_steps == first[0].decoding_steps


class RowsRecorder:
    """A proposer that proposes nothing and records the kept rows a step shows it (``topk`` = 3)."""

    topk, max_depth = 3, 1

    def __init__(self):
        self.rows, self.accepted = [], []

    def begin(self, prompt, *, do_sample):
        pass

    def observe(self, accepted, ngrams, rows=None):
        self.rows.append(rows)
        self.accepted.append(list(accepted))

    def propose(self):
        return CandidateTree()

    def end(self, prompt, output):
        pass

    def reset(self):
        pass

    def state(self):
        return ()


def test_proposers_are_constructor_arguments_and_may_ask_for_topk_rows(tiny):
    """Two sources side by side (the suffix lookup and a row recorder) keep the output; the recorder gets every
    kept row's input token and its top-3 successors, the first of which at ``c`` is the step's first token."""
    model, refs = tiny
    cfg = lookahead(window_size=3, ngram_size=3, guess_set_size=2)
    rec = RowsRecorder()
    dec = Decoder(model, cfg, proposers=proposers_for(cfg) + [rec])
    out = dec.generate(PROMPTS[0], max_new_tokens=40)
    assert out.output_ids == refs[0] and dec.topk == 3
    assert len(rec.rows) == out.decoding_steps - 1  # every step but the last one observes
    for rows, accepted in zip(rec.rows, rec.accepted):
        assert rows.topk.shape == (len(rows.tokens), 3) and rows.topk.dtype == torch.int64
        assert int(rows.topk[0, 0]) == accepted[0]  # row 0 is c: its best successor is the first accepted token
    assert Decoder(model, cfg).topk == 0  # nobody asked: no top-k work


def test_union_merges_equal_siblings_and_keeps_window_tags():
    a = CandidateTree([5, 6, 7], [-1, 0, -1], [0.5, 0.5, 0.2], [False, True, True])
    b = CandidateTree([5, 8, 7], [-1, 0, 0], [0.9, 0.1, 0.3], [True, True, True])
    u = CandidateTree.union([a, b])
    assert (u.tokens, u.parents, u.prob) == ([5, 6, 7, 8, 7], [-1, 0, -1, 0, 0], [0.5, 0.5, 0.2, 0.1, 0.3])
    assert u.from_window == [False, True, True, True, True]  # 5 was proposed by the text in a: not window-only
    assert CandidateTree.union([a]) is not a and CandidateTree.union([a]).tokens == a.tokens
