"""Copy stdin (torchrun's stderr, with its ranks') to stderr up to the end of the first line that starts with
``interrupted; `` -- the line rank 0 prints on Ctrl-C -- or with ``error: `` -- the line every rank prints for a
bad setting --, then drop the rest and exit 130 (interrupted) or 2 (error); exit 0 at the end of the input when
no such line came. Also drops torchrun's own lines about Ctrl-C, "death signal, shutting down workers" and
"Sending process N closing signal SIGINT" (or SIGTERM; they can come before rank 0's line): after Ctrl-C, or a
rank's exit on a bad setting, torchrun stops its ranks, then prints a traceback and a failure report (the part
dropped), and every other rank prints the same error line.

Used by ``launch/torchrun_single_node.sh``, which starts it with Ctrl-C and SIGTERM ignored, so that a SIGTERM sent
to the whole process group (``timeout``, ``kill -TERM -- -PGID``, which end the script at once with 143) still
finds it there to pass on rank 0's line. Whole lines are passed on as they come; a partial line (a
progress bar redrawn with carriage returns) once the input pauses for 50 ms.
"""
import os
import select
import sys

LAST_LINES = {b"interrupted; ": 130, b"error: ": 2}  # how a line starts -> this filter's exit code
DROP = (b"death signal, shutting down workers", b"closing signal SIGINT", b"closing signal SIGTERM")


def main() -> int:
    buf = b""
    while True:
        ready = select.select([0], [], [], 0.05)[0]
        chunk = os.read(0, 65536) if ready else None
        if chunk == b"":  # end of input: torchrun has exited
            os.write(2, buf)
            return 0
        if chunk is None:  # a pause: show a partial line now
            os.write(2, buf)
            buf = b""
            continue
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines:
            if any(d in line for d in DROP):
                continue
            os.write(2, line + b"\n")
            code = next((c for start, c in LAST_LINES.items() if line.split(b"\r")[-1].startswith(start)), None)
            if code is not None:
                while os.read(0, 65536):  # drop the rest; let the writers finish
                    pass
                return code


if __name__ == "__main__":
    sys.exit(main())
