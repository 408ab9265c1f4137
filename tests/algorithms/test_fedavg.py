"""FedAvg of a linear head: the server's head is the (sample-weighted) mean of the clients' heads, and one
round of one full-batch SGD step per client is one centralized full-batch gradient step on the pooled features
(the mean loss's gradient is the sample-weighted mean of the clients' gradients), against float64 references."""

import numpy as np
import pytest
import torch
from torch import nn

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.config.loading import load_config
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.federation.transport import Upload
from tests.algorithms.test_fedopal import _centralized_features
from tests.conftest import CONF

_KEYS = ("head.weight", "head.bias")


def _cfg(tmp_path, *extra):
    return load_config(CONF / "fedavg_digits_tiny.yaml", ["--output_dir", str(tmp_path), "--logging.progress", "false", *extra])


@pytest.mark.parametrize("weighted", [True, False])
def test_the_server_head_is_the_weighted_mean_of_the_client_heads(tmp_path, weighted):
    method = FedAvg(cfg=_cfg(tmp_path, "--fedavg.weighted", str(weighted).lower()))
    rng = np.random.default_rng(0)
    heads = {c: {"head.weight": rng.normal(size=(10, 8)), "head.bias": rng.normal(size=10)} for c in range(3)}
    sizes = {0: 5, 1: 40, 2: 155}
    uploads = {
        c: Upload({k: torch.tensor(v, dtype=torch.float32) for k, v in heads[c].items()}, {"num_samples": sizes[c]})
        for c in heads
    }
    state = method.aggregate(0, {}, uploads, {}, None)
    w = np.array([sizes[c] if weighted else 1.0 for c in heads])
    for k in _KEYS:
        reference = sum(w[c] * heads[c][k] for c in heads) / w.sum()
        np.testing.assert_allclose(state[k].double().numpy(), reference, rtol=1e-6, atol=1e-7)
    before = {k: torch.zeros(1) for k in _KEYS}
    assert method.aggregate(0, before, {}, {0: "failed"}, None) is before  # nobody uploaded: the head stays


@pytest.mark.parametrize("clients, alpha", [(4, "inf"), (5, "0.1")])
def test_one_full_batch_step_per_client_is_one_centralized_gradient_step(tmp_path, clients, alpha):
    lr = 0.5
    cfg = _cfg(
        tmp_path,
        "--federation.rounds",
        "1",
        "--train.epochs",
        "1",
        "--train.batch_size",
        "100000",
        "--train.optimizer",
        "sgd",
        "--train.lr",
        str(lr),
        "--train.momentum",
        "0",
        "--partition.num_clients",
        str(clients),
        "--partition.alpha",
        alpha,
    )
    Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    h, y = _centralized_features(cfg)  # the pooled features (N × d) and one-hot labels, float64
    head = nn.Linear(h.shape[1], y.shape[1])
    torch.manual_seed(cfg.seed)  # the initial head every rank builds
    head.reset_parameters()
    W, b = head.weight.detach().double().numpy(), head.bias.detach().double().numpy()
    z = h @ W.T + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = (p - y) / len(h)  # ∂ mean CE / ∂ logits
    np.testing.assert_allclose(state["head.weight"].double().numpy(), W - lr * g.T @ h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["head.bias"].double().numpy(), b - lr * g.sum(axis=0), rtol=1e-5, atol=1e-6)
