"""Faults a new user met on a fresh clone: each is checked for its kind, with the exact message, in seconds.

Config composition goes through Hydra's compose API (no model); command-line checks run
``python -m lp_runtime.generate`` on faults refused before the model loads; the rest use the tiny model folder
of ``conftest.tiny_model_dir`` or no model at all.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lp_runtime.bench import BenchConfig
from lp_runtime.config import ConfigError, GenerationConfig, ModelConfig, RunConfig
from lp_runtime.generate import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
CONF = Path(CONF_DIR)
PY = sys.executable


def cli(*args: str, cwd=None, module: str = "lp_runtime.generate", timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([PY, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a refused run (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


def _compose(config_name: str, overrides: list[str], hydra: bool = False):
    from lp_runtime.bench import _hydra_entry

    _hydra_entry()  # registers run_schema and bench_schema
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name, overrides=overrides, return_hydra_config=hydra)


# ------------------------------------------------------------------ 1. every conf file composes and validates
GROUP_OPTIONS = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml") if p.parent.name != "hydra")


@pytest.mark.parametrize("group,option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_group_option_composes(group, option):
    extra = ["dataset.path=questions.jsonl"] if (group, option) == ("dataset", "jsonl") else []
    cfg = _compose("generate", [f"{group}={option}", *extra])
    assert isinstance(OmegaConf.to_object(cfg), RunConfig)


@pytest.mark.parametrize("launcher", sorted(p.stem for p in (CONF / "hydra" / "launcher").glob("*.yaml")))
def test_every_launcher_composes(launcher):
    cfg = _compose("generate", [f"hydra/launcher={launcher}"], hydra=True)
    assert cfg.hydra.launcher.nodes == 1


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_every_top_level_config_composes(name):
    cfg = _compose(name, [])
    assert isinstance(OmegaConf.to_object(cfg), BenchConfig if name.startswith("bench") else RunConfig)


# ------------------------------------------------------------------ 2. a dict override into a null dict field
@pytest.mark.parametrize("sampling", ["greedy", "default", "model", "mt_bench"])
def test_category_temperature_override(sampling):
    cfg = _compose("generate", [f"sampling={sampling}", "sampling.category_temperature={writing: 0.3}"])
    assert OmegaConf.to_object(cfg).sampling.category_temperature["writing"] == 0.3
    cfg = _compose("generate", [f"sampling={sampling}", "sampling.category_temperature={writing: -1}"])
    with pytest.raises(ConfigError) as e:
        OmegaConf.to_object(cfg)
    assert str(e.value) == "sampling.category_temperature['writing']=-1 is not allowed; it must be >= 0"


def test_category_temperature_not_a_table():
    cfg = _compose("generate", ["sampling.category_temperature=[1]"])
    with pytest.raises(ConfigError) as e:
        OmegaConf.to_object(cfg)
    assert str(e.value) == ("sampling.category_temperature=[1] is not allowed; give null or {category: temperature}, "
                            "e.g. sampling.category_temperature='{writing: 0.7, math: 0}'")
