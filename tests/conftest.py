"""Shared pytest fixtures."""
import pytest

from lp_runtime.config import ModelConfig
from lp_runtime.models import load_model


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer): the bundled SmolLM2-135M-Instruct, float32 on CPU (first run converts the GGUF, ~50 s)."""
    return load_model(ModelConfig(path="bundled:smollm2", dtype="float32", device="cpu"))
