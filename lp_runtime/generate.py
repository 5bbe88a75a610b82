"""Main job: answer a prompt set with lookahead decoding; write answers JSONL and a run summary.

Run from the repository root (config groups in ``conf/``; overrides are Hydra's ``key=value``)::

    python -m lp_runtime.generate dataset.limit=3
    python -m lp_runtime.generate model=llama2_7b_chat decoding=paper dataset=humaneval generation.max_new_tokens=256
    torchrun --standalone --nproc-per-node=1 -m lp_runtime.generate hydra.run.dir=outputs/hydra/run1 dataset.limit=3

    python -m lp_runtime.generate -m decoding=greedy,lookahead dataset.limit=5   # a sweep: one folder per job

(``launch/torchrun_single_node.sh`` wraps the torchrun line.) Answers go to ``output.path`` (default
``outputs/answers.jsonl``, relative to the launch directory; in a ``--multirun`` job ``answers.jsonl`` in the job's
folder, see ``lp_runtime.jobs``), one JSON line per question, written and fsynced as each question finishes. The
settings that made them are recorded beside it (``lp_runtime.settings``); re-running with the same path and the
same settings skips the questions already there, other settings are refused before the model loads. The summary
(``lp_runtime.metrics``) goes next to it. A bad setting, model, dataset or output path ends the job with
``error: <message>`` on stderr and exit code 2.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from lp_runtime import data, jobs, metrics, settings
from lp_runtime.config import ConfigError, ModelOutputError, RunConfig, register_configs
from lp_runtime.config import to_object as config_to_object

register_configs()


class OutputError(ValueError):
    """``output.path`` cannot hold the answers (a folder, unwritable, or a corrupt earlier answers file)."""


def check_output_path(path: Path, *, create: bool, key: str = "output.path") -> None:
    """Raise ``OutputError`` unless ``path`` can be a file we append to; messages name ``key`` unless it is
    ``output.path`` ("output path ...").

    ``create``: really try (make the missing folders, open the file for append), then remove what the try made,
    so a run that fails later leaves no empty file or folder behind; the folders are made again at the first write.
    """
    name = f"output path {path}" if key == "output.path" else f"{key}={path}"
    if path.is_dir():
        example = path / ("answers.jsonl" if key == "output.path" else "summary.json")
        raise OutputError(f"{name} is a folder; give a file path such as {example}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"cannot create the folder for {name}: {parent} is a file")
            break
    made = [p for p in reversed(path.parents) if not p.exists()]  # outermost first
    try:
        if create:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise OutputError(f"cannot create the folder for {name}: {e.strerror}") from None
        target = path if path.exists() else path.parent
        if target.exists() and not os.access(target, os.W_OK):
            raise OutputError(f"{name} is not writable")
        if create:  # os.access says yes to root everywhere; opening for append is the real test
            existed = path.exists()
            try:
                with open(path, "a", encoding="utf-8"):
                    pass
            except OSError as e:
                raise OutputError(f"{name} is not writable: {e.strerror}") from None
            if not existed:  # leave no empty file behind if the run fails before writing
                path.unlink()
    finally:
        for folder in reversed(made):  # innermost first; only folders this check made, and only if still empty
            try:
                folder.rmdir()
            except OSError:
                pass


ANSWER_KEYS = ("output_ids", "new_tokens", "decoding_steps", "wall_time", "accept_lengths")
OUTPUT_ADVICE = "move the file away or choose another output.path"


def load_answers(path: Path, *, trim: bool, advice: str = OUTPUT_ADVICE) -> list[dict]:
    """Answers already in ``path`` (empty if it does not exist).

    A final line without its newline is what a killed run leaves: it is ignored, and with ``trim`` cut off the
    file (after every other line parsed) so the next append starts on a fresh line. A line that is not UTF-8, not
    JSON, or not an answer (a JSON object with ``question_id`` and ``choices[0]`` holding ``ANSWER_KEYS``: e.g. a
    line of a question file) raises ``OutputError`` naming the file and the line, followed by ``advice``, and
    leaves the file as it was.
    """
    if not path.exists():
        return []
    raw = path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    records: list = []
    for num, line_bytes in enumerate(complete.splitlines(), 1):
        where = f"{path} line {num}"
        line = data.decode_line(line_bytes, where, OutputError,  # one line naming file and line
                                advice=f"an answers file is written as UTF-8, so this one was changed elsewhere; {advice}")
        if not line.strip():
            continue
        try:
            records.append((where, json.loads(line)))
        except json.JSONDecodeError:
            raise OutputError(f"{where} is not JSON; {advice}") from None
    for where, record in records:  # after every line decoded: a bad byte anywhere is named first
        choices = record.get("choices") if isinstance(record, dict) else None
        if not (isinstance(record, dict) and "question_id" in record and isinstance(choices, list) and choices
                and isinstance(choices[0], dict) and all(k in choices[0] for k in ANSWER_KEYS)):
            what = "a question" if isinstance(record, dict) and "turns" in record and "choices" not in record else "not an answer"
            raise OutputError(f"{where} is {what} (an answer line has question_id and choices[0] with "
                              f"{', '.join(ANSWER_KEYS)}), so {path} is not an answers file; {advice}")
    records = [record for _, record in records]
    if trim and len(complete) < len(raw):
        with open(path, "r+b") as f:
            f.truncate(len(complete))
            os.fsync(f.fileno())
    return records


def append_line(path: Path, record: dict) -> None:
    """Append one JSON line with a single write, then flush and fsync (a kill leaves at most a partial last line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def answer_question(decoder: Any, tokenizer: Any, question: data.Question, cfg: RunConfig) -> dict:
    """Decode every turn of ``question`` (each turn's prompt holds the answers so far); the FastChat ``choices[0]``."""
    choice: dict[str, Any] = {"index": 0, "turns": [], "output_ids": [], "new_tokens": [], "decoding_steps": [],
                              "wall_time": [], "accept_lengths": [], "finish_reason": []}
    # Per-category temperature (MT-Bench's judge settings) when the sampling config lists one.
    sampling = cfg.sampling.for_category(question.category)
    choice["seed"], choice["temperature"] = sampling.seed, sampling.temperature
    for _ in question.turns:
        prompt_ids = data.build_prompt(tokenizer, question, choice["turns"])
        try:
            out = decoder.generate(prompt_ids, max_new_tokens=cfg.generation.max_new_tokens,
                                   stop_strings=cfg.generation.stop_strings, sampling=sampling)
        except (ConfigError, ModelOutputError) as e:  # e.g. a prompt longer than the context: say which question
            # NaN/inf logits (ModelOutputError) stop the job too: no line for this question, earlier ones kept.
            raise type(e)(f"question {question.question_id!r}, turn {len(choice['turns']) + 1}: {e}; "
                          "the answers written so far are kept (remove or shorten it, then re-run)") from None
        choice["turns"].append(tokenizer.decode(out.output_ids, skip_special_tokens=True))
        choice["output_ids"].append(list(out.output_ids))
        choice["new_tokens"].append(len(out.output_ids))
        choice["decoding_steps"].append(out.decoding_steps)
        choice["wall_time"].append(out.wall_time)
        choice["accept_lengths"].append(list(out.accept_lengths))
        choice["finish_reason"].append(out.finish_reason)
    return choice


def _answer_record(decoder: Any, tokenizer: Any, question: data.Question, cfg: RunConfig, model_id: str) -> dict:
    """One answers-JSONL line (DESIGN.md section 5) for ``question``."""
    choice = answer_question(decoder, tokenizer, question, cfg)
    return {
        "question_id": question.question_id,
        "category": question.category,
        # Deterministic: the same model and outputs give the same id.
        "answer_id": uuid.uuid5(uuid.NAMESPACE_OID, json.dumps([model_id, question.question_id,
                                                                choice["output_ids"]])).hex,
        "model_id": model_id,
        "choices": [choice],
        "tstamp": time.time(),
    }


AUTO_WAIT_S = 1800.0  # how long other ranks wait while rank 0 measures the machine (decoding=auto's first run)


def _resolve_auto(model: Any, tokenizer: Any, label: str, limits: Any, eos: list, todo: list, is_main: bool,
                  timeout_s: float, lp_size: int) -> tuple[Any, dict, Any]:
    """``decoding=auto``: global rank 0 reads (or measures, the first time) this machine's latency profile and
    prints the one start-up line (``tuner.resolve_auto``); every rank gets rank 0's setting and curve
    (``distributed.broadcast_object``), so all ranks of an LP group make the same choice every step. Returns
    (the decoding setting, the summary entry, a ``policy.CostPolicy`` on that curve)."""
    from lp_runtime import distributed, tuner
    from lp_runtime.policy import CostPolicy

    resolved = None
    if is_main:
        resolved = tuner.resolve_auto(model, tokenizer, label, limits, eos_token_ids=eos, fallback_questions=todo,
                                      lp_size=lp_size)
    if distributed.is_initialized():
        resolved = distributed.broadcast_object(resolved, timeout_s=max(timeout_s, AUTO_WAIT_S))
    decoding, entry = resolved
    return decoding, entry, CostPolicy(tuner.curve_of(entry))


def run(cfg: RunConfig) -> dict:
    """Answer every question of ``cfg.dataset`` not yet in ``cfg.output.path``; write and return the summary.

    Cheap checks (output path, the settings recorded for an existing answers file, dataset) come before the model
    loads, so bad input fails in seconds. Raises ``ConfigError``, ``OutputError``, ``settings.SettingsMismatchError``,
    ``data.DatasetError``, ``models.ModelLoadError`` or ``OSError`` on bad input.
    """
    from lp_runtime import distributed, parallel  # torch: imported after the config is known good

    rank_info = distributed.detect()
    is_main = rank_info.rank == 0
    answers_path = Path(cfg.output.path)
    summary_path = Path(cfg.output.resolved_summary_path)
    settings_path = Path(cfg.output.resolved_settings_path)
    check_output_path(answers_path, create=is_main)
    check_output_path(summary_path, create=is_main, key="output.summary_path" if cfg.output.summary_path else "output.path")
    questions = data.load_questions(cfg.dataset)
    from lp_runtime import models  # transformers: seconds, so after the checks above

    models.check_model_files(cfg.model)  # an empty folder or a missing model.gguf_file: before the fingerprint
    fingerprint = models.model_fingerprint(cfg.model)  # from the files: the model is not loaded yet
    current = settings.run_settings(cfg, model_fingerprint=fingerprint, world_size=rank_info.world_size)
    load_answers(answers_path, trim=False)  # read only: a corrupt file is named before the settings check
    settings.check(answers_path, settings_path, current)  # before anything touches the file
    records = load_answers(answers_path, trim=is_main)
    done = {str(r["question_id"]) for r in records}
    todo = [q for q in questions if str(q.question_id) not in done]
    ctx = parallel.setup_parallel(cfg.parallel)
    comm, my_steps = None, 0

    auto = None  # decoding=auto: the tuner's choice, recorded in the summary
    if todo:
        from lp_runtime import compiled
        from lp_runtime.decoder import Decoder

        model, tokenizer = models.load_model(cfg.model)
        # Named by what was loaded (a fingerprint of its files), not by a preset name: see models.model_label.
        current["model.fingerprint"] = fingerprint = models.model_fingerprint(cfg.model)  # a download may fill it
        label = models.model_label(cfg.model, fingerprint)
        models.check_limits(model, cfg.decoding, cfg.sampling, cfg.generation)  # ids in the vocabulary, a step fits
        eos = models.eos_token_ids(model, tokenizer, cfg.generation.eos_token_ids)
        decoding, policy = cfg.decoding, None
        if decoding.method == "auto":
            decoding, auto, policy = _resolve_auto(model, tokenizer, label, decoding, eos, todo, is_main,
                                                   cfg.parallel.timeout_s, ctx.lp_group.size)
        step = compiled.step_for(model, cfg.model.compile, log=print if is_main else lambda line: None)
        decoder = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tokenizer, lp=ctx.lp_group,
                          sampling=cfg.sampling, step_policy=policy, step=step)
        model_id = cfg.model_id or (cfg.model.name if cfg.model.name else label)
        # Data parallelism: LP group i answers questions i, i + dp, ...; in round r every group answers one
        # question, rank 0 gathers them and appends them in dataset order, so the file equals one group's.
        mine = parallel.shard_questions(todo, ctx.dp_rank, ctx.dp_size)
        rounds = -(-len(todo) // ctx.dp_size)
        bar = tqdm(total=len(todo), desc="questions", unit="q", disable=not (cfg.progress and is_main))
        for r in range(rounds):
            record = None
            if r < len(mine):
                question = mine[r]
                record = _answer_record(decoder, tokenizer, question, cfg, model_id)
                my_steps += sum(record["choices"][0]["decoding_steps"])
            gathered = [record] if ctx.world_size == 1 else distributed.gather_objects_to_rank0(record)
            if not ctx.is_writer:
                continue
            # Every rank of an LP group holds the same record; keep one per question, in dataset order.
            new = {str(rec["question_id"]): rec for rec in gathered if rec is not None}
            for question in todo[r * ctx.dp_size : (r + 1) * ctx.dp_size]:
                record = new[str(question.question_id)]
                choice = record["choices"][0]
                if not records:  # the file's first answer: record the settings that make it
                    settings.write(settings_path, current)
                records.append(record)
                append_line(answers_path, record)
                first_line = (choice["turns"][0].strip().splitlines() or [""])[0]
                tqdm.write(f"[{question.question_id}] {first_line[:120]}")
                bar.update(1)
        bar.close()
        if ctx.lp_group.size > 1:  # rank 0's view; every rank of a group takes part in each collective
            stats = ctx.lp_group.stats.as_dict()
            comm = {"lp_degree": ctx.lp_group.size, "dp_degree": ctx.dp_size, **stats,
                    "collectives_per_step": stats["collectives"] / max(my_steps, 1),
                    "bytes_per_step": stats["bytes"] / max(my_steps, 1),
                    "comm_seconds_per_step": stats["seconds"] / max(my_steps, 1)}
    ctx.teardown()

    summary = metrics.run_summary(records, cfg, str(answers_path), settings=current)
    if comm is not None:
        summary["lp_communication"] = comm
    if auto is not None:
        summary["auto_decoding"] = auto
    if is_main and not todo and summary_path.exists():
        # Nothing answered now: the summary on disk describes the run that made the answers; keep it.
        print(f"all {len(questions)} questions of the dataset are already in {answers_path}; nothing to do "
              f"(summary kept: {summary_path})")
        return json.loads(summary_path.read_text(encoding="utf-8"))
    if is_main:
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = summary_path.with_name(summary_path.name + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, summary_path)
        shown = {k: v for k, v in summary.items() if k not in ("config", "versions", "settings")}
        print(json.dumps(shown, indent=2))
        print(f"answers: {answers_path}\nsummary: {summary_path}")
    return summary


def _is_bad_input(e: BaseException) -> bool:
    """Errors that come from what the user gave (reported in one line) rather than from a bug (traceback)."""
    kinds: tuple[type, ...] = (ConfigError, ModelOutputError, OutputError, settings.SettingsMismatchError,
                               data.DatasetError, OmegaConfBaseException, OSError)
    models = sys.modules.get("lp_runtime.models")  # ModelLoadError can only be raised once models is imported
    return isinstance(e, kinds + ((models.ModelLoadError,) if models else ()))


def _one_line(e: BaseException) -> str:
    """``e``'s message in one line: its first line, Hydra's list of available options if any, and the first line
    of an OmegaConf cause (Hydra wraps OmegaConf's errors)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    msg = lines[0]
    if len(lines) > 2 and lines[1].endswith(":"):  # "Available options in 'model':" then one option a line
        options = next((lines[2:i] for i in range(2, len(lines)) if lines[i].endswith(":")), lines[2:])
        msg += f" ({lines[1]} {', '.join(options)})"
    if isinstance(e.__cause__, OmegaConfBaseException) and str(e.__cause__).strip():
        msg = msg.rstrip(".") + ": " + str(e.__cause__).strip().splitlines()[0]
    return msg


_DIRS_BEFORE: set[str] = set()  # folders (2 levels below the launch directory) that existed before Hydra ran


def _dirs_near(root: Path, depth: int = 2) -> set[str]:
    found: set[str] = set()
    try:
        entries = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except OSError:
        return found
    for e in entries:
        found.add(os.path.abspath(e.path))
        if depth > 1:
            found |= _dirs_near(Path(e.path), depth - 1)
    return found


def remove_refused_run_dir() -> None:
    """After a refusal in a single (not ``--multirun``) run, remove the run folder Hydra made for it when it holds
    nothing but Hydra's records (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``) and an empty job log,
    then the empty folders above it (up to the launch directory) that did not exist before the run. A folder
    holding anything else (torchrun logs, answers, a non-empty log) is left as it is."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or jobs.is_multirun():
        return
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    records = {f"{hc.output_subdir}/{n}" for n in ("config.yaml", "hydra.yaml", "overrides.yaml")} if hc.output_subdir else set()
    allowed = records | {f"{hc.job.name}.log"}
    try:
        found = {str(p.relative_to(run_dir)): p for p in run_dir.rglob("*")}
        if not run_dir.is_dir() or any(rel not in allowed | {hc.output_subdir} for rel in found):
            return
        if any(rel.endswith(".log") and p.stat().st_size > 0 for rel, p in found.items()):
            return
        for rel in sorted(found, key=len, reverse=True):  # files, then .hydra/, then the run folder
            (found[rel].rmdir if found[rel].is_dir() else found[rel].unlink)()
        run_dir.rmdir()
        cwd = Path.cwd().resolve()
        for parent in run_dir.resolve().parents:
            if parent == cwd or cwd not in parent.parents or str(parent) in _DIRS_BEFORE or any(parent.iterdir()):
                break
            parent.rmdir()
    except OSError:  # another rank removed it first, or it changed under us: leave the rest
        return


def _fail(e: BaseException) -> NoReturn:
    print(f"error: {_one_line(e)}", file=sys.stderr)
    sys.exit(2)


# An absolute path: "../conf" would resolve as the Python module `conf` under `python -m`, found only when the
# launch directory is the repository root.
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(config_path=CONF_DIR, config_name="generate", version_base=None)
def _hydra_main(dict_cfg: DictConfig) -> None:
    try:
        jobs.apply_job_output(dict_cfg)  # a sweep job writes into its own folder
        jobs.submitit_rank_env()  # a job of Hydra's submitit launcher: one rank per task
        cfg = config_to_object(dict_cfg)  # refuses keys no setting has
        assert isinstance(cfg, RunConfig)
        run(cfg)
    except Exception as e:
        if not _is_bad_input(e):
            raise
        remove_refused_run_dir()  # README: a refused setting leaves no new file or folder
        _fail(e)


_VALUE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun",
                "--cfg", "-c", "--package", "-p")  # Hydra's flags that take a value (not an override)


def check_sweep_outputs(argv: list[str]) -> None:
    """Refuse, before Hydra starts any job, a ``--multirun`` sweep of several jobs whose command line fixes
    ``output.path`` (or ``output.summary_path``) to one file for all of them: job 0 would write it and every
    later job refuse it (one answers file holds one setting). A value with an interpolation (``${hydra:job.num}``)
    is taken as per-job. Raises ``ConfigError`` saying what to do instead."""
    if not any(a in ("-m", "--multirun") for a in argv) and "hydra.mode=MULTIRUN" not in argv:
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args, skip = [], False
    for a in argv:
        if skip or a.startswith("-"):
            skip = a in _VALUE_FLAGS
            continue
        args.append(a)
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except Exception:  # Hydra reports a malformed override itself
        return
    sweeps = [o.input_line for o in overrides if o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
    if not sweeps:
        return
    for o in overrides:
        if o.key_or_group in ("output.path", "output.summary_path") and not o.is_sweep_override():
            value = (o.input_line or "").split("=", 1)[-1]  # as typed (get_value_element_as_str escapes ${)
            if "${" not in value:
                raise ConfigError(
                    f"{o.key_or_group}={value} names one file for every job of this --multirun sweep "
                    f"({' '.join(sweeps)}), but one answers file holds the answers of one setting; drop "
                    f"{o.key_or_group} so that each job writes into its own folder (<hydra.sweep.dir>/<job number>/), "
                    f"or put the job number in it: '{o.key_or_group}=outputs/sweep/${{hydra:job.num}}/answers.jsonl'")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, Slurm at the time limit, torchrun stopping its workers), taken like Ctrl-C."""


def _on_sigterm(signum, frame) -> NoReturn:
    raise Terminated()


def main() -> None:
    # SIGTERM ends the job like Ctrl-C: every line written so far is complete (a cut last line is trimmed on
    # resume), one message says so, and the exit code stays the signal's (143).
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Without HYDRA_FULL_ERROR, Hydra prints composition errors (a wrong type or an unknown key in an override)
    # itself and exits with 1; with it they reach us and are reported like every other bad input.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _DIRS_BEFORE.update(_dirs_near(Path.cwd()))
    try:
        check_sweep_outputs(sys.argv[1:])
        _hydra_main()
    except (HydraException, OmegaConfBaseException, ConfigError) as e:
        _fail(e)
    except KeyboardInterrupt as e:
        print("interrupted; the answers written so far are complete: re-run the same command to resume",
              file=sys.stderr)
        sys.exit(143 if isinstance(e, Terminated) else 130)


if __name__ == "__main__":
    main()
