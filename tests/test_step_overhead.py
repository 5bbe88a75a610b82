"""Per-step work the decoder can skip: a copy-KV commit whose accepted path is already in place moves nothing."""
from __future__ import annotations

import torch

from lp_runtime.kv import commit, new_cache


def _cache():
    cache = new_cache()
    keys = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1).repeat(1, 2, 1, 3)
    cache.update(keys, keys + 100, 0)
    cache.update(keys + 50, keys + 150, 1)  # a second layer
    return cache


def _ops(cache, **commit_args) -> dict[str, int]:
    """{aten op: calls} of one ``commit`` (torch's profiler: no patching of torch or lp_runtime)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        commit(cache, **commit_args)
    return {e.key: e.count for e in prof.key_averages()}


def test_commit_in_place_path_moves_nothing():
    cache = _cache()
    ops = _ops(cache, num_fed=6, num_keep=2, gather=[2, 3])  # step = entries 4..9; 6, 7 already follow 4, 5
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert not {"aten::lift_fresh", "aten::index_select", "aten::copy_"} & set(ops), ops  # no index tensor, no move
    cache = _cache()
    ops = _ops(cache, num_fed=6, num_keep=2, gather=[3, 5])  # moved: one index tensor for every layer
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
    assert cache.layers[1].values[0, 1, :, 0].tolist() == [150, 151, 152, 153, 154, 155, 157, 159]
    assert (ops["aten::lift_fresh"], ops["aten::index_select"], ops["aten::copy_"]) == (1, 4, 4), ops
