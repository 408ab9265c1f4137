"""Every rank's heartbeat, and each rank's watch over its peers: a rank that is dead or frozen ends the job in
minutes, however long the legitimate wait it interrupts.

gloo notices a peer whose process has exited (its sockets close); NCCL does not, and no backend notices a peer that
is frozen (SIGSTOP, a hung file system, a host that dropped off the network) or one that stopped outside any
collective: the others wait in their next collective until ``federation.collective_timeout_s`` (a day, because a
server phase may legitimately last hours). So every rank of a multi-process run keeps a thread that, every
``patience / 6`` seconds (at most 10 s),

* writes its own entry to the job's store (the launcher's TCP store: torchrun's agent, or rank 0's process under
  Fabric's launcher and SLURM): a beat counter, its state (running, done, stopped, failed), exit status, host, pid
  and, for a failure, its one line;
* reads every peer's entry in one round trip, and ends the job when a peer

  - failed outside an exchange of outcomes (its entry says so: e.g. a setup error on one node): at once, with that
    rank's exit status;
  - has waited with its own error in an exchange of outcomes (federation/ranks/collectives.py) for two beats while the
    others have not come: they are elsewhere — in a compute collective the failing rank will never join (an error
    inside DDP's backward, between the split ensemble's gathers), or a long phase of their own — so the exchange
    would only meet after the compute timeout or the phase: with that rank's line and exit status;
  - has not beaten for ``federation.liveness_timeout_s`` (killed, frozen, host lost): exit status 1; a frozen peer
    on this host is SIGKILLed too, so it stops holding its GPU;
  - or the store itself stopped answering for that long (the process that holds it has gone): exit status 1.

The lowest live rank prints one line naming the rank, its host and the cause, and saying that the same command
resumes; every other rank exits quietly. The exit is immediate (``os._exit``): the main thread may sit in a
collective that will never return. Nothing is lost that a kill would not lose: every file the run writes is
atomic, and a resume starts from the last completed round.

A rank's entry says done or stopped when it ends in order (a finished run; an error decided in an exchange of
outcomes, federation/ranks/collectives.py, where every rank stops together), so its peers never take its exit for a
death. What the watch costs: one small write and one read per beat per rank (64 ranks, 10 s: about 13 store
operations a second in all), no collective, no GPU.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from fl_lightning.errors import RunFailure

__all__ = ["Liveness", "PeerState", "PeerLost", "watching", "failing", "stand_down", "lost_peer", "beat_interval"]

_RESUME = "every rank stops; the same command resumes from the last completed round"

_LAST_WRITE_S = 5.0  # how long a rank's last entry may take to reach the store

# the states of a rank's entry; FAILING: the rank holds an error and waits in an exchange of outcomes for its peers
RUNNING, DONE, STOPPED, FAILED, FAILING = "running", "done", "stopped", "failed", "failing"


class PeerLost(RunFailure):
    """A collective broke because a peer's connection closed (gloo) and no watch named the rank (exit status 1)."""


def beat_interval(patience_s: float) -> float:
    """Seconds between two beats (and two reads of the peers): a sixth of the patience, at most 10 s."""
    return min(10.0, patience_s / 6.0)


@dataclass(frozen=True)
class PeerState:
    """One rank's entry in the store, as its watch reads it."""

    beat: int
    state: str
    status: int
    host: str
    pid: int
    line: str

    def encode(self) -> bytes:
        return "\t".join(map(str, (self.beat, self.state, self.status, self.host, self.pid, self.line))).encode()

    @classmethod
    def decode(cls, raw: bytes) -> PeerState:
        beat, state, status, host, pid, line = raw.decode(errors="replace").split("\t", 5)
        return cls(int(beat), state, int(status), host, int(pid), line)


def _exit_now(line: str | None, status: int) -> None:
    """The default end of a lost job: this rank's one line (or none), then exit at once."""
    if line is not None:
        print(f"fl_lightning: {line}", file=sys.stderr, flush=True)
    os._exit(status)


class Liveness:
    """This rank's heartbeat and its watch over the other ranks (the module docstring).

    Args:
        store: the job's key-value store (every rank the same), or a prefix of it.
        rank: this rank.
        world: the number of ranks.
        patience_s: ``federation.liveness_timeout_s``: how long a peer, or the store, may stay silent.
        on_lost: what ends the job: ``(line or None, status)``; the default prints the line and ``os._exit``\\ s.
        store_name: the store's address, for the line.
        leader: rank 0's (host, pid) as the start's broadcast gave it: a store frozen with rank 0 before this rank
            read its entry still names rank 0's host, and a frozen rank 0 on this host is still killed.
    """

    def __init__(
        self,
        store: dist.Store,
        *,
        rank: int,
        world: int,
        patience_s: float,
        on_lost: Callable[[str | None, int], None] = _exit_now,
        store_name: str = "the job's store",
        leader: tuple[str, int] | None = None,
    ) -> None:
        self.store, self.rank, self.world, self.patience_s = store, rank, world, float(patience_s)
        self.interval_s = beat_interval(self.patience_s)
        self.on_lost, self.store_name = on_lost, store_name
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._beat = 0
        self._stop = threading.Event()
        self._lost = threading.Event()  # set once this watch has ended the job
        self._ending = threading.Lock()  # the beat and the guard thread: one of them ends the job, once
        self._thread: threading.Thread | None = None
        self._peers = [r for r in range(world) if r != rank]
        self._seen: dict[int, tuple[int | None, float, PeerState | None]] = {}  # peer -> (beat, its last change, entry)
        self._all_present = False  # every peer has written its entry (then one multi_get reads them all)
        self._in_order: set[int] = set()  # peers whose entry said done or stopped
        self._leader = leader
        self._entry: tuple[str, int, str] = (RUNNING, 0, "")  # what each beat writes: state, status, line
        # rank (this one included) -> (when it was first seen failing, its exit status)
        self._failing_since: dict[int, tuple[float, int]] = {}

    # ------------------------------------------------------------------------------------- lifecycle
    def start(self) -> Liveness:
        """Write this rank's first entry and start the thread (daemon: it never keeps the process alive)."""
        self._write(RUNNING)
        self._answered = time.monotonic()  # the last time the store answered
        self._thread = threading.Thread(target=self._run, name="fl_lightning-liveness", daemon=True)
        self._thread.start()
        threading.Thread(target=self._guard, name="fl_lightning-liveness-guard", daemon=True).start()
        return self

    def stop(self, state: str = DONE, *, status: int = 0, line: str = "") -> None:
        """Stop watching and leave ``state`` as this rank's entry (best effort: the store may be gone)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.interval_s + 1.0)

        def leave() -> None:
            try:
                self._write(state, status=status, line=line)
            except Exception:  # noqa: BLE001 — the store's host may have exited first: nothing to tell anyone then
                pass

        last = threading.Thread(target=leave, name="fl_lightning-liveness-last", daemon=True)
        last.start()
        last.join(timeout=_LAST_WRITE_S)  # a frozen store never answers: this rank's ending does not wait on it

    @property
    def grace_s(self) -> float:
        """How long a rank may wait with its error in an exchange of outcomes before the watch ends the job: two beats
        (peers that are in the same exchange meet it within a beat; others are elsewhere)."""
        return 2 * self.interval_s

    def failing(self, status: int, what: str, line: str) -> None:
        """This rank holds an error (exit ``status``, its one ``line``) and enters the exchange of ``what``: its entry
        says so from now on, so that peers which never join that exchange end the job after :attr:`grace_s`."""
        self._failing_since.setdefault(self.rank, (time.monotonic(), status))
        # the next beat writes it (one thread uses the store)
        self._entry = (FAILING, status, " ".join(f"in {what}: {line}".split()))

    def await_verdict(self, timeout_s: float | None = None) -> bool:
        """Block until this watch has ended the job (the default ``on_lost`` never returns) or ``timeout_s``
        passed: whether it did. For a main thread whose collective broke because a peer is gone: the watch names
        the peer within its patience."""
        return self._lost.wait(self.patience_s + 3 * self.interval_s if timeout_s is None else timeout_s)

    # ---------------------------------------------------------------------------------------- the beat
    def _key(self, rank: int) -> str:
        return f"rank{rank}"

    def _write(self, state: str, *, status: int = 0, line: str = "") -> None:
        self._beat += 1
        entry = PeerState(self._beat, state, status, self.host, self.pid, " ".join(line.split()))
        self.store.set(self._key(self.rank), entry.encode())

    def _run(self) -> None:
        store_silent_since: float | None = None
        while not self._stop.wait(self.interval_s):
            call = time.monotonic()
            try:
                state, status, line = self._entry
                self._write(state, status=status, line=line)
                entries = self._read_peers()
            except Exception:  # noqa: BLE001 — the store's host has gone (its connection closed)
                store_silent_since = store_silent_since or call
                if time.monotonic() - store_silent_since >= min(self.patience_s, 2 * self.interval_s + 1.0):
                    self._store_lost()
                    return
                continue
            store_silent_since, self._answered = None, time.monotonic()
            if self._check(entries):
                return

    def _guard(self) -> None:
        """The store calls of :meth:`_run` block, without end, on a store whose process is frozen (its connection
        stays open; the client's timeout only warns): this thread ends the job when no call has come back for the
        patience."""
        while not self._stop.wait(self.interval_s):
            if time.monotonic() - self._answered > self.patience_s:
                self._store_lost()
                return

    def _read_peers(self) -> list[PeerState | None]:
        """Every peer's entry (None for a peer that has not written one yet): one round trip, two before then."""
        keys = [self._key(r) for r in self._peers]
        if not keys:
            return []
        if not self._all_present:  # multi_get would wait for a missing key
            self._all_present = self.store.check(keys)
            if not self._all_present:
                return [PeerState.decode(self.store.get(k)) if self.store.check([k]) else None for k in keys]
        return [PeerState.decode(x) for x in self.store.multi_get(keys)]

    def _check(self, entries: list[PeerState | None]) -> bool:
        """Read the peers' entries: end the job (and return True) when one failed or went silent."""
        now = time.monotonic()
        silent: list[tuple[int, PeerState | None, float]] = []
        for peer, entry in zip(self._peers, entries):
            if entry is not None and entry.state in (DONE, STOPPED):
                self._seen.pop(peer, None)
                self._in_order.add(peer)
                continue
            if entry is not None and entry.state == FAILED:  # rank 0 printed its own line; another's, rank 0 names
                self._end([peer], f"rank {peer} on {entry.host} failed: {entry.line}; {_RESUME}", entry.status, quiet=peer == 0)
                return True
            if entry is not None and entry.state == FAILING:  # waiting with its error for peers that are elsewhere
                if now - self._failing_since.setdefault(peer, (now, entry.status))[0] > self.grace_s:
                    # rank 0 prints its own error: its exchange runs on gloo, which notices these ranks' exits
                    self._end(
                        [peer], f"rank {peer} on {entry.host} failed {entry.line}; {_RESUME}", entry.status, quiet=peer == 0
                    )
                    return True
            beat, since, _ = self._seen.get(peer, (None, now, entry))
            if entry is not None and beat != entry.beat:
                since = now
            self._seen[peer] = (entry.beat if entry is not None else None, since, entry)
            if now - since > self.patience_s:
                silent.append((peer, entry, now - since))
        if not silent:
            return self._own_failure_unanswered(now)
        peer, entry, age = silent[0]
        host = f" on {entry.host}" if entry is not None else ""
        more = f" (and {len(silent) - 1} more rank{'s' if len(silent) > 2 else ''})" if len(silent) > 1 else ""
        never = "never started its watch" if entry is None else f"no heartbeat for {age:.0f} s"
        self._kill_frozen([e for _, e, _ in silent if e is not None])
        self._end(
            [p for p, _, _ in silent],
            f"rank {peer}{host} stopped answering{more}: {never} "
            f"(federation.liveness_timeout_s={self.patience_s:g}; killed, frozen or its host lost); {_RESUME}",
            1,
        )
        return True

    def _own_failure_unanswered(self, now: float) -> bool:
        """This rank has waited with its error longer than its peers' watches take to end the job (four more beats:
        they first see the entry a beat after it is written, and check once a beat): end it — quietly, a peer has
        printed the line; rank 0, for which its peers stay quiet, with its own line."""
        since = self._failing_since.get(self.rank, (now, 0))[0]
        if self._entry[0] != FAILING or now - since <= self.grace_s + 4 * self.interval_s:
            return False
        # rank 0 prints its own line (its peers stay quiet for it), should its exchange not have noticed them go
        self._end([], f"rank 0 on {self.host} failed {self._entry[2]}; {_RESUME}", self._entry[1], quiet=self.rank != 0)
        return True

    def _store_lost(self) -> None:
        """The store stopped answering: the process that holds it (rank 0 under Fabric's launcher and SLURM,
        torchrun's agent) has gone or is frozen. Not when rank 0 had ended in order: its store went with it, and
        this rank is finishing too (its own ending, not the watch, decides its exit). Quietly, with that rank's
        status, when a rank was seen waiting with its error: rank 0's watch named it and ended the job."""
        if 0 in self._in_order:
            self._stop.set()
            return
        if self._failing_since:  # a rank waited with its error (this one, or a peer): rank 0 has named it and exited
            self._end([self.rank], "", min(self._failing_since.values())[1], quiet=True)
            return
        leader = self._seen.get(0, (None, 0.0, None))[2]
        if leader is None and self._leader is not None:  # frozen before this rank read its entry
            leader = PeerState(0, RUNNING, 0, self._leader[0], self._leader[1], "")
        host = f" on {leader.host}" if leader is not None else ""
        if leader is not None:
            self._kill_frozen([leader])
        self._end(
            [0] if self.rank != 0 else [],
            f"{self.store_name} stopped answering (rank 0{host}, which holds "
            f"it under Fabric's launcher and SLURM, or torchrun's agent, has gone or is frozen); {_RESUME}",
            1,
        )

    def _kill_frozen(self, entries: list[PeerState]) -> None:
        """SIGKILL the silent peers on this host (a frozen rank otherwise holds its GPU until someone notices)."""
        for entry in entries:
            if entry.host == self.host and entry.pid not in (0, self.pid):
                try:
                    os.kill(entry.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _end(self, gone: list[int], line: str, status: int, *, quiet: bool = False) -> None:
        """End the job: the lowest rank not among ``gone`` prints ``line`` (none when ``quiet``), every rank exits
        with ``status``."""
        with self._ending:
            if self._stop.is_set() or self._lost.is_set():  # the main thread finished meanwhile, or ended already
                return
            self._lost.set()
        printer = None if quiet else min(r for r in range(self.world) if r not in gone)
        self.on_lost(line if self.rank == printer else None, status)


_active: list[Liveness] = []  # the watch of the run this process is in (at most one), for stand_down/lost_peer


@contextmanager
def watching(
    store: dist.Store | None,
    *,
    rank: int,
    world: int,
    patience_s: float,
    token: str,
    exit_status: Callable[[BaseException], int],
    one_line: Callable[[BaseException], str],
    decided: Callable[[BaseException], bool],
    on_lost: Callable[[str | None, int], None] = _exit_now,
    leader: tuple[str, int] | None = None,
) -> Iterator[Liveness | None]:
    """Keep this rank's heartbeat and watch its peers while the block runs (nothing on one rank).

    Args:
        store: the job's store (None: the launcher's, from ``MASTER_ADDR`` / ``MASTER_PORT``, else the default
            process group's).
        rank, world: this rank and the number of ranks.
        patience_s: ``federation.liveness_timeout_s``.
        token: this run's start (rank 0's, broadcast): the keys of an earlier start in the same store are ignored.
        exit_status, one_line, decided: how the block's error reads (federation/ranks/collectives.py): an error every rank
            has been told of leaves the entry ``stopped``; any other one ``failed``, with its status and line.
        on_lost: what ends the job (:class:`Liveness`; the default prints the line and exits at once).
        leader: rank 0's (host, pid), from the start's broadcast (:class:`Liveness`).
    """
    if world == 1:
        yield None
        return
    watch = Liveness(
        dist.PrefixStore(f"fl_lightning/liveness/{token}/", store or _job_store(patience_s)),
        rank=rank,
        world=world,
        patience_s=patience_s,
        on_lost=on_lost,
        store_name=_store_name(),
        leader=leader,
    )
    watch.start()
    _active.append(watch)
    try:
        yield watch
    except BaseException as err:
        if isinstance(err, Exception) and not decided(err):
            watch.stop(FAILED, status=exit_status(err), line=one_line(err))
        else:  # decided in an exchange, a stopping rank (SystemExit), Ctrl-C or the launcher's SIGTERM
            watch.stop(STOPPED)
        raise
    else:
        watch.stop(DONE)
    finally:
        _active.remove(watch)


def failing(status: int, what: str, line: str) -> None:
    """This rank enters the exchange of outcomes of ``what`` holding an error (exit ``status``, its one ``line``): its
    entry says so (:meth:`Liveness.failing`); nothing without a watch (one rank)."""
    for watch in _active:
        watch.failing(status, what, line)


def stand_down() -> None:
    """This rank is stopping in order (every rank has been told of the error): stop watching its peers, which may
    exit first — rank 0's store with it — without that being taken for a death."""
    for watch in _active:
        watch.stop(STOPPED)


def lost_peer(rank: int, what: str, err: BaseException) -> PeerLost:
    """The error for a collective that broke because a peer's connection closed: the watch names the peer and ends
    the job within its patience (this call then never returns); without a watch, or if it does not, one line."""
    for watch in _active:
        watch.await_verdict()
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return PeerLost(f"rank {rank} lost its connection to another rank during {what} ({first}); {_RESUME}")


def connection_lost(err: BaseException) -> bool:
    """Whether a collective's error says a peer's connection closed (gloo's words; torch's DistNetworkError)."""
    if isinstance(err, getattr(dist, "DistNetworkError", ())):
        return True
    text = str(err).lower()
    return any(s in text for s in ("connection closed", "connection reset", "broken pipe", "connection refused"))


def _store_name() -> str:
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"the job's store at {addr}:{port}" if addr and port else "the job's store"


def _job_store(patience_s: float) -> dist.Store:
    """A client of the launcher's store (its own connection, timing out after the patience), or the default
    process group's store when the launcher named none."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        try:
            return dist.TCPStore(addr, int(port), None, False, timeout=timedelta(seconds=patience_s))
        except (RuntimeError, ValueError):  # DistNetworkError and friends: the process group's own connection serves
            pass
    return dist.distributed_c10d._get_default_store()
