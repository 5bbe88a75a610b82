"""Logits processing and seeded draws shared by plain and lookahead decoding (docs/design.md section 1).

Processing is transformers' own processors in ``generate``'s order, each row processed against its own prefix (the
accepted sequence plus, for a tree node, its path). Draws are keyed, not streamed: the uniforms deciding the token
at sequence position t are ``uniforms(seed, t, n)``, so whichever LP rank computes a position draws the same
numbers and the output does not depend on the LP degree (docs/design.md section 6.5)."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import random
import warnings
import weakref
from typing import Any, Optional, Sequence

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, SuppressTokensLogitsProcessor, TemperatureLogitsWarper,
    TopKLogitsWarper, TopPLogitsWarper,
)

from .config import ConfigError, SamplingConfig
from .verify import node_outcome

SUPPORTED_PROCESSORS = (RepetitionPenaltyLogitsProcessor, SuppressTokensLogitsProcessor, TemperatureLogitsWarper,
                        TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)


def build_processors(cfg: SamplingConfig) -> list:
    """transformers' processors for ``cfg`` in ``generate``'s order; warpers only when ``cfg.do_sample``."""
    procs: list = []
    if cfg.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(float(cfg.repetition_penalty)))
    if cfg.suppress_tokens:
        procs.append(SuppressTokensLogitsProcessor(list(cfg.suppress_tokens)))
    if cfg.do_sample:
        if cfg.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(float(cfg.temperature)))
        if cfg.top_k != 0:
            procs.append(TopKLogitsWarper(top_k=int(cfg.top_k)))
        if cfg.top_p < 1.0:
            procs.append(TopPLogitsWarper(top_p=float(cfg.top_p)))
        if cfg.min_p > 0.0:
            procs.append(MinPLogitsWarper(min_p=float(cfg.min_p)))
    return procs


_SETTING = {RepetitionPenaltyLogitsProcessor: "repetition_penalty", SuppressTokensLogitsProcessor: "suppress_tokens",
            TemperatureLogitsWarper: "temperature", TopKLogitsWarper: "top_k", TopPLogitsWarper: "top_p",
            MinPLogitsWarper: "min_p"}  # the sampling setting that builds each class (build_processors)


def check_processors(processors: Sequence, cfg: Optional[SamplingConfig] = None) -> list:
    """``processors`` as a list; ``ValueError`` naming the first one not in ``SUPPORTED_PROCESSORS`` (only those
    depend on a row's prefix and scores alone) or given twice (two of one class, or of a class ``cfg`` builds)."""
    names = ", ".join(c.__name__ for c in SUPPORTED_PROCESSORS)
    built = {type(p) for p in build_processors(cfg)} if cfg is not None else set()
    seen: set = set()
    for p in processors:
        kind = type(p)
        if kind not in SUPPORTED_PROCESSORS:
            raise ValueError(f"logits processor {kind.__name__} is not supported by lp_runtime; supported: {names}")
        if kind in built:
            key = _SETTING[kind]
            raise ValueError(f"logits processor {kind.__name__} is given twice: sampling.{key}="
                             f"{getattr(cfg, key)!r} builds one and logits_processor passes another; remove one "
                             "(applied twice it would compound)")
        if kind in seen:
            raise ValueError(f"logits processor {kind.__name__} is given twice in logits_processor; pass it once "
                             "(applied twice it would compound)")
        seen.add(kind)
    return list(processors)


# What ``generate`` turns into processing beyond the fields ``model_sampling`` takes, with their "off" values.
_TAKEN = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "suppress_tokens")
_UNSUPPORTED = {
    "no_repeat_ngram_size": (None, 0), "encoder_repetition_penalty": (None, 1.0),
    "encoder_no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,), "min_length": (None, 0),
    "min_new_tokens": (None, 0), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,), "begin_suppress_tokens": (None,), "sequence_bias": (None,),
    "guidance_scale": (None, 1.0), "watermarking_config": (None,), "renormalize_logits": (None, False),
    "remove_invalid_values": (None, False),
}
_UNSUPPORTED_SAMPLING = {"typical_p": (None, 1.0), "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0),
                         "top_h": (None,)}


def _unsupported(gen_cfg: Any) -> dict[str, Any]:
    """The fields of ``gen_cfg`` that ask for processing lp_runtime cannot apply exactly, with their values."""
    table = {**_UNSUPPORTED, **(_UNSUPPORTED_SAMPLING if getattr(gen_cfg, "do_sample", None) else {})}
    out = {}
    for name, off in table.items():
        value = getattr(gen_cfg, name, None)
        if not any(value is o or (o is not None and value == o) for o in off) and value not in ([], {}):
            out[name] = value
    return out


def model_sampling(gen_cfg: Any, base: SamplingConfig) -> SamplingConfig:
    """``base`` with the sampling fields of a model's ``generation_config`` as ``generate`` applies them (unset:
    greedy, top_k 50 when sampling). ``ConfigError`` for no ``gen_cfg``, do_sample with temperature <= 0, or
    naming every field lp_runtime cannot apply exactly (``no_repeat_ngram_size``, ...)."""
    if gen_cfg is None:
        raise ConfigError("sampling=model needs the model's generation_config; this model has none")
    do_sample = bool(getattr(gen_cfg, "do_sample", None))
    bad = _unsupported(gen_cfg)
    if bad:
        listed = ", ".join(f"{k}={v!r}" for k, v in bad.items())
        raise ConfigError(f"sampling=model: the model's generation_config asks for {listed}, which lp_runtime cannot "
                          f"apply exactly; supported: {', '.join(_TAKEN)}. Use another sampling group")
    def get(name, default):
        value = getattr(gen_cfg, name, None)
        return default if value is None else value
    temperature = float(get("temperature", 1.0)) if do_sample else 0.0
    if do_sample and temperature <= 0:
        raise ConfigError(f"sampling=model: the model's generation_config has do_sample=True with temperature="
                          f"{temperature}; generate refuses that too")
    return dataclasses.replace(
        base, from_model=False, temperature=temperature, top_k=int(get("top_k", 50)) if do_sample else 0,
        top_p=float(get("top_p", 1.0)) if do_sample else 1.0, min_p=float(get("min_p", 0.0)) if do_sample else 0.0,
        repetition_penalty=float(get("repetition_penalty", 1.0)),
        suppress_tokens=list(get("suppress_tokens", [])) or None,
    )


def unapplied_model_defaults(gen_cfg: Any, cfg: SamplingConfig) -> list[str]:
    """``name=value`` for each piece of processing the model's ``generation_config`` asks for that a run with
    ``cfg`` does not do (empty when none, or when ``cfg.from_model``)."""
    if gen_cfg is None or cfg.from_model:
        return []
    out = []
    rp = getattr(gen_cfg, "repetition_penalty", None)
    if rp is not None and float(rp) != 1.0 and float(rp) != cfg.repetition_penalty:
        out.append(f"repetition_penalty={rp}")
    st = getattr(gen_cfg, "suppress_tokens", None)
    if st and sorted(st) != sorted(cfg.suppress_tokens or []):
        out.append(f"suppress_tokens={list(st)}")
    if getattr(gen_cfg, "do_sample", None) and not cfg.do_sample:
        shown = {k: getattr(gen_cfg, k, None) for k in ("temperature", "top_k", "top_p", "min_p")}
        out.append("do_sample=True (" + ", ".join(f"{k}={v}" for k, v in shown.items() if v is not None) + ")")
    out += [f"{k}={v!r}" for k, v in _unsupported(gen_cfg).items()]
    return out


_WARNED: "weakref.WeakSet" = weakref.WeakSet()


def warn_model_defaults(model: Any, cfg: SamplingConfig) -> None:
    """Warn (``UserWarning``, once per model object) when the model's ``generation_config`` asks for processing
    that a run with ``cfg`` will not do, as ``generate`` would have applied it."""
    unapplied = unapplied_model_defaults(getattr(model, "generation_config", None), cfg)
    if not unapplied or model in _WARNED:
        return
    with contextlib.suppress(TypeError):  # a model that takes no weak reference is warned every time
        _WARNED.add(model)
    warnings.warn(
        f"the model's generation_config asks for {', '.join(unapplied)}, which transformers' generate would apply; "
        "this run does not (it uses the sampling settings given). Use sampling=model (SamplingConfig(from_model="
        "True)) to take the model's settings, or set them in the sampling group", UserWarning, stacklevel=3)


def uniforms(seed: int, position: int, n: int) -> list[float]:
    """``n`` uniforms in [0, 1) from a generator seeded by (seed, position); the same on every rank and run."""
    digest = hashlib.blake2b(f"{int(seed)}:{int(position)}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little"))
    return [rng.random() for _ in range(n)]


class Sampler:
    """Processing and per-position decisions for one decode: ``cfg``'s processors, then ``extra``
    (``check_processors``: ``ValueError``); with ``cfg.from_model``, ``cfg`` as ``model_sampling`` of
    ``generation_config`` (``ConfigError``). ``active`` is False for plain greedy with no processors: the decoder
    then keeps its raw-argmax path."""

    def __init__(self, cfg: Optional[SamplingConfig] = None, extra: Sequence = (),
                 generation_config: Any = None) -> None:
        cfg = cfg if cfg is not None else SamplingConfig()
        self.cfg = model_sampling(generation_config, cfg) if cfg.from_model else cfg
        self.processors = build_processors(self.cfg) + check_processors(extra, self.cfg)
        self.do_sample = self.cfg.do_sample
        self.active = self.do_sample or bool(self.processors)

    def process(self, logits_RV: torch.Tensor, history: Sequence[int],
                suffixes: Sequence[Sequence[int]]) -> torch.Tensor:
        """Processed float32 scores (R, V) of raw logits (R, V), row r as if ``generate`` had reached
        ``history + suffixes[r]``. ``history``: the accepted sequence (prompt + output so far, >= 1 token);
        ``suffixes[r]``: row r's tokens after it (``[]`` for ``c``, ``cand[:i+1]`` for a candidate's token i)."""
        scores = logits_RV.to(dtype=torch.float32, copy=True)
        if not self.processors:
            return scores
        width = max((len(s) for s in suffixes), default=0)
        ids = torch.empty(len(suffixes), len(history) + width, dtype=torch.long)
        ids[:, : len(history)] = torch.tensor(list(history), dtype=torch.long)
        for r, suf in enumerate(suffixes):
            # Pad with a token already in the row's prefix: the processors look at the set of prefix tokens.
            fill = list(suf) + [suf[-1] if suf else history[-1]] * (width - len(suf))
            if width:
                ids[r, len(history):] = torch.tensor(fill, dtype=torch.long)
        ids = ids.to(scores.device)
        for proc in self.processors:
            scores = proc(ids, scores)
        return scores

    def decide(self, logits_RV: torch.Tensor, history: Sequence[int], suffixes: Sequence[Sequence[int]],
               children: Sequence[Sequence[int]]) -> list[int]:
        """The token each kept row contributes to verification (one int per row, layout order); ``children[r]``:
        row r's distinct draft tokens. Greedy: the argmax of the processed scores. Sampling:
        ``verify.node_outcome`` with draws keyed by the position it decides, ``len(history) + len(suffixes[r])``."""
        scores = self.process(logits_RV, history, suffixes)
        if not self.do_sample:
            return scores.argmax(dim=-1).tolist()
        probs = torch.softmax(scores.double(), dim=-1).cpu()  # one copy to the host; node_outcome reads rows as numpy
        return [node_outcome(probs[r], kids, uniforms(self.cfg.seed, len(history) + len(suffixes[r]), len(kids) + 1))
                for r, kids in enumerate(children)]
