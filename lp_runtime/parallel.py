"""Lookahead parallelism (paper section 3.4; docs/architecture.md): who computes what in a step, and the merge.

Every rank of an LP group holds the whole model and the same decoding state. Per step, ``tree_plan`` (a pure
function of the step's shape and the group size) gives each rank some window columns and a run of the candidate
tree's nodes with their ancestors; each rank feeds the same pending tokens (so every KV cache stays identical with
no KV traffic), runs its forward pass with no communication, and then ONE all-gather of fixed-size int64 buffers
(each rank's kept argmaxes) lets every rank run the same deterministic merge and end the step in the same state.

``LocalGroup`` (LP degree 1) and ``LPGroup`` (K ranks over a ``torch.distributed`` process group) both have
``rank``, ``size``, ``debug``, ``plan``, ``merge``, ``check_consistent``. ``setup_parallel`` builds the whole
layout (world = dp x lp) for the entry point::

    ctx = setup_parallel(ParallelConfig(lp=2))      # under torchrun --nproc-per-node=4: 2 DP groups of 2
    dec = Decoder(model.to(ctx.device), decoding, lp=ctx.lp_group)
    mine = shard_questions(questions, ctx.dp_rank, ctx.dp_size)
    ...
    ctx.teardown()
"""
from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence, TypeVar

import torch

from . import distributed
from .config import ParallelConfig
from .tree import path, preorder, reindex
from .window import levels_of, step_tokens

Plan = tuple[tuple[int, ...], tuple[int, ...]]


def split_outputs(argmax: Sequence[int], num_columns: int, num_nodes: int) -> tuple[int, list[int], list[int]]:
    """Split one rank's kept outputs (layout order) into (x1 = the output at ``c``, one new token per window column,
    one output per tree node)."""
    x1 = int(argmax[0])
    window = [int(t) for t in argmax[1 : 1 + num_columns]]
    nodes = [int(t) for t in argmax[1 + num_columns : 1 + num_columns + num_nodes]]
    return x1, window, nodes


# ---------------------------------------------------------------------------------------------- shard plan
def rank_tokens(plan: Plan, num_pending: int, num_levels: int) -> int:
    """Input tokens one rank feeds for its ``(columns, nodes)``: pending + row 0 columns 1..max(C)
    + ``num_levels`` per column + its tree nodes, a repeated ancestor chain included (layout.py's token tree)."""
    cols, nodes = plan
    return num_pending + (max(cols) if cols else 0) + num_levels * len(cols) + len(nodes)


def _pack_columns(num_columns: int, num_levels: int, world: int, limit: int) -> Optional[list[int]]:
    """Each block's end column (exclusive) of greedy left-to-right contiguous blocks with cost (last column +
    levels x columns) <= ``limit``, or None when that needs more than ``world`` blocks. Greedy maximal blocks are
    the fewest because a block's cost grows with its end and shrinks with its start."""
    ends, start = [], 0
    while start < num_columns:
        if start + num_levels > limit or len(ends) == world:
            return None
        end = start + 1
        while end < num_columns and end + num_levels * (end + 1 - start) <= limit:
            end += 1
        ends.append(end)
        start = end
    return ends


def _fill_runs(order: Sequence[int], depth: Sequence[int], loads: Sequence[int],
               limit: int) -> Optional[list[tuple[int, int]]]:
    """Cut ``order`` into contiguous runs, one per rank, least-loaded rank first (lower rank on ties), each as
    long as fits in ``limit`` with its first node's ancestor chain; None when the tree does not fit."""
    runs, start = [(0, 0)] * len(loads), 0
    for r in sorted(range(len(loads)), key=lambda i: (loads[i], i)):
        if start == len(order):
            break
        room = limit - loads[r] - depth[order[start]]
        if room > 0:
            runs[r] = (start, min(len(order), start + room))
            start = runs[r][1]
    return runs if start == len(order) else None


@functools.lru_cache(maxsize=1024)
def _tree_plan(num_columns: int, num_levels: int, parents: tuple[int, ...], world: int) -> tuple[Plan, ...]:
    order, depth = preorder(parents)
    col_total = step_tokens(num_columns, num_levels)
    limit = max(num_columns - 1 + num_levels if num_columns else 0, 1 if parents else 0,
                -(-(col_total + len(parents)) // world))
    while True:  # terminates: at the one-rank total every column fits one block and the tree one run
        ends = _pack_columns(num_columns, num_levels, world, limit)
        if ends is not None:
            cols = [tuple(range(s, e)) for s, e in zip([0] + ends[:-1], ends)] + [()] * (world - len(ends))
            runs = _fill_runs(order, depth, [rank_tokens((c, ()), 0, num_levels) for c in cols], limit)
            if runs is not None:
                break
        limit += 1
    out = []
    for r, (a, b) in enumerate(runs):
        chain = path(parents, order[a])[:-1] if b > a else []  # the first node's ancestors, fed again on this rank
        out.append((cols[r], tuple(sorted({*order[a:b], *chain}))))
    return tuple(out)


def tree_plan(num_pending: int, num_columns: int, num_levels: int, parents: Sequence[int],
              world: int) -> tuple[Plan, ...]:
    """Each rank's (window columns, candidate node indices ascending, ancestor-closed) for one step, balanced
    on input tokens (paper section 3.4: the step's work split over the LP ranks).

    A rank computing columns C feeds the pending tokens (the same on every rank, so they do not affect the
    balance), row 0 columns 1..max(C) (row 0 is causal), ``num_levels`` tokens per column and its tree nodes.
    The tree is cut into contiguous runs of its depth-first ``preorder``; a rank holding the run ``order[a:b]``
    also feeds the ancestor chain of ``order[a]`` again (the merge takes a repeated node's output from the last
    rank holding it). So a deep, wide subtree (a successor table's first child) is split wherever the balance
    needs, at the price of one chain per cut. The plan minimises (over a simple family) the busiest rank's tokens
    T: columns go in contiguous blocks to ranks 0, 1, ..., each as long as fits in T, then the runs, the
    least-loaded rank first, each as long as fits in T with its chain; T is the smallest value for which this
    fits. Without columns the runs are the best contiguous cut, so the busiest rank's nodes never decrease as
    nodes are added in best-first order. Pure, deterministic (cached); ``num_pending`` is for the interface only.

    Worked example: W = 6 columns, L = 2 levels, three chains of 3 nodes, world = 3::

        >>> tree_plan(1, 6, 2, [-1, 0, 1, -1, 3, 4, -1, 6, 7], 3)
        (((0, 1, 2, 3), ()), ((4, 5), ()), ((), (0, 1, 2, 3, 4, 5, 6, 7, 8)))

    Besides the pending tokens, rank 0 feeds row 0 columns 1..3 (3) + 2 levels x 4 columns (8) = 11 tokens;
    rank 1: row 0 columns 1..5 (5) + 2 x 2 = 9; rank 2: the 9 nodes. One process feeds 5 + 12 + 9 = 26.

    ``ValueError`` for negative counts, ``world`` < 1 or a parent that does not precede its child.
    """
    if min(num_pending, num_columns, num_levels) < 0 or world < 1:
        raise ValueError(f"tree_plan(num_pending={num_pending}, num_columns={num_columns}, num_levels={num_levels}, "
                         f"world={world}): counts must be >= 0 and world >= 1")
    return _tree_plan(int(num_columns), int(num_levels), tuple(int(p) for p in parents), int(world))


def max_rank_tokens(num_pending: int, num_columns: int, num_levels: int, parents: Sequence[int],
                    world: int) -> int:
    """Input tokens of the busiest rank of a step (``tree_plan``): what the step costs under LP, where the ranks
    run in parallel. With ``world`` = 1 it is the whole step, pending + (W - 1) + levels x W + nodes.

        >>> max_rank_tokens(1, 6, 2, [-1, 0, 1, -1, 3, 4, -1, 6, 7], 3), max_rank_tokens(1, 6, 2, [], 1)
        (12, 18)
    """
    return max(rank_tokens(plan, num_pending, num_levels)
               for plan in tree_plan(num_pending, num_columns, num_levels, parents, world))


def longest_tree_prefix(parents: Sequence[int], world: int, rank_budget: int) -> int:
    """The longest prefix ``parents[:m]`` of a tree whose every prefix is a tree (best-first order) with
    ``max_rank_tokens(0, 0, 0, parents[:m], world)`` <= ``rank_budget``: a binary search (without columns the
    busiest rank never shrinks as nodes are added), each prefix planned as ``tree_plan`` plans it, on the whole
    tree's preorder filtered to the prefix (a prefix is ancestor-closed, so that is its own preorder): one
    preorder, not one per probe (the host time of every step under LP).

        >>> longest_tree_prefix([-1, 0, 1, -1, 3, 4], 2, 3)   # two chains of 3 nodes: one a rank
        6
        >>> longest_tree_prefix([-1, 0, 1, -1, 3, 4], 2, 2)   # node 2 would go to rank 1 with its chain 0 -> 1
        2
    """
    order, depth = preorder(parents)

    def busiest(m: int) -> int:
        nodes = [n for n in order if n < m]
        limit = max(1 if m else 0, -(-m // world))
        while (runs := _fill_runs(nodes, depth, [0] * world, limit)) is None:
            limit += 1
        return max((b - a + depth[nodes[a]] for a, b in runs if b > a), default=0)

    lo, hi = 0, len(parents)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if busiest(mid) <= rank_budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _global_rows(gathered: torch.Tensor, plans, num_columns: int, num_nodes: int) -> torch.Tensor:
    """The kept rows of the gathered (world, slot, 1 + K) buffer in global order (c from rank 0, columns, nodes):
    (1 + W + nodes, 1 + K); a node fed on several ranks is read from the last."""
    index = [(0, 0)] * (1 + num_columns + num_nodes)
    for r, (cols, nodes) in enumerate(plans):
        for i, j in enumerate(cols):
            index[1 + j] = (r, 1 + i)
        for i, n in enumerate(nodes):
            index[1 + num_columns + n] = (r, 1 + len(cols) + i)
    return gathered[torch.tensor([i[0] for i in index]), torch.tensor([i[1] for i in index])]


class BusiestRankCost:
    """A step's cost under LP (``policy.StepCost``): the input tokens of its busiest rank (``max_rank_tokens``), for
    ``lp_size`` ranks and a decoder with W = ``window_size`` columns (window tokens split by column)."""

    def __init__(self, lp_size: int, window_size: int) -> None:
        self.lp_size, self.window_size = lp_size, window_size

    def __call__(self, num_pending: int, window_tokens: int, parents: Sequence[int], nodes: Sequence[int]) -> int:
        cols = self.window_size if window_tokens > 0 else 0
        return max_rank_tokens(num_pending, cols, levels_of(cols, window_tokens), reindex(parents, sorted(nodes)),
                               self.lp_size)


# ---------------------------------------------------------------------------------------------- groups
@dataclass
class CommStats:
    """Step-exchange counters of a group's life: collectives, bytes gathered into this rank, seconds in them (host
    wall time, device sync included), and the debug consistency checks, counted apart."""

    collectives: int = 0
    bytes: int = 0
    seconds: float = 0.0
    debug_collectives: int = 0


def state_hash(*parts: Any) -> int:
    """A process-independent 63-bit hash of ints/tuples/lists (``hash()`` of str is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class LocalGroup:
    """LP degree 1: this process computes the whole step."""

    rank = 0
    size = 1
    debug = False

    def __init__(self) -> None:
        self.stats = CommStats()

    def plan(self, num_pending: int, num_columns: int, num_levels: int, parents: Sequence[int]) -> Plan:
        """This rank's (window columns, candidate node indices): all of them."""
        return tuple(range(num_columns)), tuple(range(len(parents)))

    def merge(self, kept: torch.Tensor, num_pending: int, num_columns: int, num_levels: int,
              parents: Sequence[int], topk: Optional[torch.Tensor] = None):
        """(x1, new window tokens for all W columns, one output per tree node, ``topk`` as given: int64 (1 + W +
        nodes, K) top-k ids of every kept row, or None); one host sync."""
        return (*split_outputs(kept.tolist(), num_columns, len(parents)), topk)

    def check_consistent(self, state_hash: int) -> None:
        """Debug check that every rank holds the same state; trivially true for one rank."""


class LPGroup:
    """K ranks sharing each step over a ``torch.distributed`` process ``group`` (gloo or NCCL;
    ``distributed.make_groups``; None = the default group). ``debug``: check every step that all ranks hold the same
    state (one extra 8-byte-per-rank all-gather)."""

    def __init__(self, group=None, *, debug: bool = False) -> None:
        self.group = group
        self.global_ranks = distributed.group_ranks(group)
        self.rank, self.size = distributed.group_rank(group), len(self.global_ranks)
        self.debug = debug
        self.stats = CommStats()
        self._checks = 0

    def plan(self, num_pending: int, num_columns: int, num_levels: int, parents: Sequence[int]) -> Plan:
        """This rank's (window columns, candidate node indices ascending) from ``tree_plan``."""
        return tree_plan(num_pending, num_columns, num_levels, parents, self.size)[self.rank]

    def merge(self, kept: torch.Tensor, num_pending: int, num_columns: int, num_levels: int,
              parents: Sequence[int], topk: Optional[torch.Tensor] = None):
        """Exchange every rank's kept outputs (one all-gather of a slot of 1 + the most columns + nodes any rank
        keeps) and reassemble the whole step's outputs, the same on every rank.

        ``kept``: int64 (1 + |C| + |nodes|,) in this rank's layout order; ``topk``: None or int64 (same rows, K),
        which then travel in the same all-gather. Returns (x1 from rank 0's slot, the W new window tokens in column
        order, one output per tree node, None or int64 (1 + W + nodes, K) the top-k of every row in global order).
        Raises ``RuntimeError`` when a peer dies or times out.
        """
        plans = tree_plan(num_pending, num_columns, num_levels, parents, self.size)
        slot = 1 + max(len(c) + len(n) for c, n in plans)
        assert kept.numel() == 1 + len(plans[self.rank][0]) + len(plans[self.rank][1])
        device = distributed.comm_device(self.group, kept.device)
        width = 1 + (topk.shape[1] if topk is not None else 0)
        buf = torch.zeros(slot, width, dtype=torch.int64, device=device)
        buf[: kept.numel(), 0] = kept.to(device=device, dtype=torch.int64)
        if topk is not None:
            buf[: kept.numel(), 1:] = topk.to(device=device, dtype=torch.int64)
        start = time.perf_counter()
        gathered = distributed.all_gather_fixed(buf, self.group).cpu()  # the step's one host sync
        self.stats.seconds += time.perf_counter() - start
        self.stats.collectives += 1
        self.stats.bytes += self.size * slot * width * 8
        rows = _global_rows(gathered, plans, num_columns, len(parents))
        topk_rows = None if topk is None else rows[:, 1:]
        return (*split_outputs(rows[:, 0].tolist(), num_columns, len(parents)), topk_rows)

    def check_consistent(self, state_hash: int) -> None:
        """Debug: all-gather each rank's state hash; raise ``RuntimeError`` naming the ranks that differ from
        the group's rank 0 (global ranks)."""
        self._checks += 1
        device = distributed.comm_device(self.group)
        hashes = distributed.all_gather_fixed(torch.tensor([state_hash], dtype=torch.int64, device=device),
                                              self.group).view(-1).tolist()
        self.stats.debug_collectives += 1
        bad = [self.global_ranks[i] for i, h in enumerate(hashes) if h != hashes[0]]
        if bad:
            raise RuntimeError(
                f"LP consistency check {self._checks} failed: rank(s) {bad} hold a different decoding state "
                f"(window, pool, cache length, output) than rank {self.global_ranks[0]}"
            )


# ---------------------------------------------------------------------------------------------- setup
@dataclass
class ParallelContext:
    """This process's place in a run: world = dp_size x lp_group.size.

    ``lp_group``: LocalGroup (lp = 1) or LPGroup; ``dp_rank``/``dp_size``: which share of the prompt set;
    ``rank``/``world_size``: global; ``is_writer``: global rank 0 (writes answers and the summary);
    ``device``: ``cuda:LOCAL_RANK`` with NCCL, else the CPU.
    """

    lp_group: Any
    dp_rank: int
    dp_size: int
    rank: int
    world_size: int
    is_writer: bool
    device: torch.device

    def teardown(self) -> None:
        """Wait for every rank, then leave the process group (also done at exit if forgotten, without the wait)."""
        distributed.destroy(barrier=True)


def setup_parallel(cfg: ParallelConfig) -> ParallelContext:
    """Detect the launcher, join the process group, split the world into LP groups of ``cfg.lp``.

    One process without a launcher: no process group; ``lp`` must then be 1. Raises ``ConfigError`` when
    ``cfg.lp`` does not divide the world size or NCCL lacks a GPU for this local rank (before joining, so
    the message comes first).
    """
    info = distributed.detect()
    backend = distributed.resolve_backend(cfg.backend)
    num_gpus = torch.cuda.device_count() if backend == "nccl" else 0
    distributed.validate(info.world_size, cfg.lp, backend, info.local_rank, num_gpus)
    info = distributed.init(backend, cfg.timeout_s)
    group, dp_rank, dp_size = distributed.make_groups(cfg.lp)
    lp_group = LocalGroup() if cfg.lp == 1 else LPGroup(group, debug=cfg.debug_check)
    device = torch.device("cuda", info.local_rank) if backend == "nccl" else torch.device("cpu")
    return ParallelContext(
        lp_group=lp_group, dp_rank=dp_rank, dp_size=dp_size, rank=info.rank, world_size=info.world_size,
        is_writer=info.rank == 0, device=device,
    )


T = TypeVar("T")


def shard_questions(questions: Sequence[T], dp_rank: int, dp_size: int) -> list[T]:
    """Round-robin share of the prompt set for data-parallel group ``dp_rank`` of ``dp_size`` (by index)."""
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank={dp_rank} is outside 0..{dp_size - 1}")
    return list(questions[dp_rank::dp_size])
