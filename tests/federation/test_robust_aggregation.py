"""federation.aggregator: each rule against an independent reference (numpy's median, scipy's trim_mean, Krum's
definition by brute force), its robustness on a known answer, and the engine path: mean is the method's own
aggregate bit for bit, the rules resist attackers the mean follows, clashes are one line.
Flower's own outputs: tests/federation/test_robust_aggregation_flower.py."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from scipy import stats

from fl_lightning.errors import UsageError
from fl_lightning.federation.policies.robust_aggregation import bulyan, coordinate_median, krum_scores, trimmed_mean
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.run_records import metrics_rows
from tests.tiny_runs import assert_parts_equal, comparison_runs, one_and_two_processes, tiny_config


def _rows(n: int = 9, d: int = 20, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("n", [1, 2, 7, 8])
def test_the_median_is_numpys(n):
    rows = _rows(n)
    np.testing.assert_allclose(coordinate_median(rows).numpy(), np.median(rows.numpy(), axis=0), rtol=1e-12)


@pytest.mark.parametrize("n, beta", [(8, 0.2), (11, 0.25), (10, 0.0), (5, 0.45)])
def test_the_trimmed_mean_is_scipys(n, beta):
    rows = _rows(n)
    np.testing.assert_allclose(trimmed_mean(rows, beta).numpy(), stats.trim_mean(rows.numpy(), beta, axis=0), rtol=1e-12)


def test_krum_scores_are_the_definition():
    rows, f = _rows(8), 2
    for i in range(8):
        others = sorted(float(((rows[i] - rows[j]) ** 2).sum()) for j in range(8) if j != i)
        assert float(krum_scores(rows, f)[i]) == pytest.approx(sum(others[: 8 - f - 2]), rel=1e-10)


def test_bulyan_and_the_rules_ignore_f_outliers_far_away():
    """f attackers at 1000 beside honest clients near 0: every robust rule stays near 0."""
    honest, f = _rows(9, 5) * 0.1, 2
    rows = torch.cat([honest, torch.full((f, 5), 1000.0, dtype=torch.float64)])
    for aggregate in (coordinate_median(rows), trimmed_mean(rows, 0.2), bulyan(rows, f)):
        assert float(aggregate.abs().max()) < 1.0
    assert int(krum_scores(rows, f).argmin()) < 9
    with pytest.raises(ValueError, match="n >= 4f"):
        bulyan(rows[:10], f)


def test_bulyan_is_invariant_to_the_order_of_the_clients():
    rows = _rows(11, 6)
    reference = bulyan(rows, 2)
    for perm in itertools.islice(itertools.permutations(range(11)), 0, 200, 37):
        torch.testing.assert_close(bulyan(rows[list(perm)], 2), reference)


def _cfg(tmp_path, *extra: str):
    return tiny_config(tmp_path, *extra, clients=7)


def _head(cfg) -> torch.Tensor:
    return safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]["head.weight"]


def test_under_a_scaling_attack_the_median_stays_near_the_clean_run_and_the_mean_does_not(tmp_path):
    attack = ("--federation.attack.kind", "scale", "--federation.attack.fraction", "0.3", "--federation.attack.scale", "50")
    runs = {
        "clean": _cfg(tmp_path / "clean"),
        "mean": _cfg(tmp_path / "mean", *attack),
        "median": _cfg(tmp_path / "median", *attack, "--federation.aggregator.name", "median"),
        "krum": _cfg(
            tmp_path / "krum", *attack, "--federation.aggregator.name", "krum", "--federation.aggregator.num_malicious", "2"
        ),
    }
    for cfg in runs.values():
        Simulation(cfg=cfg, loggers=[]).run()
    clean = _head(runs["clean"])
    gap = {name: float((_head(cfg) - clean).norm()) for name, cfg in runs.items() if name != "clean"}
    assert gap["median"] < gap["mean"] / 5 and gap["krum"] < gap["mean"] / 5, gap
    # which clients attacked (summary.json) and which one Krum kept each round (metrics.csv): never an attacker here
    attackers = set(json.loads((runs["krum"].run_dir / "summary.json").read_text())["attacker_clients"])
    kept = [row["kept_clients"] for row in metrics_rows(runs["krum"])]
    assert len(attackers) == 2 and kept and all(k.isdigit() and int(k) not in attackers for k in kept), (attackers, kept)
    assert "kept_clients" not in metrics_rows(runs["median"])[0]  # a rule that selects no client names none


def test_mean_is_the_methods_own_aggregate_bit_for_bit(tmp_path):
    plain, named = _cfg(tmp_path / "plain"), _cfg(tmp_path / "named", "--federation.aggregator.name", "mean")
    for cfg in (plain, named):
        Simulation(cfg=cfg, loggers=[]).run()
    assert torch.equal(_head(plain), _head(named))


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--federation.aggregator.name", "bulyan", "--federation.aggregator.num_malicious", "2"), "n >= 4f + 3 = 11"),
        (
            (
                "--federation.aggregator.name",
                "median",
                "--federation.privacy.mechanism",
                "dp_fedavg",
                "--federation.privacy.epsilon",
                "10",
                "--federation.privacy.delta",
                "0.1",
            ),
            "mean's sensitivity",
        ),
    ],
)
def test_clashing_settings_are_one_line(tmp_path, extra, words):
    with pytest.raises(UsageError) as err:
        Simulation(cfg=_cfg(tmp_path, *extra), loggers=[])
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("attack", ["gaussian", pytest.param("label_flip", marks=pytest.mark.slow)])
def test_krum_under_attackers_with_fedavgm_is_the_same_on_one_and_two_processes(tmp_path, attack):
    krum = ("--federation.aggregator.name", "multi_krum", "--federation.aggregator.num_malicious", "1")
    attackers = ("--federation.attack.kind", attack, "--federation.attack.fraction", "0.2")
    fedavgm = ("--federation.server_optimizer.name", "fedavgm", "--federation.server_optimizer.momentum", "0.5")
    one, two = one_and_two_processes(tmp_path, *krum, *attackers, *fedavgm, rounds=2, clients=6, samples=300)
    assert_parts_equal(one, two, ("state", "server_optimizer"))


def test_the_tiny_comparison_runs_and_the_attack_curve_reads_it(tmp_path, capsys):
    import importlib.util

    from tests.conftest import REPO

    comparison_runs(tmp_path, capsys, "robust_aggregation_tiny.yaml", rounds=1, samples=300)
    spec = importlib.util.spec_from_file_location("attack_curve", REPO / "scripts" / "attack_curve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.write_curve(tmp_path)
    assert {(r["label"], r["fraction"]) for r in rows} == {
        (label, f)
        for label in ("mean", "median", "trimmed mean (β=0.2)", "Krum (f=3)", "Multi-Krum (f=3)")
        for f in (0.0, 0.1, 0.3)
    }
    table = (tmp_path / "attack_curve.md").read_text().splitlines()
    assert table[0] == "| aggregator | 0 % attackers | 10 % attackers | 30 % attackers |" and len(table) == 7
    assert (tmp_path / "attack_curve.png").stat().st_size > 1000
