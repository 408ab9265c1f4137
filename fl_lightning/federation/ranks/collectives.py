"""The server's phases as seen by every rank: rank 0 works, the others wait for its outcome; and the one
phase where every rank works (its clients), whose outcomes rank 0 gathers.

Ranks 1..N-1 spend the server's phases (plan, aggregate + evaluate, the round's files) blocked in one
broadcast from rank 0. :func:`from_server` makes that broadcast carry the *outcome* of the phase — its
value, or the one line of the error it raised — so a failure on rank 0 ends every rank at once: rank 0
raises the real error (the CLI reports it as usual, fl_lightning/errors.py), the others stop quietly
(:class:`RankStopped`: no traceback, no line, the exit status rank 0 exits with; on rank 0's host once rank 0
has exited, so no launcher stops it before it has printed). A rank that waits longer than
``federation.collective_timeout_s`` stops with one line naming that key (:class:`CollectiveTimeout`) instead
of a backend's traceback (gloo raises; NCCL's watchdog aborts the process with its own message).

What crosses the wire is moved to the CPU first (:func:`to_cpu`): ``broadcast_object_list`` unpickles
a CUDA tensor onto the device it was pickled from, i.e. the sender's GPU (a known torch behaviour). Rank 0
keeps its own objects; the other ranks receive CPU tensors, and the algorithms move state to their
device where they use it (the engine moves each download to the rank's device).

Every rank's part of a round (its clients, their records on disk) reaches rank 0 through :func:`to_server`
as an outcome too: its value, or the one line, exit status and traceback of the error it raised. When any
rank failed, rank 0 raises one error whose line names the first failing rank and its host
(:class:`RankFailure`, exit status 1; :class:`RankUsageError` for a usage error such as a full disk, exit
status 2) and broadcasts it as it does a failed server phase: every other rank — the failing one included —
stops quietly with that status. Only rank 0 prints the line (the failing rank's traceback travels with it
and ``--debug`` shows it), so a job's log holds the error once, whichever rank hit it.

Code that every rank runs outside those phases (the end of a round: its totals, the ``on_round_end``
callbacks, the loggers, rank 0's round files) ends in :func:`everyone`: one exchange of every rank's outcome
(an all-gather of small objects, no values), from which every rank reaches the same verdict — rank 0 raises its
own error or one naming the first failing rank, the others stop quietly with that error's status.

A server phase that every rank shares (a test evaluation, a frozen-feature table: each rank its shard) joins the
shards with :func:`gathered`: the same all-gather of outcomes as :func:`everyone`, carrying each rank's value too.
Both are one ``all_gather_object`` of :class:`_Outcome`, so a rank that fails between two of them and goes on to
the next :func:`everyone` still meets the others in a gather of outcomes: they read its error there and stop.

A rank that enters an exchange holding its own error says so in its heartbeat (``liveness.failing``): when its peers
do not come within two beats — they sit in a compute collective it will never join (an error inside DDP's
backward), or in a long phase of their own — their watch ends the job with its line and exit status, instead of
the compute timeout or the phase ending it.

An error is decided once. A phase can hold another (a stage's aggregate inside the round's end, a pre-training
step's guard inside a server phase): when the inner exchange has decided a failure, every other rank has already
stopped (:class:`RankStopped`), so the error rank 0 raises from it is marked decided (:func:`decided`) and every
outer exchange lets it through without another collective. Gathering it again would leave rank 0 alone in that
collective: gloo notices that the peers have exited, NCCL does not (until its timeout).

Every exchange here runs on the strategy's gloo object group (federation/ranks/ddp_strategy.py) under
``federation.collective_timeout_s``: pickled CPU bytes, apart from the compute collectives' short timeout.

One process: no broadcast or gather, the phase's function is simply called.
"""

from __future__ import annotations

import os
import re
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from lightning.fabric.utilities.apply_func import move_data_to_device

from fl_lightning.dealing import Deal
from fl_lightning.errors import RemoteTraceback, RunFailure, UsageError
from fl_lightning.federation.ranks.ddp_strategy import object_group
from fl_lightning.federation.ranks.liveness import PeerLost, connection_lost, failing, lost_peer, stand_down
from fl_lightning.phase_times import SecondsTally, installed

__all__ = [
    "to_cpu",
    "from_server",
    "to_server",
    "everyone",
    "gathered",
    "Ranks",
    "waiting",
    "WaitLog",
    "recording_waits",
    "RankStopped",
    "decided",
    "one_line",
    "CollectiveTimeout",
    "RankFailure",
    "RankUsageError",
    "exit_status",
]

T = TypeVar("T")

# what each timeout key must outlast, for a timed-out wait's line
_LONGEST = {
    "federation.collective_timeout_s": "server phase",
    "federation.compute_timeout_s": "step of one rank that the others wait for (a checkpoint write)",
}
# how long a stopping rank waits for rank 0 on its host (its parent under Fabric's launcher) to exit first, at most
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


_DECIDED = "_fl_lightning_decided"  # the attribute that marks an error every rank has already been told of


def _decide(err: BaseException) -> BaseException:
    """``err``, marked as decided on every rank (:func:`decided`): no later exchange of outcomes carries it again, and
    this rank stops watching its peers (they are stopping: federation/ranks/liveness.py)."""
    setattr(err, _DECIDED, True)
    stand_down()
    return err


def decided(err: BaseException) -> bool:
    """Whether every rank has already been told of ``err`` in an exchange (the others have stopped): an outer
    exchange raises it at once instead of waiting for peers that will never join."""
    return getattr(err, _DECIDED, False) is True


class CollectiveTimeout(RunFailure):
    """A rank waited in a collective longer than ``federation.collective_timeout_s`` (exit status 1)."""


class _FromRank:
    """What the errors raised on rank 0 because another rank failed share: the one line, which rank, its host,
    and that rank's formatted traceback (the ``__cause__``, shown with ``--debug``).

    Args:
        message: the one line (it names the rank and its host).
        rank: the failing rank.
        host: its host name.
        rank_traceback: its formatted traceback.
    """

    def __init__(self, message: str, rank: int, host: str, rank_traceback: str | None = None) -> None:
        super().__init__(message)
        self.rank, self.host, self.rank_traceback = rank, host, rank_traceback
        if rank_traceback:
            self.__cause__ = RemoteTraceback(rank_traceback)

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.rank, self.host, self.rank_traceback)


class RankFailure(_FromRank, RunFailure):
    """Another rank failed in its part of a round (a bug, a run failure): exit status 1."""


class RankUsageError(_FromRank, UsageError):
    """Another rank hit a usage error in its part of a round (a full disk, a missing file): exit status 2."""


@dataclass
class _Outcome:
    """What rank 0 broadcasts at the end of a server phase, and what each rank gives :func:`to_server`'s gather:
    the value, or the error's line and status."""

    value: Any = None
    error: str | None = None
    status: int = 0
    pid: int = 0  # the sender's process and host: a stopping rank lets its parent rank 0 exit first
    host: str = ""
    traceback: str | None = None  # a failed rank's formatted traceback (gathered to rank 0 for --debug)
    symptom: bool = False  # the error is a collective's timeout or broken connection: another rank's error caused it


def _failed(err: Exception) -> _Outcome:
    """The outcome of a rank's part that raised ``err``: its one line, exit status, process, host and traceback."""
    return _Outcome(
        error=one_line(err),
        status=exit_status(err),
        pid=os.getpid(),
        host=socket.gethostname(),
        traceback="".join(traceback.format_exception(err)),
        symptom=_symptom(err),
    )


def _symptom(err: BaseException) -> bool:
    """Whether ``err`` is a collective that timed out or lost its connection: what a rank sees when a peer failed
    elsewhere (a compute collective the peer never joined), not a cause of its own."""
    if isinstance(err, (CollectiveTimeout, PeerLost)):
        return True
    return isinstance(err, RuntimeError) and ("timed out" in str(err).lower() or connection_lost(err))


def one_line(err: BaseException) -> str:
    """``err`` as one line: our errors' message as it is (it is the report), any other error with its type."""
    text = str(err) if isinstance(err, (UsageError, RunFailure)) else f"{type(err).__name__}: {err}".rstrip(": ")
    return " ".join(text.split()) or type(err).__name__


class WaitLog(SecondsTally):
    """Seconds this process spent in the collectives of :func:`waiting`, by phase (``round 3's plan`` is counted as
    ``round's plan``): what ``python -m fl_lightning.bench ranks`` reports. Off unless :func:`recording_waits`
    installs one (the bench's own processes); then each wait costs two ``time.monotonic()`` calls."""

    def add(self, name: str, seconds: float) -> None:
        super().add(re.sub(r"round \d+'s", "round's", name), seconds)


_wait_log: list[WaitLog] = []  # the installed log (at most one), for the bench's processes only


@contextmanager
def recording_waits() -> Iterator[WaitLog]:
    """Record every wait of this process in :func:`waiting` into a fresh :class:`WaitLog` while the block runs."""
    with installed(_wait_log, WaitLog()) as log:
        yield log


@contextmanager
def waiting(what: str, timeout_s: float, rank: int, key: str = "federation.collective_timeout_s") -> Iterator[None]:
    """A collective that times out (gloo raises ``RuntimeError: … Timed out …``) becomes one line naming ``key`` (the
    object collectives' ``federation.collective_timeout_s``, or ``federation.compute_timeout_s`` for a compute
    collective); its duration goes to the :class:`WaitLog` of :func:`recording_waits` when one is installed."""
    start = time.monotonic() if _wait_log else 0.0
    try:
        yield
    except RuntimeError as err:  # torch.distributed.DistError and gloo's errors are RuntimeErrors
        if connection_lost(err):  # gloo: a peer's process or host has gone (the watch names it)
            raise lost_peer(rank, what, err) from err
        if "timed out" not in str(err).lower():
            raise
        raise CollectiveTimeout(
            f"rank {rank} waited more than {key}={timeout_s:g} s for {what}; raise it "
            f"above the longest {_LONGEST.get(key, 'wait')}"
        ) from err
    finally:
        if _wait_log:
            _wait_log[-1].add(what, time.monotonic() - start)


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
            if decided(err):  # an inner exchange told every rank already: they have stopped
                raise
            failed = _Outcome(
                error=" ".join(str(err).split()) or type(err).__name__,
                status=exit_status(err),
                pid=os.getpid(),
                host=socket.gethostname(),
            )
            try:
                fabric.broadcast(failed, src=0)
            except Exception:  # noqa: BLE001 — a rank that is gone already: rank 0's own error is the report
                pass
            _decide(err)
            raise
        with waiting(what, timeout_s, 0):
            fabric.broadcast(_Outcome(value=to_cpu(value) if send else None), src=0)
        return value
    with waiting(what, timeout_s, fabric.global_rank):
        outcome: _Outcome = fabric.broadcast(None, src=0)
    if outcome.error is not None:
        raise _stopping(outcome, outcome.status, outcome.error)
    return outcome.value


def to_server(
    fabric: Fabric, step: Callable[[], T], *, what: str, timeout_s: float, check: Callable[[list[T]], None] | None = None
) -> list[T]:
    """Every rank's ``step()``, gathered on rank 0 as outcomes; rank 0's verdict on every rank.

    A rank whose ``step()`` raises still takes part in the gather (with its error's line, exit status and
    traceback), so no rank waits for it until the collective timeout; the verdict is then rank 0's broadcast
    (:func:`from_server`), which ends every rank when any failed.

    Args:
        fabric: the launched Fabric.
        step: this rank's part (its clients); it may raise.
        what: the part, in words, for the error's line and a timeout's message (``"round 3's clients"``).
        timeout_s: ``federation.collective_timeout_s``, for that message.
        check: rank 0's decision on the gathered values when every rank succeeded (the client-failure
            policy); what it raises ends every rank as a failed rank does.

    Returns:
        On rank 0, every rank's value in rank order (its own object first, CPU copies of the others'); on the
        other ranks, their own value alone.

    Raises:
        On rank 0: its own step's error, else a :class:`RankUsageError` / :class:`RankFailure` naming the first
        failing rank and its host, else what ``check`` raised. On the others (the failing ones included):
        :class:`RankStopped` with that error's exit status.
    """
    if fabric.world_size == 1:
        values = [step()]
        if check is not None:
            check(values)
        return values
    rank = fabric.global_rank
    own: Exception | None = None
    try:
        value = step()
        mine = _Outcome(value=value if rank == 0 else to_cpu(value))
    except Exception as err:  # not an interrupt: a launcher or scheduler signals every rank itself
        if decided(err):  # an inner exchange told every rank already: they have stopped
            raise
        own, value, mine = err, None, _failed(err)
        failing(mine.status, what, mine.error)
    parts: list[Any] | None = [None] * fabric.world_size if rank == 0 else None
    try:
        with waiting(what, timeout_s, rank):
            dist.gather_object(mine, parts, dst=0, group=object_group(fabric))  # to the server only
    except Exception:
        if own is None:
            raise
        raise own  # noqa: B904 — this rank's error is the report, not the collective's that it broke

    def verdict() -> None:
        failed = _causes([(r, outcome) for r, outcome in enumerate(parts) if outcome.error is not None])
        if own is not None and failed[0][0] == 0:
            raise own  # rank 0's own error, as a failing server phase raises it
        if failed:
            raise _rank_error(what, failed)
        if check is not None:
            check([value, *(outcome.value for outcome in parts[1:])])

    from_server(fabric, verdict, what=f"the outcome of {what}", timeout_s=timeout_s, send=False)
    if own is not None:  # not reached: rank 0's verdict stops this rank (RankStopped)
        raise own  # noqa: B904
    return [value] if rank != 0 else [value, *(outcome.value for outcome in parts[1:])]


def everyone(fabric: Fabric, step: Callable[[], T], *, what: str, timeout_s: float) -> T:
    """Every rank's ``step()``, then one exchange of their outcomes (an all-gather of each rank's error line,
    status, process and host — never its value): every rank reaches the same verdict from it, so a rank that
    fails ends every rank in one collective, and no rank waits for it until the collective timeout.

    Args:
        fabric: the launched Fabric.
        step: this rank's part; it may raise.
        what: the part, in words, for the error's line and a timeout's message (``"round 3's end"``).
        timeout_s: ``federation.collective_timeout_s``, for that message.

    Returns:
        This rank's ``step()`` value (its own object).

    Raises:
        On rank 0: its own step's error, else a :class:`RankUsageError` / :class:`RankFailure` naming the first
        failing rank and its host. On the others (the failing ones included): :class:`RankStopped` with that
        error's exit status.
    """
    if fabric.world_size == 1:
        return step()
    return _exchange_outcomes(fabric, step, what=what, timeout_s=timeout_s, carry=False)[0]


def gathered(fabric: Fabric, step: Callable[[], T], *, what: str, timeout_s: float) -> list[T]:
    """Every rank's ``step()`` value on every rank, in rank order: :func:`everyone` whose exchange carries the
    values (as CPU copies; this rank's own object in its place).

    Args:
        fabric: the launched Fabric.
        step: this rank's shard of the work; it may raise.
        what: the part, in words, for the error's line and a timeout's message (``"the test split's shards"``).
        timeout_s: ``federation.collective_timeout_s``, for that message.

    Returns:
        The values of ranks 0..N-1 (one process: ``[step()]``).

    Raises:
        As :func:`everyone`: on rank 0 its own error or one naming the first failing rank; on the others
        :class:`RankStopped`.
    """
    if fabric.world_size == 1:
        return [step()]
    value, parts = _exchange_outcomes(fabric, step, what=what, timeout_s=timeout_s, carry=True)
    return [value if r == fabric.global_rank else outcome.value for r, outcome in enumerate(parts)]


def _exchange_outcomes(
    fabric: Fabric, step: Callable[[], T], *, what: str, timeout_s: float, carry: bool
) -> tuple[T, list[_Outcome]]:
    """This rank's ``step()``, then an all-gather of every rank's outcome (with a CPU copy of its value when
    ``carry``) and the same verdict on every rank (:func:`_verdict`): this rank's value and every outcome."""
    rank = fabric.global_rank
    own: Exception | None = None
    try:
        value = step()
        mine = _Outcome(value=to_cpu(value) if carry else None, pid=os.getpid(), host=socket.gethostname())
    except Exception as err:  # not an interrupt: a launcher or scheduler signals every rank itself
        if decided(err):  # an inner exchange told every rank already: they have stopped
            raise
        own, value, mine = err, None, _failed(err)
        failing(mine.status, what, mine.error)
    parts: list[Any] = [None] * fabric.world_size
    try:
        with waiting(what, timeout_s, rank):
            dist.all_gather_object(parts, mine, group=object_group(fabric))
    except Exception:
        if own is None:
            raise
        raise own  # noqa: B904 — this rank's error is the report, not the collective's that it broke
    _verdict(rank, own, what, parts)
    return value, parts


@dataclass(frozen=True)
class Ranks:
    """The ranks that share a server phase, for code below the engine (a stage's aggregate): who this rank is, and
    the two collectives it may join, each carrying outcomes (a failure on any rank ends every rank).

    Args:
        fabric: the launched Fabric.
        timeout_s: ``federation.collective_timeout_s`` (the object exchanges).
        compute_timeout_s: ``federation.compute_timeout_s``, for a compute collective's message (a lockstep
            all-reduce on the default process group, e.g. the pre-training's failure flag).
    """

    fabric: Fabric
    timeout_s: float
    compute_timeout_s: float = 900.0

    @property
    def rank(self) -> int:
        return self.fabric.global_rank

    @property
    def world(self) -> int:
        return self.fabric.world_size

    @property
    def deal(self) -> Deal:
        """This rank's :class:`~fl_lightning.dealing.Deal`: its share of a phase's items by a named rule, and the
        inverse that puts :meth:`gather`'s parts back in item order."""
        return Deal(self.rank, self.world)

    def on_server(self, step: Callable[[], T], what: str, *, send: bool = True) -> T:
        """:func:`from_server`: ``step()`` on rank 0, its value on every rank."""
        return from_server(self.fabric, step, what=what, timeout_s=self.timeout_s, send=send)

    def gather(self, step: Callable[[], T], what: str) -> list[T]:
        """:func:`gathered`: every rank's ``step()`` on every rank, in rank order."""
        return gathered(self.fabric, step, what=what, timeout_s=self.timeout_s)


def _verdict(rank: int, own: Exception | None, what: str, parts: list[_Outcome]) -> None:
    """Every rank's same verdict on an exchange of outcomes: nothing when none failed; else rank 0 raises its own
    error or one naming the first failing rank, the others stop quietly (:class:`RankStopped`)."""
    failed = [(r, outcome) for r, outcome in enumerate(parts) if outcome.error is not None]
    if not failed:
        return
    failed = _causes(failed)
    if rank == 0:
        raise _decide(own if own is not None and failed[0][0] == 0 else _rank_error(what, failed))
    leader = parts[0]
    if failed[0][0] == 0:  # rank 0's own error: it raises it
        status, line = leader.status, leader.error
    else:
        status, line = failed[0][1].status, str(_rank_error(what, failed))
    raise _stopping(leader, status, line)


def _causes(failed: list[tuple[int, _Outcome]]) -> list[tuple[int, _Outcome]]:
    """The failed ranks whose error is a cause, in rank order: a collective's timeout or broken connection is the
    symptom of a rank that failed elsewhere, and that rank's error is the report (all of them when every one is a
    symptom)."""
    return [(r, outcome) for r, outcome in failed if not outcome.symptom] or failed


def _rank_error(what: str, failed: list[tuple[int, _Outcome]]) -> RankFailure | RankUsageError:
    """Rank 0's one error for the ranks that failed in ``what``: it names the first (its host, its line)."""
    rank, outcome = failed[0]
    more = f" (and {len(failed) - 1} more rank{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
    message = f"rank {rank} on {outcome.host} failed in {what}{more}: {outcome.error}"
    error_class = RankUsageError if outcome.status == 2 else RankFailure
    return error_class(message, rank, outcome.host, outcome.traceback)


def _stopping(leader: _Outcome, status: int, line: str) -> RankStopped:
    """This rank stops in order, as every rank does (rank 0 raises the error): its peers' watch stands down (their
    exits, rank 0's store with it, are expected now), rank 0 on its host exits first; the quiet stop to raise."""
    stand_down()
    _let_leader_exit_first(leader)
    return RankStopped(status, line)


def _let_leader_exit_first(outcome: _Outcome) -> None:
    """Let rank 0 print its line and exit with its status before this rank exits non-zero. Under Fabric's launcher
    rank 0 is this process's parent, and a child that exits non-zero makes it kill rank 0 (SIGKILL, Lightning's
    ``_ChildProcessObserver``); torchrun's agent stops the other ranks (SIGTERM) within 0.1 s of one exiting
    non-zero — either possibly before rank 0 has printed. On rank 0's host wait until it is gone (its parent
    gone, or under another launcher its process), at most a grace period; a launcher's signal meanwhile only
    ends the wait. On another host stop at once (rank 0's host has its own launcher)."""
    if outcome.host != socket.gethostname() or outcome.pid in (0, os.getpid()):
        return
    parent = os.getppid() == outcome.pid
    deadline = time.monotonic() + _LEADER_EXIT_GRACE_S
    try:
        while (os.getppid() == outcome.pid if parent else _alive(outcome.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:  # stopping anyway, with rank 0's status
        pass


def _alive(pid: int) -> bool:
    """Process ``pid`` exists on this host (an exited one its launcher has not reaped yet counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True
