"""``<run_dir>/.lock``: one run at a time in a run folder, across the hosts of a cluster (:class:`RunLock`).

The lock holds the PID, process start time, host and SLURM job of the run that uses the folder, and a heartbeat its
holder refreshes every :data:`HEARTBEAT_S` seconds. A second run into the same folder stops with one line; a lock
whose holder is provably gone is stale and taken over with a one-line warning: its process is gone on this host
(killed, the machine restarted, the PID reused), its SLURM job has ended (``squeue``: :func:`slurm_job_running`), or
its heartbeat is older than :data:`STALE_AFTER_S` (a job killed at its time limit, pre-empted or on a lost node,
resubmitted to another host). SLURM lives here and nowhere else, as Lightning keeps it in its SLURM environment.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fl_lightning.durable_write import disk_full_error
from fl_lightning.errors import RunFolderError
from fl_lightning.federation.storage.run_folder import LOCK

__all__ = ["LOCK", "HEARTBEAT_S", "STALE_AFTER_S", "RunLock", "slurm_job_running"]

# The lock's heartbeat: its holder rewrites the lock every HEARTBEAT_S; a lock of another host whose heartbeat
# is older than STALE_AFTER_S (20 missed beats: no NFS hiccup or busy node lasts that long) is stale. A run
# resubmitted after a time limit or pre-emption waits at most that long for its folder.
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0
_UNREADABLE_LOCK_GRACE_S = 10.0  # a lock file still being written by its creator is not stale


def _process_start(pid: int) -> str | None:
    """The kernel's start time of process ``pid`` (Linux: /proc/PID/stat field 22), to tell a reused PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


# SLURM job states (squeue %T) in which the job's processes are gone: it ended, or it waits to run again
_SLURM_NOT_RUNNING = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "SPECIAL_EXIT",
        "REVOKED",
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
    }
)


def slurm_job_running(job_id: str, *, timeout_s: float = 10.0) -> bool | None:
    """Whether SLURM job ``job_id`` still runs, as ``squeue -h -j ID -o %T`` tells.

    Returns:
        True when squeue lists it in a running state (RUNNING, COMPLETING, SUSPENDED, … or one it does not
        know), False when it has ended or waits to run again (its processes are gone; a job the controller has
        forgotten is "Invalid job id"), None when it cannot tell (no squeue here, the controller does not
        answer in ``timeout_s``).
    """
    exe = shutil.which("squeue")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return False if "invalid job id" in out.stderr.lower() else None
    return bool(set(out.stdout.split()) - _SLURM_NOT_RUNNING)  # not listed at all: it has ended


def _slurm_job() -> tuple[str | None, int]:
    """This process's SLURM job id (None outside SLURM) and how often SLURM restarted it (requeue)."""
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    return os.environ.get("SLURM_JOB_ID") or None, int(restarts) if restarts.isdigit() else 0


class RunLock:
    """``<run_dir>/.lock``: one run at a time in a folder, across the hosts of a cluster.

    The file is created with ``O_EXCL`` and holds ``{"pid", "start", "host", "since", "slurm_job_id",
    "slurm_restart_count", "heartbeat", "token"}``; a daemon thread of the holder rewrites ``heartbeat`` (wall
    clock: hosts compare it) every ``heartbeat_s`` while the lock is held. A lock is stale, and taken over with
    a one-line warning on stderr naming the rule, when its holder is provably gone:

    * on this host: its process is gone (or the PID now belongs to a process started later);
    * on another host: its SLURM job (another one than ours) has ended, as ``job_running`` tells; or it is our
      own job's earlier run (``SLURM_RESTART_COUNT`` is higher now: SLURM requeued the job); or its heartbeat
      (the later of the recorded one and the file's mtime) is older than ``stale_after_s``. A lock an older
      version wrote has no heartbeat: its mtime stands for it.

    Otherwise acquiring stops with one line naming the holder (host, pid, job, heartbeat age) and when its
    lock will count as stale.

    Args:
        run_dir: the run folder (created if missing; removed again on release if nothing else was written).
        heartbeat_s: seconds between the holder's heartbeats.
        stale_after_s: age of another host's heartbeat after which its lock is stale.
        job_running: ``job_id -> True / False / None`` (running, ended, cannot tell); :func:`slurm_job_running`.

    Example:
        >>> with RunLock(Path("runs/fedavg_digits_a0.5_s0")):  # doctest: +SKIP
        ...     ...  # run
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        stale_after_s: float = STALE_AFTER_S,
        job_running: Callable[[str], bool | None] = slurm_job_running,
    ) -> None:
        if not 0 < heartbeat_s < stale_after_s:
            raise ValueError(f"RunLock: expected 0 < heartbeat_s < stale_after_s, got {heartbeat_s}, {stale_after_s}")
        self.path = Path(run_dir) / LOCK
        self.heartbeat_s, self.stale_after_s, self._job_running = heartbeat_s, stale_after_s, job_running
        self.held = False
        self._made_folder = False  # remove the folder again on release if nothing else was written
        self._token = uuid.uuid4().hex  # which RunLock holds the file (a PID is not enough across hosts)
        self._since = ""
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock (creating the run folder), or raise :class:`RunFolderError` naming the holder."""
        self._made_folder = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raw, info = self._read()
                stale, why, rule = self._judge(raw, info)
                if not stale:
                    raise RunFolderError(
                        f"run folder error: '{self.path.parent}' is in use by another run "
                        f"({why}); {rule}; wait for it to finish, or choose another --run_name / "
                        f"--output_dir"
                    ) from None
                if self._remove_if_unchanged(raw) and why:
                    print(
                        f"fl_lightning: warning: took over the stale lock '{self.path}' ({self._who(info)}): {why}",
                        file=sys.stderr,
                    )
                continue
            self._since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(self._content())
            except OSError as err:
                self.path.unlink(missing_ok=True)
                full = disk_full_error(err, self.path, len(self._content()))
                if full is not None:
                    raise full from err
                raise
            self.held = True
            self._stop = threading.Event()
            self._beat = threading.Thread(target=self._heartbeat, args=(self._stop,), name="fl-lock-heartbeat", daemon=True)
            self._beat.start()
            return
        raise RunFolderError(f"run folder error: could not take the lock '{self.path}' (other runs keep taking it); try again")

    def _content(self) -> str:
        pid = os.getpid()
        job, restarts = _slurm_job()
        return json.dumps(
            {
                "pid": pid,
                "start": _process_start(pid),
                "host": socket.gethostname(),
                "since": self._since,
                "slurm_job_id": job,
                "slurm_restart_count": restarts,
                "heartbeat": round(time.time(), 3),
                "token": self._token,
            }
        )

    def _read(self) -> tuple[bytes | None, dict[str, Any] | None]:
        """The lock file's bytes (None: gone) and its record (None: unreadable)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as err:
            raise RunFolderError(
                f"run folder error: the lock '{self.path}' cannot be read ({err.strerror or err}); "
                f"make it readable, or choose another --run_name / --output_dir"
            ) from None
        try:
            info = json.loads(raw)
            int(info["pid"]), str(info["host"])
        except (ValueError, KeyError, TypeError):
            return raw, None
        return raw, info

    @staticmethod
    def _who(info: dict[str, Any] | None) -> str:
        if info is None:
            return "unreadable"
        job = info.get("slurm_job_id")
        return f"pid {info['pid']} on host {info['host']}" + (f", SLURM job {job}" if job else "")

    def _judge(self, raw: bytes | None, info: dict[str, Any] | None) -> tuple[bool, str, str]:
        """``(True, the rule that makes the lock stale, "")`` (no rule when the file is simply gone), or
        ``(False, its holder, when it will count as stale)``."""
        if raw is None:
            return True, "", ""
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return True, "", ""
        if info is None:  # being written by its creator just now, or garbage left behind
            if time.time() - mtime < _UNREADABLE_LOCK_GRACE_S:
                return (
                    False,
                    f"lock file '{self.path}' is being written",
                    (f"it counts as stale if still unreadable {_UNREADABLE_LOCK_GRACE_S:.0f} s after it was written"),
                )
            return True, f"the lock file is unreadable and older than {_UNREADABLE_LOCK_GRACE_S:.0f} s", ""
        pid, host, since = int(info["pid"]), str(info["host"]), info.get("since", "?")
        if host == socket.gethostname():
            if not _alive(pid):
                return True, f"its process {pid} is gone", ""
            start = _process_start(pid)
            if info.get("start") is not None and start is not None and start != info["start"]:
                return True, f"pid {pid} now belongs to a process started later", ""
            return False, f"pid {pid}, since {since}", "it is taken over once that process has ended"
        job = info.get("slurm_job_id")
        job = str(job) if job else None
        mine, restarts = _slurm_job()
        if job is not None and job == mine:
            theirs = info.get("slurm_restart_count")
            if isinstance(theirs, int) and theirs < restarts:
                return (
                    True,
                    (f"SLURM requeued job {job} (restart {restarts}; the lock is of restart {theirs}): that earlier run is gone"),
                    "",
                )
        elif job is not None and self._job_running(job) is False:
            return True, f"its SLURM job {job} is no longer running (squeue)", ""
        beat = info.get("heartbeat")
        last = max(mtime, float(beat)) if isinstance(beat, (int, float)) else mtime
        age = max(time.time() - last, 0.0)
        if age > self.stale_after_s:
            return True, f"its heartbeat is {age:.0f} s old (stale after {self.stale_after_s:.0f} s)", ""
        heard = (
            f"last heartbeat {age:.0f} s ago"
            if isinstance(beat, (int, float))
            else f"no heartbeat (an older version's lock), written {age:.0f} s ago"
        )
        ended = " or its SLURM job has ended" if job is not None and job != mine else ""
        return (
            False,
            f"pid {pid} on host {host}, SLURM job {job or 'none'}, since {since}, {heard}",
            (
                f"it counts as stale once its heartbeat is {self.stale_after_s:.0f} s old{ended}; if no run is active "
                f"there, delete '{self.path}'"
            ),
        )

    def _remove_if_unchanged(self, raw: bytes | None) -> bool:
        """Delete the lock judged stale, unless it changed since (a heartbeat, another run's new lock): then it
        is judged again. True when it was removed (by us or before)."""
        try:
            if self.path.read_bytes() != raw:
                return False
            self.path.unlink()
        except FileNotFoundError:
            pass
        return True

    def _heartbeat(self, stop: threading.Event) -> None:
        """The holder's thread: rewrite the heartbeat every ``heartbeat_s`` until released (or the lock is lost)."""
        while not stop.wait(self.heartbeat_s):
            try:
                with self.path.open("r+") as f:  # in place: no temp file in the run folder, and no new inode
                    if json.loads(f.read()).get("token") != self._token:
                        raise FileNotFoundError
                    f.seek(0)
                    f.write(self._content())
                    f.truncate()
            except FileNotFoundError:
                if not stop.is_set():
                    print(
                        f"fl_lightning: warning: the lock '{self.path}' was taken over by another run (this "
                        f"run's heartbeat had stopped for over {self.stale_after_s:.0f} s): two runs may now "
                        f"write this folder",
                        file=sys.stderr,
                    )
                return
            except (OSError, ValueError):
                continue  # a hiccup of the file system: beat again next time

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=10.0)
            self._beat = None
        try:
            info = json.loads(self.path.read_text())
            if info.get("token") == self._token:
                self.path.unlink()
            if self._made_folder and not any(self.path.parent.iterdir()):
                self.path.parent.rmdir()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ----------------------------------------------------------------------------- one folder for every rank
