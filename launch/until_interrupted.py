"""Copy stdin (torchrun's stderr, with its ranks'; and their stdout where it is the same terminal or file) to stderr
up to the line that ends the run, then replace the rest (torchrun's traceback and failure report, the other ranks'
copies of the line) with at most one line.

The line that ends the run starts with ``interrupted; `` (rank 0, on Ctrl-C or SIGTERM) or ``error: `` (every
rank, for a bad setting or a dead peer), or it is torchrun's own ``failed (exitcode: ...)`` line (a rank died
without a line of its own). At the end of the input the rest is read for torchrun's report, and:

- a rank killed by a signal other than SIGINT / SIGTERM (``kill -9``, the kernel's out-of-memory killer, a
  segmentation fault) is named in one ``error: rank R was killed by signal ...`` line, exit 1 -- the survivors'
  line (torchrun stopped them with SIGTERM, or their collective failed) is a consequence and is dropped;
- otherwise the held line is shown; exit 130 after ``interrupted; ``; after ``error: `` 2 when a rank exited with
  2 (a refused setting; the others may have failed after it, their peer gone) or torchrun's report names none,
  else the failed rank's exit code (1: a dead peer);
- torchrun's own line with no rank line before it: one ``error: rank R exited with code X`` line, exit 1.

Exit 0 at the end of the input when no such line came, except after torchrun's own ``SignalException`` traceback
(Ctrl-C or SIGTERM reached torchrun as its ranks ended, after their last answer): that traceback is replaced by the
``interrupted; `` line, exit 130 (143 for SIGTERM). Also drops torchrun's own lines about Ctrl-C, "death signal, shutting down
workers" and "Sending process N closing signal SIGINT" (or SIGTERM; they can come before rank 0's line).

Used by ``launch/torchrun_single_node.sh``, which starts it with Ctrl-C and SIGTERM ignored, so that a SIGTERM sent
to the whole process group (``timeout``, ``kill -TERM -- -PGID``; the script then waits for torchrun and this
filter, and exits 143) still finds it there to pass on rank 0's line. Whole lines are passed on as they come; a
partial line (a progress bar redrawn with carriage returns) once the input pauses for 50 ms.
"""
import os
import re
import select
import signal
import sys

LAST_LINES = {b"interrupted; ": 130, b"error: ": 2}  # how a line starts -> this filter's exit code
TORCHRUN_FAILED = re.compile(rb"\] failed \(exitcode: -?\d+\) local_rank: \d+")
DROP = (b"death signal, shutting down workers", b"closing signal SIGINT", b"closing signal SIGTERM")
RESUME = "the answers written so far are complete: re-run the same command to resume"


FAILURE = re.compile(rb"rank +: (\d+) \(local_rank.*\n +exitcode +: (-?\d+)")


def root_cause(report: bytes) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)" (else its first failure), from its
    ChildFailedError report; None when the report names no rank. A negative exit code is a signal's number."""
    found = FAILURE.search(report.split(b"Root Cause", 1)[-1])
    return (int(found[1]), int(found[2])) if found else None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def verdict(held: bytes, code: int, rest: bytes) -> tuple[bytes, int]:
    """The line to show and this filter's exit code, given the held line (empty: torchrun's own line came
    first), its exit code and the rest of the input."""
    cause = root_cause(rest)
    if cause is not None and cause[1] < 0 and -cause[1] not in (signal.SIGINT, signal.SIGTERM):
        rank, number = cause[0], -cause[1]
        why = "SIGKILL: kill -9, or the kernel's out-of-memory killer" if number == 9 else signal_name(number)
        return (f"error: rank {rank} was killed by signal {number} ({why}) and torchrun stopped the other ranks; "
                f"{RESUME}\n").encode(), 1
    if not held:
        rank, exit_code = cause if cause is not None else ("?", "?")
        return f"error: rank {rank} exited with code {exit_code} (its output is above); {RESUME}\n".encode(), 1
    if code == 2 and cause is not None and cause[1] > 0:  # a refused setting (some rank exited 2), else a dead peer
        code = 2 if any(int(m[2]) == 2 for m in FAILURE.finditer(rest)) else cause[1]
    return held, code


TORCHRUN_SIGNALLED = re.compile(rb"SignalException: Process \d+ got signal: (2|15)$")


def main() -> int:
    buf, held, signalled = b"", [], 0  # held: a traceback's lines up to its exception line; the signal it names
    open_line = False  # the last bytes written end in no newline (a progress bar's partial line)
    while True:
        ready = select.select([0], [], [], 0.05)[0]
        chunk = os.read(0, 65536) if ready else None
        if chunk == b"":  # end of input: torchrun has exited
            os.write(2, b"".join(held) + buf)
            if signalled:  # Ctrl-C or SIGTERM reached torchrun as its ranks ended: no rank's line came
                os.write(2, f"interrupted; {RESUME}\n".encode())
                return 128 + signalled
            return 0
        if chunk is None:  # a pause: show a partial line now (after the held lines: they came first)
            if held:
                os.write(2, b"\n" * open_line + b"".join(held))
                held, open_line = [], False
            os.write(2, buf)
            open_line, buf = open_line or bool(buf), b""
            continue
        *lines, buf = (buf + chunk).split(b"\n")
        for i, line in enumerate(lines):
            if any(d in line for d in DROP):
                continue
            if line.startswith(b"Traceback (most recent call last):") or (held and line[:1] in (b" ", b"")):
                held.append(line + b"\n")  # torchrun's own, when Ctrl-C reached it: dropped at its last line
                continue
            found = TORCHRUN_SIGNALLED.search(line) if held else None
            if found:
                held, signalled = [], signalled or int(found[1])
                continue
            if signalled and (not line.strip() or line.startswith((b"During handling", b"The above exception"))):
                continue  # between two of torchrun's chained tracebacks (a second Ctrl-C as it shut down)
            if held:
                os.write(2, b"\n" * open_line + b"".join(held))
                held, open_line = [], False
            last = line.split(b"\r")[-1]
            code = next((c for start, c in LAST_LINES.items() if last.startswith(start)), None)
            if code is None and not TORCHRUN_FAILED.search(line):
                os.write(2, line + b"\n")
                open_line = False
                continue
            if code is not None and line != last:  # the progress bar drawn before the line, on the same line
                os.write(2, line[:len(line) - len(last)])
                open_line = True
            rest = [b"\n".join(lines[i:]), buf]
            while chunk := os.read(0, 65536):  # the rest: let the writers finish, keep it for torchrun's report
                rest.append(chunk)
            shown, exit_code = verdict(last + b"\n" if code is not None else b"", code or 1, b"".join(rest))
            os.write(2, b"\n" * open_line + shown)  # a line of its own, not at the end of a progress bar
            return exit_code


if __name__ == "__main__":
    sys.exit(main())
