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
* ``.lock``: one run at a time in a folder (federation/storage/run_lock.py); every rank must see the one folder
  (federation/storage/shared_folder.py).
* Every file is written whole or not at all (:mod:`fl_lightning.durable_write`); a write that fails for lack of
  space stops with one line (:class:`~fl_lightning.errors.DiskFullError`); the file it would have replaced is intact.
"""

from __future__ import annotations

import csv
import hashlib
import io
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

from fl_lightning.durable_write import write_text_atomic
from fl_lightning.errors import RunFolderError

__all__ = [
    "write_metrics_csv",
    "read_metrics_csv",
    "write_summary",
    "RECORD",
    "LOCK",
    "RESUMABLE_KEYS",
    "flatten",
    "fingerprint",
    "config_diff",
    "format_diff",
    "read_record",
    "write_record",
    "is_run_folder",
    "completed_rounds",
    "clear_run_folder",
]

RECORD = "run.json"
LOCK = ".lock"  # the run lock's file (federation/storage/run_lock.py), which --overwrite keeps
# Keys that may differ on --resume: they cannot change what already ran. The loop's results do not
# depend on the number of ranks (1-vs-2-rank equality is tested); the failure policy only decides
# whether the rounds still to come go on; output_dir/run_name are where the folder is; logging.* is
# where the numbers go; data.feature_cache only where frozen features are kept (bit-identical results either
# way, tested); data.cache_mb, data.cache_uint8_mb, data.pin_memory, data.persistent_workers and
# data.normalize_on_device (elementwise IEEE ops, on the CPU or the GPU) only how the same batches are made
# (tested; not data.num_workers: an augmentation draws from the workers' seeds) and
# federation.record_after_s only speed and what a crash costs, never a value; federation.collective_timeout_s,
# compute_timeout_s and liveness_timeout_s only how long a rank may wait, and federation.process_group_backend only
# which library carries the same collectives, and <method>.pretrain_check_every only how often the ranks of a
# pre-training confirm that none failed, <method>.round0_dir only where a content-keyed round 0 is shared. A key
# ending in "." is a whole section.
RESUMABLE_KEYS = (
    "federation.rounds",
    "federation.devices",
    "federation.num_nodes",
    "federation.strategy",
    "federation.on_client_error",
    "federation.min_clients",
    "output_dir",
    "run_name",
    "variants",
    "logging.",
    "data.feature_cache",
    "data.cache_mb",
    "data.cache_uint8_mb",
    "data.pin_memory",
    "data.persistent_workers",
    "data.normalize_on_device",
    "federation.record_after_s",
    "federation.collective_timeout_s",
    "federation.compute_timeout_s",
    "federation.liveness_timeout_s",
    "federation.process_group_backend",
    *(f"{method}.{key}" for method in ("fedisyn", "fgl", "gptfl") for key in ("pretrain_check_every", "round0_dir")),
)
# What a run writes; a folder holding any of these is a run folder (and --overwrite may empty it)
_RUN_FILES = (RECORD, "config.yaml", "summary.json", "metrics.csv", "checkpoints")
_ABSENT = "<absent>"


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


def config_diff(
    recorded: dict[str, Any], current: dict[str, Any], *, include_resumable: bool = False
) -> list[tuple[str, Any, Any]]:
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
        raise RunFolderError(
            f"run folder error: '{path}' cannot be read ({err}); it records how the run "
            f"started: restore it, or start the run afresh with --overwrite"
        ) from None
    return record


def write_record(run_dir: Path, config: dict[str, Any], *, resumed: bool, argv: Sequence[str] = ()) -> None:
    """Write (or, on resume, update) ``run.json``: the config as it now stands, its fingerprint, the run's id
    (``run_id``: drawn at a fresh start, kept on resume) and one entry per start (when, which process, the
    command line, fresh or resumed)."""
    run_dir = Path(run_dir)
    previous = read_record(run_dir) if resumed else None
    starts = list(previous.get("starts", [])) if previous else []
    starts.append(
        {
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "resume": resumed,
            "argv": list(argv),
        }
    )
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
        raise RunFolderError(
            f"run folder error: '{run_dir}' holds files that are not a run's; --overwrite "
            f"empties only run folders: choose another --run_name or --output_dir"
        )
    for entry in run_dir.iterdir():
        if entry.name == LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
