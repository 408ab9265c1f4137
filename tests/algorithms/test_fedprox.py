"""FedProx (Li et al. 2020): μ = 0 is FedAvg bit for bit; the proximal term μ/2·‖w − w_t‖² pulls each client's head
towards the global one, so the round's move shrinks as μ grows; a negative μ is one line."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.algorithms.client_drift_helpers import drift_config
from tests.conftest import CONF


def _state(tmp_path, algorithm: str, *extra: str) -> dict[str, torch.Tensor]:
    cfg = drift_config(tmp_path, algorithm, "--train.epochs", "3", *extra, rounds=1)
    Simulation(cfg=cfg, loggers=[]).run()
    return safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]


def test_mu_zero_is_fedavg_bit_for_bit(tmp_path):
    fedavg, fedprox = _state(tmp_path / "a", "fedavg"), _state(tmp_path / "b", "fedprox", "--fedprox.mu", "0")
    assert fedavg.keys() == fedprox.keys() and all(torch.equal(fedavg[k], fedprox[k]) for k in fedavg)


def test_the_proximal_term_shrinks_the_round_move_as_mu_grows(tmp_path):
    start = _state(tmp_path / "start", "fedavg", "--train.epochs", "0")  # the initial head, no training
    moves = [
        float((_state(tmp_path / f"mu{mu}", "fedprox", "--fedprox.mu", str(mu))["head.weight"] - start["head.weight"]).norm())
        for mu in (0.0, 0.3, 1.0)
    ]  # lr·(μ + λ_max) < 2: stable steps
    assert moves[0] > moves[1] > moves[2] > 0, moves


def test_a_negative_mu_is_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(CONF / "fedavg_digits_tiny.yaml", ["--algorithm", "fedprox", "--fedprox.mu", "-1"])
    assert err.value.key == "fedprox.mu" and "\n" not in str(err.value)
