"""The decode loop for one sequence: prefill, lookahead steps, verify-and-commit, stopping.

Lookahead decoding (Fu et al. 2024, sections 3.1-3.4, Algorithm 1 in appendix A; one step's path through the
modules: docs/architecture.md). Each step of ``Decoder.generate``:

1. ``_plan``: the proposers propose a candidate tree, the step policy chooses which nodes and whether the
   Jacobi window are fed; near the context's end the step shrinks to a plain one;
2. ``_forward``: ONE forward pass (``step.py``) over [pending][window][chosen tree nodes] laid out as one token
   tree (``layout.py``), this rank's share under LP (``parallel.py``), the sampler's decisions, the LP merge;
3. ``_verify_commit``: verification walks the tree (``verify.py``), the cache keeps the accepted part (copy-KV
   in one process; LP re-feeds);
4. ``_emit`` / ``_observe``: stopping and streaming, then the window, proposers and policy learn the step.

Plain greedy is the same loop with no window and no candidates. Sampling (paper appendix B, ``sampling.py``):
``c`` and every tree node decide their OUTCOME against their own prefix with uniforms keyed by (seed, position),
so under LP each rank decides the nodes it computed and the merge exchanges one int64 per kept row.

Usage::

    model, tok = load_model(ModelConfig())
    dec = Decoder(model, DecodingConfig(method="lookahead", window_size=3, ngram_size=3, guess_set_size=2),
                  eos_token_ids=eos_token_ids(model, tok, None), tokenizer=tok)
    out = dec.generate(prompt_ids, max_new_tokens=128, streamer=TextStreamer(tok))
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from . import checks
from .config import ConfigError, DecodingConfig, SamplingConfig
from .layout import LayoutCache, MaskBuffer
from .parallel import LocalGroup, state_hash
from .policy import FeedAll
from .successors import successor_proposers
from .sampling import Sampler, check_processors, warn_model_defaults
from .step import EagerStep, StepInputs, StepRows
from .stopping import StopChecker
from .tree import CandidateTree, child_tokens, reindex
from .verify import greedy_verify, walk_outcomes
from .window import JacobiWindow, reach


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
        sampling: the ``SamplingConfig`` applied (under ``sampling=model`` the model's ``generation_config``
            values); None only for a result built without decoding.
    """

    output_ids: list[int]
    finish_reason: str
    decoding_steps: int
    accept_lengths: list[int] = field(default_factory=list)
    wall_time: float = 0.0
    step_tokens: list[int] = field(default_factory=list)
    sampling: Optional[SamplingConfig] = None


@dataclass
class SequenceState:
    """What one ``generate`` call changes as it decodes. ``past``: entries in the committed cache; ``pending``:
    accepted tokens the next step feeds first (its last is ``c``); ``history``: prompt + accepted tokens."""

    prompt: list[int]
    cache: Any
    past: int
    pending: list[int]
    window: JacobiWindow
    history: list[int]
    stopper: StopChecker
    sampler: Sampler
    steps: int = 0
    accept_lengths: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)


@dataclass
class StepPlan:
    """What one step feeds: the proposed tree, the fed sub-tree (``fed_nodes`` of ``proposed``), whether the
    window's W columns are fed (``num_columns`` = W or 0) and the fed nodes' depths."""

    proposed: CandidateTree
    tree: CandidateTree
    fed_nodes: tuple[int, ...]
    num_columns: int
    depths: list[int]


@dataclass
class StepResult:
    """A merged step: x1 (the output at ``c``), the W new window tokens, one output per fed node (``NONFINITE``
    where a row was not finite), tokens fed here, the in-step index of the first tree node, the kept rows."""

    x1: int
    new_window: list[int]
    node_out: list[int]
    num_fed: int
    tree_start: int
    rows: Optional[StepRows]


class Decoder:
    """Greedy plain or lookahead decoding of one sequence at a time with a transformers causal LM.

    Args:
        model: a transformers ``PreTrainedModel`` for causal LM; never modified.
        decoding: method, W, N, G (``DecodingConfig``).
        eos_token_ids: ids that end generation; None (default): the model's ``generation_config.eos_token_id``, as
            transformers' ``generate`` stops (not the tokenizer's, which ``generate`` ignores; ``LookaheadGenerator``
            and the main job fall back to it); ``()``: none.
        tokenizer: needed for stop strings only.
        lp: the lookahead-parallel group (``parallel.LocalGroup`` for one process).
        sampling: logits processing and sampling (``SamplingConfig``; default greedy, no processing).
        logits_processor: extra transformers processors applied after ``sampling``'s; only the classes of
            ``sampling.SUPPORTED_PROCESSORS`` (``ValueError`` naming any other).
        step_policy: a ``policy.StepPolicy``; default ``policy.FeedAll``. ``method="auto"`` needs one
            (``ConfigError`` otherwise; ``auto.auto_policy``). Under LP a ``CostPolicy`` priced for one process is
            priced by the busiest rank's tokens (``CostPolicy.price_lp``).
        proposers: ``proposers.Proposer`` objects; default the product's for ``decoding`` at this LP degree
            (``successors.successor_proposers(..., table=None)``; none for G = 0 with the table off: the window's
            n-grams are then never verified, which the job and ``LookaheadGenerator`` refuse through
            ``DecodingConfig.check_candidates``).
        step: the model step (``step.EagerStep``'s methods); default ``EagerStep(model)``.
        copy_kv: keep the accepted candidates' KV so the next step feeds one token (default: True except for
            ``method="paper"``, which re-feeds); LP always re-feeds (the KV lives on one rank).

    Concurrent ``generate`` calls on one decoder are serialised (a lock): each returns what it would alone.
    """

    def __init__(self, model, decoding: DecodingConfig, *, eos_token_ids: Optional[Sequence[int]] = None,
                 tokenizer=None, lp=None, sampling: Optional[SamplingConfig] = None,
                 logits_processor: Sequence = (), step_policy=None, proposers: Optional[Sequence] = None,
                 step=None, copy_kv: Optional[bool] = None) -> None:
        checks.check_model(model)
        checks.check_tokenizer(tokenizer, encodes=False)  # stop strings decode
        checks.check_arg(decoding, DecodingConfig, "decoding")
        if sampling is not None:
            checks.check_arg(sampling, SamplingConfig, "sampling")
        proposers = checks.check_parts(lp=lp, step_policy=step_policy, proposers=proposers, step=step, copy_kv=copy_kv)
        self.model, self.cfg, self.tokenizer = model, decoding, tokenizer
        given = eos_token_ids if eos_token_ids is not None else checks.eos_token_ids(model, None, None)
        self.eos_token_ids = checks.check_eos_ids(given, checks.vocab_size(model))
        self.lp = lp if lp is not None else LocalGroup()
        self.extra_processors = check_processors(logits_processor or ())
        self.sampler = Sampler(sampling, self.extra_processors, getattr(model, "generation_config", None))
        warn_model_defaults(model, self.sampler.cfg)
        checks.check_attention(model)  # ConfigError for attention that ignores position_ids / the 4D mask
        if step_policy is None and decoding.method == "auto":
            raise ConfigError("decoding.method='auto' needs its cost policy: pass step_policy=lp_runtime.auto."
                              "auto_policy(model) (this machine's latency profile; LookaheadGenerator does), or "
                              "DecodingConfig(method='lookahead', ...) for a fixed W, N, G")
        self.step_policy = step_policy if step_policy is not None else FeedAll()
        self.window_size = decoding.window_size if decoding.method != "greedy" else 0
        self.ngram_size = decoding.ngram_size
        self.proposers = list(successor_proposers(decoding, checks.vocab_size(model), lp_size=self.lp.size, table=None)
                              if proposers is None else proposers)
        copy = decoding.method != "paper" if copy_kv is None else bool(copy_kv)
        self.copy_kv = copy and self.lp.size == 1
        if self.lp.size > 1 and getattr(self.step_policy, "lp_size", None) == 1:
            self.step_policy.price_lp(self.lp.size, self.window_size)  # a step costs its busiest rank's tokens
        self.step = step if step is not None else EagerStep(model)
        self.device = self.step.device
        self.layouts = LayoutCache(self.device, model.dtype)
        self._mask = MaskBuffer(model.dtype, self.device)
        limits = [n for n in (checks.position_limit(model), self.step.max_positions) if n is not None]
        self.context_length = min(limits) if limits else None  # every fed position stays below this
        self.topk = max((p.topk for p in self.proposers), default=0)
        self.prefill_topk = max((getattr(p, "prefill_topk", 0) for p in self.proposers), default=0)
        self._lock = threading.Lock()

    def forget_answers(self) -> None:
        """Forget what the proposers keep across prompts (the answer store): later prompts match no earlier one."""
        for p in self.proposers:
            p.reset()

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], *, max_new_tokens: int, stop_strings: Sequence[str] = (),
                 streamer=None, sampling: Optional[SamplingConfig] = None) -> GenerationOutput:
        """Decode up to ``max_new_tokens`` tokens after ``prompt_ids``.

        Greedy output is token-identical to plain greedy decoding up to float near-ties (docs/architecture.md);
        sampled output follows the model's processed distribution exactly (paper appendix B). ``streamer``
        (``put``/``end``, as transformers' ``TextStreamer``) first receives the prompt, then every emitted token in
        order, exactly once; its ``end()`` is called on every way out, errors included. ``sampling`` overrides the
        decoder's sampling settings for this call.

        Raises:
            ConfigError: (``checks.check_request``, before any forward pass) an empty prompt, a token id outside
                the vocabulary, ``max_new_tokens`` < 1, a prompt leaving no room in the context for one new
                token, or a length the model does not decode exactly (length-dependent rope, an attention
                window or chunk). Near the context's end steps shrink to plain ones; a full context ends with
                "length".
            ModelOutputError: NaN or inf logits in a row that decides an emitted token (names the step and the
                position); such rows at rejected candidates or window cells only reject or discard a guess.
        """
        start = time.perf_counter()
        if streamer is not None:  # transformers' TextStreamer
            checks.check_methods(streamer, "streamer", ("put", "end"), "a transformers TextStreamer or "
                                 "TextIteratorStreamer, or an object with those two methods")
        checks.check_arg(self.cfg, DecodingConfig, "decoding")  # again: a field may be set after construction
        if sampling is not None:
            checks.check_arg(sampling, SamplingConfig, "sampling")
        try:
            with self._lock:
                state = self._start(prompt_ids, max_new_tokens, stop_strings, streamer, sampling)
                self._loop(state, streamer)
                for p in self.proposers:
                    p.end(state.prompt, state.stopper.output)
        finally:
            if streamer is not None:
                streamer.end()
        return GenerationOutput(output_ids=list(state.stopper.output),
                                finish_reason=state.stopper.finish_reason or "length",
                                decoding_steps=state.steps, accept_lengths=state.accept_lengths,
                                wall_time=time.perf_counter() - start, step_tokens=state.step_tokens,
                                sampling=state.sampler.cfg)

    def _loop(self, state: SequenceState, streamer) -> None:
        """Steps until the stopper finishes (or the context is full)."""
        while True:
            plan = self._plan(state)
            if plan is None:
                state.stopper.finish_reason = "length"
                return
            result = self._forward(state, plan)
            accepted = self._verify_commit(state, plan, result)
            self._emit(state, accepted, streamer)
            if state.stopper.finish_reason is not None:
                return
            self._observe(state, plan, result, accepted)

    def _start(self, prompt_ids, max_new_tokens, stop_strings, streamer, sampling) -> SequenceState:
        """Check the request, prefill all but the last prompt token (the first step's pending token)."""
        sampler = self.sampler if sampling is None else Sampler(sampling, self.extra_processors,
                                                                getattr(self.model, "generation_config", None))
        prompt, max_new_tokens = checks.check_request(self.model, prompt_ids, max_new_tokens, self.step.max_positions)
        stopper = StopChecker(max_new_tokens, self.eos_token_ids, stop_strings, self.tokenizer, prompt)
        if streamer is not None:
            streamer.put(torch.tensor([prompt]))
        cache = self.step.new_cache()
        window = JacobiWindow(self.window_size, self.ngram_size)
        if window.active:
            window.reset(prompt, self.cfg.seed)
        for p in self.proposers:
            p.begin(prompt, do_sample=sampler.do_sample)
        self._prefill(cache, prompt)
        return SequenceState(prompt, cache, len(prompt) - 1, [prompt[-1]], window, list(prompt), stopper, sampler)

    def _prefill(self, cache, prompt: list[int]) -> None:
        """Prefill ``prompt[:-1]``; a proposer with ``prefill_topk`` > 0 then gets the prompt's last rows in
        ``observe_prefill`` (every LP rank computes the same prefill, so nothing travels)."""
        if not self.prefill_topk:
            self.step.prefill(cache, prompt[:-1])
            return
        topk = self.step.prefill(cache, prompt[:-1], topk=self.prefill_topk)
        rows = StepRows(prompt[len(prompt) - 1 - topk.shape[0]: len(prompt) - 1], topk)
        for p in self.proposers:
            if getattr(p, "prefill_topk", 0):
                p.observe_prefill(rows)

    def _plan(self, state: SequenceState) -> Optional[StepPlan]:
        """What the next step feeds; None when the context has no room for even a plain step."""
        proposed = CandidateTree.union([p.propose() for p in self.proposers])
        choice = self.step_policy.choose(proposed, num_pending=len(state.pending),
                                         window_tokens=state.window.step_tokens)
        tree = proposed if len(choice.nodes) == len(proposed) else proposed.select(choice.nodes)
        plan = StepPlan(proposed, tree, choice.nodes, self.window_size if choice.use_window else 0, tree.depths())
        ctx, past, pending = self.context_length, state.past, state.pending
        span = len(pending) - 1 + max(max(plan.depths, default=0),
                                      reach(self.window_size, self.ngram_size) if plan.num_columns else 0)
        fed = len(pending) + (state.window.step_tokens if plan.num_columns else 0) + len(tree)  # all ranks' (a bound)
        if (ctx is not None and past + span >= ctx) or not self.step.fits(past, fed):  # near the end: plain steps
            plan = StepPlan(proposed, CandidateTree(), (), 0, [])
            if (ctx is not None and past + len(pending) > ctx) or not self.step.fits(past, len(pending)):
                return None
        return plan

    def _forward(self, state: SequenceState, plan: StepPlan) -> StepResult:
        """ONE forward pass over [pending][this rank's window columns][this rank's tree nodes], then the merge."""
        window, tree, pending = state.window, plan.tree, state.pending
        num_levels = window.num_levels if plan.num_columns else 0
        cols, nodes = self.lp.plan(len(pending), plan.num_columns, num_levels, tree.parents)
        layout, depth, inner, keep = self.layouts.get(len(pending), cols, num_levels, reindex(tree.parents, nodes))
        ids = layout.input_ids(pending, window.row0, window.levels, [tree.tokens[n] for n in nodes])
        inputs = StepInputs(ids=torch.tensor([ids], device=self.device), positions=(depth + state.past)[None],
                            mask=None if layout.is_chain else self._mask.view(inner, state.past), keep=keep)
        out = self.step(state.cache, inputs, topk=self.topk)
        kept = out.tokens()
        if state.sampler.active:  # c and tree nodes: processed against their own prefix (window: raw argmax)
            kept = self._decide(state, out.logits, kept, out.finite, tree, nodes, len(cols))
        x1, new_window, node_out, topk = self.lp.merge(kept, len(pending), plan.num_columns, num_levels,
                                                       tree.parents, out.topk)
        rows = None if topk is None else StepRows(  # every rank's rows: c, the W columns, every fed node
            [pending[-1], *window.kept_tokens(pending[-1], plan.num_columns, num_levels), *tree.tokens], topk,
            plan.fed_nodes)
        return StepResult(x1, new_window, node_out, len(ids), layout.tree_start, rows)

    @staticmethod
    def _decide(state: SequenceState, logits_KV: torch.Tensor, kept: torch.Tensor, finite: torch.Tensor,
                tree: CandidateTree, nodes: Sequence[int], num_cols: int) -> torch.Tensor:
        """``kept`` (int64 (k,), layout order) with ``c``'s and this rank's tree nodes' entries replaced by the
        sampler's decision (processed argmax, or the sampled node outcome), ``NONFINITE`` kept where a row is
        not finite; window entries stay raw argmax, so the LP merge exchanges the same int64 buffer."""
        rows = [0] + [1 + num_cols + k for k in range(len(nodes))]
        suffixes = [[]] + [[tree.tokens[m] for m in tree.path(n)] for n in nodes]
        children = [child_tokens(tree.tokens, tree.parents, n) for n in (-1, *nodes)]
        index = torch.tensor(rows, device=logits_KV.device)
        tokens = torch.tensor(state.sampler.decide(logits_KV[index], state.history, suffixes, children),
                              dtype=kept.dtype, device=kept.device)
        kept = kept.clone()
        kept[index] = torch.where(finite[index], tokens, kept[index])
        return kept

    def _verify_commit(self, state: SequenceState, plan: StepPlan, res: StepResult) -> list[int]:
        """Verify the tree, commit the accepted part of the step's KV; returns the accepted tokens."""
        verify = walk_outcomes if state.sampler.do_sample else greedy_verify
        accepted, path = verify(res.x1, plan.tree.tokens, plan.tree.parents, res.node_out)
        checks.check_decided(state.steps + 1, state.past + len(state.pending) - 1, accepted)
        num_pending = len(state.pending)
        if self.copy_kv:  # keep the accepted nodes' KV: the next step feeds only the bonus token
            self.step.commit(state.cache, res.num_fed, num_pending, [res.tree_start + n for n in path])
            state.past += num_pending + len(path)
        else:
            self.step.commit(state.cache, res.num_fed, num_pending)
            state.past += num_pending
        state.steps += 1
        state.step_tokens.append(res.num_fed)
        self.step_policy.observe(plan.proposed, plan.fed_nodes, [plan.fed_nodes[n] for n in path])
        return accepted

    @staticmethod
    def _emit(state: SequenceState, accepted: list[int], streamer) -> None:
        emitted = state.stopper.push(accepted)
        state.accept_lengths.append(len(emitted))
        if streamer is not None:
            for tok in emitted:
                streamer.put(torch.tensor([tok]))

    def _observe(self, state: SequenceState, plan: StepPlan, res: StepResult, accepted: list[int]) -> None:
        """The window, the proposers and the next step's pending tokens learn the step."""
        ngrams = []
        if plan.num_columns:  # a non-finite window row is a discarded guess: c stands in for it
            c = state.pending[-1]
            ngrams = state.window.advance(c, [t if t >= 0 else c for t in res.new_window])
        state.history.extend(accepted)
        for p in self.proposers:
            p.observe(accepted, ngrams, res.rows)
        state.pending = accepted[-1:] if self.copy_kv else accepted
        if getattr(self.lp, "debug", False):  # every LP rank holds the same state after a merge (docs/architecture.md)
            self.lp.check_consistent(state_hash(state.window.state(), tuple(p.state() for p in self.proposers),
                                                state.past, state.stopper.output))
