"""AFL through the engine: one round of sufficient statistics solves to the centralized ridge regression on the
same features, exactly (float64), for any number of clients, partition and backbone; its regularisation
conventions are AFL's and FedOPAL's."""

import numpy as np
import pytest
import torch
from lightning.fabric import seed_everything

from fl_lightning.algorithms.common import frozen_backbone
from fl_lightning.config.loading import load_config
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.federation.algorithm import InputSpec
from fl_lightning.federation.run_data import partition_for
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.algorithms.client_test_helpers import check_scores, clients_rows, features, read_splits
from tests.algorithms.test_fedopal import _centralized_features, _cfg, _ridge


def _W(cfg):
    return safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]["W"].numpy()


@pytest.mark.parametrize("clients, alpha", [(1, "0.1"), (4, "0.1"), (7, "inf"), (5, "0.01")])
def test_afl_equals_centralized_ridge(tmp_path, clients, alpha):
    cfg = _cfg(
        tmp_path, "--algorithm", "afl", "--partition.num_clients", str(clients), "--partition.alpha", alpha, "--afl.lam", "0.1"
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()
    W = _W(cfg)
    h, y = _centralized_features(cfg)
    np.testing.assert_allclose(W, _ridge(h, y, 0.1), rtol=1e-8, atol=1e-10)
    d, c = h.shape[1], y.shape[1]
    assert summary["bytes_up"] == clients * (d * (d + 1) // 2 * 8 + d * c * 8 + 8)  # R upper, C, N


def test_per_client_regularization_convention(tmp_path):
    cfg = _cfg(tmp_path, "--algorithm", "afl", "--afl.lam", "0.5", "--afl.regularization", "per_client")
    Simulation(cfg=cfg, loggers=[]).run()
    W = _W(cfg)
    h, y = _centralized_features(cfg)
    np.testing.assert_allclose(W, _ridge(h, y, 4 * 0.5), rtol=1e-8)  # K·γ·I, as AFL's code


def test_afl_on_a_frozen_cnn_equals_centralized_ridge(tmp_path):
    """model.name: resnet18 (a tiny random timm ResNet): the pooled pre-logit features of the frozen CNN,
    summed over 3 clients, solve to the centralized ridge on the same features (float64)."""
    conf = tmp_path / "afl_cnn.yaml"
    conf.write_text(
        "algorithm: afl\ndata: {name: digits, image_size: 32, batch_size: 64}\n"
        "partition: {num_clients: 3, alpha: 0.1}\nafl: {lam: 0.1}\nlogging: {progress: false}\n"
        "model: {library: timm, name: resnet18, pretrained: null,\n"
        "        overrides: {layers: [1, 1, 1, 1], channels: [8, 16, 32, 64]}}\n"
    )
    cfg = load_config(conf, ["--output_dir", str(tmp_path)])
    summary = Simulation(cfg=cfg, loggers=[]).run()
    W = _W(cfg)
    seed_everything(cfg.seed, verbose=False)
    backbone = frozen_backbone(cfg)
    assert type(backbone).__name__ == "CNNBackbone" and summary["feature_dim"] == 64
    spec = InputSpec.of_backbone(backbone, cfg.data.image_size)
    t = build_transform(normalization=spec.normalization, image_size=spec.image_size, train=False, mean=spec.mean, std=spec.std)
    splits = build_dataset(cfg.data.name, root=cfg.data.root, train_transform=t, test_transform=t, seed=cfg.seed)
    hs, ys = [], []
    for part in partition_for(cfg, splits.train_targets):
        for start in range(0, len(part), cfg.data.batch_size):
            idx = part[start : start + cfg.data.batch_size]
            with torch.inference_mode():
                hs.append(backbone(torch.stack([splits.train[int(i)][0] for i in idx])).double().numpy())
            ys.append(np.eye(len(splits.classes))[splits.train_targets[idx]])
    h, y = np.concatenate(hs), np.concatenate(ys)
    reference = _ridge(h, y, 0.1)  # float64 both; Cholesky vs LU differ in the last digits of small entries
    np.testing.assert_allclose(W, reference, rtol=1e-6, atol=1e-8 * np.abs(reference).max())


def test_removed_regularization_is_the_least_squares_solution(tmp_path):
    """``remove_regularization``: the clients' γI is taken back out, so W fits the centralized least squares
    (the fitted values h W agree with numpy's lstsq in float64)."""
    cfg = _cfg(
        tmp_path,
        "--algorithm",
        "afl",
        "--afl.lam",
        "0.5",
        "--afl.regularization",
        "per_client",
        "--afl.remove_regularization",
        "true",
    )
    Simulation(cfg=cfg, loggers=[]).run()
    h, y = _centralized_features(cfg)
    reference, *_ = np.linalg.lstsq(h, y, rcond=None)
    np.testing.assert_allclose(h @ _W(cfg), h @ reference, rtol=1e-6, atol=1e-8)


def test_the_number_of_clients_does_not_change_w(tmp_path):
    """The statistics are sums: 2 or 6 clients, Dirichlet 0.1 or IID, solve to the same W."""
    ws = []
    for clients, alpha in ((2, "0.1"), (6, "inf")):
        cfg = _cfg(
            tmp_path / f"k{clients}",
            "--algorithm",
            "afl",
            "--partition.num_clients",
            str(clients),
            "--partition.alpha",
            alpha,
            "--afl.lam",
            "0.1",
        )
        Simulation(cfg=cfg, loggers=[]).run()
        ws.append(_W(cfg))
    np.testing.assert_allclose(ws[0], ws[1], rtol=1e-7, atol=1e-10)  # float64 sums in another order


def test_afl_evaluates_the_clients_test_rows_with_w_solved_without_them(tmp_path):
    """partition.client_test_fraction 0.25: W* is the ridge solution on the clients' training rows alone (their
    test rows are in no R_k, C_k), and fed_test_acc & co. are W*'s on the test rows, weighted as Flower's server."""
    cfg = _cfg(tmp_path, "--algorithm", "afl", "--afl.lam", "0.1", "--partition.client_test_fraction", "0.25")
    summary = Simulation(cfg=cfg, loggers=[]).run()
    W = torch.as_tensor(_W(cfg))
    model, splits = read_splits(cfg)
    targets = np.asarray(splits.train_targets)
    h = features(model, splits.train, np.arange(len(targets)), cfg.data.batch_size)  # the run's table, its batches
    fit, held = clients_rows(cfg, targets)
    rows, train = np.concatenate(held), np.concatenate(fit)
    y = np.eye(len(splits.classes))[targets]
    np.testing.assert_allclose(W.numpy(), _ridge(h[train].double().numpy(), y[train], 0.1), rtol=1e-8, atol=1e-10)
    h_test = features(model, splits.test, np.arange(len(splits.test_targets)), cfg.data.batch_size)
    check_scores(
        summary,
        lambda v: v.double() @ W,
        h[rows],
        torch.as_tensor(targets[rows]),
        [len(r) for r in held],
        h_test,
        torch.as_tensor(np.asarray(splits.test_targets)),
    )


@pytest.mark.slow  # two CLI runs of 1 + 2 processes per method
@pytest.mark.parametrize("algorithm", ["afl", "fedopal"])
def test_the_clients_test_rows_give_two_processes_the_numbers_of_one(tmp_path, algorithm):
    """partition.client_test_fraction on 2 ranks: each evaluates its block of the clients' test rows (the feature
    table's for AFL, the images through P_global for FedOPAL), the outcomes gathered: one process's numbers."""
    import json

    from tests.conftest import CONF, run_cli

    base = ["--config", str(CONF / "fedopal_digits_tiny.yaml"), "--algorithm", algorithm, "--partition.num_clients", "5"]
    base += ["--train.epochs", "1", "--logging.progress", "false", "--partition.client_test_fraction", "0.25"]
    summaries = []
    for name, extra in (("one", []), ("two", ["--federation.devices", "2"])):
        proc = run_cli(*base, "--output_dir", str(tmp_path / name), *extra, env={"OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-1500:]
        summaries.append(json.loads(next((tmp_path / name).glob("*/summary.json")).read_text()))
    one, two = summaries
    assert two["world_size"] == 2 and 0 < one["fed_test_acc"] <= 1
    for key in ("accuracy", "loss", "fed_test_acc", "fed_test_loss", "fed_test_acc_min", "fed_test_acc_worst10"):
        assert one[key] == two[key], key
