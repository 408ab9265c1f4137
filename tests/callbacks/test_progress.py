"""Progress a user can plan by: totals and an ETA; plain lines when stdout is not a terminal; silent when off."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest

from fl_lightning.callbacks.progress import ProgressCallback, eta_s, format_duration
from tests.conftest import run_cli
from tests.tiny_runs import TINY, tiny_overrides


@pytest.mark.parametrize(
    "elapsed, done, total, expected",
    [(10.0, 0, 5, None), (10.0, 1, 5, 40.0), (10.0, 2, 5, 15.0), (9.0, 3, 3, 0.0), (1.0, 4, 3, 0.0)],
)
def test_eta_is_the_mean_step_time_times_the_steps_left(elapsed, done, total, expected):
    assert eta_s(elapsed, done, total) == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("seconds, text", [(None, "?"), (4.4, "4 s"), (185, "3 min 05 s"), (7620, "2 h 07 min")])
def test_durations_read_as_a_person_writes_them(seconds, text):
    assert format_duration(seconds) == text


def _drive(callback, rounds=3, first=0):
    env = SimpleNamespace(fabric=SimpleNamespace(global_rank=0))
    callback.on_run_start(cfg=SimpleNamespace(resolved_run_name="afl_x"), env=env, rounds=rounds, completed_rounds=first)
    for r in range(first, rounds):
        callback.on_round_start(round_idx=r, clients=[0, 1], local_clients=2)
        callback.on_client_end()
        callback.on_client_end()
        callback.on_round_end(round_idx=r, metrics={"accuracy": 0.5 + r / 10})
    callback.on_run_end(summary={"accuracy": 0.7})


def test_plain_lines_when_stdout_is_not_a_terminal():
    stream = io.StringIO()
    _drive(ProgressCallback(stream=stream), rounds=3, first=1)  # a resumed run: rounds 2 and 3 left
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert re.fullmatch(r"afl_x: round 2/3, accuracy 0\.6000, round \d+\.\d s, ETA \d+ s", lines[0]), lines[0]
    assert lines[1].startswith("afl_x: round 3/3, accuracy 0.7000") and lines[1].endswith("ETA 0 s")
    assert re.fullmatch(r"afl_x: finished, accuracy 0\.7000, \d+\.\d s", lines[2]), lines[2]


def test_progress_false_is_silent():
    stream = io.StringIO()
    _drive(ProgressCallback(enabled=False, stream=stream))
    assert stream.getvalue() == ""


def test_a_comparison_in_a_log_file_says_where_it_is(tmp_path):
    """The CLI with stdout a pipe (as under SLURM or nohup): a line per run of the comparison, per round, per
    finished run."""
    out = run_cli("--config", str(TINY), *tiny_overrides(tmp_path, "--sweep", "{seed: [0, 1]}", clients=3, progress=True))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if "round" in line or "run " in line or "finished" in line]
    assert lines[0].startswith("fl_lightning: run 1/2 (0 of 2 done): fedavg_digits_a0.5_s0, ETA of the rest ?")
    assert any(line.startswith("fedavg_digits_a0.5_s0: round 2/2, accuracy ") for line in lines), lines
    assert any(
        line.startswith("fl_lightning: run 2/2 (1 of 2 done): fedavg_digits_a0.5_s1, ETA of the rest ") for line in lines
    ), lines
    assert sum(": finished, accuracy " in line for line in lines) == 2, lines
