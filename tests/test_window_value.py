"""The window's value, learned: the lookup tags the tree nodes only the window's harvested n-grams proposed
(``CandidateTree.from_window``), and ``CostPolicy.window_gain`` becomes the measured extra accepted tokens per
windowed step instead of a fixed prior."""
from __future__ import annotations

import pytest

from lp_runtime.config import DecodingConfig
from lp_runtime.decoder import Decoder
from lp_runtime.proposers import SuffixProposer
from lp_runtime.tree import CandidateTree
from lp_runtime.policy import WINDOW_GAIN_PRIOR, CostPolicy
from fakes import llama

A, B, C, X, D, E, F, Q = 10, 11, 12, 13, 14, 15, 16, 17
GENTLE = {1: 10.0, 101: 20.0}


def _tagged(tree: CandidateTree) -> dict[tuple[int, ...], bool]:
    """{token path from the root: from_window} for every node."""
    return {tuple(tree.tokens[m] for m in tree.path(n)): tree.from_window[n] for n in range(len(tree))}


def test_suffix_lookup_tags_window_only_nodes():
    lk = SuffixProposer(4, 3, max_key=1, chain=False, ngram_keys="head")
    lk.extend([A, B, C, X, A])            # "a" was followed by b c x in the text
    assert _tagged(lk.propose()) == {(B,): False, (B, C): False, (B, C, X): False}
    lk.add_ngram([A, D, E, F])            # the window saw a d e f
    lk.add_ngram([A, B, Q, E])            # and a b q e: b is in the text too, q e only in the window
    tree = lk.propose()
    assert len(tree.from_window) == len(tree)
    assert _tagged(tree) == {(B,): False, (B, C): False, (B, C, X): False, (B, Q): True, (B, Q, E): True,
                             (D,): True, (D, E): True, (D, E, F): True}
    # chains (tree=false) and selections carry no tags: the policy then keeps its prior
    assert tree.chains().from_window == [] and tree.select([0]).from_window == []
    # a chained node is tagged by the match that proposed it: "x" again matches the text (x -> a)
    lk.chain = True
    assert _tagged(lk.propose())[(B, C, X, A)] is False


def test_window_gain_counts_accepted_window_only_nodes():
    lk = SuffixProposer(4, 3, max_key=1, chain=False, ngram_keys="head")
    lk.extend([A, B, C, X, A])
    lk.add_ngram([A, D, E, F])
    tree = lk.propose()
    window_path = [n for n in range(len(tree)) if tree.from_window[n]]          # d, e, f
    text_path = [n for n in range(len(tree)) if not tree.from_window[n]][:1]    # b
    pol = CostPolicy(GENTLE, window_strength=4.0)
    assert pol.window_gain == pytest.approx(WINDOW_GAIN_PRIOR)
    for accepted in (window_path, window_path[:1], text_path, []):               # 3 + 1 + 0 + 0 window tokens
        choice = pol.choose(tree, num_pending=1, window_tokens=6)
        assert choice.use_window
        pol.observe(tree, range(len(tree)), accepted)
    assert (pol.window_steps, pol.window_accepted) == (4, 4)
    assert pol.window_gain == pytest.approx((4 + 4 * WINDOW_GAIN_PRIOR) / (4 + 4))
    # an untagged tree (another lookup) leaves the measurement alone
    pol.observe(CandidateTree(tree.tokens, tree.parents, tree.prob), range(len(tree)), window_path)
    assert pol.window_accepted == 4


def test_window_gain_is_measured_inside_a_decode():
    model = llama()
    pol = CostPolicy({1: 0.010, 256: 0.010})  # flat: the window is fed every step, so its value is measured
    dec = Decoder(model, DecodingConfig(method="auto", window_size=3, ngram_size=4, guess_set_size=3),
                  step_policy=pol)
    for prompt in ([3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4, 5, 6, 9, 11, 3, 4, 5], [5, 9, 5], [7]):
        dec.generate(prompt, max_new_tokens=60)
    assert pol.window_steps > 100 and pol.window_accepted > 0
    assert pol.window_gain == pytest.approx((pol.window_accepted + 32 * WINDOW_GAIN_PRIOR) / (pol.window_steps + 32))
    assert pol.window_gain != pytest.approx(WINDOW_GAIN_PRIOR, abs=0.01)
