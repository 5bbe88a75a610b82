"""What to feed in a lookahead step: the step policy protocol, ``FeedAll`` (fixed W, N, G) and the cost policy
(docs/architecture.md). Pure Python, no torch.

``CostPolicy`` maximises expected accepted tokens per second of the step. E[tokens] = 1 + the sum of the fed
nodes' path probabilities (a greedy walk accepts a node exactly when its whole path matched); cost = latency(q),
q = the step's input tokens, on the measured ``LatencyCurve``. Path probabilities never grow along a path, so the
best k nodes are the k of highest path probability (ancestor-closed); EVERY k = 0..K is evaluated, since on some
curves (float32 on a 2-core CPU) a step of 5 nodes pays where 1-2 do not.

The window earns nothing in the step that feeds it (its n-grams become later candidates): its value per windowed
step is a prior (``WINDOW_GAIN_PRIOR``, measured: docs/benchmarks.md section 1) refined by the window-only nodes
accepted (``tree.from_window``); it is fed only where the curve is flat enough to pay for it.

Example (flat curve up to 4 tokens, then dearer)::

    >>> from lp_runtime.tree import CandidateTree
    >>> pol = CostPolicy({1: 0.010, 4: 0.010, 8: 0.020})
    >>> tree = CandidateTree(tokens=[7, 8, 9], parents=[-1, 0, -1], prob=[0.9, 0.8, 0.1])
    >>> pol.choose(tree, num_pending=1, window_tokens=0).nodes   # all three fit in the flat part (q = 4)
    (0, 1, 2)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Protocol, Sequence

from .tree import CandidateTree, depths, path_probabilities

WINDOW_GAIN_PRIOR = 0.15


@dataclass(frozen=True)
class StepChoice:
    """What one step feeds: ``nodes`` of the proposed tree (ancestor-closed, ascending) and whether to feed the
    window; the expectations are a policy's estimates (None when not estimated)."""

    nodes: tuple[int, ...]
    use_window: bool
    expected_tokens: Optional[float] = None
    expected_seconds: Optional[float] = None


class StepPolicy(Protocol):
    """Decides what each step feeds; the ``Decoder`` calls ``choose`` before and ``observe`` after every step, in
    order across calls. ``num_pending``: tokens the step feeds anyway; ``window_tokens``: tokens the window would add
    (0 when there is none); ``fed_nodes`` / ``accepted_nodes``: indices into the proposed ``tree``."""

    def choose(self, tree: CandidateTree, *, num_pending: int, window_tokens: int) -> StepChoice: ...

    def observe(self, tree: CandidateTree, fed_nodes: Sequence[int], accepted_nodes: Sequence[int]) -> None: ...


class FeedAll:
    """The fixed-(W, N, G) policy: feed every proposed node, and the window whenever there is one."""

    def choose(self, tree: CandidateTree, *, num_pending: int, window_tokens: int) -> StepChoice:
        return StepChoice(nodes=tuple(range(len(tree))), use_window=window_tokens > 0)

    def observe(self, tree: CandidateTree, fed_nodes: Sequence[int], accepted_nodes: Sequence[int]) -> None:
        """No learning: a fixed setting feeds the same whatever was accepted."""


def interpolate(curve: Mapping[int, float], q: float) -> float:
    """Seconds of a step of ``q`` tokens: piecewise linear in q between measured points, linear past the ends.

    Raises ``ValueError`` for an empty curve.

    >>> interpolate({1: 1.0, 3: 2.0, 5: 6.0}, 2)
    1.5
    >>> interpolate({1: 1.0, 3: 2.0, 5: 6.0}, 7)
    10.0
    """
    pts = sorted((int(k), float(v)) for k, v in curve.items())
    if not pts:
        raise ValueError("the latency curve is empty")
    if len(pts) == 1:
        return pts[0][1]
    i = 0
    while i < len(pts) - 2 and q > pts[i + 1][0]:
        i += 1
    (q0, t0), (q1, t1) = pts[i], pts[i + 1]
    return t0 + (t1 - t0) * (q - q0) / (q1 - q0)


class LatencyCurve:
    """Seconds of one forward pass against the tokens q in it, from measured points (``interpolate``), with the
    values for q = 1..``max_q`` tabulated once so a step's choice costs a list lookup per candidate size.

    Raises ``ValueError`` for an empty curve, a q < 1 or a non-positive time.
    """

    def __init__(self, points: Mapping[int, float], max_q: int = 512) -> None:
        pts = {int(q): float(t) for q, t in points.items()}
        if not pts:
            raise ValueError("the latency curve is empty")
        bad = {q: t for q, t in pts.items() if q < 1 or not t > 0}
        if bad:
            raise ValueError(f"latency curve points {bad} are not allowed; q must be >= 1 and seconds > 0")
        self.points = dict(sorted(pts.items()))
        self._table = [0.0] + [max(interpolate(pts, q), 1e-12) for q in range(1, max_q + 1)]

    def __call__(self, q: int) -> float:
        if 0 < q < len(self._table):
            return self._table[q]
        return max(interpolate(self.points, q), 1e-12)


class AcceptanceCalibration:
    """Online calibration of the lookup's raw acceptance estimates, a Beta prior centred on the raw value:
    ``estimate(depth, raw) = (successes + strength * raw) / (trials + strength)`` per (depth 1..``max_depth``,
    deeper nodes sharing the last; raw probability in ``num_prob_buckets`` equal bins of [0, 1]), clipped to
    [``floor``, 1 - ``floor``] so no node is ever certain or impossible. ``ValueError`` for strength <= 0.

    >>> cal = AcceptanceCalibration(strength=2.0)
    >>> cal.estimate(1, 0.5)
    0.5
    >>> for hit in (False, False, False, False, False, False): cal.update(1, 0.5, hit)
    >>> cal.estimate(1, 0.5)        # (0 + 2 * 0.5) / (6 + 2)
    0.125
    """

    def __init__(self, strength: float = 4.0, max_depth: int = 4, num_prob_buckets: int = 5,
                 floor: float = 1e-3) -> None:
        if strength <= 0:
            raise ValueError(f"strength={strength}; the prior's strength must be > 0")
        self.strength, self.max_depth, self.num_prob_buckets, self.floor = strength, max_depth, num_prob_buckets, floor
        self.trials: dict[tuple[int, int], int] = {}
        self.successes: dict[tuple[int, int], int] = {}

    def bucket(self, depth: int, raw: float) -> tuple[int, int]:
        b = min(int(max(raw, 0.0) * self.num_prob_buckets), self.num_prob_buckets - 1)
        return min(max(depth, 1), self.max_depth), b

    def estimate(self, depth: int, raw: float) -> float:
        key = self.bucket(depth, raw)
        raw = min(max(float(raw), 0.0), 1.0)
        p = (self.successes.get(key, 0) + self.strength * raw) / (self.trials.get(key, 0) + self.strength)
        return min(max(p, self.floor), 1.0 - self.floor)

    def update(self, depth: int, raw: float, accepted: bool) -> None:
        key = self.bucket(depth, raw)
        self.trials[key] = self.trials.get(key, 0) + 1
        self.successes[key] = self.successes.get(key, 0) + int(bool(accepted))


def best_prefix(path_probs: Sequence[float], base_q: int, curve: LatencyCurve, bonus_tokens: float = 0.0,
                tokens_of: Optional[Callable[[list[int]], int]] = None) -> tuple[tuple[int, ...], float, float]:
    """The node set with the highest (1 + bonus + sum of path probs) / latency(q), q = base_q + nodes, or
    ``tokens_of(nodes)`` when given (under LP: the busiest rank's tokens, ``CostPolicy.price_lp``).

    Nodes are taken in order of decreasing path probability (lower index first on ties); every prefix size is
    evaluated and the best kept (the smallest on ties). Returns (nodes ascending, expected tokens, seconds).

    >>> best_prefix([0.9, 0.1], 1, LatencyCurve({1: 1.0, 2: 1.0, 3: 2.0}))
    ((0,), 1.9, 1.0)
    """
    order = sorted(range(len(path_probs)), key=lambda i: (-path_probs[i], i))
    tokens = 1.0 + bonus_tokens
    best_k, best_tokens, best_s = 0, tokens, curve(base_q if tokens_of is None else tokens_of([]))
    best_rate = best_tokens / best_s
    for k, i in enumerate(order, start=1):
        tokens += path_probs[i]
        seconds = curve(base_q + k if tokens_of is None else tokens_of(order[:k]))
        if tokens / seconds > best_rate * (1.0 + 1e-12):
            best_k, best_tokens, best_s, best_rate = k, tokens, seconds, tokens / seconds
    return tuple(sorted(order[:best_k])), best_tokens, best_s


class StepCost(Protocol):
    """What a step costs, in input tokens of the busiest process (the latency curve is read there); ``nodes``: the
    fed node indices of the tree ``parents``; ``lp_size``: the ranks that share a step."""

    lp_size: int

    def __call__(self, num_pending: int, window_tokens: int, parents: Sequence[int], nodes: Sequence[int]) -> int: ...


class OneProcessCost:
    """One process feeds the whole step: pending + window + nodes."""

    lp_size = 1

    def __call__(self, num_pending: int, window_tokens: int, parents: Sequence[int], nodes: Sequence[int]) -> int:
        return num_pending + window_tokens + len(nodes)


class CostPolicy:
    """Feed the candidate nodes (and the window) that maximise expected accepted tokens per second.

    Args:
        curve: {tokens in the step q: seconds of one forward pass} (the tuner's measured profile) or a
            ``LatencyCurve``.
        calibration: kept across calls, so a policy held by a decoder keeps learning from prompt to prompt.
        window_gain: prior value of feeding the window, in accepted tokens per windowed step;
            window_strength: pseudo-steps of that prior when it is refined online.
        max_nodes: never feed more nodes than this (None: no limit besides the curve).
        step_cost: default ``OneProcessCost()``; under LP ``price_lp(K, W)``.

    The choice is a pure function of the curve, the tree and what was accepted before, which the LP merge makes
    the same on every rank, so every rank feeds the same nodes.
    """

    def __init__(self, curve, *, calibration: Optional[AcceptanceCalibration] = None,
                 window_gain: float = WINDOW_GAIN_PRIOR, window_strength: float = 32.0,
                 max_nodes: Optional[int] = None, step_cost: Optional[StepCost] = None) -> None:
        self.curve = curve if isinstance(curve, LatencyCurve) else LatencyCurve(curve)
        self.step_cost = step_cost if step_cost is not None else OneProcessCost()
        self.calibration = calibration or AcceptanceCalibration()
        self.window_gain_prior, self.window_strength, self.max_nodes = window_gain, window_strength, max_nodes
        self.window_steps = self.window_accepted = self.steps = 0
        self._last: Optional[StepChoice] = None

    @property
    def lp_size(self) -> int:
        """Ranks a step is priced for (``step_cost.lp_size``)."""
        return self.step_cost.lp_size

    @property
    def window_size(self) -> int:
        """The W the step cost splits by column (0 for one process)."""
        return getattr(self.step_cost, "window_size", 0)

    def price_lp(self, lp_size: int, window_size: int) -> None:
        """Price steps as ``lp_size`` ranks run them: ``step_cost = parallel.BusiestRankCost(lp_size, window_size)``
        (``window_size``: the decoder's W). ``ValueError`` for lp_size < 1 or W < 0."""
        from .parallel import BusiestRankCost  # torch: only under LP

        if lp_size < 1 or window_size < 0:
            raise ValueError(f"price_lp(lp_size={lp_size}, window_size={window_size}): need lp_size >= 1, W >= 0")
        self.step_cost = BusiestRankCost(int(lp_size), int(window_size)) if lp_size > 1 else OneProcessCost()

    @property
    def window_gain(self) -> float:
        """Current estimate of the window's value, accepted tokens per windowed step."""
        return ((self.window_accepted + self.window_strength * self.window_gain_prior)
                / (self.window_steps + self.window_strength))

    def choose(self, tree, num_pending: int, window_tokens: int) -> StepChoice:
        """``StepPolicy.choose``; empty tree and no paying window: a plain step (nodes=()). ``ValueError`` for
        ``num_pending`` < 1."""
        if num_pending < 1:
            raise ValueError(f"num_pending={num_pending}; a step feeds at least the newest accepted token")
        calibrated = list(tree.prob) if tree.calibrated else \
            [self.calibration.estimate(d, p) for d, p in zip(depths(tree.parents), tree.prob)]
        paths = path_probabilities(tree.parents, calibrated)
        if self.max_nodes is not None and len(paths) > self.max_nodes:
            keep = set(sorted(range(len(paths)), key=lambda i: (-paths[i], i))[: self.max_nodes])
            paths = [p if i in keep else 0.0 for i, p in enumerate(paths)]  # a zero never pays
        def cost(window: int):
            return lambda nodes: self.step_cost(num_pending, window, tree.parents, nodes)

        nodes, tokens, seconds = best_prefix(paths, num_pending, self.curve, tokens_of=cost(0))
        choice = StepChoice(nodes, False, tokens, seconds)
        if window_tokens > 0:
            gain = self.window_gain
            w_nodes, w_tokens, w_seconds = best_prefix(paths, num_pending + window_tokens, self.curve, gain,
                                                       tokens_of=cost(window_tokens))
            if w_tokens / w_seconds > tokens / seconds:
                choice = StepChoice(w_nodes, True, w_tokens - gain, w_seconds)
        self._last = choice
        return choice

    def observe(self, tree, fed_nodes: Sequence[int], accepted_nodes: Sequence[int]) -> None:
        """Learn from one verified step: a fed node (``fed_nodes``) is a trial when its parent is the root or was
        accepted, a success when it is on the accepted path (``accepted_nodes``)."""
        node_depths = depths(tree.parents)
        accepted = set(int(i) for i in accepted_nodes)
        fed = set(int(i) for i in fed_nodes)
        assert accepted <= fed, f"accepted nodes {sorted(accepted - fed)} were not fed"
        for i in sorted(fed) if not tree.calibrated else ():
            par = tree.parents[i]
            if par < 0 or par in accepted:
                self.calibration.update(node_depths[i], tree.prob[i], i in accepted)
        last = self._last
        if last is not None:
            self.steps += 1
            self.window_steps += last.use_window
        from_window = getattr(tree, "from_window", None)
        if from_window and len(from_window) == len(tree.parents):  # a lookup that tags its nodes (SuffixLookup)
            self.window_accepted += sum(1 for i in accepted if from_window[i])
        self._last = None
