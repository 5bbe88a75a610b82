"""Shared pytest fixtures."""
from pathlib import Path

import pytest

from lp_runtime.config import ModelConfig
from lp_runtime.models import load_model


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer): the bundled SmolLM2-135M-Instruct, float32 on CPU (first run converts the GGUF, ~50 s)."""
    return load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer random Llama with SmolLM2's tokenizer (chat template included), saved as a local folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from lp_runtime import models

    cached = Path(models.cache_root()) / "smollm2-135m-instruct"
    if (cached / "tokenizer.json").is_file():
        tok = AutoTokenizer.from_pretrained(cached)
    else:
        folder, gguf_file, _ = models._bundled_gguf("smollm2")
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    out = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out
