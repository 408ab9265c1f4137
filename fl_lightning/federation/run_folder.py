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
* ``.lock`` holds the PID, process start time and host of the run that uses the folder. A second
  run into the same folder stops with one line; a lock whose process is gone (killed, the machine
  restarted, the PID reused) is stale and taken over.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.errors import RunFolderError

__all__ = [
    "write_metrics_csv", "read_metrics_csv", "write_summary", "write_text_atomic",
    "RECORD", "LOCK", "RESUMABLE_KEYS", "RunLock", "flatten", "fingerprint", "config_diff", "format_diff",
    "read_record", "write_record", "is_run_folder", "completed_rounds", "clear_run_folder",
]

RECORD = "run.json"
LOCK = ".lock"
# Keys that may differ on --resume: they cannot change what already ran. The loop's results do not
# depend on the number of ranks (1-vs-2-rank equality is tested); the failure policy only decides
# whether the rounds still to come go on; output_dir/run_name are where the folder is; logging.* is
# where the numbers go; data.feature_cache only where frozen features are kept (bit-identical results either
# way, tested); data.cache_mb and federation.record_after_s change only speed and what a crash costs, never a
# value. A key ending in "." is a whole section.
RESUMABLE_KEYS = ("federation.rounds", "federation.devices", "federation.num_nodes", "federation.strategy",
                  "federation.on_client_error", "federation.min_clients", "output_dir", "run_name", "variants",
                  "logging.", "data.feature_cache", "data.cache_mb", "federation.record_after_s")
# What a run writes; a folder holding any of these is a run folder (and --overwrite may empty it)
_RUN_FILES = (RECORD, "config.yaml", "summary.json", "metrics.csv", "checkpoints")
_ABSENT = "<absent>"
_UNREADABLE_LOCK_GRACE_S = 10.0  # a lock file still being written by its creator is not stale


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


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


class RunLock:
    """``<run_dir>/.lock``: one run at a time in a folder.

    The file is created with ``O_EXCL`` and holds ``{"pid", "start", "host", "since"}``. A lock is stale
    when its process is gone on this host (or the PID now belongs to a process started later); a stale
    lock is taken over. A lock of another host cannot be checked: the message says how to clear it.

    Example:
        >>> with RunLock(Path("runs/fedavg_digits_a0.5_s0")):  # doctest: +SKIP
        ...     ...  # run
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK
        self.held = False
        self._made_folder = False  # remove the folder again on release if nothing else was written

    def acquire(self) -> None:
        """Take the lock (creating the run folder), or raise :class:`RunFolderError` naming the holder."""
        self._made_folder = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._live_holder()
                if holder is not None:
                    raise RunFolderError(f"run folder error: '{self.path.parent}' is in use by another run "
                                         f"({holder}); wait for it to finish, or choose another --run_name / "
                                         f"--output_dir") from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                pid = os.getpid()
                json.dump({"pid": pid, "start": _process_start(pid), "host": socket.gethostname(),
                           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
            self.held = True
            return
        raise RunFolderError(f"run folder error: could not take the lock '{self.path}' (other runs keep "
                             f"taking it); try again")

    def _live_holder(self) -> str | None:
        """Who holds the lock, in words; None when the lock is stale."""
        try:
            info = json.loads(self.path.read_text())
            pid, host = int(info["pid"]), str(info["host"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError):
            try:  # being written by its creator just now, or garbage left behind
                young = time.time() - self.path.stat().st_mtime < _UNREADABLE_LOCK_GRACE_S
            except FileNotFoundError:
                return None
            return f"lock file '{self.path}' is being written" if young else None
        since = info.get("since", "?")
        if host != socket.gethostname():
            return (f"pid {pid} on host {host}, since {since}; if no run is active there, delete "
                    f"'{self.path}'")
        if not _alive(pid):
            return None
        start = _process_start(pid)
        if info.get("start") is not None and start is not None and start != info["start"]:
            return None  # the PID was reused by a later process
        return f"pid {pid}, since {since}"

    def release(self) -> None:
        if not self.held:
            return
        try:
            info = json.loads(self.path.read_text())
            if int(info["pid"]) == os.getpid():
                self.path.unlink()
            if self._made_folder and not any(self.path.parent.iterdir()):
                self.path.parent.rmdir()
        except (OSError, ValueError, KeyError, TypeError):
            pass
        self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
