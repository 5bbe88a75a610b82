"""KV cache for the decode loop: construction, the support check, and committing a step.

A step feeds the pending tokens first, so committing it keeps a prefix of the step's new entries and drops
the rest (window and candidates): one ``crop`` of the cache's tail (DESIGN.md section 1).
"""
from __future__ import annotations

from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """An empty cache with full (non-sliding) layers: the step's 4D mask decides what each token sees."""
    return DynamicCache()


def check_supported(model, max_total_tokens: int) -> None:
    """Refuse a sequence length this model would not decode exactly (``support.check_supported``: sliding
    window, length-dependent rope). Kept here for callers of the old location."""
    from .support import check_supported as _check

    _check(model, max_total_tokens)


def commit(cache: DynamicCache, num_fed: int, num_keep: int) -> None:
    """Keep the first ``num_keep`` of the ``num_fed`` entries the last step appended; drop the others."""
    if num_fed > num_keep:
        cache.crop(num_keep - num_fed)
