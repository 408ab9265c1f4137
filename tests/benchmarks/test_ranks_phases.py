"""The ranks benchmark's phase times on one process and its per-phase model, without several processes."""

from __future__ import annotations

import csv
import json

import pytest

from benchmarks import ranks
from benchmarks.__main__ import main
from benchmarks.rank_model import estimate
from fl_lightning.config.loading import load_config
from fl_lightning.federation.simulation import Simulation
from tests.conftest import REPO

H100 = REPO / "benchmarks/data/fedisyn_food101_h100.json"


def _report(tmp_path, name, extra=()):
    config, overrides = ranks.METHODS[name]
    out = tmp_path / f"{name}_out"
    out.mkdir()
    args = ["--output_dir", str(tmp_path / name), "--logging.progress", "false", *overrides, *extra]
    ranks._worker(str(REPO / "conf" / config), args, out)
    return json.loads((out / "rank0.json").read_text(encoding="utf-8")), tmp_path / name


def test_recording_the_phases_changes_no_number(tmp_path, one_thread):
    """FedAvg (tiny) with the phase log installed and without: the same metrics, bit for bit."""
    report, run = _report(tmp_path, "fedavg")
    plain = load_config(
        REPO / "conf" / ranks.METHODS["fedavg"][0],
        ["--output_dir", str(tmp_path / "plain"), "--logging.progress", "false", *ranks.METHODS["fedavg"][1]],
    )
    Simulation(cfg=plain, loggers=[]).run()

    def numbers(path):  # every column but the wall clocks
        with path.open(encoding="utf-8") as f:
            return [{k: v for k, v in row.items() if "_s" not in k and k != "straggler_ratio"} for row in csv.DictReader(f)]

    assert numbers(next(run.iterdir()) / "metrics.csv") == numbers(plain.run_dir / "metrics.csv")
    assert {"clients", "aggregate", "evaluation"} <= set(report["phases"])
    assert len(report["items"]["clients"]) == 3 and sum(report["client_sizes"]) > 0  # 3 rounds of 8 clients
    assert (
        report["facts"]["evaluation batches"]
        == report["calls"]["evaluation"] * report["facts"]["evaluation batches"] / report["calls"]["evaluation"]
    )


def test_fedisyn_round0_phases_and_the_model_of_two_ranks(tmp_path, one_thread):
    """The tiny FeDiSyn's round 0 phases, their sizes, and the model's split of them over 2 ranks by hand."""
    report, run = _report(tmp_path, "fedisyn", ["--federation.rounds", "1"])
    images = len(list((run / "fedisyn_tiny" / "synthetic").rglob("*.png")))
    assert {"clients", "aggregate", "evaluation", "generation", "store", "pretraining"} <= set(report["phases"])
    facts = report["facts"]
    assert facts["generation batches"] == 9 and facts["store rows"] == images == 62  # batches of 8 by start timestep
    assert facts["pretraining steps"] == 2 * 2 and facts["pretraining gradient bytes"] > 0  # 2 epochs of 50 rows by 32
    phases = ranks.measured_phases(report, "fedisyn")
    one = {p.name: p.seconds for p in estimate(phases, 1).phases}
    assert one == pytest.approx(report["phases"])  # N = 1: the measured times
    two = {p.name: p for p in estimate(phases, 2).phases}
    assert two["generation"].seconds == pytest.approx(5 / 9 * report["phases"]["generation"])  # ⌈9/2⌉ of 9 batches
    assert two["store"].seconds == pytest.approx(report["phases"]["store"] / 2)  # 30 of 60 rows
    assert two["aggregate"].busy == (report["phases"]["aggregate"], 0.0)  # rank 0's plan


def test_model_from_prints_the_assumptions_and_every_source(capsys):
    results = ranks.model_from_file(H100)
    out = capsys.readouterr().out
    data = json.loads(H100.read_text(encoding="utf-8"))
    for entry in [*data["assumptions"].values(), *data["phases"]]:
        assert entry["source"] in out
    assert "N = 8" in out and "all-reduce bandwidth 150 GB/s" in out
    speedup = results["model_n8_speedup"]
    assert speedup["threshold"] == {"op": ">=", "value": 5.5} and 1.0 < speedup["value"] < 8.0
    assert results["model_n1_speedup"]["value"] == 1.0


def test_a_missing_model_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["ranks", "--model-from", str(tmp_path / "none.json")]) == 2
    assert main(["ranks", "--methods", "gptfl,nope"]) == 2  # one line naming it, before any run
    err = capsys.readouterr().err
    assert "--model-from" in err and "none.json" in err and "Traceback" not in err
