"""Candidate sources (proposers.py): suffix matching, the candidate tree, its caps and ranking, FeedAll.

Hand-written token ids (letters as small ints) and exact expected trees.
"""
import re

import pytest

from lp_runtime.policy import FeedAll, StepChoice
from lp_runtime.proposers import MATCH_WEIGHT, STORE_WEIGHT, AnswerStore, PoolProposer, SuffixProposer
from lp_runtime.tree import CandidateTree, children

a, b, c, d, e, f, g, h = range(1, 9)
y = 10  # a token in no history


def lookup(history, ngram_size=3, leaves=2, **kw):
    """A suffix proposer after ``history``; n-grams keyed by their head unless ``ngram_keys`` says otherwise."""
    lk = SuffixProposer(ngram_size, leaves, **{"ngram_keys": "head", **kw})
    lk.extend(history)
    return lk


def test_docstring_example():
    tree = lookup([a, b, c, a, b, d, a, b], ngram_size=3, leaves=2, max_nodes=4, max_key=2).propose()
    assert tree.tokens == [d, c, a, a] and tree.parents == [-1, -1, 0, 1]
    assert tree.prob == pytest.approx([4 / 9, 4 / 9, 0.8, 0.8])


@pytest.mark.parametrize(
    "history, kw, tokens, parents",
    [
        # no earlier occurrence of the suffix: nothing to propose
        ([a, b, c], {}, [], []),
        # one 1-token match: N-1 = 2 tokens (prompt lookup)
        ([a, b, c, d, a], {}, [b, c], [-1, 0]),
        # a 2-token match proposes (N-1) x 2 = 4 tokens, capped by max_nodes
        ([a, b, c, d, e, f, a, b], {"max_nodes": 10}, [c, d, e, f], [-1, 0, 1, 2]),
        ([a, b, c, d, e, f, a, b], {"max_nodes": 3}, [c, d, e], [-1, 0, 1]),
        # max_depth bounds long matches: 3-token match would allow 6, max_depth 5
        ([a, b, c, d, e, f, g, h, a, b, c], {"max_nodes": 10, "max_depth": 5}, [d, e, f, g, h], [-1, 0, 1, 2, 3]),
        # counts: "a -> b" seen twice, "a -> c" once: b first; shared prefix b fed once; e (newer) before d
        ([a, b, d, a, b, e, a, c, f, a], {"leaves": 3, "max_nodes": 10},
         [b, c, e, d, f], [-1, -1, 0, 0, 1]),
        # G = 1 leaf: only the best branch, however many nodes are allowed
        ([a, b, d, a, b, e, a, c, f, a], {"leaves": 1, "max_nodes": 10}, [b, e], [-1, 0]),
        # a 2-token match outweighs more frequent 1-token matches (MATCH_WEIGHT = 4 > 2 occurrences)
        ([g, a, c, h, a, b, h, a, b, g, a], {"leaves": 1, "max_nodes": 10}, [c, h, a, b], [-1, 0, 1, 2]),
    ],
)
def test_propose_table(history, kw, tokens, parents):
    kw = dict(kw)
    leaves = kw.pop("leaves", 2)
    tree = lookup(history, ngram_size=3, leaves=leaves, chain=False, **kw).propose()  # one match (chains: below)
    assert (tree.tokens, tree.parents) == (tokens, parents)
    assert all(0 <= p <= 1 for p in tree.prob)


def test_counts_vs_recency_and_probabilities():
    hist = [a, b, d, a, b, e, a, c, f, a]
    counts = lookup(hist, leaves=1, max_nodes=2).propose()
    recency = lookup(hist, leaves=1, max_nodes=2, ranking="recency").propose()
    assert counts.tokens == [b, e] and recency.tokens == [c, f]
    # b followed a twice out of 3 continuations: 2 / (3 + 1); then e once out of b's 2: 1 / (2 + 1)
    assert counts.prob == pytest.approx([2 / 4, 1 / 3])
    assert MATCH_WEIGHT == 4.0


def test_window_ngrams_are_a_source_and_dedup():
    lk = lookup([a, b, c], ngram_size=3, leaves=2, max_nodes=4)
    assert len(lk.propose()) == 0
    lk.add_ngram([c, d, e])
    lk.add_ngram([c, d, e])  # re-harvested: counted once, refreshed
    lk.add_ngram([b, c, f])  # keyed "b c": a 2-token match with the history's suffix
    tree = lk.propose()
    assert tree.tokens == [f, d, e] and tree.parents == [-1, -1, 1]
    assert lk.state()[0] == 3
    n_only = SuffixProposer(3, 2, index_history=False, ngram_keys="head")
    n_only.extend([a, b, a])
    assert len(n_only.propose()) == 0  # the history is matched, not indexed
    n_only.add_ngram([a, g, h])
    assert n_only.propose().tokens == [g, h]


def test_tree_helpers():
    t = CandidateTree([b, c, d, e], [-1, 0, 0, -1], [0.5, 0.4, 0.3, 0.2])
    assert t.depths() == [1, 2, 2, 1] and t.path(2) == [0, 2] and children(t.parents)[-1] == [0, 3]
    s = t.select((0, 2))
    assert (s.tokens, s.parents, s.prob) == ([b, d], [-1, 0], [0.5, 0.3])
    with pytest.raises(ValueError, match="ancestor-closed"):
        t.select((1,))
    ch = t.chains()
    assert (ch.tokens, ch.parents) == ([b, c, b, d, e], [-1, 0, -1, 2, -1])
    m = ch.merged()
    assert (m.tokens, m.parents) == (t.tokens, t.parents)
    assert CandidateTree.from_chains([(b, c), (b, d)]).merged().parents == [-1, 0, 0]


def test_pool_lookup_and_feed_all():
    pl = PoolProposer(3, 2)
    pl.observe([a, b, c, a, b, d, a], ())
    tree = pl.propose()
    assert (tree.tokens, tree.parents) == ([b, d, b, c], [-1, 0, -1, 2])
    choice = FeedAll().choose(tree, num_pending=1, window_tokens=0)
    assert choice == StepChoice(nodes=(0, 1, 2, 3), use_window=False)
    assert FeedAll().choose(CandidateTree(), num_pending=2, window_tokens=5).use_window


def test_bad_arguments():
    with pytest.raises(ValueError, match="ranking='size'"):
        SuffixProposer(3, 2, ranking="size")
    with pytest.raises(ValueError, match=r"ngram_size=1 \(need an int >= 2\)"):
        SuffixProposer(1, 2)
    assert len(lookup([a, a, a], leaves=0).propose()) == 0


def test_default_budget():
    # G x (N-1) verification tokens, and always room for one full-depth continuation
    assert SuffixProposer(4, 2).max_nodes == 10 and SuffixProposer(5, 15).max_nodes == 60
    assert SuffixProposer(4, 2, max_depth=2).max_depth == 3  # never below N-1
    lk = lookup([a, b, c, d, e, f, g, h, a, b, c], ngram_size=4, leaves=1, chain=False)  # 3-token match: up to 9
    assert lk.propose().tokens == [d, e, f, g, h, a, b, c]
    lk.chain = True  # the draft's end "a b c" matches again at the start: continued to max_depth = 10
    assert lk.propose().tokens == [d, e, f, g, h, a, b, c, d, e]


def _with_ngrams(history, ngrams, **kw):
    lk = lookup(history, **kw)
    for g in ngrams:
        lk.add_ngram(g)
    return lk


@pytest.mark.parametrize(
    "history, ngrams, kw, tokens, parents",
    [
        # a window n-gram's end is continued by the n-gram its last token heads (neighbouring columns overlap)
        ([h, a], [[a, b, c], [c, d, e]], {}, [b, c, d, e], [-1, 0, 1, 2]),
        # nothing continues the second n-gram: the chain stops there
        ([h, a], [[a, b, c], [c, d, e], [g, e, f]], {}, [b, c, d, e], [-1, 0, 1, 2]),
        # a 1-token match's N-1 tokens continued by the longer key the draft forms ("a b c" -> a, periodic text)
        ([a, b, c, a], [], {"max_depth": 5}, [b, c, a, b, c], [-1, 0, 1, 2, 3]),
        # the chain never passes max_depth
        ([h, a], [[a, b, c], [c, d, e], [e, f, g]], {"max_depth": 5}, [b, c, d, e, f], [-1, 0, 1, 2, 3]),
        # two continuations of the draft's end: both become children (leaves 2), the heavier (2 occurrences) first
        ([h, a], [[a, b, c], [c, d, e], [g, c, d], [c, f, y]], {"ngram_keys": "all"},
         [b, c, d, f, e, y], [-1, 0, 1, 1, 2, 3]),
        # chaining off: the draft ends with the first n-gram
        ([h, a], [[a, b, c], [c, d, e]], {"chain": False}, [b, c], [-1, 0]),
    ],
)
def test_chain_table(history, ngrams, kw, tokens, parents):
    tree = _with_ngrams(history, ngrams, ngram_size=3, leaves=2, max_nodes=10, **kw).propose()
    assert (tree.tokens, tree.parents) == (tokens, parents)
    assert all(0 <= p <= 1 for p in tree.prob)


def test_chain_probabilities_multiply_along_the_path():
    # b: 1 occurrence after a -> 1 / (1 + 1); c follows b in the same n-gram -> 1 / 2; d, chained from c's n-gram,
    # is a fresh match: 1 / (1 + 1); best-first order is by the product, so siblings of higher product come first
    tree = _with_ngrams([h, a], [[a, b, c], [c, d, e]], ngram_size=3, leaves=1, max_nodes=10).propose()
    assert tree.prob == pytest.approx([0.5, 0.5, 0.5, 0.5])
    assert tree.from_window == [True, True, True, True]


# ---------------------------------------------------------------- candidate sources (issue 10 levers)
def test_store_matches_earlier_answers_after_their_prompt_tail():
    store = AnswerStore(max_key=2)
    store.add([h, g, a], [b, c, d])  # stored as (g, a, b, c, d): the prompt's last max_key tokens, then the answer
    assert store.docs == [(g, a, b, c, d)] and store.state() == (1, 5)
    lk = SuffixProposer(3, 2, max_key=2, store=store)
    lk.extend([e, g, a])  # "g a" matched in the store (2 tokens: up to 4 deep), nothing in the own text
    tree = lk.propose()
    assert (tree.tokens, tree.parents) == ([b, c, d], [-1, 0, 1])
    assert SuffixProposer(3, 2, max_key=2).propose().tokens == []  # no store: nothing


@pytest.mark.parametrize("min_key, tokens", [(1, [b, c, d]), (2, []), (3, [])])
def test_store_matched_only_from_store_min_key_tokens(min_key, tokens):
    store = AnswerStore(max_key=2)
    store.add([h, g, a], [b, c, d])  # stored as (g, a, b, c, d)
    lk = SuffixProposer(3, 2, max_key=2, store=store, store_min_key=min_key)
    lk.extend([e, f, a])  # only "a" (1 token) is in the store: matched when store_min_key is 1
    assert lk.propose().tokens == tokens
    lk = SuffixProposer(3, 2, max_key=2, store=store, store_min_key=min_key)
    lk.extend([e, g, a])  # "g a" (2 tokens) is: matched unless store_min_key is above it (3 > max_key: never)
    assert lk.propose().tokens == ([] if min_key > 2 else [b, c, d])


def test_store_min_key_leaves_the_own_text_matched_by_any_key():
    store = AnswerStore(max_key=2)
    store.add([], [a, c, d])
    lk = SuffixProposer(3, 1, max_key=2, store=store, store_min_key=2)
    lk.extend([a, b, f, a])  # own "a -> b f" (1-token key) proposed; the store's "a -> c d" needs 2 tokens
    assert lk.propose().tokens[:2] == [b, f]
    assert c not in lk.propose().tokens


@pytest.mark.parametrize("kwargs, why", [
    (dict(store_min_key=0), "store_min_key=0 (need an int >= 1)"),
    (dict(ngram_size=1, num_leaves=-1), "ngram_size=1 (need an int >= 2); num_leaves=-1 (need an int >= 0)"),
    (dict(max_key=2.0, chain="yes"), "max_key=2.0 (need an int >= 1); chain='yes' (need True or False)"),
    (dict(ranking="best"), "ranking='best' (need one of 'counts', 'recency')"),
    (dict(store_weight=-1.0), "store_weight=-1.0 (need a number >= 0)"),
])
def test_suffix_proposer_refuses_bad_arguments(kwargs, why):
    args = {"ngram_size": 3, "num_leaves": 2, **kwargs}
    with pytest.raises(ValueError, match=f"^SuffixProposer: {re.escape(why)}$"):
        SuffixProposer(args.pop("ngram_size"), args.pop("num_leaves"), **args)


@pytest.mark.parametrize("weight, first", [(STORE_WEIGHT, b), (8.0, c)])
def test_store_weight_against_own_text(weight, first):
    store = AnswerStore(max_key=2)
    store.add([], [a, c, g])
    lk = SuffixProposer(3, 1, max_key=2, store=store, store_weight=weight)
    lk.extend([a, b, f, a])  # own "a -> b f" (weight 1) vs stored "a -> c g" (weight ``weight``)
    assert lk.propose().tokens[0] == first
    assert STORE_WEIGHT == 0.25


def test_store_forgets_the_older_half_past_max_tokens():
    store = AnswerStore(max_key=1, max_tokens=8)
    for t in range(5):
        store.add([], [t + 1, t + 2])
    assert store.docs == [(4, 5), (5, 6)] and store.index[(5,)] == [(0, 1), (1, 0)] and store.num_tokens == 4
    store.add([], list(range(20, 40)))  # one answer longer than the cap: kept alone
    assert store.docs == [tuple(range(20, 40))] and store.num_tokens == 20


@pytest.mark.parametrize("keys, tokens", [("head", []), ("all", [d])])
def test_ngram_keys_head_or_all(keys, tokens):
    lk = SuffixProposer(3, 2, index_history=False, ngram_keys=keys)
    lk.extend([g, c])
    lk.add_ngram([b, c, d])  # "c" is inside the n-gram, not its head
    assert lk.propose().tokens == tokens
