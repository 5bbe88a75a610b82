"""Tree attention without a dense mask over the cache (paper section 3.3 for the step's tree): every step token
sees the whole committed prefix, so only the step's q x q block needs the tree mask. ``split_attention`` computes
softmax attention over the prefix (no mask) and over the block (tree mask), each with its log-sum-exp, and merges
them exactly: out = (e^{lse_a} out_a + e^{lse_b} out_b) / (e^{lse_a} + e^{lse_b}) (tests/test_split_attention.py).

Registered as ``SPLIT`` in transformers' ``AttentionInterface``; calls without the step's geometry (a dense (q, kv)
mask, or a prefill) go to transformers' sdpa unchanged."""
from __future__ import annotations

from typing import Optional

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SPLIT = "lp_split"


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: Optional[torch.Tensor],
            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out float32 (B, Hq, q, D), lse float32 (B, Hq, q, 1)) of softmax attention.

    query (B, Hq, q, D); key/value (B, Hkv, L, D) with Hq a multiple of Hkv (grouped heads share a KV head
    without copying it); bias float additive, broadcastable to (q, L) (or (B, 1, q, L)), or None.
    """
    batch, q_heads, q, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = q_heads // kv_heads
    scores = (query.reshape(batch, kv_heads, groups * q, dim) @ key.transpose(-1, -2)).float() * scale
    scores = scores.view(batch, kv_heads, groups, q, length)
    if bias is not None:
        scores = scores + (bias.float() if bias.dim() < 4 else bias.float().unsqueeze(2))
    lse = scores.logsumexp(-1, keepdim=True)
    probs = (scores - lse).exp().view(batch, kv_heads, groups * q, length)
    out = probs.to(value.dtype) @ value
    return out.view(batch, q_heads, q, value.shape[-1]).float(), lse.view(batch, q_heads, q, 1)


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each set's (out, lse) (float32, shapes as
    ``_attend``'s). A side whose keys are all blocked has lse near finfo.min and weight 0."""
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = (lse_a - top).exp(), (lse_b - top).exp()
    return (out_a * w_a + out_b * w_b) / (w_a + w_b)


def _as_bias(mask: Optional[torch.Tensor], q: int, device) -> torch.Tensor:
    """The step block's additive float (.., q, q) bias from a float or bool (True = attend) mask; None = causal."""
    if mask is None:
        mask = torch.ones(q, q, dtype=torch.bool, device=device).tril()
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, device=device).masked_fill(~mask, torch.finfo(torch.float32).min)
    return mask


UNSUPPORTED = {"s_aux": "attention sinks", "sinks": "attention sinks", "softcap": "logit soft-capping",
               "sliding_window": "a sliding window"}  # transformers' attention kwargs split_attention refuses


def split_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                    lp_past: Optional[torch.Tensor] = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention function (``AttentionInterface``): returns ((B, q, Hq, D) in query's dtype, None).

    query (B, Hq, q, D); key/value (B, Hkv, kv, D) as the cache returned them. ``lp_past`` (a model forward
    kwarg, passed down by transformers): None = the keys are [prefix, step] (kv = past + q); or a 0-d int64
    tensor = the keys are a ``SlotCache`` buffer whose slots < lp_past are the prefix and whose slots
    lp_past .. lp_past+q-1 hold the step. ``attention_mask``: the step's (q, q) tree mask (4D, float additive or
    bool), None (causal), or without ``lp_past`` a dense (q, kv) mask (then transformers' sdpa runs).
    ``ValueError`` for attention it does not compute (``UNSUPPORTED``: attention sinks, logit soft-capping, a
    sliding window), which it would otherwise drop without a word.
    """
    dropped = {k: v for k, v in kwargs.items() if k in UNSUPPORTED and v is not None}
    if dropped:
        raise ValueError(f"the split attention of the static and compiled paths does not compute "
                         f"{', '.join(f'{k} ({UNSUPPORTED[k]})' for k in dropped)}, which this model's attention "
                         "uses; set model.compile=false")
    q = query.shape[2]
    scale = module.scaling if scaling is None else scaling
    past = key.shape[2] - q
    dense = attention_mask is not None and attention_mask.shape[-1] != q
    if lp_past is None and (dense or (past == 0 and attention_mask is None)):  # a dense mask, or a causal prefill
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    bias = _as_bias(attention_mask, q, query.device)
    if lp_past is None:
        out, lse = _attend(query, key[:, :, past:], value[:, :, past:], bias, scale)
        if past > 0:
            out = merge(*_attend(query, key[:, :, :past], value[:, :, :past], None, scale), out, lse)
    else:
        slots = lp_past + torch.arange(q, device=key.device)
        out, lse = _attend(query, key.index_select(2, slots), value.index_select(2, slots), bias, scale)
        blocked = torch.arange(key.shape[2], device=key.device) >= lp_past
        key_bias = torch.zeros(key.shape[2], device=key.device).masked_fill(blocked, torch.finfo(torch.float32).min)
        out = merge(*_attend(query, key, value, key_bias, scale), out, lse)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def register() -> None:
    """Register ``SPLIT`` in transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(SPLIT, split_attention)
    AttentionMaskInterface.register(SPLIT, sdpa_mask)


def use_split_attention(model) -> None:
    """Make ``model`` attend through ``split_attention`` (its config's attention implementation; the weights are
    untouched)."""
    register()
    model.set_attn_implementation(SPLIT)
