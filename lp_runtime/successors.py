"""Candidates from the model's own predictions: a successor table, and one tree grown from every source.

Token Recycling (Luo et al. 2024, arXiv 2408.08696, section 3) keeps, for every token id, the top-k tokens the
model predicted after it the last time a forward pass computed a logits row there (an accepted token, a rejected
draft, a window cell): rows a step computes anyway, so the table costs one top-k per kept row, and even on chat,
where the text rarely repeats itself, it predicts function words, punctuation and the next sub-word.

``grow_tree`` builds ONE candidate tree from the suffix lookup's tree (text, answer store, window n-grams) and the
table, best first by the product of the per-node estimates along the path (``RankCalibration``), merging a token
both sources propose under the same parent: long suffix matches keep their chains (their nodes carry the lookup's
high estimates); the table fills in where nothing matches and extends every chain past its end.

Worked example (table rows: 5 -> [6, 7], 6 -> [8], 7 -> [], 8 -> []; no suffix tree; estimates by rank
0.5 / 0.25 whatever the depth; budget 3)::

    root 5: children 6 (0.5), 7 (0.25)          pop 6 (path 0.5): push its child 8 (0.5 x 0.5 = 0.25)
    pop 7 (0.25, pushed first), pop 8 (0.25)    tree tokens [6, 7, 8], parents [-1, -1, 0]
"""
from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .config import check_arguments
from .tree import CandidateTree, children
from .policy import AcceptanceCalibration

# Prior P(accepted | parent accepted) of the table's successor of each rank (rank 0 = the row's argmax).
SUCC_PRIOR = (0.45, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02)
JOINT_RANKS = 4  # ranks 0..3 of each table calibrate apart in a joint (token table, pair table) estimate


class SuccessorTable:
    """For every token id (``context=1``, Token Recycling) or pair of ids (``context=2``: (the token before the
    row's input token, that token), hashed into ``slots`` rows where the newest key wins its slot), the top-``k``
    successors (Token Recycling uses 8) from the newest logits row computed there.

    ``table``: int32 (rows, k), best first, -1 = empty (context 1: vocab_size rows indexed by token id, 1.5 MB for
    SmolLM2 at k = 8; context 2: ``slots`` rows, 2^18 x 8 = 8 MB). ``ValueError`` for vocab_size < 1, k < 1, a
    context other than 1 or 2, or slots not a power of two >= 2.

        >>> t = SuccessorTable(10, k=2)
        >>> t.update([3, 4, 3], [[1, 2], [5, 6], [7, 8]])   # two rows at token 3: the later one wins
        >>> t.successors(3), t.successors(4), t.successors(9)
        ([7, 8], [5, 6], [])
        >>> p = SuccessorTable(10, k=2, context=2, slots=16)
        >>> p.update([3, 3], [[1, 2], [5, 6]], prev=[7, 8])   # (7, 3) and (8, 3) are two keys
        >>> p.successors(3, 7), p.successors(3, 8), p.successors(3, 9)
        ([1, 2], [5, 6], [])
    """

    def __init__(self, vocab_size: int, k: int = 8, *, context: int = 1, slots: int = 1 << 18) -> None:
        if vocab_size < 1 or k < 1 or context not in (1, 2) or slots < 2 or slots & (slots - 1):
            raise ValueError(f"SuccessorTable(vocab_size={vocab_size}, k={k}, context={context}, slots={slots}): "
                             "need vocab_size, k >= 1, context 1 or 2 and slots a power of two >= 2")
        self.k, self.vocab, self.context = int(k), int(vocab_size), int(context)
        self.table = np.full((self.vocab if context == 1 else slots, self.k), -1, dtype=np.int32)
        self.keys = np.full(slots, -1, dtype=np.int64) if context == 2 else None
        self._shift = np.uint64(64 - (slots.bit_length() - 1))
        self.updates = 0

    def _slots(self, ids: np.ndarray, prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.keys is None:
            return ids, ids
        keys = prev * self.vocab + ids  # Fibonacci hashing of the pair (uint64 arithmetic wraps)
        return ((keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> self._shift).astype(np.int64), keys

    def update(self, tokens: Sequence[int], successors, prev: Optional[Sequence[int]] = None, *,
               only_empty: bool = False) -> None:
        """Write ``successors[i]`` (the top-k ids, best first, of the row computed at ``tokens[i]``; extra columns
        ignored) as the row of ``tokens[i]`` (context 2: of (``prev[i]``, ``tokens[i]``), skipped where ``prev[i]``
        < 0), in time order: for a key given twice the later row wins. ``only_empty`` (context 1): write only keys
        with no row yet (the prompt's rows must not replace rows computed in answers). ``ValueError`` when the
        lengths differ, a row is shorter than k, an id is outside the vocabulary, or ``only_empty`` in context 2."""
        ids, rows = _checked(tokens, successors, self.k, self.vocab)
        if only_empty:
            if self.keys is not None:
                raise ValueError("update(only_empty=True) is for a context-1 table")
            ids, rows = ids[self.table[ids, 0] < 0], rows[self.table[ids, 0] < 0]
        before = np.asarray(prev if prev is not None else [-1] * ids.size, dtype=np.int64).reshape(-1)
        if self.keys is not None:
            ids, rows, before = ids[before >= 0], rows[before >= 0], before[before >= 0]
        if ids.size == 0:
            return
        slots, keys = self._slots(ids, before)
        _, last = np.unique(slots[::-1], return_index=True)  # the last row of each slot wins
        keep = ids.shape[0] - 1 - last
        self.table[slots[keep]] = rows[keep, : self.k]
        if self.keys is not None:
            self.keys[slots[keep]] = keys[keep]
        self.updates += 1

    def successors(self, token: int, prev: int = -1) -> list[int]:
        """The successors of ``token`` (context 2: after ``prev``), best first; empty when no row was computed
        there (or ``prev`` < 0 in context 2)."""
        if self.keys is not None:
            if prev < 0:
                return []
            key = int(prev) * self.vocab + int(token)  # _slots' hash of one pair, in Python ints (mod 2^64)
            slot = ((key * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> int(self._shift)
            if self.keys[slot] != key:
                return []
            token = slot
        return [t for t in self.table[int(token)].tolist() if t >= 0]

    def rows_of(self, tokens: np.ndarray, prev: np.ndarray, width: int) -> np.ndarray:
        """``successors`` of many keys at once, the first ``width`` of each: int64 (n,) ``tokens`` (context 2:
        after ``prev``, int64 (n,)) -> int64 (n, width), best first, -1 padded (no row there, or ``prev`` < 0 in
        context 2). A row is read as written: the top-k ids of a logits row, distinct, -1 only at the end."""
        if self.keys is None:
            rows = self.table[tokens, :width]
        else:
            slots, keys = self._slots(tokens, prev)
            rows = np.where(((prev >= 0) & (self.keys[slots] == keys))[:, None], self.table[slots, :width], -1)
        return rows.astype(np.int64)

    def state(self) -> tuple:
        """A hashable summary (for the LP consistency check): updates and a digest of the table."""
        return self.updates, hashlib.blake2b(self.table.tobytes(), digest_size=8).hexdigest()  # hash() is salted


def _checked(tokens, successors, k: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """``update``'s rows as int64 arrays (n,) and (n, >= k); ``ValueError`` for other shapes or ids outside the
    vocabulary."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    rows = np.asarray(successors, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[0] != ids.shape[0] or rows.shape[1] < k:
        raise ValueError(f"update: {ids.shape[0]} tokens and successors of shape {rows.shape}; need "
                         f"({ids.shape[0]}, >= {k})")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab or rows[:, :k].min() < 0 or rows[:, :k].max() >= vocab):
        raise ValueError(f"update: token ids must be in 0..{vocab - 1}")
    return ids, rows


class RankTables:
    """Under LP, ``ranks`` token tables (``SuccessorTable(vocab_size, k)`` each, ``ranks`` x 4 x vocab_size x k
    bytes: 25 MB for SmolLM2 at k = 16 and 8 ranks), read as one: a token's row interleaves the tables' rows by
    rank (each table's best, then each table's second, ...), a repeated id kept at its first place.

    At K = 8 a step writes about 600 rows, so with one table a frequent token's row is rewritten every step, mostly
    from branches that were rejected; with a table per rank, each rank's subtree writes only its own table and the
    K newest rows of a token, computed in different contexts, all stay candidates (docs/benchmarks.md 6d, "rank
    tables"). Every rank writes every rank's rows (they travel in the step's all-gather), so every rank holds the
    same tables. ``ValueError`` from ``SuccessorTable``, or for ranks < 1.

        >>> t = RankTables(10, 2, ranks=2)
        >>> t.update([3, 3, 4], [[1, 2], [5, 1], [6, 7]], owners=[0, 1, -1])   # -1: every table
        >>> t.successors(3), t.successors(4), t.successors(9)
        ([1, 5, 2], [6, 7], [])
    """

    def __init__(self, vocab_size: int, k: int, ranks: int) -> None:
        if ranks < 1:
            raise ValueError(f"RankTables(ranks={ranks}): need ranks >= 1")
        self.tables = [SuccessorTable(vocab_size, k) for _ in range(ranks)]
        self.k = self.tables[0].k
        # (vocab, k, ranks): a token's row, read in the interleaved order, is contiguous; each table's is a view
        self.rows = np.stack([t.table for t in self.tables], axis=2)
        for r, t in enumerate(self.tables):
            t.table = self.rows[:, :, r]
        self.merged = np.full((vocab_size, self.k), -1, dtype=np.int32)  # each row's first k distinct ids

    def update(self, tokens: Sequence[int], successors, owners: Optional[Sequence[int]] = None, *,
               only_empty: bool = False) -> None:
        """``SuccessorTable.update`` on the table of ``owners[i]`` for row i (-1 or no ``owners``: every table)."""
        ids, rows = _checked(tokens, successors, self.k, self.tables[0].vocab)
        if ids.size == 0:  # e.g. a one-token prompt's prefill rows
            return
        owners = np.asarray(owners if owners is not None else [-1] * ids.size, dtype=np.int64).reshape(-1)
        ranks = len(self.tables)
        every = np.flatnonzero(owners < 0)  # row i of every table: (token, rank, i) for each rank
        index = np.concatenate([np.flatnonzero(owners >= 0), np.repeat(every, ranks)])
        rank = np.concatenate([owners[owners >= 0], np.tile(np.arange(ranks), every.size)])
        token = ids[index]
        if only_empty:  # as each table's update: only keys without a row before this batch
            empty = self.rows[token, 0, rank] < 0
            index, rank, token = index[empty], rank[empty], token[empty]
            if index.size == 0:
                return
        order = np.lexsort((index, token * ranks + rank))  # by (token, rank), then time: the last row of each wins
        key = (token * ranks + rank)[order]
        last = order[np.append(key[1:] != key[:-1], True)]
        self.rows[token[last], :, rank[last]] = rows[index[last], :self.k]
        for r in np.unique(rank):
            self.tables[r].updates += 1
        touched = np.unique(ids)
        self.merged[touched] = _first_ids(self.rows[touched].reshape(touched.size, -1), self.k)

    def successors(self, token: int, prev: int = -1) -> list[int]:
        row = self.rows_of(np.array([token], dtype=np.int64), None, self.k * len(self.tables))[0]
        return row[row >= 0].tolist()

    def rows_of(self, tokens: np.ndarray, prev, width: int) -> np.ndarray:
        """``SuccessorTable.rows_of`` on the interleaved rows (``prev`` unused; up to k wide: kept merged by
        ``update``, so a read is one gather)."""
        if width <= self.k:
            return self.merged[tokens, :width].astype(np.int64)
        return _first_ids(self.rows[tokens].reshape(len(tokens), -1), width)

    def state(self) -> tuple:
        return tuple(table.state() for table in self.tables)


class RankCalibration(AcceptanceCalibration):
    """P(node accepted | parent accepted) per (depth, rank), learned online around a prior per rank
    (``AcceptanceCalibration``'s counting, with a rank instead of a raw estimate and no clipping).

    ``estimate(depth, rank) = (successes + strength * prior[rank]) / (trials + strength)``; depths past
    ``max_depth`` share the last bucket, ranks past the prior's length use its last value. ``rank`` may also be
    a tuple of ranks, one per table (None: not in that table's row; e.g. the token table's and the pair table's):
    each combination is its own bucket (ranks past ``JOINT_RANKS`` - 1 share one), prior by the best rank, so a
    successor both tables agree on is learned apart from one only a single table proposes.

        >>> cal = RankCalibration(prior=(0.5, 0.25), strength=2.0)
        >>> cal.estimate(1, 0), cal.estimate(3, 5)
        (0.5, 0.25)
        >>> cal.update(1, 0, True); cal.update(1, 0, True); cal.estimate(1, 0)   # (2 + 2 * 0.5) / (2 + 2)
        0.75
    """

    def __init__(self, prior: Sequence[float] = SUCC_PRIOR, strength: float = 8.0, max_depth: int = 6) -> None:
        if not prior or not all(0 <= p <= 1 for p in prior) or strength <= 0 or max_depth < 1:
            raise ValueError(f"RankCalibration(prior={prior}, strength={strength}, max_depth={max_depth}): need "
                             "a non-empty prior of probabilities in [0, 1], strength > 0 and max_depth >= 1")
        super().__init__(float(strength), int(max_depth))
        self.prior = tuple(float(p) for p in prior)
        self._grids: dict = {}

    def bucket(self, depth: int, rank) -> tuple:
        """The (depth, rank) bucket that counts ``rank``'s trials at ``depth``."""
        if isinstance(rank, tuple):
            rank = tuple(-1 if r is None else min(r, JOINT_RANKS - 1) for r in rank)
        else:
            rank = min(rank, len(self.prior) - 1)
        return min(max(depth, 1), self.max_depth), rank

    def estimate(self, depth: int, rank) -> float:
        key = self.bucket(depth, rank)
        best = min(r for r in rank if r is not None) if isinstance(rank, tuple) else rank
        prior = self.prior[min(best, len(self.prior) - 1)]
        return (self.successes.get(key, 0) + self.strength * prior) / (self.trials.get(key, 0) + self.strength)

    def grid(self, width: int, joint: bool) -> np.ndarray:
        """``estimate`` for every depth bucket and every rank below ``width`` at once (the same floating-point
        operations, so the same values): float64 ``[bucket, rank + 1]`` for int ranks, or with ``joint``
        ``[bucket, rank + 1, pair rank + 1]`` for pairs of ranks (rank -1 = None; 0.0 where both are None).
        Bucket = min(depth, max_depth); row 0 is unused."""
        if (width, joint) not in self._grids:  # which bucket and prior each rank (pair) reads: fixed
            ranks = np.arange(-1, width)
            if joint:
                bucket = np.where(ranks < 0, 0, np.minimum(ranks, JOINT_RANKS - 1) + 1)  # index of (-1, 0, .., 3)
                r1, r2 = np.meshgrid(ranks, ranks, indexing="ij")
                best = np.where(r1 < 0, r2, np.where(r2 < 0, r1, np.minimum(r1, r2)))
                shape, at = (JOINT_RANKS + 1, JOINT_RANKS + 1), (slice(None), *np.ix_(bucket, bucket))
            else:
                bucket = np.minimum(np.maximum(ranks, 0), len(self.prior) - 1)
                best, shape, at = ranks, (len(self.prior),), (slice(None), bucket)
            prior = self.strength * np.asarray(self.prior)[np.minimum(np.maximum(best, 0), len(self.prior) - 1)]
            self._grids[width, joint] = shape, at, prior, best < 0
        shape, at, prior, neither = self._grids[width, joint]
        counts = np.zeros((2, self.max_depth + 1, *shape))
        for index, table in enumerate((self.successes, self.trials)):
            for (depth, rank), n in table.items():
                if isinstance(rank, tuple) == joint:
                    counts[(index, depth) + ((rank[0] + 1, rank[1] + 1) if joint else (rank,))] = n
        est = (counts[0][at] + prior) / (counts[1][at] + self.strength)
        est[:, neither] = 0.0
        return est


@dataclass
class GrownTree:
    """A tree from ``grow_tree`` (``prob``: each node's P(accepted | parent accepted)) and, per node, where it came
    from: ``suffix_raw``, the suffix lookup's raw estimate, ``succ_rank`` / ``pair_rank``, its rank in its parent's
    row of the token / pair table (None where that source did not propose it)."""

    tree: CandidateTree = field(default_factory=CandidateTree)
    suffix_raw: list = field(default_factory=list)
    succ_rank: list = field(default_factory=list)
    pair_rank: list = field(default_factory=list)

    def append(self, token: int, parent: int, prob: float, suffix_raw, succ_rank, pair_rank) -> int:
        """Add one node (``CandidateTree.append``) with its sources; its index."""
        self.suffix_raw.append(suffix_raw)
        self.succ_rank.append(succ_rank)
        self.pair_rank.append(pair_rank)
        return self.tree.append(token, parent, prob)


def _first_ids(rows: np.ndarray, width: int) -> np.ndarray:
    """Each row's first ``width`` distinct ids >= 0, in row order: int (n, L) -> int64 (n, width), -1 padded."""
    n, length = rows.shape
    rows = rows.astype(np.int64)
    key = np.sort(rows * length + np.arange(length), axis=1)  # by id, then place
    ids = key // length  # -1 for an empty entry (floor division)
    repeat = np.zeros(key.shape, dtype=bool)
    repeat[:, 1:] = ids[:, 1:] == ids[:, :-1]
    places = np.sort(np.where(repeat | (ids < 0), length, key - ids * length), axis=1)[:, :width]  # first places
    out = np.take_along_axis(rows, np.minimum(places, length - 1), axis=1)
    out[places >= length] = -1
    return out if width <= length else np.pad(out, ((0, 0), (0, width - length)), constant_values=-1)


EXPAND = 64  # grow_tree: nodes expanded at once, the best first
HEAP_WORK = 384  # grow_tree: budget x width up to which a heap grows a token table's tree (docs 6d)
SIBLING_GROUP = 1 << 20  # grow_tree's order among siblings: the suffix tree's children, the token table's, the pair's


def _children(front: dict, suffix, kids: dict, suffix_cal, grid: np.ndarray, table, pair, width: int) -> dict:
    """``grow_tree``'s candidates: the children of the ``front`` nodes (arrays ``id`` (-1 = the root), ``token``,
    ``prev`` (the token before), ``path`` (path estimate), ``snode`` (suffix-tree node, -1: none), ``depth`` (the
    children's)), as arrays: ``row`` (index into ``front``), ``token``, ``est``, ``key`` (-path estimate),
    ``code`` (place among siblings), ``snode``, ``raw`` (suffix raw estimate, nan: none), ``r1`` / ``r2`` (rank in
    the token / pair table's row, -1: none). A token several sources propose is one child with the larger
    estimate, at its first place; an id repeated among a node's suffix children keeps the last suffix node."""
    n, level = front["token"].size, np.minimum(front["depth"], grid.shape[0] - 1)
    empty = np.full((n, 0), -1, dtype=np.int64)
    a = table.rows_of(front["token"], front["prev"], width) if table is not None else empty
    b = pair.rows_of(front["token"], front["prev"], width) if pair is not None else empty
    a_in_b, a_free, b_free = np.full(a.shape, -1), a >= 0, b >= 0  # a_in_b: an entry's rank in b's row
    both = np.flatnonzero(a_free[:, 0] & b_free[:, 0]) if b.shape[1] and a.shape[1] else []
    if len(both):  # -2: b's padding never equals a's (-1)
        same = a[both, :, None] == np.where(b_free[both], b[both], -2)[:, None, :]
        a_in_b[both] = np.where(same.any(2), same.argmax(2), -1)
        b_free[both] &= ~same.any(1)
    joint = grid.ndim == 3
    sfx = {k: [] for k in ("row", "token", "est", "code", "snode", "raw", "r1", "r2")}
    matched = np.flatnonzero((front["snode"] >= 0) | (front["id"] < 0)).tolist()
    for i, row_a, row_b in zip(matched, a[matched].tolist(), b[matched].tolist()):
        depth = int(front["depth"][i])
        for j, (t, s) in enumerate({suffix.tokens[s]: s for s in kids.get(int(front["snode"][i]), ())}.items()):
            r1, r2 = (row.index(t) if t in row else -1 for row in (row_a, row_b))
            if r1 >= 0:  # the table's entry becomes this node
                a_free[i, r1] = False
            if r2 >= 0:
                b_free[i, r2] = False
            est = suffix_cal.estimate(depth, suffix.prob[s])
            if r1 >= 0 or r2 >= 0:
                est = max(est, float(grid[level[i], r1 + 1, r2 + 1] if joint else grid[level[i], r1 + 1]))
            for k, v in zip(sfx, (i, t, est, j, s, suffix.prob[s], r1, r2)):
                sfx[k].append(v)
    i1, j1 = np.nonzero(a_free)
    i2, j2 = np.nonzero(b_free)
    r2_of_1 = a_in_b[i1, j1]
    est1 = grid[level[i1], j1 + 1, r2_of_1 + 1] if joint else grid[level[i1], j1 + 1]
    est2 = grid[level[i2], 0, j2 + 1] if joint else np.zeros(0)
    none = np.full(i1.size + i2.size, -1)
    out = {"row": np.concatenate([i1, i2]), "token": np.concatenate([a[i1, j1], b[i2, j2]]),
           "est": np.concatenate([est1, est2]), "code": np.concatenate([SIBLING_GROUP + j1, 2 * SIBLING_GROUP + j2]),
           "snode": none, "raw": np.full(none.size, np.nan), "r1": np.concatenate([j1, none[i1.size:]]),
           "r2": np.concatenate([r2_of_1, j2])}
    if sfx["row"]:
        out = {k: np.concatenate([np.asarray(sfx[k], dtype=v.dtype), v]) for k, v in out.items()}
    out["key"] = -front["path"][out["row"]] * out["est"]
    return out


def _append(pool: dict, new: dict, size: int) -> int:
    """Append the arrays ``new`` to the arrays ``pool`` holding ``size`` rows (capacity doubled when full, in
    place); the new size."""
    end = size + len(new["key"])
    if not pool or end > len(pool["key"]):
        cap = max(2 * end, 1024)
        for k, v in new.items():
            grown = np.empty(cap, dtype=v.dtype)
            if k in pool:
                grown[:size] = pool[k][:size]
            pool[k] = grown
    for k, v in new.items():
        pool[k][size:end] = v
    return end


def _best_first(nodes: dict, budget: int) -> np.ndarray:
    """The first ``budget`` of ``nodes`` (arrays ``key``, ``parent``, ``code``, ``depth``) in the order a heap of
    (key, push counter) pops them, as indices: by key, then by the parent's place in that order (the root first),
    then by the place among siblings; i.e. lexicographically by the keys of the node, its parent, its grandparent,
    ... (-inf past the root), then by the places among siblings from the root down."""
    key, parent, depth = nodes["key"], nodes["parent"], nodes["depth"]
    bound = np.partition(key, budget - 1)[budget - 1] if key.size > budget else math.inf
    sel = np.flatnonzero(key <= bound)
    deepest = int(depth[sel].max()) if sel.size else 0
    up_keys, places, anc = [], np.full((sel.size, deepest), -1, dtype=np.int64), sel
    for j in range(deepest):
        live = anc >= 0
        at = np.where(live, anc, 0)
        up_keys.append(np.where(live, key[at], -np.inf))
        places[live, depth[sel][live] - 1 - j] = nodes["code"][at[live]]
        anc = np.where(live, parent[at], -1)
    return sel[np.lexsort([*places.T[::-1], *up_keys[::-1]])][:budget]


def _grow_heap(root_token: int, suffix, kids: dict, table, pair, budget: int, suffix_cal, succ_cal,
               max_depth: int, width: int, root_prev: int) -> GrownTree:
    """``grow_tree`` with a heap of candidates, one node at a time: fewer calls than the arrays for a small tree."""
    out, heap, memo = GrownTree(), [], {}  # memo: (depth bucket, rank, pair rank) -> estimate

    def push(parent: int, token: int, prev: int, depth: int, path_p: float, s_node: int) -> None:
        first = {t: r for r, t in enumerate(table.successors(token, prev)[:width])} if table is not None else {}
        second = {t: r for r, t in enumerate(pair.successors(token, prev)[:width])} if pair is not None else {}
        cand = []  # [token, estimate, suffix node, suffix raw, rank, pair rank]: the suffix's, the table's, the pair's
        for t, s in {suffix.tokens[s]: s for s in kids.get(s_node, ()) if (s_node >= 0 or parent < 0)}.items():
            cand.append([t, suffix_cal.estimate(depth, suffix.prob[s]), s, suffix.prob[s], first.pop(t, None),
                         second.pop(t, None)])
        cand += [[t, 0.0, -1, None, r, second.pop(t, None)] for t, r in first.items()]
        cand += [[t, 0.0, -1, None, None, r] for t, r in second.items()]
        for c in cand:
            if c[4] is not None or c[5] is not None:
                key = (min(depth, succ_cal.max_depth), c[4], c[5])
                if key not in memo:
                    memo[key] = succ_cal.estimate(depth, c[4] if pair is None else (c[4], c[5]))
                c[1] = max(c[1], memo[key])
            heapq.heappush(heap, (-path_p * c[1], len(out.tree) + len(heap), parent, depth, c))

    push(-1, root_token, root_prev, 1, 1.0, -1)
    while heap and len(out.tree) < budget:
        neg_p, _, parent, depth, (t, est, s, raw, rank, pair_rank) = heapq.heappop(heap)
        node = out.append(t, parent, est, raw, rank, pair_rank)
        if depth < max_depth:
            push(node, t, out.tree.tokens[parent] if parent >= 0 else root_token, depth + 1, -neg_p, s)
    return out


def grow_tree(root_token: int, suffix: Optional[CandidateTree], table: Optional[SuccessorTable], budget: int, *,
              suffix_cal: Optional[AcceptanceCalibration] = None, succ_cal: Optional[RankCalibration] = None,
              max_depth: int = 16, width: int = 8, pair: Optional[SuccessorTable] = None,
              root_prev: int = -1) -> GrownTree:
    """One candidate tree of at most ``budget`` nodes rooted at ``root_token`` (``c``), best first by path estimate.

    ``suffix``: the suffix lookup's tree (``prob`` = its raw estimates) or None; ``suffix_cal`` / ``succ_cal`` turn
    the sources' raw values into P(accepted | parent accepted) (default: fresh ones, i.e. the priors). ``pair``,
    ``root_prev``: a ``context=2`` table and the token before ``root_token``; with it ``succ_cal`` is keyed by
    (rank in the token table's row, rank in the pair table's row).

    A node's children are the suffix tree's children of the node it matches (if any) and the first ``width``
    successors of its token in each table (the pair table's row of (its parent's token, its token)); a token
    proposed by several sources is one node with the larger estimate. Nodes come out best first, parents before
    children, ties to the node a heap would have been given first (its parent taken first, then its place among
    siblings), none deeper than ``max_depth``: the tree a best-first search with a heap grows (written plainly in
    tests/test_successors.py). A small tree from a token table (one process, up to ``HEAP_WORK`` = budget x width)
    is grown so, one node at a time. Under LP the tree has 600+ nodes and its host time adds to every step, so it
    is grown in arrays, the ``EXPAND`` best open nodes at a time (about as many rounds as the tree is deep), and
    put in the heap's order at the end (``_best_first``): 10x faster at K = 8, 2x slower for a 12-node tree.
    Estimates are <= 1, so a node's key (-path estimate) is >= its parent's: with ``budget`` nodes found so far
    at keys <= B, no node past B is ever taken, nor its subtree. ``ValueError`` for a negative budget.
    """
    if budget < 0:
        raise ValueError(f"grow_tree(budget={budget}): the node budget must be >= 0")
    suffix_cal, succ_cal = suffix_cal or AcceptanceCalibration(), succ_cal or RankCalibration()
    kids = children(suffix.parents) if suffix is not None else {}
    grow = _grow_heap if budget * width <= HEAP_WORK and not isinstance(table, RankTables) else _grow_arrays
    return grow(root_token, suffix, kids, table, pair, budget, suffix_cal, succ_cal, max_depth, width, root_prev)


def _grow_arrays(root_token: int, suffix, kids: dict, table, pair, budget: int, suffix_cal, succ_cal,
                 max_depth: int, width: int, root_prev: int) -> GrownTree:
    """``grow_tree`` in arrays, the ``EXPAND`` best open nodes at a time, then put in the heap's order."""
    grid = succ_cal.grid(width, pair is not None)
    front = {"id": np.array([-1]), "token": np.array([root_token], dtype=np.int64), "depth": np.array([1]),
             "prev": np.array([root_prev], dtype=np.int64), "path": np.array([1.0]), "snode": np.array([-1])}
    nodes, found, rest = {}, 0, []  # every candidate so far: the loop's arrays (capacity >= found), the others
    best, live = np.zeros(0), np.zeros(0, dtype=np.int64)  # the keys <= the bound; the open nodes there, ascending
    while budget and front["id"].size:
        c = _children(front, suffix, kids, suffix_cal, grid, table, pair, width)
        c["parent"], c["depth"], c["prev"] = front["id"][c["row"]], front["depth"][c["row"]], front["token"][c["row"]]
        is_open = c["depth"] < max(max_depth, 1)
        rest.append({k: c.pop(k) for k in ("est", "code", "raw", "r1", "r2", "parent")})
        del c["row"]
        start, found = found, _append(nodes, c, found)
        best = np.concatenate([best, c["key"]])  # holds the budget best keys of all found so far
        bound = np.partition(best, budget - 1)[budget - 1] if found > budget else math.inf
        best = best[best <= bound]
        new = start + np.flatnonzero(is_open & (c["key"] <= bound))  # past the bound: never taken, nor its subtree
        todo = live = np.concatenate([live[nodes["key"][live] <= bound], new])
        if todo.size > EXPAND:
            pick = np.argpartition(nodes["key"][todo], EXPAND - 1)[:EXPAND]
            todo, left = live[pick], np.ones(live.size, dtype=bool)
            left[pick] = False
            live = live[left]
        else:
            live = live[:0]
        front = {"id": todo, "token": nodes["token"][todo], "depth": nodes["depth"][todo] + 1,
                 "prev": nodes["prev"][todo], "path": -nodes["key"][todo], "snode": nodes["snode"][todo]}
    if not found:
        return GrownTree()
    nodes = {**{k: v[:found] for k, v in nodes.items()}, **{k: np.concatenate([r[k] for r in rest]) for k in rest[0]}}
    take = _best_first(nodes, budget)
    place = np.full(nodes["key"].size, -1, dtype=np.int64)
    place[take] = np.arange(take.size)
    parents = np.where(nodes["parent"][take] >= 0, place[np.maximum(nodes["parent"][take], 0)], -1)
    none = lambda a, missing: [None if m else v for v, m in zip(a.tolist(), missing.tolist())]  # noqa: E731
    return GrownTree(CandidateTree(nodes["token"][take].tolist(), parents.tolist(), nodes["est"][take].tolist()),
                     none(nodes["raw"][take], np.isnan(nodes["raw"][take])),
                     none(nodes["r1"][take], nodes["r1"][take] < 0), none(nodes["r2"][take], nodes["r2"][take] < 0))


TABLE_MAX_DEPTH = 16  # SuccessorProposer's deepest node by default (grow_tree's max_depth)


class SuccessorProposer:
    """A ``proposers.Proposer``: one tree grown from a suffix proposer's tree and the successor table.

    Args:
        budget: most tree nodes a step proposes (the step policy may feed fewer).
        suffix: the ``proposers.SuffixProposer`` whose tree is merged in (None: the table alone).
        k: successors kept per token (the ``topk`` asked of every kept logits row); max_depth, width: ``grow_tree``'s.
        context: 1 = the token table alone (Token Recycling); 2 = also a pair table (``SuccessorTable(context=2)``),
            calibrated jointly with the token table (``RankCalibration`` on the pair of ranks).
        table_when_sampling: keep using the job's table in sampled calls (default False: a sampled call starts a
            table of its own, so a seed's draws do not depend on the answers before it; the law is exact either way).
        prefill: also fill the token table's EMPTY rows from the prompt's last ``step.PREFILL_ROWS`` rows
            (``prefill_topk`` = k; ``observe_prefill``); a row already computed (in an answer) is never replaced.
        lp_size, rank_budget: under LP, cut the grown tree to its longest best-first prefix whose busiest rank feeds
            at most ``rank_budget`` nodes (``cap_ranks``; None = no cap), as one process with that budget would.
        rank_tables: under LP, one token table per rank (``RankTables``): a fed node's row goes to the table of the
            rank ``tree_ranks`` gives it, so a token keeps up to ``lp_size`` rows from different contexts.

    Each step: ``propose`` grows the tree from ``c``; ``observe`` gets the accepted tokens and the step's rows
    (``step.StepRows``, every LP rank's, so every rank writes the same table), learns the calibrations from the fed
    nodes (a trial: its parent is the root or was accepted) and writes the rows in time order, the accepted path's
    rows (the truest context) last. The tables live across the decoder's prompts; ``reset`` empties them.
    ``ValueError`` (``config.check_arguments``: every bad one named) for a budget not an int >= 0, a context other
    than 1 or 2, lp_size, k, width or max_depth not an int >= 1, rank_budget neither None nor an int >= 1, a flag
    not True or False, or k above ``vocab_size``.
    """

    def __init__(self, vocab_size: int, budget: int, *, suffix=None, k: int = 8, max_depth: int = TABLE_MAX_DEPTH,
                 width: int = 8, context: int = 1, table_when_sampling: bool = False, prefill: bool = False,
                 lp_size: int = 1, rank_budget: Optional[int] = None, rank_tables: bool = False) -> None:
        check_arguments("SuccessorProposer", ints=(
            ("budget", budget, 0), ("lp_size", lp_size, 1), ("rank_budget", rank_budget, (1, None)), ("k", k, 1),
            ("width", width, 1), ("max_depth", max_depth, 1)), choices=(("context", context, (1, 2)),),
            bools=(("table_when_sampling", table_when_sampling), ("prefill", prefill), ("rank_tables", rank_tables)))
        if k > vocab_size:
            raise ValueError(f"SuccessorProposer: k={k} (need at most the vocabulary, {vocab_size})")
        self.lp_size, self.rank_budget = int(lp_size), rank_budget
        self.rank_tables = bool(rank_tables) and self.lp_size > 1
        self.vocab_size, self.k, self.context = int(vocab_size), int(k), int(context)
        self.table, self.pair = self._new_tables()
        self.budget, self.suffix, self.width = int(budget), suffix, int(width)
        self.max_depth = max(int(max_depth), getattr(suffix, "max_depth", 0))
        self.table_when_sampling = table_when_sampling
        self.topk = self.k
        self.prefill_topk = self.k if prefill else 0
        self.suffix_cal = AcceptanceCalibration()
        self.succ_cal = RankCalibration()
        self._table, self._pair, self._root, self._prev, self._last = self.table, self.pair, -1, -1, GrownTree()

    def _new_tables(self) -> tuple:
        pair = SuccessorTable(self.vocab_size, self.k, context=2) if self.context == 2 else None
        if self.rank_tables:
            return RankTables(self.vocab_size, self.k, self.lp_size), pair
        return SuccessorTable(self.vocab_size, self.k), pair

    def begin(self, prompt: Sequence[int], *, do_sample: bool) -> None:
        if self.suffix is not None:
            self.suffix.begin(prompt, do_sample=do_sample)
        own = do_sample and not self.table_when_sampling
        self._table, self._pair = self._new_tables() if own else (self.table, self.pair)
        self._root, self._prev, self._last = int(prompt[-1]), int(prompt[-2]) if len(prompt) > 1 else -1, GrownTree()

    def observe_prefill(self, rows) -> None:
        """The prompt's rows at prefill (``step.StepRows``: the prompt tokens, int64 (n, >= k) top ids), time
        order: written only where the token table has no row yet."""
        self._table.update(rows.tokens, rows.topk.cpu().numpy(), only_empty=True)

    def propose(self) -> CandidateTree:
        suffix = self.suffix.propose() if self.suffix is not None else None
        self._last = grow_tree(self._root, suffix, self._table, self.budget, suffix_cal=self.suffix_cal,
                               succ_cal=self.succ_cal, max_depth=self.max_depth, width=self.width, pair=self._pair,
                               root_prev=self._prev)
        if self.lp_size > 1 and self.rank_budget is not None:
            self._last = cap_ranks(self._last, self.lp_size, self.rank_budget)
        self._last.tree.calibrated = True
        return self._last.tree

    def observe(self, accepted: Sequence[int], ngrams: Sequence[Sequence[int]], rows=None) -> None:
        if self.suffix is not None:
            self.suffix.observe(accepted, ngrams, None)
        path = accepted_path(self._last.tree, accepted)
        if rows is not None:
            fed = list(rows.nodes) if rows.nodes else list(range(len(self._last.tree)))
            self._learn(fed, path)
            self._record(rows, fed, path)
        self._prev = int(accepted[-2]) if len(accepted) > 1 else self._root
        self._root = int(accepted[-1])

    def _learn(self, fed: Sequence[int], path: Sequence[int]) -> None:
        grown, on_path = self._last, set(path)
        depths = grown.tree.depths()
        for i in fed:
            par = grown.tree.parents[i]
            if par >= 0 and par not in on_path:
                continue
            if grown.suffix_raw[i] is not None:
                self.suffix_cal.update(depths[i], grown.suffix_raw[i], i in on_path)
            rank = grown.succ_rank[i] if self._pair is None else (grown.succ_rank[i], grown.pair_rank[i])
            if rank is not None and rank != (None, None):
                self.succ_cal.update(depths[i], rank, i in on_path)

    def _record(self, rows, fed: Sequence[int], path: Sequence[int]) -> None:
        first = len(rows.tokens) - len(fed)  # rows: c, window columns, then one per fed node
        row_of = {n: first + i for i, n in enumerate(fed)}
        late = [0] + [row_of[n] for n in path if n in row_of]
        last = set(late)
        order = [r for r in range(1, len(rows.tokens)) if r not in last] + late
        top, tokens = rows.topk.cpu().numpy()[order], [rows.tokens[r] for r in order]
        if isinstance(self._table, RankTables):  # a node's row to its rank's table; c, columns, the path: to all
            owner, node_of = tree_ranks(self._last.tree.parents, self.lp_size), dict(enumerate(fed, first))
            self._table.update(tokens, top, owners=[owner[node_of[r]] if r in node_of and r not in last else -1
                                                    for r in order])
        else:
            self._table.update(tokens, top)
        if self._pair is not None:  # each row's context: c's previous token, a node's parent (window cells: none)
            tree = self._last.tree
            prev = [self._prev] + [-1] * (first - 1) + [tree.tokens[p] if p >= 0 else self._root
                                                         for p in (tree.parents[n] for n in fed)]
            self._pair.update(tokens, top, prev=[prev[r] for r in order])

    def end(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        if self.suffix is not None:
            self.suffix.end(prompt, output)

    def reset(self) -> None:
        """Forget what is kept across prompts: the answer store (if any) and the table."""
        if self.suffix is not None:
            self.suffix.reset()
        self.table, self.pair = self._table, self._pair = self._new_tables()

    def state(self) -> tuple:
        return (self.suffix.state() if self.suffix is not None else None, self._table.state(),
                self._pair.state() if self._pair is not None else None, tuple(sorted(self.succ_cal.trials.items())))


def cap_ranks(grown: GrownTree, lp_size: int, rank_budget: int) -> GrownTree:
    """The longest best-first prefix of ``grown`` whose busiest LP rank feeds at most ``rank_budget`` tree nodes
    under ``parallel.tree_plan`` over ``lp_size`` ranks (no window columns; repeated ancestor chains counted).

    Every prefix of ``grow_tree``'s output is a tree, so ``parallel.longest_tree_prefix`` finds it.

        >>> g = grow_tree(5, None, None, 0)
        >>> g.tree.tokens, g.tree.parents, g.tree.prob = [1, 2, 3, 4, 6], [-1, -1, 0, 1, 0], [.9] * 5
        >>> g.suffix_raw, g.succ_rank, g.pair_rank = [None] * 5, [0] * 5, [None] * 5
        >>> cap_ranks(g, 2, 2).tree.parents   # 1 -> 3 and 2 -> 4 on one rank each; 1 -> 6 would make a rank 3
        [-1, -1, 0, 1]
    """
    from .parallel import longest_tree_prefix  # torch: only under LP

    lo = longest_tree_prefix(grown.tree.parents, lp_size, rank_budget)
    if lo == len(grown.tree.parents):
        return grown
    t = grown.tree
    return GrownTree(CandidateTree(t.tokens[:lo], t.parents[:lo], t.prob[:lo]), grown.suffix_raw[:lo],
                     grown.succ_rank[:lo], grown.pair_rank[:lo])


def tree_ranks(parents: Sequence[int], lp_size: int) -> list[int]:
    """The LP rank whose row of each node the merge keeps (``parallel.tree_plan`` over ``lp_size`` ranks, no window
    columns; a node fed on several ranks: the last), for ``parents`` (int, -1 = a child of the root).

        >>> tree_ranks([-1, 0, 1, -1, 3], 2)   # the chains 0-1-2 and 3-4 on one rank each
        [0, 0, 0, 1, 1]
    """
    from .parallel import tree_plan  # torch: only under LP

    owner = [0] * len(parents)
    for rank, (_, nodes) in enumerate(tree_plan(0, 0, 0, parents, lp_size)):
        for n in nodes:
            owner[n] = rank
    return owner


def accepted_path(tree: CandidateTree, accepted: Sequence[int]) -> list[int]:
    """The nodes of ``tree`` that the accepted tokens walk from the root (siblings carry distinct tokens).

        >>> accepted_path(CandidateTree([5, 6, 7], [-1, 0, 0], [1, 1, 1]), [5, 7, 9])
        [0, 2]
    """
    path, node = [], -1
    for t in accepted[:-1]:  # the last accepted token is the bonus: never a node
        node = next((i for i in range(node + 1, len(tree)) if tree.parents[i] == node and tree.tokens[i] == t), None)
        if node is None:
            break
        path.append(node)
    return path


# The product's table (measured: docs/benchmarks.md 6d): the pair table, the top 16 ids of every kept row, and the
# first 16 of a row tried per node under LP but 8 in one process (at one process's budget wider rows crowd out
# deeper chains); under LP one token table per rank (``RankTables``).
TABLE_CONTEXT, TABLE_TOPK, TABLE_WIDTH, TABLE_WIDTH_ONE_PROCESS = 2, 16, 16, 8
# Beside the table, earlier answers (the answer store) are looked up only by a suffix of 3 or more tokens: shorter
# matches in other answers (chat text while decoding code) took a large tree's leaves from better candidates
# (docs/benchmarks.md 6d, "The answer store matched only by long suffixes", 2026-12-07).
TABLE_STORE_MIN_KEY = 3
# A small tree (at most SMALL_TREE nodes) in one process: the token table, its top 8, and the prompt's rows at
# prefill in its empty rows. Never under LP: a rank's prefill rows do not travel in the step's all-gather.
SMALL_TREE, SMALL_TABLE = 32, dict(context=1, k=8, width=8, prefill=True, store_min_key=1)


def _product_table(lp_size: int, per_rank: int, vocab_size: int) -> dict:
    """The product's ``SuccessorProposer`` arguments, and its suffix proposer's ``store_min_key``, for K =
    ``lp_size`` ranks feeding ``per_rank`` tree nodes each (``successor_proposers``)."""
    product = dict(context=TABLE_CONTEXT, k=TABLE_TOPK, lp_size=lp_size, rank_budget=per_rank, prefill=False,
                   width=TABLE_WIDTH if lp_size > 1 else TABLE_WIDTH_ONE_PROCESS, rank_tables=lp_size > 1,
                   store_min_key=TABLE_STORE_MIN_KEY)
    if lp_size == 1 and per_rank <= SMALL_TREE:
        product.update(SMALL_TABLE)
    product["k"] = min(product["k"], vocab_size)
    return product


def successor_proposers(decoding, vocab_size: Optional[int], *, lp_size: int = 1, budget: Optional[int] = None,
                        table: Optional[bool] = True, **levers) -> list:
    """The product's proposers for ``decoding`` at LP degree ``lp_size`` (K): ``proposers.proposers_for``'s, with
    the suffix proposer (suffix lookup + answer store) wrapped in a ``SuccessorProposer`` when the table is on.

    Args:
        vocab_size: the model's vocabulary (``checks.vocab_size``); the table's rows.
        lp_size: K, the ranks that share a step (1 = one process, or one process simulating K).
        budget: tree nodes ONE rank feeds (default: the suffix proposer's node cap + 1, e.g. 11 at (W, N, G) =
            (0, 4, 2)). The tree holds up to K x ``budget`` nodes, cut by ``cap_ranks``.
        table: True (default) = the table whatever ``decoding.successors`` says (the bench's ``+successors``
            lever); None = as ``decoding.successors_on(lp_size)`` says (``Decoder``'s default); False = never.
        levers: ``SuccessorProposer`` arguments replacing the product's (``TABLE_*``, ``k`` at most the vocabulary,
            ``lp_size`` = K, ``rank_budget`` = ``budget``, ``rank_tables`` when K > 1, no prefill; ``SMALL_TABLE``
            in one process with a budget of at most ``SMALL_TREE`` nodes), for measurements; ``store_min_key``
            is the suffix proposer's (``TABLE_STORE_MIN_KEY``; 1 in ``SMALL_TABLE``).

    Plain greedy and ``decoding=paper`` keep ``proposers_for``'s; with G = 0 (no suffix proposer to join) the table
    is on alone, at a default budget of ``decoding.candidate_depth`` + 1 nodes a rank. Every LP rank builds the same
    proposer, so every rank grows the same tree and holds the same table. ``ValueError`` for ``lp_size`` not an int
    >= 1, ``budget`` neither None nor an int >= 1 or ``table`` not True, None or False; when the table is on, for
    ``vocab_size`` None, ``store_min_key`` not an int >= 1, or (from ``SuccessorProposer``) a lever it refuses.

        >>> from lp_runtime.config import DecodingConfig
        >>> look = DecodingConfig(method="lookahead", window_size=0, ngram_size=4, guess_set_size=2, max_depth=10)
        >>> [(p.budget, p.rank_budget, p.width, p.context, p.suffix.store_min_key)
        ...  for p in successor_proposers(look, 96, lp_size=8)]
        [(88, 11, 16, 2, 3)]
        >>> [(p.budget, p.k, p.context, p.prefill_topk, p.suffix.store_min_key)
        ...  for p in successor_proposers(look, 96)]  # one process, 11 nodes
        [(11, 8, 1, 8, 1)]
        >>> successor_proposers(look, 96, table=None)[0].__class__.__name__   # successors "auto", one process: off
        'SuffixProposer'
    """
    from .proposers import SuffixProposer, proposers_for

    check_arguments("successor_proposers", ints=(("lp_size", lp_size, 1), ("budget", budget, (1, None))),
                    choices=(("table", table, (True, None, False)),))
    on = decoding.successors_on(lp_size) if table is None else table
    found = proposers_for(decoding)
    if on and not found and decoding.method in ("lookahead", "auto"):  # G = 0: the table alone
        found = [None]
    out = []
    for p in found:
        if on and (p is None or isinstance(p, SuffixProposer)):
            if vocab_size is None:
                raise ValueError("successor_proposers: the successor table needs the model's vocabulary size "
                                 "(checks.vocab_size(model) gave None)")
            cap = decoding.candidate_depth if p is None else p.max_nodes  # G = 0: a SuffixProposer's cap, max_depth
            per_rank = cap + 1 if budget is None else budget
            args = {**_product_table(lp_size, per_rank, vocab_size), **levers}
            min_key = args.pop("store_min_key")  # the suffix proposer's, built above by proposers_for
            check_arguments("successor_proposers", ints=(("store_min_key", min_key, 1),))
            if p is not None:
                p.store_min_key = min_key
            else:  # as deep as a suffix proposer would make it: its max_depth is decoding.candidate_depth
                args["max_depth"] = max(args.get("max_depth", TABLE_MAX_DEPTH), decoding.candidate_depth)
            p = SuccessorProposer(vocab_size, lp_size * per_rank, suffix=p, **args)
        out.append(p)
    return out
