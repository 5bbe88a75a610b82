"""KV cache for the decode loop: construction, the support check, and committing a step.

A step feeds the pending tokens first, so committing it keeps a prefix of the step's new entries and drops
the rest (window and candidates): one ``crop`` of the cache's tail (DESIGN.md section 1).
"""
from __future__ import annotations

from transformers import DynamicCache

from .config import ConfigError


def new_cache() -> DynamicCache:
    """An empty cache with full (non-sliding) layers: the step's 4D mask decides what each token sees."""
    return DynamicCache()


def check_supported(model, max_total_tokens: int) -> None:
    """Refuse models whose attention our custom mask would not reproduce exactly.

    Sliding-window attention limits how far back a token may look; our 4D mask lets every token see the
    whole committed cache, so a sequence longer than the window would differ from plain decoding.
    Raises ``ConfigError`` naming the window and the sequence length.
    """
    cfg = model.config.get_text_config(decoder=True)
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None) or []
    uses_sliding = bool(window) and (
        "sliding_attention" in layer_types or (not layer_types and getattr(cfg, "use_sliding_window", True))
    )
    if uses_sliding and max_total_tokens > window:
        raise ConfigError(
            f"the model uses sliding-window attention (window {window} tokens) and this sequence may reach "
            f"{max_total_tokens} tokens; lookahead decoding supports sequences up to the window only"
        )


def commit(cache: DynamicCache, num_fed: int, num_keep: int) -> None:
    """Keep the first ``num_keep`` of the ``num_fed`` entries the last step appended; drop the others."""
    if num_fed > num_keep:
        cache.crop(num_keep - num_fed)
