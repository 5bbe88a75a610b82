"""The product's defaults are the same in code and in conf/: ``DecodingConfig()`` is what ``conf/generate.yaml``
composes (``decoding=auto``), and each preset file holds the values the code documents for it."""
from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fakes import lookahead
from lp_runtime.cli import CONF_DIR
from lp_runtime.config import PRESETS, DecodingConfig, RunConfig, register_configs


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
                                         "pool_from_prompt": True, "seed": 0, "max_depth": 24}
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
        "seed": 0, "max_depth": 10}
    assert ('``DecodingConfig(method="lookahead")`` is\n    ``decoding=lookahead``\'s W=0, N=4, G=2, max_depth=10'
            in DecodingConfig.__doc__)
