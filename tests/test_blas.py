"""MKL's mode on a non-Intel CPU (lp_runtime.blas): chosen from /proc/cpuinfo's vendor, never over the user's."""
import os
import subprocess
import sys

import pytest

from lp_runtime import blas, latency

AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx avx2\n"
INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx avx2 avx512f\n"


@pytest.mark.parametrize("cpuinfo, user, expected", [
    (AMD, None, "AUTO"),            # another vendor: MKL's reproducible mode
    (INTEL, None, ""),              # Intel: MKL's default, nothing set
    ("processor\t: 0\n", None, ""),  # no vendor line (e.g. an ARM cpuinfo)
    (None, None, ""),               # no /proc/cpuinfo (not Linux)
    (AMD, "AVX2", "AVX2"),          # the user's choice stays
    (AMD, "", ""),                  # even an empty one (MKL's default)
])
def test_choose_mkl_mode(tmp_path, cpuinfo, user, expected):
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    env = {} if user is None else {"MKL_CBWR": user}
    assert blas.choose_mkl_mode(env, str(path)) == expected
    assert env == ({} if user is None and not expected else {"MKL_CBWR": expected})


def test_vendor_of_this_machine_and_import_sets_it():
    vendor = blas.cpu_vendor()
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = subprocess.run([sys.executable, "-c", "import os, lp_runtime; print(repr(os.environ.get('MKL_CBWR')))"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == ("None" if vendor in (None, "GenuineIntel") else "'AUTO'")


def test_cpu_key_names_the_mode(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    assert latency.cpu_key(2) == "cpu-2t-mkl-auto"
    monkeypatch.setenv("MKL_CBWR", "")
    assert latency.cpu_key(1) == "cpu-1t"
    monkeypatch.delenv("MKL_CBWR")
    assert latency.cpu_key(4) == "cpu-4t"
