"""One table over several runs of ``lp_runtime.generate``: a sweep's folder, run folders or answers files.

    python -m lp_runtime.report outputs/multirun/2026-11-30_10-00-00
    python -m lp_runtime.report outputs/a.jsonl outputs/b.jsonl --baseline outputs/a.jsonl --out outputs/report

One row per run: the settings that differ between runs, S, accepted tokens per step, tok/s, ms/step, speedup over
the baseline run (default the greedy run that shares the most questions with the others) over the questions both
answered from the same dataset, and, for greedy runs, how many answers are token-identical to it.
Written to ``report.csv``, ``.json``, ``.md`` and (with matplotlib) ``.png`` in ``--out``."""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from omegaconf import OmegaConf

from lp_runtime import answers, metrics

# Settings that name where a run wrote, not how it ran: never shown as a difference.
_IGNORED = ("output.path", "output.summary_path", "progress")
ADVICE = "give answers files of python -m lp_runtime.generate, or a folder holding them"
SHOWN = 5  # problems a refusal names; the rest are counted


class ReportError(ValueError):
    """A PATH given to the report holds no run, or the baseline names no run."""


def one_refusal(problems: list[str], what: str, advice: Optional[str]) -> str:
    """One line: ``<n> <what>: `` (for more than one), the first ``SHOWN`` problems, how many more, ``advice``."""
    shown = problems[:SHOWN] + ([f"and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else [])
    head = f"{len(problems)} {what}: " if len(problems) > 1 else ""
    return head + "; ".join(shown) + (f"; {advice}" if advice else "")


def find_runs(paths: Sequence[str]) -> list[Path]:
    """Answers files named by ``paths`` (folders searched recursively), in order, no duplicates; ``ReportError``
    naming every path that holds no run."""
    found: list[Path] = []
    problems: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():  # the answers file of each record (any name: output.path=a.txt writes a.txt.settings.json)
            hits = sorted({a for r in (*p.rglob("*.summary.json"), *p.rglob("*.settings.json"))
                           if (a := answers.answers_of(r)).is_file()})
            if not hits:
                problems.append(f"{p} holds no answers file with a summary or settings beside it")
            found += hits
        elif p.name.endswith((".summary.json", ".settings.json")):  # a record beside its answers: that run
            found.append(answers.answers_of(p))
        elif p.is_file():
            found.append(p)
        else:
            problems.append(f"{p} does not exist" if not p.exists() else f"{p} is neither an answers file nor a folder")
    if problems:
        advice = ADVICE if len(problems) > 1 or problems[0].endswith(" does not exist") else None
        raise ReportError(one_refusal(problems, "PATHs hold no run", advice))
    seen: dict[Path, Path] = {}
    for f in found:  # one row per file however it was named (b.jsonl, ./b.jsonl, an absolute path)
        seen.setdefault(f.resolve(), f)
    return list(seen.values())


def jobs_without_answers(paths: Sequence[str]) -> list[str]:
    """``"<folder> (<its overrides>)"`` for each Hydra job under ``paths`` that holds no answer, in job order."""
    out = []
    for p in map(Path, paths):
        if not p.is_dir():
            continue
        jobs = [rec.parent.parent for rec in p.rglob(".hydra/overrides.yaml")]
        for job in sorted(jobs, key=lambda j: (len(str(j)), str(j))):
            if any(answers.has_answers(a) for a in job.glob("*.jsonl")) or _answered_elsewhere(job):
                continue
            try:
                overrides = " ".join(OmegaConf.load(job / ".hydra" / "overrides.yaml") or []) or "no overrides"
            except (OSError, ValueError):
                overrides = "overrides unreadable"
            out.append(f"{job.relative_to(p) if job != p else job} ({overrides})")
        out += _jobs_not_started(p)
    return out


def _jobs_not_started(sweep: Path) -> list[str]:
    """``"<num> (<its overrides>, not started)"`` for each job a sweep folder's ``multirun.yaml`` lists whose folder
    Hydra never made (a sweep stopped before it); none when the jobs' folders are not named by job number."""
    from .jobs import sweep_jobs

    try:
        record = OmegaConf.load(sweep / "multirun.yaml")
        if OmegaConf.to_container(record.hydra.sweep, resolve=False).get("subdir") != "${hydra.job.num}":
            return []
        jobs, _ = sweep_jobs(list(record.hydra.overrides.task))
    except Exception:  # noqa: BLE001 - no record, or one this Hydra cannot read: nothing more to list
        return []
    return [f"{num} ({' '.join(job) or 'no overrides'}, not started)"  # as the started jobs' overrides show
            for num, job in enumerate(jobs) if not (sweep / str(num) / ".hydra").is_dir()]


def _answered_elsewhere(job: Path) -> bool:
    """Whether a Hydra job folder's run wrote answers outside it (a single run's ``output.path``, relative to
    the directory it started in, which Hydra records)."""
    try:
        path = OmegaConf.load(job / ".hydra" / "config.yaml").output.path
        cwd = OmegaConf.load(job / ".hydra" / "hydra.yaml").hydra.runtime.cwd
    except Exception:  # noqa: BLE001 - an unreadable or partial record: the folder is listed as before
        return False
    return isinstance(path, str) and "${" not in path and answers.has_answers(Path(cwd) / path)


def load_run(path: Path) -> dict[str, Any]:
    """``{"path", "records", "metrics", "settings"}`` of one run; metrics recomputed from the answers."""
    records = answers.load_answers(path, trim=False, advice=ADVICE)  # [] when the file does not exist
    recorded = _recorded_settings(path)
    applied = {k[len(answers.APPLIED):]: recorded.pop(k) for k in list(recorded) if k.startswith(answers.APPLIED)}
    recorded.update({f"sampling.{k}": v for k, v in applied.items()})  # sampling=model: the values it applied
    return {"path": path, "records": records, "metrics": metrics.summarize(records), "settings": recorded}


def _recorded_settings(path: Path) -> dict[str, Any]:
    """The settings recorded beside answers ``path``: its .settings.json's, else its .summary.json's ``settings``
    or flattened ``config``; {} when none is a non-empty object (a record holding ``null`` or a list: no settings)."""
    recorded = answers.read_settings(answers.beside(path, ".settings.json"), any_format=True)  # non-empty dict or None
    if recorded:
        return dict(recorded)
    summary = answers.read_json(answers.beside(path, ".summary.json"))
    settings, config = (summary.get("settings"), summary.get("config")) if isinstance(summary, dict) else (None, None)
    if isinstance(settings, dict) and settings:
        return dict(settings)
    return answers.flatten(config) if isinstance(config, dict) and config else {}


def is_greedy(run: dict) -> bool:
    """Greedy tokens (temperature 0, no per-category temperature, and every answer recorded at temperature 0,
    which ``sampling=model`` takes from the model): answers comparable token by token."""
    s = run["settings"]
    return (not s.get("sampling.temperature") and not s.get("sampling.category_temperature")
            and not any(c.get("temperature") for r in run["records"] for c in r.get("choices", [])[:1]
                        if isinstance(c, dict)))


def is_plain_greedy(run: dict) -> bool:
    """A ``decoding=greedy`` run with greedy tokens (``is_greedy``): what speedups are best taken over."""
    return run["settings"].get("decoding.method") == "greedy" and is_greedy(run)


def differing_keys(runs: Sequence[dict]) -> list[str]:
    """Setting keys whose value is not the same in every run (sorted)."""
    keys = sorted({k for r in runs for k in r["settings"]} - set(_IGNORED))
    return [k for k in keys if len({json.dumps(r["settings"].get(k), sort_keys=True) for r in runs}) > 1]


def pick_baseline(runs: Sequence[dict], choice: Optional[str]) -> int:
    """Index of the baseline run: ``choice`` as the label the table's ``run`` column prints (a sweep's job number
    among them), a row number, or the path of a run's answers file or of the folder holding only that run (relative
    to the working directory, or absolute), else the greedy run that shares the most questions with the runs
    (``shared``; the first on ties), else 0."""
    if choice is not None:
        labels = _labels(runs)
        if labels.count(choice) == 1:  # what the table shows: job "1" where job 0 has no answers is row 0
            return labels.index(choice)
        if choice.isdigit() and int(choice) < len(runs):
            return int(choice)
        want = Path(os.path.expanduser(choice)).resolve()
        named = [i for i, r in enumerate(runs) if want in (r["path"].resolve(), r["path"].resolve().parent)]
        if len(named) == 1:
            return named[0]
        if named:
            raise ReportError(f"--baseline {choice!r} is the folder of {len(named)} runs; give one of their files: "
                              f"{', '.join(str(runs[i]['path']) for i in named)}")
        raise ReportError(f"--baseline {choice!r} is neither a run as the table names it ({', '.join(labels)}), a row "
                          f"number (0..{len(runs) - 1}) nor the path of one of the runs: "
                          f"{', '.join(str(r['path']) for r in runs)}")
    greedy = [i for i, r in enumerate(runs) if is_plain_greedy(r)]
    return max(greedy, key=lambda i: (sum(len(shared(runs[i], r)) for r in runs), -i), default=0)


def _prompts(run: dict) -> tuple:
    """What a run's question ids ask: its dataset (the same ids in two files are other prompts), whether only
    first turns, and how many tokens a turn may have (answers of 16 and of 32 tokens differ in turns, speed and
    ids)."""
    s = run["settings"]
    path = s.get("dataset.path")
    file = answers.real_path(path) if isinstance(path, str) and path else path  # q.jsonl and ./q.jsonl are one
    return s.get("dataset.name"), file, s.get("dataset.first_turn_only"), s.get("generation.max_new_tokens")


def shared(run: dict, base: dict) -> set[str]:
    """The question ids both runs answered from the same prompts (none when ``_prompts`` differ)."""
    if _prompts(run) != _prompts(base):
        return set()
    return {str(r["question_id"]) for r in run["records"]} & {str(r["question_id"]) for r in base["records"]}


def _tokens_per_s(run: dict, ids: set[str]) -> Optional[float]:
    return metrics.summarize([r for r in run["records"] if str(r["question_id"]) in ids])["tokens_per_s"]


def identical(run: dict, base: dict, ids: set[str]) -> tuple[Optional[int], int]:
    """(questions among ``ids`` with the same output ids in every turn, how many were compared); (None, 0) unless
    both runs are greedy."""
    if not (is_greedy(run) and is_greedy(base)):
        return None, 0
    ref = {str(r["question_id"]): r["choices"][0]["output_ids"] for r in base["records"]
           if str(r["question_id"]) in ids}
    pairs = [(r["choices"][0]["output_ids"], ref[str(r["question_id"])]) for r in run["records"]
             if str(r["question_id"]) in ref]
    return sum(a == b for a, b in pairs), len(pairs)


def _labels(runs: Sequence[dict]) -> list[str]:
    """Short run names: the path below the runs' common folder (a job folder for ``<job>/answers.jsonl``)."""
    paths = [r["path"].resolve() for r in runs]
    root = (Path(os.path.commonpath([p.parent for p in paths])) if len(paths) > 1  # one run: its folder's name for
            else paths[0].parent.parent if paths[0].name == "answers.jsonl" else paths[0].parent)  # <job>/answers.jsonl
    out = []
    for p in paths:
        rel = p.relative_to(root)
        out.append(str(rel.parent) if p.name == "answers.jsonl" and str(rel.parent) != "." else str(rel))
    return out


def build_table(runs: Sequence[dict], baseline: int) -> tuple[list[dict], list[str]]:
    """One row per run (``keys`` = the differing settings, each a column) and those keys."""
    keys = differing_keys(runs)
    base = runs[baseline]
    rows = []
    for label, run in zip(_labels(runs), runs):
        m = run["metrics"]
        ids = shared(run, base)  # speedup over the questions both answered: other prompts are no comparison
        same, compared = identical(run, base, ids)
        tps, base_tps = (_tokens_per_s(run, ids), _tokens_per_s(base, ids)) if ids else (None, None)
        rows.append({
            "run": label, "baseline": run is base, **{k: run["settings"].get(k) for k in keys},
            "questions": m["num_questions"], "turns": m["num_turns"], "new_tokens": m["new_tokens"],
            "decoding_steps": m["decoding_steps"], "step_compression": m["step_compression"],
            "mean_accepted_tokens": m["mean_accepted_tokens"], "tokens_per_s": m["tokens_per_s"],
            "seconds_per_step": m["seconds_per_step"],
            "speedup": tps / base_tps if tps and base_tps else None, "shared": len(ids),
            "identical": same, "compared": compared, "answers": str(run["path"]),
        })
    return rows, keys


def fmt(v: Any, spec: str) -> str:
    """``v`` formatted by ``spec``; "-" for None."""
    return "-" if v is None else format(v, spec)


def format_table(table: Sequence[dict], groups: Optional[Sequence[str]] = None, *,
                 columns: Sequence[tuple[str, Callable[[dict], str]]], left: int = 2,
                 markdown: bool = False) -> str:
    """A fixed-width (or, ``markdown``, GitHub markdown) table of ``table``'s rows whose ``group`` is in
    ``groups`` (default all). ``columns``: (header, row -> cell) pairs; the first ``left`` are left-aligned."""
    head = tuple(h for h, _ in columns)
    lines = [tuple(cell(r) for _, cell in columns) for r in table if groups is None or r["group"] in groups]
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    fmt = lambda row: "  ".join(x.ljust(w) if i < left else x.rjust(w)  # noqa: E731
                                for i, (x, w) in enumerate(zip(row, widths)))
    if markdown:
        fmt = lambda row: "| " + " | ".join(x.ljust(w) for x, w in zip(row, widths)) + " |"  # noqa: E731
        rule = "|" + "|".join(":" + "-" * (w + 1) if i < left else "-" * (w + 1) + ":"
                              for i, w in enumerate(widths)) + "|"
        return "\n".join([fmt(head), rule] + [fmt(r) for r in lines])
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths))] + [fmt(r) for r in lines])


def write_results(out_dir: str, table: Sequence[dict], rows: Sequence[dict], extra: dict[str, Any], *,
                  columns: Sequence[str], name: str) -> dict[str, str]:
    """Write ``<name>.csv`` (``columns``) and ``<name>.json`` (``extra``, table, rows) in ``out_dir``; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"csv": os.path.join(out_dir, f"{name}.csv"), "json": os.path.join(out_dir, f"{name}.json")}
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows({k: r[k] for k in columns} for r in table)
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump({**extra, "table": list(table), "rows": list(rows)}, f, indent=1)
    return paths


def _cell(v: Any) -> str:
    return "-" if v is None else json.dumps(v) if isinstance(v, (list, dict, bool)) else str(v)


def table_columns(keys: Sequence[str]) -> list:
    """(header, cell) pairs for ``format_table``."""
    f = fmt
    return ([("run", lambda r: r["run"] + (" (baseline)" if r["baseline"] else ""))]
            + [(k, lambda r, k=k: _cell(r[k])) for k in keys]
            + [("questions", lambda r: str(r["questions"])), ("turns", lambda r: str(r["turns"])),
               ("S", lambda r: f(r["step_compression"], ".3f")),
               ("acc/step", lambda r: f(r["mean_accepted_tokens"], ".3f")),
               ("tok/s", lambda r: f(r["tokens_per_s"], ".2f")),
               ("ms/step", lambda r: f(None if r["seconds_per_step"] is None else 1e3 * r["seconds_per_step"], ".1f")),
               ("speedup", lambda r: f(r["speedup"], ".3f")),
               ("identical", lambda r: "-" if r["identical"] is None or not r["compared"]  # none shared
                else f"{r['identical']}/{r['compared']}")])


CSV_COLUMNS = ("run", "questions", "turns", "new_tokens", "decoding_steps", "step_compression", "mean_accepted_tokens",
               "tokens_per_s", "seconds_per_step", "speedup", "identical", "compared", "baseline", "answers")


def plot(rows: Sequence[dict], out_dir: str) -> Optional[str]:
    """``report.png``: S and speedup per run (None when matplotlib is not installed)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(max(6, 0.9 * len(rows) + 3), 4))
    names = [r["run"] for r in rows]
    for ax, key, label in ((axes[0], "step_compression", "step compression S"),
                           (axes[1], "speedup", "speedup (tok/s)")):
        ax.bar(range(len(rows)), [r[key] or 0.0 for r in rows])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(rows)), names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel(label)
    path = os.path.join(out_dir, "report.png")
    with warnings.catch_warnings():  # a run named in a script the font lacks: its boxes, not 4 warnings on stderr
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def shared_note(rows: list[dict]) -> str:
    """The line under the table naming the runs that share only some questions with the baseline (fewer than the
    run or the baseline answered: tok/s and ms/step then count other questions than speedup does), or none ('-'
    in their cells); "" when every run shares all of its and the baseline's questions."""
    base = next(r for r in rows if r["baseline"])
    some = [r["run"] for r in rows if not r["baseline"] and 0 < r["shared"] < max(r["questions"], base["questions"])]
    none = [r["run"] for r in rows if not r["baseline"] and not r["shared"]]
    parts = ([f"fewer than all for {', '.join(some)} (tok/s and ms/step count all of a run's questions)"]
             if some else []) + ([f"none for {', '.join(none)} ('-')"] if none else [])
    return (f"speedup and identical count only the questions a run shares with the baseline {base['run']} (the same "
            f"dataset, question id, dataset.first_turn_only and generation.max_new_tokens): {'; '.join(parts)}"
            ) if parts else ""


def precision_note(rows: list[dict], runs: Sequence[dict]) -> str:
    """The line under the table when a greedy run in a 16-bit dtype (or against a baseline in one) is not identical
    on every question it shares: there greedy may part at a rounding tie without a fault; "" otherwise."""
    half = {r["run"]: run["settings"].get("model.resolved_dtype") for r, run in zip(rows, runs)
            if run["settings"].get("model.resolved_dtype") in ("bfloat16", "float16")}
    base = next(r for r in rows if r["baseline"])
    parted = [r["run"] for r in rows if r["compared"] and r["identical"] < r["compared"]
              and (r["run"] in half or base["run"] in half)]
    if not parted:
        return ""
    dtypes = " / ".join(sorted({half[r] for r in (*parted, base["run"]) if r in half}))  # those of the comparisons
    return (f"{', '.join(parted)}: not identical on every question, with {dtypes} in the comparison: greedy in a "
            "16-bit dtype may part at a rounding tie (the two largest logits within its rounding) without a fault; "
            "README, Precision (scripts/bench.py checks each parting)")


def baseline_note(base: dict, label: str, choice: Optional[str]) -> str:
    """The line under the table when no ``--baseline`` was given and no plain greedy run was among the runs (the
    first run is then the baseline, so its speedup of 1.000 is over itself); "" otherwise."""
    if choice is not None or is_plain_greedy(base):
        return ""
    return (f"no plain greedy run (decoding=greedy, greedy sampling) among these: speedup is over {label}, the first "
            "run; give a decoding=greedy run of the same questions for speedup over greedy, or choose with --baseline")


def report(paths: Sequence[str], *, baseline: Optional[str] = None, out_dir: Optional[str] = None,
           figure: bool = True) -> dict[str, Any]:
    """Build, print and write the table; ``{"rows", "keys", "text", "files", "missing"}``. Raises ``ReportError``."""
    missing = jobs_without_answers(paths)
    try:
        found = find_runs(paths)
    except ReportError as e:
        if missing:
            raise ReportError(f"{e}; jobs without answers: {'; '.join(missing)}") from None
        raise
    runs = [load_run(p) for p in found]
    empty = [f"{run['path']} holds no answers" for run in runs if not run["records"]]
    if empty:  # an empty file (a run leaves none: a refused or interrupted run removes its own)
        raise ReportError(one_refusal(empty, "answers files are empty", "give answers files of python -m "
                                      "lp_runtime.generate"))
    if out_dir is not None:
        blocked = next((p for p in (Path(out_dir), *Path(out_dir).parents) if p.exists() and not p.is_dir()), None)
        if blocked is not None:  # --out file or --out file/sub: an OS error otherwise
            kind = "a file" if blocked.is_file() else "not a folder"  # /dev/null: a device
            raise ReportError(f"--out {out_dir}: {blocked} is {kind}; give a folder for report.csv/.json/.md/.png")
    base = pick_baseline(runs, baseline)
    rows, keys = build_table(runs, base)
    columns = table_columns(keys)
    text = format_table(rows, columns=columns, left=1 + len(keys))
    notes = shared_note(rows), baseline_note(runs[base], rows[base]["run"], baseline), precision_note(rows, runs)
    for note in notes:
        text += "\n" + note if note else ""
    if missing:
        text += "\njobs without answers (refused, failed or not run yet): " + "; ".join(missing)
    running = [f"{run['path']} ({holder})" for run in runs if (holder := answers.lock_holder(run["path"]))]
    if running:  # its rows count the answers written so far
        text += "\nstill being written by a running job, counted as far as written: " + "; ".join(running)
    cut = [str(run["path"]) for run in runs if answers.cut_last_line(run["path"])]
    if cut:  # a killed run's partial line: not counted, and the next run of the job cuts it and answers it again
        text += ("\nthe last line of " + "; ".join(cut) + " was cut off (a run stopped while writing it) and is "
                 "not counted: re-run that job to finish it")
    where = f"--out {out_dir}"
    if out_dir is None:
        first = Path(paths[0])
        out_dir = str(first if first.is_dir() else first.parent)
        where = f"{out_dir} (the first PATH's folder, where the report goes without --out)"
    try:
        files = write_results(out_dir, rows, [], {"differing_settings": keys, "jobs_without_answers": missing},
                              columns=["run", *keys, *CSV_COLUMNS[1:]], name="report")
        files["md"] = os.path.join(out_dir, "report.md")
        Path(files["md"]).write_text(format_table(rows, columns=columns, left=1 + len(keys), markdown=True) + "\n",
                                     encoding="utf-8")
        if figure and (png := plot(rows, out_dir)):
            files["png"] = png
        elif os.path.isfile(os.path.join(out_dir, "report.png")):  # an earlier report's: it would not match
            os.remove(os.path.join(out_dir, "report.png"))
    except OSError as e:  # a folder that cannot be made or written (/proc/x, read-only): the OS error named no option
        name = e.filename and os.path.dirname(os.path.abspath(e.filename)) == os.path.abspath(out_dir)
        what = f" {os.path.basename(e.filename)}" if name else ""
        raise ReportError(f"{where}: cannot write{what} there: {e.strerror or e}; give --out a folder you can "
                          "write") from e
    return {"rows": rows, "keys": keys, "text": text, "files": files, "missing": missing}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lp_runtime.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a sweep folder, run folders or answers files")
    parser.add_argument("--baseline", help="the baseline run as the table's run column names it, its row number, or "
                        "its path (default: the greedy run that shares the most questions with the others)")
    parser.add_argument("--out", help="folder for report.csv/.json/.md/.png (default: the first PATH's folder)")
    parser.add_argument("--no-figure", action="store_true", help="skip report.png")
    args = parser.parse_args(argv)
    try:
        result = report(args.paths, baseline=args.baseline, out_dir=args.out, figure=not args.no_figure)
    except (ReportError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(result["text"])
    print("written: " + ", ".join(result["files"].values()))


if __name__ == "__main__":
    main()
