"""Per-step work the decoder can skip: a copy-KV commit whose accepted path is already in place moves nothing."""
from __future__ import annotations

import torch

from lp_runtime import kv
from lp_runtime.kv import commit, new_cache


def _cache():
    cache = new_cache()
    keys = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1).repeat(1, 2, 1, 3)
    cache.update(keys, keys + 100, 0)
    cache.update(keys + 50, keys + 150, 1)  # a second layer
    return cache


def test_commit_in_place_path_moves_nothing(monkeypatch):
    made = []  # the non-empty index lists commit turns into tensors
    real = torch.tensor

    def counting(data, *args, **kwargs):
        if isinstance(data, list) and data:
            made.append(data)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(kv.torch, "tensor", counting)
    cache = _cache()
    commit(cache, num_fed=6, num_keep=2, gather=[2, 3])  # step = entries 4..9; 6, 7 already follow 4, 5
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7] and made == []
    cache = _cache()
    commit(cache, num_fed=6, num_keep=2, gather=[3, 5])  # moved: one index tensor for every layer
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
    assert cache.layers[1].values[0, 1, :, 0].tolist() == [150, 151, 152, 153, 154, 155, 157, 159]
    assert made == [[7, 9]]
