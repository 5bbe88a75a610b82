"""The one place that calls the model for a decoding step: ``StepInputs`` -> ``StepOutputs`` (docs/architecture.md).

``EagerStep`` feeds the step's token tree (paper section 3.3; ``layout.py``) through the model's public forward on
a ``DynamicCache`` and owns that cache (``new_cache``, ``prefill``, ``__call__``, ``commit``); another step (e.g.
``compiled.CapturedStep``) is any object with those four methods, passed as ``Decoder(..., step=...)``. Outputs
stay on the device (no host sync here)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from transformers import DynamicCache

from . import kv

# Marks a kept row whose logits were not finite; travels through the LP all-gather like a token id.
NONFINITE = -1
# Most prompt rows whose top-k a prefill returns when asked (the last ones; bounds the n x V logits it holds).
PREFILL_ROWS = 256


@dataclass
class StepInputs:
    """One step's model inputs (q = tokens fed, k = rows kept).

    Attributes:
        ids: int64 (1, q) token ids in layout order, on the model's device.
        positions: int64 (1, q) absolute positions (committed length + depth in the step's tree).
        mask: float (1, 1, q, past + q) additive mask in the model's dtype (0 = may attend, ``finfo.min`` =
            blocked), or None for a plain causal run (the model builds its own causal mask).
        keep: int64 (k,) in-step indices whose logits rows are returned, in layout order.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    mask: Optional[torch.Tensor]
    keep: torch.Tensor


@dataclass
class StepOutputs:
    """What one step returns, per kept row, on the model's device.

    Attributes:
        logits: float (k, V) raw logits of the kept rows (the model's dtype).
        argmax: int64 (k,) argmax of each row.
        finite: bool (k,) False where a row holds NaN or inf (its argmax decides nothing).
        topk: int64 (k, K) the K most likely token ids of each row, best first, when the step was asked for
            ``topk=K`` > 0 (None otherwise).
    """

    logits: torch.Tensor
    argmax: torch.Tensor
    finite: torch.Tensor
    topk: Optional[torch.Tensor] = None

    @classmethod
    def of(cls, logits_KV: torch.Tensor, topk: int = 0) -> "StepOutputs":
        """The outputs of raw logits (k, V), argmax and finiteness in one reduction (a row's max is NaN, +inf, or
        -inf when all are, exactly when the row is unusable); the top-``topk`` ids when ``topk`` > 0."""
        values, argmax = logits_KV.max(dim=-1)
        top = torch.topk(logits_KV, topk, dim=-1).indices if topk > 0 else None
        return cls(logits_KV, argmax, torch.isfinite(values), top)

    def tokens(self) -> torch.Tensor:
        """int64 (k,): the argmax, ``NONFINITE`` where the row is not finite (on the device: no host sync)."""
        return torch.where(self.finite, self.argmax, torch.full_like(self.argmax, NONFINITE))


@dataclass
class StepRows:
    """A step's kept rows as a proposer sees them (``Proposer.observe`` when its ``topk`` > 0).

    Attributes:
        tokens: the input token of each kept row: ``c``, the window columns (newest level), then the fed tree
            nodes in tree order; under LP every rank's rows.
        topk: int64 (k, K) the top-K successor ids of each row (``StepOutputs.topk``).
        nodes: the fed tree nodes' indices in the PROPOSED tree (the policy may feed a subset), one per node row."""

    tokens: list[int]
    topk: torch.Tensor
    nodes: tuple = ()


class EagerStep:
    """Steps through the model's eager forward on a ``DynamicCache``; ``model`` is never modified.

    ``max_positions``: tokens a sequence may reach in this step's cache (None: it grows to the model's context)."""

    max_positions: Optional[int] = None

    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    def fits(self, past: int, q: int) -> bool:
        """Whether a step of ``q`` tokens after ``past`` cache entries has room in the cache (a growing one: yes)."""
        return True

    def new_cache(self) -> DynamicCache:
        return kv.new_cache()

    def prefill(self, cache: DynamicCache, ids: Sequence[int], *, topk: int = 0,
                rows: int = PREFILL_ROWS) -> Optional[torch.Tensor]:
        """Feed ``ids`` (a causal run after the cache). With ``topk`` = K > 0, also return int64 (n, K): the K most
        likely next ids of the logits rows at the last n = min(len(ids), ``rows``) positions, best first (the
        lm_head then runs over those n rows: n x V logits in the model's dtype, freed on return); else keep no
        logits and return None. The cache is the same either way."""
        if not ids:
            return None if topk <= 0 else torch.empty(0, topk, dtype=torch.long, device=self.device)
        n = min(len(ids), rows) if topk > 0 else 0
        keep = n if n > 0 else torch.empty(0, dtype=torch.long, device=self.device)  # an int n keeps the last n rows
        out = self.model(input_ids=torch.tensor([list(ids)], device=self.device), past_key_values=cache,
                         use_cache=True, logits_to_keep=keep)
        return torch.topk(out.logits[0, -n:], topk, dim=-1).indices if topk > 0 else None

    def __call__(self, cache: DynamicCache, inputs: StepInputs, *, topk: int = 0) -> StepOutputs:
        """ONE forward pass of ``inputs`` after ``cache`` (appending q entries to it)."""
        out = self.model(input_ids=inputs.ids, position_ids=inputs.positions, attention_mask=inputs.mask,
                         past_key_values=cache, use_cache=True, logits_to_keep=inputs.keep)
        return StepOutputs.of(out.logits[0], topk)

    def commit(self, cache: DynamicCache, num_fed: int, num_keep: int, gather: Sequence[int] = ()) -> None:
        kv.commit(cache, num_fed, num_keep, gather)
