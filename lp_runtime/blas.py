"""Intel MKL's mode on a CPU of another vendor, chosen when the package is imported (docs/benchmarks.md 6e).

PyTorch's x86 wheels multiply float32 matrices with MKL. On an AMD EPYC (AVX2, 2 cores) its default products of
2-16 rows, the rows of a lookahead step, cost up to twice a product of one row, while with MKL's conditional
numerical reproducibility mode (``MKL_CBWR=AUTO``) they cost 1.0-1.3x it: a SmolLM2-135M float32 step of q = 2 / 4
/ 16 tokens then takes about 0.6-0.7x the time (q = 1 unchanged), so a step's extra tokens cost little and the cost
policy can feed them. MKL reads ``MKL_CBWR`` at its first call, so this runs before any product (``import
lp_runtime`` first; always so for ``python -m lp_runtime.*`` and torchrun ranks). Intel CPUs keep MKL's default
(not measured here). A ``MKL_CBWR`` already set, even empty (MKL's default), is left as it is. ``mkl_mode`` asks
MKL which mode it actually runs in, which names the latency profile (``latency.cpu_key``)."""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import warnings
from typing import MutableMapping, Optional

MODE = "AUTO"
# mkl_cbwr.h: the codes mkl_cbwr_get(MKL_CBWR_ALL) returns; 1 (MKL_CBWR_BRANCH_OFF) is MKL's default.
_BRANCHES = {1: "", 2: "auto", 3: "compatible", 4: "sse2", 6: "ssse3", 7: "sse4_1", 8: "sse4_2", 9: "avx",
             10: "avx2", 11: "avx512_mic", 12: "avx512", 13: "avx512_mic_e1", 14: "avx512_e1"}
_STRICT = 0x10000


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


def mkl_mode(torch_lib: Optional[str] = None) -> Optional[str]:
    """The mode MKL runs in, as ``cpu_key`` names it: '' for MKL's default, 'auto', 'compatible', 'avx2', ... (with
    '-strict' where set), or None where torch carries no MKL (e.g. an ARM build). Asked of MKL itself
    (``mkl_serv_cbwr_get`` in ``torch_lib``, default torch's libtorch_cpu), not read from ``MKL_CBWR``: MKL reads
    the variable only once, so a value set after its first call, or one it does not know, is not what it runs."""
    if torch_lib is None:
        import torch

        found = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.*"))
        if not found:
            return None
        torch_lib = found[0]
    try:
        get = ctypes.CDLL(torch_lib).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    code = get(-1)  # MKL_CBWR_ALL
    name = _BRANCHES.get(code & ~_STRICT, f"mode{code & ~_STRICT}") + ("-strict" if code & _STRICT else "")
    wanted = os.environ.get("MKL_CBWR")
    if wanted and wanted.strip().lower().replace(",", "-") != name:
        late = ("a matrix product ran before lp_runtime was imported; import lp_runtime first (steps of 2-16 tokens "
                "cost up to twice as long on this CPU, docs/benchmarks.md 6e)") if name == "" else (
                "a value MKL does not know or this CPU does not take, or one set after MKL's first product")
        warnings.warn(f"MKL_CBWR={wanted} is set but MKL runs in {f'mode {name}' if name else 'its default mode'}: "
                      f"{late}", RuntimeWarning, stacklevel=_callers_level())
    return name


def _callers_level() -> int:
    """``warnings.warn``'s stacklevel, called from a function here, of the first frame outside this package: the
    warning names the user's line, however deep in lp_runtime it was raised."""
    here, level = os.path.dirname(os.path.abspath(__file__)), 2
    frame = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here + os.sep):
        frame, level = frame.f_back, level + 1
    return level
