"""The run folder contract (docs/architecture.md): config.yaml, summary.json, metrics.csv, checkpoints/ — and
the record that keeps a run folder honest.

A run folder is a record that is never silently changed:

* ``run.json`` holds the resolved config the run started with and its **fingerprint** (SHA-256 of
  the config without the keys listed in :data:`RESUMABLE_KEYS`). ``--resume`` compares the folder's
  ``config.yaml`` (an edit is caught) and the command line's overrides with it, and accepts only
  changes that cannot alter what already ran: more (or fewer, down to the completed) rounds, how
  many ranks run it (the results do not depend on it), the failure policy for the rounds still to
  run, and ``logging.*``. Anything else stops with one line naming the keys and both values.
* A fresh start into a folder that already holds a run stops with one line, unless ``--overwrite``
  is given (which empties the folder first).
* ``.lock`` holds the PID, process start time, host and SLURM job of the run that uses the folder, and a
  heartbeat its holder refreshes every :data:`HEARTBEAT_S` seconds. A second run into the same folder stops
  with one line; a lock whose holder is provably gone is stale and taken over with a one-line warning: its
  process is gone on this host (killed, the machine restarted, the PID reused), its SLURM job has ended
  (``squeue``), or its heartbeat is older than :data:`STALE_AFTER_S` (a job killed at its time limit, pre-empted
  or on a lost node, resubmitted to another host).
* Every rank must see the one run folder: :func:`check_shared_run_folder` checks it at start-up, in seconds.
* A write that fails for lack of space stops with one line (:class:`~fl_lightning.errors.DiskFullError`,
  :func:`disk_full_error`); the file it would have replaced is intact.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fl_lightning.errors import DiskFullError, RunFolderError, UsageError

__all__ = [
    "write_metrics_csv", "read_metrics_csv", "write_summary", "write_text_atomic",
    "RECORD", "LOCK", "RESUMABLE_KEYS", "RunLock", "flatten", "fingerprint", "config_diff", "format_diff",
    "read_record", "write_record", "is_run_folder", "completed_rounds", "clear_run_folder",
    "HEARTBEAT_S", "STALE_AFTER_S", "slurm_job_running", "SHARED_CHECK", "check_shared_run_folder",
    "disk_full_error",
]

RECORD = "run.json"
LOCK = ".lock"
# Keys that may differ on --resume: they cannot change what already ran. The loop's results do not
# depend on the number of ranks (1-vs-2-rank equality is tested); the failure policy only decides
# whether the rounds still to come go on; output_dir/run_name are where the folder is; logging.* is
# where the numbers go; data.feature_cache only where frozen features are kept (bit-identical results either
# way, tested); data.cache_mb, data.cache_uint8_mb, data.pin_memory, data.persistent_workers and
# data.normalize_on_device (elementwise IEEE ops, on the CPU or the GPU) only how the same batches are made
# (tested; not data.num_workers: an augmentation draws from the workers' seeds) and
# federation.record_after_s only speed and what a crash costs, never a value; federation.collective_timeout_s,
# compute_timeout_s and liveness_timeout_s only how long a rank may wait. A key ending in "." is a whole section.
RESUMABLE_KEYS = ("federation.rounds", "federation.devices", "federation.num_nodes", "federation.strategy",
                  "federation.on_client_error", "federation.min_clients", "output_dir", "run_name", "variants",
                  "logging.", "data.feature_cache", "data.cache_mb", "data.cache_uint8_mb",
                  "data.pin_memory", "data.persistent_workers", "data.normalize_on_device", "federation.record_after_s",
                  "federation.collective_timeout_s", "federation.compute_timeout_s",
                  "federation.liveness_timeout_s")
# What a run writes; a folder holding any of these is a run folder (and --overwrite may empty it)
_RUN_FILES = (RECORD, "config.yaml", "summary.json", "metrics.csv", "checkpoints")
_ABSENT = "<absent>"
_UNREADABLE_LOCK_GRACE_S = 10.0  # a lock file still being written by its creator is not stale
# The lock's heartbeat: its holder rewrites the lock every HEARTBEAT_S; a lock of another host whose heartbeat
# is older than STALE_AFTER_S (20 missed beats: no NFS hiccup or busy node lasts that long) is stale. A run
# resubmitted after a time limit or pre-emption waits at most that long for its folder.
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0
SHARED_CHECK = ".shared_check"  # the token check_shared_run_folder writes (and removes again)
_SHARED_CHECK_WAIT_S = 5.0  # NFS caches a directory's entries for a few seconds (acdirmin): retry that long
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


# ----------------------------------------------------------------------------- writes, and a full disk


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _no_space_errno(err: BaseException) -> int | None:
    """ENOSPC or EDQUOT of an OSError anywhere in ``err``'s chain (torch buries it under its own RuntimeError)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            return err.errno
        err = err.__cause__ or err.__context__
    return None


def disk_full_error(err: BaseException, path: Path, needed: int | Callable[[], int | None] | None, *,
                    needed_is: str = "its size") -> DiskFullError | None:
    """The one-line error for a write of ``path`` that failed for lack of space, or None when ``err`` is another
    failure. Call it after the partial temp file is removed: the free space it reports is what the user has.

    Lack of space is an OSError ENOSPC/EDQUOT anywhere in the chain, or torch's ``inline_container``
    RuntimeError (its writer's failed write) while less than the bytes needed are free.

    Args:
        err: what the write raised.
        path: the file that was being written.
        needed: bytes the write needed, or a function giving them (asked only when ``err`` may be a lack of
            space); None (or None given) when unknown: then the size of ``path``'s previous version stands in,
            said to be an estimate.
        needed_is: where ``needed`` comes from, in words (``"its size"``, ``"its serialized size"``).
    """
    path = Path(path)
    code = _no_space_errno(err)
    if code is None and not (isinstance(err, RuntimeError) and "inline_container" in str(err)):
        return None
    size = needed() if callable(needed) else needed
    if size is None and path.is_file():
        size, needed_is = path.stat().st_size, "the size of its previous version, an estimate"
    try:
        free: int | None = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if code is None and (free is None or size is None or free >= size):
        return None  # torch's writer failed, but not for want of space
    need = f"it needs {_size(size)} ({needed_is})" if size is not None else "its size is unknown"
    room = "?" if free is None else _size(free)
    where = (f"the disk quota there is used up ({room} free on the filesystem)" if code == errno.EDQUOT
             else f"{room} free there")
    return DiskFullError(f"disk full: '{path}' could not be written: {need}, {where}; any earlier version of it is "
                         f"intact: free space there, or move output_dir to a disk with room; then continue the run "
                         f"with --resume", str(path), size, free)


def write_text_atomic(path: Path, text: str) -> None:
    """``path`` holds ``text`` or what it held before, never a part (temp file + rename).

    Raises:
        DiskFullError: one line when there is no space for it (the temp file removed).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", newline="") as f:  # newline="": the text as given (a CSV's \r\n stays)
            f.write(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        full = disk_full_error(err, path, len(text.encode()))
        if full is not None:
            raise full from err
        raise


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None  # JSON null: e.g. the accuracy of a class with no test images
    if isinstance(value, float) and math.isinf(value):
        return str(value)  # JSON has no inf: "inf" / "-inf" (alpha: inf means IID)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _jsonable(value.item())
    return value


def write_metrics_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """All rounds so far, one row each; columns are the union of the rows' keys in first-seen order."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, text.getvalue())


def read_metrics_csv(path: Path) -> list[dict[str, str]]:
    """The rows :func:`write_metrics_csv` wrote, one mapping per round (values as the CSV's strings)."""
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """``summary.json``: NaN is written as null (with a note when a class had no test images)."""
    per_class = summary.get("per_class_accuracy")
    if isinstance(per_class, (list, tuple)) and any(isinstance(a, float) and math.isnan(a) for a in per_class):
        summary = {**summary, "per_class_accuracy_note": "null: the class has no image in the test split"}
    write_text_atomic(path, json.dumps(_jsonable(summary), indent=2) + "\n")


# ----------------------------------------------------------------------------- the run's record


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": {}}`` → ``{"a.b": 1}`` (JSON-normalised leaves: inf → "inf"; lists stay
    leaves; an empty mapping holds no key)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = _jsonable(value)
    return out


def _resumable(key: str) -> bool:
    return any(key.startswith(k) if k.endswith(".") else key == k for k in RESUMABLE_KEYS)


def _same(a: Any, b: Any) -> bool:
    """Equal values; 1 and 1.0 are the same number, but True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def config_diff(recorded: dict[str, Any], current: dict[str, Any], *,
                include_resumable: bool = False) -> list[tuple[str, Any, Any]]:
    """The keys whose values differ, as ``(dotted key, recorded value, current value)``, in key order.

    Args:
        recorded, current: configs as nested mappings (``config_to_dict`` or the YAML as read).
        include_resumable: also list differences in :data:`RESUMABLE_KEYS` (never where the folder is, nor
            ``logging.*``: neither makes a run different).
    """
    a, b = flatten(recorded), flatten(current)
    diff = []
    for key in sorted(set(a) | set(b)):
        if key in ("output_dir", "run_name") or key.startswith("logging.") or not include_resumable and _resumable(key):
            continue
        old, new = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if not _same(old, new):
            diff.append((key, old, new))
    return diff


def format_diff(diff: Sequence[tuple[str, Any, Any]], *, limit: int = 4) -> str:
    """``"partition.alpha: 0.5 → 100.0, seed: 0 → 7"`` (at most ``limit`` keys, then how many more)."""
    def show(v: Any) -> str:
        return v if v == _ABSENT else repr(v)
    text = ", ".join(f"{k}: {show(old)} → {show(new)}" for k, old, new in diff[:limit])
    return text + (f" (and {len(diff) - limit} more)" if len(diff) > limit else "")


def fingerprint(config: dict[str, Any]) -> str:
    """SHA-256 of the config without the resumable keys: the identity of what ran."""
    kept = {k: v for k, v in flatten(config).items() if not _resumable(k)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """``run.json`` of a run folder, or None when there is none (a folder written before records)."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
            raise ValueError("no config in it")
    except (ValueError, UnicodeDecodeError) as err:
        raise RunFolderError(f"run folder error: '{path}' cannot be read ({err}); it records how the run "
                             f"started: restore it, or start the run afresh with --overwrite") from None
    return record


def write_record(run_dir: Path, config: dict[str, Any], *, resumed: bool, argv: Sequence[str] = ()) -> None:
    """Write (or, on resume, update) ``run.json``: the config as it now stands, its fingerprint, the run's id
    (``run_id``: drawn at a fresh start, kept on resume) and one entry per start (when, which process, the
    command line, fresh or resumed)."""
    run_dir = Path(run_dir)
    previous = read_record(run_dir) if resumed else None
    starts = list(previous.get("starts", [])) if previous else []
    starts.append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(), "host": socket.gethostname(),
                   "resume": resumed, "argv": list(argv)})
    # the run's identity across its starts (e.g. its W&B run id): new on a fresh start, kept on resume
    run_id = (previous or {}).get("run_id") or uuid.uuid4().hex[:16]
    record = {"fingerprint": fingerprint(config), "run_id": run_id, "config": _jsonable(config), "starts": starts}
    write_text_atomic(run_dir / RECORD, json.dumps(record, indent=2) + "\n")


def is_run_folder(run_dir: Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in _RUN_FILES)


def completed_rounds(run_dir: Path) -> int:
    """Rounds recorded in ``metrics.csv`` (written just before each round's checkpoint); 0 when none."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        return 0
    return len(read_metrics_csv(path))


def clear_run_folder(run_dir: Path) -> None:
    """Empty a run folder for ``--overwrite`` (its lock stays). Refuses a folder that is not a run's."""
    run_dir = Path(run_dir)
    if not is_run_folder(run_dir):
        raise RunFolderError(f"run folder error: '{run_dir}' holds files that are not a run's; --overwrite "
                             f"empties only run folders: choose another --run_name or --output_dir")
    for entry in run_dir.iterdir():
        if entry.name == LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


# ----------------------------------------------------------------------------- the lock


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
_SLURM_NOT_RUNNING = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "TIMEOUT", "SPECIAL_EXIT", "REVOKED", "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


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
        out = subprocess.run([exe, "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                             timeout=timeout_s)
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

    def __init__(self, run_dir: Path, *, heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S,
                 job_running: Callable[[str], bool | None] = slurm_job_running) -> None:
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
                    raise RunFolderError(f"run folder error: '{self.path.parent}' is in use by another run "
                                         f"({why}); {rule}; wait for it to finish, or choose another --run_name / "
                                         f"--output_dir") from None
                if self._remove_if_unchanged(raw) and why:
                    print(f"fl_lightning: warning: took over the stale lock '{self.path}' ({self._who(info)}): "
                          f"{why}", file=sys.stderr)
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
            self._beat = threading.Thread(target=self._heartbeat, args=(self._stop,), name="fl-lock-heartbeat",
                                          daemon=True)
            self._beat.start()
            return
        raise RunFolderError(f"run folder error: could not take the lock '{self.path}' (other runs keep "
                             f"taking it); try again")

    def _content(self) -> str:
        pid = os.getpid()
        job, restarts = _slurm_job()
        return json.dumps({"pid": pid, "start": _process_start(pid), "host": socket.gethostname(),
                           "since": self._since, "slurm_job_id": job, "slurm_restart_count": restarts,
                           "heartbeat": round(time.time(), 3), "token": self._token})

    def _read(self) -> tuple[bytes | None, dict[str, Any] | None]:
        """The lock file's bytes (None: gone) and its record (None: unreadable)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as err:
            raise RunFolderError(f"run folder error: the lock '{self.path}' cannot be read ({err.strerror or err}); "
                                 f"make it readable, or choose another --run_name / --output_dir") from None
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
                return False, f"lock file '{self.path}' is being written", (
                    f"it counts as stale if still unreadable {_UNREADABLE_LOCK_GRACE_S:.0f} s after it was written")
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
                return True, (f"SLURM requeued job {job} (restart {restarts}; the lock is of restart {theirs}): "
                              f"that earlier run is gone"), ""
        elif job is not None and self._job_running(job) is False:
            return True, f"its SLURM job {job} is no longer running (squeue)", ""
        beat = info.get("heartbeat")
        last = max(mtime, float(beat)) if isinstance(beat, (int, float)) else mtime
        age = max(time.time() - last, 0.0)
        if age > self.stale_after_s:
            return True, f"its heartbeat is {age:.0f} s old (stale after {self.stale_after_s:.0f} s)", ""
        heard = (f"last heartbeat {age:.0f} s ago" if isinstance(beat, (int, float))
                 else f"no heartbeat (an older version's lock), written {age:.0f} s ago")
        ended = " or its SLURM job has ended" if job is not None and job != mine else ""
        return False, f"pid {pid} on host {host}, SLURM job {job or 'none'}, since {since}, {heard}", (
            f"it counts as stale once its heartbeat is {self.stale_after_s:.0f} s old{ended}; if no run is active "
            f"there, delete '{self.path}'")

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
                    print(f"fl_lightning: warning: the lock '{self.path}' was taken over by another run (this "
                          f"run's heartbeat had stopped for over {self.stale_after_s:.0f} s): two runs may now "
                          f"write this folder", file=sys.stderr)
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


def check_shared_run_folder(fabric: Any, run_dir: Path, *, wait_s: float = _SHARED_CHECK_WAIT_S) -> None:
    """Check that every rank sees the run folder rank 0 writes to (one shared folder, not one per node).

    Rank 0 writes a token with a random nonce into ``run_dir`` (atomically) and broadcasts the nonce; each rank
    reads the token from its ``run_dir``, retrying for up to ``wait_s`` (NFS caches directory entries for a few
    seconds); all ranks gather who saw it. Every rank returns, or every rank raises the same error: no rank is
    left waiting. Rank 0 removes the token again. A single process returns at once.

    Args:
        fabric: the launched :class:`lightning.fabric.Fabric` (every rank calls this).
        run_dir: the run folder, as this rank names it.
        wait_s: how long a rank looks for the token before it counts as not seeing the folder.

    Raises:
        RunFolderError: on every rank, one line naming the ranks (and hosts) that cannot see the folder.
    """
    if fabric.world_size == 1:
        return
    import torch.distributed as dist

    from fl_lightning.federation.ddp_strategy import object_group

    run_dir, rank = Path(run_dir), fabric.global_rank
    token = run_dir / SHARED_CHECK
    sent: dict[str, Any] = {"nonce": None, "error": None, "path": str(run_dir), "host": socket.gethostname()}
    if rank == 0:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            nonce = uuid.uuid4().hex
            write_text_atomic(token, nonce + "\n")
            sent["nonce"] = nonce
        except (OSError, UsageError) as err:  # rank 0 cannot write: every rank stops with its reason
            sent["error"] = (f"run folder error: '{run_dir}' cannot be written on rank 0 (host {sent['host']}): "
                             f"{err}")
    sent = fabric.broadcast(sent, src=0)
    if sent["error"] is not None:
        raise RunFolderError(sent["error"])
    seen, why = _look_for_token(token, sent["nonce"], wait_s)
    mine = {"rank": rank, "host": socket.gethostname(), "path": str(run_dir), "seen": seen, "why": why}
    everyone: list[Any] = [None] * fabric.world_size
    dist.all_gather_object(everyone, mine, group=object_group(fabric))
    if rank == 0:
        token.unlink(missing_ok=True)
    blind = [e for e in everyone if not e["seen"]]
    if blind:
        raise RunFolderError(_blind_ranks_message(blind, sent))


def _look_for_token(token: Path, nonce: str, wait_s: float) -> tuple[bool, str]:
    """Whether ``token`` holds ``nonce`` within ``wait_s``; else why not, in words."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.listdir(token.parent)  # reads the directory afresh: NFS then notices the new entry sooner
            if token.read_text().strip() == nonce:
                return True, ""
            why = "it holds another run's token"
        except FileNotFoundError:
            why = "no such folder" if not token.parent.is_dir() else "the token is not there"
        except OSError as err:
            why = f"{type(err).__name__}: {err.strerror or err}"
        if time.monotonic() >= deadline:
            return False, why
        time.sleep(0.1)


def _blind_ranks_message(blind: list[dict[str, Any]], sent: dict[str, Any], limit: int = 4) -> str:
    by_host: dict[str, list[dict[str, Any]]] = {}
    for e in blind:
        by_host.setdefault(e["host"], []).append(e)
    parts = []
    for host, entries in list(by_host.items())[:limit]:
        ranks = ", ".join(str(e["rank"]) for e in entries)
        first = entries[0]
        named = "" if first["path"] == sent["path"] else f"; it looks in '{first['path']}'"
        parts.append(f"rank{'s' if len(entries) > 1 else ''} {ranks} on host {host} ({first['why']}{named})")
    more = f" and {len(by_host) - limit} more host(s)" if len(by_host) > limit else ""
    return (f"run folder error: {'; '.join(parts)}{more} cannot see the run folder '{sent['path']}' that rank 0 "
            f"(host {sent['host']}) writes to: every rank must share one run folder; put output_dir on a "
            f"filesystem every node shares (not a node-local disk such as /tmp or $TMPDIR)")
