"""Structure rules of the package that code review would otherwise have to re-check by hand.

* no function in the package is longer than 60 lines (docstring included), no line longer than 120 characters;
* no two package modules import each other (module-level or function-local imports alike);
* no test or script patches a module global (``monkeypatch.setattr``, or ``module.name = ...`` on an imported
  module): a lever is a constructor argument, an environment variable read at start-up, or a public API.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lp_runtime"
CORE = ["decoder", "tree", "proposers", "step", "checks", "window", "layout", "verify", "kv", "parallel", "policy",
        "ngram_pool", "api", "__init__"]
MAX_LINES = 60
MAX_CHARS = 120


def _functions(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("module", sorted(p.stem for p in PACKAGE.glob("*.py")))
def test_no_package_function_over_60_lines_nor_line_over_120_chars(module):
    long = [(name, line, n) for name, line, n in _functions(PACKAGE / f"{module}.py") if n > MAX_LINES]
    assert long == [], f"{module}.py: functions over {MAX_LINES} lines (name, line, lines): {long}"
    wide = [n for n, line in enumerate((PACKAGE / f"{module}.py").read_text().splitlines(), 1) if len(line) > MAX_CHARS]
    assert wide == [], f"{module}.py: lines over {MAX_CHARS} characters: {wide}"


def _imports(path: Path) -> set[str]:
    """Package modules ``path`` imports (``from .x import``, ``from . import x``, ``lp_runtime.x``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1 and mod:
                out.add(mod.split(".")[0])
            elif node.level == 1:
                out.update(a.name for a in node.names)
            elif mod.startswith("lp_runtime."):
                out.add(mod.split(".")[1])
            elif mod == "lp_runtime":
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("lp_runtime."))
    return out


def test_no_two_package_modules_import_each_other():
    modules = {p.stem: _imports(p) for p in PACKAGE.glob("*.py")}
    pairs = sorted({tuple(sorted((a, b))) for a, deps in modules.items() for b in deps
                    if b in modules and a != b and a in modules[b]})
    assert pairs == [], f"modules importing each other: {pairs}"


@pytest.mark.parametrize("module", ["tree", "window", "policy", "parallel", "verify", "ngram_pool"])
def test_core_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"lp_runtime.{module}"))
    assert result.failed == 0 and result.attempted > 0


# Documented settings, not patches: the interpreter's arguments (tests/cli_batch.py runs ``MODULE.main()`` as
# ``python -m`` would) and torch's numerics switches (scripts/device_check.py turns TF32 off).
SETTINGS = ("sys.argv", "torch.backends.")


def _patches(path: Path) -> list[str]:
    """``file:line`` of every ``monkeypatch.setattr`` call and every assignment to an imported module's attribute."""
    tree = ast.parse(path.read_text())
    modules = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names}
    modules |= {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names
                if node.module and (a.asname or a.name) in {"distributed", "models", "latency", "auto", "kv", "decoder"}}
    found = []
    for node in ast.walk(tree):
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr"
        if call and isinstance(node.func.value, ast.Name) and node.func.value.id == "monkeypatch":
            found.append(f"{path.name}:{node.lineno}")
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and ast.unparse(t).startswith(SETTINGS):
                continue
            while isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute):
                t = t.value
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in modules:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_test_or_script_patches_a_module_global():
    root = PACKAGE.parent
    files = sorted((root / "tests").glob("*.py")) + sorted((root / "scripts").glob("*.py"))
    assert len(files) > 30
    assert [hit for f in files for hit in _patches(f)] == []
