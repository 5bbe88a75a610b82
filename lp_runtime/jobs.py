"""Hydra job context of the generate entry point: per-job output paths in a sweep, ranks of a submitit job.

- ``--multirun``: every job of a sweep gets its own ``answers.jsonl`` (with its summary and settings) in its job
  folder, ``<hydra.sweep.dir>/<job number>/``, unless ``output.path`` is given on the command line. A single run
  keeps ``output.path`` as configured (default ``outputs/answers.jsonl``).
- Hydra's submitit launcher (``hydra/launcher=slurm`` or ``submitit_local``, see ``conf/hydra/launcher/``) runs the
  job function once per task: each task is one rank. Under Slurm, ``lp_runtime.distributed`` reads the ranks from
  ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` and the rendezvous host from the node list, as for the
  scripts in ``launch/``; under the local executor the ranks come from submitit's own variables. Either way the
  rendezvous port is derived from the job id, so two jobs of a sweep that share a node do not collide.
"""
from __future__ import annotations

import os
import re
from typing import Any


def is_multirun() -> bool:
    """True inside a job of a Hydra ``--multirun`` sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def command_line_keys() -> set[str]:
    """Keys set by this job's command-line (or sweep) overrides, e.g. ``{"output.path", "decoding.window_size"}``."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    return {o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task}


def apply_job_output(dict_cfg: Any) -> None:
    """In a sweep job, point ``output.path`` at ``<job folder>/answers.jsonl`` unless the command line set it."""
    if not is_multirun() or "output.path" in command_line_keys():
        return
    from hydra.core.hydra_config import HydraConfig

    dict_cfg.output.path = os.path.join(HydraConfig.get().runtime.output_dir, "answers.jsonl")


def port_for_job(job_id: str, base: int = 20000, span: int = 20000) -> int:
    """A rendezvous port in ``[base, base + span)`` from a job id (``"4242"``, ``"4242_3"`` for an array task)."""
    digits = re.sub(r"\D", "", job_id)
    return base + (int(digits) if digits else 0) % span


def submitit_rank_env() -> None:
    """Inside a submitit job, set what ``lp_runtime.distributed`` needs to join the job's ranks; else nothing.

    Slurm: ``MASTER_PORT`` (from the job id, unless set) and ``LOCAL_RANK`` (the task's GPU); the ranks and the host
    come from Slurm's variables.
    Local executor: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1`` and ``MASTER_PORT`` from
    submitit's ``SUBMITIT_LOCAL_*`` variables. A torchrun-started process (``RANK`` set) is left alone.
    """
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    if not executor or "RANK" in os.environ:
        return
    import submitit

    env = submitit.JobEnvironment()
    os.environ.setdefault("MASTER_PORT", str(port_for_job(str(env.job_id))))
    os.environ.setdefault("LOCAL_RANK", str(env.local_rank))  # models.resolve_device: cuda:LOCAL_RANK
    if executor == "local" and env.num_tasks > 1:
        os.environ.update(RANK=str(env.global_rank), WORLD_SIZE=str(env.num_tasks))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
