"""The test suite's models, built in one place: tiny random Llamas, the character tokenizer and the forced-successor LM.

Every builder seeds torch first, so the same call gives the same weights in every process (the LP driver's
ranks included). Imported by the tests and by tests/lp_driver.py.
"""
from __future__ import annotations

import math

import torch

V = 96
TINY = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
TINY8 = dict(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
             pad_token_id=None)


def lookahead(**over):
    """A fixed-setting ``DecodingConfig``: ``decoding=lookahead``'s preset (W=0, N=4, G=2, max_depth=10), ``over``
    replacing fields. ``DecodingConfig()`` itself is the main job's ``decoding=auto``, which needs a latency
    profile."""
    from lp_runtime.config import DecodingConfig

    return DecodingConfig(**{"method": "lookahead", **over})


def llama(**over):
    """A 2-layer random Llama over ``V`` = 96 ids (``initializer_range`` 0.3, so positions and masks move the
    argmax), context 256; ``over`` replaces config fields."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, "max_position_embeddings": 256, **over})).eval()


def tiny_model():
    """The LP driver's tiny random Llama (vocab 64, context 512, fixed seed, float32, eval)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval()


def char_tokenizer():
    """A character-level tokenizer (a WordLevel vocabulary of 43 characters after <unk>, <s> = 1, </s> = 2): the
    suite's model folders pair it with a tiny random model of vocabulary 64."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list("abcdefghijklmnopqrstuvwxyz .,?!'0123456789\n")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{ch: i + 3 for i, ch in enumerate(chars)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def build_tiny8():
    """A one-layer tiny Llama with an 8-token vocabulary and peaked distributions (same weights in every process;
    one layer: the sampling-law tests decode it thousands of times)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    model = LlamaForCausalLM(LlamaConfig(**TINY8)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model


class ForcedLM(torch.nn.Module):
    """A causal LM whose greedy next token after ``t`` is ``succ[t]`` (default ``t + 1``); a tiny Llama runs
    underneath so cache, positions and mask go through transformers. ``nan_after``: tokens whose logits row is
    ``bad`` (NaN, or +inf; only that row: the hidden states stay finite, so plain decoding that never emits after
    them finishes)."""

    def __init__(self, vocab: int, succ: dict[int, int], nan_after=(), bad: float = math.nan):
        from transformers import LlamaConfig, LlamaForCausalLM

        super().__init__()
        torch.manual_seed(0)
        self.inner = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                                  max_position_embeddings=512)).eval()
        self.config = self.inner.config
        self.vocab = vocab
        table = (torch.arange(vocab) + 1) % vocab
        for k, v in succ.items():
            table[k] = v
        self.register_buffer("table", table)
        self.nan_after = torch.tensor(sorted(nan_after), dtype=torch.long)
        self.bad = bad
        self.calls = 0

    @property
    def dtype(self):
        return self.inner.dtype

    def forward(self, input_ids, logits_to_keep=0, **kwargs):
        self.calls += 1
        out = self.inner(input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)
        kept = input_ids[:, logits_to_keep] if isinstance(logits_to_keep, torch.Tensor) else input_ids
        logits = torch.nn.functional.one_hot(self.table[kept], self.vocab).float() * 10
        bad = torch.isin(kept, self.nan_after)
        out.logits = torch.where(bad[..., None], torch.full_like(logits, self.bad), logits)
        return out


def conversion_with_a_bar(folder: str, gguf_file: str, out: str) -> None:
    """A stand-in for ``bundled.convert_gguf`` (tests of ``bundled.convert_quietly``): a tqdm bar drawn as
    transformers' GGUF loader draws its own (``tqdm.auto``, no ``disable`` argument), a line on stderr and one on
    stdout, and a file in ``out``."""
    import sys
    from pathlib import Path

    from tqdm.auto import tqdm

    for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
        pass
    print("a warning of the conversion", file=sys.stderr)
    print("a line of the conversion")
    Path(out, "model.safetensors").write_text(f"{folder}/{gguf_file}")


def conversion_that_fails(folder: str, gguf_file: str, out: str) -> None:
    """A stand-in for ``bundled.convert_gguf`` whose copy fails its check after a warning on stderr."""
    import sys

    from lp_runtime.bundled import ModelLoadError

    print("a warning before the failure", file=sys.stderr)

    raise ModelLoadError(f"the float32 copy in {out} does not compute the GGUF model's logits")
