"""The cost-aware step policy (lp_runtime/policy.py): synthetic latency curves and acceptance tables, exact choices."""
from __future__ import annotations

import pytest

from lp_runtime.policy import AcceptanceCalibration, CostPolicy, FeedAll, LatencyCurve, StepChoice, best_prefix, interpolate
from lp_runtime.tree import CandidateTree, depths, path_probabilities

# Measured on the 2-core CPU on 2026-11-30 (ms, SmolLM2, 200-token cache; docs/design.md section 7b).
FLOAT32 = {1: 38.5, 2: 61.8, 3: 75.8, 4: 58.9, 8: 59.2, 16: 70.6, 32: 95.0, 64: 142.8}
BFLOAT16 = {1: 21.9, 2: 21.5, 3: 21.0, 4: 22.1, 8: 24.4, 16: 28.0, 32: 36.8, 64: 52.6}
FLAT = {1: 10.0, 64: 10.0}
LINEAR = {1: 10.0, 2: 20.0, 64: 640.0}       # every token costs as much as the first: nothing ever pays
SLOPE = {1: 10.0, 11: 20.0}                    # 1 ms per extra token on a 10 ms step
GENTLE = {1: 10.0, 101: 20.0}                  # 0.1 ms per extra token (GPU-like)


def tree(parents, prob, tokens=None, from_window=None):
    t = CandidateTree(tokens or list(range(100, 100 + len(parents))), list(parents), list(prob))
    if from_window is not None:
        t.from_window = list(from_window)
    return t


def star(*probs):
    """Every node a child of the root: path probability = the node's raw probability."""
    return tree([-1] * len(probs), probs)


def policy(curve, **kw):
    return CostPolicy(curve, **kw)


# ---------------------------------------------------------------------------------------- helpers

def test_interpolate_and_curve_table():
    assert interpolate({1: 1.0, 3: 2.0, 5: 6.0}, 4) == 4.0
    assert interpolate({1: 1.0, 3: 2.0, 5: 6.0}, 0) == 0.5   # linear past the ends
    assert interpolate({4: 2.0}, 99) == 2.0
    c = LatencyCurve(FLOAT32)
    assert c(1) == 38.5 and c(3) == 75.8 and c(6) == pytest.approx(59.05) and c(128) == pytest.approx(238.4)
    with pytest.raises(ValueError, match="empty"):
        LatencyCurve({})
    with pytest.raises(ValueError, match=r"\{0: 1.0\} are not allowed"):
        LatencyCurve({0: 1.0, 1: 2.0})


def test_depths_and_path_probabilities():
    assert depths([-1, 0, 1, 0, -1]) == [1, 2, 3, 2, 1]
    assert path_probabilities([-1, 0, 1, 0, -1], [0.5, 0.5, 0.5, 0.2, 0.9]) == [0.5, 0.25, 0.125, 0.1, 0.9]


def test_best_prefix_evaluates_every_size_past_a_dip():
    # float32: q = 2 (one node) is a dip (1.6 / 61.8 < 1 / 38.5) but 5 nodes (q = 6) pay 2x.
    nodes, tokens, seconds = best_prefix([0.6, 0.5, 0.4, 0.3, 0.2], 1, LatencyCurve(FLOAT32))
    assert nodes == (0, 1, 2, 3, 4) and tokens == pytest.approx(3.0) and seconds == pytest.approx(59.05)
    # with the last two nodes gone: q = 4 (3 nodes) beats q = 1..3
    assert best_prefix([0.6, 0.5, 0.4], 1, LatencyCurve(FLOAT32))[0] == (0, 1, 2)
    # one good node alone cannot pay on float32 (q = 2 is dearer than 2 tokens' worth at 0.6)
    assert best_prefix([0.6], 1, LatencyCurve(FLOAT32))[0] == ()


# ---------------------------------------------------------------------------------------- choices on curves

@pytest.mark.parametrize("curve, probs, expected", [
    (FLAT, (0.05, 0.9, 0.3), (0, 1, 2)),                 # flat: every node with any chance pays
    (LINEAR, (0.99, 0.99, 0.99), ()),                    # linear from zero: a node never pays (p < 1)
    # 1 ms per token on a 10 ms step: a node pays while p > (current tokens) / (current ms):
    # 0.9 > 1/10 -> take; 0.3 > 1.9/11 -> take; 0.15 < 2.2/12 -> stop; 0.05 no
    (SLOPE, (0.05, 0.9, 0.15, 0.3), (1, 3)),
    (FLOAT32, (0.6, 0.5, 0.4, 0.3, 0.2), (0, 1, 2, 3, 4)),
    (FLOAT32, (0.3, 0.2), ()),                           # float32, weak candidates: a plain step
    (BFLOAT16, (0.3, 0.2), (0, 1)),                      # bf16: q = 3 is cheaper than q = 1
])
def test_choose_on_synthetic_curves(curve, probs, expected):
    choice = policy(curve).choose(star(*probs), num_pending=1, window_tokens=0)
    assert choice.nodes == expected and choice.use_window is False
    assert choice.expected_tokens == pytest.approx(1 + sum(probs[i] for i in expected))
    assert choice.expected_seconds == pytest.approx(LatencyCurve(curve)(1 + len(expected)))


def test_empty_tree_is_a_plain_step():
    choice = policy(FLAT).choose(star(), num_pending=1, window_tokens=0)
    assert choice == StepChoice((), False, 1.0, 10.0)
    with pytest.raises(ValueError, match="num_pending=0"):
        policy(FLAT).choose(star(), num_pending=0, window_tokens=0)


def test_pending_tokens_move_the_step_along_the_curve():
    # float32: after 3 pending tokens q is already 3; one node takes it to q = 4, which is CHEAPER than q = 3.
    pol = policy(FLOAT32)
    assert pol.choose(star(0.2), num_pending=1, window_tokens=0).nodes == ()
    assert pol.choose(star(0.2), num_pending=3, window_tokens=0).nodes == (0,)


def test_chain_choice_is_ancestor_closed():
    # root -> a (0.9) -> b (0.9) -> c (0.9); root -> d (0.95) -> e (0.1).  Path probabilities:
    # a .9, b .81, c .729, d .95, e .095.  On SLOPE: d, a, b, c pay, e does not.
    t = tree([-1, 0, 1, -1, 3], [0.9, 0.9, 0.9, 0.95, 0.1])
    choice = policy(SLOPE).choose(t, num_pending=1, window_tokens=0)
    assert choice.nodes == (0, 1, 2, 3)
    assert choice.expected_tokens == pytest.approx(1 + 0.95 + 0.9 + 0.81 + 0.729)
    # a certain child (p = 1 clipped to 0.999) still comes after its parent
    t = tree([-1, 0], [0.5, 1.0])
    for curve in (FLAT, SLOPE, BFLOAT16):
        nodes = policy(curve).choose(t, 1, 0).nodes
        assert all(t.parents[i] < 0 or t.parents[i] in nodes for i in nodes), (curve, nodes)


def test_max_nodes_caps_the_step():
    assert policy(FLAT, max_nodes=2).choose(star(0.1, 0.5, 0.3), 1, 0).nodes == (1, 2)


# ---------------------------------------------------------------------------------------- the window

def test_window_only_where_the_curve_is_flat():
    t = star(0.5)
    flat = policy(FLAT).choose(t, num_pending=1, window_tokens=8)
    assert flat.use_window and flat.nodes == (0,) and flat.expected_tokens == pytest.approx(1.5)
    # SLOPE: 8 window tokens cost 8 ms on a ~11 ms step for 0.15 tokens: never
    assert not policy(SLOPE).choose(t, num_pending=1, window_tokens=8).use_window
    # float32: window + node = q 10 (62.05 ms) for 1.5 + 0.15 tokens beats a plain 1 / 38.5 ms (q = 2-3 being
    # dearer than q = 4-10 on this curve); a window of 30 (q = 32, 95 ms) does not
    assert policy(FLOAT32).choose(t, 1, 8) == StepChoice((0,), True, 1.5, pytest.approx(62.05))
    assert policy(FLOAT32).choose(t, 1, 30) == StepChoice((), False, 1.0, 38.5)
    # no window in this decoder: never used
    assert not policy(FLAT).choose(t, 1, 0).use_window


def test_window_gain_is_learned_from_window_only_nodes():
    pol = policy(GENTLE, window_strength=4.0)
    assert pol.window_gain == pytest.approx(0.15)
    t = tree([-1, 0], [0.5, 0.5], from_window=[True, True])
    for _ in range(4):  # 4 windowed steps, each accepting both window-only nodes: 8 tokens
        assert pol.choose(t, 1, window_tokens=6).use_window
        pol.observe(t, [0, 1], [0, 1])
    assert pol.window_steps == 4
    assert pol.window_gain == pytest.approx((8 + 4 * 0.15) / (4 + 4))
    # a window that never helps: its value 0.6 / (n + 4) after n windowed steps falls below its cost, 6 x 0.1 ms
    # on a 10.1 ms step worth 1 + p tokens (p = 2 / (n + 4), the node's estimate, falling too): gain > (1 + p)
    # * 0.6 / 10.1 holds up to n = 4 (0.075 > 0.0743) and fails from n = 5 (0.0667 < 0.0726)
    pol = policy(GENTLE, window_strength=4.0)
    t = tree([-1], [0.5], from_window=[False])
    used = []
    for _ in range(10):
        c = pol.choose(t, 1, window_tokens=6)
        used.append(c.use_window)
        pol.observe(t, c.nodes, [])
    assert used == [True] * 5 + [False] * 5


# ---------------------------------------------------------------------------------------- calibration

def test_calibration_table():
    cal = AcceptanceCalibration(strength=2.0, max_depth=2, num_prob_buckets=5)
    assert cal.bucket(1, 0.0) == (1, 0) and cal.bucket(1, 1.0) == (1, 4) and cal.bucket(7, 0.45) == (2, 2)
    assert cal.estimate(1, 1.0) == 0.999 and cal.estimate(1, 0.0) == 0.001   # never certain, never impossible
    for hit in (True, True, True, False):
        cal.update(1, 0.3, hit)
    assert cal.estimate(1, 0.3) == pytest.approx((3 + 2 * 0.3) / (4 + 2))
    assert cal.estimate(1, 0.35) == pytest.approx((3 + 2 * 0.35) / (4 + 2))   # same bucket, own prior
    assert cal.estimate(2, 0.3) == pytest.approx(0.3)                         # another depth: untouched
    with pytest.raises(ValueError, match="strength=0"):
        AcceptanceCalibration(strength=0)


def test_observe_counts_only_nodes_whose_parent_was_accepted():
    pol = policy(FLAT)
    t = tree([-1, 0, -1, 2], [0.5, 0.5, 0.5, 0.5])   # a -> b, c -> d
    pol.choose(t, 1, 0)
    pol.observe(t, [0, 1, 2, 3], [0])                # a accepted, b rejected; c rejected so d is no trial
    cal = pol.calibration
    assert cal.trials == {(1, 2): 2, (2, 2): 1} and cal.successes == {(1, 2): 1, (2, 2): 0}
    with pytest.raises(AssertionError, match="were not fed"):
        pol.observe(t, [0], [0, 1])


def test_estimates_self_correct_and_change_the_choice():
    # The lookup says 0.9 but verification never accepts: after some steps the node is no longer fed.
    pol = policy(SLOPE)
    t = star(0.9)
    fed = []
    for _ in range(60):
        c = pol.choose(t, 1, 0)
        fed.append(len(c.nodes))
        pol.observe(t, c.nodes, [])
    assert fed[0] == 1 and fed[-1] == 0
    # it stopped as soon as the estimate fell below the break-even 1/10 = 0.1: (4 * 0.9) / (n + 4) <= 0.1
    assert sum(fed) == 32


def test_a_calibrated_tree_is_priced_as_it_is_and_teaches_nothing():
    # A proposer that learns its own estimates per source (successors.grow_tree) marks its tree calibrated: the
    # policy's own calibration, taught here that 0.9 at depth 1 is never accepted, must not discount it again.
    pol = policy(SLOPE)
    for _ in range(40):
        pol.observe(star(0.9), [0], [])
    assert pol.choose(star(0.9), 1, 0).nodes == ()  # (0 + 4 * 0.9) / 44 < 0.1: no longer pays
    mine = star(0.9)
    mine.calibrated = True
    assert pol.choose(mine, 1, 0).nodes == (0,)
    trials = dict(pol.calibration.trials)
    pol.observe(mine, [0], [])
    assert pol.calibration.trials == trials
    # the union of calibrated trees stays calibrated; with one plain tree it is calibrated again by the policy
    assert CandidateTree.union([mine, mine]).calibrated and not CandidateTree.union([mine, star(0.5)]).calibrated
    assert mine.select([0]).calibrated and not star(0.9).select([0]).calibrated


def test_expected_speedup_and_feed_all():
    pol = policy(FLAT)
    t = star(0.5, 0.5)
    choice = pol.choose(t, 1, 0)
    assert choice.expected_tokens / choice.expected_seconds * FLAT[1] == pytest.approx(2.0)  # 2 for the price of 1
    assert FeedAll().choose(t, num_pending=2, window_tokens=5) == StepChoice((0, 1), True)
