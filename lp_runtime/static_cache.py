"""A preallocated KV cache written by slot (gpt-fast's static cache) behind transformers' public ``Cache``
interface, so the model's forward and ``kv.commit`` use it as a ``DynamicCache``. Its buffers keep static addresses
for CUDA graphs.

By length (eager, ``static_past is None``): ``update`` writes at ``length .. length+q-1`` and returns the first
``length+q`` slots, as a ``DynamicCache`` does. By a device position (captured, ``static_past`` a 0-d int64
tensor): ``update`` writes at ``static_past + arange(q)`` and returns the whole, fixed-shape buffers;
``attention.split_attention`` masks the slots past the prefix."""
from __future__ import annotations

from typing import Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .step import EagerStep


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, ``(B, H, max_len, D)`` tensors allocated at the first write (dtype, device
    and head shapes from the model), and ``length``, the slots in use (host side)."""

    is_compileable = True
    is_sliding = False
    is_croppable = True

    def __init__(self, cache: "SlotCache") -> None:
        super().__init__()
        self.cache = cache
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, k_dim = key_states.shape
        with torch.inference_mode(False):  # normal tensors: a commit may write them outside inference mode
            self.keys = key_states.new_zeros(batch, heads, self.cache.max_len, k_dim)
            self.values = value_states.new_zeros(batch, heads, self.cache.max_len, value_states.shape[-1])
        if not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the step's ``(B, H, q, D)`` keys/values; see the module docstring for the two ways."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past = self.cache.static_past
        if past is not None:
            slots = past + torch.arange(key_states.shape[-2], device=past.device)
            self.keys.index_copy_(2, slots, key_states)
            self.values.index_copy_(2, slots, value_states)
            return self.keys, self.values
        end = self.length + key_states.shape[-2]
        if end > self.cache.max_len:
            raise ValueError(f"SlotCache holds {self.cache.max_len} slots; this step needs {end}: build it with a "
                             "max_len covering the prompt, the new tokens and the largest step")
        self.keys[:, :, self.length:end] = key_states
        self.values[:, :, self.length:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.cache.max_len

    def crop(self, max_length: int) -> None:
        """``DynamicLayer.crop`` semantics: a negative value drops that many entries from the end."""
        self.length = self.length + max_length if max_length < 0 else min(self.length, max_length)

    def reset(self) -> None:
        self.length = 0


class SlotCache(Cache):
    """A KV cache of ``max_len`` slots (prompt + new tokens + the largest step; a write past them raises
    ``ValueError``) in each of ``num_layers`` layers, written in place. ``static_past``: None (write by length) or
    a 0-d int64 device tensor holding the committed length (write by position; ``compiled.CapturedStep``)."""

    def __init__(self, num_layers: int, max_len: int) -> None:
        if num_layers < 1 or max_len < 1:
            raise ValueError(f"SlotCache(num_layers={num_layers}, max_len={max_len}): both must be >= 1")
        self.max_len = max_len
        self.static_past: Optional[torch.Tensor] = None
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    @classmethod
    def for_model(cls, model, max_len: int) -> "SlotCache":
        """A cache for ``model`` (its text config's ``num_hidden_layers``)."""
        return cls(model.config.get_text_config(decoder=True).num_hidden_layers, max_len)

    def set_length(self, length: int) -> None:
        """Slots in use in every layer (after a captured step: past + the step's real tokens, padding excluded)."""
        if not 0 <= length <= self.max_len:
            raise ValueError(f"length={length} is outside this SlotCache's 0..{self.max_len} slots")
        for layer in self.layers:
            layer.length = length

    def reset(self) -> None:
        """Forget every entry (the buffers stay allocated, at the same addresses, for the next sequence)."""
        self.set_length(0)


STEP_ROOM = 256  # slots the product's static caches keep past the context for one step (compiled.BUCKETS[-1])


class SlotStep(EagerStep):
    """``step.EagerStep`` on one reused ``SlotCache`` of ``max_len`` slots instead of a growing ``DynamicCache``
    (the middle path between eager and ``compiled.CapturedStep``). A sequence may reach ``max_positions`` = max_len -
    ``room`` tokens (``room``: slots kept for a padded step; the decoder ends a decode there as at the model's
    context, and takes plain steps where a larger one has no room)."""

    def __init__(self, model, max_len: int, room: int = 0) -> None:
        super().__init__(model)
        self.cache = SlotCache.for_model(model, max_len)
        self.max_positions = max(max_len - room, 1)

    def fits(self, past: int, q: int) -> bool:
        """Whether a step of ``q`` tokens after ``past`` entries fits in the cache's slots."""
        return past + q <= self.cache.max_len

    def new_cache(self) -> SlotCache:
        """This step's one cache, emptied (its buffers keep their addresses: compiled graphs write them)."""
        self.cache.reset()
        return self.cache
