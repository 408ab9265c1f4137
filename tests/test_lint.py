"""The house linter (ruff, configured in pyproject.toml) passes on the whole tree. Skipped where ruff is not
installed (``pip install -e ".[dev]"`` installs it)."""

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
