"""federation.server_optimizer equals Flower's strategy of the same name on the same client updates.

The truth is ``tests/federation/fixtures/flower_server_optimizers.json``: four rounds of three clients per case
replayed through flwr's own ``FedAvg``, ``FedAvgM``, ``FedAdagrad``, ``FedAdam`` and ``FedYogi`` (defaults and one
non-default setting each; ``scripts/make_flower_server_optimizer_fixtures.py``, run in a venv holding flwr, whose
version is in the file). Here each round is our weighted mean (``WeightedMean``, by the clients' example counts, as
Flower's) followed by :class:`ServerOptimizer`'s step. The suite does not need flwr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fl_lightning.config import ServerOptimizerConfig
from fl_lightning.federation.aggregate import WeightedMean
from fl_lightning.federation.policies.server_optimizer import ServerOptimizer

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "flower_server_optimizers.json").read_text())
# Flower's name → ours, and its keyword → our federation.server_optimizer key
_NAMES = {"FedAvg": "fedavg", "FedAvgM": "fedavgm", "FedAdagrad": "fedadagrad", "FedAdam": "fedadam", "FedYogi": "fedyogi"}
_KEYS = {
    "eta": "lr",
    "server_learning_rate": "lr",
    "server_momentum": "momentum",
    "beta_1": "beta_1",
    "beta_2": "beta_2",
    "tau": "tau",
}


def _optimizer(case: dict) -> ServerOptimizer:
    given = {_KEYS[k]: v for k, v in case["kwargs"].items() if k in _KEYS}
    return ServerOptimizer.of(ServerOptimizerConfig(name=_NAMES[case["strategy"]], **given))


def _tensors(arrays: list) -> dict[str, torch.Tensor]:
    return {str(i): torch.tensor(a, dtype=torch.float32) for i, a in enumerate(arrays)}


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda c: f"{c['strategy']}-{json.dumps(c['kwargs'])}")
def test_each_round_equals_flowers_strategy(case):
    optimizer = _optimizer(case)
    state, moments = _tensors(case["initial_parameters"]), {}
    for round_idx, played in enumerate(case["rounds"]):
        assert played["server_round"] == round_idx + 1
        mean = WeightedMean()
        for client in played["clients"]:
            mean.add(_tensors(client["parameters"]), client["num_examples"])
        state, moments = optimizer.step(state, mean.result(), moments, round_idx)
        for key, flower in _tensors(played["global_parameters"]).items():
            torch.testing.assert_close(
                state[key], flower, rtol=1e-5, atol=1e-6, msg=lambda m, k=key, r=round_idx: f"round {r}, array {k}: {m}"
            )


def test_the_defaults_are_flowers():
    """Every case run with Flower's defaults records the hyper-parameters its strategy object held."""
    for case in FIXTURE["cases"]:
        if case["kwargs"] or case["strategy"] == "FedAvg":
            continue
        ours, held = _optimizer(case), case["hyperparameters"]
        for flower_key, ours_key in _KEYS.items():
            if flower_key in held:
                assert getattr(ours, ours_key) == pytest.approx(held[flower_key]), (case["strategy"], flower_key)


def test_the_fixture_covers_every_optimizer_with_and_without_its_defaults():
    seen = {(c["strategy"], bool(c["kwargs"])) for c in FIXTURE["cases"]}
    assert {(name, False) for name in _NAMES if name != "FedAvgM"} <= seen
    assert {(name, True) for name in _NAMES if name != "FedAvg"} <= seen and FIXTURE["flwr_version"]
