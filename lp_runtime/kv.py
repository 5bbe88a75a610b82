"""Committing a step in a ``DynamicCache``: keep the pending tokens' entries, and in one process the accepted
path's (copy-KV, so the next step feeds only the bonus token); drop the rest (docs/architecture.md)."""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """An empty cache with full (non-sliding) layers: the step's 4D mask decides what each token sees."""
    return DynamicCache()


def commit(cache: DynamicCache, num_fed: int, num_keep: int, gather: Sequence[int] = ()) -> None:
    """Of the ``num_fed`` entries the last step appended keep the first ``num_keep`` (the pending tokens), then
    move the entries at step offsets ``gather`` (ascending, each >= ``num_keep``: the accepted path's nodes, whose
    KV was computed with exactly the context plain decoding gives them) right after them; drop the rest. Uses the
    cache's public ``layers[i].keys/.values`` ((B, H, T, D)) and ``crop``."""
    if gather:
        assert all(g >= num_keep for g in gather) and list(gather) == sorted(gather), gather
        base = cache.get_seq_length() - num_fed
        dst = base + num_keep
        if list(gather) != list(range(num_keep, num_keep + len(gather))):  # else already in place: nothing to move
            src = None
            for layer in cache.layers:
                if layer.keys is None or layer.keys.numel() == 0:
                    continue
                if src is None or src.device != layer.keys.device:  # one index tensor for all layers
                    src = torch.tensor([base + g for g in gather], device=layer.keys.device)
                layer.keys[..., dst : dst + len(gather), :] = layer.keys.index_select(-2, src)
                layer.values[..., dst : dst + len(gather), :] = layer.values.index_select(-2, src)
        num_keep += len(gather)
    if num_fed > num_keep:
        cache.crop(num_keep - num_fed)
