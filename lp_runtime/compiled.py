"""One captured decoding step per shape bucket over a ``SlotCache`` (gpt-fast's static shapes, nano-vllm's buckets).

A step of q tokens keeping k rows is padded to the smallest bucket b >= max(q, k) (``BUCKETS``), so every step of a
bucket has the same shapes: ids and positions int64 (1, b), tree mask (1, 1, b, b), kept rows int64 (b,), the
committed length a 0-d int64 device tensor. Each bucket's forward is captured once (``backend``): "cudagraph"
(default on CUDA: one ``torch.cuda.CUDAGraph`` per bucket, one shared pool), "reduce-overhead" (``torch.compile``
under CUDA graphs), or "inductor" (default on CPU) or any other ``torch.compile`` backend.

Padded rows sit at the last real position and see only themselves; their outputs are never read and their KV, in
slots past+q .. past+b-1, is overwritten before it is read. So ``max_len`` = the longest sequence + the largest
bucket; every captured step reads all ``max_len`` slots (``attention.split_attention`` masks those past the
committed length). Prefill runs eagerly on the same cache::

    step = CapturedStep(model, max_len=len(prompt) + 128 + 256)
    step.warm_up()                              # "captured 9 step buckets (1..256) in 4.2 s"
    tokens = step.greedy(prompt, 128)           # token-identical to eager greedy in float32
    dec = Decoder(model, decoding, step=step)   # lookahead through the same buckets"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import torch

from . import distributed
from .answers import write_json
from .attention import use_split_attention
from .bundled import cache_root
from .checks import position_limit
from .latency import CACHE_TOKENS, REPS, step_latency  # step_latency: also compiled.step_latency (device_check.py)
from .static_cache import STEP_ROOM, SlotCache, SlotStep
from .step import StepInputs, StepOutputs

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, STEP_ROOM)  # the largest is the room a static cache keeps for a step


def bucket_for(q: int, buckets: Sequence[int] = BUCKETS) -> int:
    """The smallest bucket >= q. ``ValueError`` when q < 1 or q > the largest bucket."""
    fits = [b for b in buckets if b >= q]
    if q < 1 or not fits:
        raise ValueError(f"a step of {q} tokens has no bucket; buckets are {tuple(buckets)} (1 <= q <= {max(buckets)})")
    return min(fits)


class CapturedStep(SlotStep):
    """Compiled step per bucket for one model (float32 or bfloat16, CPU or CUDA), one sequence at a time.

    ``model``: a causal LM taking position ids and a 4D mask (Llama-like), set to ``attention.SPLIT``;
    ``max_len``: ``SlotCache`` slots (prompt + new tokens + the largest bucket); ``buckets``: ascending step sizes;
    ``backend``: see the module docstring. Raises ``ValueError`` for bad buckets, a ``max_len`` not above the
    largest bucket, "cudagraph" off CUDA."""

    def __init__(self, model, max_len: int, buckets: Sequence[int] = BUCKETS, backend: Optional[str] = None) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets or buckets[0] < 1:
            raise ValueError(f"buckets={tuple(buckets)} must be ascending, distinct and >= 1")
        if max_len < max(buckets) + 1:
            raise ValueError(f"max_len={max_len} must exceed the largest bucket ({max(buckets)})")
        super().__init__(model, max_len, room=max(buckets))
        self.on_cuda = self.device.type == "cuda"
        self.backend = backend or ("cudagraph" if self.on_cuda else "inductor")
        if self.backend == "cudagraph" and not self.on_cuda:
            raise ValueError(f"backend='cudagraph' needs a CUDA model (this one is on {self.device})")
        use_split_attention(model)
        self.buckets = tuple(buckets)
        self.past = torch.zeros((), dtype=torch.long, device=self.device)
        torch._dynamo.mark_static_address(self.past)
        self.prefill(self.cache, [0])  # allocates the cache's buffers eagerly (static addresses, outside any graph)
        self.cache.reset()
        self._blocked = torch.finfo(model.dtype).min
        self._buffers = {b: self._new_buffers(b) for b in self.buckets}
        self._graphs: dict[int, tuple] = {}  # bucket -> (CUDAGraph, its logits output)
        self._pool = None
        if self.backend == "reduce-overhead":
            self._compiled = torch.compile(self._forward, mode="reduce-overhead", dynamic=False)
        elif self.backend != "cudagraph":
            self._compiled = torch.compile(self._forward, backend=self.backend, dynamic=False)
        self.capture_seconds: Optional[float] = None

    def _new_buffers(self, b: int) -> dict[str, torch.Tensor]:
        dev = self.device
        pad = torch.full((b, b), self._blocked, dtype=self.model.dtype, device=dev).fill_diagonal_(0)
        causal = torch.full((b, b), self._blocked, dtype=self.model.dtype, device=dev).triu_(1)
        return {"ids": torch.zeros(1, b, dtype=torch.long, device=dev),
                "pos": torch.zeros(1, b, dtype=torch.long, device=dev),
                "mask": pad[None, None].clone(), "pad": pad, "causal": causal,
                "keep": torch.zeros(b, dtype=torch.long, device=dev)}

    def _forward(self, ids, pos, mask, keep):
        return self.model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=self.cache,
                          use_cache=True, logits_to_keep=keep, lp_past=self.past).logits[0]

    def _replay(self, b: int, buf: dict[str, torch.Tensor]) -> torch.Tensor:
        """Bucket b's step: its CUDA graph replayed (recorded at the first call), or its compiled function."""
        args = (buf["ids"], buf["pos"], buf["mask"], buf["keep"])
        if self.backend != "cudagraph":
            if self.backend == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            return self._compiled(*args)
        if b not in self._graphs:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # kernels chosen and workspaces allocated before recording
                for _ in range(2):
                    self._forward(*args)
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._pool = self._pool if self._pool is not None else torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._forward(*args)
            self._graphs[b] = (graph, out)
        graph, out = self._graphs[b]
        graph.replay()
        return out

    @torch.inference_mode()
    def prefill(self, cache: SlotCache, ids: Sequence[int], **rows) -> Optional[torch.Tensor]:
        """``EagerStep.prefill`` under inference mode, written by length (``topk``/``rows`` as there)."""
        return super().prefill(cache, ids, **rows)

    def __call__(self, cache: SlotCache, inputs: StepInputs, *, topk: int = 0) -> StepOutputs:
        """``step.EagerStep``'s call on the compiled path, reading only the (q, q) block of ``inputs.mask`` after
        the committed columns. A step larger than the largest bucket runs eagerly."""
        if cache is not self.cache:
            raise ValueError("a CapturedStep steps only its own cache (from its new_cache())")
        past = cache.get_seq_length()
        if max(inputs.ids.numel(), inputs.keep.numel()) > self.buckets[-1]:  # past every bucket: eager, by length
            return super().__call__(cache, inputs, topk=topk)
        inner = None if inputs.mask is None else inputs.mask[0, 0, :, past:]
        return StepOutputs.of(self.run(inputs.ids, inputs.positions, inner, inputs.keep, past), topk)

    def _fill(self, b: int, ids: torch.Tensor, positions: torch.Tensor, inner: Optional[torch.Tensor],
              keep: torch.Tensor, past: int) -> dict[str, torch.Tensor]:
        """Copy one step's inputs into bucket b's static buffers, padded as the module docstring says."""
        q = ids.numel()
        buf = self._buffers[b]
        buf["ids"][0, :q].copy_(ids.reshape(-1), non_blocking=True)
        buf["pos"][0, :q].copy_(positions.reshape(-1))
        if q < b:
            buf["pos"][0, q:].fill_(past + q - 1)
        mask = buf["mask"][0, 0]
        mask.copy_(buf["pad"])
        mask[:q, :q].copy_(buf["causal"][:q, :q] if inner is None else inner)
        buf["keep"][: keep.numel()].copy_(keep)
        self.past.fill_(past)
        return buf

    @torch.inference_mode()
    def run(self, ids: torch.Tensor, positions: torch.Tensor, inner: Optional[torch.Tensor],
            keep: torch.Tensor, past: int) -> torch.Tensor:
        """Logits (k, V) at the step's kept rows, valid until the next step (on CUDA: the graph's memory); the
        cache then holds ``past + q`` entries. ids, positions: int64 (q,) or (1, q) on the device; inner: the float
        (q, q) additive tree mask in the model's dtype, or None for causal; keep: int64 (k,) in-step rows; past:
        committed entries. ``ValueError`` when no bucket fits or the cache has no room for past + b slots."""
        q = ids.numel()
        b = bucket_for(max(q, keep.numel()), self.buckets)  # k can be q + 1 (window column 0 is c, kept twice)
        if past + b > self.cache.max_len:
            raise ValueError(f"a step at past={past} padded to {b} tokens needs {past + b} cache slots; "
                             f"this CapturedStep has max_len={self.cache.max_len}")
        buf = self._fill(b, ids, positions, inner, keep, past)
        self.cache.static_past = self.past
        try:
            logits = self._replay(b, buf)
        finally:
            self.cache.static_past = None
        self.cache.set_length(past + q)
        return logits[: keep.numel()]

    def fits(self, past: int, q: int) -> bool:
        """Whether a step of ``q`` tokens after ``past`` entries fits, padded to its bucket (kept rows may be q + 1;
        past every bucket it runs eagerly, by length)."""
        return past + (bucket_for(q + 1, self.buckets) if q < self.buckets[-1] else q) <= self.cache.max_len

    @property
    def latency_variant(self) -> str:
        """The variant keying this step's latency profile (``latency.model_profile``)."""
        return f"captured-{self.backend}"

    def latency_qs(self) -> tuple[int, ...]:
        """Every bucket b and b + 1: measured there, the interpolated latency curve is the buckets' step function.

        >>> CapturedStep.latency_qs(type("S", (), {"buckets": (1, 2, 4, 8)})())
        (1, 2, 3, 4, 5, 8)
        """
        return tuple(sorted(set(self.buckets) | {b + 1 for b in self.buckets[:-1]}))

    def measure_latency(self, qs: Sequence[int], reps: int = REPS, warmup: int = 1) -> dict[int, float]:
        """``latency.Measure``: {q: median seconds of q's bucket} (``step_latency``, each bucket timed once); a q
        past the largest bucket is timed eagerly."""
        shape = {q: bucket_for(q, self.buckets) if q <= self.buckets[-1] else q for q in qs}
        prefix = min(CACHE_TOKENS, self.cache.max_len - max(shape.values()))  # as many as the slots allow
        times = step_latency(self, sorted(set(shape.values())), cache_tokens=prefix, reps=reps, warmup=warmup)
        return {q: times[s] for q, s in shape.items()}

    def warm_up(self, log: Optional[Callable[[str], None]] = print) -> float:
        """Capture every bucket (three calls each, then the cache is reset); returns and logs the seconds."""
        start = time.perf_counter()
        with torch._dynamo.config.patch(recompile_limit=max(8, 2 * len(self.buckets))):
            for b in self.buckets:
                for _ in range(3):
                    rows = torch.arange(b, device=self.device)
                    self.run(torch.zeros(b, dtype=torch.long, device=self.device), rows, None, rows, 0)
        self.cache.reset()
        if self.on_cuda:
            torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - start
        if log is not None:
            log(f"captured {len(self.buckets)} step buckets ({self.buckets[0]}..{self.buckets[-1]}, {self.backend}) "
                f"in {self.capture_seconds:.1f} s")
        return self.capture_seconds

    def greedy(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int] = ()) -> list[int]:
        """Plain greedy through the 1-token bucket (the compiled baseline), ending after an id of ``eos_token_ids``
        (kept) or ``max_new_tokens``. ``ValueError`` for an empty prompt or ``max_new_tokens`` < 1."""
        prompt = list(prompt_ids)
        if not prompt or max_new_tokens < 1:
            raise ValueError(f"greedy needs a non-empty prompt and max_new_tokens >= 1 (got {len(prompt)} prompt "
                             f"tokens, max_new_tokens={max_new_tokens})")
        self.prefill(self.new_cache(), prompt[:-1])
        keep = torch.zeros(1, dtype=torch.long, device=self.device)
        out, token = [], prompt[-1]
        for past in range(len(prompt) - 1, len(prompt) - 1 + max_new_tokens):
            pos = torch.full((1,), past, dtype=torch.long, device=self.device)
            ids = torch.full((1,), token, dtype=torch.long, device=self.device)
            token = int(self.run(ids, pos, None, keep, past)[0].argmax())
            out.append(token)
            if token in eos_token_ids:
                break
        return out


MAX_DEFAULT_LEN = 8192  # slots when the model states no smaller context (each captured step reads them all)


def verdict_path(model, root: Optional[str] = None) -> str:
    """``<cache_root>/compile/<model>__<device>__<dtype>.json``: the measured eager-vs-compiled verdict."""
    ident = getattr(model, "lp_model_id", None) or os.path.basename(str(model.config._name_or_path).rstrip("/"))
    key = f"{ident or model.config.model_type}__{next(model.parameters()).device.type}__{model.dtype}"
    return os.path.join(root or cache_root(), "compile", re.sub(r"[^A-Za-z0-9._-]", "_", key) + ".json")


PATHS = ("eager", "static", "compiled")  # model.compile=auto chooses among them by the recorded verdict


def record_verdict(model, tokens_s: Mapping[str, float], root: Optional[str] = None) -> dict:
    """Record, and return, for ``model.compile=auto`` which path of ``PATHS`` decoded fastest here, from {path:
    tokens/s} (scripts/compile_bench.py ``--record``). ``ValueError`` for no or an unknown path."""
    bad = sorted(set(tokens_s) - set(PATHS))
    if bad or not tokens_s:
        raise ValueError(f"verdict paths {bad or '(none)'} are not allowed; use some of {', '.join(PATHS)}")
    record = {"path": max(tokens_s, key=tokens_s.get), "tokens_s": dict(tokens_s),
              "measured": time.strftime("%Y-%m-%d %H:%M")}
    write_json(Path(verdict_path(model, root)), record, indent=None)
    return record


def chosen_path(model, setting: str, root: Optional[str], log: Callable[[str], None]) -> str:
    """``model.compile`` as a path of ``PATHS``: true = compiled, false = eager, auto = the recorded verdict (one
    line logged); while none is, compiled on CUDA (one line logged) and eager elsewhere (silently).

    CUDA's default is measured (docs/benchmarks.md section 8, one H200): the captured step of a 7B model took 10.1 ms
    at 1 token against the eager forward's 36.0 ms (13.4 / 23.2 ms at 128 tokens), its 9 buckets captured in about
    2 s, token-identical to transformers' greedy in float32. On a CPU inductor compiles each bucket for minutes and
    the compiled step was slower (section 8's CPU table)."""
    if setting != "auto":
        return "compiled" if setting == "true" else "eager"
    path = verdict_path(model, root)
    if not os.path.isfile(path):  # a CPU, or an attention the user chose (model.attn_implementation): eager
        if next(model.parameters()).device.type != "cuda" or model.config._attn_implementation not in (None, "sdpa"):
            return "eager"
        log("model.compile=auto: compiled steps (CUDA graphs per step bucket; nothing recorded for this model here: "
            "scripts/compile_bench.py --record measures; model.compile=false for eager steps)")
        return "compiled"
    with open(path, encoding="utf-8") as f:
        v = json.load(f)
    rates = v.get("tokens_s") or {"eager": v["eager_tokens_s"], "compiled": v["compiled_tokens_s"]}
    best = v.get("path") or ("compiled" if v["compile"] else "eager")  # an older record: its compile flag
    shown = ", ".join(f"{p} {t:.1f}" for p, t in rates.items())
    log(f"model.compile=auto: {best} steps (measured {v['measured']}, tokens/s: {shown})")
    return best


def default_max_len(model) -> int:
    """Slots for any request: the position limit (<= ``MAX_DEFAULT_LEN``) + the largest bucket."""
    return min(position_limit(model) or MAX_DEFAULT_LEN, MAX_DEFAULT_LEN) + STEP_ROOM


def static_capacity(model, path: str) -> Optional[int]:
    """Tokens a sequence may reach on ``path`` (``chosen_path``'s): None on the eager path (the model's context)."""
    return None if path == "eager" else default_max_len(model) - STEP_ROOM


def step_for(model, setting: str, *, root: Optional[str] = None, log: Callable[[str], None] = print,
             path: Optional[str] = None) -> Optional[SlotStep]:
    """The step for ``model.compile`` = ``setting`` on ``path`` (default ``chosen_path``'s): None (eager), a
    ``SlotStep`` (static) or a warmed-up ``CapturedStep``, of ``default_max_len`` slots (one line logged where they
    hold less than the model's context). Under ``auto`` a step that fails to capture falls back to eager (the
    model's attention restored, one line logged), except under torch.distributed, where every rank must take the
    same path. ``ValueError`` for a setting not auto, true, false."""
    if setting not in ("auto", "true", "false"):
        raise ValueError(f"model.compile={setting!r} is not allowed; use one of auto, true, false")
    path = path or chosen_path(model, setting, root, log)
    if path == "eager":
        return None
    limit, cap = position_limit(model), static_capacity(model, path)
    if limit is None or cap < limit:
        log(f"model.compile={setting}: the static KV cache holds {cap} tokens, fewer than the model's "
            f"{limit or 'unstated'} context: answers stop there (finish_reason length); model.compile=false for more")
    if path == "static":
        return SlotStep(model, default_max_len(model), room=STEP_ROOM)
    attention = model.config._attn_implementation
    try:
        step = CapturedStep(model, default_max_len(model))
        slow = (" (inductor compiles each bucket on a CPU: minutes in all, before the first answer; the default "
                "model.compile=auto runs eager steps on a CPU)") if not step.on_cuda else ""
        log(f"model.compile={setting}: capturing {len(step.buckets)} step buckets ({step.backend} on {step.device})"
            f"{slow} ...")
        step.warm_up(log=log)
    except Exception as e:  # e.g. an attention split_attention refuses: auto falls back, true says so
        if setting != "auto" or (distributed.is_initialized() and distributed.world_size() > 1):
            raise
        model.set_attn_implementation(attention)
        log(f"model.compile=auto: capturing the step failed ({type(e).__name__}: {str(e)[:200]}); eager steps")
        return None
    return step
