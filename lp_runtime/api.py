"""Python API: load a model once, decode many prompts, stream tokens.

Example::

    from transformers import TextStreamer
    from lp_runtime import LookaheadGenerator
    from lp_runtime.config import SamplingConfig

    gen = LookaheadGenerator.from_config()                       # bundled SmolLM2 in float32, decoding=auto
    streamer = TextStreamer(gen.tokenizer, skip_prompt=True, skip_special_tokens=True)  # no <|im_end|> at the end
    out = gen.generate("Write a haiku about the sea.", streamer=streamer)
    print(out.text, out.decoding_steps, out.accept_lengths)
    ids = gen.generate([1, 2, 3], max_new_tokens=16).output_ids  # token ids in, raw completion
    out = gen.generate("A limerick, please.", sampling=SamplingConfig(temperature=0.7, seed=1))  # this call samples

A ``str`` prompt is a user message put through the model's chat template; a list of ``{"role", "content"}``
dicts is a whole conversation (ending with an assistant message: the reply continues it, as transformers'
text-generation pipeline does); token ids (a list of ints, a 1-D or (1, n) tensor or array, or a tokenizer's
``BatchEncoding``) are used as they are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from .config import (ConfigError, DecodingConfig, GenerationConfig, ModelConfig, SamplingConfig, is_bool,
                     lone_surrogate)
from .compiled import step_for
from .decoder import Decoder, GenerationOutput
from .models import load_model
from .auto import NoCalibrationPrompts, auto_policy, resolve_auto
from .latency import curve_of
from .policy import CostPolicy
from .checks import (check_arg, check_eos_ids, check_limits, check_max_new_tokens, check_model, check_prompt_ids,
                     check_tokenizer, eos_token_ids, one_sequence, vocab_size)
from .data import blank_kind, encode_messages, is_blank

Prompt = Union[str, Sequence[int], Sequence[dict]]


def _check_progress(progress) -> None:
    if not is_bool(progress):  # "no" was a true flag (a new user, session 22)
        raise ConfigError(f"progress={progress!r} is not allowed; it must be True or False")


@dataclass
class TextOutput(GenerationOutput):
    """``GenerationOutput`` plus ``text``: the new tokens decoded without special tokens."""

    text: str = ""


def _check_configs(decoding, generation, sampling) -> None:
    """``checks.check_arg`` on each config argument given (None: the default)."""
    for value, kind, what in ((decoding, DecodingConfig, "decoding"), (generation, GenerationConfig, "generation"),
                              (sampling, SamplingConfig, "sampling")):
        if value is not None:
            check_arg(value, kind, what)


def _check_text(text: str, where: str, wanted: str) -> None:
    """``ConfigError`` naming ``where`` for a blank ``text`` (as an empty or blank turn in a JSONL question file is
    refused; ``wanted``: what to give instead) or one holding a lone surrogate (the tokenizer's TypeError)."""
    if is_blank(text):
        raise ConfigError(f"{where} is {blank_kind(text)}; give {wanted}")
    bad = lone_surrogate(text)
    if bad is not None:
        raise ConfigError(f"{where} holds a lone UTF-16 surrogate {text[bad]!r} at character {bad}; give valid "
                          "Unicode text")


class LookaheadGenerator:
    """A loaded model + tokenizer and one decoding setting, reused across calls.

    Args:
        model, tokenizer: a transformers causal LM and its tokenizer.
        decoding: default ``DecodingConfig()`` (``decoding=auto``, resolved as the main job resolves it:
            ``auto.resolve_auto`` picks W from this machine's latency profile and turns the successor table on where
            its calibration says it pays, printing one line; the profile and the calibration are measured once,
            then read from the cache). Where a calibration must run and has no prompts (no tokenizer, or neither the
            MT-Bench nor the HumanEval package installed): the cost policy on the profile for the setting as given
            (``auto.auto_policy``).
        generation: default budget, stop strings and EOS ids (``GenerationConfig()``).
        step: the model step (default eager; ``compiled.step_for`` builds the compiled one).
        sampling: every call's default (``SamplingConfig()``: greedy); ``generate(..., sampling=...)`` replaces it.
        progress: ``decoding=auto``'s calibration bar on stderr (its first use on this machine).

    Raises ``ConfigError`` for settings the model cannot take (``checks.check_limits``: ids outside the
    vocabulary, a lookahead step longer than the context).
    """

    def __init__(self, model, tokenizer, decoding: Optional[DecodingConfig] = None,
                 generation: Optional[GenerationConfig] = None, step=None,
                 sampling: Optional[SamplingConfig] = None, progress: bool = True) -> None:
        check_model(model)
        check_tokenizer(tokenizer)
        _check_progress(progress)
        self.model, self.tokenizer = model, tokenizer
        self.generation, self.sampling = generation or GenerationConfig(), sampling
        decoding = decoding or DecodingConfig()
        _check_configs(decoding, self.generation, sampling)
        decoding.check_candidates(1)
        check_limits(model, decoding, sampling, generation=self.generation)
        eos = eos_token_ids(model, tokenizer, self.generation.eos_token_ids)
        policy = None
        if decoding.method == "auto":  # the main job's setting: W, the successor table, the policy's curve
            try:
                decoding, entry = resolve_auto(model, tokenizer, decoding, step=step, progress=progress, make_decoder=(
                    lambda d, p: Decoder(model, d, eos_token_ids=eos, tokenizer=tokenizer, step_policy=p, step=step)))
                policy = CostPolicy(curve_of(entry))
            except NoCalibrationPrompts:  # nothing calibrated yet and nothing to calibrate on: the curve's policy
                policy = auto_policy(model, step=step)
        self.decoder = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tokenizer, step_policy=policy, step=step,
                               sampling=sampling)

    @classmethod
    def from_config(cls, model: Optional[ModelConfig] = None, decoding: Optional[DecodingConfig] = None,
                    generation: Optional[GenerationConfig] = None,
                    sampling: Optional[SamplingConfig] = None, progress: bool = True) -> "LookaheadGenerator":
        """Load the model of ``model`` (default: the bundled SmolLM2) and build a generator. ``progress=False``:
        no progress bar while loading (transformers' "Loading weights", a download, the one-time GGUF conversion)
        or calibrating."""
        model = model or ModelConfig()
        check_arg(model, ModelConfig, "model")
        _check_progress(progress)
        _check_configs(decoding, generation, sampling)  # before the model loads
        m, tok = load_model(model, progress=progress)
        return cls(m, tok, decoding, generation, step=step_for(m, model.compile), sampling=sampling, progress=progress)

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of ``prompt`` (see the module docstring). ``ConfigError`` for an empty or blank prompt, a batch,
        a malformed message, or token ids that are not integers or lie outside the model's vocabulary."""
        prompt = one_sequence(prompt)  # a BatchEncoding, a (1, n) or 1-D tensor: a list of ids
        if not isinstance(prompt, (str, list, tuple)):
            raise ConfigError(f"the prompt is {type(prompt).__name__}; give text (str), a list of messages "
                              "({'role', 'content'} dicts) or a list (or 1-D tensor) of token ids")
        if (isinstance(prompt, str) or (prompt and isinstance(prompt[0], dict))) and self.tokenizer is None:
            raise ConfigError("a text or messages prompt needs a tokenizer; this generator has none "
                              "(tokenizer=None): give token ids")
        if isinstance(prompt, str):
            _check_text(prompt, "the prompt", "a non-empty user turn")
            prompt = [{"role": "user", "content": prompt}]
        if len(prompt) == 0:
            raise ConfigError("the prompt is empty; give text, messages or at least one token id")
        if isinstance(prompt[0], dict):
            for i, message in enumerate(prompt):
                if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                        and isinstance(message.get("content"), str)):
                    raise ConfigError(f"prompt message {i} is {message!r:.80}; every message must be a dict with a "
                                      "str 'role' and a str 'content', e.g. {'role': 'user', 'content': 'Hi'}")
                _check_text(message["content"], f"prompt message {i}", "every message non-empty content")
            return encode_messages(self.tokenizer, list(prompt))
        return check_prompt_ids(prompt, vocab_size(self.model))

    def generate(self, prompt: Prompt, *, max_new_tokens: Optional[int] = None,
                 stop_strings: Optional[Sequence[str]] = None, streamer=None,
                 sampling: Optional[SamplingConfig] = None) -> TextOutput:
        """Decode one prompt; ``streamer`` (e.g. ``transformers.TextStreamer``) gets every token in order.
        ``max_new_tokens``, ``stop_strings`` (a single string counts as one), ``sampling``: None = the generator's.
        ``ConfigError`` for ``max_new_tokens`` < 1 or sampling ids outside the vocabulary."""
        check_arg(self.generation, GenerationConfig, "generation")  # a field set after construction: checked again
        budget = self.generation.max_new_tokens if max_new_tokens is None else check_max_new_tokens(max_new_tokens)
        eos = check_eos_ids(eos_token_ids(self.model, self.tokenizer, self.generation.eos_token_ids),
                            vocab_size(self.model))
        self.decoder.eos_token_ids = eos  # generation.eos_token_ids set after construction applies too
        sampling = self.sampling if sampling is None else sampling  # the generator's own: read (and checked) anew,
        if sampling is not None:                                     # as the decoding and generation configs are
            check_arg(sampling, SamplingConfig, "sampling")
        check_arg(self.decoder.cfg, DecodingConfig, "decoding")  # a field set after construction: checked again,
        check_limits(self.model, self.decoder.cfg, sampling)     # the step's length against the context included
        out = self.decoder.generate(self.encode(prompt), max_new_tokens=budget, streamer=streamer, sampling=sampling,
                                    stop_strings=self.generation.stop_strings if stop_strings is None else stop_strings)
        text = self.tokenizer.decode(out.output_ids, skip_special_tokens=True) if self.tokenizer is not None else ""
        return TextOutput(**vars(out), text=text)
