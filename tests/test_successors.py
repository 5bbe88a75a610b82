"""The successor table and the tree grown from every source (lp_runtime/successors.py), with hand-written ids."""
import numpy as np
import pytest

from lp_runtime.lookup import CandidateTree
from lp_runtime.successors import GrownTree, RankCalibration, SuccessorProposer, SuccessorTable, grow_tree


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


def test_table_refuses_bad_shape():
    with pytest.raises(ValueError, match=r"SuccessorTable\(vocab_size=0, k=8\): both must be >= 1"):
        SuccessorTable(0)


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
    assert (g.tree.tokens, g.tree.parents, g.succ_key) == ([6, 7, 8], [-1, -1, 0], [0, 1, 0])
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
    assert g.tree.tokens[0] == 6 and g.suffix_raw[0] == 0.9 and g.succ_key[0] == 0  # one node, both sources
    assert g.tree.tokens.count(6) == 1
    # the suffix chain keeps its child 9 (estimated above the table's 8), then the table fills in
    assert g.tree.tokens[:2] == [6, 9] and g.tree.parents[:2] == [-1, 0]
    assert sorted(g.tree.tokens) == [6, 7, 8, 9] and g.succ_key[g.tree.tokens.index(9)] is None


def test_grow_continues_a_suffix_chain_from_the_table():
    suffix = CandidateTree(tokens=[6], parents=[-1], prob=[0.9])
    g = grow_tree(5, suffix, table_of({6: [8]}), 3, succ_cal=flat())
    assert (g.tree.tokens, g.tree.parents) == ([6, 8], [-1, 0])  # 5 has no row; 8 has no row: 2 nodes only


def test_grow_refuses_negative_budget():
    with pytest.raises(ValueError, match=r"grow_tree\(budget=-1\): the node budget must be >= 0"):
        grow_tree(1, None, None, -1)


# ------------------------------------------------------------------------------------------------ proposer
def test_proposer_learns_from_trials_only():
    prop = SuccessorProposer(table_of({5: [6, 7], 6: [8, 9]}), 4)
    g = prop.propose(5, None)
    assert g.tree.tokens == [6, 8, 7, 9] and g.tree.parents == [-1, 0, -1, 0]
    prop.observe(g, range(4), [0])  # 6 accepted, then 8 rejected (9 was a trial too), 7 a rejected trial
    assert prop.succ_cal.trials == {(1, 0): 1, (1, 1): 1, (2, 0): 1, (2, 1): 1}
    assert prop.succ_cal.successes == {(1, 0): 1, (1, 1): 0, (2, 0): 0, (2, 1): 0}
    prop.observe(g, range(4), [])  # nothing accepted: the children of 6 are no trials
    assert prop.succ_cal.trials[(2, 0)] == 1 and prop.succ_cal.trials[(1, 0)] == 2


def test_proposer_records_rows_and_refuses_negative_budget():
    prop = SuccessorProposer(SuccessorTable(10, 2), 4)
    prop.record([1, 2], [[3, 4], [5, 6]])
    assert prop.propose(1, None).tree.tokens == [3, 4]
    assert isinstance(SuccessorProposer(None, 2).propose(1, None), GrownTree)
    with pytest.raises(ValueError, match=r"SuccessorProposer\(budget=-3\): the node budget must be >= 0"):
        SuccessorProposer(None, -3)
