"""The server's phases as seen by every rank: rank 0 works, the others wait for its outcome.

Ranks 1..N-1 spend the server's phases (plan, aggregate + evaluate, the round's files) blocked in one
broadcast from rank 0. :func:`from_server` makes that broadcast carry the *outcome* of the phase — its
value, or the one line of the error it raised — so a failure on rank 0 ends every rank at once: rank 0
raises the real error (the CLI reports it as usual, fl_lightning/errors.py), the others stop quietly
(:class:`RankStopped`: no traceback, no line, the exit status rank 0 exits with). A rank that waits
longer than ``federation.collective_timeout_s`` stops with one line naming that key
(:class:`CollectiveTimeout`) instead of a backend's traceback (gloo raises; NCCL's watchdog aborts the
process with its own message).

What crosses the wire is moved to the CPU first (:func:`to_cpu`): ``broadcast_object_list`` unpickles
a CUDA tensor onto the device it was pickled from, i.e. the sender's GPU (a known torch behaviour). Rank 0
keeps its own objects; the other ranks receive CPU tensors, and the algorithms move state to their
device where they use it (the engine moves each download to the rank's device).

One process: no broadcast, the phase's function is simply called.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from lightning.fabric import Fabric
from lightning.fabric.utilities.apply_func import move_data_to_device

from fl_lightning.errors import RunFailure, UsageError

__all__ = ["to_cpu", "from_server", "waiting", "RankStopped", "CollectiveTimeout", "exit_status"]

T = TypeVar("T")

# how long a stopping rank waits for rank 0 (its parent under Fabric's launcher) to exit first, at most
_LEADER_EXIT_GRACE_S = 30.0


def to_cpu(obj: T) -> T:
    """``obj`` with every tensor in it on the CPU (dicts, lists, tuples, dataclasses and objects with a
    ``.to(device)`` such as :class:`~fl_lightning.federation.transport.Payload` are rebuilt around them; a
    CPU tensor is the same tensor, its values untouched)."""
    return move_data_to_device(obj, torch.device("cpu"))


def exit_status(err: BaseException) -> int:
    """The exit status the CLI gives ``err`` (fl_lightning/train.py): 2 for a usage error, 1 otherwise."""
    return 2 if isinstance(err, UsageError) else 1


class RankStopped(SystemExit):
    """This rank stops because rank 0 failed: quietly (rank 0 prints the error), with rank 0's exit status.

    Args:
        status: the exit status (``SystemExit.code``).
        message: rank 0's one line, for a caller that catches this.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status)
        self.message = message


class CollectiveTimeout(RunFailure):
    """A rank waited in a collective longer than ``federation.collective_timeout_s`` (exit status 1)."""


@dataclass
class _Outcome:
    """What rank 0 broadcasts at the end of a server phase: the value, or the error's line and status."""

    value: Any = None
    error: str | None = None
    status: int = 0
    pid: int = 0  # rank 0's process and host: a stopping rank lets its parent rank 0 exit first
    host: str = ""


@contextmanager
def waiting(what: str, timeout_s: float, rank: int) -> Iterator[None]:
    """A collective that times out (gloo raises ``RuntimeError: … Timed out …``) becomes one line naming the key."""
    try:
        yield
    except RuntimeError as err:  # torch.distributed.DistError and gloo's errors are RuntimeErrors
        if "timed out" not in str(err).lower():
            raise
        raise CollectiveTimeout(
            f"rank {rank} waited more than federation.collective_timeout_s={timeout_s:g} s for {what}; raise it "
            f"above the longest server phase") from err


def from_server(fabric: Fabric, step: Callable[[], T], *, what: str, timeout_s: float, send: bool = True) -> T:
    """``step()`` on rank 0, its outcome on every rank.

    Args:
        fabric: the launched Fabric.
        step: rank 0's work; it may raise.
        what: the phase, in words, for a timeout's message (``"round 3's aggregate"``).
        timeout_s: ``federation.collective_timeout_s``, for that message.
        send: hand the value to the other ranks (False: they get None; the broadcast then only syncs).

    Returns:
        ``step()``'s value: rank 0's own object on rank 0, a CPU copy on the others.

    Raises:
        The error ``step()`` raised, on rank 0; :class:`RankStopped` with its exit status on the others.
    """
    if fabric.world_size == 1:
        return step()
    if fabric.global_rank == 0:
        try:
            value = step()
        except Exception as err:  # not an interrupt: a launcher or scheduler signals every rank itself
            failed = _Outcome(error=" ".join(str(err).split()) or type(err).__name__, status=exit_status(err),
                              pid=os.getpid(), host=socket.gethostname())
            try:
                fabric.broadcast(failed, src=0)
            except Exception:  # noqa: BLE001 — a rank that is gone already: rank 0's own error is the report
                pass
            raise
        fabric.broadcast(_Outcome(value=to_cpu(value) if send else None), src=0)
        return value
    with waiting(what, timeout_s, fabric.global_rank):
        outcome: _Outcome = fabric.broadcast(None, src=0)
    if outcome.error is not None:
        _let_leader_exit_first(outcome)
        raise RankStopped(outcome.status, outcome.error)
    return outcome.value


def _let_leader_exit_first(outcome: _Outcome) -> None:
    """Under Fabric's launcher rank 0 is this process's parent, and a child that exits non-zero makes it kill
    rank 0 (SIGKILL, Lightning's ``_ChildProcessObserver``) — possibly before rank 0 has exited with its own
    status. Wait until the parent is gone (at most a grace period); another launcher's signal meanwhile only
    ends the wait. Elsewhere (torchrun, SLURM, another host) stop at once."""
    if outcome.host != socket.gethostname() or os.getppid() != outcome.pid:
        return
    deadline = time.monotonic() + _LEADER_EXIT_GRACE_S
    try:
        while os.getppid() == outcome.pid and time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:  # stopping anyway, with rank 0's status
        pass
