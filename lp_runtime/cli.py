"""The command-line frame shared by ``python -m lp_runtime.generate`` and ``scripts/bench.py``:
``hydra_app(config_name, job)`` composes ``conf/<config_name>.yaml`` with the overrides and calls ``job``;
``main(app, ...)`` runs it. Bad input (``is_bad_input``) prints ``error: <one line>`` and exits 2, removing the run
folder Hydra made for it; Ctrl-C (130) and SIGTERM (143) print the ``interrupted`` line from rank 0, as does any
error raised after one of them (``interrupted``); anything else is a bug: Python's traceback."""
from __future__ import annotations

import dataclasses
import difflib
import errno
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NoReturn, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.overrides_visitor import HydraErrorListener, HydraOverrideVisitor
from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from lp_runtime import answers, data
from lp_runtime.config import ConfigError, ModelOutputError, PeerFailure, not_a_setting

# An absolute path: "../conf" would resolve as the Python module `conf` under `python -m`, found only when the
# launch directory is the repository root.
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def is_bad_input(e: BaseException) -> bool:
    """Errors that come from what the user gave (reported in one line) rather than from a bug (traceback)."""
    kinds: tuple[type, ...] = (ConfigError, ModelOutputError, answers.OutputError, answers.SettingsMismatchError,
                               data.DatasetError, OmegaConfBaseException, OSError)
    models = sys.modules.get("lp_runtime.models")  # ModelLoadError can only be raised once models is imported
    return isinstance(e, kinds + ((models.ModelLoadError,) if models else ())) or _overflow_key(e) is not None


def _overflow_key(e: BaseException) -> Optional[str]:
    """The setting OmegaConf names on an ``OverflowError`` (an integer too large for a float given to a float
    setting, ``sampling.temperature=1000...0``); None for any other error."""
    found = re.search(r"^\s*full_key: (\S+)$", str(e), re.M) if isinstance(e, OverflowError) else None
    return found.group(1) if found else None


def unknown_key(e: BaseException) -> Optional[str]:
    """For Hydra's refusal of an override whose key no setting has (``decoding.foo=1``), the line
    ``config.to_object`` gives for ``+decoding.foo=1``; for its refusal of a key that a dict setting does not hold
    yet (``sampling.category_temperature.x=0.7`` or ``sampling.category_temperature={x: 0.7}`` over
    ``sampling=mt_bench``'s keys), a line naming the key, the closest held one and the ``+`` override that adds it;
    None for any other error."""
    cause = e.__cause__
    if not isinstance(e, ConfigCompositionException) or not isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return None
    kind, path, key = getattr(cause, "object_type", None), str(cause.full_key or ""), str(cause.key or "")
    if dataclasses.is_dataclass(kind) and key and path.endswith(key):
        return not_a_setting(path, path[: -len(key)].rstrip("."), [f.name for f in dataclasses.fields(kind)])
    if kind is not dict or not key or not path.endswith("." + key):
        return None
    held = [str(k) for k in (cause.parent_node or {})]
    close = difflib.get_close_matches(key, held, n=1)
    known = (f" (did you mean {close[0]!r}?)" if close else "") + (f"; it holds {', '.join(held)}" if held else "")
    return f"{path[: -len(key) - 1]} has no key {key!r}{known}; add a new one with +{path}=VALUE"


def list_by_name(e: BaseException) -> Optional[str]:
    """For an override whose key reaches into a list by a name (``generation.stop_strings.x=1``; OmegaConf raises
    a bare ValueError or TypeError, or "Index 'x' (str) is not an int", while Hydra applies it): a line naming the
    override and the list; None for any other error."""
    override, tb = None, e.__traceback__
    while tb is not None:  # the override Hydra was applying, read from its frame in the traceback
        if tb.tb_frame.f_code.co_name == "_apply_overrides_to_config":
            override = tb.tb_frame.f_locals.get("override")
        tb = tb.tb_next
    text = str(e.__cause__ or e)
    name = re.search(r"(?:invalid literal for int\(\) with base 10: |Index )'([^']*)'", text)
    key = getattr(override, "key_or_group", None)
    if name is None or not isinstance(key, str) or name.group(1) not in key.split("."):
        return None
    parts = key.split(".")
    items = ".".join(parts[: parts.index(name.group(1))])
    return (f"{override.input_line}: {items} is a list, whose items are numbered from 0; give the whole list "
            f"({items}=[...]) or one item by its number ({items}.0=...)")


def one_line(e: BaseException) -> str:
    """``e``'s message in one line (``unknown_key``'s for an unknown key): its first line, Hydra's list of available
    options if any, and the first line of an OmegaConf cause (Hydra wraps OmegaConf's errors)."""
    known = unknown_key(e) or list_by_name(e)
    if known:
        return known
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"cannot write {e.filename or 'a file'}: {e.strerror}; free space there, then re-run the same "
                "command: the answers written so far are complete and a re-run resumes")
    if _overflow_key(e):
        return f"{_overflow_key(e)} is given an integer too large for a float; it must be a finite number"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    msg = lines[0]
    if len(lines) > 2 and lines[1].endswith(":"):  # "Available options in 'model':" then one option a line
        options = next((lines[2:i] for i in range(2, len(lines)) if lines[i].endswith(":")), lines[2:])
        msg += f" ({lines[1]} {', '.join(options)})"
    if isinstance(e.__cause__, OmegaConfBaseException) and str(e.__cause__).strip():
        msg = msg.rstrip(".") + ": " + str(e.__cause__).strip().splitlines()[0]
    if isinstance(e, OverrideParseException):  # a value the shell split at a space, or a bracket in it
        msg = re.sub(r"^[A-Za-z]+Exception: ", "", msg)  # the grammar's own exception name tells a user nothing
        msg += (" (every override is key=value; quote one whose value holds spaces or brackets as a whole, e.g. "
                "'output.path=my answers.jsonl' or 'model.name=\"a (b)\"')")
        if "~" in str(e):  # Hydra's grammar takes no bare ~ in a value, and the shell expands none after '='
            msg = msg[:-1] + "; a path starting with ~ too: 'output.path=\"~/answers.jsonl\"')"
        if not str(e).isascii():  # the grammar's unquoted values are ASCII
            msg = msg[:-1] + "; a value with characters outside ASCII too: 'output.path=\"outputs/é/a.jsonl\"')"
    return msg


MULTIRUN_FLAGS = ("-m", "--multirun")
# Hydra's flags that take a value (not an override); the first six name another config than conf/generate.yaml
CONFIG_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
VALUE_FLAGS = CONFIG_FLAGS + ("--experimental-rerun", "--cfg", "-c", "--package", "-p")
INFO_FLAGS = ("--info", "-i")  # Hydra's flag whose value is optional: one of INFO_CHOICES, else none
INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
# Hydra's flags that its argument parser refuses between overrides (all but --version, which prints and exits)
HYDRA_FLAGS = MULTIRUN_FLAGS + VALUE_FLAGS + INFO_FLAGS + ("--resolve", "--run", "-r", "--help", "-h", "--hydra-help",
                                                           "--shell-completion", "-sc")


def override_positions(argv: list[str]) -> list[int]:
    """Indices of the overrides in a command line: the arguments that are neither a flag nor a flag's value."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip or a.startswith("-") or (i and argv[i - 1] in INFO_FLAGS and a in INFO_CHOICES):
            skip = a in VALUE_FLAGS
            continue
        out.append(i)
    return out


def check_flag_order(argv: list[str]) -> None:
    """``ConfigError`` when one of Hydra's flags (``-m``, ``--cfg job``, ...) stands between overrides (key=value), or
    an override follows ``--info`` where its topic goes: Hydra's argument parser refuses both with a usage text."""
    info = next((i for i, a in enumerate(argv[:-1]) if a in INFO_FLAGS and argv[i + 1] not in INFO_CHOICES
                 and not argv[i + 1].startswith("-")), None)
    if info is not None:
        flag, word = argv[info], argv[info + 1]
        raise ConfigError(f"{flag} {word}: Hydra reads the word after {flag} as what to show "
                          f"({', '.join(INFO_CHOICES)}); name one first ({flag} config {word}) or put the "
                          f"overrides before {flag}")
    overrides = override_positions(argv)
    at = next((i for i, a in enumerate(argv) if a.split("=", 1)[0] in HYDRA_FLAGS
               and overrides and overrides[0] < i < overrides[-1]), None)
    if at is not None:
        flags = [a for i, a in enumerate(argv) if i not in overrides]
        valued = at + 1 < len(argv) and at + 1 not in overrides and not argv[at + 1].startswith("-")
        flag = " ".join(argv[at:at + 1 + valued])  # with its value: --cfg job, --info config
        raise ConfigError(f"{flag} stands between overrides; put it before them (or after all of them): "
                          f"{' '.join(flags + [argv[i] for i in overrides])}")


class _OneValueAKey(HydraOverrideVisitor):
    """Hydra's override visitor, except that a ``{key: value}`` giving one key twice raises ``ConfigError`` naming
    it: Hydra's builds the dict pair by pair, so the last value wins without a word."""

    def __init__(self, override: str) -> None:
        super().__init__(OverridesParser.create().functions)
        self.override = override

    def visitDictContainer(self, ctx):  # noqa: N802 (the grammar's name)
        out: dict = {}
        for i in range(1, ctx.getChildCount() - 1, 2):  # "{", pair, ",", pair, ..., "}"
            key, value = self.visitDictKeyValuePair(ctx.getChild(i))
            if key in out:
                raise ConfigError(f"{self.override}: the key {key!r} appears twice in one {{key: value}} dict, and "
                                  "Hydra would keep only its last value; give each key once")
            out[key] = value
        return out


def check_dict_keys(argv: list[str]) -> None:
    """``ConfigError`` naming the key when an override's ``{key: value}`` (``sampling.category_temperature``,
    the bench's ``per_category``, a dict in a sweep or a list) gives one key twice. The override is parsed by
    Hydra's own grammar; one that it cannot parse is left to Hydra's message."""
    from hydra.grammar.gen.OverrideLexer import CommonTokenStream, InputStream, OverrideLexer
    from hydra.grammar.gen.OverrideParser import OverrideParser

    hydra_parser = OverridesParser.create()
    for i in override_positions(argv):
        try:
            hydra_parser.parse_override(argv[i])
        except Exception:  # noqa: BLE001 - a syntax error or a bad function call: Hydra's own line names it
            continue
        lexer = OverrideLexer(InputStream(argv[i]))
        parser = OverrideParser(CommonTokenStream(lexer))
        for part in (lexer, parser):  # as Hydra's parse_rule: errors raised, not printed
            part.removeErrorListeners()
            part.addErrorListener(HydraErrorListener())
        _OneValueAKey(argv[i]).visit(parser.override())


def error_exit(line: str, code: int = 2) -> NoReturn:
    """``error: <line>`` on stderr, exit ``code``."""
    sys.stderr.write(f"error: {line}\n")  # one write: ranks sharing a file under PYTHONUNBUFFERED glued two lines
    sys.stderr.flush()
    sys.exit(code)


def fail(e: BaseException) -> NoReturn:
    """``error: <one line>`` on stderr, exit 2."""
    error_exit(one_line(e))


RESUME = "the answers written so far are complete: re-run the same command to resume"  # a dead or hung peer's line


def peer_failed(e: PeerFailure) -> NoReturn:
    """A rank died or hung: this rank's ``error:`` line (not a traceback per rank) and the resume hint, exit 1."""
    error_exit(f"{e}; {RESUME}", 1)


def is_rank0() -> bool:
    """True unless this process is a torchrun / Slurm rank other than 0 (for lines every rank would print)."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


_DIRS_BEFORE: set[str] = set()  # folders (2 levels below the launch directory) that existed before Hydra ran
_NEW_PARENTS: dict[str, set[str]] = {}  # hydra.run.dir / hydra.sweep.dir given -> its parents missing then
_STARTED = time.time()  # a run folder not changed since is an earlier run's (a fixed hydra.run.dir): kept


def _dirs_near(root: Path, depth: int = 2) -> set[str]:
    try:
        entries = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except OSError:
        return set()
    found = {os.path.abspath(e.path) for e in entries}
    for e in entries if depth > 1 else []:
        found |= _dirs_near(Path(e.path), depth - 1)
    return found


def _new_parents(argv: list[str]) -> dict[str, set[str]]:
    """For the last ``hydra.run.dir=`` and ``hydra.sweep.dir=`` in ``argv`` (without ``${...}``), the folders above
    it that do not exist yet: what the run makes."""
    out = {}
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        given = [a.split("=", 1)[1] for a in argv if a.startswith(key + "=")]
        if given and given[-1] and "${" not in given[-1]:
            out[key] = {str(p) for p in Path(os.path.realpath(os.path.expanduser(given[-1]))).parents
                        if not p.exists()}
    return out


def remove_refused_run_dir() -> None:
    """After a single run that refused or answered nothing, remove the run folder Hydra made for it when it holds
    only Hydra's records and an empty log, then the empty folders above it that the run made."""
    if not HydraConfig.initialized() or HydraConfig.get().mode == RunMode.MULTIRUN:
        return
    hc = HydraConfig.get()
    records = {f"{hc.job.name}.log", hc.output_subdir}
    if hc.output_subdir:
        records |= {f"{hc.output_subdir}/{n}" for n in ("config.yaml", "hydra.yaml", "overrides.yaml")}
    _remove_made(Path(hc.runtime.output_dir), _NEW_PARENTS.get("hydra.run.dir"),
                 lambda rel, p: rel in records and not (rel.endswith(".log") and p.stat().st_size > 0))


def remove_refused_sweep_dir() -> None:
    """After Slurm's sbatch refused a sweep's jobs, remove the sweep folder when it holds only what the launcher
    wrote for them (``multirun.yaml``, ``.submitit/``), then the empty folders above it that the run made."""
    if HydraConfig.initialized():
        _remove_made(Path(HydraConfig.get().sweep.dir), _NEW_PARENTS.get("hydra.sweep.dir"),
                     lambda rel, p: rel == "multirun.yaml" or rel.split("/")[0] == ".submitit")


def _remove_made(root: Path, new_parents: Optional[set[str]], allowed: Callable[[str, Path], bool]) -> None:
    """Remove ``root`` when every path under it is ``allowed(relative path, path)`` and ``root`` changed since this
    process started (else: an earlier run's), then the empty folders above it that were not there before: those in
    ``new_parents`` where the command line gave ``root`` (``_new_parents``), else new ones below the working one."""
    try:
        found = {str(p.relative_to(root)): p for p in root.rglob("*")}
        if not root.is_dir() or not all(allowed(rel, p) for rel, p in found.items()):
            return
        if root.stat().st_mtime < _STARTED - 1.0:  # nothing made in it by this run: an earlier run's records
            return
        for rel in sorted(found, key=len, reverse=True):  # files, then their folders, then root
            (found[rel].rmdir if found[rel].is_dir() else found[rel].unlink)()
        root.rmdir()
        cwd = Path.cwd().resolve()
        for parent in root.resolve().parents:
            # /tmp/x/a of hydra.run.dir=/tmp/x/a/b (a new user), never an empty folder of the user's deeper than
            # _DIRS_BEFORE looks (a review)
            made = (str(parent) in new_parents if new_parents is not None else
                    cwd in parent.parents and str(parent) not in _DIRS_BEFORE)
            if not made or any(parent.iterdir()):
                break
            parent.rmdir()
    except OSError:  # another rank removed it first, or it changed under us: leave the rest
        return


def hydra_app(config_name: str, job: Callable[[DictConfig], None]) -> Callable[[], None]:
    """The ``@hydra.main`` function of a command: ``job(dict_cfg)`` on ``conf/<config_name>.yaml`` plus the
    command line; bad input ends the process with ``fail``."""

    @hydra.main(config_path=CONF_DIR, config_name=config_name, version_base=None)
    def _app(dict_cfg: DictConfig) -> None:
        try:
            job(dict_cfg)
        except Exception as e:
            if isinstance(e, PeerFailure) and not interrupted():
                peer_failed(e)  # here, or Hydra prints "Error executing job with overrides: [...]" above the line
            if not is_bad_input(e) or interrupted():
                raise
            remove_refused_run_dir()  # README: a refused setting leaves no new file or folder
            fail(in_sweep_job(e))

    return _app


def launcher_is(launcher, kind: str) -> bool:
    """Whether the ``hydra.launcher`` node ``launcher`` is Hydra's ``kind`` (``"BasicLauncher"``: the jobs run one
    after another in this process; ``"SlurmLauncher"``: submitit's for Slurm)."""
    return str(launcher.get("_target_", "")).endswith(kind)


def override_key(override: str) -> str:
    """The key a Hydra override sets: ``"decoding.window_size"`` for ``"+decoding.window_size=3"``."""
    return override.split("=", 1)[0].lstrip("+~")


def sweep_point(overrides: list[str], swept: set[str]) -> str:
    """What a sweep job gives the keys the sweep varies: ``"decoding=greedy decoding.window_size=3"``."""
    return " ".join(o for o in overrides if override_key(o) in swept)


def in_sweep_job(e: BaseException) -> BaseException:
    """``e`` naming the sweep job it stopped where Hydra's default launcher runs a sweep's jobs one after another in
    this process (its line said nothing of the job, nor that the earlier jobs had finished), else ``e``."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return e
    hc = HydraConfig.get()
    if not launcher_is(hc.launcher, "BasicLauncher"):  # submitit's: its own line (main)
        return e
    try:
        argv = sys.argv[1:]  # without Hydra's flags and their values (-cn generate)
        given = OverridesParser.create().parse_overrides([argv[i] for i in override_positions(argv)])
        swept = {o.key_or_group for o in given if o.is_sweep_override()}
    except HydraException:
        swept = set()
    point = sweep_point(list(hc.overrides.task), swept)
    return ConfigError(f"sweep job {hc.job.num}{f' ({point})' if point else ''}: {one_line(e)}; the jobs before it "
                       "finished (their answers are kept), the later ones were not run")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, Slurm at the time limit, torchrun stopping its workers), taken like Ctrl-C."""


_SIGNALS: list[int] = []  # SIGINT / SIGTERM this process received (``main``'s handlers)
_BEFORE_EXIT: dict = {}  # the handlers ``main`` replaced as it exits (``_ignore_signals``)
_HOOKS: dict = {}  # the sys.unraisablehook ``take_signals`` replaced


def _on_signal(signum, frame) -> None:
    _SIGNALS.append(signum)
    check_interrupted()


def _on_unraisable(unraisable) -> None:
    """An interrupt raised inside a weakref callback or finalizer, where Python drops exceptions (a SIGTERM while
    torch compiled the step buckets was printed as "Exception ignored" and the run went on for 7 minutes; a new
    user, 2026-12-07): the signal comes again 10 ms later, from a thread, to land outside it (again if it does not),
    unless this process no longer takes it (exiting). It stays recorded (``interrupted``) meanwhile. Anything else
    goes to the hook that was there before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _SIGNALS:
        timer = threading.Timer(0.01, _send_again, (_SIGNALS[-1],))
        timer.daemon = True  # not waited for at exit
        timer.start()
    else:
        _HOOKS.get("before", sys.__unraisablehook__)(unraisable)


def _send_again(signum: int) -> None:
    if signal.getsignal(signum) is _on_signal:
        os.kill(os.getpid(), signum)


def take_signals() -> None:
    """SIGTERM, and SIGINT unless this process started with it ignored (`cmd &`), recorded and raised as
    ``Terminated`` / ``KeyboardInterrupt`` (``check_interrupted``; ``_on_unraisable`` where Python dropped it):
    ``main``'s handlers, and a submitit job's."""
    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    if sys.unraisablehook is not _on_unraisable:
        _HOOKS["before"], sys.unraisablehook = sys.unraisablehook, _on_unraisable


def interrupted() -> bool:
    """True once Ctrl-C or SIGTERM reached this process: an error raised after it is the interrupt's doing (a
    library may catch the ``KeyboardInterrupt``: transformers' lazy imports raise ``ModuleNotFoundError``)."""
    return bool(_SIGNALS)


def check_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` (``Terminated`` for SIGTERM) when Ctrl-C or SIGTERM reached this process but a
    library caught the exception (seen once in 81 Ctrl-Cs while a run loaded): the job calls it between answers."""
    if _SIGNALS:
        raise Terminated() if _SIGNALS[-1] == signal.SIGTERM else KeyboardInterrupt()


def _ignore_signals(how: signal.Handlers = signal.SIG_IGN) -> None:
    """SIGINT and SIGTERM taken by ``how`` from now on, as the process exits (ignored after a completed run:
    CPython's exit resets a Python handler to the default, which killed it, 130 and no line; the default after an
    interrupt); a later ``main`` in this interpreter restores them."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        _BEFORE_EXIT.setdefault(sig, signal.signal(sig, how))


def _exit(code: int) -> NoReturn:
    """``sys.exit(code)``; in a rank of a process group ``os._exit`` once the output is flushed: the group's teardown
    at interpreter exit waits for a collective a peer never joins (a rank interrupted while waiting for rank 0 hung
    there until torchrun killed it, 30 s later). Every ``finally`` has run by now; atexit handlers do not."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _job_error_line(e: BaseException) -> Optional[str]:
    """The last ``error:`` line (without the prefix) of a submitit job's stderr in the launcher's
    ``UncompletedJobError`` / ``FailedJobError``; None for anything else."""
    if type(e).__name__ not in ("UncompletedJobError", "FailedJobError"):
        return None
    lines = [line[len("error: "):] for line in str(e).splitlines() if line.startswith("error: ")]
    return lines[-1] if lines else None


def main(app: Callable[[], None], *, interrupted: str,
         check_argv: Optional[Callable[[list[str]], None]] = None) -> None:
    """Run ``app`` (``hydra_app``) with the exits of the module docstring, after ``check_argv(sys.argv[1:])``,
    which may raise ``ConfigError``. Once ``app`` completed, SIGINT and SIGTERM are ignored (the process exits; a
    later ``main`` in the same interpreter restores its handlers)."""
    for sig, handler in _BEFORE_EXIT.items():  # an earlier main in this interpreter (tests/cli_batch.py) ignored them
        signal.signal(sig, handler)
    _BEFORE_EXIT.clear()
    take_signals()
    # Without it Hydra prints composition errors (a wrong type, an unknown key) itself and exits with 1.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _DIRS_BEFORE.update(_dirs_near(Path.cwd()))
    _NEW_PARENTS.clear()
    _NEW_PARENTS.update(_new_parents(sys.argv[1:]))
    try:
        check_flag_order(sys.argv[1:])
        check_dict_keys(sys.argv[1:])
        if check_argv is not None:
            check_argv(sys.argv[1:])
        app()
        check_interrupted()  # the run ended although a Ctrl-C came: it still exits as interrupted
        _ignore_signals()  # all is written: the interpreter's exit (~0.7 s with torch) ends in 0
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) or (_SIGNALS and not isinstance(e, SystemExit)):
            _ignore_signals(signal.SIG_DFL)  # a second Ctrl-C while exiting ends it, with no KeyboardInterrupt
            # traceback from an atexit callback (ignoring it left an exit held by a thread unstoppable)
            if is_rank0():
                sys.stderr.write(interrupted + "\n")
                sys.stderr.flush()
            _exit(143 if isinstance(e, Terminated) or _SIGNALS[-1:] == [signal.SIGTERM] else 130)
        if isinstance(e, (HydraException, OmegaConfBaseException, ConfigError)) or list_by_name(e) or _overflow_key(e):
            fail(e)
        if isinstance(e, PeerFailure):
            peer_failed(e)
        if isinstance(e, OSError) and e.filename is not None:  # the job's own are caught in hydra_app: Hydra's folders
            error_exit(f"cannot make the run folder {e.filename}: {e.strerror} (set by hydra.run.dir, or "
                        "hydra.sweep.dir with -m; the launch scripts' RUN_DIR)")
        submitit = sys.modules.get("submitit.core.utils")
        if submitit is not None and isinstance(e, submitit.FailedJobError):  # sbatch refused the job array
            remove_refused_sweep_dir()
            error_exit(f"Slurm's sbatch refused the sweep's jobs: {one_line(e)}; no job was submitted (the "
                        "hydra.launcher.* settings are sbatch's options)")
        refused = _job_error_line(e)
        if refused:  # a sweep job (submitit: lp_local, lp_slurm) refused its input: its line, not the launcher's trace
            error_exit(f"a sweep job stopped: {refused}", 1 if refused.endswith(RESUME) else 2)  # 1: a dead peer
        raise
