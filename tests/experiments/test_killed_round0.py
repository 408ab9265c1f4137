"""Work a run made before its first round was recorded is never thrown away: a FeDiSyn run killed after its images
were generated but before round 0's records reached disk is continued by the same command (its images reused, not
made again), to the uninterrupted run's numbers; a start that made nothing is still taken over quietly."""

from __future__ import annotations

import json
import shutil

import pytest

from fl_lightning.experiments.runner import _nothing_ran
from tests.conftest import CONF, run_cli

RUN = "fedisyn_tiny"


def _run(out):
    done = run_cli(
        "--config",
        str(CONF / "fedisyn_tiny.yaml"),
        "--output_dir",
        str(out),
        "--federation.rounds",
        "1",
        "--logging.progress",
        "false",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / RUN / "summary.json").read_text())


@pytest.mark.slow  # two tiny FeDiSyn runs, ~35 s
def test_the_same_command_continues_a_run_killed_after_generation(tmp_path):
    full = _run(tmp_path / "full")
    run = tmp_path / "full" / RUN
    # as a kill after generation and pre-training, before round 0's records reached disk leaves the folder
    for name in ("checkpoints", "metrics.csv", "summary.json", "partition.png"):
        shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    shutil.rmtree(tmp_path / "full" / "round0")  # nothing shared to fall back on: only the run's own images
    images = {p: p.stat().st_mtime_ns for p in (run / "synthetic").rglob("*.png")}
    assert images and not _nothing_ran(run)
    again = _run(tmp_path / "full")
    assert all(p.stat().st_mtime_ns == t for p, t in images.items())  # continued from them, not generated again
    record = json.loads((run / "run.json").read_text())
    assert [s["resume"] for s in record["starts"]] == [False, True]
    clocks = ("wall_time_s", "host_generation_s", "host_pretraining_s")
    assert {k: v for k, v in again.items() if k not in clocks} == {k: v for k, v in full.items() if k not in clocks}


@pytest.mark.parametrize(
    ("made", "ran"),
    [
        ({}, False),
        ({"checkpoints/round0000/plan.pt": b"x"}, True),
        ({"synthetic/0/00000.png": b"x"}, True),
        ({"pretrain/checkpoints/best-epoch=0.ckpt": b"x"}, True),
        ({"prompts.json": b"{}"}, True),
        ({"pilots/round0_inputs/client0.pt": b"x"}, True),
        ({"probe/0.png": b"x", "synthetic/.keep/": None}, False),
    ],
)
def test_what_counts_as_work_already_done(tmp_path, made, ran):
    for name, data in {"config.yaml": b"a: 1", "run.json": b"{}", "partition.csv": b"", **made}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is not None:
            path.write_bytes(data)
    assert _nothing_ran(tmp_path) is not ran
