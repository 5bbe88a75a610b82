"""The product's defaults are the same in code and in conf/: ``DecodingConfig()`` is what ``conf/generate.yaml``
composes (``decoding=auto``), and each preset file holds the values the code documents for it."""
from __future__ import annotations

import dataclasses
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fakes import lookahead
from lp_runtime.cli import CONF_DIR
from lp_runtime import answers
from lp_runtime.config import (PRESETS, ConfigError, DatasetConfig, DecodingConfig, ModelConfig, OutputConfig,
                               ParallelConfig, RunConfig, SamplingConfig, register_configs)


def _composed(*overrides: str) -> RunConfig:
    register_configs()  # the schema conf/generate.yaml names (run_schema), as the entry point registers it
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return OmegaConf.to_object(compose("generate", overrides=list(overrides)))


def _fields(cfg: DecodingConfig) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(DecodingConfig)}


def test_decoding_default_is_the_composed_main_job_default():
    """Field by field: the Python API's ``DecodingConfig()`` is the CLI's ``decoding: auto`` (conf/decoding/auto.yaml)."""
    composed = _composed().decoding
    assert _fields(composed) == _fields(DecodingConfig())
    assert _fields(DecodingConfig()) == {"method": "auto", "window_size": 0, "ngram_size": 6, "guess_set_size": 4,
                                         "pool_from_prompt": True, "seed": 0, "max_depth": 24, "successors": "auto"}
    assert RunConfig().decoding == composed


@pytest.mark.parametrize("method", sorted(PRESETS))
def test_each_preset_file_is_the_codes_preset(method):
    """conf/decoding/<method>.yaml = ``DecodingConfig(method=...)`` (config.PRESETS), so a Python caller's fixed
    setting and the CLI's agree; a field given explicitly is kept."""
    assert _fields(_composed(f"decoding={method}").decoding) == _fields(DecodingConfig(method=method))
    assert _fields(DecodingConfig(method=method)) == {"method": method, "pool_from_prompt": True, "seed": 0,
                                                      **PRESETS[method]}
    assert DecodingConfig(method=method, window_size=3, max_depth=2).max_depth == 2


def test_lookahead_preset_is_the_documented_fixed_setting():
    """The values DecodingConfig's docstring and README give for ``decoding=lookahead`` (and fakes.lookahead())."""
    assert _fields(DecodingConfig(method="lookahead")) == _fields(lookahead()) == {
        "method": "lookahead", "window_size": 0, "ngram_size": 4, "guess_set_size": 2, "pool_from_prompt": True,
        "seed": 0, "max_depth": 10, "successors": "auto"}
    assert ('``DecodingConfig(method="lookahead")`` is\n    ``decoding=lookahead``\'s W=0, N=4, G=2, max_depth=10'
            in DecodingConfig.__doc__)


@pytest.mark.parametrize("given, expected", [(None, "auto"), ("auto", "auto"), (True, "true"), ("True", "true"),
                                             (False, "false"), ("false", "false")])
def test_successors_takes_yaml_and_cli_booleans(given, expected):
    assert DecodingConfig(successors=given).successors == expected


def test_successors_from_the_command_line_and_the_paper_preset():
    assert _composed("decoding.successors=true").decoding.successors == "true"
    assert _composed("decoding=lookahead", "decoding.successors=false").decoding.successors == "false"
    assert _composed("decoding=paper").decoding.successors == "false"


@pytest.mark.parametrize("setting, message", [
    (dict(successors="yes"), "decoding.successors='yes' is not allowed; use one of auto, true, false"),
    (dict(successors=2), "decoding.successors='2' is not allowed; use one of auto, true, false"),
    (dict(method="paper", successors=True),
     "decoding.successors=true is not allowed with decoding=paper (the paper's algorithm as published has no successor "
     "table); use decoding=lookahead or decoding=auto with it, or decoding.successors=false"),
    # decoding=auto with G = 0 decoded plain greedy without a word (a new user, 2026-12-04); the table alone is a choice
    (dict(guess_set_size=0, successors=False), "decoding.guess_set_size=0 with decoding.successors=false leaves "
     "decoding=auto nothing to propose (its suffix lookup "
     "proposes G n-grams, and the window's n-grams are verified only as candidates); set G > 0, "
     "decoding.successors=true (the successor table alone), or use decoding=greedy"),
])
def test_successors_refuses_bad_values(setting, message):
    with pytest.raises(ConfigError) as e:
        DecodingConfig(**setting)
    assert str(e.value) == message


@pytest.mark.parametrize("method, successors, on_at_lp", [
    ("auto", "auto", {1: False, 2: True, 8: True}),   # auto: on under LP only (docs/benchmarks.md 6d)
    ("lookahead", "auto", {1: False, 2: True}),
    ("lookahead", "true", {1: True, 2: True}),
    ("auto", "false", {1: False, 8: False}),
    ("paper", "auto", {1: False, 8: False}),          # the published algorithm: never
    ("greedy", "true", {1: False, 8: False}),         # no candidate tree to join
])
def test_successors_on(method, successors, on_at_lp):
    assert DecodingConfig(guess_set_size=0, successors="true").successors_on(1)  # auto, G = 0: the table alone
    cfg = DecodingConfig(method=method, successors=successors)
    assert {k: cfg.successors_on(k) for k in on_at_lp} == on_at_lp


@pytest.mark.parametrize("method", ["auto", "lookahead", "paper"])
def test_answers_written_before_successors_existed_still_resume(method):
    """A settings record without ``decoding.successors`` (written before the key existed) reads as the recorded
    method's default, so the run resumes with that default; another value is refused."""
    cfg = RunConfig(decoding=DecodingConfig(method=method))
    current = answers.run_settings(cfg, model_fingerprint="ab", world_size=2)
    old = {k: v for k, v in current.items() if k != "decoding.successors"}
    assert answers.differences(old, current) == []
    changed = "true" if method != "paper" else "auto"
    other = answers.run_settings(RunConfig(decoding=DecodingConfig(method=method, successors=changed)),
                                 model_fingerprint="ab", world_size=2)
    # paper reads no successor setting (its candidates are the pool's n-grams): a resume ignores it (session 22)
    want = [] if method == "paper" else [("decoding.successors", current["decoding.successors"], changed)]
    assert answers.differences(old, other) == want


def test_greedy_runs_ignore_successors():
    cfg = RunConfig(decoding=DecodingConfig(method="greedy"))
    current = answers.run_settings(cfg, model_fingerprint="ab", world_size=1)
    assert "decoding.successors" in answers.GREEDY_IGNORES and current["decoding.successors"] == "auto"
    assert answers.differences({**current, "decoding.successors": "true"}, current) == []


@pytest.mark.parametrize("make, message", [
    (lambda: DecodingConfig(method="lookahead", window_size="3"),
     "decoding.window_size='3' is not allowed; it must be an integer"),
    (lambda: DecodingConfig(method="lookahead", max_depth=2.0), "decoding.max_depth=2.0 is not allowed; it must be an integer"),
    (lambda: SamplingConfig(temperature=float("inf")), "sampling.temperature=inf is not allowed; it must be a finite number"),
    (lambda: SamplingConfig(temperature="0.7"), "sampling.temperature='0.7' is not allowed; it must be a finite number"),
    (lambda: SamplingConfig(top_k=2.5), "sampling.top_k=2.5 is not allowed; it must be an integer"),
    (lambda: SamplingConfig(top_p=float("nan")), "sampling.top_p=nan is not allowed; it must be a finite number"),
    # an int too large for a float raised OverflowError from math.isfinite (a review, 2026-12-05)
    (lambda: SamplingConfig(min_p=10**400), f"sampling.min_p={10**400} is not allowed; it must be a finite number"),
    (lambda: SamplingConfig(category_temperature={"math": 10**400}), f"sampling.category_temperature['math']="
     f"{10**400} is not allowed; a temperature is a finite number: 0 (greedy) or >= 1e-06"),
    # a flag of "no" was true, a name of 3 was taken (a new user, 2026-12-04)
    (lambda: DecodingConfig(method="lookahead", pool_from_prompt="no"),
     "decoding.pool_from_prompt='no' is not allowed; it must be True or False"),
    (lambda: ModelConfig(trust_remote_code="yes"), "model.trust_remote_code='yes' is not allowed; it must be True or False"),
    (lambda: ModelConfig(name=3), "model.name=3 is not allowed; it must be a string (or None)"),
    (lambda: DatasetConfig(first_turn_only=1), "dataset.first_turn_only=1 is not allowed; it must be True or False"),
    (lambda: SamplingConfig(from_model="true"), "sampling.from_model='true' is not allowed; it must be True or False"),
    (lambda: ParallelConfig(debug_check=None), "parallel.debug_check=None is not allowed; it must be True or False"),
    # a second pass (2026-12-04): tracebacks from comparisons, values taken through str(), groups given as strings
    (lambda: ParallelConfig(lp="2"), "parallel.lp='2' is not allowed; it must be an integer"),
    (lambda: ParallelConfig(timeout_s=None), "parallel.timeout_s=None is not allowed; it must be a number of seconds "
     ">= 1 and <= 604800 (a week)"),
    # 0.001 s passed and ended in a 140-line DistStoreError at the ranks' rendezvous (a new user, 2026-12-07)
    (lambda: ParallelConfig(timeout_s=0.001), "parallel.timeout_s=0.001 is not allowed; it must be a number of "
     "seconds >= 1 and <= 604800 (a week)"),
    (lambda: DatasetConfig(limit=2.5), "dataset.limit=2.5 is not allowed; it must be an integer (or None)"),
    (lambda: SamplingConfig(suppress_tokens=[-1]),
     "sampling.suppress_tokens=[-1] is not allowed; it must be a list of token ids >= 0"),
    (lambda: OutputConfig(path=["a"]), "output.path=['a'] is not allowed; it must be a string"),
    (lambda: RunConfig(model="yes"), "model='yes' is not allowed; give a ModelConfig"),
    (lambda: RunConfig(progress="no"), "progress='no' is not allowed; it must be True or False"),
    (lambda: RunConfig(output=OutputConfig), "output=<class 'lp_runtime.config.OutputConfig'> is not allowed; give "
                                             "an OutputConfig"),
    # session 22: a blank label was taken (the answers carried "" as their model)
    (lambda: ModelConfig(name=" "), "model.name=' ' is blank; give the label answers and reports are to carry "
                                    "(model.name=my-model), or leave it null for the model's own"),
])
def test_python_api_values_of_the_wrong_type_get_one_config_error(make, message):
    """The Python API takes any value (the command line has Hydra's typed schema): a string W raised a bare
    TypeError from a comparison, and temperature=inf sampled uniformly at random (a new user, 2026-12-02)."""
    with pytest.raises(ConfigError) as e:
        make()
    assert str(e.value) == message and isinstance(e.value, ValueError)


def test_python_api_takes_numpy_numbers_as_python_ones():
    """np.float32(0.5) was refused as "not a finite number" while np.int32 passed elsewhere (a new user,
    2026-12-02); numpy scalars are numbers, stored as Python ones (settings records are JSON)."""
    import numpy as np

    s = SamplingConfig(temperature=np.float32(0.5), top_k=np.int64(5), top_p=np.float64(0.9))
    assert (s.temperature, s.top_k, s.top_p) == (0.5, 5, 0.9)
    assert [type(v) for v in (s.temperature, s.top_k, s.top_p)] == [float, int, float]
    d = DecodingConfig(method="lookahead", window_size=np.int32(3))
    assert d.window_size == 3 and type(d.window_size) is int
    # and everywhere else (a second pass, 2026-12-04: seed, max_new_tokens, eos ids, category temperatures, bools)
    from lp_runtime.config import GenerationConfig

    s = SamplingConfig(seed=np.int64(2), category_temperature={"writing": np.float32(0.5)})
    g = GenerationConfig(max_new_tokens=np.int64(2), eos_token_ids=[np.int64(3)])
    d = DecodingConfig(method="lookahead", pool_from_prompt=np.True_)
    assert (s.seed, s.category_temperature, g.max_new_tokens, g.eos_token_ids, d.pool_from_prompt) == (
        2, {"writing": 0.5}, 2, [3], True)
    assert [type(v) for v in (s.seed, g.max_new_tokens, g.eos_token_ids[0], d.pool_from_prompt)] == [int, int, int, bool]
    inf = np.float32("inf")
    with pytest.raises(ConfigError) as e:
        SamplingConfig(temperature=inf)
    assert str(e.value) == f"sampling.temperature={inf!r} is not allowed; it must be a finite number"


def test_a_quoted_home_path_is_expanded():
    """'output.path="~/a.jsonl"' (the shell expands no ~ after '=') made a folder named ~ in the working directory;
    output and question paths now expand it, as model.path does."""
    from lp_runtime.config import DatasetConfig, OutputConfig

    home = os.path.expanduser("~")
    out = OutputConfig(path="~/a.jsonl", summary_path="~/s.json")
    assert (out.path, out.summary_path) == (f"{home}/a.jsonl", f"{home}/s.json")
    assert DatasetConfig(name="jsonl", path="~/q.jsonl").path == f"{home}/q.jsonl"


def test_a_setting_the_method_does_not_read_is_refused_only_when_given():
    """decoding=paper reads no max_depth: given on the command line it is refused (tests/test_cli.py: paper_depth),
    but ``decoding.method=paper`` over the default group's max_depth 24 runs (a review, 2026-12-05: a first version
    refused every paper config whose max_depth was not 10, that one included)."""
    from lp_runtime.jobs import check_ignored_keys

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        composed = compose("generate", overrides=["decoding.method=paper"])
        given = compose("generate", overrides=["decoding=paper", "decoding.max_depth=30"])
    check_ignored_keys(composed, {"decoding.method"})
    assert OmegaConf.to_object(composed).decoding.max_depth == 24
    check_ignored_keys(given, {"decoding.ngram_size"})  # max_depth not given on the command line: not refused
    with pytest.raises(ConfigError, match=r"^decoding.max_depth=30 is ignored under decoding=paper"):
        check_ignored_keys(given, {"decoding", "decoding.max_depth"})


def test_sweep_jobs_expands_a_glob_over_a_config_group():
    """``decoding=glob([greedy,looka*])``: expanding it needs Hydra's config loader; without it the sweep's
    up-front checks raised inside Hydra's callback, which Hydra turns into a warning, and every job ran unchecked
    (a new user, 2026-12-05)."""
    from lp_runtime.jobs import sweep_jobs

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        jobs, swept = sweep_jobs(["decoding=glob([greedy,looka*])", "decoding.window_size=3"])
    assert (jobs, swept) == ([["decoding=greedy", "decoding.window_size=3"],
                              ["decoding=lookahead", "decoding.window_size=3"]], {"decoding"})


def test_model_path_may_be_a_pathlib_path(tmp_path):
    """ModelConfig(path=Path(folder)) was refused as "give ... a local folder" (a new user, 2026-12-07)."""
    assert ModelConfig(path=tmp_path).path == str(tmp_path)


def test_one_suppressed_token_id_is_a_list_of_one():
    """sampling.suppress_tokens=5 got Hydra's "int is not a ListConfig" where generation.eos_token_ids=7 is [7] (a
    new user, 2026-12-07)."""
    assert SamplingConfig(suppress_tokens=5).suppress_tokens == [5]
