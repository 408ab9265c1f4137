"""FedPFT through the engine and the CLI: what crosses the network, and the head it trains against a
head trained on the real features."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from lightning.fabric import seed_everything

from fl_lightning.algorithms.common import frozen_backbone
from fl_lightning.config.loading import load_config
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.errors import UsageError
from fl_lightning.feature_gaussians import train_linear_head
from fl_lightning.federation.algorithm import InputSpec
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.algorithms.client_test_helpers import check_scores, clients_rows, features, read_splits
from tests.conftest import CONF, run_cli
from tests.outcomes import expect, outcome_seed

CONFIG = CONF / "fedpft_digits_tiny.yaml"


def _cfg(tmp_path, *extra):
    return load_config(CONFIG, ["--output_dir", str(tmp_path), "--logging.progress", "false", *extra])


def _features(cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Real train and test features of the backbone the simulation builds (same seed)."""
    seed_everything(cfg.seed, verbose=False)
    backbone = frozen_backbone(cfg)
    spec = InputSpec.of_backbone(backbone, cfg.data.image_size)
    t = build_transform(normalization=spec.normalization, image_size=spec.image_size, train=False, mean=spec.mean, std=spec.std)
    splits = build_dataset(cfg.data.name, root=cfg.data.root, train_transform=t, test_transform=t, seed=cfg.seed)

    def run(ds):
        x = torch.stack([ds[i][0] for i in range(len(ds))])
        with torch.inference_mode():
            return backbone(x).float(), torch.tensor([int(ds[i][1]) for i in range(len(ds))])

    return (*run(splits.train), *run(splits.test))


@pytest.mark.outcome
def test_cli_run_uploads_only_mixture_parameters(tmp_path):
    seed = str(outcome_seed())
    out = run_cli(
        "--config",
        str(CONFIG),
        "--output_dir",
        str(tmp_path),
        "--logging.progress",
        "false",
        "--seed",
        seed,
        "--partition.seed",
        seed,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads((tmp_path / f"fedpft_digits_a0.1_s{seed}" / "summary.json").read_text())
    d, K = s["feature_dim"], 2
    assert s["rounds"] == 1 and s["n_components"] == K and s["covariance_type"] == "diag"
    per_mixture = K * (d + 1 + d) * 2 + 16  # float16 weights, means, diagonal covariances; int64 label and count
    assert s["upload_bytes_per_class_mixture"] == per_mixture
    # every uploaded byte is a class mixture or the sample count: no feature, image or label list
    assert s["bytes_up"] == s["class_mixtures_uploaded"] * per_mixture + 10 * 8
    # α = 0.1 leaves clients with few classes; those with ≤ K samples of a class do not send it
    assert 10 <= s["class_mixtures_uploaded"] < 100
    assert s["synthetic_features"] <= 1437
    expect("test accuracy", s["accuracy"], ">", 0.2)  # chance: 0.1


@pytest.mark.parametrize("covariance_type, n_components, cov_numbers", [("spherical", 3, 1), ("full", 1, 64 * 65 // 2)])
def test_upload_grows_with_components_times_classes(tmp_path, covariance_type, n_components, cov_numbers):
    cfg = _cfg(
        tmp_path,
        "--partition.alpha",
        "inf",
        "--partition.num_clients",
        "2",
        "--fedpft.covariance_type",
        covariance_type,
        "--fedpft.n_components",
        str(n_components),
        "--fedpft.head_epochs",
        "1",
    )
    s = Simulation(cfg=cfg, loggers=[]).run()
    assert s["class_mixtures_uploaded"] == 2 * 10  # α = inf: every client holds every class
    per_mixture = n_components * (64 + 1 + cov_numbers) * 2 + 16
    assert s["upload_bytes_per_class_mixture"] == per_mixture
    assert s["bytes_up"] == 20 * per_mixture + 2 * 8


@pytest.mark.outcome
def test_head_on_synthetic_features_is_close_to_head_on_real_features(tmp_path):
    """One client, full covariances: the server's head, trained only on features sampled from the
    uploaded mixtures, is within 0.05 test accuracy of the same head trained on the real features."""
    cfg = _cfg(tmp_path, "--partition.num_clients", "1", "--fedpft.covariance_type", "full", "--seed", str(outcome_seed()))
    s = Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    Xtr, ytr, Xte, yte = _features(cfg)
    c = cfg.method
    w, b = train_linear_head(
        Xtr,
        ytr,
        num_classes=10,
        epochs=c.head_epochs,
        batch_size=c.head_batch_size,
        optimizer=c.head_optimizer,
        lr=c.head_lr,
        momentum=c.head_momentum,
        seed=cfg.seed,
    )
    real = float(((Xte @ w.T + b).argmax(1) == yte).float().mean())
    synthetic = float(((Xte @ state["weight"].T + state["bias"]).argmax(1) == yte).float().mean())
    assert synthetic == pytest.approx(s["accuracy"], abs=1e-6)  # the engine evaluated that head
    expect("accuracy of the head on real features", real, ">", 0.3)
    expect("accuracy on synthetic features - on real features", synthetic - real, ">=", -0.05)
    assert int(state["synthetic_features"]) == len(ytr)  # n_j draws per class, as the client's counts


@pytest.mark.parametrize(
    "key, value", [("n_components", "0"), ("covariance_type", "tied"), ("head_lr", "0"), ("wire_dtype", "int8"), ("lam", "1")]
)
def test_bad_section_keys_are_usage_errors_naming_the_key(tmp_path, key, value):
    with pytest.raises(UsageError, match=f"fedpft.{key}"):
        _cfg(tmp_path, f"--fedpft.{key}", value)


def test_fedpft_evaluates_the_clients_test_rows_with_its_head_fitted_without_them(tmp_path):
    """partition.client_test_fraction 0.25: the mixtures are fitted on the clients' training rows alone (the
    synthetic features drawn are their class counts above K), and fed_test_acc & co. are the trained head's on
    the clients' own test rows, weighted as Flower's server."""
    cfg = _cfg(tmp_path, "--partition.num_clients", "4", "--fedpft.head_epochs", "2", "--partition.client_test_fraction", "0.25")
    summary = Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    model, splits = read_splits(cfg)
    targets = np.asarray(splits.train_targets)
    fit, held = clients_rows(cfg, targets)

    def drawn(parts):  # a class of more than K rows on a client: a mixture, as many draws as its rows
        counts = [np.bincount(targets[p], minlength=10) for p in parts]
        return sum(int(c[c > cfg.method.n_components].sum()) for c in counts)

    whole = [np.union1d(a, b) for a, b in zip(fit, held)]
    assert int(state["synthetic_features"]) == drawn(fit) != drawn(whole)
    rows = np.concatenate(held)
    h = features(model, splits.train, np.arange(len(targets)), cfg.data.batch_size)  # the run's table, its batches
    h_test = features(model, splits.test, np.arange(len(splits.test_targets)), cfg.data.batch_size)
    weight, bias = state["weight"], state["bias"]
    check_scores(
        summary,
        lambda v: v.float() @ weight.T + bias,
        h[rows],
        torch.as_tensor(targets[rows]),
        [len(r) for r in held],
        h_test,
        torch.as_tensor(np.asarray(splits.test_targets)),
    )
