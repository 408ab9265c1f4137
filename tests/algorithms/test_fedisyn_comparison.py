"""FeDiSyn against its four baselines from one tiny config, end to end, and the time/traffic-to-accuracy curves."""

import csv

import pytest

from fl_lightning.experiments.curves import Curve, first_reaching, main, read_curve, write_curves
from tests.conftest import CONF, run_cli

METHODS = ["fedisyn", "sflf", "caff", "gptfl", "fgl"]


def test_first_reaching_uses_the_best_accuracy_so_far():
    c = Curve("m", [0, 1, 2, 3], [10.0, 20.0, 30.0, 40.0], [0.1, 0.2, 0.3, 0.4], [0.5, 0.7, 0.6, 0.8])
    assert c.best == [0.5, 0.7, 0.7, 0.8]
    assert first_reaching(c, 0.7) == (20.0, 0.2) and first_reaching(c, 0.75) == (40.0, 0.4)
    assert first_reaching(c, 0.9) is None


def test_curves_command_line_rejects_a_folder_without_metrics(tmp_path, capsys):
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fl_lightning: ") and err.count("\n") == 1


@pytest.mark.slow  # five tiny runs in one CLI call: ~1-2 min on 2 idle cores
def test_tiny_comparison_runs_every_method_and_draws_the_curves(tmp_path):
    proc = run_cli(
        "--config",
        str(CONF / "fedisyn_compare_tiny.yaml"),
        "--output_dir",
        str(tmp_path),
        "--federation.rounds",
        "1",
        env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (tmp_path / "comparison.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["method"] for r in table] == METHODS
    curves = {m: read_curve(tmp_path / m) for m in METHODS}
    for m, c in curves.items():
        assert c.label == m and all(b >= a for a, b in zip(c.time_s, c.time_s[1:]))
        assert all(b >= a for a, b in zip(c.traffic_mb, c.traffic_mb[1:]))
    # synthesis methods have a round 0 (upload + generation + pre-training) before their one fine-tuning round
    assert [len(curves[m].rounds) for m in METHODS] == [2, 1, 1, 2, 2]
    # traffic: LoRA blocks (FeDiSyn) < whole models every round (GPT-FL, FGL)
    assert curves["fedisyn"].traffic_mb[-1] < curves["gptfl"].traffic_mb[-1]
    paths = write_curves([tmp_path / m for m in METHODS], tmp_path, targets=[0.0, 1.01])
    for path in paths.values():
        assert path.is_file() and path.stat().st_size > 0
    with paths["time_to_accuracy"].open(newline="") as f:
        rows = list(csv.DictReader(f))
    reached = {r["method"]: r for r in rows if float(r["target_accuracy"]) == 0.0}
    never = [r for r in rows if float(r["target_accuracy"]) == 1.01]
    assert all(float(reached[m]["simulated_time_s"]) == pytest.approx(curves[m].time_s[0]) for m in METHODS)
    assert all(r["simulated_time_s"] == "" for r in never)
