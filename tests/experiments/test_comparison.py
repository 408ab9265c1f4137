"""A comparison from one command: methods × α × seeds → comparison.csv / .md / .png beside the runs."""

import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest

from fl_lightning import train
from fl_lightning.experiments.comparison import comparison_rows
from tests.conftest import CONF


def _run(label, alpha, acc):
    cfg = SimpleNamespace(label=label, algorithm=label.lower(), partition=SimpleNamespace(alpha=alpha))
    return cfg, {"accuracy": acc, "bytes_up_per_client": 10.0, "wall_time_s": 1.0}


def test_rows_are_mean_and_sample_std_over_seeds_per_method_and_alpha():
    accs = [0.5, 0.7, 0.65]
    rows = comparison_rows([*(_run("A", 0.1, a) for a in accs), _run("A", math.inf, 0.9), _run("B", 0.1, 0.2)])
    assert [(r["method"], r["alpha"], r["runs"]) for r in rows] == [("A", 0.1, 3), ("A", math.inf, 1), ("B", 0.1, 1)]
    assert rows[0]["accuracy_mean"] == pytest.approx(np.mean(accs))
    assert rows[0]["accuracy_std"] == pytest.approx(np.std(accs, ddof=1))  # the sample std, not the population's
    assert rows[0]["accuracy_std"] != pytest.approx(np.std(accs))
    assert rows[1]["accuracy_std"] is None and rows[2]["accuracy_std"] is None  # one run: no spread


def test_a_single_run_cell_has_no_plus_minus_and_every_cell_its_count(tmp_path):
    from fl_lightning.experiments.comparison import write_comparison

    results = [_run("A", 0.1, 0.5), _run("A", 0.1, 0.7), _run("A", 1.0, 0.9), _run("B", 0.1, 0.25)]
    for cfg, _ in results:
        cfg.run_dir = tmp_path / "none"
    write_comparison(results, tmp_path)
    table = (tmp_path / "comparison.md").read_text()
    assert f"| A | 60.00 ± {100 * np.std([0.5, 0.7], ddof=1):.2f} (n=2) | 90.00 (n=1) |" in table, table
    assert "| B | 25.00 (n=1) | — |" in table, table
    assert "± 0.00" not in table and "sample std" in table
    with (tmp_path / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["alpha"], r["runs"], r["accuracy_std"] == "") for r in rows] == [
        ("A", "0.1", "2", False),
        ("A", "1.0", "1", True),
        ("B", "0.1", "1", True),
    ]


def test_the_tiny_table_from_one_command(tmp_path, capsys):
    """The shipped tiny comparison, cut to its two training-free methods: AFL and FedCGS are exact
    (federated = centralized), so their mean and spread over the seeds are the same at every α."""
    variants = "[{algorithm: afl, label: AFL}, {algorithm: fedcgs, label: FedCGS, fedcgs: {shrinkage: 1.0e-6}}]"
    rc = train.main(["--config", str(CONF / "fedopal_table2_tiny.yaml"), "--variants", variants, "--output_dir", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    with (tmp_path / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["alpha"], r["runs"]) for r in rows] == [
        ("AFL", "0.1", "2"),
        ("AFL", "inf", "2"),
        ("FedCGS", "0.1", "2"),
        ("FedCGS", "inf", "2"),
    ]
    for method in ("AFL", "FedCGS"):
        cells = {(r["accuracy_mean"], r["accuracy_std"]) for r in rows if r["method"] == method}
        assert len(cells) == 1, cells
    table = (tmp_path / "comparison.md").read_text()
    assert "| method | α = 0.1 | α = IID | bytes up / client, all rounds |" in table and "| FedCGS |" in table
    assert (tmp_path / "comparison.png").stat().st_size > 1000
    runs = [p for p in tmp_path.iterdir() if p.is_dir() and p.name != "feature_cache"]
    assert len(runs) == 8  # 2 methods × 2 α × 2 seeds, one folder each
    # the 8 runs share their backbone's features: one table per split (train, test) and data seed
    assert len(list((tmp_path / "feature_cache").glob("*.pt"))) == 4


def test_a_share_of_several_runs_on_several_devices_is_refused_and_names_the_shard_to_use(tmp_path, capsys):
    """One process group runs one run: with federation.devices > 1 the line says which --shard makes each share one."""
    variants = "[{algorithm: afl, label: AFL}, {algorithm: fedcgs, label: FedCGS}]"
    args = ["--config", str(CONF / "fedopal_table2_tiny.yaml"), "--variants", variants, "--output_dir", str(tmp_path)]
    rc = train.main([*args, "--federation.devices", "2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "a single run when federation.devices > 1" in err and "--shard I/8" in err and "\n" not in err
