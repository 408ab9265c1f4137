"""Re-running is safe and cheap: the same command again, after a comparison was killed in one of its runs,
finishes it — the finished runs are not run again (their folders untouched), the killed run continues from
its checkpoint, and the table is that of a comparison that was never interrupted."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONF, REPO, run_cli

# 2 methods × 3 seeds = 6 runs; the 4th (FedOPAL, seed 0) trains long enough to be killed in its round
_VARIANTS = [{"algorithm": "afl", "label": "AFL"}, {"algorithm": "fedopal", "label": "FedOPAL", "train": {"epochs": 4}}]


def _config(tmp_path: Path) -> Path:
    cfg = yaml.safe_load((CONF / "fedopal_table2_tiny.yaml").read_text())
    cfg.update(variants=_VARIANTS, sweep={"seed": [0, 1, 2]})
    cfg["partition"]["alpha"] = 0.1
    # every finished client's record on disk at once (the default holds a short round's records in memory):
    # the kill below lands mid-round, after a record, and the resumed run re-runs only the clients without one
    cfg.setdefault("federation", {})["record_after_s"] = 0
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _table(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in csv.DictReader(f)]


def _mtimes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow  # ~50 s on 2 cores: a comparison run, SIGKILLed, and run again
def test_a_killed_comparison_finishes_when_the_same_command_is_run_again(tmp_path):
    config = _config(tmp_path)
    straight = run_cli("--config", str(config), "--output_dir", str(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stderr[-3000:]

    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "fl_lightning.train", "--config", str(config), "--output_dir", str(out)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    fourth = out / "fedopal_digits_a0.1_s0"
    deadline = time.monotonic() + 400
    while not list((fourth / "checkpoints").glob("round0000/client*.pt")):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the 4th run did not start in time"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    finished = [out / f"afl_digits_a0.1_s{seed}" for seed in range(3)]
    assert all((d / "summary.json").is_file() for d in finished) and not (fourth / "summary.json").exists()
    before = {d.name: _mtimes(d) for d in finished}

    again = run_cli("--config", str(config), "--output_dir", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "3 of 6 run(s) finished already" in again.stderr, again.stderr[-3000:]
    assert {d.name: _mtimes(d) for d in finished} == before  # not one file of a finished run was written
    assert _table(out / "comparison.csv") == _table(tmp_path / "straight" / "comparison.csv")
    for seed in range(3):  # every run's result is that of the uninterrupted comparison
        name = f"fedopal_digits_a0.1_s{seed}"
        a = json.loads((tmp_path / "straight" / name / "summary.json").read_text())
        b = json.loads((out / name / "summary.json").read_text())
        assert (a["accuracy"], a["bytes_up"], a["per_class_accuracy"]) == (
            b["accuracy"],
            b["bytes_up"],
            b["per_class_accuracy"],
        ), name
    starts = json.loads((fourth / "run.json").read_text())["starts"]
    assert [s["resume"] for s in starts] == [False, True]  # the killed run continued from its checkpoint
    assert not list(out.glob("*/.lock"))  # the killed process's locks were stale and taken over, then released

    # and once more: nothing left to run, the table rebuilt, exit 0
    third = run_cli("--config", str(config), "--output_dir", str(out))
    assert third.returncode == 0 and "6 of 6 run(s) finished already" in third.stderr, third.stderr[-3000:]
    assert _table(out / "comparison.csv") == _table(tmp_path / "straight" / "comparison.csv")
