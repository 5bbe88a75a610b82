"""Several ``python -m MODULE ...`` command lines in ONE fresh interpreter, for the bad-input tests.

Each of those commands fails before a model is loaded, so a separate process apiece spends nearly all its time
importing torch, transformers and Hydra. Here one subprocess (a clean interpreter, the test's environment) runs
``MODULE.main()`` once per command line (default ``lp_runtime.generate``; ``lp_runtime.report`` and ``scripts.bench``
too), in its working directory, with ``sys.argv`` set as ``python -m`` sets it (and the call's own environment
variables, if any, set for its duration), and records
what the process would have shown: the exit status (``SystemExit``'s code; 1 and a printed traceback for an
escaping exception, as the interpreter does) and everything written to file descriptors 1 and 2 during that call
(so log handlers and C code are captured too). Hydra clears its global state after every run.

    results = run_cli([["dataset=jsonl"], ["model.path=/nonexistent", "dataset.limit=1"],
                       Call(["ablation=true"], cwd="/tmp/x", module="scripts.bench"),
                       Call(["decoding=auto"], env={"LP_RUNTIME_CACHE": "/tmp/c"})], env)
    results[0].returncode, results[0].stderr

``Call(["copy", SRC, DST], module="cli_batch")`` copies a file between two command lines (``main`` below), so a test
can compare what a later command line left with what an earlier one wrote; ``["append", SRC, DST]`` appends SRC's
bytes to DST (an answers file appended to itself: every answer twice, as a hand edit might leave it).
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Call:
    """``python -m MODULE ARGS`` run in ``cwd`` (default: the repository root), with ``env`` added to the batch's
    environment for this call only (lp_runtime reads the variables it uses when it needs them, not at import)."""

    args: list[str]
    cwd: str = str(REPO)
    module: str = "lp_runtime.generate"
    env: Optional[dict] = None


def run_cli(calls: list, env: dict, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Run each call (a ``Call``, or an argument list for ``python -m lp_runtime.generate`` in the repository root)
    in one subprocess; one result per call."""
    calls = [c if isinstance(c, Call) else Call(list(c)) for c in calls]
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "calls.json", Path(tmp) / "results.json"
        spec.write_text(json.dumps([asdict(c) for c in calls]))
        proc = subprocess.run([sys.executable, __file__, str(spec), str(out)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0 and out.is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
        rows = json.loads(out.read_text())
    assert len(rows) == len(calls)
    return [subprocess.CompletedProcess(["python", "-m", c.module, *c.args], r["returncode"], r["stdout"],
                                        r["stderr"]) for c, r in zip(calls, rows)]


def main() -> None:
    """``cli_batch copy SRC DST`` (or ``append SRC DST``) as a command line of the batch: SRC's bytes, as the command
    lines before it left them, into (or appended to) DST."""
    command, src, dst = sys.argv[1:]
    if command not in ("copy", "append"):
        raise SystemExit(f"cli_batch: unknown command {command!r}")
    if command == "copy":
        shutil.copyfile(src, dst)
    else:
        data = Path(src).read_bytes()
        with open(dst, "ab") as f:
            f.write(data)


def _call(module, args: list[str]) -> int:
    sys.argv = [module.__file__, *args]
    try:
        module.main()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # what the interpreter does with an exception nobody caught
        traceback.print_exc()
        return 1
    return 0


def _main(spec: str, out: str) -> None:
    sys.path.insert(0, str(REPO))  # this checkout's lp_runtime, as `python -m` from the repository root finds it
    rows = []
    for call in json.loads(Path(spec).read_text()):
        os.chdir(call["cwd"])
        saved_env = {k: os.environ.get(k) for k in call.get("env") or {}}
        os.environ.update(call.get("env") or {})
        module = importlib.import_module(call["module"])
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        with tempfile.TemporaryFile() as o, tempfile.TemporaryFile() as e:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(o.fileno(), 1), os.dup2(e.fileno(), 2)
            start = time.perf_counter()
            try:
                code = _call(module, call["args"])
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                for fd, copy in saved.items():
                    os.dup2(copy, fd), os.close(copy)
            o.seek(0), e.seek(0)
            rows.append({"returncode": code, "stdout": o.read().decode(errors="replace"),
                         "stderr": e.read().decode(errors="replace"), "seconds": time.perf_counter() - start})
        for k, v in saved_env.items():  # the next call sees the batch's environment again
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    Path(out).write_text(json.dumps(rows))


if __name__ == "__main__":
    _main(*sys.argv[1:])
