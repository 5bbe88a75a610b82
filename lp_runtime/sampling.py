"""Logits processing and seeded draws shared by plain and lookahead decoding (DESIGN.md section 1).

Processing is transformers' own: ``RepetitionPenaltyLogitsProcessor``, then (when sampling)
``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper`` -- the
classes and the order ``generate`` uses (``GenerationMixin._get_logits_processor``), each added only when it
changes anything, as ``generate`` does. Every kept position is processed against its OWN prefix: the
accepted sequence (prompt + output so far) plus, for a candidate tree node, the tokens of its path.

Random draws are keyed, not streamed: the uniforms that decide the token at absolute sequence position t are
``uniforms(seed, t, n)``, a generator seeded by (seed, t). Each position's token is decided exactly once on
the realised path, so draws for different decisions are independent; and whichever LP rank computes a
position draws the same numbers, so the output does not depend on the LP degree (DESIGN.md section 6.5).
"""
from __future__ import annotations

import hashlib
import random
from typing import Optional, Sequence

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
    TopPLogitsWarper,
)

from .config import SamplingConfig
from .verify import node_outcome

SUPPORTED_PROCESSORS = (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                        TopPLogitsWarper, MinPLogitsWarper)


def build_processors(cfg: SamplingConfig) -> list:
    """transformers' processors for ``cfg`` in ``generate``'s order; warpers only when ``cfg.do_sample``."""
    procs: list = []
    if cfg.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(float(cfg.repetition_penalty)))
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


def check_processors(processors: Sequence) -> list:
    """Return ``processors`` as a list; raise ``ValueError`` naming the first one we cannot apply per position.

    Only processors whose output for a row depends on that row's prefix and scores alone are exact under
    lookahead verification; these are the five classes of ``SUPPORTED_PROCESSORS``.
    """
    names = ", ".join(c.__name__ for c in SUPPORTED_PROCESSORS)
    for p in processors:
        if type(p) not in SUPPORTED_PROCESSORS:
            raise ValueError(f"logits processor {type(p).__name__} is not supported by lp_runtime; supported: {names}")
    return list(processors)


def _key(seed: int, position: int) -> int:
    digest = hashlib.blake2b(f"{int(seed)}:{int(position)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def uniforms(seed: int, position: int, n: int) -> list[float]:
    """``n`` uniforms in [0, 1) from a generator seeded by (seed, position); the same on every rank and run."""
    rng = random.Random(_key(seed, position))
    return [rng.random() for _ in range(n)]


class Sampler:
    """Processing and per-position decisions for one decode (a ``SamplingConfig`` plus extra processors).

    Args:
        cfg: the sampling settings (``temperature == 0`` = greedy).
        extra: further processors (instances of ``SUPPORTED_PROCESSORS``) applied after ``cfg``'s.

    ``active`` is False for plain greedy with no processors: the decoder then keeps its raw-argmax path.
    """

    def __init__(self, cfg: Optional[SamplingConfig] = None, extra: Sequence = ()) -> None:
        self.cfg = cfg if cfg is not None else SamplingConfig()
        self.processors = build_processors(self.cfg) + check_processors(extra)
        self.do_sample = self.cfg.do_sample
        self.active = self.do_sample or bool(self.processors)

    def process(self, logits_RV: torch.Tensor, history: Sequence[int],
                suffixes: Sequence[Sequence[int]]) -> torch.Tensor:
        """Processed float32 scores (R, V) for R kept positions.

        ``logits_RV``: raw logits (R, V); ``history``: the accepted sequence (prompt + output so far, >= 1
        token); ``suffixes[r]``: row r's tokens after ``history`` (``[]`` for ``c``, ``cand[:i+1]`` for a
        candidate's token i). Row r is processed as if ``generate`` had reached ``history + suffixes[r]``.
        """
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
        """The token each kept position contributes to verification (one int per row, layout order).

        Row r is a node of the candidate tree (or the root ``c``): ``suffixes[r]`` its path's tokens after
        ``history`` and ``children[r]`` the distinct draft tokens to try there (``verify.node_children``).
        Greedy: the argmax of the processed scores. Sampling: the node's outcome under sequential rejection
        of its children (``verify.node_outcome``), with draws keyed by the absolute position of the token it
        decides, ``len(history) + len(suffixes[r])``.
        """
        scores = self.process(logits_RV, history, suffixes)
        if not self.do_sample:
            return scores.argmax(dim=-1).tolist()
        probs = torch.softmax(scores.double(), dim=-1)
        out = []
        for r, kids in enumerate(children):
            u = uniforms(self.cfg.seed, len(history) + len(suffixes[r]), len(kids) + 1)
            out.append(node_outcome(probs[r], kids, u))
        return out
