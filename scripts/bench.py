"""Side-by-side benchmark: transformers' greedy and prompt lookup against our greedy and lookahead settings.

Every method decodes the same prompts in the same process, interleaved per prompt (the method order rotates
from prompt to prompt) so that machine drift and order effects cancel; one warm-up generation per method
comes first and is not counted. Per method and per dataset category (plus per dataset and "all"):

- ``tokens_per_s``: new tokens / seconds (each call timed whole, prefill included);
- ``speedup_mean_ratio``: Spec-Bench's speedup, the mean over prompts of (tokens/s) / (baseline tokens/s);
- ``speedup_total``: total tokens / total time, over the baseline's (long answers weigh more);
- ``step_compression`` S = tokens / steps (forward passes; transformers' prefill counts as its first step,
  as it yields the first token), ``mean_accepted`` (tokens per step), ``seconds_per_step``;
- ``step_tokens``: input tokens of a full step (1 for greedy, 1 + 10 for prompt lookup, pending + window +
  G candidates for lookahead per ``DecodingConfig.step_tokens``);
- ``identical``: prompts whose output is token-identical to the baseline's (transformers' greedy).

Results go to ``output_dir``: ``results.csv`` (the table), ``results.json`` (table, per-prompt rows, config,
versions) and figures (speedup per category; S against tokens per step, log scale, the paper's section 4
scaling plot; seconds per step against tokens per step). Run from the repository root::

    python scripts/bench.py                                       # conf/bench.yaml: 5 MT-Bench + 5 HumanEval
    python scripts/bench.py limit=20 generation.max_new_tokens=128 output_dir=outputs/bench/full
    python scripts/bench.py --multirun decoding.window_size=0,3,7 decoding.ngram_size=3,5
    python scripts/bench.py decoding=auto                         # adds the tuner's choice as a method
    python scripts/bench.py 'datasets=[{name:jsonl,path:spec_bench/question.jsonl}]' limit=40

The ``decoding`` group's setting (a ``--multirun`` sweep point) is benchmarked besides ``methods`` and the
``lookahead`` list. ``parallel.lp`` > 1 needs torchrun with world size = lp (one sweep point per launch).
"""
from __future__ import annotations

import dataclasses
import math
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # python scripts/bench.py

from lp_runtime import cli, data, metrics  # noqa: E402
from lp_runtime.report import fmt, format_table, write_results  # noqa: E402
from lp_runtime.config import to_object as config_to_object  # noqa: E402
from lp_runtime.config import (DTYPES, ConfigError, DatasetConfig, DecodingConfig,  # noqa: E402
                               GenerationConfig, ModelConfig, ParallelConfig, register_configs)

HF_GREEDY, HF_PROMPT_LOOKUP, GREEDY = "hf_greedy", "hf_prompt_lookup", "greedy"
FIXED_METHODS = (HF_GREEDY, HF_PROMPT_LOOKUP, GREEDY)


@dataclass
class BenchConfig:
    """``conf/bench.yaml``. ``datasets``: prompt sets (``DatasetConfig`` each; categories are prefixed with the
    dataset's name); ``limit``: overrides every dataset's limit when set; ``per_category``: {dataset name: k}
    takes the first k questions of EACH category of that dataset, in file order (before ``limit``; null: none);
    ``dtypes``: run every method in each of these dtypes in the same interleaved run (one model copy each),
    each compared with transformers' greedy in its own dtype (empty: ``model.dtype`` only); ``methods``: any of
    hf_greedy, hf_prompt_lookup, greedy; ``lookahead``: [W, N, G] settings of ours; ``include_decoding``: also
    the ``decoding`` group's setting (``decoding=auto``: the cost policy); ``ablation``: also decoding=auto with
    each lever off in turn (``ABLATIONS``); ``levers``: only these ``ABLATIONS`` labels (e.g. ``[+successors]``).
    At least one method must be left (``methods``, ``lookahead`` or ``include_decoding``); ``output_dir`` must be a
    folder or a path that can become one (no file on it or above it): both are refused before the model loads."""

    model: ModelConfig = field(default_factory=ModelConfig)
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(  # conf/bench.yaml: decoding=lookahead
        method="lookahead", window_size=0, ngram_size=4, guess_set_size=2, max_depth=10))
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=64))
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    datasets: list[DatasetConfig] = field(default_factory=lambda: [
        DatasetConfig(name="mt_bench", limit=5, first_turn_only=True), DatasetConfig(name="humaneval", limit=5)])
    limit: Optional[int] = None
    per_category: Any = None  # Optional[dict[str, int]]; Any: an override into null must assign, not merge
    dtypes: list[str] = field(default_factory=list)
    ablation: bool = False
    levers: Optional[list[str]] = None
    methods: list[str] = field(default_factory=lambda: list(FIXED_METHODS))
    lookahead: list[list[int]] = field(default_factory=lambda: [[0, 3, 1], [0, 4, 2], [3, 4, 3]])
    include_decoding: bool = True
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 2
    warmup: bool = True
    figures: bool = True
    output_dir: str = "outputs/bench"
    progress: bool = True

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in FIXED_METHODS]
        if bad:
            raise ConfigError(f"methods={bad} not allowed; use any of {', '.join(FIXED_METHODS)}")
        if not self.methods and not self.lookahead and not self.include_decoding:
            raise ConfigError("methods=[], lookahead=[] and include_decoding=false: nothing to benchmark; give at "
                              f"least one of methods ({', '.join(FIXED_METHODS)}), a lookahead [W, N, G] setting "
                              "or include_decoding=true")
        for i, s in enumerate(self.lookahead):
            if len(s) != 3:
                raise ConfigError(f"lookahead entry {list(s)} is not [W, N, G]")
            if list(s) in [list(x) for x in self.lookahead[:i]]:  # two rows of one setting (a new user, session 22)
                raise ConfigError(f"lookahead={[list(x) for x in self.lookahead]} gives {list(s)} twice; give each "
                                  "setting once")
            try:
                DecodingConfig(method="lookahead", window_size=s[0], ngram_size=s[1], guess_set_size=s[2])
            except ConfigError as e:  # its message names decoding.*, which the user did not set: name the triple
                raise ConfigError(f"lookahead={[list(x) for x in self.lookahead]}: (W, N, G) = {tuple(s)}: {e}") from e
        if not self.datasets:
            raise ConfigError("datasets is empty; give at least one prompt set")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit={self.limit} is not allowed; it must be >= 1")
        table = {} if self.per_category is None else self.per_category
        if not (isinstance(table, dict) and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                                for k, v in table.items())):
            raise ConfigError(f"per_category={table!r} is not allowed; give null or {{dataset: k}}, "
                              "e.g. per_category='{mt_bench: 3}'")
        self.per_category = dict(table)
        names = [d.name for d in self.datasets]
        unknown = [k for k in self.per_category if k not in names]
        if unknown:  # a name no prompt set has selected nothing, silently
            raise ConfigError(f"per_category names {unknown}, which is not among datasets ({', '.join(names)}); "
                              "give {dataset name: k} for one of them")
        bad = {k: v for k, v in self.per_category.items() if v < 1}
        if bad:
            raise ConfigError(f"per_category={bad} is not allowed; each count must be >= 1")
        for d in self.dtypes:
            if d not in DTYPES or d == "auto":
                raise ConfigError(f"dtypes entry {d!r} is not allowed; use any of float32, bfloat16, float16")
        if self.ablation and self.decoding.method != "auto":
            raise ConfigError("ablation=true switches decoding=auto's levers off one at a time; add decoding=auto")
        if self.levers is not None and not self.ablation:  # they select ablation rows: none without it
            raise ConfigError(f"levers={list(self.levers)} selects rows of the ablation, which is off; add "
                              "ablation=true (with decoding=auto)")
        bad = [x for x in self.levers or [] if x not in ABLATIONS]
        if bad:
            raise ConfigError(f"levers={bad} not allowed; use any of {', '.join(ABLATIONS)}")
        if self.prompt_lookup_num_tokens < 1:
            raise ConfigError(f"prompt_lookup_num_tokens={self.prompt_lookup_num_tokens} must be >= 1")
        out = Path(self.output_dir)
        blocked = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if blocked is not None:  # a file at output_dir or above it: an OS error after the model loaded otherwise
            what = "a file" if blocked.is_file() else "not a folder"
            where = f"output_dir={out} is" if blocked == out else f"output_dir={out}: {blocked} is"
            raise ConfigError(f"{where} {what}; give a folder path")


# ------------------------------------------------------------------------------------------ the harness

@dataclass
class Prompt:
    """One prompt: ``key`` identifies it across methods, ``category`` is ``<dataset>/<category>``."""

    key: str
    dataset: str
    category: str
    ids: list[int]


@dataclass
class Result:
    """What a runner returns: new token ids, forward passes, tokens per step (None when the method hides them)."""

    output_ids: list[int]
    steps: int
    accept_lengths: Optional[list[int]] = None
    step_tokens: Optional[list[int]] = None


@dataclass
class Method:
    """A benchmarked method: ``run(prompt_ids) -> Result``; ``step_tokens``: input tokens of a full step;
    ``baseline``: the label its outputs and speed are compared with (None: the run's baseline);
    ``dtype``: the model dtype it runs in (for the parting check)."""

    label: str
    run: Callable[[list[int]], Result]
    step_tokens: Optional[float] = None
    baseline: Optional[str] = None
    dtype: Optional[str] = None
    reset: Optional[Callable[[], None]] = None


def run_benchmark(prompts: Iterable[Prompt], methods: Sequence[Method], *, baseline: Optional[str] = None,
                  clock: Callable[[], float] = time.perf_counter, warmup: bool = True,
                  follow_up: Optional[Callable[[Prompt, list[int]], Optional[Prompt]]] = None,
                  on_prompt: Optional[Callable[[Prompt], None]] = None,
                  on_rows: Optional[Callable[[list[dict[str, Any]]], None]] = None) -> list[dict[str, Any]]:
    """Run every method on every prompt, interleaved; one row per (prompt, method).

    Method order rotates by one per prompt. ``warmup``: one untimed generation per method on the first prompt,
    then each method's ``reset`` (ours forgets the warm-up's answer, so the timed run cannot match it).
    ``baseline`` (a label): each row's ``identical`` says whether its output equals the baseline's on that prompt.
    ``follow_up(prompt, baseline_output)`` may return the next turn's prompt (built from the baseline's answer,
    so all methods see the same prompt), which is run right after. A method's ``baseline`` overrides ``baseline``
    for its row. Row keys: key, dataset, category, method, prompt_tokens, new_tokens, steps, seconds, accepted
    (sum of accept lengths or None), accept_steps, identical, fed_tokens (input tokens over all steps, or None),
    output_ids. ``on_rows(rows)`` gets each prompt's rows as soon as they exist (``run`` appends them to
    ``output_dir/rows_partial.jsonl``, so a stopped run keeps what it measured).
    """
    rows: list[dict[str, Any]] = []
    queue = list(prompts)[::-1]
    done = 0
    while queue:
        prompt = queue.pop()
        if warmup and done == 0:
            for m in methods:
                m.run(prompt.ids)
                if m.reset is not None:
                    m.reset()
        n = len(methods)
        order = [methods[(done + i) % n] for i in range(n)] if n else []
        results: dict[str, tuple[Result, float]] = {}
        for m in order:
            t0 = clock()
            res = m.run(prompt.ids)
            results[m.label] = (res, clock() - t0)
        ref = results[baseline][0].output_ids if baseline in results else None
        for m in methods:  # rows in the methods' order, whatever order they ran in
            res, seconds = results[m.label]
            own = m.baseline or baseline
            own_ref = results[own][0].output_ids if own in results else None
            rows.append({
                "key": prompt.key, "dataset": prompt.dataset, "category": prompt.category, "method": m.label,
                "prompt_tokens": len(prompt.ids), "new_tokens": len(res.output_ids), "steps": res.steps,
                "seconds": seconds,
                "accepted": None if res.accept_lengths is None else sum(res.accept_lengths),
                "accept_steps": None if res.accept_lengths is None else len(res.accept_lengths),
                "identical": None if own_ref is None else list(res.output_ids) == list(own_ref),
                "fed_tokens": None if res.step_tokens is None else sum(res.step_tokens),
                "output_ids": list(res.output_ids),
            })
        done += 1
        if on_rows is not None:  # this prompt's rows, as soon as they exist (a stopped run keeps them)
            on_rows(rows[-len(methods):])
        if on_prompt is not None:
            on_prompt(prompt)
        if follow_up is not None and ref is not None:
            nxt = follow_up(prompt, ref)
            if nxt is not None:
                queue.append(nxt)
    return rows


def _div(a: float, b: float) -> Optional[float]:
    return a / b if b else None


def aggregate(rows: Sequence[dict[str, Any]], methods: Sequence[Method], baseline: Optional[str]) -> list[dict]:
    """Per method and group (each category, each dataset, "all"): the metrics of the module docstring.

    ``speedup_mean_ratio``: mean over the group's prompts of (tokens/s) / (baseline's tokens/s on that prompt);
    ``speedup_total``: the group's tokens/s over the baseline's. Both None without a baseline. Each method is
    compared with its own ``baseline`` when it has one. ``fed_per_step``: input tokens per step (ours);
    ``partings``: outputs that part from the baseline, ``ties``: how many of them part at a rounding tie
    (rows carry ``parting`` after ``check_partings``).
    """
    groups: dict[str, list[dict]] = {}
    for r in rows:
        for g in (r["category"], r["dataset"], "all"):
            groups.setdefault(g, []).append(r)
    order = sorted(g for g in groups if "/" in g) + sorted(g for g in groups if "/" not in g and g != "all") + ["all"]
    out = []
    for g in order:
        grows = groups[g]
        for m in methods:
            mrows = [r for r in grows if r["method"] == m.label]
            if not mrows:
                continue
            own = m.baseline or baseline
            base = {r["key"]: r for r in grows if r["method"] == own}
            base_tps = _div(sum(r["new_tokens"] for r in base.values()), sum(r["seconds"] for r in base.values()))
            tokens = sum(r["new_tokens"] for r in mrows)
            seconds = sum(r["seconds"] for r in mrows)
            steps = sum(r["steps"] for r in mrows)
            known = [r for r in mrows if r["accepted"] is not None]
            accepted = ((sum(r["accepted"] for r in known), sum(r["accept_steps"] for r in known))
                        if len(known) == len(mrows) else (None, None))
            rate = metrics.rates(tokens, steps, seconds, *accepted)
            tps = rate["tokens_per_s"]
            ratios = [(r["new_tokens"] / r["seconds"]) / (base[r["key"]]["new_tokens"] / base[r["key"]]["seconds"])
                      for r in mrows if r["key"] in base and r["seconds"] and base[r["key"]]["new_tokens"]
                      and base[r["key"]]["seconds"]]
            idents = [r["identical"] for r in mrows if r["identical"] is not None]
            fed = [r for r in mrows if r.get("fed_tokens") is not None]
            partings = [r["parting"] for r in mrows if r.get("parting")]
            out.append({
                "method": m.label, "group": g, "prompts": len(mrows), "new_tokens": tokens, "seconds": seconds,
                "steps": steps, "tokens_per_s": tps,
                "speedup_mean_ratio": statistics.fmean(ratios) if ratios else None,
                "speedup_total": _div(tps, base_tps) if (tps is not None and base_tps) else None,
                "step_compression": rate["step_compression"], "mean_accepted": rate["mean_accepted_tokens"],
                "seconds_per_step": rate["seconds_per_step"], "step_tokens": m.step_tokens,
                "identical": sum(idents) if idents else None, "compared": len(idents),
                "fed_per_step": (_div(sum(r["fed_tokens"] for r in fed), sum(r["steps"] for r in fed))
                                 if fed and len(fed) == len(mrows) else None),
                "partings": len(partings), "ties": sum(1 for p in partings if p["tie"]),
            })
    return out


COLUMNS = ("method", "group", "prompts", "new_tokens", "seconds", "steps", "tokens_per_s", "speedup_mean_ratio",
           "speedup_total", "step_compression", "mean_accepted", "seconds_per_step", "step_tokens", "fed_per_step",
           "identical", "compared", "partings", "ties")


# (header, cell) of the text table (lp_runtime.report.format_table).
TABLE_COLUMNS: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("method", lambda r: r["method"]),
    ("group", lambda r: r["group"]),
    ("n", lambda r: str(r["prompts"])),
    ("tok/s", lambda r: fmt(r["tokens_per_s"], ".2f")),
    ("speedup(mean ratio)", lambda r: fmt(r["speedup_mean_ratio"], ".3f")),
    ("speedup(total)", lambda r: fmt(r["speedup_total"], ".3f")),
    ("S", lambda r: fmt(r["step_compression"], ".3f")),
    ("acc/step", lambda r: fmt(r["mean_accepted"], ".3f")),
    ("ms/step", lambda r: fmt(None if r["seconds_per_step"] is None else 1e3 * r["seconds_per_step"], ".1f")),
    ("q/step", lambda r: fmt(r["step_tokens"], "g")),
    ("fed/step", lambda r: fmt(r.get("fed_per_step"), ".2f")),
    ("identical", lambda r: "-" if r["identical"] is None else f"{r['identical']}/{r['compared']}"),
    ("ties/partings", lambda r: f"{r.get('ties', 0)}/{r.get('partings', 0)}"),
)


def plot(table: Sequence[dict], out_dir: str) -> list[str]:
    """Three PNG figures from ``aggregate``'s rows; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in table))
    groups = list(dict.fromkeys(r["group"] for r in table))
    by = {(r["method"], r["group"]): r for r in table}
    paths = []

    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(groups) * max(1, len(methods)) / 3), 4.5))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        ys = [(by.get((m, g)) or {}).get("speedup_mean_ratio") or 0.0 for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], ys, width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("speedup over HF greedy\n(mean of per-prompt ratios)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside the bars
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "speedup_per_category.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    for name, key, ylabel in (("scaling.png", "step_compression", "step compression S"),
                              ("step_latency.png", "seconds_per_step", "seconds per step")):
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for g in [g for g in groups if "/" not in g]:
            fed = lambda r: r.get("fed_per_step") or r["step_tokens"]  # noqa: E731  (measured, else nominal)
            pts = [(fed(by[(m, g)]), by[(m, g)][key], m) for m in methods
                   if (m, g) in by and fed(by[(m, g)]) and by[(m, g)][key] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=g)
                if g == "all":
                    for x, y, m in pts:
                        ax.annotate(m, (x, y), fontsize=6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("input tokens per step (log scale)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, name))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


# ------------------------------------------------------------------------------------------ the runners

def hf_method(label: str, model, *, max_new_tokens: int, eos_token_ids: Sequence[int],
              prompt_lookup_num_tokens: Optional[int] = None, max_matching_ngram_size: int = 2) -> Method:
    """transformers' ``generate``, greedy (with prompt lookup when ``prompt_lookup_num_tokens`` is set).

    Steps are counted with a forward hook (the prefill is step one: it yields the first token).
    """
    import torch
    from transformers import GenerationConfig as HFGenerationConfig

    eos = list(eos_token_ids)
    extra = {}
    if prompt_lookup_num_tokens:
        extra = dict(prompt_lookup_num_tokens=prompt_lookup_num_tokens, max_matching_ngram_size=max_matching_ngram_size)
    gen_cfg = HFGenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                 eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0, **extra)
    device = next(model.parameters()).device

    def run(prompt_ids: list[int]) -> Result:
        calls = [0]
        hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            ids = torch.tensor([prompt_ids], device=device)
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_cfg)
        finally:
            hook.remove()
        return Result(out[0, len(prompt_ids):].tolist(), calls[0], None)

    step = 1 + prompt_lookup_num_tokens if prompt_lookup_num_tokens else 1
    return Method(label, run, step, dtype=str(model.dtype).replace("torch.", ""))


ABLATIONS = {  # label suffix -> decoder options switched off (decoding=auto has them all on)
    "-copy_kv": {"copy_kv": False},            # re-feed the accepted tokens next step (the LP scheme)
    "-policy": {"policy": "feed_all"},         # feed every candidate node (and the window), fixed W, N, G
    "-cross_question": {"cross_question": False},  # no store of earlier answers (each prompt on its own)
    "-chain": {"chain": False},                # drafts end where their match ends (no re-match on the draft)
    "window": {"window": "always"},            # W = 3 fed every step where auto chose W = 0; W = 0 where it chose a window
    "+successors": {"successors": True},       # the table joins the suffix proposer (where auto chose it: -successors)
}


class WindowAlways:
    """A step policy that feeds the window every step and the nodes its ``inner`` policy picks (the window lever
    of the ablation: the cost policy alone would not feed a window that does not pay)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def choose(self, tree, *, num_pending: int, window_tokens: int):
        choice = self.inner.choose(tree, num_pending=num_pending, window_tokens=0)
        return dataclasses.replace(choice, use_window=window_tokens > 0)

    def observe(self, tree, fed_nodes, accepted_nodes) -> None:
        self.inner.observe(tree, fed_nodes, accepted_nodes)


def decoder_levers(model, decoding: DecodingConfig, options: dict[str, Any], policy) -> dict[str, Any]:
    """``Decoder`` constructor arguments for the levers in ``options`` (``ABLATIONS``) on top of ``policy``;
    unknown options raise ``ConfigError``."""
    from lp_runtime.checks import vocab_size
    from lp_runtime.policy import FeedAll
    from lp_runtime.proposers import proposers_for
    from lp_runtime.successors import successor_proposers

    kwargs: dict[str, Any] = {"step_policy": policy}
    allowed = {"policy": "feed_all", "cross_question": False, "chain": False, "copy_kv": False, "window": "always",
               "successors": True}
    for key, value in options.items():
        if key not in allowed:
            raise ConfigError(f"unknown decoder option {key!r}; use any of {', '.join(allowed)}")
        if value != allowed[key]:
            raise ConfigError(f"{key}={value!r}: only {allowed[key]!r} is a lever")
    if options.get("policy"):
        kwargs["step_policy"] = FeedAll()
    if options.get("window"):
        kwargs["step_policy"] = WindowAlways(kwargs["step_policy"] or FeedAll())
    if "copy_kv" in options:
        kwargs["copy_kv"] = False
    off = {k: False for k in ("cross_question", "chain") if k in options}
    if off:
        kwargs["proposers"] = proposers_for(decoding, **off)
    if options.get("successors"):
        kwargs["proposers"] = successor_proposers(decoding, vocab_size(model))
    return kwargs


def ours_method(label: str, model, decoding: DecodingConfig, *, max_new_tokens: int, eos_token_ids: Sequence[int],
                tokenizer=None, lp=None, options: Optional[dict[str, Any]] = None) -> Method:
    """Our ``Decoder`` (greedy, lookahead or auto), built with the levers of ``options`` (``decoder_levers``)."""
    from lp_runtime import auto
    from lp_runtime.decoder import Decoder

    policy = auto.auto_policy(model) if decoding.method == "auto" else None  # the caller builds the cost policy
    dec = Decoder(model, decoding, eos_token_ids=eos_token_ids, tokenizer=tokenizer, lp=lp,
                  **decoder_levers(model, decoding, options or {}, policy))

    def run(prompt_ids: list[int]) -> Result:
        out = dec.generate(prompt_ids, max_new_tokens=max_new_tokens)
        return Result(list(out.output_ids), out.decoding_steps, list(out.accept_lengths), list(out.step_tokens))

    return Method(label, run, None, dtype=str(model.dtype).replace("torch.", ""), reset=dec.forget_answers)


def decoding_label(d: DecodingConfig) -> str:
    if d.method == "greedy":
        return GREEDY
    return f"{d.method} W{d.window_size} N{d.ngram_size} G{d.guess_set_size}"  # auto, lookahead or paper


def _fill_step_tokens(methods: Sequence[Method], decodings: dict[str, DecodingConfig], table: Sequence[dict]) -> None:
    """Our methods' tokens per full step, with pending = their measured mean accepted tokens (rounded)."""
    acc = {r["method"]: r["mean_accepted"] for r in table if r["group"] == "all"}
    for m in methods:
        d = decodings.get(m.label)
        if d is None:
            continue
        if d.method == "greedy":
            m.step_tokens = 1
        else:
            pending = max(1, round(acc.get(m.label) or 1))
            m.step_tokens = d.step_tokens(num_pending=min(pending, d.ngram_size), num_candidates=d.guess_set_size)


def select_per_category(questions: Sequence[data.Question], k: int) -> list[data.Question]:
    """The first ``k`` questions of each category, in file order (MT-Bench lists its 8 categories in blocks of 10,
    so its first 20 questions cover 2 categories only).

    >>> qs = [data.Question(i, c, ["t"]) for i, c in enumerate("aaabbbc")]
    >>> [q.question_id for q in select_per_category(qs, 2)]
    [0, 1, 3, 4, 6]
    """
    seen: dict[str, int] = {}
    out = []
    for q in questions:
        if seen.get(q.category, 0) < k:
            seen[q.category] = seen.get(q.category, 0) + 1
            out.append(q)
    return out


def load_prompts(cfg: BenchConfig, tokenizer) -> tuple[list[Prompt], dict[str, data.Question]]:
    """First turns of every dataset's questions as ``Prompt``s, and the questions by prompt key."""
    prompts, questions = [], {}
    for ds in cfg.datasets:
        name = ds.name if ds.name != "jsonl" else Path(ds.path or "jsonl").stem
        k = cfg.per_category.get(name)
        limit = cfg.limit if cfg.limit is not None else ds.limit
        chosen = data.load_questions(dataclasses.replace(ds, limit=None if k else limit))
        if k:
            chosen = select_per_category(chosen, k)[:limit]
        for q in chosen:
            key = f"{name}/{q.question_id}/0"
            questions[key] = q
            prompts.append(Prompt(key, name, f"{name}/{q.category}", data.build_prompt(tokenizer, q, [])))
    return prompts, questions


def is_rounding_tie(gap: float, top: float, dtype: str) -> bool:
    """Whether two greedy decodings may part at a next-token distribution whose top-2 logit gap is ``gap`` (top
    logit ``top``): in float32 a near-tie (gap < 1e-4, docs/design.md section 6); in bfloat16 / float16 a rounding tie,
    gap <= 8 units in the last place of ``top`` in that dtype (README "Precision"; tests/test_exactness_tiny F1).

    >>> is_rounding_tie(0.0625, 20.0, "bfloat16"), is_rounding_tie(1.5, 20.0, "bfloat16")   # ulp(20) = 0.125
    (True, False)
    """
    if dtype == "float32":
        return gap < 1e-4
    mantissa = {"bfloat16": 7, "float16": 10}[dtype]
    ulp = 2.0 ** (math.floor(math.log2(abs(top))) - mantissa) if top else 2.0 ** -mantissa
    return gap <= 8 * ulp


def check_partings(rows: list[dict], methods: Sequence[Method], models_by_dtype: dict[str, Any],
                   prompts: dict[str, list[int]], baseline: str) -> None:
    """For every row whose output parts from its baseline's, add ``parting`` = {index, ours, theirs, gap, top,
    tie}: the top-2 logit gap of the model (in the method's dtype) after the prompt plus the baseline's tokens
    before the parting point, and whether that is a rounding tie (``is_rounding_tie``). Rows that stop early
    without a differing token part at the shorter length."""
    import torch

    by_label = {m.label: m for m in methods}
    refs = {(r["key"], r["method"]): r["output_ids"] for r in rows}
    for r in rows:
        m = by_label[r["method"]]
        own = m.baseline or baseline
        ref = refs.get((r["key"], own))
        if ref is None or r["identical"] in (None, True) or m.dtype not in models_by_dtype:
            continue
        ours = r["output_ids"]
        i = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        model = models_by_dtype[m.dtype]
        prefix = list(prompts[r["key"]]) + list(ref[:i])
        with torch.inference_mode():
            logits = model(torch.tensor([prefix], device=next(model.parameters()).device)).logits[0, -1].float()
        top2 = torch.topk(logits, 2).values
        gap, top = float(top2[0] - top2[1]), float(top2[0])
        r["parting"] = {"index": i, "ours": ours[i] if i < len(ours) else None,
                        "theirs": ref[i] if i < len(ref) else None, "gap": gap, "top": top,
                        "tie": is_rounding_tie(gap, top, m.dtype)}


def run(cfg: BenchConfig, *, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Load the model once per dtype, benchmark every method, write results and figures; return the results dict."""
    from lp_runtime import auto, checks, models
    from lp_runtime.decoder import Decoder
    from lp_runtime.latency import dtype_name
    from lp_runtime.parallel import setup_parallel

    ctx = setup_parallel(cfg.parallel)
    if ctx.dp_size > 1:
        raise ConfigError(f"the benchmark runs one LP group; launch {cfg.parallel.lp} ranks (world = parallel.lp)")
    bars = dict(progress=cfg.progress and ctx.is_writer, weight_bars=False)  # as the main job: no "Loading weights"
    model, tok = models.load_model(cfg.model, **bars)
    eos = checks.eos_token_ids(model, tok, cfg.generation.eos_token_ids)
    model_label = models.model_label(cfg.model, models.model_fingerprint(cfg.model))
    prompts, questions = load_prompts(cfg, tok)
    n_new = cfg.generation.max_new_tokens
    dtypes = list(cfg.dtypes) or [dtype_name(model)]
    models_by_dtype = {}
    for d in dtypes:
        models_by_dtype[d] = model if d == dtype_name(model) else models.load_model(
            dataclasses.replace(cfg.model, dtype=d), **bars)[0]
    multi = len(dtypes) > 1
    named = (lambda d, label: f"{d} {label}") if multi else (lambda d, label: label)  # noqa: E731

    methods: list[Method] = []
    decodings: dict[str, DecodingConfig] = {}
    autos: dict[str, Any] = {}
    for d in dtypes:
        m_d = models_by_dtype[d]
        base = named(d, HF_GREEDY) if HF_GREEDY in cfg.methods else None
        mine: list[tuple[str, DecodingConfig, dict]] = []
        if GREEDY in cfg.methods:
            mine.append((GREEDY, DecodingConfig(method="greedy"), {}))
        for w, n, g in cfg.lookahead:
            dc = DecodingConfig(method="lookahead", window_size=w, ngram_size=n, guess_set_size=g, max_depth=10)
            mine.append((decoding_label(dc), dc, {}))
        if cfg.include_decoding:
            dc = cfg.decoding
            if dc.method == "auto":
                dc, autos[d] = auto.resolve_auto(m_d, tok, dc, model_name=model_label, make_decoder=lambda dd, p, m=m_d:
                                                 Decoder(m, dd, eos_token_ids=eos, tokenizer=tok, step_policy=p))
                mine.append((decoding_label(dc), dc, {}))
                if cfg.ablation:
                    for suffix, opts in ABLATIONS.items():
                        if cfg.levers is not None and suffix not in cfg.levers:
                            continue
                        if suffix == "window" and dc.window_size:  # auto feeds a window: switch it off
                            mine.append((f"{decoding_label(dc)} W->0", dataclasses.replace(dc, window_size=0), {}))
                        elif suffix == "window":  # auto has none: W = 3 fed every step
                            mine.append((f"{decoding_label(dc)} W->3 always", dataclasses.replace(dc, window_size=3),
                                         opts))
                        elif suffix == "+successors" and dc.successors_on(1):  # auto chose the table: without it
                            mine.append((f"{decoding_label(dc)} -successors",
                                         dataclasses.replace(dc, successors="false"), {}))
                        else:
                            mine.append((f"{decoding_label(dc)} {suffix}", dc, opts))
            elif decoding_label(dc) not in [x[0] for x in mine]:
                mine.append((decoding_label(dc), dc, {}))
        if HF_GREEDY in cfg.methods:
            methods.append(hf_method(named(d, HF_GREEDY), m_d, max_new_tokens=n_new, eos_token_ids=eos))
        if HF_PROMPT_LOOKUP in cfg.methods:
            methods.append(hf_method(named(d, HF_PROMPT_LOOKUP), m_d, max_new_tokens=n_new, eos_token_ids=eos,
                                     prompt_lookup_num_tokens=cfg.prompt_lookup_num_tokens,
                                     max_matching_ngram_size=cfg.max_matching_ngram_size))
        for label, dc, opts in mine:
            methods.append(ours_method(named(d, label), m_d, dc, max_new_tokens=n_new, eos_token_ids=eos,
                                       tokenizer=tok, lp=ctx.lp_group, options=opts))
            decodings[named(d, label)] = dc
        for m in methods:
            if base and m.baseline is None and m.dtype == d:
                m.baseline = base
    baseline = methods[0].label

    answers: dict[str, list[str]] = {}  # prompt key -> the baseline's answers to the turns before it

    def follow_up(prompt: Prompt, ref_ids: list[int]) -> Optional[Prompt]:
        q = questions[prompt.key]
        stem, turn = prompt.key.rsplit("/", 1)
        turn = int(turn) + 1
        if turn >= len(q.turns):
            return None
        key = f"{stem}/{turn}"
        questions[key] = q
        answers[key] = answers.get(prompt.key, []) + [tok.decode(ref_ids, skip_special_tokens=True)]
        return Prompt(key, prompt.dataset, prompt.category, data.build_prompt(tok, q, answers[key]))

    from tqdm import tqdm

    prompt_ids: dict[str, list[int]] = {}

    def seen(p: Prompt) -> None:
        prompt_ids[p.key] = p.ids
        if p.key.endswith("/0"):
            bar.update(1)

    bar = tqdm(total=len(prompts), desc="prompts", unit="p", disable=not (cfg.progress and ctx.is_writer))
    partial = os.path.join(cfg.output_dir, "rows_partial.jsonl")  # every finished prompt's rows, appended

    def keep(prompt_rows: list[dict[str, Any]]) -> None:
        if ctx.is_writer:
            os.makedirs(cfg.output_dir, exist_ok=True)
            with open(partial, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in prompt_rows)

    if ctx.is_writer:
        keep_earlier_rows(partial)  # a new run starts a new file
    rows = run_benchmark(prompts, methods, baseline=baseline, clock=clock, warmup=cfg.warmup, follow_up=follow_up,
                         on_prompt=seen, on_rows=keep)
    bar.close()
    check_partings(rows, methods, models_by_dtype, prompt_ids, baseline)
    table = aggregate(rows, methods, baseline)
    _fill_step_tokens(methods, decodings, table)
    table = aggregate(rows, methods, baseline)
    extra = {"baseline": baseline, "dtypes": dtypes, "auto_decoding": autos or None,
             "methods": {m.label: {"step_tokens": m.step_tokens, "baseline": m.baseline or baseline, "dtype": m.dtype,
                                   "decoding": dataclasses.asdict(decodings[m.label]) if m.label in decodings else None}
                         for m in methods},
             "config": dataclasses.asdict(cfg), "versions": metrics.versions(),
             "device": str(next(model.parameters()).device), "torch_threads": _threads()}
    result = {**extra, "table": table, "rows": rows}
    if ctx.is_writer:
        paths = write_results(cfg.output_dir, table, rows, extra, columns=COLUMNS, name="results")
        paths["table"] = os.path.join(cfg.output_dir, "table.txt")
        Path(paths["table"]).write_text(format_table(table, columns=TABLE_COLUMNS) + "\n", encoding="utf-8")
        if cfg.figures:
            paths.update({f"figure{i}": p for i, p in enumerate(plot(table, cfg.output_dir))})
        print(format_table(table, groups=[g for g in dict.fromkeys(r["group"] for r in table) if "/" not in g],
                           columns=TABLE_COLUMNS))
        print("\n".join(f"{k}: {v}" for k, v in paths.items()))
        result["paths"] = paths
    return result


def _threads() -> int:
    import torch

    return torch.get_num_threads()


# ------------------------------------------------------------------------------------------ entry point

def _job(dict_cfg) -> None:
    cfg = config_to_object(dict_cfg)  # refuses keys no setting has
    assert isinstance(cfg, BenchConfig)
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:  # one results folder per sweep point
        cfg.output_dir = os.path.join(cfg.output_dir, "sweep", f"{hc.job.num}_{hc.job.override_dirname}")
    run(cfg)


def register_schema() -> None:
    """Register ``BenchConfig`` (with ``RunConfig``'s groups) as the schema of ``conf/bench.yaml``."""
    from hydra.core.config_store import ConfigStore

    register_configs()
    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


INTERRUPTED = ("interrupted; no tables or figures were written; the rows of the prompts finished so far are in "
               "rows_partial.jsonl in output_dir")


def keep_earlier_rows(partial: str) -> Optional[str]:
    """Move a stopped run's ``rows_partial.jsonl`` aside to the next free ``rows_partial-N.jsonl`` (printed), so
    that a new run starts a new file without deleting what the stopped one measured; the new path, or None."""
    if not os.path.exists(partial) or os.path.getsize(partial) == 0:
        return None
    from lp_runtime.answers import next_free

    kept = next_free(partial[: -len(".jsonl")], ".jsonl")
    os.rename(partial, kept)
    print(f"an earlier stopped run's rows (rows_partial.jsonl) are kept as {kept}")
    return kept


def main() -> None:
    register_schema()
    cli.main(cli.hydra_app("bench", _job), interrupted=INTERRUPTED)


if __name__ == "__main__":
    main()
