"""The run folder's record, fingerprint and lock (fl_lightning/federation/storage/run_folder.py), in process.

The lock is also tested across processes: a second process holding it makes the acquire fail with
one line naming its PID; once that process is gone, the lock is stale and taken over.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from fl_lightning.errors import RunFolderError
from fl_lightning.federation.storage.run_folder import (
    LOCK,
    clear_run_folder,
    completed_rounds,
    config_diff,
    fingerprint,
    flatten,
    format_diff,
    read_record,
    write_metrics_csv,
    write_record,
    write_summary,
)
from fl_lightning.federation.storage.run_lock import RunLock
from tests.conftest import REPO

CONFIG = {
    "algorithm": "fedavg",
    "seed": 0,
    "output_dir": "runs",
    "run_name": None,
    "variants": [],
    "partition": {"alpha": 0.5, "balance": False},
    "federation": {"rounds": 2, "devices": 1},
    "train": {"lr": 0.1},
    "logging": {"progress": True},
    "model": {"overrides": {}},
    "fedavg": {},
}


def _with(config: dict, dotted: str, value: object) -> dict:
    out = json.loads(json.dumps(config))
    *path, last = dotted.split(".")
    node = out
    for part in path:
        node = node[part]
    node[last] = value
    return out


def test_summary_writes_nan_as_null_with_a_note(tmp_path):
    write_summary(tmp_path / "summary.json", {"accuracy": 0.5, "alpha": math.inf, "per_class_accuracy": [1.0, math.nan]})
    text = (tmp_path / "summary.json").read_text()
    assert "NaN" not in text and "nan" not in text
    summary = json.loads(text)  # strict JSON
    assert summary["per_class_accuracy"] == [1.0, None] and summary["alpha"] == "inf"
    assert "no image in the test split" in summary["per_class_accuracy_note"]
    write_summary(tmp_path / "plain.json", {"per_class_accuracy": [1.0, 0.0]})
    assert "per_class_accuracy_note" not in json.loads((tmp_path / "plain.json").read_text())


def test_flatten_and_diff_name_dotted_keys_with_both_values():
    assert flatten({"a": {"b": 1, "c": {}}, "d": [1, 2]}) == {"a.b": 1, "d": [1, 2]}
    other = _with(_with(CONFIG, "partition.alpha", 100.0), "seed", 7)
    assert config_diff(CONFIG, other) == [("partition.alpha", 0.5, 100.0), ("seed", 0, 7)]
    assert format_diff(config_diff(CONFIG, other)) == "partition.alpha: 0.5 → 100.0, seed: 0 → 7"
    # an int for a float is the same value; a bool is not a number; a removed key is named
    assert config_diff(CONFIG, _with(CONFIG, "train.lr", 0.1)) == []
    assert config_diff(CONFIG, _with(CONFIG, "seed", 0.0)) == []
    assert config_diff(CONFIG, _with(CONFIG, "partition.balance", 0)) == [("partition.balance", False, 0)]
    dropped = json.loads(json.dumps(CONFIG))
    del dropped["train"]["lr"]
    assert format_diff(config_diff(CONFIG, dropped)) == "train.lr: 0.1 → <absent>"
    nested = _with(CONFIG, "model.overrides", {"vision_cfg": {"width": 64}})
    assert config_diff(CONFIG, nested) == [("model.overrides.vision_cfg.width", "<absent>", 64)]


@pytest.mark.parametrize(
    "key, value",
    [
        ("federation.rounds", 5),
        ("federation.devices", 2),
        ("logging.progress", False),
        ("output_dir", "elsewhere"),
        ("run_name", "moved"),
    ],
)
def test_resumable_keys_keep_the_fingerprint(key, value):
    changed = _with(CONFIG, key, value)
    assert fingerprint(changed) == fingerprint(CONFIG)
    assert config_diff(CONFIG, changed) == []


@pytest.mark.parametrize(
    "key, value",
    [("partition.alpha", 100.0), ("seed", 7), ("algorithm", "fedopal"), ("train.lr", 0.5), ("model.overrides", {"embed_dim": 8})],
)
def test_other_keys_change_the_fingerprint(key, value):
    assert fingerprint(_with(CONFIG, key, value)) != fingerprint(CONFIG)


def test_fresh_start_diff_lists_rounds_but_never_the_folder_or_logging():
    other = _with(_with(_with(CONFIG, "federation.rounds", 5), "logging.progress", False), "output_dir", "x")
    assert config_diff(CONFIG, other, include_resumable=True) == [("federation.rounds", 2, 5)]


def test_record_round_trip_and_starts(tmp_path):
    assert read_record(tmp_path) is None
    write_record(tmp_path, {**CONFIG, "partition": {"alpha": math.inf}}, resumed=False, argv=["--config", "x"])
    write_record(tmp_path, CONFIG, resumed=True)
    record = read_record(tmp_path)
    assert record["fingerprint"] == fingerprint(CONFIG) and record["config"] == CONFIG
    assert [s["resume"] for s in record["starts"]] == [False, True] and record["starts"][0]["argv"] == ["--config", "x"]
    json.loads((tmp_path / "run.json").read_text())  # strict JSON (inf is written as "inf")
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(RunFolderError, match="run.json' cannot be read"):
        read_record(tmp_path)


def test_completed_rounds_and_clear(tmp_path):
    assert completed_rounds(tmp_path) == 0
    write_metrics_csv(tmp_path / "metrics.csv", [{"round": 0}, {"round": 1}])
    assert completed_rounds(tmp_path) == 2
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "server.pt").write_bytes(b"x")
    (tmp_path / LOCK).write_text("{}")
    clear_run_folder(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [LOCK]  # the lock stays with its holder
    other = tmp_path / "not_a_run"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    with pytest.raises(RunFolderError, match="not a run's"):
        clear_run_folder(other)
    assert (other / "thesis.tex").exists()


# ----------------------------------------------------------------------------- the lock


def _lock_info(path):
    return json.loads((path / LOCK).read_text())


def test_lock_records_the_holder_and_is_released(tmp_path):
    run = tmp_path / "new" / "run"
    with RunLock(run):
        info = _lock_info(run)
        assert info["pid"] == os.getpid() and info["start"] is not None
        with pytest.raises(RunFolderError, match=f"in use by another run \\(pid {os.getpid()}"):
            RunLock(run).acquire()
    assert not run.exists()  # it made the folder and nothing else was written: removed again
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("x")
    with RunLock(run):
        pass
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]


def test_stale_locks_are_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cases = {
        "dead-pid": {"pid": dead.pid, "start": None, "host": os.uname().nodename, "since": "then"},
        "reused-pid": {"pid": os.getpid(), "start": "1", "host": os.uname().nodename, "since": "then"},
    }
    for name, info in cases.items():
        run = tmp_path / name
        run.mkdir()
        (run / LOCK).write_text(json.dumps(info))
        with RunLock(run):
            assert _lock_info(run)["pid"] == os.getpid(), name
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / LOCK).write_text("")
    with pytest.raises(RunFolderError, match="being written"):  # its creator may be writing it right now
        RunLock(garbage).acquire()
    old = time.time() - 60
    os.utime(garbage / LOCK, (old, old))
    with RunLock(garbage):
        pass


def test_lock_of_another_host_says_how_to_clear_it(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": 1, "start": None, "host": "elsewhere", "since": "then"}))
    with pytest.raises(RunFolderError, match="on host elsewhere.*delete"):
        RunLock(tmp_path).acquire()


def test_lock_across_two_processes(tmp_path):
    """A second process holds the lock: acquiring fails naming it; after it is killed, the lock is stale."""
    code = (
        "import sys, time; from pathlib import Path; from fl_lightning.federation.storage.run_lock import RunLock\n"
        "lock = RunLock(Path(sys.argv[1])); lock.acquire(); print('locked', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderError, match=f"in use by another run \\(pid {holder.pid},"):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()  # SIGKILL: the lock file stays behind with a dead PID
        holder.wait()
    assert _lock_info(tmp_path)["pid"] == holder.pid
    with RunLock(tmp_path):
        assert _lock_info(tmp_path)["pid"] == os.getpid()
