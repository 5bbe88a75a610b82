"""Intel MKL's mode on a CPU of another vendor, chosen when the package is imported (docs/benchmarks.md 6e).

PyTorch's x86 wheels multiply float32 matrices with MKL. On an AMD EPYC (AVX2, 2 cores) its default products of
2-16 rows, the rows of a lookahead step, cost up to twice a product of one row, while with MKL's conditional
numerical reproducibility mode (``MKL_CBWR=AUTO``) they cost 1.0-1.3x it: a SmolLM2-135M float32 step of q = 2 / 4
/ 16 tokens then takes about 0.6-0.7x the time (q = 1 unchanged), so a step's extra tokens cost little and the cost
policy can feed them. MKL reads ``MKL_CBWR`` at its first call, so this runs before any product (``import
lp_runtime`` first; always so for ``python -m lp_runtime.*`` and torchrun ranks). Intel CPUs keep MKL's default
(not measured here). A ``MKL_CBWR`` already set, even empty (MKL's default), is left as it is."""
from __future__ import annotations

import os
from typing import MutableMapping, Optional

MODE = "AUTO"


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> Optional[str]:
    """The ``vendor_id`` of the first CPU in ``cpuinfo`` (``GenuineIntel``, ``AuthenticAMD``, ...), or None where
    the file is missing or names none (not Linux, not x86)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def choose_mkl_mode(environ: Optional[MutableMapping[str, str]] = None, cpuinfo: str = "/proc/cpuinfo") -> str:
    """Set ``MKL_CBWR`` = ``MODE`` in ``environ`` (default ``os.environ``) when it is unset and the CPU's vendor is
    known and not Intel; return the value MKL will read ('' for MKL's default)."""
    env = os.environ if environ is None else environ
    if "MKL_CBWR" not in env:
        vendor = cpu_vendor(cpuinfo)
        if vendor is not None and vendor != "GenuineIntel":
            env["MKL_CBWR"] = MODE
    return env.get("MKL_CBWR", "")
