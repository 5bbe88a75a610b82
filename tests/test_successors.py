"""The successor table and the tree grown from every source (lp_runtime/successors.py), with hand-written ids."""
import re

import numpy as np
import pytest
import torch

from lp_runtime.parallel import LocalGroup
from lp_runtime.tree import CandidateTree
from lp_runtime.step import StepRows
from lp_runtime.successors import (RankCalibration, RankTables, SuccessorProposer, SuccessorTable,
                                   grow_tree, tree_ranks)
from fakes import lookahead


def table_of(rows: dict, vocab: int = 20, k: int = 2) -> SuccessorTable:
    t = SuccessorTable(vocab, k)
    for tok, succ in rows.items():
        t.table[tok, : len(succ)] = succ
    return t


# ------------------------------------------------------------------------------------------------ the table
@pytest.mark.parametrize("tokens, rows, expected", [
    ([3], [[1, 2]], {3: [1, 2], 4: []}),
    ([3, 4, 3], [[1, 2], [5, 6], [7, 8]], {3: [7, 8], 4: [5, 6]}),       # the later row of a token wins
    ([3, 3, 3], [[1, 2], [5, 6], [7, 8]], {3: [7, 8]}),
    ([5], [[1, 2, 9]], {5: [1, 2]}),                                      # extra columns ignored
    ([], np.zeros((0, 2)), {3: []}),
])
def test_table_update(tokens, rows, expected):
    t = SuccessorTable(10, k=2)
    t.update(tokens, rows)
    assert {tok: t.successors(tok) for tok in expected} == expected


def test_table_keeps_the_newest_row_across_updates_and_bounded_memory():
    t = SuccessorTable(49152, k=8)
    assert t.table.dtype == np.int32 and t.table.nbytes == 49152 * 8 * 4  # 1.5 MB
    t.update([7], [[1, 2, 3, 4, 5, 6, 8, 9]])
    t.update([7, 8], [[9, 8, 6, 5, 4, 3, 2, 1], [0] * 8])
    assert t.successors(7) == [9, 8, 6, 5, 4, 3, 2, 1] and t.successors(8) == [0] * 8 and t.updates == 2


@pytest.mark.parametrize("tokens, rows, message", [
    ([1, 2], [[1, 2]], r"update: 2 tokens and successors of shape \(1, 2\); need \(2, >= 2\)"),
    ([1], [[1]], r"update: 1 tokens and successors of shape \(1, 1\); need \(1, >= 2\)"),
    ([10], [[1, 2]], r"update: token ids must be in 0..9"),
    ([1], [[1, -1]], r"update: token ids must be in 0..9"),
])
def test_table_update_refuses(tokens, rows, message):
    with pytest.raises(ValueError, match=message):
        SuccessorTable(10, k=2).update(tokens, rows)


def test_table_update_only_empty_keeps_rows_already_computed():
    t = SuccessorTable(10, k=2)
    t.update([3], [[1, 2]])
    t.update([3, 4, 5, 4], [[5, 6], [7, 8], [9, 0], [9, 1]], only_empty=True)  # 3 keeps its row; 4's later row wins
    assert [t.successors(i) for i in (3, 4, 5, 6)] == [[1, 2], [9, 1], [9, 0], []] and t.updates == 2
    t.update([3, 4, 5], [[1, 1], [2, 2], [3, 3]], only_empty=True)  # nothing empty left: nothing written
    assert [t.successors(i) for i in (3, 4, 5)] == [[1, 2], [9, 1], [9, 0]] and t.updates == 2
    with pytest.raises(ValueError, match=r"update\(only_empty=True\) is for a context-1 table"):
        SuccessorTable(10, k=2, context=2, slots=16).update([3], [[1, 2]], prev=[4], only_empty=True)


@pytest.mark.parametrize("args, kw, bad", [((0,), {}, "vocab_size=0, k=8, context=1"), ((5, 0), {}, "k=0"),
                                           ((5,), {"context": 3}, "context=3"), ((5,), {"slots": 24}, "slots=24")])
def test_table_refuses_bad_shape(args, kw, bad):
    with pytest.raises(ValueError, match=rf"SuccessorTable\(.*{bad}.*\): need vocab_size, k >= 1, context 1 or 2 "
                       "and slots a power of two >= 2"):
        SuccessorTable(*args, **kw)


def test_pair_table_keys_by_the_last_two_tokens():
    t = SuccessorTable(49152, k=2, context=2, slots=1 << 10)
    t.update([3, 3, 4, 5], [[1, 2], [5, 6], [7, 8], [9, 9]], prev=[7, 8, 3, -1])  # prev -1: no context, skipped
    assert (t.successors(3, 7), t.successors(3, 8), t.successors(4, 3)) == ([1, 2], [5, 6], [7, 8])
    assert (t.successors(3, 9), t.successors(3), t.successors(5, 0), t.successors(5)) == ([], [], [], [])
    t.update([3, 3], [[4, 4], [6, 6]], prev=[7, 7])  # the same pair twice: the later row wins
    assert t.successors(3, 7) == [6, 6] and t.table.shape == (1 << 10, 2) and t.updates == 2
    # the last pair of the vocabulary hashes into range and is found again
    t.update([49151], [[0, 1]], prev=[49151])
    assert t.successors(49151, 49151) == [0, 1]


# ------------------------------------------------------------------------------------------------ calibration
def test_rank_calibration_learns_per_depth_and_rank():
    cal = RankCalibration(prior=(0.5, 0.25), strength=2.0, max_depth=2)
    assert (cal.estimate(1, 0), cal.estimate(1, 1), cal.estimate(5, 7)) == (0.5, 0.25, 0.25)
    for hit in (True, True):
        cal.update(1, 0, hit)
    cal.update(3, 1, False)  # depth 3 -> bucket 2
    assert cal.estimate(1, 0) == 0.75 and cal.estimate(2, 1) == pytest.approx(0.5 / 3) and cal.estimate(2, 0) == 0.5


# ------------------------------------------------------------------------------------------------ growth
def flat(prob=0.5):
    return RankCalibration(prior=(prob, prob / 2), strength=1.0)


def test_grow_from_the_table_alone_is_best_first():
    # the module docstring's example: 5 -> [6, 7], 6 -> [8]
    g = grow_tree(5, None, table_of({5: [6, 7], 6: [8]}), 3, succ_cal=flat())
    assert (g.tree.tokens, g.tree.parents, g.succ_rank) == ([6, 7, 8], [-1, -1, 0], [0, 1, 0])
    assert g.tree.prob == [0.5, 0.25, 0.5] and g.suffix_raw == [None, None, None]


def test_grow_budget_depth_and_width():
    table = table_of({1: [2, 3], 2: [2, 4], 3: [5]}, k=2)
    assert grow_tree(1, None, table, 0).tree.tokens == []
    g = grow_tree(1, None, table, 10, succ_cal=flat(), max_depth=2)
    assert max(g.tree.depths()) == 2 and g.tree.tokens == [2, 3, 2, 4, 5]  # ties: pushed first
    g = grow_tree(1, None, table, 10, succ_cal=flat(), max_depth=3, width=1)
    assert (g.tree.tokens, g.tree.parents) == ([2, 2, 2], [-1, 0, 1])  # one successor per node: a chain


def test_grow_merges_a_token_both_sources_propose():
    # suffix: root -> 6 (raw 0.9) -> 9 (0.9); table: 5 -> [6, 7]; 6 -> [8]
    suffix = CandidateTree(tokens=[6, 9], parents=[-1, 0], prob=[0.9, 0.9])
    g = grow_tree(5, suffix, table_of({5: [6, 7], 6: [8]}), 5, succ_cal=flat(0.2))
    assert g.tree.tokens[0] == 6 and g.suffix_raw[0] == 0.9 and g.succ_rank[0] == 0  # one node, both sources
    assert g.tree.tokens.count(6) == 1
    # the suffix chain keeps its child 9 (estimated above the table's 8), then the table fills in
    assert g.tree.tokens[:2] == [6, 9] and g.tree.parents[:2] == [-1, 0]
    assert sorted(g.tree.tokens) == [6, 7, 8, 9] and g.succ_rank[g.tree.tokens.index(9)] is None


def test_grow_continues_a_suffix_chain_from_the_table():
    suffix = CandidateTree(tokens=[6], parents=[-1], prob=[0.9])
    g = grow_tree(5, suffix, table_of({6: [8]}), 3, succ_cal=flat())
    assert (g.tree.tokens, g.tree.parents) == ([6, 8], [-1, 0])  # 5 has no row; 8 has no row: 2 nodes only


def test_grow_takes_the_pair_tables_row_of_each_nodes_context():
    # token table: 5 -> [6], 6 -> [8]; pair table: (4, 5) -> [7], (5, 7) -> [9]; the root 5 follows 4
    pair = SuccessorTable(20, k=1, context=2, slots=64)
    pair.update([5, 7], [[7], [9]], prev=[4, 5])
    cal = flat(0.5)
    for hit in (True,) * 8:  # the pair table's rank-0 successors were accepted, the token table's alone never
        cal.update(1, (None, 0), hit)
        cal.update(1, (0, None), not hit)
    assert cal.estimate(1, (None, 0)) == pytest.approx(8.5 / 9) and cal.estimate(1, (0, 0)) == 0.5
    g = grow_tree(5, None, table_of({5: [6], 6: [8]}, k=1), 4, succ_cal=cal, pair=pair, root_prev=4)
    assert (g.tree.tokens, g.tree.parents) == ([7, 9, 6, 8], [-1, 0, -1, 2])
    assert (g.pair_rank, g.succ_rank) == ([0, 0, None, None], [None, None, 0, 0])
    assert grow_tree(5, None, None, 4, pair=pair, root_prev=3).tree.tokens == []  # (3, 5) never computed


def _grow_plainly(root, suffix, table, budget, suffix_cal, succ_cal, max_depth, width, pair, root_prev):
    """grow_tree's specification, written plainly: every child of every node taken is pushed (no pruning)."""
    import heapq
    from lp_runtime.tree import children

    kids = children(suffix.parents) if suffix is not None else {}
    tree, info, heap, counter = CandidateTree(), [], [], 0

    def push(parent, token, prev, depth, path_p, s_node):
        nonlocal counter
        cand = {}  # token -> [estimate, suffix node, suffix raw, rank, pair rank]
        for s in kids.get(s_node, ()) if (s_node >= 0 or parent < 0) else ():
            cand[suffix.tokens[s]] = [suffix_cal.estimate(depth, suffix.prob[s]), s, suffix.prob[s], None, None]
        for i, tab in enumerate((table, pair)):
            for rank, t in enumerate(tab.successors(token, prev)[:width] if tab is not None else ()):
                cand.setdefault(t, [0.0, -1, None, None, None])[3 + i] = rank
        for t, c in cand.items():
            if c[3] is not None or c[4] is not None:
                c[0] = max(c[0], succ_cal.estimate(depth, c[3] if pair is None else (c[3], c[4])))
            heapq.heappush(heap, (-path_p * c[0], counter, t, parent, depth, c))
            counter += 1

    push(-1, root, root_prev, 1, 1.0, -1)
    while heap and len(tree) < budget:
        neg_p, _, t, parent, depth, (est, s, raw, rank, pair_rank) = heapq.heappop(heap)
        node = tree.append(t, parent, est)
        info.append((raw, rank, pair_rank))
        if depth < max_depth:
            push(node, t, tree.tokens[parent] if parent >= 0 else root, depth + 1, -neg_p, s)
    return tree, info


@pytest.mark.parametrize("grow", ["_grow_heap", "_grow_arrays", "grow_tree"])
@pytest.mark.parametrize("seed", range(12))
def test_grow_tree_equals_its_plain_specification_on_random_sources(seed, grow):
    """grow_tree's two ways (a heap for small trees; arrays, the best open nodes at a time, pruned, for LP's large
    ones) and its choice between them: on random token / pair / per-rank tables over a small vocabulary (many ties
    and repeats), random suffix trees (independent chains too, which repeat tokens) and trained calibrations, the
    trees equal the plain best-first growth node for node, estimates and sources included."""
    from lp_runtime import successors
    from lp_runtime.policy import AcceptanceCalibration
    from lp_runtime.tree import children

    def grown(root, suffix, table, budget, suffix_cal, succ_cal, max_depth, width, pair, root_prev):
        if grow == "grow_tree":
            return grow_tree(root, suffix, table, budget, suffix_cal=suffix_cal, succ_cal=succ_cal,
                             max_depth=max_depth, width=width, pair=pair, root_prev=root_prev)
        kids = children(suffix.parents) if suffix is not None else {}
        return getattr(successors, grow)(root, suffix, kids, table, pair, budget, suffix_cal, succ_cal, max_depth,
                                         width, root_prev)

    rng = np.random.default_rng(seed)
    vocab, k = 12, 4
    table = RankTables(vocab, k, ranks=3) if seed % 2 else SuccessorTable(vocab, k)
    pair = SuccessorTable(vocab, k, context=2, slots=64) if seed % 3 else None
    for _ in range(3):
        n = 30
        toks, rows = rng.integers(0, vocab, n), np.stack([rng.permutation(vocab)[:k] for _ in range(n)])
        if isinstance(table, RankTables):
            table.update(toks, rows, owners=rng.integers(-1, 3, n))
        else:
            table.update(toks, rows)
        if pair is not None:
            pair.update(toks, rows, prev=rng.integers(-1, vocab, n))
    succ_cal, suffix_cal = RankCalibration(max_depth=3), AcceptanceCalibration(max_depth=3)
    for _ in range(200):
        depth, raw = int(rng.integers(1, 6)), float(rng.random())
        rank = int(rng.integers(0, k)) if pair is None else (int(rng.integers(0, k)), int(rng.integers(0, k)))
        succ_cal.update(depth, rank, bool(rng.random() < 0.4))
        suffix_cal.update(depth, raw, bool(rng.random() < 0.5))
    largest = 0
    for trial in range(6):
        size = int(rng.integers(0, 25))
        parents = [int(rng.integers(-1, i)) if i else -1 for i in range(size)]
        suffix = CandidateTree([int(t) for t in rng.integers(0, vocab, size)], parents,
                               [float(p) for p in rng.random(size)]) if trial % 3 else None
        root, prev = int(rng.integers(0, vocab)), int(rng.integers(-1, vocab))
        kw = dict(suffix_cal=suffix_cal, succ_cal=succ_cal, max_depth=int(rng.integers(3, 9)),
                  width=int(rng.integers(1, k + 2)), pair=pair, root_prev=prev)
        for budget in (0, 1, 7, 40, 300):
            got = grown(root, suffix, table, budget, kw["suffix_cal"], kw["succ_cal"], kw["max_depth"], kw["width"],
                        pair, prev)
            tree, info = _grow_plainly(root, suffix, table, budget, kw["suffix_cal"], kw["succ_cal"],
                                       kw["max_depth"], kw["width"], pair, prev)
            assert (got.tree.tokens, got.tree.parents, got.tree.prob) == (tree.tokens, tree.parents, tree.prob)
            assert list(zip(got.suffix_raw, got.succ_rank, got.pair_rank)) == info
            largest = max(largest, len(tree))
    assert largest > 100  # real trees, many levels deep


def test_grow_refuses_negative_budget():
    with pytest.raises(ValueError, match=r"grow_tree\(budget=-1\): the node budget must be >= 0"):
        grow_tree(1, None, None, -1)


# ------------------------------------------------------------------------------------------------ proposer
def rows_of(tokens, topk, nodes=()):
    return StepRows(list(tokens), torch.tensor(topk, dtype=torch.int64), tuple(nodes))


def test_proposer_learns_from_trials_only_and_writes_the_accepted_path_last():
    prop = SuccessorProposer(20, 4, k=2)
    prop.table.table[5] = [6, 7]
    prop.table.table[6] = [8, 9]
    prop.begin([1, 5], do_sample=False)
    tree = prop.propose()
    assert (tree.tokens, tree.parents) == ([6, 8, 7, 9], [-1, 0, -1, 0])
    assert tree.calibrated  # its estimates are learned here (succ_cal, suffix_cal): the cost policy takes them as is
    # accepted 6 then the bonus 3: node 0 hit, 8 and 9 (children of 6) and 7 are failed trials
    # rows: c = 5, then nodes 0..3 (tokens 6, 8, 7, 9)
    prop.observe([6, 3], [], rows_of([5, 6, 8, 7, 9], [[6, 1], [3, 2], [4, 4], [5, 5], [6, 6]]))
    assert prop.succ_cal.trials == {(1, 0): 1, (1, 1): 1, (2, 0): 1, (2, 1): 1}
    assert prop.succ_cal.successes == {(1, 0): 1, (1, 1): 0, (2, 0): 0, (2, 1): 0}
    assert [prop.table.successors(t) for t in (5, 6, 7, 8, 9)] == [[6, 1], [3, 2], [5, 5], [4, 4], [6, 6]]
    assert prop.propose().tokens == []  # the next root is the bonus token 3, which has no row yet
    # the policy fed only nodes 0 and 1 (rows.nodes): 7 and 9 were no trials
    prop.begin([1, 5], do_sample=False)
    prop.propose()
    prop.observe([7, 2], [], rows_of([5, 6, 3], [[6, 1], [3, 2], [0, 1]], nodes=(0, 1)))
    assert prop.succ_cal.trials[(1, 0)] == 2 and prop.succ_cal.trials[(2, 0)] == 1


def test_accepted_path_rows_win_over_a_rejected_branch_with_the_same_token():
    prop = SuccessorProposer(20, 4, k=1)
    prop.table.table[5] = [6]
    prop.table.table[6] = [6]  # 5 -> 6 -> 6 -> 6 ...: three nodes with token 6
    prop.begin([5], do_sample=False)
    assert prop.propose().tokens == [6, 6, 6, 6]
    # accepted 6 6 + bonus: rows of nodes 0, 1 are the path; node 2's (also token 6) is written first
    prop.observe([6, 6, 1], [], rows_of([5, 6, 6, 6, 6], [[6], [2], [3], [4], [9]]))
    assert prop.table.successors(6) == [3]  # node 1's row (the deepest path node), not node 3's [9]


def test_sampled_calls_use_a_table_of_their_own_and_reset_empties_the_table():
    prop = SuccessorProposer(20, 2, k=1)
    prop.table.table[5] = [6]
    prop.begin([5], do_sample=True)
    assert prop.propose().tokens == []
    prop.observe([7, 1], [], rows_of([5], [[9]]))
    assert prop.table.successors(5) == [6]  # the job's table is untouched by a sampled call
    prop.begin([5], do_sample=False)
    assert prop.propose().tokens == [6]
    prop.reset()
    assert prop.table.successors(5) == [] and prop.propose().tokens == []


def test_proposer_writes_pair_rows_in_each_rows_context():
    prop = SuccessorProposer(20, 4, k=1, context=2)
    prop.table.table[5] = [6]
    prop.table.table[6] = [8]
    prop.begin([1, 5], do_sample=False)
    assert prop.propose().tokens == [6, 8]
    # rows: c = 5 (after 1), one window cell 9 (no context: not in the pair table), nodes 6 (after 5), 8 (after 6)
    prop.observe([6, 3], [], rows_of([5, 9, 6, 8], [[6], [2], [3], [4]], nodes=(0, 1)))
    assert [prop.pair.successors(t, p) for t, p in ((5, 1), (6, 5), (8, 6), (9, 5))] == [[6], [3], [4], []]
    assert prop.succ_cal.trials == {(1, (0, -1)): 1, (2, (0, -1)): 1}  # (token rank, pair rank): no pair row yet
    assert (prop._prev, prop._root) == (6, 3)  # the next root 3 follows 6
    prop.reset()
    assert prop.pair.successors(5, 1) == [] and prop.table.successors(5) == []


def test_proposer_prefill_rows_fill_only_empty_rows():
    prop = SuccessorProposer(20, 4, k=2, prefill=True)
    assert prop.prefill_topk == 2 and SuccessorProposer(20, 4, k=2).prefill_topk == 0
    prop.table.update([3], [[1, 2]])  # a row computed in an earlier answer
    prop.begin([3, 4, 5], do_sample=False)
    prop.observe_prefill(StepRows([3, 4], torch.tensor([[7, 8, 9], [9, 1, 2]])))
    assert [prop.table.successors(t) for t in (3, 4, 5)] == [[1, 2], [9, 1], []]
    prop.begin([4, 6], do_sample=True)  # a sampled call fills its own table
    prop.observe_prefill(StepRows([4], torch.tensor([[5, 6]])))
    assert prop._table.successors(4) == [5, 6] and prop.table.successors(4) == [9, 1]


def test_rank_tables_keep_each_ranks_rows_apart_and_the_path_in_all():
    prop = SuccessorProposer(20, 4, k=1, lp_size=2, rank_tables=True)
    assert isinstance(prop.table, RankTables) and len(prop.table.tables) == 2
    assert not SuccessorProposer(20, 4, k=1, rank_tables=True).rank_tables  # one process: one table
    for table in prop.table.tables:
        table.table[5], table.table[6], table.table[7] = [6], [8], [9]
    prop.begin([1, 5], do_sample=False)
    prop.table.tables[1].table[5] = [7]  # 5's row: [6] (rank 0's table), then [7] (rank 1's)
    tree = prop.propose()
    assert (tree.tokens, tree.parents) == ([6, 8, 7, 9], [-1, 0, -1, 2])
    assert tree_ranks(tree.parents, 2) == [0, 0, 1, 1]  # the chains 6-8 and 7-9 on one rank each
    # accepted 6 and the bonus 3: c's and node 0's rows (the path) go to both tables, node 1's to rank 0's,
    # nodes 2's and 3's to rank 1's
    prop.observe([6, 3], [], rows_of([5, 6, 8, 7, 9], [[11], [12], [13], [14], [15]]))
    assert [t.successors(x) for t in prop.table.tables for x in (5, 6, 7, 8, 9)] == [
        [11], [12], [9], [13], [], [11], [12], [14], [], [15]]
    assert prop.table.successors(7) == [9, 14] and prop.table.successors(9) == [15]
    with pytest.raises(ValueError, match=r"^RankTables\(ranks=0\): need ranks >= 1$"):
        RankTables(20, 1, 0)


@pytest.mark.parametrize("kwargs, why", [
    (dict(budget=-3), "budget=-3 (need an int >= 0)"),
    (dict(context=3), "context=3 (need one of 1, 2)"),
    (dict(context=True), "context=True (need one of 1, 2)"),  # True == 1 was taken as the token table
    (dict(lp_size=0, rank_budget=0), "lp_size=0 (need an int >= 1); rank_budget=0 (need None or an int >= 1)"),
    (dict(rank_budget=1.5), "rank_budget=1.5 (need None or an int >= 1)"),
    (dict(k=2.5, width="8"), "k=2.5 (need an int >= 1); width='8' (need an int >= 1)"),
    (dict(prefill="false"), "prefill='false' (need True or False)"),  # a truthy string turned prefill on
    (dict(k=11), "k=11 (need at most the vocabulary, 10)"),
])
def test_proposer_refuses_bad_arguments(kwargs, why):
    """Wrong types were taken silently through lp_scaling's --set (context true, rank_budget 1.5, "false"; a new
    user, 2026-12-07): every bad argument is named, with what is allowed."""
    args = {"budget": 4, **kwargs}
    with pytest.raises(ValueError, match=f"^SuccessorProposer: {re.escape(why)}$"):
        SuccessorProposer(10, args.pop("budget"), **args)


def test_rank_cap_keeps_the_longest_prefix_within_every_ranks_budget():
    from lp_runtime.parallel import max_rank_tokens

    table = SuccessorTable(10, k=3)
    table.update(range(10), [[(t + 1) % 10, (t + 2) % 10, (t + 3) % 10] for t in range(10)])
    full = SuccessorProposer(10, 40, width=3)
    full.table = full._table = table
    full.begin([0], do_sample=False)
    tree = full.propose()
    assert len(tree) == 40 and max_rank_tokens(0, 0, 0, tree.parents, 4) == 12
    for cap, kept in ((12, 40), (10, 35), (4, 12)):
        capped = SuccessorProposer(10, 40, width=3, lp_size=4, rank_budget=cap)
        capped.table = capped._table = table
        capped.begin([0], do_sample=False)
        got = capped.propose()
        assert got.parents == tree.parents[:kept] and got.tokens == tree.tokens[:kept]
        assert max_rank_tokens(0, 0, 0, got.parents, 4) <= cap
        assert kept == 40 or max_rank_tokens(0, 0, 0, tree.parents[:kept + 1], 4) > cap  # the longest such prefix
        assert len(capped._last.succ_rank) == kept  # what observe learns from is cut the same way


@pytest.mark.parametrize("seed", range(6))
def test_longest_tree_prefix_is_the_binary_search_over_plans(seed):
    """cap_ranks' search plans every probed prefix on the whole tree's preorder: on random trees (deep chains,
    wide roots) it finds the same prefix as probing max_rank_tokens (tree_plan) on each prefix."""
    from lp_runtime.parallel import longest_tree_prefix, max_rank_tokens

    rng = np.random.default_rng(seed)
    for _ in range(20):
        n, world = int(rng.integers(0, 120)), int(rng.integers(1, 9))
        parents = [int(rng.integers(max(-1, i - 3), i)) if rng.random() < 0.7 else int(rng.integers(-1, i))
                   for i in range(n)]
        for budget in (1, 3, 8, 20, 200):
            fits = [m for m in range(n + 1) if max_rank_tokens(0, 0, 0, parents[:m], world) <= budget]
            assert longest_tree_prefix(parents, world, budget) == max(fits)


# ------------------------------------------------------------------------------------------------ the product option
class _Ranks(LocalGroup):  # the LP degree, as Decoder.__init__ reads a group (decodes under real ranks: test_lp_auto.py)
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size


def _table_of(proposers) -> tuple:
    """(class, budget, rank_budget, width, context, k, prefill_topk, rank_tables, the suffix proposer's
    store_min_key) of a decoder's single proposer."""
    (p,) = proposers
    if not isinstance(p, SuccessorProposer):
        return (type(p).__name__,)
    return (type(p).__name__, p.budget, p.rank_budget, p.width, p.context, p.k, p.prefill_topk, p.rank_tables,
            p.suffix.store_min_key)


@pytest.mark.parametrize("setting, lp, expected", [
    # decoding=lookahead (0, 4, 2): one rank feeds the suffix proposer's 10-node cap + 1 = 11 tree nodes
    (dict(method="lookahead"), 1, ("SuffixProposer",)),                           # auto, one process: off
    (dict(method="lookahead"), 2, ("SuccessorProposer", 22, 11, 16, 2, 16, 0, True, 3)),  # auto under LP: K x 11 nodes
    (dict(method="lookahead"), 8, ("SuccessorProposer", 88, 11, 16, 2, 16, 0, True, 3)),
    (dict(method="lookahead", successors=False), 8, ("SuffixProposer",)),
    # one process, a small tree: the token table, top 8, width 8, with the prompt's rows at prefill
    (dict(method="lookahead", successors=True), 1, ("SuccessorProposer", 11, 11, 8, 1, 8, 8, False, 1)),
    (dict(method="auto", window_size=0, successors=True), 1, ("SuccessorProposer", 25, 25, 8, 1, 8, 8, False, 1)),
    # decoding=auto (0, 6, 4), max_depth 24: 25 nodes a rank, the cost policy feeds what pays of them
    (dict(method="auto", window_size=0), 4, ("SuccessorProposer", 100, 25, 16, 2, 16, 0, True, 3)),
    (dict(method="auto", window_size=0), 1, ("SuffixProposer",)),
    (dict(method="paper"), 8, ("PoolProposer",)),                                 # the published algorithm
])
def test_decoder_builds_the_table_as_decoding_successors_says(setting, lp, expected):
    from fakes import llama

    from lp_runtime.config import DecodingConfig
    from lp_runtime.decoder import Decoder
    from lp_runtime.policy import CostPolicy
    from lp_runtime.successors import successor_proposers

    cfg = DecodingConfig(**setting)
    policy = CostPolicy({1: 1.0, 64: 1.0}) if cfg.method == "auto" else None
    assert _table_of(Decoder(llama(), cfg, lp=_Ranks(lp), step_policy=policy).proposers) == expected
    assert _table_of(successor_proposers(cfg, 96, lp_size=lp, table=None)) == expected  # a process simulating K
    if expected[0] == "SuffixProposer":  # table=True (the bench's lever, lp_scaling.py): the product's values
        assert _table_of(successor_proposers(cfg, 96, lp_size=lp))[0] == "SuccessorProposer"


def test_docstring_examples():
    import doctest

    import lp_runtime.successors

    result = doctest.testmod(lp_runtime.successors)
    assert result.failed == 0 and result.attempted >= 18


def test_product_table_levers_and_greedy():
    from lp_runtime.config import DecodingConfig
    from lp_runtime.successors import successor_proposers

    look = DecodingConfig(method="lookahead", ngram_size=5, guess_set_size=15, max_depth=10, successors=True)
    (p,) = successor_proposers(look, 96, lp_size=8, budget=79, width=8, rank_budget=None)
    assert (p.budget, p.rank_budget, p.width, p.suffix.num_leaves, p.suffix.max_depth) == (632, None, 8, 15, 10)
    assert p.suffix.store_min_key == 3  # TABLE_STORE_MIN_KEY beside a large tree; a lever sets another
    assert successor_proposers(look, 96, lp_size=8, store_min_key=1)[0].suffix.store_min_key == 1
    # one process: SMALL_TABLE's 1 up to SMALL_TREE (32) nodes a step, TABLE_STORE_MIN_KEY above
    assert [successor_proposers(look, 96, budget=b)[0].suffix.store_min_key for b in (32, 33)] == [1, 3]
    for bad in (0, "4", None, 2.5):
        with pytest.raises(ValueError,
                           match=rf"^successor_proposers: store_min_key={re.escape(repr(bad))} \(need an int >= 1\)$"):
            successor_proposers(look, 96, lp_size=8, store_min_key=bad)
    for bad, why in ((dict(lp_size="2"), "lp_size='2' (need an int >= 1)"),
                     (dict(budget=1.5), "budget=1.5 (need None or an int >= 1)"),
                     (dict(table="yes", lp_size=0), "lp_size=0 (need an int >= 1); table='yes' (need one of True, "
                                                    "None, False)")):
        with pytest.raises(ValueError, match=f"^successor_proposers: {re.escape(why)}$"):
            successor_proposers(look, 96, **bad)
    assert successor_proposers(DecodingConfig(method="greedy", successors=True), 96, lp_size=8) == []
    assert successor_proposers(look, 8, lp_size=2)[0].k == 8  # a vocabulary smaller than the top-16
    with pytest.raises(ValueError, match=r"^successor_proposers: the successor table needs the model's vocabulary "
                                         r"size \(checks.vocab_size\(model\) gave None\)$"):
        successor_proposers(look, None)


# ------------------------------------------------------------------------------------------------ the decoder
@pytest.mark.parametrize("w, n, g, budget, context, prefill", [
    (0, 4, 2, 11, 1, False), (3, 4, 3, 20, 1, False), (0, 3, 0, 6, 1, False), (0, 4, 2, 11, 2, False),
    (3, 4, 3, 20, 2, False), (0, 4, 2, 11, 1, True), (0, 3, 0, 6, 1, True)])
def test_greedy_with_the_successor_proposer_equals_transformers(w, n, g, budget, context, prefill):
    from exactness import hf_greedy
    from fakes import llama

    from lp_runtime.decoder import Decoder
    from lp_runtime.proposers import AnswerStore, SuffixProposer

    model = llama()
    suffix = SuffixProposer(n, g, store=AnswerStore()) if g else None
    prop = SuccessorProposer(96, budget, suffix=suffix, context=context, prefill=prefill)
    dec = Decoder(model, lookahead(window_size=w, ngram_size=n, guess_set_size=max(g, 1)), proposers=[prop])
    for prompt in ([1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8, 9, 7]):
        out = dec.generate(prompt, max_new_tokens=40)
        assert out.output_ids == hf_greedy(model, prompt, 40)
        assert out.decoding_steps < 40  # the table proposes from the second prompt's first step on
    assert prop.table.updates > 0 and sum(prop.succ_cal.trials.values()) > 0
    assert context == 1 or (prop.pair.updates > 0 and any(isinstance(r, tuple) and r[1] >= 0
                                                          for _, r in prop.succ_cal.trials))


@pytest.mark.parametrize("rows", [3, 256])
def test_prefill_topk_is_the_models_top_ids_of_the_prompts_last_rows(rows):
    from fakes import llama

    from lp_runtime.step import EagerStep

    model, ids = llama(), [5, 9, 1, 33, 9, 70, 2]
    step = EagerStep(model)
    plain, kept = step.new_cache(), step.new_cache()
    assert step.prefill(plain, ids) is None
    top = step.prefill(kept, ids, topk=4, rows=rows)
    n = min(rows, len(ids))
    with torch.inference_mode():
        expected = torch.topk(model(torch.tensor([ids])).logits[0, -n:], 4, dim=-1).indices
    assert top.dtype == torch.int64 and top.tolist() == expected.tolist()
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(plain.layers, kept.layers))
    assert step.prefill(step.new_cache(), [], topk=4).shape == (0, 4)


def test_decoder_writes_the_prompts_rows_at_prefill_into_empty_rows():
    """Budget 0 and one new token: the only rows are the prefill's (prompt[:-1]; the one step ends the call before
    its row at c = 2 is observed)."""
    from exactness import hf_greedy
    from fakes import llama

    from lp_runtime.decoder import Decoder

    model, prompt = llama(), [5, 9, 1, 33, 9, 70, 2]
    prop = SuccessorProposer(96, 0, k=3, prefill=True)
    prop.table.update([1], [[4, 4, 4]])  # computed before: kept
    out = Decoder(model, lookahead(), proposers=[prop]).generate(prompt, max_new_tokens=1)
    assert out.output_ids == hf_greedy(model, prompt, 1)
    with torch.inference_mode():
        top = torch.topk(model(torch.tensor([prompt])).logits[0], 3, dim=-1).indices.tolist()
    expected = {5: top[0], 9: top[4], 33: top[3], 70: top[5], 2: [], 1: [4, 4, 4]}  # 9: its later row
    assert {t: prop.table.successors(t) for t in expected} == expected


# ------------------------------------------------------------------------------------------------ LP
# K = 3 and K = 2 real ranks with the successor proposer (same tokens and steps as one process, one exchange a step):
# tests/test_parallel.py's SUCC_CONFIGS, decoded in its lp3 and dp2 x lp2 launches.


# ------------------------------------------------------------------------------------------------ sampling
def test_sampling_law_is_exact_on_trees_with_successor_nodes():
    """Lookahead sampling whose trees hold successor-table nodes keeps the model's law (paper appendix B; the
    statistical test of tests/test_sampling.py). The job's table is kept across the seeds (table_when_sampling),
    so from the second call on the table proposes; each call's uniforms are its own, so the outputs stay iid."""
    from dataclasses import replace

    from test_sampling import ALPHA, chi2_pvalue, exact_joint

    from fakes import build_tiny8
    from lp_runtime.config import SamplingConfig
    from lp_runtime.decoder import Decoder
    from lp_runtime.proposers import SuffixProposer

    model, prompt, length, n = build_tiny8(), [1, 2, 3, 5, 3, 4, 1, 2, 3], 3, 1000
    prop = SuccessorProposer(8, 6, suffix=SuffixProposer(3, 1), k=3, table_when_sampling=True)
    dec = Decoder(model, lookahead(window_size=0, ngram_size=3, guess_set_size=1), proposers=[prop])
    cfg, counts, multi = SamplingConfig(temperature=1.0), {}, 0
    for s in range(n):
        out = dec.generate(prompt, max_new_tokens=length, sampling=replace(cfg, seed=s))
        counts[tuple(out.output_ids)] = counts.get(tuple(out.output_ids), 0) + 1
        multi += max(out.accept_lengths) > 1
    table_hits = sum(prop.succ_cal.successes.values())
    assert multi > n // 10 and table_hits > n // 10, (multi, table_hits)  # successor nodes were accepted
    pval, df = chi2_pvalue(counts, exact_joint(model, prompt, cfg, length))
    assert pval > ALPHA, f"chi-square p={pval:.2g} (df={df}), multi-token runs {multi}/{n}"


# ------------------------------------------------------------------------------------------------ LP plan
def test_tree_plan_splits_a_heavy_subtree_repeating_its_ancestor_chain():
    from lp_runtime.parallel import _global_rows, max_rank_tokens, tree_plan

    parents = [-1, 0, 1, 1, -1]  # 0 -> 1 -> {2, 3}; 4
    assert tree_plan(1, 0, 0, parents, 2) == (((), (0, 1, 2, 3)), ((), (4,)))
    assert tree_plan(1, 0, 0, parents, 3) == (((), (0, 1, 2)), ((), (0, 1, 3)), ((), (4,)))  # 0 -> 1 fed twice
    assert max_rank_tokens(1, 0, 0, parents, 3) == 4  # subtrees whole: 1 + 4 on one rank
    # a successor-table tree: one deep first child holding most nodes, over 4 ranks
    table_tree = [-1, 0, 0, 0, 0, 1, 1, 2, 2, 3, 4, -1]
    plan = tree_plan(1, 0, 0, table_tree, 4)
    assert plan == (((), (0, 1, 5, 6)), ((), (0, 2, 7, 8)), ((), (0, 3, 4, 9)), ((), (0, 4, 10, 11)))
    assert max_rank_tokens(1, 0, 0, table_tree, 4) == 5  # root subtrees whole: 1 + 11 on one rank
    # the top-k rows of a duplicated node come from the last rank that holds it; c from rank 0
    plans = tree_plan(1, 0, 0, parents, 3)
    gathered = torch.zeros(3, 4, 3, dtype=torch.int64)
    for r, (_, nodes) in enumerate(plans):
        gathered[r, 0, 1:] = 100 + r
        for i, n in enumerate(nodes):
            gathered[r, 1 + i, 1:] = 10 * n + r
    assert _global_rows(gathered, plans, 0, 5)[:, 1:].tolist() == [
        [100, 100], [1, 1], [11, 11], [20, 20], [31, 31], [42, 42]]


@pytest.mark.parametrize("setting, lp, budget, depth", [
    (dict(method="auto", guess_set_size=0, successors=True), 1, 25, 24),              # max_depth 24 + 1, one process
    (dict(method="auto", guess_set_size=0, successors=True, max_depth=40), 1, 41, 40),  # as deep as a suffix lookup
    (dict(method="lookahead", window_size=3, guess_set_size=0, successors=True), 1, 11, 16),
    (dict(method="lookahead", window_size=0, guess_set_size=0, successors=True), 1, 11, 16),  # was "nothing to do"
    (dict(method="lookahead", window_size=3, guess_set_size=0), 2, 22, 16),            # auto under LP: K x 11
])
def test_g0_with_the_table_on_is_the_table_alone(setting, lp, budget, depth):
    """decoding.guess_set_size=0 with decoding.successors=true: the config's message offers it as 'the successor
    table alone', but no proposer was built, so it decoded as plain greedy (a new user, 2026-12-07)."""
    from lp_runtime.config import DecodingConfig
    from lp_runtime.successors import successor_proposers

    (p,) = successor_proposers(DecodingConfig(**setting), 96, lp_size=lp, table=None)
    assert (type(p).__name__, p.suffix, p.budget, p.max_depth) == ("SuccessorProposer", None, budget, depth)


@pytest.mark.parametrize("method, table", [("lookahead", ", decoding.successors=true"), ("paper", "")])
def test_g0_with_the_table_off_is_refused_not_plain_greedy(method, table):  # paper: no "with the table off"
    """decoding=lookahead / paper with W > 0 and G = 0 in one process decoded as plain greedy without a word: the
    window's n-grams are verified only as candidates (a review, 2026-12-07). The job and LookaheadGenerator check
    it; a Decoder still takes it (tests of the window's mechanics under LP use it)."""
    from fakes import llama
    from lp_runtime.api import LookaheadGenerator
    from lp_runtime.config import ConfigError

    off = "with the successor table off " if method == "lookahead" else ""
    message = (f"decoding.guess_set_size=0 {off}leaves decoding={method} nothing to verify "
               "(the window's n-grams reach the output only as candidates), so it would decode as plain greedy; set "
               f"G > 0{table}, or use decoding=greedy")
    cfg = lookahead(method=method, window_size=2, ngram_size=3, guess_set_size=0)
    for lp in (1, 2):
        with pytest.raises(ConfigError, match=re.escape(message)):
            cfg.check_candidates(lp if method == "paper" else 1)
    if method == "lookahead":
        cfg.check_candidates(2)  # successors=auto under LP: the table alone
    with pytest.raises(ConfigError, match=re.escape(message)):
        LookaheadGenerator(llama(), None, cfg, progress=False)


@pytest.mark.parametrize("setting", [dict(method="auto", guess_set_size=0),
                                     dict(method="lookahead", window_size=0, guess_set_size=0)])
def test_g0_with_successors_auto_is_the_table_alone_under_lp_only(setting):
    """successors=auto turns the table on under LP: G = 0 there is the table alone (README), and one process is
    refused by check_candidates, not by the config, which does not know the LP degree (a new user, 2026-12-07)."""
    from lp_runtime.config import ConfigError, DecodingConfig

    cfg = DecodingConfig(**setting)
    cfg.check_candidates(2)
    with pytest.raises(ConfigError, match=r"^decoding.guess_set_size=0 with the successor table off leaves decoding="
                                          r"\w+ nothing to verify .*; set G > 0, decoding.successors=true, or use "
                                          r"decoding=greedy$"):
        cfg.check_candidates(1)


EMPTY_POOL = ("decoding.window_size=0 with decoding.pool_from_prompt=false leaves the n-gram pool empty{off}; set "
              "W > 0, decoding.pool_from_prompt=true{table}, or use decoding=greedy")


@pytest.mark.parametrize("method, successors, refused_at", [
    ("lookahead", "false", "config"), ("paper", "false", "config"),
    ("lookahead", "auto", "one process"),  # the table is on under LP only
    ("lookahead", "true", None)])          # the table alone (was refused by the config: a new user, 2026-12-07)
def test_w0_without_the_prompts_text_needs_the_table(method, successors, refused_at):
    from lp_runtime.config import ConfigError, DecodingConfig

    paper = method == "paper"  # it has no successor table
    message = EMPTY_POOL.format(off="" if paper else " and the successor table off",
                                table="" if paper else ", decoding.successors=true (the successor table alone)")
    setting = dict(method=method, window_size=0, guess_set_size=2, pool_from_prompt=False, successors=successors)
    if refused_at == "config":
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            DecodingConfig(**setting)
        return
    cfg = DecodingConfig(**setting)
    cfg.check_candidates(2)
    if refused_at == "one process":
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            cfg.check_candidates(1)
    else:
        cfg.check_candidates(1)


def test_table_alone_without_the_prompts_text_decodes_as_greedy():
    from fakes import llama
    from lp_runtime.decoder import Decoder

    model = llama()
    plain = Decoder(model, lookahead(method="greedy")).generate([5, 9, 5, 9, 5], max_new_tokens=24).output_ids
    dec = Decoder(model, lookahead(window_size=0, ngram_size=3, guess_set_size=2, pool_from_prompt=False,
                                   successors=True))
    out = dec.generate([5, 9, 5, 9, 5], max_new_tokens=24)
    assert out.output_ids == plain and not dec.proposers[0].suffix.index_history
    assert out.decoding_steps < len(plain)  # the table found accepted tokens


def test_g0_table_alone_decodes_as_greedy_and_proposes():
    from fakes import llama
    from lp_runtime.decoder import Decoder

    model = llama()
    plain = Decoder(model, lookahead(method="greedy")).generate([5, 9, 5, 9, 5], max_new_tokens=24).output_ids
    dec = Decoder(model, lookahead(window_size=2, ngram_size=3, guess_set_size=0, successors=True))
    (p,) = dec.proposers
    out = dec.generate([5, 9, 5, 9, 5], max_new_tokens=24)
    assert out.output_ids == plain and p.suffix is None
    assert out.decoding_steps < len(plain)  # the table (and the window) found accepted tokens


def test_rank_tables_take_an_empty_update_and_a_one_token_prompt_with_prefill_rows():
    """A one-token prompt has no prefill rows: RankTables.update([]) raised 'cannot reshape array of size 0' (a
    review, 2026-12-04); now it changes nothing, and the decode equals one without the table's prefill."""
    from fakes import llama
    from lp_runtime.decoder import Decoder
    from lp_runtime.successors import successor_proposers

    tables = RankTables(96, 4, ranks=2)
    before = tables.state()
    tables.update([], np.zeros((0, 4), dtype=np.int64), only_empty=True)
    assert tables.state() == before
    cfg = lookahead(window_size=0, ngram_size=3, guess_set_size=2)
    model = llama()
    plain = Decoder(model, lookahead(method="greedy")).generate([7], max_new_tokens=6).output_ids
    dec = Decoder(model, cfg, proposers=successor_proposers(cfg, 96, lp_size=2, prefill=True))
    assert dec.generate([7], max_new_tokens=6).output_ids == plain


def test_rank_tables_update_in_one_pass_equals_each_tables_own_update():
    """RankTables writes every rank's rows in one vectorised pass (session 22, for the host time under LP): the same
    tables, update counts and merged rows as each SuccessorTable updated in turn, with repeated keys (the later row
    wins), rows for every table (owner -1), only_empty, and rows holding repeated ids across ranks."""
    from lp_runtime.successors import SuccessorTable, _first_ids

    rng = np.random.default_rng(1)
    for trial in range(40):
        ranks, k, vocab = int(rng.integers(1, 5)), int(rng.integers(1, 5)), 12
        tables, alone = RankTables(vocab, k, ranks), [SuccessorTable(vocab, k) for _ in range(ranks)]
        for batch in range(4):
            n = int(rng.integers(0, 9))
            tokens = rng.integers(0, vocab, n)
            rows = rng.integers(0, 6, (n, k + 1))  # few ids: repeats within and across rows
            owners = rng.integers(-1, ranks, n)
            only_empty = bool(rng.integers(0, 2))
            tables.update(tokens, rows, owners, only_empty=only_empty)
            for r, t in enumerate(alone):
                mine = (owners == r) | (owners < 0)
                if mine.any():
                    t.update(tokens[mine], rows[mine], only_empty=only_empty)
            for r, t in enumerate(alone):
                assert (tables.tables[r].table == t.table).all() and tables.tables[r].updates == t.updates
            for token in range(vocab):  # the merged row: each rank's best, then each one's second, ..., first places
                seq = [int(t.table[token, j]) for j in range(k) for t in alone]
                want = list(dict.fromkeys(x for x in seq if x >= 0))
                assert tables.successors(token) == want, (trial, batch, token)
                row = tables.rows_of(np.array([token]), None, k)[0].tolist()  # the merged row kept by update
                assert row == (want + [-1] * k)[:k], (trial, batch, token)
                assert _first_ids(np.array([seq]), k + 3)[0].tolist() == (want + [-1] * (k + 3))[:k + 3]
