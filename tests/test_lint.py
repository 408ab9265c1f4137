"""The house linter and formatter (ruff, configured in pyproject.toml) pass on the whole tree: ``ruff check`` finds
nothing and ``ruff format --check`` would change nothing. Skipped where ruff is not installed (``pip install -e
".[dev]"`` installs it, pinned: the formatter's output may change between releases)."""

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _ruff() -> list[str] | None:
    exe = shutil.which("ruff")
    if exe is not None:
        return [exe]
    try:
        import ruff  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_passes():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the dev extra)")
    proc = subprocess.run([*ruff, "check", "--no-cache", "."], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def test_ruff_format_would_change_nothing():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (it comes with the dev extra)")
    proc = subprocess.run([*ruff, "format", "--check", "--no-cache", "."], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, "run `ruff format .`:\n" + proc.stdout[-5000:] + proc.stderr[-2000:]
