"""Hydra job context of the generate entry point: checks of the command line and of every job of a sweep before
the first runs (``ValidateSweep``, a Hydra callback in ``conf/generate.yaml``), each sweep job's own
``answers.jsonl``, and the ranks of a submitit job (one task per rank, the rendezvous port from the job id)."""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator, Optional

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict, read_write

from lp_runtime import answers
from lp_runtime.cli import (CONFIG_FLAGS, INFO_CHOICES, INFO_FLAGS, MULTIRUN_FLAGS, error_exit, fail, is_bad_input,
                            launcher_is, one_line, override_key, override_positions, sweep_point, take_signals)
from lp_runtime.config import MODEL_TAKEN, ConfigError, RunConfig, model_sampling_refusal, to_object


def command_line_overrides() -> list[str]:
    """This job's command-line (or sweep) overrides, e.g. ``["output.path=a.jsonl", "decoding.window_size=3"]``."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def job_output(output_dir: str, overrides: list[str]) -> Optional[str]:
    """A sweep job's answers file, ``<output_dir (its folder)>/answers.jsonl``; None when ``overrides`` set
    ``output.path``."""
    return None if "output.path" in {override_key(o) for o in overrides} else os.path.join(output_dir, "answers.jsonl")


def apply_job_output(dict_cfg: Any) -> None:
    """In a sweep job, point ``output.path`` at ``job_output``'s file unless the command line set it."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    path = job_output(HydraConfig.get().runtime.output_dir, command_line_overrides()) if multirun else None
    if path is not None:
        dict_cfg.output.path = path


def port_for_job(job_id: str, base: int = 20000, span: int = 20000) -> int:
    """A rendezvous port in ``[base, base + span)`` from a job id (``"4242"``, ``"4242_3"`` for an array task)."""
    digits = re.sub(r"\D", "", job_id)
    return base + (int(digits) if digits else 0) % span


def submitit_rank_env() -> None:
    """Inside a submitit job not started by torchrun (no ``RANK``), set what ``lp_runtime.distributed`` needs:
    ``MASTER_PORT`` and ``LOCAL_RANK``, plus, under the local executor, ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
    and, as torchrun does for several ranks, one thread a rank unless ``OMP_NUM_THREADS`` says otherwise. Under the
    local executor, Ctrl-C and SIGTERM stop the job as they stop a single run (``cli.take_signals``)."""
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    if not executor:
        return
    # submitit takes SIGTERM as a preemption to ignore: an lp_local sweep stopped by timeout said "interrupted"
    # while its jobs ran on, holding their answers' locks (a new user, 2026-12-07); they stop as a single run. Not
    # under Slurm, where a preemption's SIGTERM comes before submitit's requeue signal (SIGUSR2)
    if executor == "local":
        take_signals()
    if "RANK" in os.environ:
        return
    import submitit

    env = submitit.JobEnvironment()
    os.environ.setdefault("MASTER_PORT", str(port_for_job(str(env.job_id))))
    os.environ.setdefault("LOCAL_RANK", str(env.local_rank))  # models.resolve_device: cuda:LOCAL_RANK
    if executor == "local" and env.num_tasks > 1:
        os.environ.update(RANK=str(env.global_rank), WORLD_SIZE=str(env.num_tasks))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "OMP_NUM_THREADS" not in os.environ:  # each rank on all cores: 8x slower on a 2-core CPU
            import torch

            torch.set_num_threads(1)


# Settings a decoding method does not read (decoding=auto chooses them itself; decoding=paper has no suffix lookup),
# so a value given for them would be shown by the report but not run.
IGNORED_BY = {"auto": {"decoding.window_size": "chooses W itself from this machine's latency curve",
                       "decoding.pool_from_prompt": "always seeds the n-gram pool from the prompt"},
              "paper": {"decoding.max_depth": "proposes the n-gram pool's candidates of N-1 tokens (max_depth bounds "
                                              "the suffix lookup's continuations)"}}


def check_ignored_keys(dict_cfg: Any, keys: set[str]) -> None:
    """``ConfigError`` when the command line (``keys``) sets a setting that the run's decoding method does not read
    (``IGNORED_BY``; N and G bound auto's tree; greedy allows W, N, G so that a sweep can vary them)."""
    method = OmegaConf.select(dict_cfg, "decoding.method")
    for key, what in IGNORED_BY.get(method, {}).items():
        if key in keys:
            value = OmegaConf.select(dict_cfg, key)
            shown = str(value).lower() if isinstance(value, bool) else value
            raise ConfigError(f"{key}={shown} is ignored under decoding={method}, which {what}; add "
                              f"decoding=lookahead to run {key}={shown}")


def check_model_sampling_keys(dict_cfg: Any, overrides: list[str]) -> None:
    """``ConfigError`` when the command line (``overrides``) sets a field ``sampling=model`` takes from the model,
    even to its default value (which ``SamplingConfig`` cannot tell from unset)."""
    if not OmegaConf.select(dict_cfg, "sampling.from_model"):
        return
    given = [f"{override_key(o)}={o.split('=', 1)[1]}" for o in overrides
             if override_key(o).startswith("sampling.") and override_key(o).split(".")[1] in MODEL_TAKEN]
    if given:
        raise ConfigError(model_sampling_refusal(given))


def check_true_false(dict_cfg: Any, overrides: list[str]) -> None:
    """``ConfigError`` for an integer other than 0 and 1 given to a true/false setting, which OmegaConf reads as
    true (``dataset.first_turn_only=2``)."""
    for override in overrides:
        key, value = override_key(override), override.partition("=")[2]
        if re.fullmatch(r"[+-]?\d+", value.strip()) and int(value) not in (0, 1) \
                and isinstance(OmegaConf.select(dict_cfg, key, default=None), bool):
            raise ConfigError(f"{key}={value} is not allowed; {key} is true or false")


def check_job(dict_cfg: Any, overrides: list[str]) -> Any:
    """The ``RunConfig`` of a composed job after every check that needs no model or file (``overrides``: the job's
    command-line ones); ``ConfigError`` (or OmegaConf's errors)."""
    cfg = to_object(dict_cfg)  # refuses keys no setting has, and bad values
    check_true_false(dict_cfg, overrides)
    check_ignored_keys(dict_cfg, {override_key(o) for o in overrides})
    check_model_sampling_keys(dict_cfg, overrides)
    assert isinstance(cfg, RunConfig)
    cfg.decoding.check_candidates(cfg.parallel.lp)  # the LP degree decides whether successors=auto's table is on
    return cfg


def sweep_jobs(task_overrides: list[str]) -> tuple[list[list[str]], set[str]]:
    """The override list of each job of a basic sweep, in job order (the cartesian product Hydra's basic sweeper
    launches, a repeated key keeping its first place and last value), and the keys the sweep varies."""
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    parsed = OverridesParser.create(loader).parse_overrides(task_overrides)  # glob() lists a group's options
    choices: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices[key] = [f"{key}={v}" for v in values]
    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    return [list(job) for job in itertools.product(*choices.values())], swept


def validate_sweep(config: Any) -> None:
    """``check_job`` every job of the sweep ``config`` describes, before any runs, then what the jobs would write
    (``_check_distinct``, ``_check_own_files``) and the files each finds (``_check_resumable``); ``ConfigError``
    naming the first bad job's number and overrides (both jobs' for two that clash)."""
    from lp_runtime.models import check_model_config  # torch: the sweep's jobs import it too

    jobs, swept = sweep_jobs(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    launcher = config.hydra.get("launcher") or {}
    world, ranks = _launcher_ranks(launcher)
    checked: list[tuple[RunConfig, Any]] = []  # each job's settings and Hydra node
    try:
        for num, overrides in enumerate(jobs):
            with _naming_job(num, overrides, swept):
                job_cfg = _job_config(config, overrides, num, launcher)
                task_cfg = job_cfg.copy()  # what the job function gets: the config without Hydra's node
                with open_dict(task_cfg):
                    del task_cfg["hydra"]
                run_cfg = check_job(task_cfg, overrides)
                if world % run_cfg.parallel.lp:  # found when its job's ranks started (a submitit traceback)
                    raise ConfigError(f"parallel.lp={run_cfg.parallel.lp} does not divide the {world} rank(s) of "
                                      f"each job ({ranks}); set hydra.launcher.tasks_per_node (hydra/launcher="
                                      "lp_local or lp_slurm) to a multiple of it")
                # a missing model folder or a bad attention implementation (found only when its job loaded); not
                # the device: the jobs may run elsewhere (lp_slurm's GPU nodes), and each job checks its own
                check_model_config(run_cfg.model, device=False)
                checked.append((run_cfg, job_cfg.hydra))
    finally:
        HydraConfig.instance().set_config(config)
    _check_distinct(jobs, swept, [_job_setting(cfg, world) for cfg, _ in checked])
    files = [_job_files(cfg, hydra, o) for (cfg, hydra), o in zip(checked, jobs)]
    _check_own_files(jobs, swept, files, [str(hydra.runtime.output_dir) for _, hydra in checked])
    for num, (cfg, (_, hydra), overrides) in enumerate(zip(files, checked, jobs)):  # after: a shared file is named
        with _naming_job(num, overrides, swept):
            _check_resumable(cfg, world, hydra)


def _launcher_ranks(launcher: Any) -> tuple[int, str]:
    """The ranks each job of a sweep runs under ``launcher`` (the ``hydra.launcher`` node) and what makes them so;
    ``ConfigError`` for Slurm's launcher where Slurm is missing, or nodes / tasks_per_node below 1."""
    slurm = launcher_is(launcher, "SlurmLauncher")
    for tool, use, here in (("sbatch", "submits each job with", ""),
                            ("srun", "starts each job's ranks with", " (sbatch is here)")):
        if slurm and shutil.which(tool) is None:  # no srun: submitit's RuntimeError traceback otherwise
            raise ConfigError(f"hydra/launcher=lp_slurm {use} Slurm's {tool}, which this machine does not have{here}; "
                              "run the sweep on a Slurm login node, or try it here with hydra/launcher=lp_local")
    nodes, tasks = launcher.get("nodes"), launcher.get("tasks_per_node")  # submitit's (lp_local, lp_slurm)
    for key, value in (("nodes", nodes), ("tasks_per_node", tasks)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"hydra.launcher.{key}={value!r} is not allowed; give an integer >= 1 (processes of "
                              "each job: nodes x tasks_per_node, one rank each)")
    world = int(nodes) * int(tasks) if isinstance(nodes, int) and isinstance(tasks, int) else 1  # basic: in process
    return world, (f"hydra.launcher.nodes={nodes} x tasks_per_node={tasks}" if world > 1 or tasks else
                   "this launcher runs each job in this one process")


def _job_config(config: Any, overrides: list[str], num: int, launcher: Any) -> Any:
    """Job ``num``'s config as its launcher composes it from ``config`` and its ``overrides`` (a value of the wrong
    type: ``HydraException``), made Hydra's config, so that ``${hydra:job.num}`` and ``${hydra:runtime.output_dir}``
    in its values resolve as in the job."""
    job_cfg = GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)
    with open_dict(job_cfg):
        job_cfg.hydra.job.num = num
        # the id: the number under Hydra's basic launcher; submitit's (Slurm's job id) is not known yet, so a stand-in
        # of the job's own (a path of it is told apart from the other jobs', and holds no file)
        basic = launcher_is(launcher, "BasicLauncher")
        job_cfg.hydra.job.id = num if basic else f"<id of job {num}>"
    HydraConfig.instance().set_config(job_cfg)  # as Hydra's run_job: ${hydra:job.num} in sweep.subdir is this job's
    with read_write(job_cfg.hydra.runtime), open_dict(job_cfg.hydra.runtime):
        job_cfg.hydra.runtime.output_dir = os.path.abspath(os.path.join(str(job_cfg.hydra.sweep.dir),
                                                                        str(job_cfg.hydra.sweep.subdir)))
    HydraConfig.instance().set_config(job_cfg)
    return job_cfg


@contextlib.contextmanager
def _naming_job(num: int, overrides: list[str], swept: set[str]) -> Iterator[None]:
    """Bad input (or Hydra's refusal) raised in the block as one ``ConfigError`` naming sweep job ``num``."""
    try:
        yield
    except Exception as e:
        if not (is_bad_input(e) or isinstance(e, HydraException)):
            raise
        point = sweep_point(overrides, swept)
        raise ConfigError(f"sweep job {num}{f' ({point})' if point else ''}: {one_line(e)}; no job was run") from None


def _job_files(cfg: RunConfig, hydra: Any, overrides: list[str]) -> RunConfig:
    """``cfg`` with the output files its job opens: ``job_output``'s in the job's folder (``hydra.runtime.output_dir``)
    unless ``overrides`` set ``output.path``, and under ``hydra.job.chdir`` (the job runs in that folder) a relative
    ``output.path`` / ``output.summary_path`` there."""
    folder = str(hydra.runtime.output_dir)

    def opened(path: Optional[str]) -> Optional[str]:
        return os.path.join(folder, path) if path and hydra.job.get("chdir") else path

    output = dataclasses.replace(cfg.output, path=job_output(folder, overrides) or opened(cfg.output.path),
                                 summary_path=opened(cfg.output.summary_path))
    return dataclasses.replace(cfg, output=output)


# What a sweep's per-job output file holds, and its name in the job's folder (_check_own_files' advice)
SWEEP_FILES = {"output.path": ("answers file holds the answers", "answers.jsonl"),
               "output.summary_path": ("summary file holds the figures", "answers.summary.json")}


def _check_own_files(jobs: list[list[str]], swept: set[str], cfgs: list[RunConfig], folders: list[str]) -> None:
    """``ConfigError`` naming two jobs of a sweep that would write one answers or summary file (``cfgs``: each job's
    ``_job_files``; ``folders``: each job's ``hydra.runtime.output_dir``): a fixed path, one whose interpolations do
    not depend on the job (``${hydra:sweep.dir}/a.jsonl``), links to one file, or one ``hydra.sweep.subdir`` for
    every job."""
    for key, attr in (("output.path", "path"), ("output.summary_path", "resolved_summary_path")):
        first: dict[str, int] = {}
        for b, cfg in enumerate(cfgs):
            path, real = getattr(cfg.output, attr), answers.real_path(getattr(cfg.output, attr))
            a = first.setdefault(real, b)
            if a == b:
                continue
            points = [sweep_point(jobs[n], swept) for n in (a, b)]
            both = f"sweep jobs {a} ({points[0]}) and {b} ({points[1]}) would both write"
            kind, file = SWEEP_FILES[key]
            shown = os.path.abspath(path)
            shown += "" if real == shown else f" (the file {real})"
            if folders[a] == folders[b] and real.startswith(answers.real_path(folders[b]) + os.sep):  # one folder
                raise ConfigError(f"{both} {shown} (hydra.sweep.subdir is one folder for both), but one {kind} of one "
                                  "setting; put the job number in hydra.sweep.subdir (its default: "
                                  "'${hydra.job.num}'); no job was run")
            raise ConfigError(f"{both} {key}={shown}, but one {kind} of one setting; drop {key} so "
                              "that each job writes into its own folder (<hydra.sweep.dir>/<job number>/), or put the "
                              f"job number in it: '{key}=${{hydra:sweep.dir}}/${{hydra:job.num}}/{file}'; no job was "
                              "run")


def _check_resumable(cfg: RunConfig, world: int, hydra: Any) -> None:
    """What a job checks of the files it finds before it loads the model (``generate.run``), here before any job of
    the sweep runs (a re-run sweep whose jobs changed order was refused at job 1, after job 0 had run), on the job's
    files as it opens them (``cfg``: its ``_job_files``): ``answers.OutputError`` for a summary, settings record or
    lock beside the answers that lp_runtime did not write, or an answers file that is not one (an answer given twice);
    ``answers.SettingsMismatchError`` when it holds answers made with other settings."""
    from lp_runtime.models import model_fingerprint

    here, folder = os.getcwd(), str(hydra.runtime.output_dir)
    path = Path(cfg.output.path)
    if hydra.job.get("chdir") and os.path.isdir(folder):  # where the job runs: a summary names its answers from there
        os.chdir(folder)
    try:
        answers.check_summary_path(cfg)
        if path.is_file():  # not a folder or a pipe (read: blocks), which the job names (answers.check_output_path)
            answers.load_answers(path, trim=False)
        if answers.has_answers(path):
            current = answers.run_settings(cfg, model_fingerprint=model_fingerprint(cfg.model), world_size=world)
            answers.check_settings(path, Path(cfg.output.resolved_settings_path), current,
                                   answers.new_sweep_hint(str(hydra.sweep.dir)))
    finally:
        os.chdir(here)


def _job_setting(cfg: RunConfig, world: int) -> dict:
    """What tells two jobs of a sweep apart: the settings an answers file records (``answers.run_settings``, known
    before the model loads) and those it does not compare on resume (a quick and a full run, gloo against nccl),
    but not the output paths, which differ in every job."""
    flat = answers.flatten(dataclasses.asdict(cfg))
    setting = answers.run_settings(cfg, model_fingerprint=cfg.model.path, world_size=world)
    setting = {k: v for k, v in setting.items() if k not in answers.AFTER_LOAD}  # model.dtype is compared instead
    return {**setting, "not_compared": {k: flat.get(k) for k in answers.NOT_COMPARED if not k.startswith("output.")}}


def _check_distinct(jobs: list[list[str]], swept: set[str], settings: list[dict]) -> None:
    """``ConfigError`` naming two jobs of a sweep that would run the same setting (``answers.differences`` finds
    nothing between them): equal values (``0,00``), or ones the setting does not read (W under decoding=greedy)."""
    for b, later in enumerate(settings):
        a = next((a for a in range(b) if not answers.differences(settings[a], later)), None)
        if a is not None:  # two folders of the same answers (a new user, session 22)
            point = [sweep_point(jobs[n], swept) for n in (a, b)]
            raise ConfigError(f"sweep jobs {a} ({point[0]}) and {b} ({point[1]}) would run the same setting (equal "
                              "values, or values it does not read, e.g. decoding.* under decoding=greedy): give each "
                              "job a setting of its own (a greedy baseline beside a W sweep: run it on its own); no "
                              "job was run")


class ValidateSweep(Callback):
    """Hydra callback: ``validate_sweep`` when a sweep starts; a bad job ends the process (``cli.fail``), and so
    does any other error of the check (one line, exit 1): Hydra turns an exception raised in a callback into a
    warning and runs every job unchecked (``SystemExit`` is no ``Exception``, which is all it catches)."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        try:
            validate_sweep(config)
        except ConfigError as e:
            fail(e)
        except Exception as e:
            error_exit(f"the up-front check of the sweep's jobs failed ({type(e).__name__}: {one_line(e)}); no job "
                       "was run", 1)


def is_sweep(argv: list[str]) -> bool:
    """Whether a command line asks Hydra for a ``--multirun`` sweep."""
    return any(a in MULTIRUN_FLAGS for a in argv) or "hydra.mode=MULTIRUN" in argv


def check_argv(argv: list[str]) -> None:
    """Command-line checks before Hydra starts."""
    check_torchrun_sweep(argv)
    check_printed_config(argv)


def printing_flag(argv: list[str]) -> Optional[str]:
    """The flag with which Hydra prints the composed config and exits (``--cfg``/``-c``, ``--info``/``-i`` all or
    config), or None."""
    for i, a in enumerate(argv):
        flag, _, value = a.partition("=")
        if flag in ("--cfg", "-c"):
            return flag
        if flag in INFO_FLAGS:
            value = value or (argv[i + 1] if i + 1 < len(argv) and argv[i + 1] in INFO_CHOICES else "all")
            if value in ("all", "config"):
                return flag
    return None


def check_printed_config(argv: list[str]) -> None:
    """``check_job`` the config that ``--cfg`` / ``--info`` prints (Hydra prints it and exits 0 even when a run
    would refuse a value); ``ConfigError`` with ``-m``, which Hydra refuses in a traceback. Not checked: ``--help``
    (wanted when the settings are wrong) and another config named by ``-cn``/``-cp``/``-cd``."""
    flag = printing_flag(argv)
    if flag is None or any(a.split("=", 1)[0] in CONFIG_FLAGS for a in argv):
        return
    if is_sweep(argv):
        raise ConfigError(f"{flag} prints the config of one run and -m/--multirun runs a sweep: give only one of them")
    from hydra import compose, initialize_config_dir

    from lp_runtime.cli import CONF_DIR

    overrides = [argv[i] for i in override_positions(argv)]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None, job_name="generate"):
        cfg = compose("generate", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # what ${hydra:...} in a value resolves to, as in a run
    chdir = cfg.hydra.job.chdir  # the paths are then the run folder's, which --cfg does not make
    with open_dict(cfg):
        del cfg["hydra"]
    run = check_job(cfg, overrides)
    if not chdir:
        try:
            answers.check_summary_target(run)  # as the run checks it (answers.check_summary_path)
        except answers.OutputError as e:  # the same line as a run's (cli.main's ConfigError)
            raise ConfigError(str(e)) from None


TORCHRUN_SWEEP = ("sweeps (-m/--multirun) and torchrun do not mix: every rank would run the whole sweep; launch "
                  "torchrun once per setting, or sweep from one process with hydra/launcher=lp_local (or lp_slurm), "
                  "which starts each job's ranks itself")


def check_torchrun_sweep(argv: list[str]) -> None:
    """Refuse a sweep in a process torchrun started (``TORCHELASTIC_RUN_ID`` set). Raises ``ConfigError``."""
    if is_sweep(argv) and "TORCHELASTIC_RUN_ID" in os.environ:
        raise ConfigError(TORCHRUN_SWEEP)
