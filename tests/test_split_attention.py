"""attention.split_attention (prefix + step block merged by log-sum-exp) against dense-mask sdpa, float32
(issue 19, item 3): kernel-level max abs difference, and the same greedy / tree-step outputs on a tiny Llama."""
from types import SimpleNamespace

import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lp_runtime.attention import SPLIT, split_attention, use_split_attention
from lp_runtime.layout import LayoutCache, full_mask
from lp_runtime.static_cache import SlotCache
from test_static_cache import PROMPT, greedy, tiny_llama

PARENTS = (-1, -1, 0, 2, 1)  # a candidate tree below c


def step_tensors(past: int, spare: int = 0, seed: int = 0):
    """query (1, 4, q, 8); keys/values (1, 2, past+q+spare, 8) (GQA 2 groups); the step's float (q, q) tree
    mask. ``spare`` slots after the step hold garbage a static buffer may hold."""
    gen = torch.Generator().manual_seed(seed)
    _, depth, inner, _ = LayoutCache(torch.device("cpu"), torch.float32).get(2, (), 0, PARENTS)
    q = inner.shape[0]
    query = torch.randn(1, 4, q, 8, generator=gen)
    key, value = (torch.randn(1, 2, past + q + spare, 8, generator=gen) for _ in range(2))
    return query, key, value, inner


def dense(query, key, value, inner, past):
    module = SimpleNamespace(scaling=8 ** -0.5, num_key_value_groups=2, is_causal=True, training=False)
    out, _ = sdpa_attention_forward(module, query, key[:, :, : past + inner.shape[0]],
                                    value[:, :, : past + inner.shape[0]], full_mask(inner, past))
    return out, module


def test_merge_equals_dense_mask_eager_geometry():
    for past in (0, 1, 37):
        query, key, value, inner = step_tensors(past)
        ref, module = dense(query, key, value, inner, past)
        out, _ = split_attention(module, query, key, value, inner[None, None])
        assert out.shape == ref.shape == (1, inner.shape[0], 4, 8)
        assert (out - ref).abs().max().item() < 1e-5, past


def test_merge_equals_dense_mask_static_buffer():
    """Keys in a whole buffer: the prefix is slots < past, the step sits at past.., later slots are garbage."""
    past = 23
    query, key, value, inner = step_tensors(past, spare=30, seed=1)
    ref, module = dense(query, key, value, inner, past)
    out, _ = split_attention(module, query, key, value, inner[None, None], lp_past=torch.tensor(past))
    assert (out - ref).abs().max().item() < 1e-5


def test_dense_mask_and_no_mask_behave_as_sdpa():
    query, key, value, inner = step_tensors(11, seed=2)
    ref, module = dense(query, key, value, inner, 11)
    out, _ = split_attention(module, query, key, value, full_mask(inner, 11))
    assert torch.equal(out, ref)
    causal = torch.zeros(inner.shape).masked_fill(torch.ones(inner.shape, dtype=torch.bool).triu(1), -1e30)
    ref_causal, _ = dense(query, key, value, causal, 11)
    out_causal, _ = split_attention(module, query, key, value, None)
    assert (out_causal - ref_causal).abs().max().item() < 1e-5


def test_tiny_llama_greedy_and_tree_step_match_sdpa():
    ref_model, model = tiny_llama(), tiny_llama()
    use_split_attention(model)
    assert model.config._attn_implementation == SPLIT
    assert greedy(model, DynamicCache(), PROMPT, 16) == greedy(ref_model, DynamicCache(), PROMPT, 16)
    assert greedy(model, SlotCache.for_model(model, 64), PROMPT, 16) == greedy(ref_model, DynamicCache(), PROMPT, 16)
    lay, depth, inner, keep = LayoutCache(torch.device("cpu"), torch.float32).get(1, (), 0, PARENTS)
    past = len(PROMPT) - 1
    logits = []
    for m, mask in ((ref_model, full_mask(inner, past)), (model, inner[None, None])):
        cache = DynamicCache()
        with torch.inference_mode():
            m(input_ids=torch.tensor([PROMPT[:-1]]), past_key_values=cache, use_cache=True)
            ids = torch.tensor([[PROMPT[-1], 8, 40, 12, 77, 3]])
            logits.append(m(input_ids=ids, position_ids=(depth + past)[None], attention_mask=mask,
                            past_key_values=cache, use_cache=True).logits[0])
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))
    assert (logits[0] - logits[1]).abs().max().item() < 1e-4
