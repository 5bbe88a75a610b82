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


KEY = "import lp_runtime; from lp_runtime import latency; print(latency.cpu_key(2))"
LATE = "import torch; torch.ones(8, 8) @ torch.ones(8, 8); " + KEY  # a product before the import
needs_mkl = pytest.mark.skipif(blas.mkl_mode() is None, reason="this torch build carries no MKL")


def _run(code: str, mkl_cbwr):
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if mkl_cbwr is not None:
        env["MKL_CBWR"] = mkl_cbwr
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                          check=True)


@needs_mkl
@pytest.mark.parametrize("mkl_cbwr, key", [("AUTO", "cpu-2t-mkl-auto"), ("auto", "cpu-2t-mkl-auto"),
                                           ("COMPATIBLE", "cpu-2t-mkl-compatible"), ("", "cpu-2t")])
def test_cpu_key_names_the_mode_mkl_runs(mkl_cbwr, key):
    assert _run(KEY, mkl_cbwr).stdout.strip() == key


@needs_mkl
def test_a_product_before_the_import_keeps_mkls_default_and_says_so():
    vendor = blas.cpu_vendor()
    out = _run(LATE, None)
    assert out.stdout.strip() == "cpu-2t"  # the profile of the mode MKL runs, not of the variable
    assert ("MKL_CBWR=AUTO is set but MKL runs in its default mode" in out.stderr) == (
        vendor not in (None, "GenuineIntel"))
    deep = _run(LATE.replace(KEY, "import lp_runtime, torch; from lp_runtime import latency; "
                                  "latency.device_key(torch.device('cpu'))"), None)
    if vendor not in (None, "GenuineIntel"):  # named at the user's line, not inside lp_runtime
        assert "<string>:1: RuntimeWarning: MKL_CBWR=AUTO is set" in deep.stderr, deep.stderr
    out = _run(LATE, "AUTO")  # set before the process: MKL reads it at its first call
    assert out.stdout.strip() == "cpu-2t-mkl-auto" and "MKL runs in its default mode" not in out.stderr


@needs_mkl
def test_a_value_mkl_does_not_take_is_named_with_the_mode_it_runs():
    """MKL_CBWR=FOO ran as AUTO on an AMD CPU with no notice (a new user, 2026-12-04): the profile is named by the
    mode MKL runs in, and a warning names both."""
    out = _run(KEY, "FOO")
    assert out.stdout.strip().startswith("cpu-2t") and "foo" not in out.stdout
    assert "RuntimeWarning: MKL_CBWR=FOO is set but MKL runs in " in out.stderr
    assert "RuntimeWarning" not in _run(KEY, "auto").stderr  # a mode MKL runs as asked: nothing to say


def test_no_mkl_in_a_library_is_none(tmp_path):
    assert blas.mkl_mode(str(tmp_path / "missing.so")) is None


@pytest.mark.parametrize("argv, message", [
    (["--qs", "1", "0"], "--qs [1, 0]: must be >= 1"),
    (["--rounds", "0"], "--rounds 0: must be >= 1"),
    (["--max-new-tokens", "-5"], "--max-new-tokens -5: must be >= 1"),
    (["--prompts", "{q}", "--indices", "0", "2"], "--indices [2]: {q} holds questions 0..1"),
    (["--prompts", "{q}", "--indices", "1", "1"], "--indices [1, 1]: each question once"),
    (["--indices", "1"], "--indices picks questions of --prompts; add --prompts FILE.jsonl"),
    (["--dtype", "float64"], "argument --dtype: invalid choice: 'float64' (choose from "),
    (["--out", "{q}/sub"], "--out {q}/sub: cannot write there: Not a directory"),
    (["--prompts", "{q}.missing"], "--prompts '{q}.missing' does not exist; give a question file in JSONL format "),
])
def test_mkl_mode_script_refuses_bad_numbers_before_any_child(tmp_path, capsys, argv, message):
    from scripts import mkl_mode

    q = tmp_path / "q.jsonl"
    q.write_text('{"question_id": 1, "category": "x", "turns": ["a"]}\n{"question_id": 2, "category": "x", '
                 '"turns": ["b"]}\n')
    ap = mkl_mode.parser()
    with pytest.raises(SystemExit) as e:
        mkl_mode.check(ap, ap.parse_args([a.format(q=q) for a in argv]))
    assert e.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"mkl_mode.py: error: {message.format(q=q)}")
    assert line == f"mkl_mode.py: error: {message.format(q=q)}" or message.endswith(" ")  # then the rest varies
