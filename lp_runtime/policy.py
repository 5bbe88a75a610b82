"""What to feed in a lookahead step: the cost-aware step policy (issue 9; docs/architecture.md).

Pure Python, no torch, no model. Each step the decoder holds a candidate tree (``tree.CandidateTree``:
``tokens``, ``parents`` with -1 = the root ``c``, ``prob`` = the lookup's raw estimate of P(node accepted |
parent accepted)) and asks the policy which nodes to feed and whether to feed the Jacobi window.

``CostPolicy`` maximises expected accepted tokens per second of the step:

* E[tokens] = 1 + sum over fed nodes of P(the path root -> node is accepted): the step always yields ``c``'s
  next token, and a greedy walk accepts a node exactly when its whole path matched, so the expected length of
  the accepted path is the sum of the fed nodes' path probabilities;
* cost = latency(q), q = pending + window tokens (if fed) + nodes, read off the measured latency curve
  (``LatencyCurve``: seconds of one forward pass against q, piecewise linear between measured points).

Path probabilities never grow along a path, so the best subset of k nodes is the k nodes of highest path
probability, and that set is ancestor-closed (ties go to the lower index, and parents precede children). The
policy evaluates EVERY prefix size k = 0..K, not only until the first dip: on a curve such as float32 on a
2-core CPU (q = 2-3 dearer than q = 4-8) a step of 5 nodes can pay where 1-2 do not. k = 0 is a plain
one-token step, which costs what greedy costs.

Acceptance estimates are calibrated online (``observe``): per (depth bucket, raw-probability bucket) the
policy counts trials (a fed node whose parent was accepted) and successes, and estimates
P = (s + k * raw) / (n + k): a Beta prior of strength k centred on the lookup's raw estimate, so estimates
start at the lookup's counts and move to what verification really accepts.

The window earns nothing in the step that feeds it: its harvested n-grams become candidates in later steps.
Its value per windowed step (``window_gain``, tokens) is a prior (0.15 tokens a step: the S difference between
(W, N, G) = (3, 4, 3) and (0, 4, 2) measured on MT-Bench, docs/benchmarks.md section 1) refined online when
the tree marks which nodes only the window proposed (``tree.from_window``, set by ``proposers.SuffixProposer``):
gain = (window-only nodes accepted + k_w * prior) / (windowed steps + k_w). The window is fed when
(E[tokens] + gain) / latency(q + window) beats E[tokens] / latency(q), i.e. only where the curve is flat
enough at this q (a GPU, or bfloat16 on a CPU with native bf16 matmul), never on a steep curve.

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
    """Decides what each step feeds; the ``Decoder`` calls ``choose`` before and ``observe`` after every step.

    ``choose(tree, num_pending=P, window_tokens=T)``: the proposed tree, the P pending tokens the step feeds
    anyway, the T tokens the window would add (0 when there is none); returns a ``StepChoice``.
    ``observe(tree, fed_nodes, accepted_nodes)``: the same proposed tree, the node indices fed and the accepted
    path (indices into ``tree``). A policy held by a decoder sees every call's steps in order.
    """

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
    """Online calibration of the lookup's raw acceptance estimates (Beta prior centred on the raw value).

    Trials are counted per (depth bucket, raw-probability bucket): depth 1..``max_depth`` (deeper nodes share
    the last bucket), raw probability in ``num_prob_buckets`` equal bins of [0, 1].
    ``estimate(depth, raw) = (successes + strength * raw) / (trials + strength)``, clipped to
    [``floor``, 1 - ``floor``] so no node is ever certain or impossible.

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
        self.strength = strength
        self.max_depth = max_depth
        self.num_prob_buckets = num_prob_buckets
        self.floor = floor
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
    """What a step costs, in input tokens of the busiest process (the latency curve is read there):
    ``cost(num_pending, window_tokens, parents, nodes)``, ``nodes`` the fed node indices of the tree ``parents``.
    ``lp_size``: the ranks that share a step."""

    lp_size: int

    def __call__(self, num_pending: int, window_tokens: int, parents: Sequence[int], nodes: Sequence[int]) -> int: ...


class OneProcessCost:
    """One process feeds the whole step: pending + window + nodes."""

    lp_size = 1
    window_size = 0

    def __call__(self, num_pending: int, window_tokens: int, parents: Sequence[int], nodes: Sequence[int]) -> int:
        return num_pending + window_tokens + len(nodes)


class CostPolicy:
    """Feed the candidate nodes (and the window) that maximise expected accepted tokens per second.

    Args:
        curve: {tokens in the step q: seconds of one forward pass} (the tuner's measured profile) or a
            ``LatencyCurve``.
        calibration: the acceptance calibration (default ``AcceptanceCalibration()``); kept across calls, so a
            policy held by a decoder keeps learning from prompt to prompt.
        window_gain: prior value of feeding the window, in accepted tokens per windowed step.
        window_strength: pseudo-steps of that prior when it is refined online.
        max_nodes: never feed more nodes than this (None: no limit besides the curve).
        step_cost: a ``StepCost`` (default ``OneProcessCost()``).

    Under lookahead parallelism (``step_cost=parallel.BusiestRankCost(K, W)``, or ``price_lp(K, W)``) a step costs
    latency(the busiest rank's tokens) from the shard plan, not latency(all tokens): K ranks run their shares in
    parallel. The choice is a
    pure function of the curve, the tree and what was accepted before, which the LP merge makes the same on every
    rank, so every rank feeds the same nodes; one process with the same pricing makes the same choices.

    Methods follow the decoder's ``step_policy`` hook (``StepPolicy``): ``choose`` then ``observe`` each step.
    """

    def __init__(self, curve, *, calibration: Optional[AcceptanceCalibration] = None,
                 window_gain: float = WINDOW_GAIN_PRIOR, window_strength: float = 32.0,
                 max_nodes: Optional[int] = None, step_cost: Optional[StepCost] = None) -> None:
        self.curve = curve if isinstance(curve, LatencyCurve) else LatencyCurve(curve)
        self.step_cost = step_cost if step_cost is not None else OneProcessCost()
        self.calibration = calibration or AcceptanceCalibration()
        self.window_gain_prior = window_gain
        self.window_strength = window_strength
        self.max_nodes = max_nodes
        self.window_steps = 0
        self.window_accepted = 0
        self.steps = 0
        self.sum_expected_tokens = 0.0
        self.sum_expected_seconds = 0.0
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

    def _tokens_of(self, parents: Sequence[int], num_pending: int, window_tokens: int) -> Callable[[list[int]], int]:
        """``tokens_of`` for ``best_prefix``: the step cost of feeding some nodes of the tree ``parents``."""
        return lambda nodes: self.step_cost(num_pending, window_tokens, parents, nodes)

    @property
    def window_gain(self) -> float:
        """Current estimate of the window's value, accepted tokens per windowed step."""
        return ((self.window_accepted + self.window_strength * self.window_gain_prior)
                / (self.window_steps + self.window_strength))

    def node_probabilities(self, tree) -> list[float]:
        """Calibrated P(node accepted | parent accepted) for every node of ``tree``."""
        node_depths = depths(tree.parents)
        return [self.calibration.estimate(d, p) for d, p in zip(node_depths, tree.prob)]

    def choose(self, tree, num_pending: int, window_tokens: int) -> StepChoice:
        """The nodes and window to feed after ``num_pending`` pending tokens (``window_tokens``: tokens the
        window would add, 0 when there is none). Empty tree and no paying window: a plain step (nodes=())."""
        if num_pending < 1:
            raise ValueError(f"num_pending={num_pending}; a step feeds at least the newest accepted token")
        paths = path_probabilities(tree.parents, self.node_probabilities(tree))
        if self.max_nodes is not None and len(paths) > self.max_nodes:
            keep = set(sorted(range(len(paths)), key=lambda i: (-paths[i], i))[: self.max_nodes])
            paths = [p if i in keep else 0.0 for i, p in enumerate(paths)]  # a zero never pays
        nodes, tokens, seconds = best_prefix(paths, num_pending, self.curve,
                                             tokens_of=self._tokens_of(tree.parents, num_pending, 0))
        choice = StepChoice(nodes, False, tokens, seconds)
        if window_tokens > 0:
            gain = self.window_gain
            w_nodes, w_tokens, w_seconds = best_prefix(
                paths, num_pending + window_tokens, self.curve, gain,
                tokens_of=self._tokens_of(tree.parents, num_pending, window_tokens))
            if w_tokens / w_seconds > tokens / seconds:
                choice = StepChoice(w_nodes, True, w_tokens - gain, w_seconds)
        self._last = choice
        return choice

    def observe(self, tree, fed_nodes: Sequence[int], accepted_nodes: Sequence[int]) -> None:
        """Learn from one verified step: ``fed_nodes`` (indices fed), ``accepted_nodes`` (the accepted path).

        A fed node is a trial when its parent is the root or was accepted; it succeeded when it was accepted.
        """
        node_depths = depths(tree.parents)
        accepted = set(int(i) for i in accepted_nodes)
        fed = set(int(i) for i in fed_nodes)
        assert accepted <= fed, f"accepted nodes {sorted(accepted - fed)} were not fed"
        for i in sorted(fed):
            par = tree.parents[i]
            if par < 0 or par in accepted:
                self.calibration.update(node_depths[i], tree.prob[i], i in accepted)
        last = self._last
        if last is not None:
            self.steps += 1
            self.sum_expected_tokens += last.expected_tokens
            self.sum_expected_seconds += last.expected_seconds
            if last.use_window:
                self.window_steps += 1
        from_window = getattr(tree, "from_window", None)
        if from_window and len(from_window) == len(tree.parents):  # a lookup that tags its nodes (SuffixLookup)
            self.window_accepted += sum(1 for i in accepted if from_window[i])
        self._last = None

    def expected_speedup(self) -> Optional[float]:
        """Expected tokens/s of the steps chosen so far over a plain one-token step's (None before any step)."""
        if not self.steps or not self.sum_expected_seconds:
            return None
        return (self.sum_expected_tokens / self.sum_expected_seconds) * self.curve(1)
