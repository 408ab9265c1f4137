"""FedCGS through the engine and the CLI, against a centralized float64 reference on the same features."""

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
from fl_lightning.federation.algorithm import InputSpec
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.algorithms.client_test_helpers import check_scores, clients_rows, features, read_splits
from tests.conftest import CONF, run_cli

CONFIG = CONF / "fedcgs_digits_tiny.yaml"


def _cfg(tmp_path, *extra):
    return load_config(
        CONFIG, ["--output_dir", str(tmp_path), "--logging.progress", "false", "--partition.num_clients", "4", *extra]
    )


def _split_batch_features(cfg) -> tuple[np.ndarray, np.ndarray]:
    """Features of the whole training split in the split's own batches, as the run computes them once
    (data/feature_cache.py; a float32 forward may depend on the batch it runs in), with the backbone the
    simulation builds (same seed)."""
    seed_everything(cfg.seed, verbose=False)
    backbone = frozen_backbone(cfg)
    spec = InputSpec.of_backbone(backbone, cfg.data.image_size)
    t = build_transform(normalization=spec.normalization, image_size=spec.image_size, train=False, mean=spec.mean, std=spec.std)
    splits = build_dataset(cfg.data.name, root=cfg.data.root, train_transform=t, test_transform=t, seed=cfg.seed)
    hs, ys = [], []
    for start in range(0, len(splits.train_targets), cfg.data.batch_size):
        idx = np.arange(start, min(start + cfg.data.batch_size, len(splits.train_targets)))
        with torch.inference_mode():
            hs.append(backbone(torch.stack([splits.train[int(i)][0] for i in idx])).double().numpy())
        ys.append(splits.train_targets[idx])
    return np.concatenate(hs), np.concatenate(ys)


def test_federated_head_equals_the_official_formula_on_pooled_features(tmp_path):
    # γ = 1e-2 keeps cond(Σ̂) ≈ 4e3 on these random-ViT features, so that float64 rounding stays far below
    # the 1e-8 compared here (‖μ‖ ≈ 8 against a per-dimension std ≈ 0.12: the raw moments cancel ~4000×)
    cfg = _cfg(tmp_path, "--partition.alpha", "0.1", "--fedcgs.shrinkage", "0.01")
    Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    H, y = _split_batch_features(cfg)
    c, d, N = 10, H.shape[1], len(y)
    n = np.bincount(y, minlength=c)
    M = np.stack([H[y == j].mean(0) for j in range(c)])
    S = np.cov(H, rowvar=False)  # the global covariance of main_fedcgs.py, on the pooled features
    W_ref = np.linalg.solve(S + 0.01 * np.trace(S) / d * np.eye(d), M.T)  # W = Σ̂⁻¹ μᵀ (utils_fl.eval)
    b_ref = -0.5 * np.einsum("jd,dj->j", M, W_ref) + np.log(n / N)  # −½ μ Σ̂⁻¹ μᵀ + log(N_j / N)
    np.testing.assert_allclose(state["W"].numpy(), W_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(state["b"].numpy(), b_ref, rtol=1e-8, atol=1e-10)
    assert state["counts"].tolist() == n.tolist()


def test_within_class_option_is_lda_on_pooled_features(tmp_path):
    """``covariance: within``: the class-centred scatter / N (scikit-learn LDA's covariance_; the
    unit tests compare with sklearn itself, which cannot shrink like this)."""
    cfg = _cfg(tmp_path, "--fedcgs.covariance", "within", "--fedcgs.shrinkage", "0.01")
    Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    H, y = _split_batch_features(cfg)
    d, N = H.shape[1], len(y)
    M = np.stack([H[y == j].mean(0) for j in range(10)])
    Sw = sum((H[y == j] - M[j]).T @ (H[y == j] - M[j]) for j in range(10)) / N
    W_ref = np.linalg.solve(Sw + 0.01 * np.trace(Sw) / d * np.eye(d), M.T)
    b_ref = -0.5 * np.einsum("jd,dj->j", M, W_ref) + np.log(np.bincount(y, minlength=10) / N)
    np.testing.assert_allclose(state["W"].numpy(), W_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(state["b"].numpy(), b_ref, rtol=1e-8, atol=1e-10)


def test_cli_result_does_not_depend_on_alpha_and_reports_upload_size(tmp_path):
    out = run_cli("--config", str(CONFIG), "--output_dir", str(tmp_path), "--logging.progress", "false")
    assert out.returncode == 0, out.stderr[-2000:]
    name = "fedcgs_digits_a0.1_s0"  # the config's 10 clients, α = 0.1
    runs = {
        "0.1": (
            json.loads((tmp_path / name / "summary.json").read_text()),
            safe_load(tmp_path / name / "checkpoints" / "server.pt")["state"],
        )
    }
    cfg = _cfg(tmp_path, "--partition.alpha", "inf", "--partition.num_clients", "3")  # in-process: faster
    runs["inf"] = (Simulation(cfg=cfg, loggers=[]).run(), safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"])
    (s1, w1), (s2, w2) = runs["0.1"], runs["inf"]
    assert s1["accuracy"] == s2["accuracy"] and s1["rounds"] == 1
    # the same head up to the float32 rounding of features computed in different batches
    np.testing.assert_allclose(w1["W"].numpy(), w2["W"].numpy(), rtol=1e-3, atol=1e-4 * float(w1["W"].abs().max()))
    d, c = s1["feature_dim"], 10
    per_client = (d * (d + 1) // 2 + d * c) * 8 + 8 * c + 8  # B upper, class sums (float64), counts, N
    assert s1["upload_bytes_per_client"] == s2["upload_bytes_per_client"] == per_client
    assert s1["bytes_up"] == 10 * per_client and s2["bytes_up"] == 3 * per_client
    assert s1["classes_seen"] == 10


@pytest.mark.parametrize("key, value", [("shrinkage", "-1"), ("covariance", "pooled"), ("lam", "0.1")])
def test_bad_section_keys_are_usage_errors_naming_the_key(tmp_path, key, value):
    with pytest.raises(UsageError, match=f"fedcgs.{key}"):  # lam is AFL's, not FedCGS's
        _cfg(tmp_path, f"--fedcgs.{key}", value)


def test_fedcgs_evaluates_the_clients_test_rows_with_its_head_fitted_without_them(tmp_path):
    """partition.client_test_fraction 0.25: the class counts folded are those of the clients' training rows alone,
    and fed_test_acc & co. are the Gaussian head's on their own test rows, weighted as Flower's server."""
    cfg = _cfg(tmp_path, "--partition.client_test_fraction", "0.25")
    summary = Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    model, splits = read_splits(cfg)
    targets = np.asarray(splits.train_targets)
    fit, held = clients_rows(cfg, targets)
    rows = np.concatenate(held)
    counts = np.bincount(targets[np.concatenate(fit)], minlength=10)
    assert state["counts"].tolist() == counts.tolist() != np.bincount(targets, minlength=10).tolist()
    h = features(model, splits.train, np.arange(len(targets)), cfg.data.batch_size)  # the run's table, its batches
    h_test = features(model, splits.test, np.arange(len(splits.test_targets)), cfg.data.batch_size)
    W, b = state["W"], state["b"]
    check_scores(
        summary,
        lambda v: v.to(W.dtype) @ W + b,
        h[rows],
        torch.as_tensor(targets[rows]),
        [len(r) for r in held],
        h_test,
        torch.as_tensor(np.asarray(splits.test_targets)),
    )
