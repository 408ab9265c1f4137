"""The report and check scripts answer ``--help`` and refuse a folder or file that is not there in one line (exit 2),
never with a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "name, missing",
    [
        ("attack_curve.py", ["/no/such/comparison"]),
        ("privacy_curve.py", ["/no/such/comparison"]),
        ("policy_golden.py", ["check", "/no/such.pt"]),
    ],
)
def test_a_script_explains_itself_and_refuses_a_missing_input_in_one_line(name, missing):
    helped = _script(name, "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage:"), helped.stderr
    refused = _script(name, *missing)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(f"{name}: error: ")
