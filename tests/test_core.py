"""Model-free core: mask/layout, n-gram pool, window, greedy verification, stopping.

Hand-written token ids and exact expected results (docs/architecture.md).
"""
import pytest
import torch

from lp_runtime.layout import LayoutCache, build_layout, full_mask
from lp_runtime.tree import ancestors, child_tokens, children, path, reindex, subtrees
from lp_runtime.ngram_pool import NGramPool
from lp_runtime.stopping import StopChecker
from lp_runtime.verify import greedy_verify
from lp_runtime.window import JacobiWindow


# ---------------------------------------------------------------- layout and mask
def test_layout_every_pair():
    # P=2 pending (p0, c), W=3, N=3 (one level), one candidate of N-1=2 tokens.
    lay = build_layout(num_pending=2, columns=[0, 1, 2], num_levels=1, tree_parents=[-1, 0])
    names = ["p0", "c", "r1", "r2", "a0", "a1", "a2", "k0", "k1"]
    sees = {
        "p0": {"p0"},
        "c": {"p0", "c"},  # pending: causal among themselves
        "r1": {"p0", "c", "r1"},  # row 0: causal within row 0, sees all pending
        "r2": {"p0", "c", "r1", "r2"},
        "a0": {"p0", "c", "a0"},  # level 1 column j: pending, row0[0..j], itself
        "a1": {"p0", "c", "r1", "a1"},
        "a2": {"p0", "c", "r1", "r2", "a2"},
        "k0": {"p0", "c", "k0"},  # candidate: pending and its own earlier tokens, never the window
        "k1": {"p0", "c", "k0", "k1"},
    }
    expected = torch.tensor([[b in sees[a] for b in names] for a in names])
    assert torch.equal(lay.ancestors, expected)
    assert lay.depth.tolist() == [0, 1, 2, 3, 2, 3, 4, 2, 3]
    assert lay.keep_index.tolist() == [1, 4, 5, 6, 7, 8]
    assert lay.input_ids([10, 11], [20, 21], [[30, 31, 32]], [40, 41]) == [10, 11, 20, 21, 30, 31, 32, 40, 41]
    assert not lay.is_chain


def test_layout_two_levels_and_candidates_never_see_each_other():
    # P=1, W=2, N=4 (levels 1 and 2), two candidates of 3 tokens.
    lay = build_layout(1, [0, 1], 2, [-1, 0, 1, -1, 3, 4])
    # order: c | r1 | L1: a0 a1 | L2: b0 b1 | cand0: x0 x1 x2 | cand1: y0 y1 y2
    names = ["c", "r1", "a0", "a1", "b0", "b1", "x0", "x1", "x2", "y0", "y1", "y2"]
    sees = {
        "c": {"c"}, "r1": {"c", "r1"},
        "a0": {"c", "a0"}, "a1": {"c", "r1", "a1"},
        "b0": {"c", "a0", "b0"}, "b1": {"c", "r1", "a1", "b1"},
        "x0": {"c", "x0"}, "x1": {"c", "x0", "x1"}, "x2": {"c", "x0", "x1", "x2"},
        "y0": {"c", "y0"}, "y1": {"c", "y0", "y1"}, "y2": {"c", "y0", "y1", "y2"},
    }
    expected = torch.tensor([[b in sees[a] for b in names] for a in names])
    assert torch.equal(lay.ancestors, expected)
    assert lay.depth.tolist() == [0, 1, 1, 2, 2, 3, 1, 2, 3, 1, 2, 3]
    assert lay.keep_index.tolist() == [0, 4, 5, 6, 7, 8, 9, 10, 11]


def test_layout_column_subset_feeds_row0_prefix():
    # An LP rank computing only column 3 must still feed row 0 columns 1..3 (row 0 is causal).
    lay = build_layout(1, [3], 1)
    assert lay.row0_fed == 3
    assert lay.num_tokens == 1 + 3 + 1
    assert lay.depth.tolist() == [0, 1, 2, 3, 4]
    assert lay.keep_index.tolist() == [0, 4]


def test_layout_plain_step_is_chain_and_n2_reads_row0():
    assert build_layout(3, [], 0).is_chain
    lay = build_layout(1, [0, 1, 2], 0, [-1])  # N=2: row 0 is the last level
    assert lay.keep_index.tolist() == [0, 0, 1, 2, 3]
    with pytest.raises(ValueError, match="num_pending=0"):
        build_layout(0, [], 0)
    with pytest.raises(ValueError, match="parents must precede children"):
        build_layout(1, [], 0, [-1, 1])


# A tree with shared prefixes: c -> a -> {b, d -> e}; c -> f.  Index: a0 b1 d2 e3 f4.
TREE = [-1, 0, 0, 2, -1]


def test_tree_operations_table():
    assert children(TREE) == {-1: [0, 4], 0: [1, 2], 2: [3]} and path(TREE, 3) == [0, 2, 3]
    assert subtrees(TREE) == [[0, 1, 2, 3], [4]] and reindex(TREE, [0, 2, 3]) == (-1, 0, 1)
    assert child_tokens([7, 8, 8, 9, 7], TREE, 0) == [8]
    with pytest.raises(ValueError, match="node 3 selected without its parent 2"):
        reindex(TREE, [0, 3])
    depth, anc = ancestors(TREE)
    assert depth.tolist() == [1, 2, 2, 3, 1]
    assert anc.astype(int).tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ]


def test_tree_layout_with_window_every_pair():
    # P=1 (c), W=2, N=3 (one level), the tree above: shared prefix a fed once.
    lay = build_layout(1, [0, 1], 1, TREE)
    names = ["c", "r1", "l0", "l1", "a", "b", "d", "e", "f"]
    sees = {
        "c": {"c"}, "r1": {"c", "r1"}, "l0": {"c", "l0"}, "l1": {"c", "r1", "l1"},
        "a": {"c", "a"}, "b": {"c", "a", "b"}, "d": {"c", "a", "d"}, "e": {"c", "a", "d", "e"}, "f": {"c", "f"},
    }
    expected = torch.tensor([[b in sees[x] for b in names] for x in names])
    assert torch.equal(lay.ancestors, expected)
    assert lay.depth.tolist() == [0, 1, 1, 2, 1, 2, 2, 3, 1]
    assert lay.keep_index.tolist() == [0, 2, 3, 4, 5, 6, 7, 8]
    assert lay.tree_start == 4


def test_layout_cache_tree_block_equals_build_layout():
    cache = LayoutCache(torch.device("cpu"), torch.float32, max_entries=2)
    blocked = torch.finfo(torch.float32).min
    for parents in (TREE, [-1, 0, 1], [-1, -1], TREE):
        lay = build_layout(2, [0, 1, 2], 1, parents)
        info, depth, inner, keep = cache.get(2, [0, 1, 2], 1, parents)
        assert torch.equal(depth, lay.depth) and torch.equal(keep, lay.keep_index)
        assert torch.equal(inner, torch.zeros(inner.shape).masked_fill_(~lay.ancestors, blocked))
        assert info.tree_start == lay.tree_start and info.num_tokens == lay.num_tokens
    assert len(cache._entries) == 2  # LRU-bounded


def test_full_mask_is_float_additive():
    cache = LayoutCache(torch.device("cpu"), torch.float32)
    _, _, inner, _ = cache.get(1, (0,), 1)
    m = full_mask(inner, past_len=4)
    assert m.shape == (1, 1, 2, 6) and m.dtype == torch.float32
    blocked = torch.finfo(torch.float32).min
    assert m[0, 0].tolist() == [[0, 0, 0, 0, 0, blocked], [0, 0, 0, 0, 0, 0]]
    assert cache.get(1, (0,), 1)[2] is inner  # built once


# ---------------------------------------------------------------- n-gram pool
def test_pool_lru_cap_and_order():
    pool = NGramPool(ngram_size=3, capacity=2)
    pool.add([5, 6, 7])
    pool.add([5, 8, 9])
    assert pool.candidates(5) == [(8, 9), (6, 7)]
    pool.add([5, 6, 7])  # re-seen: moves to the newest end
    assert pool.candidates(5) == [(6, 7), (8, 9)]
    pool.add([5, 1, 2])  # full: evicts the least recently seen (8, 9)
    assert pool.candidates(5) == [(1, 2), (6, 7)]
    assert pool.candidates(6) == []
    assert len(pool) == 2


def test_pool_seeding_from_sequence():
    pool = NGramPool(ngram_size=3, capacity=4)
    pool.add_from_sequence([1, 2])  # shorter than N: nothing
    assert len(pool) == 0
    pool.add_from_sequence([1, 2, 3, 1, 2, 4])
    assert pool.candidates(1) == [(2, 4), (2, 3)]
    assert pool.candidates(2) == [(3, 1)]
    assert pool.candidates(3) == [(1, 2)]
    pool.add_from_sequence([1, 2, 3, 1, 2, 4, 9, 9], start=6)  # only n-grams completed by the last 2 tokens
    assert pool.candidates(2) == [(4, 9), (3, 1)]
    assert pool.candidates(4) == [(9, 9)]


def test_pool_rejects_bad_input():
    with pytest.raises(ValueError, match="N >= 2"):
        NGramPool(1, 3)
    with pytest.raises(ValueError, match="has 2 tokens; this pool holds N=3"):
        NGramPool(3, 3).add([1, 2])
    zero = NGramPool(3, 0)
    zero.add([1, 2, 3])
    assert zero.candidates(1) == []


# ---------------------------------------------------------------- window
def test_window_warmup_harvest_and_shift():
    win = JacobiWindow(window_size=3, ngram_size=4)  # levels 1..2
    win.reset([7, 7, 7], seed=0)
    assert win.row0 == [7, 7]
    assert win.advance(c=1, new_tokens=[10, 11, 12]) == []  # warm-up step 1
    assert win.advance(c=2, new_tokens=[20, 21, 22]) == []  # warm-up step 2: now full
    assert win.full and win.levels == [[10, 11, 12], [20, 21, 22]]
    ngrams = win.advance(c=3, new_tokens=[30, 31, 32])
    assert ngrams == [[3, 10, 20, 30], [7, 11, 21, 31], [7, 12, 22, 32]]
    assert win.row0 == [11, 12]  # level 1 moves up and drops its first token
    assert win.levels == [[20, 21, 22], [30, 31, 32]]


def test_window_n2_and_w1():
    win = JacobiWindow(3, 2)  # no levels: row 0 is the last level
    win.reset([4], seed=1)
    assert win.row0 == [4, 4] and win.full
    assert win.advance(9, [5, 6, 7]) == [[9, 5], [4, 6], [4, 7]]
    assert win.row0 == [6, 7]
    one = JacobiWindow(1, 3)
    one.reset([1, 2], seed=0)
    assert one.row0 == []
    assert one.advance(8, [3]) == []
    assert one.advance(9, [4]) == [[9, 3, 4]]
    assert one.levels == [[4]] and one.row0 == []


def test_window_reset_is_seeded_and_checks_length():
    a, b = JacobiWindow(6, 3), JacobiWindow(6, 3)
    a.reset(list(range(100)), seed=5)
    b.reset(list(range(100)), seed=5)
    assert a.row0 == b.row0 and len(a.row0) == 5
    with pytest.raises(ValueError, match="got 2 new window tokens; the window has W=6 columns"):
        a.advance(1, [1, 2])
    with pytest.raises(ValueError, match="empty prompt"):
        a.reset([], 0)


# ---------------------------------------------------------------- greedy verification
@pytest.mark.parametrize(
    "x1, tokens, parents, outs, accepted, path",
    [
        (7, [], [], [], [7], []),  # no candidates: one token
        (7, [6, 8], [-1, 0], [8, 9], [7], []),  # first token wrong
        (7, [7, 5], [-1, 0], [8, 9], [7, 8], [0]),  # one matched + bonus
        (7, [7, 8], [-1, 0], [8, 9], [7, 8, 9], [0, 1]),  # full match: path + bonus
        # tree 7 -> {3, 8 -> 2}: the argmax after 7 is 8, after 7 8 is 2, after 7 8 2 is 6
        (7, [7, 3, 8, 2], [-1, 0, 0, 2], [8, 0, 2, 6], [7, 8, 2, 6], [0, 2, 3]),
        # separate chains with a duplicated prefix: the deepest match wins, the first on ties
        (7, [7, 8, 1, 7, 8, 2], [-1, 0, 1, -1, 3, 4], [8, 5, 0, 8, 5, 0], [7, 8, 5], [0, 1]),
        (7, [7, 8, 1, 7, 8, 2], [-1, 0, 1, -1, 3, 4], [8, 2, 0, 8, 2, 4], [7, 8, 2, 4], [3, 4, 5]),
        # a verified child under an unverified parent does not count
        (7, [6, 9], [-1, 0], [9, 1], [7], []),
    ],
)
def test_greedy_verify_tree(x1, tokens, parents, outs, accepted, path):
    assert greedy_verify(x1, tokens, parents, outs) == (accepted, path)


# ---------------------------------------------------------------- stopping
class CharTokenizer:
    """Token id i decodes to chr(i); enough for stop strings."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_stop_eos_inside_run():
    s = StopChecker(100, eos_token_ids=[2, 7])
    assert s.push([5, 7, 9, 9]) == [5, 7]
    assert s.finish_reason == "stop" and s.output == [5, 7]
    assert s.push([1]) == []


def test_stop_budget_and_eos_same_step():
    s = StopChecker(3)
    assert s.push([1, 2, 3, 4, 5]) == [1, 2, 3] and s.finish_reason == "length"
    s = StopChecker(5, eos_token_ids=[2])
    assert s.push([8, 9, 2, 3, 4]) == [8, 9, 2] and s.finish_reason == "stop"
    s = StopChecker(3, eos_token_ids=[2])
    assert s.push([8, 9, 2]) == [8, 9, 2] and s.finish_reason == "stop"  # EOS wins on the last budget token


def test_stop_string_across_steps():
    nl, a, b = ord("\n"), ord("a"), ord("b")
    s = StopChecker(100, stop_strings=["\n\n"], tokenizer=CharTokenizer())
    assert s.push([a, nl]) == [a, nl] and s.finish_reason is None
    assert s.push([nl, b, b]) == [nl] and s.finish_reason == "stop"
    assert s.output == [a, nl, nl]
