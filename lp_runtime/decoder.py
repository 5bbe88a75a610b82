"""The decode loop for one sequence: prefill, lookahead steps, stopping, metrics.

Lookahead decoding (Fu et al. 2024, sections 3.1-3.3, Algorithm 1 in appendix A) with the step layout of
DESIGN.md section 1: each step is ONE forward pass over the pending tokens (accepted last step, ``c`` last),
the Jacobi window (lookahead branch) and up to G n-gram candidates (verification branch). Plain greedy
decoding is the same loop with no window and no candidates (one pending token a step), so both methods
share every line that touches the model and the cache.

Sampling and logits processing (``sampling.py``; paper appendix B): ``c`` and every candidate token are
processed against their own prefix with transformers' processors; greedy takes the processed argmax (so a
repetition penalty matches ``generate(do_sample=False, repetition_penalty=...)``), sampling replaces each
such argmax by the OUTCOME of that trie node -- sequential rejection of the node's draft children, else a
residual (or, after a full match, bonus) sample -- with uniforms keyed by (seed, absolute position).
A node's outcome is a child exactly when that child was accepted, so ``verify.walk_outcomes`` rebuilds the
step from one int64 per kept position. Under LP each rank decides the nodes of the candidates it computed,
from candidate tokens every rank holds and draws every rank can make, so the merge exchanges the SAME
fixed-size int64 buffer as greedy decoding: ONE all-gather per step, sampling or not, and no probabilities
cross ranks. The window's new tokens stay the raw argmax (guesses only; they never affect the output law).

Usage::

    model, tok = load_model(ModelConfig())
    dec = Decoder(model, DecodingConfig(window_size=3, ngram_size=3, guess_set_size=2),
                  eos_token_ids=eos_token_ids(model, tok, None), tokenizer=tok)
    out = dec.generate(prompt_ids, max_new_tokens=128, streamer=TextStreamer(tok))
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from .config import DecodingConfig, SamplingConfig
from . import support
from .kv import commit, new_cache
from .layout import LayoutCache, full_mask
from .ngram_pool import NGramPool
from .parallel import LocalGroup, state_hash
from .sampling import Sampler, check_processors, warn_model_defaults
from .stopping import StopChecker
from .verify import greedy_verify, walk_outcomes
from .window import JacobiWindow


@dataclass
class GenerationOutput:
    """One generation's result.

    Attributes:
        output_ids: new token ids only (the EOS that ended generation included).
        finish_reason: "stop" (EOS or stop string) or "length" (max_new_tokens or the model's context).
        decoding_steps: forward passes after the prefill.
        accept_lengths: tokens emitted by each step (sums to ``len(output_ids)``).
        wall_time: seconds from the call to its return, prefill included.
        step_tokens: input tokens this process fed to each step's forward pass (pending + window + candidates;
            under LP this rank's share), what the step's cost depends on.
    """

    output_ids: list[int]
    finish_reason: str
    decoding_steps: int
    accept_lengths: list[int] = field(default_factory=list)
    wall_time: float = 0.0
    step_tokens: list[int] = field(default_factory=list)


class Decoder:
    """Greedy plain or lookahead decoding of one sequence at a time with a transformers causal LM.

    Args:
        model: a transformers ``PreTrainedModel`` for causal LM (used through its public forward:
            ``input_ids``, ``position_ids``, a float 4D ``attention_mask``, ``past_key_values``,
            ``logits_to_keep``); it is never modified.
        decoding: method and W, N, G (``DecodingConfig``).
        eos_token_ids: ids that end generation (may be empty).
        tokenizer: needed for stop strings only.
        lp: the lookahead-parallel group (``parallel.LocalGroup`` for one process).
        sampling: logits processing and sampling (``SamplingConfig``; default greedy, no processing).
        logits_processor: extra transformers processors applied after ``sampling``'s; only the classes of
            ``sampling.SUPPORTED_PROCESSORS`` (``ValueError`` naming any other).
    """

    def __init__(self, model, decoding: DecodingConfig, *, eos_token_ids: Sequence[int] = (),
                 tokenizer=None, lp=None, sampling: Optional[SamplingConfig] = None,
                 logits_processor: Sequence = ()) -> None:
        self.model = model
        self.cfg = decoding
        self.eos_token_ids = list(eos_token_ids or [])
        self.tokenizer = tokenizer
        self.lp = lp if lp is not None else LocalGroup()
        self.extra_processors = check_processors(logits_processor or ())
        self.sampler = Sampler(sampling, self.extra_processors, getattr(model, "generation_config", None))
        warn_model_defaults(model, self.sampler.cfg)
        support.check_attention(model)  # ConfigError for attention that ignores position_ids / the 4D mask
        lookahead = decoding.method == "lookahead"
        self.window_size = decoding.window_size if lookahead else 0
        self.ngram_size = decoding.ngram_size
        self.guess_set_size = decoding.guess_set_size if lookahead else 0
        self.use_pool = lookahead and (self.guess_set_size > 0)
        self.device = next(model.parameters()).device
        self.layouts = LayoutCache(self.ngram_size, self.device, model.dtype)
        self.context_length = support.position_limit(model)  # every fed position stays below this

    def _max_depth(self, num_pending: int, with_window: bool, with_candidates: bool) -> int:
        """Largest position offset from the first pending token in a step of this shape."""
        depth = num_pending - 1
        if with_window and self.window_size > 0:
            depth = max(depth, num_pending - 1 + self.window_size - 1 + self.ngram_size - 2)
        if with_candidates:
            depth = max(depth, num_pending - 1 + self.ngram_size - 1)
        return depth

    @staticmethod
    def _decide(sampler: Sampler, logits_KV: torch.Tensor, kept: torch.Tensor, history: list[int],
                candidates: list[list[int]], cand_ids: Sequence[int], num_cols: int, cand_len: int) -> torch.Tensor:
        """``kept`` (int64 (k,), layout order) with ``c``'s and this rank's candidate tokens' entries replaced by
        the sampler's decision (processed argmax, or the sampled node outcome); window entries stay raw argmax,
        so the LP merge exchanges the same int64 buffer as in greedy decoding."""
        rows = [0] + [1 + num_cols + t for t in range(len(cand_ids) * cand_len)]
        cells = [(-1, -1)] + [(g, i) for g in cand_ids for i in range(cand_len)]
        suffixes = [candidates[g][: i + 1] if g >= 0 else [] for g, i in cells]
        index = torch.tensor(rows, device=logits_KV.device)
        tokens = sampler.decide(logits_KV[index], history, suffixes, candidates, cells)
        kept = kept.clone()
        kept[index] = torch.tensor(tokens, dtype=kept.dtype, device=kept.device)
        return kept

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], *, max_new_tokens: int, stop_strings: Sequence[str] = (),
                 streamer=None, sampling: Optional[SamplingConfig] = None) -> GenerationOutput:
        """Decode up to ``max_new_tokens`` tokens after ``prompt_ids`` (a list of token ids).

        Greedy output is token-identical to plain greedy decoding up to float near-ties (DESIGN.md
        section 6). ``streamer`` (transformers ``TextStreamer``-compatible: ``put``/``end``) first receives
        the prompt, then every emitted token in order, exactly once. ``sampling`` overrides the decoder's
        sampling settings for this call (e.g. a per-question temperature or seed). Sampled output follows
        the model's processed distribution exactly (paper appendix B; tests/test_sampling.py).

        Raises:
            ConfigError: (``support.check_request``, before any forward pass) an empty prompt, a token id outside
                the vocabulary, ``max_new_tokens`` < 1, a prompt leaving no room in the context for one new
                token, or a length the model does not decode exactly (length-dependent rope, sliding window).
                Near the context's end steps shrink to plain ones; a full context ends with "length".
            ModelOutputError: NaN or inf logits at a decision (names the step and the position).
        """
        start = time.perf_counter()
        sampler = self.sampler if sampling is None else Sampler(sampling, self.extra_processors,
                                                                getattr(self.model, "generation_config", None))
        # ids in the vocabulary, budget >= 1 (capped to the context), lengths the model decodes exactly
        prompt, max_new_tokens = support.check_request(self.model, prompt_ids, max_new_tokens)
        ctx = self.context_length
        stopper = StopChecker(max_new_tokens, self.eos_token_ids, stop_strings, self.tokenizer)
        if streamer is not None:
            streamer.put(torch.tensor([prompt]))

        cache = new_cache()
        if len(prompt) > 1:  # prefill all but the last prompt token; it is the first step's pending token
            self.model(
                input_ids=torch.tensor([prompt[:-1]], device=self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=torch.empty(0, dtype=torch.long, device=self.device),
            )
        past = len(prompt) - 1
        pending = [prompt[-1]]

        window = JacobiWindow(self.window_size, self.ngram_size)
        if window.active:
            window.reset(prompt, self.cfg.seed)
        pool = NGramPool(self.ngram_size, self.guess_set_size) if self.use_pool else None
        history = list(prompt)
        if pool is not None and self.cfg.pool_from_prompt:
            pool.add_from_sequence(history)
        cand_len = self.ngram_size - 1
        steps, accept_lengths, step_tokens = 0, [], []

        while True:
            c = pending[-1]
            candidates = pool.candidates(c) if pool is not None else []
            num_columns = self.window_size
            if ctx is not None and past + self._max_depth(len(pending), True, bool(candidates)) >= ctx:
                num_columns, candidates = 0, []  # near the context's end: plain steps only
                if past + len(pending) > ctx:
                    stopper.finish_reason = "length"
                    break
            num_levels = window.num_levels if num_columns else 0
            cols, cand_ids = self.lp.plan(len(pending), num_columns, num_levels, len(candidates), cand_len)
            layout, depth, inner, keep = self.layouts.get(len(pending), cols, num_levels, len(cand_ids))
            ids = layout.input_ids(pending, window.row0, window.levels, [candidates[g] for g in cand_ids])
            out = self.model(
                input_ids=torch.tensor([ids], device=self.device),
                position_ids=(depth + past)[None],
                attention_mask=None if layout.is_chain else full_mask(inner, past),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=keep,
            )
            kept_argmax, finite = support.finite_argmax(out.logits[0])
            if sampler.active:  # c and candidate tokens: processed against their own prefix (window: raw argmax)
                kept_argmax = self._decide(sampler, out.logits[0], kept_argmax, history, candidates, cand_ids,
                                           len(cols), cand_len)
            kept_argmax = support.mark_nonfinite(kept_argmax, finite)  # NaN/inf rows -> NONFINITE, no host sync
            x1, new_window, cand_argmax = self.lp.merge(
                kept_argmax, len(pending), num_columns, num_levels, len(candidates), cand_len
            )
            support.check_finite(steps + 1, past + len(pending) - 1, x1, new_window, cand_argmax)
            accepted, _ = (walk_outcomes if sampler.do_sample else greedy_verify)(x1, candidates, cand_argmax)
            commit(cache, len(ids), len(pending))
            past += len(pending)
            steps += 1
            step_tokens.append(len(ids))

            emitted = stopper.push(accepted)
            accept_lengths.append(len(emitted))
            if streamer is not None:
                for tok in emitted:
                    streamer.put(torch.tensor([tok]))
            if stopper.finish_reason is not None:
                break

            if num_columns:
                harvest = window.advance(c, new_window)
                if pool is not None:
                    for ngram in harvest:
                        pool.add(ngram)
            history.extend(accepted)
            if pool is not None and self.cfg.pool_from_prompt:
                pool.add_from_sequence(history, start=len(history) - len(accepted))
            pending = accepted
            if getattr(self.lp, "debug", False):  # every LP rank must hold the same state after the merge (DESIGN.md section 3)
                self.lp.check_consistent(state_hash(window.state(), list(pool.items()) if pool else None,
                                                    past, stopper.output))

        if streamer is not None:
            streamer.end()
        return GenerationOutput(
            output_ids=list(stopper.output),
            finish_reason=stopper.finish_reason or "length",
            decoding_steps=steps,
            accept_lengths=accept_lengths,
            wall_time=time.perf_counter() - start,
            step_tokens=step_tokens,
        )
