"""Logits processors given both by the sampling settings and by the caller: refused once, by name (a processor
applied twice compounds: two repetition penalties of 1.3 act as one of 1.69)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, SuppressTokensLogitsProcessor, TemperatureLogitsWarper,
    TopKLogitsWarper, TopPLogitsWarper,
)

from lp_runtime.config import DecodingConfig, SamplingConfig
from fakes import lookahead
from lp_runtime.decoder import Decoder
from lp_runtime.sampling import Sampler


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, bos_token_id=None,
                                        eos_token_id=None, pad_token_id=None)).eval()


@pytest.mark.parametrize("setting, processor, shown", [
    ({"repetition_penalty": 1.3}, RepetitionPenaltyLogitsProcessor(1.3), "sampling.repetition_penalty=1.3"),
    ({"suppress_tokens": [5]}, SuppressTokensLogitsProcessor([7]), "sampling.suppress_tokens=[5]"),
    ({"temperature": 0.7}, TemperatureLogitsWarper(0.7), "sampling.temperature=0.7"),
    ({"temperature": 0.7, "top_k": 20}, TopKLogitsWarper(20), "sampling.top_k=20"),
    ({"temperature": 0.7, "top_p": 0.9}, TopPLogitsWarper(0.9), "sampling.top_p=0.9"),
    ({"temperature": 0.7, "min_p": 0.1}, MinPLogitsWarper(0.1), "sampling.min_p=0.1"),
])
def test_a_processor_the_settings_build_too_is_refused(tiny, setting, processor, shown):
    name = type(processor).__name__
    message = (f"logits processor {name} is given twice: {shown} builds one and logits_processor passes another; "
               "remove one (applied twice it would compound)")
    with pytest.raises(ValueError) as e:
        Decoder(tiny, lookahead(), sampling=SamplingConfig(**setting),
                logits_processor=[processor])
    assert str(e.value) == message
    with pytest.raises(ValueError) as e:
        Sampler(SamplingConfig(**setting), [processor])
    assert str(e.value) == message


def test_the_same_class_twice_in_logits_processor_is_refused(tiny):
    with pytest.raises(ValueError) as e:
        Decoder(tiny, DecodingConfig(method="greedy"),
                logits_processor=[RepetitionPenaltyLogitsProcessor(1.3), RepetitionPenaltyLogitsProcessor(1.1)])
    assert str(e.value) == ("logits processor RepetitionPenaltyLogitsProcessor is given twice in logits_processor; "
                            "pass it once (applied twice it would compound)")


def test_a_processor_given_once_is_applied_once(tiny):
    # the caller's penalty alone equals the setting's alone: both paths give the same tokens
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    by_setting = Decoder(tiny, lookahead(), sampling=SamplingConfig(repetition_penalty=1.3))
    by_caller = Decoder(tiny, lookahead(), logits_processor=[RepetitionPenaltyLogitsProcessor(1.3)])
    assert by_setting.generate(prompt, max_new_tokens=12).output_ids == by_caller.generate(prompt, max_new_tokens=12).output_ids
    # greedy settings build no warper: a caller's temperature warper is then the only one, and allowed
    assert len(Sampler(SamplingConfig(), [TemperatureLogitsWarper(0.7)]).processors) == 1
