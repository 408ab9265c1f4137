"""What the tests read back from a run folder, and the fakes they share: one definition each."""

from __future__ import annotations

import csv
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from fl_lightning.federation.storage.checkpoint import safe_load


def _run_dir(run: Any) -> Path:
    return Path(getattr(run, "run_dir", run))


def metrics_rows(run: Any) -> list[dict[str, str]]:
    """``metrics.csv`` of ``run`` (a config with ``run_dir``, or the folder), one dict a round."""
    with open(_run_dir(run) / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def server_state(run: Any) -> dict[str, Any]:
    """The server's state in ``run``'s ``checkpoints/server.pt`` (a config with ``run_dir``, or the folder)."""
    return safe_load(_run_dir(run) / "checkpoints" / "server.pt")["state"]


def kill_after_round_0(proc: subprocess.Popen, run: Any, timeout_s: float = 300) -> None:
    """SIGKILL ``proc`` (a run writing into ``run``) as soon as round 0's ``server.pt`` exists: the kill lands in a
    later round."""
    server, deadline = _run_dir(run) / "checkpoints" / "server.pt", time.monotonic() + timeout_s
    while not server.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, "round 0 did not finish in time"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


class GlooFabric(SimpleNamespace):
    """What the collectives use of a launched Fabric, on a plain gloo group (spawned test ranks)."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__(global_rank=rank, world_size=world, device=torch.device("cpu"))

    def broadcast(self, obj, src=0):  # as lightning's DDPStrategy.broadcast
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]
