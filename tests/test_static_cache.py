"""static_cache.SlotCache against transformers' DynamicCache on a tiny random Llama in float32 (issue 19, item 1):
the same greedy tokens, the same tree-step logits with a 4D mask, the same KV after a copy-KV commit."""
import pytest
import torch
from fakes import llama, lookahead
from transformers import DynamicCache, LlamaForCausalLM

from lp_runtime.kv import commit
from lp_runtime.layout import LayoutCache, full_mask
from lp_runtime.static_cache import SlotCache


def tiny_llama(layers: int = 2) -> LlamaForCausalLM:
    """``fakes.llama`` with ``layers`` layers and room for 512 positions (the same weights at every call)."""
    return llama(num_hidden_layers=layers, max_position_embeddings=512)


PROMPT = [5, 17, 3, 44, 9, 61, 2, 30, 17, 3]


def greedy(model, cache, prompt, n):
    """Plain greedy decoding by hand: prefill, then one token a step with explicit position ids."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        for i in range(n - 1):
            pos = torch.tensor([[len(prompt) + i]])
            out = model(input_ids=torch.tensor([tokens[-1:]]), position_ids=pos, past_key_values=cache,
                        use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def test_greedy_tokens_equal_dynamic_cache():
    model = tiny_llama()
    ref = greedy(model, DynamicCache(), PROMPT, 16)
    cache = SlotCache.for_model(model, max_len=64)
    assert greedy(model, cache, PROMPT, 16) == ref
    assert cache.get_seq_length() == len(PROMPT) + 15
    cache.reset()  # the same buffers serve the next sequence
    assert greedy(model, cache, PROMPT[:4], 8) == greedy(model, DynamicCache(), PROMPT[:4], 8)


def tree_step(model, cache, past):
    """One step over [c][tree] with a 4D mask, copy-KV commit of the path 0 -> 2, then one plain step."""
    parents = (-1, -1, 0, 2)  # nodes 0 and 1 children of c; 2 below 0; 3 below 2
    tokens = [8, 40, 12, 77]
    lay, depth, inner, keep = LayoutCache(torch.device("cpu"), torch.float32).get(1, (), 0, parents)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[PROMPT[-1]] + tokens]), position_ids=(depth + past)[None],
                    attention_mask=full_mask(inner, past), past_key_values=cache, use_cache=True)
        commit(cache, 5, 1, [1 + 0, 1 + 2])  # keep c, then nodes 0 and 2
        nxt = model(input_ids=torch.tensor([[tokens[2]]]), position_ids=torch.tensor([[past + 3]]),
                    past_key_values=cache, use_cache=True)
    return out.logits[0], nxt.logits[0, -1]


def test_tree_step_and_commit_equal_dynamic_cache():
    model = tiny_llama()
    results = []
    for cache in (DynamicCache(), SlotCache.for_model(model, max_len=32)):
        with torch.inference_mode():
            model(input_ids=torch.tensor([PROMPT[:-1]]), past_key_values=cache, use_cache=True)
        results.append((tree_step(model, cache, len(PROMPT) - 1), cache))
    (step_d, next_d), dyn = results[0]
    (step_s, next_s), slot = results[1]
    assert torch.equal(step_d.argmax(-1), step_s.argmax(-1))
    assert (step_d - step_s).abs().max().item() < 1e-5
    assert (next_d - next_s).abs().max().item() < 1e-5
    assert slot.get_seq_length() == dyn.get_seq_length() == len(PROMPT) + 3
    for a, b in zip(dyn.layers, slot.layers):
        n = dyn.get_seq_length()
        assert (a.keys - b.keys[:, :, :n]).abs().max().item() < 1e-5  # layer 2's inputs went through attention
        assert (a.values - b.values[:, :, :n]).abs().max().item() < 1e-5


def test_overflow_and_bad_sizes_are_refused():
    model = tiny_llama()
    cache = SlotCache.for_model(model, max_len=8)
    with pytest.raises(ValueError, match="SlotCache holds 8 slots; this step needs 10"):
        greedy(model, cache, PROMPT, 1)
    with pytest.raises(ValueError, match=r"SlotCache\(num_layers=0, max_len=8\): both must be >= 1"):
        SlotCache(0, 8)
    with pytest.raises(ValueError, match="length=9 is outside this SlotCache's 0..8 slots"):
        cache.set_length(9)


def test_slot_step_decodes_as_eager_step():
    from lp_runtime.config import DecodingConfig
    from lp_runtime.decoder import Decoder
    from lp_runtime.static_cache import SlotStep

    model = tiny_llama()
    for decoding in (DecodingConfig(method="greedy"), lookahead(window_size=3, ngram_size=3, guess_set_size=2)):
        ref = Decoder(model, decoding).generate(PROMPT * 3, max_new_tokens=20)
        out = Decoder(model, decoding, step=SlotStep(model, max_len=128)).generate(PROMPT * 3, max_new_tokens=20)
        assert (out.output_ids, out.step_tokens) == (ref.output_ids, ref.step_tokens)


def test_a_static_cache_ends_a_decode_as_the_context_does():
    """A static cache holds the model's context, at most 8,192 positions (``compiled.default_max_len``); a request
    past them failed mid-decode with SlotCache's ValueError, and a window step near its end wrote past its slots
    (found 2026-12-04 with a 20,000-position model and an 8,514-token prompt). Now the cache ends a decode as the
    model's context does: up to its end, steps that do not fit are plain steps (the growing cache's tokens), the
    budget stops there (finish_reason length), and a prompt filling it is refused in one line."""
    from lp_runtime.config import ConfigError
    from lp_runtime.decoder import Decoder
    from lp_runtime.static_cache import SlotStep

    model, setting = tiny_llama(), lookahead(window_size=3, ngram_size=4, guess_set_size=2)
    step = SlotStep(model, max_len=48, room=8)
    assert step.max_positions == 40 and step.fits(37, 11) and not step.fits(38, 11)
    ref = Decoder(model, setting).generate(PROMPT, max_new_tokens=30)
    out = Decoder(model, setting, step=step).generate(PROMPT, max_new_tokens=30)  # 10 + 30 = 40 positions
    assert out.output_ids == ref.output_ids and len(out.output_ids) == 30
    assert max(out.step_tokens) > 8 and out.step_tokens[-1] == 1  # window steps, then plain ones at the end
    longer = Decoder(model, setting, step=step).generate(PROMPT, max_new_tokens=31)
    assert (longer.output_ids, longer.finish_reason) == (out.output_ids, "length")
    with pytest.raises(ConfigError) as e:
        Decoder(model, setting, step=step).generate(PROMPT * 4, max_new_tokens=1)
    assert str(e.value) == (
        "the prompt (40 tokens) fills this decoder's static KV cache of 40 tokens (model.compile's static and "
        "compiled paths); shorten it, or set model.compile=false (a cache that grows up to the model's context of "
        "512 tokens)")
