"""The package's functions stay short and simple enough to read: none is over 100 lines (read from the source with
``ast``: a function's or method's lines from its ``def`` to its last, decorators aside, docstring included), and
none is over the McCabe complexity bound that pyproject.toml gives ruff (``[tool.ruff.lint.mccabe]``, enforced by
tests/test_lint.py; this file checks that the bound is still selected and set).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "fl_lightning"

MAX_LINES = 100
# the bound the tree passes; lower it as the tree allows, never raise it
MAX_COMPLEXITY = 15


def _long_functions(package: Path, limit: int) -> list[str]:
    """``path:line name (N lines)`` (path from the package's parent) of every function or method under ``package``
    longer than ``limit`` lines."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_100_lines():
    long = _long_functions(PACKAGE, MAX_LINES)
    assert not long, f"functions over {MAX_LINES} lines (split them into named steps):\n" + "\n".join(long)


def test_the_measure_names_a_method_one_line_over(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES - 1))
    (package / "sub" / "long.py").write_text(f"class C:\n    def f(self):\n{body}        return 0\n")
    (package / "short.py").write_text(f"def g():\n{body}")  # exactly MAX_LINES: allowed
    assert _long_functions(package, MAX_LINES) == [f"pkg/sub/long.py:2 f ({MAX_LINES + 1} lines)"]


def test_ruff_bounds_the_complexity():
    lint = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
    assert "C90" in lint["select"] or "C901" in lint["select"]
    assert lint["mccabe"]["max-complexity"] <= MAX_COMPLEXITY
