"""Shared test set-up: offline, headless, small; helpers to run the real CLI."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("WANDB_SILENT", "true")

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m fl_lightning.train ARGS`` in a fresh process, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "fl_lightning.train", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=env, timeout=timeout)


@pytest.fixture
def tiny_fedavg_overrides(tmp_path: Path) -> list[str]:
    return ["--output_dir", str(tmp_path / "runs"), "--federation.rounds", "2", "--partition.num_clients", "4"]
