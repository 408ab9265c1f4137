"""Federated evaluation on the clients' own test rows (partition.client_test_fraction): Flower's weighted mean."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.common import evaluate_on_test, evaluate_on_test_features
from fl_lightning.algorithms.fedavg_cnn import FedAvgCNN
from fl_lightning.config.loading import load_config
from fl_lightning.data.loader import LoaderSettings
from fl_lightning.data.partition import read_partition_json
from fl_lightning.errors import ConfigError
from fl_lightning.federation.algorithm import ALGORITHMS, Environment
from fl_lightning.federation.run_data import check_client_test
from fl_lightning.federation.simulation import Simulation
from fl_lightning.modules.federated_evaluation import federated_scores, row_outcomes
from tests.conftest import CONF


def _flower_weighted(results: list[tuple[int, float]]) -> float:
    """Flower's tutorials' ``weighted_average``: Σ n_k · m_k / Σ n_k over (n_k, m_k)."""
    return sum(n * m for n, m in results) / sum(n for n, _ in results)


def test_federated_scores_are_flowers_weighted_means_and_the_worst_clients():
    rng = np.random.default_rng(0)
    sizes = [3, 1, 7, 2, 5, 4, 6, 2, 3, 8, 1]  # 11 clients: the worst 10% is the 2 lowest
    hits, losses = rng.random(sum(sizes)) < 0.6, rng.random(sum(sizes)) * 3
    out = federated_scores(hits, losses, sizes)
    ends = np.cumsum(sizes)
    acc = [float(hits[e - n : e].mean()) for n, e in zip(sizes, ends)]
    loss = [float(losses[e - n : e].mean()) for n, e in zip(sizes, ends)]
    assert out["fed_test_acc"] == pytest.approx(_flower_weighted(list(zip(sizes, acc))), abs=1e-12)
    assert out["fed_test_acc"] == pytest.approx(hits.mean(), abs=1e-12)  # = the pooled accuracy
    assert out["fed_test_loss"] == pytest.approx(_flower_weighted(list(zip(sizes, loss))), abs=1e-12)
    assert out["fed_test_acc_min"] == min(acc)
    assert out["fed_test_acc_worst10"] == pytest.approx(np.mean(sorted(acc)[:2]), abs=1e-12)
    with pytest.raises(ValueError, match="do not split"):
        federated_scores(hits, losses, [1, 2])


def test_row_outcomes_are_each_rows_hit_and_cross_entropy():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 4, generator=g), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    w = torch.randn(4, 4, generator=g)
    hits, losses = row_outcomes(lambda v: v @ w, [(x[:6], y[:6]), (x[6:], y[6:])], device=torch.device("cpu"))
    logits = (x @ w).double()
    np.testing.assert_array_equal(hits, (logits.argmax(1) == y).numpy())
    # float32 logits: a loss near 0 is exact to ~1e-7 absolute, not relative (log-sum-exp cancels)
    reference = (torch.logsumexp(logits, 1) - logits[torch.arange(10), y]).numpy()
    np.testing.assert_allclose(losses, reference, rtol=1e-6, atol=1e-6)


def _env(client_test):
    cfg = load_config(str(CONF / "fedavg_digits_tiny.yaml"), ["--data.batch_size", "4"])
    g = torch.Generator().manual_seed(1)
    train_x, test_x = torch.randn(30, 3, generator=g), torch.randn(8, 3, generator=g)
    train_y, test_y = torch.randint(0, 3, (30,), generator=g), torch.randint(0, 3, (8,), generator=g)
    splits = SimpleNamespace(
        train=torch.utils.data.TensorDataset(train_x, train_y),
        test=torch.utils.data.TensorDataset(test_x, test_y),
        classes=["a", "b", "c"],
        train_targets=train_y.numpy(),
        test_targets=test_y.numpy(),
    )
    fabric = SimpleNamespace(device=torch.device("cpu"), world_size=1, autocast=torch.autocast("cpu", enabled=False))
    env = Environment(fabric, cfg, splits, [], Path("."), loading=LoaderSettings(0, False, False), client_test=client_test)
    return env, train_x, train_y


def test_the_shared_evaluations_add_the_clients_test_rows():
    client_test = [np.array([0, 4, 9]), np.array([12]), np.array([20, 21, 22, 29])]
    env, train_x, train_y = _env(client_test)
    w = torch.randn(3, 3, generator=torch.Generator().manual_seed(2))
    head = lambda v: v @ w  # noqa: E731
    acc = [float(((train_x[r] @ w).argmax(1) == train_y[r]).float().mean()) for r in client_test]
    expected = _flower_weighted([(len(r), a) for r, a in zip(client_test, acc)])
    by_features = evaluate_on_test_features(env, env.splits.test.tensors[0], head, train_x)
    by_images = evaluate_on_test(env, head, autocast=False)
    for out in (by_features, by_images):
        assert out["fed_test_acc"] == pytest.approx(expected, abs=1e-12) and out["fed_test_acc_min"] == min(acc)
    plain, _, _ = _env(None)
    assert "fed_test_acc" not in evaluate_on_test(plain, head, autocast=False)
    assert by_images["accuracy"] == evaluate_on_test(plain, head, autocast=False)["accuracy"]  # the test split's


def test_a_fedavg_run_logs_federated_evaluation_and_keeps_the_whole_partition(tmp_path):
    cfg = load_config(
        str(CONF / "fedavg_digits_tiny.yaml"),
        ["--output_dir", str(tmp_path), "--federation.rounds", "1", "--partition.client_test_fraction", "0.2"],
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()
    rows = list(csv.DictReader((cfg.run_dir / "metrics.csv").open()))
    acc, worst, low = (float(rows[-1][k]) for k in ("fed_test_acc", "fed_test_acc_worst10", "fed_test_acc_min"))
    assert 0 <= low <= worst <= acc <= 1 and summary["fed_test_acc"] == acc
    meta = json.loads((cfg.run_dir / "partition.json").read_text())
    assert meta["meta"]["client_test_fraction"] == 0.2
    whole = read_partition_json(cfg.run_dir / "partition.json", 1437)  # the digits' training rows, every one
    assert sum(len(p) for p in whole) == 1437


def test_methods_without_federated_evaluation_refuse_the_key_in_one_line():
    cfg = load_config(str(CONF / "coboosting_digits_tiny.yaml"), ["--partition.client_test_fraction", "0.2"])
    with pytest.raises(ConfigError, match="partition.client_test_fraction.*0 for coboosting"):
        Simulation(cfg=cfg, loggers=[])
    cfg = load_config(
        str(CONF / "fedavg_cnn_digits_tiny.yaml"), ["--partition.client_test_fraction", "0.2", "--fedavg_cnn.augment", "true"]
    )
    with pytest.raises(ConfigError, match="augments its training split"):
        check_client_test(cfg, FedAvgCNN(cfg=cfg))
    cfg = load_config(str(CONF / "dense_digits_tiny.yaml"), ["--partition.client_test_fraction", "0.2"])
    with pytest.raises(ConfigError, match="0 for dense"):  # a subclass of fedavg_cnn, not covered
        check_client_test(cfg, ALGORITHMS["dense"])
