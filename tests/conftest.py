"""Shared test set-up: offline, headless, small; helpers to run the real CLI."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("WANDB_SILENT", "true")
# One intra-op thread per process: the tiny test models gain nothing from more, and the DDP tests
# run two processes on a 2-core machine, where oversubscribed OpenMP threads spin and slow everything
# down by orders of magnitude. It also makes 1-process and 2-process runs bitwise comparable.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m fl_lightning.train ARGS`` in a fresh process, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "fl_lightning.train", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=env,
        timeout=timeout,
    )


@pytest.fixture(autouse=True)
def _torch_seeded():
    """Every test starts from torch's seed 0, whatever ran before it.

    pytest-randomly shuffles the order and reseeds ``random`` and numpy per test, but not torch: without this a
    test's unseeded ``torch.randn`` draws depend on which tests ran first, and a tolerance that holds for one
    order can fail for another.
    """
    import torch

    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test (tiny models: thread sync costs more than it gives)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class StopAfterClients:
    """A callback that simulates a crash (KeyboardInterrupt) after ``n`` finished clients."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_client_end(self, **_: object) -> None:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt


@pytest.fixture
def tiny_disk(tmp_path):
    """A real full disk: a 600 KiB tmpfs at tmp_path/disk, or a skip saying why it cannot be mounted here."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(disk)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``python -m pytest`` leaves out the few tests marked ``slow`` (each tens of seconds: whole CLI
    comparisons, the kill-and-rerun, notebooks, multi-process launchers, the quick benches), so that the
    suite stays near 10 minutes on 2 cores; ``.ci/run`` runs them in its pass of every file alone
    (``scripts/test_files_alone.py``), and ``pytest -m slow`` runs them all. Any ``-m``
    expression (``-m slow``, ``-m outcome``, ``-m "slow or not slow"``) or a test named by its id selects
    as usual."""
    if config.option.markexpr or any("::" in str(arg) for arg in config.args):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Say how to repeat a shuffled run: pytest-randomly (in the ``dev`` extra) orders the tests by a fresh seed
    each run, and ``-q`` hides its header line."""
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.has_plugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(
            f"tests shuffled by pytest-randomly; repeat this order with -p randomly --randomly-seed={seed}"
        )
