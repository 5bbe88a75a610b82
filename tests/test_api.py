"""Python API: load once, decode many, stream with transformers' TextStreamer."""
from transformers import TextStreamer

from lp_runtime import LookaheadGenerator
from lp_runtime.config import GenerationConfig

from exactness import assert_greedy_equal
from fakes import lookahead


def test_api_text_messages_ids_and_streamer(smollm2, smollm2_greedy, capsys):
    model, tok = smollm2
    _, questions, prompts, refs = smollm2_greedy  # the first: an MT-Bench question with transformers' greedy answer
    text = questions[0].turns[0]
    gen = LookaheadGenerator(model, tok, lookahead(window_size=2, ngram_size=3, guess_set_size=2),
                             GenerationConfig(max_new_tokens=24))
    ids = gen.encode(text)
    assert ids == gen.encode([{"role": "user", "content": text}]) == prompts[0]  # the chat template, as generate's
    out = gen.generate(text, streamer=TextStreamer(tok, skip_prompt=True))
    assert len(out.output_ids) == 24
    assert_greedy_equal(model, ids, out.output_ids, refs[0][:24], "API text prompt")
    printed = capsys.readouterr().out
    assert printed.strip() == out.text.strip() and out.text
    raw = gen.generate(ids, max_new_tokens=5)
    assert raw.output_ids == out.output_ids[:5] and raw.finish_reason == "length"


def test_from_config_with_progress_false_loads_without_bars_and_puts_them_back(tiny_model_dir, capsys):
    """transformers' "Loading weights" bar showed from the Python API, which has no way to hide it (a new user,
    2026-12-03): ``progress=False`` hides it for the load only; the switch is as it was afterwards."""
    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    from lp_runtime.config import DecodingConfig, ModelConfig

    model = ModelConfig(path=str(tiny_model_dir), dtype="float32")
    fixed = DecodingConfig(method="lookahead")
    capsys.readouterr()
    LookaheadGenerator.from_config(model, fixed)
    assert "Loading weights" in capsys.readouterr().err  # shown by default, as transformers shows it
    gen = LookaheadGenerator.from_config(model, fixed, progress=False)
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled() and not hub.are_progress_bars_disabled()
    assert gen.generate([1, 2, 3], max_new_tokens=4).output_ids  # and it decodes


def test_a_conversation_ending_with_the_assistant_is_continued(tiny_model_dir):
    """A conversation ending with an assistant message got a new assistant turn after it, so the reply started
    afresh instead of continuing "Why did the chicken" (a new user, 2026-12-04): now the prompt ends inside that
    message, as transformers' text-generation pipeline renders it, and generate continues it exactly."""
    from lp_runtime.config import DecodingConfig, ModelConfig

    from exactness import hf_greedy

    gen = LookaheadGenerator.from_config(ModelConfig(path=str(tiny_model_dir), dtype="float32"),
                                         DecodingConfig(method="lookahead"), progress=False)
    chat = [{"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken"}]
    ids = gen.encode(chat)
    assert gen.tokenizer.decode(ids).endswith("<|im_start|>assistant\nWhy did the chicken")
    assert ids == gen.tokenizer.apply_chat_template(chat, continue_final_message=True, tokenize=True,
                                                    return_dict=True)["input_ids"]
    assert gen.tokenizer.decode(gen.encode(chat[:1])).endswith("<|im_end|>\n<|im_start|>assistant\n")  # a new turn
    out = gen.generate(chat, max_new_tokens=12)
    assert out.output_ids == hf_greedy(gen.model, ids, 12)


def test_auto_without_calibration_prompts_keeps_the_curves_policy(tiny_model_dir, tmp_path, monkeypatch):
    """decoding=auto's calibration needs prompts; a generator without a tokenizer keeps the cost policy on the
    latency curve (``auto.auto_policy``) and the setting as given, instead of failing; the prompts are asked for
    only when a calibration has to run (they were built at every construction, then again to calibrate)."""
    import pytest

    from lp_runtime import latency, models
    from lp_runtime.auto import NoCalibrationPrompts, calibration_prompts
    from lp_runtime.config import DecodingConfig, ModelConfig
    from lp_runtime.policy import CostPolicy

    monkeypatch.setenv("LP_RUNTIME_CACHE", str(tmp_path))
    model, _ = models.load_model(ModelConfig(name="tiny", path=str(tiny_model_dir), device="cpu"), progress=False)
    curve = {1: 0.01, 2: 0.011, 64: 0.04}
    latency.latency_profile(models.model_id_of(model), latency.device_key(model), "float32", measure=lambda: curve)
    with pytest.raises(NoCalibrationPrompts, match="^decoding=auto's calibration needs a tokenizer to build its "
                                                   "prompts$"):
        calibration_prompts(None)
    given = DecodingConfig(method="auto", window_size=0, ngram_size=4, guess_set_size=2)
    gen = LookaheadGenerator(model, None, given, progress=False)
    policy = gen.decoder.step_policy
    assert isinstance(policy, CostPolicy) and gen.decoder.cfg == given
    assert [policy.curve(q) for q in (1, 2, 64)] == pytest.approx(list(curve.values()))
