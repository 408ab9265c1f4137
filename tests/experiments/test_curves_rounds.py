"""Accuracy per round for every method, not only those with a simulated clock: ``python -m fl_lightning.curves`` on
FedAvg-style runs writes the round curve and leaves out the clock's (tests/algorithms/test_fedisyn_comparison.py
covers the clock's)."""

from __future__ import annotations

import csv

from fl_lightning.experiments.curves import main, read_curve, write_curves
from fl_lightning.federation.simulation import Simulation
from tests.run_records import metrics_rows
from tests.tiny_runs import tiny_config


def test_runs_without_a_clock_get_their_accuracy_per_round(tmp_path, capsys):
    runs = []
    for name, extra in (("plain", ()), ("momentum", ("--federation.server_optimizer.name", "fedavgm"))):
        cfg = tiny_config(tmp_path / name, *extra, rounds=3)
        Simulation(cfg=cfg, loggers=[]).run()
        runs.append(cfg.run_dir)
    curve = read_curve(runs[0])
    assert curve.time_s is None and curve.rounds == [0, 1, 2]
    assert curve.accuracy == [float(r["accuracy"]) for r in metrics_rows(runs[0])]
    paths = write_curves(runs, tmp_path / "out", targets=[0.0])
    assert set(paths) == {"curves", "time_to_accuracy", "rounds_plot"} and paths["rounds_plot"].stat().st_size > 1000
    with paths["curves"].open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and {r["simulated_time_s"] for r in rows} == {""}
    with paths["time_to_accuracy"].open(newline="") as f:
        assert [r["round"] for r in csv.DictReader(f)] == ["0", "0"]  # target 0: reached in the first round
    assert main([str(runs[1]), "--out", str(tmp_path / "cli")]) == 0
    assert "rounds_plot:" in capsys.readouterr().out and (tmp_path / "cli" / "curves_rounds.png").is_file()
