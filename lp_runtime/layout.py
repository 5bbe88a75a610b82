"""One lookahead step's inputs: token order, position ids, the 4D attention mask, and where outputs are read.

(Paper section 3.3, Figure 3; DESIGN.md section 1.) Every in-step token attends to the committed KV cache
and to a chain of in-step tokens ending at itself, so the step is a token *tree* and the mask is its
ancestor relation. Each token has one parent:

* pending token i: pending token i-1 (the pending tokens are a causal run ending at ``c``);
* row 0, column j (j >= 1): row 0 column j-1, where column 0 is ``c`` (the last pending token);
* level l, column j: level l-1 column j (level 0 = row 0);
* candidate g, token i: candidate g token i-1, token 0's parent is ``c``.

Position = position of the first pending token + depth in the tree. Token order in the step::

    [pending (P)] [row 0 columns 1..R] [level 1: columns C] ... [level L: columns C] [candidates, N-1 each]

where C are the window columns this rank computes (all W in one process) and R = max(C) (row 0 is causal,
so a rank computing column j must feed row 0 up to j). The structure depends only on
(P, C, L, number of candidates), so layouts are built once and cached; only the token ids change per step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class StepLayout:
    """The token tree of one step (shapes: q = tokens in the step, k = positions whose logits are kept).

    Attributes:
        num_pending: P, accepted tokens of the previous step fed again (``c`` is the last).
        columns: window columns computed here, ascending.
        row0_fed: R, row-0 tokens fed (columns 1..R).
        num_levels: L, window levels fed besides row 0.
        num_candidates: candidates fed, N-1 tokens each.
        depth: int64 (q,), position offset from the first pending token.
        ancestors: bool (q, q), True where token i may attend to in-step token j.
        keep_index: int64 (k,), in-step indices whose logits are needed: ``c``, then one per window column
            (its last level, or row 0 when L = 0), then every candidate token in order.
        is_chain: True when the step is a plain causal run (no window, no candidates): no custom mask needed.
    """

    num_pending: int
    columns: tuple[int, ...]
    row0_fed: int
    num_levels: int
    num_candidates: int
    cand_len: int
    depth: torch.Tensor
    ancestors: torch.Tensor
    keep_index: torch.Tensor
    is_chain: bool

    @property
    def num_tokens(self) -> int:
        return int(self.depth.numel())

    def input_ids(self, pending: Sequence[int], row0: Sequence[int], levels: Sequence[Sequence[int]],
                  candidates: Sequence[Sequence[int]]) -> list[int]:
        """The step's token ids in layout order (length q)."""
        ids = list(pending) + list(row0[: self.row0_fed])
        for lvl in levels[: self.num_levels]:
            ids.extend(lvl[j] for j in self.columns)
        for cand in candidates:
            ids.extend(cand)
        return ids


def build_layout(num_pending: int, columns: Sequence[int], num_levels: int, num_candidates: int,
                 ngram_size: int) -> StepLayout:
    """Build the token tree for one step; see the module docstring for the order and parents.

    Raises ``ValueError`` for ``num_pending < 1`` or negative column indices.
    """
    if num_pending < 1:
        raise ValueError(f"num_pending={num_pending}; a step feeds at least the newest accepted token")
    cols = tuple(sorted(int(j) for j in columns))
    if cols and cols[0] < 0:
        raise ValueError(f"window columns {cols} must be >= 0")
    row0_fed = cols[-1] if cols else 0
    levels = num_levels if cols else 0
    cand_len = ngram_size - 1
    c_idx = num_pending - 1

    parent: list[int] = [i - 1 for i in range(num_pending)]  # -1 = the committed cache only
    depth: list[int] = list(range(num_pending))
    row0_idx = [c_idx]  # column j of row 0 -> in-step index
    for j in range(1, row0_fed + 1):
        parent.append(row0_idx[-1])
        depth.append(depth[row0_idx[-1]] + 1)
        row0_idx.append(len(parent) - 1)
    last = {j: row0_idx[j] for j in cols}  # column -> index of its newest level
    for _ in range(levels):
        for j in cols:
            parent.append(last[j])
            depth.append(depth[last[j]] + 1)
            last[j] = len(parent) - 1
    cand_idx: list[int] = []
    for _ in range(num_candidates):
        prev = c_idx
        for _ in range(cand_len):
            parent.append(prev)
            depth.append(depth[prev] + 1)
            prev = len(parent) - 1
            cand_idx.append(prev)

    q = len(parent)
    anc = torch.zeros(q, q, dtype=torch.bool)
    for i, par in enumerate(parent):  # parents precede children, so each row extends its parent's row
        if par >= 0:
            anc[i] = anc[par]
        anc[i, i] = True
    keep = [c_idx] + [last[j] for j in cols] + cand_idx
    return StepLayout(
        num_pending=num_pending,
        columns=cols,
        row0_fed=row0_fed,
        num_levels=levels,
        num_candidates=num_candidates,
        cand_len=cand_len,
        depth=torch.tensor(depth, dtype=torch.long),
        ancestors=anc,
        keep_index=torch.tensor(keep, dtype=torch.long),
        is_chain=(q == num_pending),
    )


class LayoutCache:
    """Builds each distinct layout once and keeps its device tensors (mask in the model's dtype).

    ``get`` returns ``(layout, depth, inner_mask, keep_index)`` on ``device``; ``inner_mask`` is a float
    additive (q, q) mask in ``dtype``: 0 where attention is allowed, ``finfo(dtype).min`` where blocked
    (a boolean mask is silently wrong in some attention backends; DESIGN.md section 4).
    """

    def __init__(self, ngram_size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.ngram_size = ngram_size
        self.device = device
        self.dtype = dtype
        self._cache: dict[tuple, tuple] = {}

    def get(self, num_pending: int, columns: Sequence[int], num_levels: int, num_candidates: int):
        key = (num_pending, tuple(columns), num_levels, num_candidates)
        hit = self._cache.get(key)
        if hit is None:
            lay = build_layout(num_pending, columns, num_levels, num_candidates, self.ngram_size)
            blocked = torch.finfo(self.dtype).min
            inner = torch.zeros(lay.ancestors.shape, dtype=self.dtype).masked_fill_(~lay.ancestors, blocked)
            hit = (lay, lay.depth.to(self.device), inner.to(self.device), lay.keep_index.to(self.device))
            self._cache[key] = hit
        return hit


def full_mask(inner: torch.Tensor, past_len: int) -> torch.Tensor:
    """(1, 1, q, past_len + q) additive mask: every token sees the whole committed cache, then ``inner``.

    Allocates and concatenates a new tensor each call; ``MaskBuffer`` gives the same values without that."""
    q = inner.shape[0]
    prefix = torch.zeros(q, past_len, dtype=inner.dtype, device=inner.device)
    return torch.cat([prefix, inner], dim=1)[None, None]


class MaskBuffer:
    """A preallocated additive mask: ``view(inner, past_len)`` equals ``full_mask(inner, past_len)`` in values.

    One zero buffer of shape (1, 1, rows, cols) is kept per decoder; a step writes its (q, q) ``inner`` block at
    columns ``past_len .. past_len + q`` and gets back the view ``buf[:, :, :q, :past_len + q]`` (a strided view,
    which transformers passes to sdpa as is: an already-4D mask is not rebuilt). Before the next write the
    previous block is zeroed again, so a step costs O(q^2) writes instead of allocating and concatenating a
    (q, past_len + q) tensor. The buffer grows (doubling) when a step needs more rows or columns: a few
    allocations per sequence at most. The returned view is valid until the next ``view`` call.
    """

    def __init__(self, dtype: torch.dtype, device, rows: int = 64, cols: int = 1024) -> None:
        self.dtype = dtype
        self.device = device
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
