"""What a decode can run exactly, checked before any work (docs/architecture.md): the model's attention
(``check_attention``), position encoding, attention span and the request (``check_request``), and the step's logits
(``check_decided``). Refusals are ``ConfigError``; non-finite deciding logits are ``ModelOutputError``."""
from __future__ import annotations

import contextlib
import dataclasses
import operator
import weakref
from typing import Optional, Sequence

import torch

from .config import ConfigError, DecodingConfig, GenerationConfig, ModelOutputError, SamplingConfig, a_or_an, is_bool
from .layout import full_mask
from .step import EagerStep, StepInputs
from .window import step_tokens


def _text_config(model):
    cfg = model.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def _arch(model) -> str:
    cfg = _text_config(model)  # the class given (a base LlamaModel's config.architectures names LlamaForCausalLM)
    return f"{type(model).__name__} (model_type {getattr(cfg, 'model_type', '?')!r})"


def _rope_entries(cfg) -> list[dict]:
    """The rope parameter dicts of a text config (one, or one per layer type)."""
    rope = getattr(cfg, "rope_parameters", None)
    if rope is None:
        rope = getattr(cfg, "rope_scaling", None)
    if not isinstance(rope, dict):
        return []
    if "rope_type" in rope or "type" in rope:
        return [rope]
    return [v for v in rope.values() if isinstance(v, dict)]


def length_dependent_rope(model) -> Optional[tuple[str, int]]:
    """(rope type, length) when the model's rotary frequencies change once the sequence passes ``length`` tokens
    (transformers' ``dynamic_rope_update``: types containing "dynamic", and "longrope"), else None."""
    cfg = _text_config(model)
    found: Optional[tuple[str, int]] = None
    for rope in _rope_entries(cfg):
        kind = str(rope.get("rope_type", rope.get("type", "default")))
        if kind == "longrope":
            key = "original_max_position_embeddings"  # the rope dict's, else the config's
            limit = rope.get(key) or getattr(cfg, key, None)
        elif "dynamic" in kind:
            limit = getattr(cfg, "max_position_embeddings", None)
        else:
            continue
        if limit is None:
            raise ConfigError(f"{_arch(model)} uses rope scaling {kind!r} without a known base length; "
                              "lp_runtime cannot tell how far it decodes exactly")
        if found is None or int(limit) < found[1]:
            found = (kind, int(limit))
    return found


def context_length(model) -> Optional[int]:
    """Most tokens a sequence may hold (``max_position_embeddings``); None when the config does not say."""
    return getattr(_text_config(model), "max_position_embeddings", None)


def fills_context(model, num_tokens: int, capacity: Optional[int] = None) -> bool:
    """Whether a prompt of ``num_tokens`` leaves no room for one new token in the model's context or in a static KV
    cache of ``capacity`` tokens (a step's ``max_positions``)."""
    limits = [n for n in (context_length(model), capacity) if n is not None]
    return bool(limits) and num_tokens >= min(limits)


def position_limit(model) -> Optional[int]:
    """Bound on a step's fed positions: the context, or less where a length-dependent rope would change its
    frequencies for the whole step (the decoder then takes plain steps near it); None when neither is known."""
    limits = [n for n in (context_length(model), (length_dependent_rope(model) or (None, None))[1]) if n]
    return min(limits) if limits else None


def _refuse_past(model, max_total_tokens: int, limit: int, reason: str) -> None:
    """``ConfigError`` (``reason``, the length asked for, the limit) when ``max_total_tokens`` > ``limit``."""
    if max_total_tokens > limit:
        raise ConfigError(f"{_arch(model)} {reason}; this prompt plus max_new_tokens may reach {max_total_tokens} "
                          f"tokens. lp_runtime decodes such models exactly up to {limit} tokens: shorten the prompt "
                          "or lower max_new_tokens")


def attention_span(model) -> Optional[tuple[str, int]]:
    """(config attribute, tokens) when some layer attends only within a window or chunk of that many tokens
    (``sliding_window``, GPT-Neo's ``window_size``, Llama-4's ``attention_chunk_size``; the smallest), else None.
    A step's own 4D mask replaces the model's, so lookahead is exact only inside the first window or chunk."""
    cfg = _text_config(model)
    spans = []
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None) or []
    sliding = "sliding_attention" in layer_types or (not layer_types and getattr(cfg, "use_sliding_window", True))
    if window and sliding:
        spans.append(("sliding_window", int(window)))
    local = getattr(cfg, "attention_layers", None) or []
    if "local" in local and getattr(cfg, "window_size", None):
        spans.append(("window_size", int(cfg.window_size)))
    if getattr(cfg, "attention_chunk_size", None):
        spans.append(("attention_chunk_size", int(cfg.attention_chunk_size)))
    return min(spans, key=lambda s: s[1]) if spans else None


def vocab_size(model) -> Optional[int]:
    """Rows of the input embedding (ids 0..n-1 are valid), else the config's ``vocab_size``."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if emb is not None and hasattr(emb, "num_embeddings"):
        return int(emb.num_embeddings)
    return getattr(_text_config(model), "vocab_size", None)


def one_sequence(prompt):
    """``prompt`` with a tokenizer's ``BatchEncoding`` replaced by its ``input_ids`` less the positions its
    ``attention_mask`` masks (padding), a (1, n) tensor, array or list of lists by its row and a 1-D tensor or
    array by a list; anything else as given. ``ConfigError`` for a batch of several sequences (decoding is one
    sequence at a time)."""
    if not isinstance(prompt, (str, list, tuple)) and hasattr(prompt, "keys") and "input_ids" in prompt.keys():
        mask = prompt.get("attention_mask")  # tok(..., padding=...): padding decoded as prompt gave other text
        prompt = one_sequence(prompt["input_ids"])  # tok(text, return_tensors="pt")
        mask = None if mask is None else one_sequence(mask)
        if mask is not None and len(mask) == len(prompt):
            prompt = [t for t, m in zip(prompt, mask) if m]
    if (getattr(prompt, "ndim", None) or 0) > 2:
        raise ConfigError(f"the prompt has {prompt.ndim} dimensions (shape {tuple(prompt.shape)}); give one sequence "
                          "of token ids (a list, a 1-D or (1, n) tensor)")
    rows = prompt.shape[0] if getattr(prompt, "ndim", None) == 2 else None
    if isinstance(prompt, (list, tuple)) and prompt and all(
            isinstance(r, (list, tuple)) or getattr(r, "ndim", None) == 1 for r in prompt):  # a list of rows
        rows = len(prompt)
    if rows is not None and rows != 1:
        shape = f" (shape {tuple(prompt.shape)})" if hasattr(prompt, "shape") else ""
        raise ConfigError(f"the prompt is a batch of {rows} sequences{shape}; give one sequence of token ids (a "
                          "list, a 1-D or (1, n) tensor): a step decodes one sequence at a time")
    if rows == 1:
        prompt = prompt[0]
    return prompt.tolist() if getattr(prompt, "ndim", None) == 1 and hasattr(prompt, "tolist") else prompt


def check_prompt_ids(prompt_ids: Sequence, vocab: Optional[int]) -> list[int]:
    """``prompt_ids`` (``one_sequence``) as a list of ints; ``ConfigError`` for an empty prompt, a batch, a
    non-integer, or an id outside ``0..vocab-1`` (on a GPU a bad id is a device-side assert that kills the
    process)."""
    if isinstance(prompt_ids, (str, bytes)):
        raise ConfigError("the prompt must be a list of token ids here, not text")
    raw = one_sequence(prompt_ids)
    if not isinstance(raw, (list, tuple)):  # None, a number, a dict: "'NoneType' object is not iterable"
        raise ConfigError(f"the prompt is {type(raw).__name__}; give a list (or 1-D tensor) of token ids")
    raw = list(raw)
    ids = [_as_int(t) for t in raw]
    if None in ids:
        i = ids.index(None)
        raise ConfigError(f"prompt token {i} is {raw[i]!r}; token ids must be integers")
    if not ids:
        raise ConfigError("the prompt is empty; give at least one token")
    bad = next((i for i, t in enumerate(ids) if vocab is not None and not 0 <= t < vocab), None)
    if bad is not None:
        raise ConfigError(f"prompt token id {ids[bad]} (at index {bad}) is outside the model's vocabulary of "
                          f"{vocab} ids (0..{vocab - 1})")
    return ids


def check_model(model) -> None:
    """``ConfigError`` unless ``model`` is a ``torch.nn.Module`` with a ``config``, as a transformers causal LM is
    (one without an LM head is named by ``check_attention``'s probe)."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise ConfigError(f"model is {type(model).__name__}; give a transformers causal LM, e.g. "
                          "AutoModelForCausalLM.from_pretrained(...)")


def check_tokenizer(tokenizer, encodes: bool = True) -> None:
    """``ConfigError`` unless ``tokenizer`` is None or has a callable ``decode`` and, with ``encodes`` (text prompts),
    is callable itself, as a transformers tokenizer is."""
    usable = callable(getattr(tokenizer, "decode", None)) and (callable(tokenizer) or not encodes)
    if tokenizer is not None and (isinstance(tokenizer, (str, bytes)) or not usable):  # bytes has a decode
        raise ConfigError(f"tokenizer is {type(tokenizer).__name__}; give the model's transformers tokenizer "
                          "(AutoTokenizer.from_pretrained(...)), or None for token-id prompts")


def check_arg(value, kind: type, what: str) -> None:
    """``ConfigError`` unless ``value`` is a ``kind`` (``what`` names the argument) and, for a config dataclass, its
    fields still pass its checks (one may be set after construction).

        >>> check_arg({"temperature": 0.7}, dict, "sampling")
        >>> check_arg([0.7], dict, "sampling")
        Traceback (most recent call last):
        lp_runtime.config.ConfigError: sampling is list; give a dict
    """
    if not isinstance(value, kind):
        raise ConfigError(f"{what} is {type(value).__name__}; give {a_or_an(kind.__name__)}")
    if dataclasses.is_dataclass(value):
        dataclasses.replace(value)


def check_methods(value, what: str, methods: Sequence[str], give: str) -> None:
    """``ConfigError`` unless ``value`` has every one of ``methods`` (callables; ``what`` names the argument,
    ``give`` says what to pass instead): duck-typed arguments (a streamer, a step, a proposer) refused in one line
    instead of an AttributeError mid-decode.

        >>> check_methods(object(), "streamer", ("put", "end"), "a TextStreamer")
        Traceback (most recent call last):
        lp_runtime.config.ConfigError: streamer is object, without put() and end(); give a TextStreamer
    """
    missing = [m for m in methods if not callable(getattr(value, m, None))]
    if missing:
        names = [m + "()" for m in missing]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        raise ConfigError(f"{what} is {type(value).__name__}, without {listed}; give {give}")


def check_parts(*, lp=None, step_policy=None, proposers=None, step=None, copy_kv=None) -> Optional[list]:
    """``ConfigError`` for a ``Decoder`` part of the wrong kind (None: the default): ``lp`` (``parallel.LPGroup``),
    ``step_policy`` (``policy.StepPolicy``), ``proposers`` (an iterable of ``proposers.Proposer``), ``step``
    (``step.EagerStep`` or another with its methods), ``copy_kv`` (a bool). Returns ``proposers`` as a list (None:
    None), so a generator is read once."""
    if lp is not None:
        check_methods(lp, "lp", ("plan", "merge", "check_consistent"), "the LPGroup of parallel.setup_parallel(), "
                      "or leave it out for one process")
    if step_policy is not None:
        check_methods(step_policy, "step_policy", ("choose", "observe"), "a policy.StepPolicy, e.g. "
                      "lp_runtime.auto.auto_policy(model)")
    if proposers is not None:
        if isinstance(proposers, (str, bytes, dict)) or not hasattr(proposers, "__iter__"):
            raise ConfigError(f"proposers is {type(proposers).__name__}; give a list of proposers.Proposer objects "
                              "(e.g. proposers.SuffixProposer), or leave it out for the decoding setting's own")
        proposers = list(proposers)
        for i, p in enumerate(proposers):
            check_methods(p, f"proposers[{i}]", ("begin", "observe", "propose", "end", "reset"),
                          "a proposers.Proposer (docs/architecture.md)")
            for name in ("topk", "max_depth"):
                value = getattr(p, name, None)
                if _as_int(value) is None or value < 0:  # numpy integers too
                    raise ConfigError(f"proposers[{i}].{name}={value!r} is not allowed; it must be an integer >= 0")
    if step is not None:
        check_methods(step, "step", ("new_cache", "prefill", "commit", "fits", "__call__"), "step.EagerStep(model), "
                      "compiled.CapturedStep, or leave it out for the eager step")
    if copy_kv is not None and not is_bool(copy_kv):
        raise ConfigError(f"copy_kv={copy_kv!r} is not allowed; give True, False, or None for the method's default")
    return proposers


def eos_token_ids(model, tokenizer, override: Optional[Sequence[int]]) -> list[int]:
    """``override``, else the model's ``generation_config.eos_token_id``, else ``tokenizer.eos_token_id``, without
    repeats; may be empty (then only ``max_new_tokens`` and stop strings end generation)."""
    value = override
    if value is None:
        value = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if value is None and tokenizer is not None:
        value = tokenizer.eos_token_id
    ids = [] if value is None else [value] if _as_int(value) is not None else list(value)
    return list(dict.fromkeys(int(i) for i in ids))


def check_eos_ids(eos_token_ids, vocab: Optional[int]) -> list[int]:
    """``eos_token_ids`` (one id or a sequence of ids) as a list; ``ConfigError`` for a non-integer or an id outside
    ``0..vocab-1``."""
    one = _as_int(eos_token_ids)
    raw = [one] if one is not None else list(eos_token_ids or [])
    ids = [_as_int(t) for t in raw]
    if None in ids:
        raise ConfigError(f"eos_token_ids holds {raw[ids.index(None)]!r}; token ids must be integers")
    for t in ids:
        if vocab is not None and not 0 <= t < vocab:
            raise ConfigError(f"eos_token_ids holds {t}, outside the model's vocabulary of {vocab} ids "
                              f"(0..{vocab - 1})")
    return ids


def check_max_new_tokens(max_new_tokens) -> int:
    """``max_new_tokens`` as an int >= 1; ``ConfigError`` otherwise."""
    value = _as_int(max_new_tokens)
    if value is None:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} is not allowed; it must be an integer >= 1")
    if value < 1:
        raise ConfigError(f"max_new_tokens={value} is not allowed; it must be >= 1")
    return value


def _as_int(value) -> Optional[int]:
    """``value`` as an int when it is an integer (Python or numpy or a 0-d tensor, not a bool), else None."""
    try:
        return None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return None


def check_request(model, prompt_ids: Sequence, max_new_tokens,
                  capacity: Optional[int] = None) -> tuple[list[int], int]:
    """(prompt ids, token budget capped to the model's context and to a static KV cache of ``capacity`` tokens, the
    step's ``max_positions``) of one ``Decoder.generate`` call, before any forward pass. ``ConfigError`` for a bad
    prompt or budget, a prompt filling the context or the cache, or a length the model cannot decode exactly."""
    prompt = check_prompt_ids(prompt_ids, vocab_size(model))
    budget = check_max_new_tokens(max_new_tokens)
    ctx = context_length(model)
    if fills_context(model, len(prompt)):
        raise ConfigError(f"the prompt ({len(prompt)} tokens) fills the model's context of {ctx} tokens; "
                          "it leaves no room for a new token: shorten it")
    limit = position_limit(model)
    static = capacity if capacity is not None and (limit is None or capacity < limit) else None  # where it binds
    if static is not None and len(prompt) >= static:  # a write past the cache's slots failed mid-decode (ValueError)
        raise ConfigError(f"the prompt ({len(prompt)} tokens) fills this decoder's static KV cache of {static} tokens "
                          "(model.compile's static and compiled paths); shorten it, or set model.compile=false (a "
                          f"cache that grows up to the model's context{f' of {ctx} tokens' if ctx else ''})")
    # Rope on what was asked: a dynamic-NTK model is meant to run past its context, where we stop.
    rope = length_dependent_rope(model)
    if rope is not None:
        _refuse_past(model, len(prompt) + budget, rope[1], f"uses rope scaling {rope[0]!r}, whose frequencies "
                                                           f"change once the sequence passes {rope[1]} tokens")
    budget = min([budget] + [n - len(prompt) for n in (ctx, static) if n is not None])
    # Window and candidates past the sequence are not counted: the decoder keeps fed positions < position_limit.
    span = attention_span(model)
    if span is not None:
        _refuse_past(model, len(prompt) + budget, span[1], f"attends within windows of {span[1]} tokens "
                                                           f"({span[0]}={span[1]})")
    return prompt, budget


_PROBED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
ALIBI_MODEL_TYPES = ("bloom", "mpt")  # plus any config with alibi=True (Falcon)


def _probe_steps(model, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chain, wrong, tree) float32 logits of ``_probe``'s three steps (``dtype``: the mask's)."""
    step = EagerStep(model)
    n = vocab_size(model) or 8
    a, b, c, d = (t % n for t in (1, 2, 3, 4))
    blocked = torch.finfo(dtype).min

    def run(ids, positions, inner, keep):
        cache = step.new_cache()
        step.prefill(cache, [a])
        mask = None if inner is None else full_mask(torch.tensor(inner, dtype=dtype, device=step.device), 1)
        inputs = StepInputs(torch.tensor([ids], device=step.device), torch.tensor([positions], device=step.device),
                            mask, torch.tensor(keep, device=step.device))
        return step(cache, inputs).logits.float()

    return (run([b, c], [1, 2], None, [0, 1]), run([b, d, c], [1, 2, 3], None, [0, 2]),
            run([b, d, c], [1, 2, 2], [[0, blocked, blocked], [0, 0, blocked], [0, blocked, 0]], [0, 2]))


def _distance(x: torch.Tensor, y: torch.Tensor) -> float:
    diff = (x - y).abs()
    diff = torch.where(torch.isnan(x) & torch.isnan(y), torch.zeros_like(diff), diff)  # NaN weights: not ours
    return float(diff.nan_to_num(float("inf")).max())


@torch.inference_mode()
def _probe(model, alibi_types: Sequence[str] = ALIBI_MODEL_TYPES) -> Optional[str]:
    """None when a 2-token tree step reproduces plain decoding; else what went wrong.

    After a prefill of (a): chain = (b, c) at positions (1, 2), the reference; tree = (b, d, c) at (1, 2, 2)
    with a 4D mask hiding d from c; wrong = (b, d, c) at (1, 2, 3), causal. The tree's logits for b and c must
    equal the chain's within 1e-4 of the logit scale (float32), or in 16-bit types within 2e-2 of it or a tenth
    of the wrong step's distance. ALiBi and ``attn_temperature_tuning`` (cache-index based) are refused first.
    """
    cfg = _text_config(model)
    if getattr(cfg, "alibi", False) or getattr(cfg, "model_type", None) in alibi_types:
        return "it uses ALiBi attention biases, built from cache indices rather than position_ids"
    if getattr(cfg, "attn_temperature_tuning", False):
        return ("it scales attention by cache index (attn_temperature_tuning=True), not by position_ids, which "
                "a lookahead step's tokens do not share")
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    try:
        chain, wrong, tree = _probe_steps(model, dtype)
    except Exception as e:  # the model's own attention code refused our inputs
        if isinstance(e, AttributeError) and "logits" in str(e):  # a base model (LlamaModel): hidden states
            return "it returns no logits (a model without an LM head: load its causal-LM class, AutoModelForCausalLM)"
        return f"a tree step fails inside the model ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    if tree.shape != chain.shape:
        return f"a tree step returned logits of shape {tuple(tree.shape)}, expected {tuple(chain.shape)}"
    finite = chain[torch.isfinite(chain)]
    scale = max(1.0, float(finite.abs().max()) if finite.numel() else 1.0)
    atol = (1e-4 if dtype == torch.float32 else 2e-2) * scale
    off = _distance(tree, chain)
    # float32 rounds a batched step like a chain step to ~1e-6: a fixed tolerance separates them. 16-bit types
    # round differently by up to a few percent, so there the tree must sit much closer to the chain than the
    # wrong step does (models that ignore position_ids or the mask land on or near the wrong step).
    if off <= (atol if dtype == torch.float32 else max(atol, 0.1 * _distance(wrong, chain))):
        return None
    return (f"a tree step's logits differ from plain decoding by {off:.3g} (its attention ignores position_ids or "
            "the 4D mask, e.g. ALiBi)")


def check_attention(model) -> None:
    """Refuse, with a ``ConfigError`` naming the architecture, a model whose attention does not follow explicit
    ``position_ids`` and a float 4D mask (``_probe``; run once per model object, a few ms)."""
    try:
        problem = _PROBED[model]
    except (KeyError, TypeError):
        problem = _probe(model)
        with contextlib.suppress(TypeError):  # a model that takes no weak reference: probed on every call
            _PROBED[model] = problem
    attn = getattr(model.config, "_attn_implementation", None) if problem is not None else None
    if attn not in (None, "sdpa", "eager"):  # the attention kernel failed the step, not the model
        raise ConfigError(f"model.attn_implementation={attn!r} cannot run a lookahead step of {_arch(model)}: "
                          f"{problem}. A step needs a float 4D attention mask: use sdpa (the default) or eager")
    if problem is not None:
        raise ConfigError(f"{_arch(model)} is not supported by lp_runtime: {problem}. Supported: models whose "
                          "attention takes explicit position_ids and a float 4D attention mask (rotary or learned "
                          "absolute positions: Llama, Mistral, Qwen2, Phi-3, Gemma, GPT-2, ...); ALiBi models (BLOOM, "
                          "MPT, Falcon with alibi=True) are not")


def check_decided(step: int, c_position: int, accepted: Sequence[int]) -> None:
    """Raise ``ModelOutputError`` when a step's accepted tokens hold ``step.NONFINITE`` (the row deciding an
    emitted token was NaN or inf). ``c_position``: sequence position of ``c``, whose row decides token 1."""
    bad = next((i for i, t in enumerate(accepted) if t < 0), None)
    if bad is None:
        return
    pos = c_position + bad
    raise ModelOutputError(f"the model's logits are not finite (NaN or inf) at decoding step {step}, sequence "
                           f"position {pos} (the logits choosing new token {pos + 1}); no token can be chosen from "
                           "them. Check the weights, or the dtype (float16 overflows: try model.dtype=bfloat16 or "
                           "float32)")


def available_devices() -> list[str]:
    """Devices this process can use: "cpu" plus "cuda:0".."cuda:k-1"."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu"] + [f"cuda:{i}" for i in range(n)]


def check_device(device: str) -> None:
    """``ConfigError`` naming the available devices when ``model.device`` names a GPU this machine lacks."""
    if not str(device).startswith("cuda"):  # "auto", "cpu"
        return
    available = available_devices()
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if f"cuda:{index}" not in available:
        gpus = len(available) - 1
        why = f"only {gpus} CUDA GPU(s) are visible" if gpus else "no CUDA GPU is visible"
        if not torch.backends.cuda.is_built():
            why = "this torch is built without CUDA"
        raise ConfigError(f"model.device={device!r} is not available: {why}; available devices: "
                          f"{', '.join(available)} (or model.device=auto)")


def check_limits(model, decoding: DecodingConfig, sampling: Optional[SamplingConfig] = None,
                 generation: Optional[GenerationConfig] = None) -> None:
    """``ConfigError`` naming key, value and bound for a setting only the loaded model can bound: a token id
    (``generation.eos_token_ids``, ``sampling.suppress_tokens``) outside ``0..vocab-1``, ``suppress_tokens``
    leaving no id, or a lookahead step, 1 + (W-1) + (N-2)*W window tokens + G candidates of ``candidate_depth``
    tokens (W = 0 with ``decoding=auto``; docs/design.md section 1), beyond ``max_position_embeddings``."""
    vocab = vocab_size(model)
    lists = {"generation.eos_token_ids": getattr(generation, "eos_token_ids", None),
             "sampling.suppress_tokens": getattr(sampling, "suppress_tokens", None)}
    for key, ids in lists.items():
        bad = [t for t in ids or [] if vocab is not None and not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"{key}={list(ids)} is not allowed: token id {bad[0]} is outside the model's vocabulary "
                              f"of {vocab} ids (0..{vocab - 1})")
    suppressed = set(lists["sampling.suppress_tokens"] or [])
    if vocab is not None and len(suppressed) >= vocab:  # every logit -inf: token 0 came out every step
        raise ConfigError(f"sampling.suppress_tokens suppresses all {vocab} token ids of the model's vocabulary; "
                          "leave at least one")
    ctx = context_length(model)
    if ctx is None or decoding.method == "greedy":
        return
    W = 0 if decoding.method == "auto" else decoding.window_size
    N, G, depth = decoding.ngram_size, decoding.guess_set_size, decoding.candidate_depth
    step = 1 + step_tokens(W, N - 2) + G * depth
    if step > ctx:
        window = f"decoding.window_size={W}, " if decoding.method != "auto" else ""
        depth_key = "" if decoding.method == "paper" else f", decoding.max_depth={decoding.max_depth}"
        raise ConfigError(
            f"{window}decoding.ngram_size={N}, decoding.guess_set_size={G}{depth_key} make a lookahead step of "
            f"{step} tokens ({'1 + (W-1) + (N-2)*W window tokens' if W else '1 pending token'} + G candidates of "
            f"{depth} tokens), more than the model's context of {ctx} tokens (max_position_embeddings); lower "
            "them so that a step fits")
