"""Lookahead parallelism (paper section 3.4; DESIGN.md section 3): who computes what in a step, and the merge.

Every rank of an LP group holds the whole model and the same decoding state. Per step, ``shard_plan`` (a pure
function of the step's shape and the group size) gives each rank some window columns and some candidates;
each rank feeds the same pending tokens (so every KV cache stays identical with no KV traffic), runs its
forward pass with no communication, and then ONE all-gather of fixed-size int64 buffers (each rank's kept
argmaxes) lets every rank run the same deterministic merge and end the step with the same window, pool and
cache.

``LocalGroup`` is LP degree 1 (one process computes everything); ``LPGroup`` is K ranks over a
``torch.distributed`` process group; both have ``rank``, ``size``, ``debug``, ``plan``, ``merge``,
``check_consistent``. ``setup_parallel`` builds the whole layout (world = dp x lp) for the entry point::

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

Plan = tuple[tuple[int, ...], tuple[int, ...]]


def split_outputs(argmax: Sequence[int], num_columns: int, num_candidates: int,
                  cand_len: int) -> tuple[int, list[int], list[list[int]]]:
    """Split one rank's kept argmaxes (layout order: ``c``, window columns, candidate tokens).

    Returns (x1 = argmax at ``c``, one new token per window column, one argmax row of ``cand_len`` per candidate).
    """
    x1 = int(argmax[0])
    window = [int(t) for t in argmax[1 : 1 + num_columns]]
    base = 1 + num_columns
    cands = [[int(t) for t in argmax[base + g * cand_len : base + (g + 1) * cand_len]] for g in range(num_candidates)]
    return x1, window, cands


# ---------------------------------------------------------------------------------------------- shard plan
def rank_tokens(plan: Plan, num_pending: int, num_levels: int, cand_len: int) -> int:
    """Input tokens one rank feeds for its ``(columns, candidates)``: pending + row 0 columns 1..max(C)
    + ``num_levels`` per column + ``cand_len`` per candidate (layout.py's token tree)."""
    cols, cands = plan
    return num_pending + (max(cols) if cols else 0) + num_levels * len(cols) + cand_len * len(cands)


def _pack_columns(num_columns: int, num_levels: int, world: int, limit: int) -> Optional[list[int]]:
    """Greedy left-to-right contiguous blocks with cost (last column + levels x columns) <= ``limit``.

    Returns each block's end column (exclusive), or None when it needs more than ``world`` blocks. Greedy
    maximal blocks give the fewest blocks because a block's cost grows with its end and shrinks with its start.
    """
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


@functools.lru_cache(maxsize=4096)
def shard_plan(num_pending: int, num_columns: int, num_levels: int, num_candidates: int, world: int,
               *, cand_len: int) -> tuple[Plan, ...]:
    """Each rank's ``(window columns, candidate indices)`` for one step, balanced on input tokens.

    A rank computing columns C feeds the pending tokens (the same on every rank, so they do not affect the
    balance), row 0 columns 1..max(C) (row 0 is causal), ``num_levels`` tokens per column and ``cand_len``
    (= N-1) tokens per candidate. The plan minimises (over a simple family) the largest rank's tokens T:
    columns go in contiguous blocks to ranks 0, 1, ..., each block as long as it fits in T (so later blocks,
    which pay for a longer row-0 prefix, are shorter), then candidates go one by one to the least-loaded rank
    (lowest rank on ties). T is the smallest value for which this fits. Every column and every candidate is
    assigned exactly once; ranks may be idle (world > columns + candidates). Pure and deterministic
    (cached); ``num_pending`` is accepted for the interface only.

    Worked example: W = 6 columns, L = 2 levels, G = 3 candidates of N-1 = 3 tokens, world = 3::

        >>> shard_plan(1, 6, 2, 3, 3, cand_len=3)
        (((0, 1, 2, 3), ()), ((4, 5), ()), ((), (0, 1, 2)))

    Besides the pending tokens, rank 0 feeds row 0 columns 1..3 (3) + 2 levels x 4 columns (8) = 11 tokens;
    rank 1: row 0 columns 1..5 (5) + 2 x 2 = 9; rank 2: 3 candidates x 3 = 9. One process feeds 5 + 12 + 9 = 26.

    Raises ``ValueError`` for negative counts or ``world < 1``.
    """
    if min(num_pending, num_columns, num_levels, num_candidates) < 0 or world < 1 or cand_len < 1:
        raise ValueError(
            f"shard_plan(num_pending={num_pending}, num_columns={num_columns}, num_levels={num_levels}, "
            f"num_candidates={num_candidates}, world={world}, cand_len={cand_len}): counts must be >= 0, "
            "world and cand_len >= 1"
        )
    limit = max(num_columns - 1 + num_levels if num_columns else 0, cand_len if num_candidates else 0)
    while True:  # terminates: at the one-rank total every column fits one block and the rest holds all candidates
        ends = _pack_columns(num_columns, num_levels, world, limit)
        if ends is not None:
            loads = [0] * world
            starts = [0] + ends[:-1]
            for r, (s, e) in enumerate(zip(starts, ends)):
                loads[r] = (e - 1) + num_levels * (e - s)
            if sum((limit - x) // cand_len for x in loads) >= num_candidates:
                break
        limit += 1
    cols = [tuple(range(s, e)) for s, e in zip(starts, ends)] + [()] * (world - len(ends))
    cands: list[list[int]] = [[] for _ in range(world)]
    for g in range(num_candidates):
        r = min(range(world), key=lambda i: (loads[i], i))
        cands[r].append(g)
        loads[r] += cand_len
    return tuple((cols[r], tuple(cands[r])) for r in range(world))


# ---------------------------------------------------------------------------------------------- groups
@dataclass
class CommStats:
    """Step-exchange counters since the last ``reset``: collectives, bytes gathered into this rank (the
    whole all-gather output, int64), seconds spent in them (host wall time, including the device sync),
    and the debug consistency checks, counted apart."""

    collectives: int = 0
    bytes: int = 0
    seconds: float = 0.0
    debug_collectives: int = 0

    def reset(self) -> None:
        self.collectives, self.bytes, self.seconds, self.debug_collectives = 0, 0, 0.0, 0

    def as_dict(self) -> dict[str, Any]:
        return {"collectives": self.collectives, "bytes": self.bytes, "seconds": self.seconds,
                "debug_collectives": self.debug_collectives}


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

    def plan(self, num_pending: int, num_columns: int, num_levels: int, num_candidates: int,
             cand_len: Optional[int] = None) -> Plan:
        """This rank's (window columns, candidate indices): all of them."""
        return tuple(range(num_columns)), tuple(range(num_candidates))

    def merge(self, kept_argmax: torch.Tensor, num_pending: int, num_columns: int, num_levels: int,
              num_candidates: int, cand_len: int) -> tuple[int, list[int], list[list[int]]]:
        """(x1, new window tokens for all W columns, argmax rows for all candidates); one host sync."""
        return split_outputs(kept_argmax.tolist(), num_columns, num_candidates, cand_len)

    def check_consistent(self, state_hash: int) -> None:
        """Debug check that every rank holds the same state; trivially true for one rank."""


class LPGroup:
    """K ranks sharing each step over a ``torch.distributed`` process group (gloo or NCCL).

    Args:
        group: the LP process group (``distributed.make_groups``; None = the default group).
        debug: check every step that all ranks hold the same state (one extra 8-byte-per-rank all-gather).
        slot_size: int64 entries each rank contributes per step. None (default): the largest slot this
            step's plan needs, ``1 + max over ranks (columns + candidates x (N-1))``, which every rank computes
            identically from the shared state; give ``slot_size_for(W, N, G)`` for one fixed shape per decoder
            (static buffers, CUDA graphs).
    """

    def __init__(self, group=None, *, debug: bool = False, slot_size: Optional[int] = None) -> None:
        self.group = group
        self.rank = distributed.group_rank(group)
        self.size = distributed.group_size(group)
        self.global_ranks = distributed.group_ranks(group)
        self.debug = debug
        self.slot_size = slot_size
        self.stats = CommStats()
        self._checks = 0

    @staticmethod
    def slot_size_for(window_size: int, ngram_size: int, guess_set_size: int) -> int:
        """The largest slot any step of a decoder with these W, N, G can need: 1 + W + G x (N-1)."""
        return 1 + window_size + guess_set_size * (ngram_size - 1)

    def _plan(self, num_pending, num_columns, num_levels, num_candidates, cand_len) -> tuple[Plan, ...]:
        return shard_plan(num_pending, num_columns, num_levels, num_candidates, self.size, cand_len=cand_len)

    def plan(self, num_pending: int, num_columns: int, num_levels: int, num_candidates: int,
             cand_len: Optional[int] = None) -> Plan:
        """This rank's (window columns, candidate indices) from ``shard_plan``; ``cand_len`` = N-1 weighs
        candidates against columns and must be the value later given to ``merge``."""
        if cand_len is None:
            raise ValueError("LPGroup.plan needs cand_len (= N-1) to balance candidates against window columns")
        return self._plan(num_pending, num_columns, num_levels, num_candidates, cand_len)[self.rank]

    def merge(self, kept_argmax: torch.Tensor, num_pending: int, num_columns: int, num_levels: int,
              num_candidates: int, cand_len: int) -> tuple[int, list[int], list[list[int]]]:
        """Exchange every rank's kept argmaxes (one all-gather) and reassemble the whole step's outputs.

        ``kept_argmax``: int64 (1 + |C| + |cands| x cand_len,) in this rank's layout order. Returns
        (x1 from rank 0's slot, the W new window tokens in column order, one argmax row per candidate), the
        same on every rank. Raises ``RuntimeError`` when a peer dies or times out.
        """
        plans = self._plan(num_pending, num_columns, num_levels, num_candidates, cand_len)
        need = 1 + max(len(c) + len(g) * cand_len for c, g in plans)
        slot = self.slot_size if self.slot_size is not None else need
        assert slot >= need, f"slot_size={slot} < {need} needed by this step's plan"
        assert kept_argmax.numel() == 1 + len(plans[self.rank][0]) + len(plans[self.rank][1]) * cand_len
        device = distributed.comm_device(self.group, kept_argmax.device)
        buf = torch.zeros(slot, dtype=torch.int64, device=device)
        buf[: kept_argmax.numel()] = kept_argmax.to(device=device, dtype=torch.int64)
        start = time.perf_counter()
        rows = distributed.all_gather_fixed(buf, self.group).tolist()  # the step's one host sync
        self.stats.seconds += time.perf_counter() - start
        self.stats.collectives += 1
        self.stats.bytes += self.size * slot * 8

        window = [0] * num_columns
        cand_rows: list[list[int]] = [[] for _ in range(num_candidates)]
        for row, (cols, cands) in zip(rows, plans):
            for i, j in enumerate(cols):
                window[j] = row[1 + i]
            base = 1 + len(cols)
            for i, g in enumerate(cands):
                cand_rows[g] = row[base + i * cand_len : base + (i + 1) * cand_len]
        return rows[0][0], window, cand_rows

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
    backend: Optional[str] = None

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
    group, dp_rank, dp_size, _ = distributed.make_groups(cfg.lp, backend)
    lp_group = LocalGroup() if cfg.lp == 1 else LPGroup(group, debug=cfg.debug_check)
    multi = distributed.is_initialized()
    device = torch.device("cuda", info.local_rank) if backend == "nccl" else torch.device("cpu")
    return ParallelContext(
        lp_group=lp_group, dp_rank=dp_rank, dp_size=dp_size, rank=info.rank, world_size=info.world_size,
        is_writer=info.rank == 0, device=device, backend=backend if multi else None,
    )


T = TypeVar("T")


def shard_questions(questions: Sequence[T], dp_rank: int, dp_size: int) -> list[T]:
    """Round-robin share of the prompt set for data-parallel group ``dp_rank`` of ``dp_size`` (by index)."""
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank={dp_rank} is outside 0..{dp_size - 1}")
    return list(questions[dp_rank::dp_size])
