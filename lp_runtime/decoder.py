"""The decode loop for one sequence: prefill, lookahead steps, stopping, metrics.

Lookahead decoding (Fu et al. 2024, sections 3.1-3.3, Algorithm 1 in appendix A) with the step layout of
DESIGN.md section 1 and the candidates of issue 10. Each step (``generate``'s loop, CORE_INTERFACE.md):

1. the lookup (``lookup.py``) proposes a candidate TREE from the longest suffix match over the prompt, the
   output and the window's n-grams;
2. the step policy (default ``FeedAll``) chooses which nodes to feed and whether to feed the window;
3. ``_step``: ONE forward pass over [pending][window][chosen tree nodes] (shared prefixes fed once), then
   verification by walking the tree (greedy, or sampling per node);
4. commit: in one process copy-KV (the accepted path's KV rows are kept, so the next step feeds only the
   bonus token); under LP re-feed (the accepted tokens are the next step's pending tokens);
5. ``step_policy.observe`` sees what was fed and accepted.

Plain greedy decoding is the same loop with no window and no candidates (one pending token a step).

Sampling and logits processing (``sampling.py``; paper appendix B): ``c`` and every tree node are processed
against their own prefix with transformers' processors; greedy takes the processed argmax (so a repetition
penalty matches ``generate(do_sample=False, repetition_penalty=...)``), sampling replaces each such argmax by
the OUTCOME of that node -- sequential rejection of the node's draft children, else a residual (or, at a
leaf, bonus) sample -- with uniforms keyed by (seed, absolute position). A node's outcome is a child exactly
when that child was accepted, so ``verify.walk_outcomes`` rebuilds the step from one int64 per kept position.
Under LP each rank decides the nodes of the subtrees it computed, from tree tokens every rank holds and
draws every rank can make, so the merge exchanges the SAME fixed-size int64 buffer as greedy decoding: ONE
all-gather per step, sampling or not, and no probabilities cross ranks. The window's new tokens stay the raw
argmax (guesses only; they never affect the output law).

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

from . import support
from .config import ConfigError, DecodingConfig, SamplingConfig
from .kv import commit, new_cache
from .layout import LayoutCache, MaskBuffer, full_mask
from .lookup import AnswerStore, CandidateTree, FeedAll, new_lookup, propose
from .parallel import LocalGroup, state_hash, sub_parents
from .sampling import Sampler, check_processors, warn_model_defaults
from .stopping import StopChecker
from .verify import greedy_verify, node_children, walk_outcomes
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
        decoding: method, W, N, G and the candidate/commit variants (``DecodingConfig``).
        eos_token_ids: ids that end generation (may be empty).
        tokenizer: needed for stop strings only.
        lp: the lookahead-parallel group (``parallel.LocalGroup`` for one process).
        sampling: logits processing and sampling (``SamplingConfig``; default greedy, no processing).
        logits_processor: extra transformers processors applied after ``sampling``'s; only the classes of
            ``sampling.SUPPORTED_PROCESSORS`` (``ValueError`` naming any other).
        step_policy: what each step feeds (``choose(tree, num_pending=, window_tokens=) -> StepChoice`` and
            ``observe(tree, fed_nodes, accepted_nodes)``; CORE_INTERFACE.md); default ``lookup.FeedAll``, or
            with ``decoding.method="auto"`` a ``policy.CostPolicy`` on this machine's latency profile
            (``auto.auto_policy``: measured once per model/device/dtype, then read from the cache). Under LP
            pass it (every rank on rank 0's curve; ``ConfigError`` otherwise): a ``CostPolicy`` is then told to
            price steps by the busiest rank's tokens (``CostPolicy.price_lp``) unless it already was.

    Attributes switched by the benchmark's ablation: ``copy_kv`` (False: re-feed the accepted tokens),
    ``static_mask`` (False: concatenate a new mask each step instead of writing into ``layout.MaskBuffer``),
    ``step_policy``.
    """

    def __init__(self, model, decoding: DecodingConfig, *, eos_token_ids: Sequence[int] = (),
                 tokenizer=None, lp=None, sampling: Optional[SamplingConfig] = None,
                 logits_processor: Sequence = (), step_policy=None) -> None:
        self.model = model
        self.cfg = decoding
        self.eos_token_ids = list(eos_token_ids or [])
        self.tokenizer = tokenizer
        self.lp = lp if lp is not None else LocalGroup()
        self.extra_processors = check_processors(logits_processor or ())
        self.sampler = Sampler(sampling, self.extra_processors, getattr(model, "generation_config", None))
        warn_model_defaults(model, self.sampler.cfg)
        support.check_attention(model)  # ConfigError for attention that ignores position_ids / the 4D mask
        if step_policy is None and decoding.method == "auto":
            if self.lp.size > 1:  # each rank would read (or measure) its own curve: choices could differ
                raise ConfigError("decoding.method='auto' under lookahead parallelism needs every rank on the same "
                                  "latency curve: pass step_policy=policy.CostPolicy(curve) with rank 0's curve "
                                  "(lp_runtime.generate does)")
            from .auto import auto_policy

            step_policy = auto_policy(model)
        self.step_policy = step_policy if step_policy is not None else FeedAll()
        lookahead = decoding.method in ("lookahead", "auto")  # auto: lookahead, the cost policy picks each step
        self.window_size = decoding.window_size if lookahead else 0
        self.ngram_size = decoding.ngram_size
        self.guess_set_size = decoding.guess_set_size if lookahead else 0
        self.use_pool = lookahead and (self.guess_set_size > 0)
        # Deepest candidate node: N-1 for the pool, longer continuations after long suffix matches.
        self.tree_depth = self.ngram_size - 1 if decoding.lookup == "pool" else max(decoding.max_depth,
                                                                                    self.ngram_size - 1)
        self.copy_kv = decoding.commit == "copy" and self.lp.size == 1  # LP re-feeds (KV lives on one rank)
        if self.lp.size > 1 and getattr(self.step_policy, "lp_size", None) == 1:
            self.step_policy.price_lp(self.lp.size, self.window_size)  # a step costs its busiest rank's tokens
        self.device = next(model.parameters()).device
        self.layouts = LayoutCache(self.device, model.dtype)
        self.static_mask = True
        self._mask_buffer = MaskBuffer(model.dtype, self.device)
        self.context_length = support.position_limit(model)  # every fed position stays below this
        # decoding.cross_question: earlier answers of this Decoder seed later prompts' lookups (candidates only);
        # the store exists when some call may match it (a greedy one does whenever any does)
        self.store = AnswerStore() if self._matches_answers(do_sample=False) else None

    def _matches_answers(self, do_sample: bool) -> bool:
        """Whether a call's lookup matches the cross-question store (``decoding.cross_question``): true/false as
        set; null = for greedy calls only (a sampled answer's draws would depend on which answers came before);
        never with ``lookup=pool`` (the reference pool keeps no answers) or without a verification branch."""
        cross_question = self.cfg.cross_question
        return self.use_pool and self.cfg.lookup != "pool" and (
            cross_question if cross_question is not None else not do_sample)

    def forget_answers(self) -> None:
        """Empty the cross-question store (``decoding.cross_question``): later prompts match no earlier answer."""
        if self.store is not None:
            self.store = AnswerStore()

    def _window_tokens(self, window: JacobiWindow) -> int:
        """Window tokens one process would feed this step (row 0 columns 1..W-1 + W per level)."""
        return max(self.window_size - 1, 0) + window.num_levels * self.window_size if window.active else 0

    @staticmethod
    def _decide(sampler: Sampler, logits_KV: torch.Tensor, kept: torch.Tensor, history: list[int],
                tree: CandidateTree, nodes: Sequence[int], num_cols: int) -> torch.Tensor:
        """``kept`` (int64 (k,), layout order) with ``c``'s and this rank's tree nodes' entries replaced by
        the sampler's decision (processed argmax, or the sampled node outcome); window entries stay raw argmax,
        so the LP merge exchanges the same int64 buffer as in greedy decoding."""
        rows = [0] + [1 + num_cols + k for k in range(len(nodes))]
        suffixes = [[]] + [[tree.tokens[m] for m in tree.path(n)] for n in nodes]
        children = [node_children(tree.tokens, tree.parents, n) for n in (-1, *nodes)]
        index = torch.tensor(rows, device=logits_KV.device)
        tokens = sampler.decide(logits_KV[index], history, suffixes, children)
        kept = kept.clone()
        kept[index] = torch.tensor(tokens, dtype=kept.dtype, device=kept.device)
        return kept

    def _step(self, cache, past: int, pending: list[int], window: JacobiWindow, num_columns: int,
              tree: CandidateTree, sampler: Sampler, history: list[int]):
        """ONE forward pass: [pending][this rank's window columns][this rank's tree nodes], then the merge.

        Returns (x1, the W new window tokens, one output per tree node, tokens fed, in-step index of each of
        this rank's tree nodes or None under LP).
        """
        num_levels = window.num_levels if num_columns else 0
        cols, nodes = self.lp.plan(len(pending), num_columns, num_levels, tree.parents)
        layout, depth, inner, keep = self.layouts.get(len(pending), cols, num_levels,
                                                      sub_parents(tree.parents, nodes))
        ids = layout.input_ids(pending, window.row0, window.levels, [tree.tokens[n] for n in nodes])
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            position_ids=(depth + past)[None],
            attention_mask=None if layout.is_chain else (
                self._mask_buffer.view(inner, past) if self.static_mask else full_mask(inner, past)),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        kept, finite = support.finite_argmax(out.logits[0])
        if sampler.active:  # c and tree nodes: processed against their own prefix (window: raw argmax)
            kept = self._decide(sampler, out.logits[0], kept, history, tree, nodes, len(cols))
        kept = support.mark_nonfinite(kept, finite)  # NaN/inf rows -> NONFINITE on the device, no host sync
        x1, new_window, node_out = self.lp.merge(kept, len(pending), num_columns, num_levels, tree.parents)
        return x1, new_window, node_out, len(ids), layout.tree_start

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

        store = self.store if self._matches_answers(sampler.do_sample) else None
        lookup = new_lookup(self.cfg, store) if self.use_pool else None
        history = list(prompt)
        if lookup is not None:
            lookup.extend(prompt)
        window = JacobiWindow(self.window_size, self.ngram_size)
        if window.active:
            window.reset(prompt, self.cfg.seed)
        steps, accept_lengths, step_tokens = 0, [], []

        while True:
            # What to feed: the lookup proposes a tree, the step policy picks nodes and the window.
            proposed = propose(lookup, self.cfg)
            choice = self.step_policy.choose(proposed, num_pending=len(pending),
                                             window_tokens=self._window_tokens(window))
            tree = proposed if len(choice.nodes) == len(proposed) else proposed.select(choice.nodes)
            num_columns = self.window_size if choice.use_window else 0
            fed_nodes = choice.nodes
            depths = tree.depths()  # once per step: the span below and the finite check after the forward
            span = len(pending) - 1 + max(max(depths, default=0),
                                          self.window_size - 1 + self.ngram_size - 2 if num_columns else 0)
            if ctx is not None and past + span >= ctx:
                num_columns, tree, fed_nodes, depths = 0, CandidateTree(), (), []  # near the context's end: plain steps
                if past + len(pending) > ctx:
                    stopper.finish_reason = "length"
                    break

            x1, new_window, node_out, num_fed, tree_start = self._step(
                cache, past, pending, window, num_columns, tree, sampler, history)
            support.check_finite(steps + 1, past + len(pending) - 1, x1, new_window, node_out, depths)
            verify = walk_outcomes if sampler.do_sample else greedy_verify
            accepted, path = verify(x1, tree.tokens, tree.parents, node_out)
            if self.copy_kv:  # keep the accepted nodes' KV: the next step feeds only the bonus token
                commit(cache, num_fed, len(pending), [tree_start + n for n in path])
                past += len(pending) + len(path)
            else:
                commit(cache, num_fed, len(pending))
                past += len(pending)
            steps += 1
            step_tokens.append(num_fed)
            self.step_policy.observe(proposed, fed_nodes, [fed_nodes[n] for n in path])

            emitted = stopper.push(accepted)
            accept_lengths.append(len(emitted))
            if streamer is not None:
                for tok in emitted:
                    streamer.put(torch.tensor([tok]))
            if stopper.finish_reason is not None:
                break

            if num_columns:
                for ngram in window.advance(pending[-1], new_window):
                    if lookup is not None:
                        lookup.add_ngram(ngram)
            history.extend(accepted)
            if lookup is not None:
                lookup.extend(accepted)
            pending = accepted[-1:] if self.copy_kv else accepted
            if getattr(self.lp, "debug", False):  # every LP rank must hold the same state after the merge (DESIGN.md section 3)
                self.lp.check_consistent(state_hash(window.state(), lookup.state() if lookup else None,
                                                    past, stopper.output))

        if streamer is not None:
            streamer.end()
        if self.store is not None:
            self.store.add(prompt, stopper.output)
        return GenerationOutput(
            output_ids=list(stopper.output),
            finish_reason=stopper.finish_reason or "length",
            decoding_steps=steps,
            accept_lengths=accept_lengths,
            wall_time=time.perf_counter() - start,
            step_tokens=step_tokens,
        )
