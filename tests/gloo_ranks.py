"""Spawned gloo ranks on 127.0.0.1 for the tests: each worker writes its result as ``rank<r>.pkl``; and the
command of one node of a two-node torchrun job on this machine."""

from __future__ import annotations

import os
import pickle
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class GlooFabric:
    """What the engine's collectives read of a Fabric (rank, world, CPU device, ``broadcast``), over an initialised gloo
    group (no object group of its own: the collectives then use the default group)."""

    device = torch.device("cpu")
    strategy = SimpleNamespace()

    def __init__(self, rank: int, world: int) -> None:
        self.global_rank, self.world_size = rank, world

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_node(node: int, port: int | str, launcher: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The ``torchrun`` command of node ``node`` of a two-node job on this machine: one process a node, meeting on
    127.0.0.1:``port``; the entry (``-m module``, or a script) and its arguments follow. ``launcher`` is the
    torchrun command to use (``python -m torch.distributed.run`` if empty)."""
    torchrun = launcher or (sys.executable, "-m", "torch.distributed.run")
    rendezvous = ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    return [*torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", *rendezvous]


def report(out: str | Path, rank: int, result: Any) -> None:
    """Rank ``rank``'s result into ``out``, then leave the process group (the worker's last step)."""
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.destroy_process_group()


def run_ranks(worker: Callable[..., None], world: int, out: str | Path, *args: Any) -> list[Any]:
    """``worker(rank, world, port, out, *args)`` on ``world`` spawned processes; every rank's reported result."""
    mp.start_processes(worker, args=(world, free_port(), str(out), *args), nprocs=world, start_method="spawn")
    return [pickle.loads(Path(out, f"rank{r}.pkl").read_bytes()) for r in range(world)]


def verdict_to(out: str | Path, rank: int, result: dict) -> Callable[[str | None, int], None]:
    """A liveness watch's ``on_lost`` for a spawned rank: its (line, status, when) go into ``result["verdict"]``, the
    result is reported (without leaving the process group, which a stuck collective holds), then the process exits
    as the default ``on_lost`` would (``os._exit``; status 0 here, so that the spawner reads the report)."""

    def on_lost(line: str | None, status: int) -> None:
        result["verdict"] = (line, status, time.time())
        Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
        os._exit(0)

    return on_lost
