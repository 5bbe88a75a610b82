"""Main job: answer a prompt set with lookahead decoding; write answers JSONL and a run summary.

Run from the repository root (config groups in ``conf/``; overrides are Hydra's ``key=value``)::

    python -m lp_runtime.generate dataset.limit=3
    python -m lp_runtime.generate model=llama2_7b_chat decoding=paper dataset=humaneval generation.max_new_tokens=256
    torchrun --standalone --nproc-per-node=1 -m lp_runtime.generate hydra.run.dir=outputs/hydra/run1 dataset.limit=3
    python -m lp_runtime.generate -m decoding=greedy,lookahead dataset.limit=5   # a sweep: one folder per job

Answers are appended and fsynced to ``output.path`` as each question finishes; a re-run with the same settings
resumes, other settings are refused before the model loads (``lp_runtime.answers``). Bad input ends the job with
``error: <message>`` on stderr and exit code 2 (``lp_runtime.cli``)."""
from __future__ import annotations

import contextlib
import difflib
import json
import os
import time
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig
from tqdm import tqdm

from lp_runtime import answers, cli, data, jobs, metrics
from lp_runtime.config import ConfigError, ModelOutputError, RunConfig, register_configs

register_configs()


def _answer_record(decoder: Any, tokenizer: Any, question: data.Question, cfg: RunConfig, model_id: str) -> dict:
    """One answers-JSONL line (docs/design.md section 5): every turn of ``question``, each prompt holding the
    answers so far."""
    from lp_runtime.checks import fills_context
    from lp_runtime.decoder import GenerationOutput

    sampling = cfg.sampling.for_category(question.category)  # MT-Bench's per-category temperature, if listed
    texts, outs = [], []
    for turn in range(len(question.turns)):
        prompt = data.build_prompt(tokenizer, question, texts)
        if turn and fills_context(decoder.model, len(prompt), decoder.step.max_positions):  # earlier answers filled it
            outs.append(GenerationOutput(output_ids=[], finish_reason="length", decoding_steps=0))
            texts.append("")
            continue
        try:
            out = decoder.generate(prompt, sampling=sampling, max_new_tokens=cfg.generation.max_new_tokens,
                                   stop_strings=cfg.generation.stop_strings)
        except (ConfigError, ModelOutputError) as e:  # no line for this question, earlier ones kept: say which
            why = (f"; this turn's prompt holds the earlier turns' answers: a smaller generation.max_new_tokens (now "
                   f"{cfg.generation.max_new_tokens}) leaves it room" if turn and isinstance(e, ConfigError) else "")
            raise type(e)(f"question {question.question_id!r}, turn {turn + 1}: {e}{why}; "
                          "the answers written before this question are kept (remove or shorten it, then re-run)"
                          ) from None
        outs.append(out)
        texts.append(tokenizer.decode(out.output_ids, skip_special_tokens=True))
    choice = {"index": 0, "turns": texts, "output_ids": [list(o.output_ids) for o in outs],
              "new_tokens": [len(o.output_ids) for o in outs], "decoding_steps": [o.decoding_steps for o in outs],
              "wall_time": [o.wall_time for o in outs], "accept_lengths": [list(o.accept_lengths) for o in outs],
              "finish_reason": [o.finish_reason for o in outs], "seed": outs[0].sampling.seed,
              "temperature": outs[0].sampling.temperature}  # as applied (sampling=model: the model's own)
    return {
        "question_id": question.question_id,
        "category": question.category,
        "question_digest": data.question_digest(question),  # an edited question is not taken as answered
        "answer_id": uuid.uuid5(uuid.NAMESPACE_OID, json.dumps([model_id, question.question_id,
                                                                choice["output_ids"]])).hex,
        "model_id": model_id,
        "choices": [choice],
        "tstamp": time.time(),
    }


def unanswered_turns(record: dict, max_new_tokens: int) -> list[str]:
    """One line for each later turn of ``record`` that got no token because the earlier answers filled the model's
    context (written with no tokens, no steps and ``finish_reason`` "length"; a turn whose prompt fills it even
    with the earlier answers empty is refused before any question, ``check_prompts``)."""
    c = record["choices"][0]
    return [f"[{record['question_id']}] turn {t + 1} not answered: the earlier turns' answers fill the model's "
            f"context; a smaller generation.max_new_tokens (now {max_new_tokens}) leaves it room"
            for t in range(1, len(c["turns"])) if not c["new_tokens"][t] and c["finish_reason"][t] == "length"]


AUTO_WAIT_S = 1800.0  # how long other ranks wait while rank 0 measures the machine (decoding=auto's first run)


def run(cfg: RunConfig) -> dict:
    """Answer every question of ``cfg.dataset`` not yet in ``cfg.output.path``; write and return the summary.
    Raises (cheap checks before the model loads) ``ConfigError``, ``answers.OutputError``,
    ``answers.SettingsMismatchError``, ``data.DatasetError``, ``models.ModelLoadError`` or ``OSError``."""
    from lp_runtime import distributed, parallel  # torch: imported after the config is known good

    # Every rank joins first: rank 0's refusal of the output reaches the others through the broadcast, where they
    # waited in the rendezvous until its timeout (a launcher that does not stop them, lp_local: 2 x 120 s)
    ctx = parallel.setup_parallel(cfg.parallel)
    with contextlib.ExitStack() as held:
        distributed.from_rank0(lambda: _claim_output(cfg, held))
        return _run_held(cfg, ctx)


def _claim_output(cfg: RunConfig, held: contextlib.ExitStack) -> None:
    """Rank 0's checks of the files the run writes, then its ``AnswersLock`` on the answers file, held by ``held``.
    Raises ``answers.OutputError`` or ``answers.SettingsMismatchError`` (a settings record of another format)."""
    answers_path = Path(cfg.output.path)
    answers.check_output_path(answers_path)
    answers.check_summary_path(cfg)  # first: a folder where the default summary goes is named as that
    answers.check_output_path(Path(cfg.output.resolved_summary_path),
                              key="output.summary_path" if cfg.output.summary_path else "output.path")
    held.enter_context(answers.AnswersLock(answers_path))


def _run_held(cfg: RunConfig, ctx: Any) -> dict:
    """``run`` once the answers file is this run's: read what is there, answer the rest, write the summary."""
    from lp_runtime import models

    is_main = ctx.rank == 0
    answers_path, settings_path = Path(cfg.output.path), Path(cfg.output.resolved_settings_path)
    questions = data.load_questions(cfg.dataset)
    check_category_keys(cfg.sampling.category_temperature, questions)
    recorded = answers.load_answers(answers_path, trim=False)  # read only: a corrupt file is named first
    models.check_model_config(cfg.model)  # a bad value named as such, not as a setting the file differs in
    fingerprint = models.model_fingerprint(cfg.model)  # from the files: the model is not loaded yet
    current = answers.run_settings(cfg, model_fingerprint=fingerprint, world_size=ctx.world_size)
    answers.check_settings(answers_path, settings_path, current, _sweep_hint())  # before anything touches the file
    check_unchanged(recorded, questions, answers_path, cfg)
    records = answers.load_answers(answers_path, trim=is_main)
    done = {str(r["question_id"]) for r in records}
    todo = [q for q in questions if str(q.question_id) not in done]
    extra: dict[str, Any] = {}
    if todo:
        extra = _answer_all(cfg, ctx, todo, records, current, is_main)
    ctx.teardown()
    summary = metrics.run_summary(records, cfg, str(answers_path), settings=current)
    summary.update(extra)
    return _report(cfg, summary, records, questions, is_main, answered_now=bool(todo))


def _sweep_hint() -> Optional[str]:
    """In a sweep job, where to write instead of answers made with other settings: a new sweep folder."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return answers.new_sweep_hint(HydraConfig.get().sweep.dir)


def _load(cfg: RunConfig, ctx: Any, todo: list, current: dict, is_main: bool) -> tuple[Any, Any, str, dict]:
    """(``Decoder``, tokenizer, the answers' ``model_id``, summary entries): the model loaded and checked against
    the settings and every first-turn prompt, ``decoding=auto`` resolved."""
    from lp_runtime import auto, blas, checks, compiled, distributed, latency, models
    from lp_runtime.decoder import Decoder
    from lp_runtime.policy import CostPolicy
    from lp_runtime.sampling import model_sampling

    log = print if is_main else lambda line: None
    answers_path, settings_path = Path(cfg.output.path), Path(cfg.output.resolved_settings_path)
    model_cfg = cfg.model
    if model_cfg.dtype == "auto":  # rank 0 reads the record, so every rank loads the same dtype
        resumed = distributed.from_rank0(lambda: answers.recorded_dtype(answers_path, settings_path))
        if resumed:
            log(f"model.dtype=auto: {resumed}, the dtype {cfg.output.path} was made in (a resume keeps it)")
            model_cfg = replace(model_cfg, dtype=resumed)
    # transformers' per-tensor "Loading weights" bars never (every rank printed them); downloads and the GGUF
    # conversion's bar as the job shows bars
    model, tokenizer = models.load_model(model_cfg, progress=cfg.progress and is_main, weight_bars=False)
    current["model.fingerprint"] = fingerprint = models.model_fingerprint(cfg.model)  # a download may fill it
    # model.dtype=auto's choice can differ between runs (a machine under load, two sweep jobs timing at once): a
    # resumed file keeps one dtype
    current["model.resolved_dtype"] = latency.dtype_name(model)
    if cfg.sampling.from_model:  # what sampling=model applies, recorded (the sampling.* settings hold defaults)
        applied = model_sampling(getattr(model, "generation_config", None), cfg.sampling)
        current.update(answers.applied_sampling(applied))
    mkl = blas.mkl_mode() if model.device.type == "cpu" else None  # MKL's mode changes a CPU's numerics too
    if mkl is not None:
        current["model.mkl_mode"] = mkl or "default"
    answers.check_settings(answers_path, settings_path, current, _sweep_hint())
    label = models.model_label(cfg.model, fingerprint)
    checks.check_limits(model, cfg.decoding, cfg.sampling, cfg.generation)  # ids in the vocabulary, a step fits
    path = compiled.chosen_path(model, cfg.model.compile, None, log)  # the prompts checked against its cache
    check_prompts(model, tokenizer, todo, cfg.generation.max_new_tokens, compiled.static_capacity(model, path))
    eos = checks.eos_token_ids(model, tokenizer, cfg.generation.eos_token_ids)
    decoding, policy, extra = cfg.decoding, None, {}
    step = compiled.step_for(model, cfg.model.compile, log=log, path=path)
    if decoding.method == "auto":  # rank 0 reads (or measures) the latency profile; every rank takes its setting
        decoding, extra["auto_decoding"] = distributed.from_rank0(lambda: auto.resolve_auto(
            model, tokenizer, cfg.decoding, model_name=label, fallback_questions=todo, lp_size=ctx.lp_group.size,
            step=step, progress=cfg.progress, make_decoder=lambda d, p: Decoder(
                model, d, eos_token_ids=eos, tokenizer=tokenizer, step_policy=p, step=step)),
            timeout_s=max(cfg.parallel.timeout_s, AUTO_WAIT_S))
        policy = CostPolicy(latency.curve_of(extra["auto_decoding"]))
    decoder = Decoder(model, decoding, eos_token_ids=eos, tokenizer=tokenizer, lp=ctx.lp_group,
                      sampling=cfg.sampling, step_policy=policy, step=step)
    return decoder, tokenizer, cfg.model_id or label, extra


def check_category_keys(table: Optional[dict], questions: list) -> None:
    """``ConfigError`` for a ``sampling.category_temperature`` key that matches a category only in another case
    ("Writing" for writing) or is one typo away from one ("wrting": ``difflib`` ratio >= 0.8). A key far from every
    category may name one past ``dataset.limit`` or of another dataset (a preset's): allowed."""
    categories = sorted({q.category for q in questions if q.category is not None})
    for key in table or {}:
        near = ([c for c in categories if c.lower() == key.lower() and c != key]
                or difflib.get_close_matches(key, categories, n=1, cutoff=0.8))  # "wrting" for writing: a typo
        if key not in categories and near:
            raise ConfigError(f"sampling.category_temperature key {key!r} matches no question's category (matched "
                              f"exactly); did you mean {near[0]!r}? This run's categories: {', '.join(categories)}")


def check_prompts(model: Any, tokenizer: Any, questions: list, max_new_tokens: int,
                  capacity: Optional[int] = None) -> None:
    """``ConfigError`` naming the question and turn when a turn's prompt fails ``checks.check_request`` with every
    earlier answer left empty (``capacity``: the static KV cache's, ``compiled.static_capacity``): no budget would let
    it be answered. A later turn whose prompt the earlier answers fill is written unanswered, with a note."""
    from lp_runtime.checks import check_request

    for q in questions:
        for turn in range(len(q.turns)):
            try:
                check_request(model, data.build_prompt(tokenizer, q, [""] * turn), max_new_tokens, capacity)
            except ConfigError as e:
                empty = " with the earlier turns' answers left empty" if turn else ""
                raise ConfigError(f"question {q.question_id!r}, turn {turn + 1}{empty}: {e}; no question was "
                                  "answered (remove or shorten it, then re-run)") from None


ROUND_WAIT_S = 7 * 24 * 3600  # how long a data-parallel rank waits for the others' answers (seconds; a dead peer
# ends the wait: under gloo its connection closes, and torchrun, or srun under lp_slurm, stops the job)


def _answer_all(cfg: RunConfig, ctx: Any, todo: list, records: list, current: dict, is_main: bool) -> dict:
    """Answer ``todo``, appending each answer to the file and ``records``; returns summary entries. LP group i
    answers questions i, i + dp, ...; rank 0 appends each round's answers in dataset order."""
    from lp_runtime import distributed, parallel

    # data parallelism: a rank that finished its question waits for the others' as long as a question takes
    # (parallel.timeout_s, a collective's bound, failed a healthy run whose ranks' questions differed by more); made
    # while the ranks are in step, before one may fail to load (its peers then waited in new_group for days)
    wait = distributed.waiting_group(ROUND_WAIT_S) if ctx.dp_size > 1 else None
    decoder, tokenizer, model_id, extra = _load(cfg, ctx, todo, current, is_main)
    model_id = records[0]["model_id"] if records else model_id  # resumed: the file's label (one made before 12-04
                                                                # holds model.name without its fingerprint)
    mine = parallel.shard_questions(todo, ctx.dp_rank, ctx.dp_size)
    my_steps = 0
    # A context manager: on Ctrl-C the bar is closed (ends its line) before the "interrupted" line is printed.
    with tqdm(total=len(todo), desc="questions", unit="q", disable=not (cfg.progress and is_main)) as bar:
        for r in range(-(-len(todo) // ctx.dp_size)):
            cli.check_interrupted()  # a Ctrl-C a library swallowed while loading or answering: stop before the next
            record = _answer_record(decoder, tokenizer, mine[r], cfg, model_id) if r < len(mine) else None
            my_steps += sum(record["choices"][0]["decoding_steps"]) if record else 0
            gathered = [record] if ctx.world_size == 1 else distributed.gather_objects_to_rank0(record, wait)
            if not ctx.is_writer:
                continue
            # Every rank of an LP group holds the same record; keep one per question, in dataset order.
            new = {str(rec["question_id"]): rec for rec in gathered if rec is not None}
            for question in todo[r * ctx.dp_size : (r + 1) * ctx.dp_size]:
                if records and not Path(cfg.output.path).is_file():  # was made again, the earlier answers lost
                    raise answers.OutputError(
                        f"the answers file {cfg.output.path} is gone (deleted or moved while the run went on; "
                        f"{len(records)} answer(s) were in it); the run stops here: put it back and re-run the same "
                        "command to resume, or re-run to start a new file")
                if not records:  # the file's first answer: record the settings that make it
                    answers.write_settings(Path(cfg.output.resolved_settings_path), current)
                records.append(new[str(question.question_id)])
                answers.append_line(Path(cfg.output.path), records[-1])
                tqdm.write(answers.first_line(records[-1]))
                for note in unanswered_turns(records[-1], cfg.generation.max_new_tokens):
                    tqdm.write(note)
                bar.update(1)
    distributed.release_group(wait)
    if ctx.lp_group.size > 1:  # rank 0's view; every rank of a group takes part in each collective
        stats = asdict(ctx.lp_group.stats)
        extra["lp_communication"] = {"lp_degree": ctx.lp_group.size, "dp_degree": ctx.dp_size, **stats,
                                     "collectives_per_step": stats["collectives"] / max(my_steps, 1),
                                     "bytes_per_step": stats["bytes"] / max(my_steps, 1),
                                     "comm_seconds_per_step": stats["seconds"] / max(my_steps, 1)}
    return extra


def check_unchanged(records: list, questions: list, answers_path: Path, cfg: RunConfig) -> None:
    """``OutputError`` when an answer's ``question_digest`` (if it has one) differs from its question's now."""
    now = {str(q.question_id): data.question_digest(q) for q in questions}
    for record in records:
        digest = now.get(str(record["question_id"]))
        if digest is not None and record.get("question_digest", digest) != digest:  # asked now, and edited
            source = cfg.dataset.path if cfg.dataset.name == "jsonl" else f"dataset={cfg.dataset.name}"
            raise answers.OutputError(
                f"{answers_path} answers question {record['question_id']!r} as it read then, and its text in "
                f"{source} has changed since; remove that answer's line to answer the question as it reads now, or "
                f"write to a new output path ({answers.new_output_arg(answers_path)})")


def _report(cfg: RunConfig, summary: dict, records: list, questions: list, is_main: bool, *,
            answered_now: bool) -> dict:
    """Write and print the summary (rank 0); when nothing was answered now, show the answers and keep the summary,
    its counts brought up to the file's answers when a run stopped by Ctrl-C or SIGTERM added some after it."""
    summary_path, answers_path = Path(cfg.output.resolved_summary_path), Path(cfg.output.path)
    if not is_main:
        return summary
    if _in_job_folder():  # hydra.job.chdir: a relative path is the job folder's, not where the user launched it
        summary_path, answers_path = Path(os.path.abspath(summary_path)), Path(os.path.abspath(answers_path))
    if not answered_now and summary_path.exists():
        kept = json.loads(summary_path.read_text(encoding="utf-8"))
        stale = kept.get("num_questions") != summary["num_questions"]
        if stale:  # counted from the file now; the answering runs' entries (auto_decoding, LP bytes, the settings
            # known once the model loaded, e.g. model.mkl_mode) stay
            kept = {**kept, **summary, "settings": kept.get("settings", summary.get("settings"))}
            answers.write_json(summary_path, kept)
        print(f"already answered in {answers_path}:")
        asked = {str(q.question_id) for q in questions}
        for record in records:
            if str(record["question_id"]) in asked:
                print(answers.first_line(record))
        which = "of the dataset" if cfg.dataset.limit is None else f"asked (dataset.limit={cfg.dataset.limit})"
        every = "the 1 question {} is" if len(questions) == 1 else f"all {len(questions)} questions {{}} are"
        print(f"{every.format(which)} already in {answers_path}; nothing to do "
              f"(summary {'counted again from the answers' if stale else 'kept'}: {summary_path})")
        return kept
    answers.write_json(summary_path, summary)
    shown = {k: v for k, v in summary.items() if k not in ("config", "versions", "settings")}
    if "auto_decoding" in shown:  # its latency curve shortened: the file keeps it whole
        from lp_runtime.auto import shown_entry

        shown["auto_decoding"] = shown_entry(shown["auto_decoding"])
    print(json.dumps(shown, indent=2))
    print(f"answers: {answers_path}\nsummary: {summary_path}")
    return summary


def _in_job_folder() -> bool:
    """Whether Hydra runs this job in its own folder (``hydra.job.chdir=true``)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized() and bool(HydraConfig.get().job.get("chdir"))


def _job(dict_cfg: DictConfig) -> None:
    jobs.apply_job_output(dict_cfg)  # a sweep job writes into its own folder
    jobs.submitit_rank_env()  # a job of Hydra's submitit launcher: one rank per task
    cfg = jobs.check_job(dict_cfg, jobs.command_line_overrides())
    before = _file_state(cfg.output.path)
    try:
        run(cfg)
    except BaseException as e:  # Ctrl-C or SIGTERM before the first answer: like a refusal, no run folder left
        if isinstance(e, KeyboardInterrupt) or cli.interrupted():
            _remove_run_dir_if_idle(cfg.output.path, before)
        raise
    _remove_run_dir_if_idle(cfg.output.path, before)  # every question was answered already: nothing was done


def _remove_run_dir_if_idle(path: str, before: tuple) -> None:
    """``cli.remove_refused_run_dir`` on rank 0 (another node may not see the answers file) when the answers file
    at ``path`` is as it was ``before``."""
    if cli.is_rank0() and _file_state(path) == before:
        cli.remove_refused_run_dir()


def _file_state(path: str) -> tuple:
    """(size, mtime in ns) of ``path``, or () when it does not exist: changes when an answer is appended."""
    try:
        st = Path(path).stat()
    except OSError:
        return ()
    return st.st_size, st.st_mtime_ns


INTERRUPTED = f"interrupted; {cli.RESUME}"


def main() -> None:
    cli.main(cli.hydra_app("generate", _job), interrupted=INTERRUPTED, check_argv=jobs.check_argv)


if __name__ == "__main__":
    main()
