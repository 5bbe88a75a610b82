"""Lines of lp_runtime/ at a git revision: ``wc -l`` lines and code lines (without docstrings, comments and blank
lines), the two counts issue 17's size target is read by.

    .venv/bin/python scripts/code_lines.py HEAD eda1d24 e13b8cb~1
"""
from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize

SKIP = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def code_lines(source: str) -> int:
    """Lines of ``source`` holding a token other than a comment, a docstring or layout."""
    docs: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body:
            first = body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docs.update(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in SKIP:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return len(lines)


def count(rev: str) -> tuple[int, int]:
    """(wc -l lines, code lines) of lp_runtime/*.py at ``rev``."""
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "lp_runtime/"], capture_output=True,
                           text=True, check=True).stdout.split()
    total = code = 0
    for name in (n for n in names if n.endswith(".py")):
        source = subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, text=True, check=True).stdout
        total, code = total + source.count("\n"), code + code_lines(source)
    return total, code


if __name__ == "__main__":
    for rev in sys.argv[1:] or ["HEAD"]:
        print(rev, "lines %d, code lines %d" % count(rev))
