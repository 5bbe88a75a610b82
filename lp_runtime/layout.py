"""One lookahead step's inputs: token order, position ids, the 4D attention mask and the kept rows (paper
section 3.3, Figure 3). The step is one token tree (each token attends to the committed cache and to its chain of
in-step ancestors), in this order::

    [pending (P)] [row 0 columns 1..R] [level 1: columns C] ... [level L: columns C] [candidate tree nodes]

Parents: the pending tokens are a causal run ending at ``c``; row 0 column j follows column j-1 (column 0 = ``c``);
level l column j follows level l-1 column j; a candidate node follows its tree parent (-1 = ``c``). C are the
window columns this rank computes (all W in one process), R = max(C). Position = first pending position + depth;
``tree.ancestors`` of the parent array gives depths and the mask (the one way a step's mask is built)."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .tree import ancestors, check_parents


@dataclass(frozen=True)
class StepLayout:
    """The token tree of one step (P, C, R, L: module docstring; q = tokens in the step, k = rows kept).

    Attributes:
        depth: int64 (q,), position offset from the first pending token.
        ancestors: bool (q, q), True where token i may attend to in-step token j.
        keep_index: int64 (k,), in-step indices whose logits are needed: ``c``, then one per window column
            (its last level, or row 0 when L = 0), then every candidate node in tree order.
        is_chain: True when the step is a plain causal run (no window, no candidates): no custom mask needed.
    """

    num_pending: int
    columns: tuple[int, ...]
    row0_fed: int
    num_levels: int
    tree_parents: tuple[int, ...]
    depth: torch.Tensor
    ancestors: torch.Tensor
    keep_index: torch.Tensor
    is_chain: bool

    @property
    def num_tokens(self) -> int:
        return int(self.depth.numel())

    @property
    def tree_start(self) -> int:
        """In-step index of the first candidate node (the window part's length)."""
        return self.num_tokens - len(self.tree_parents)

    def input_ids(self, pending: Sequence[int], row0: Sequence[int], levels: Sequence[Sequence[int]],
                  tree_tokens: Sequence[int]) -> list[int]:
        """The step's token ids in layout order (length q)."""
        ids = list(pending) + list(row0[: self.row0_fed])
        for lvl in levels[: self.num_levels]:
            ids.extend(lvl[j] for j in self.columns)
        ids.extend(tree_tokens)
        return ids


def _window_part(num_pending: int, cols: tuple[int, ...], num_levels: int) -> tuple[list[int], list[int]]:
    """(parent, keep) of the pending tokens and the window, in layout order (parent -1 = the cache)."""
    row0_fed = cols[-1] if cols else 0
    c_idx = num_pending - 1
    parent: list[int] = [i - 1 for i in range(num_pending)]
    row0_idx = [c_idx]  # column j of row 0 -> in-step index
    for _ in range(row0_fed):
        parent.append(row0_idx[-1])
        row0_idx.append(len(parent) - 1)
    last = {j: row0_idx[j] for j in cols}  # column -> index of its newest level
    for _ in range(num_levels if cols else 0):
        for j in cols:
            parent.append(last[j])
            last[j] = len(parent) - 1
    return parent, [c_idx] + [last[j] for j in cols]


def build_layout(num_pending: int, columns: Sequence[int], num_levels: int,
                 tree_parents: Sequence[int] = ()) -> StepLayout:
    """Build the token tree for one step (order and parents: module docstring). Raises ``ValueError`` for
    ``num_pending < 1``, negative column indices or a malformed parent array."""
    if num_pending < 1:
        raise ValueError(f"num_pending={num_pending}; a step feeds at least the newest accepted token")
    cols = tuple(sorted(int(j) for j in columns))
    if cols and cols[0] < 0:
        raise ValueError(f"window columns {cols} must be >= 0")
    check_parents(tree_parents)
    parent, keep = _window_part(num_pending, cols, num_levels)
    nw, n = len(parent), len(tree_parents)
    parent += [num_pending - 1 if p < 0 else nw + p for p in tree_parents]
    depth, anc = ancestors(parent)
    return StepLayout(
        num_pending=num_pending,
        columns=cols,
        row0_fed=cols[-1] if cols else 0,
        num_levels=num_levels if cols else 0,
        tree_parents=tuple(int(p) for p in tree_parents),
        depth=torch.from_numpy(depth - 1),
        ancestors=torch.from_numpy(anc),
        keep_index=torch.tensor(keep + list(range(nw, nw + n)), dtype=torch.long),
        is_chain=(nw + n == num_pending),
    )


class LayoutCache:
    """``build_layout``'s device tensors per step shape, in an LRU of ``max_entries``: ``get`` returns
    ``(layout, depth, inner_mask, keep_index)``, ``inner_mask`` float additive (q, q) in ``dtype`` (0 = allowed,
    ``finfo(dtype).min`` = blocked: a boolean mask is silently wrong in some attention backends)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, max_entries: int = 1024) -> None:
        self.device, self.dtype, self.max_entries = device, dtype, max_entries
        self._entries: OrderedDict[tuple, tuple] = OrderedDict()
        self._blocked = torch.finfo(dtype).min

    def get(self, num_pending: int, columns: Sequence[int], num_levels: int, tree_parents: Sequence[int] = ()):
        key = (num_pending, tuple(sorted(int(j) for j in columns)), num_levels, tuple(int(p) for p in tree_parents))
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit
        lay = build_layout(*key)
        inner = torch.from_numpy(np.where(lay.ancestors.numpy(), 0.0, float(self._blocked))).to(self.dtype)
        hit = (lay, lay.depth.to(self.device), inner.to(self.device), lay.keep_index.to(self.device))
        self._entries[key] = hit
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return hit


def full_mask(inner: torch.Tensor, past_len: int) -> torch.Tensor:
    """(1, 1, q, past_len + q) additive mask: every token sees the whole committed cache, then ``inner``
    (a fresh ``MaskBuffer`` of exactly that size: the one way a step's mask is built)."""
    q = inner.shape[0]
    return MaskBuffer(inner.dtype, inner.device, rows=q, cols=past_len + q).view(inner, past_len)


class MaskBuffer:
    """A preallocated additive mask, one zero buffer (1, 1, rows, cols) grown by doubling: ``view(inner,
    past_len)`` writes the (q, q) ``inner`` block at columns ``past_len ..`` and returns ``buf[:, :, :q, :past_len
    + q]`` (O(q^2) writes instead of a new (q, past_len + q) tensor), valid until the next ``view`` call."""

    def __init__(self, dtype: torch.dtype, device, rows: int = 64, cols: int = 1024) -> None:
        self.dtype, self.device = dtype, device
        self.buf = torch.zeros(1, 1, rows, cols, dtype=dtype, device=device)
        self._dirty: tuple[int, int, int] = (0, 0, 0)  # rows, first column, columns last written

    def view(self, inner: torch.Tensor, past_len: int) -> torch.Tensor:
        q = inner.shape[0]
        rows, cols = self.buf.shape[2], self.buf.shape[3]
        if q > rows or past_len + q > cols:
            self.buf = torch.zeros(1, 1, max(rows, 2 * q), max(cols, 2 * (past_len + q)), dtype=self.dtype,
                                   device=self.device)
        else:
            r, c0, n = self._dirty
            self.buf[0, 0, :r, c0 : c0 + n] = 0
        self.buf[0, 0, :q, past_len : past_len + q] = inner
        self._dirty = (q, past_len, q)
        return self.buf[:, :, :q, : past_len + q]
