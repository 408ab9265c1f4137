"""federation.aggregator equals Flower's robust strategy of the same name on the same client weights.

The truth is ``tests/federation/fixtures/flower_robust_aggregators.json``: two rounds of 8 and 11 clients (one and
two outliers: a client's weights ×−5, or heavy Gaussian noise) through flwr's own ``FedMedian``, ``FedTrimmedAvg``,
``Krum`` / Multi-Krum and ``Bulyan`` (``scripts/make_flower_robust_aggregator_fixtures.py``, run in a venv holding
flwr; its version is in the file). The suite does not need flwr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fl_lightning.config import AggregatorConfig
from fl_lightning.federation.policies.robust_aggregation import RobustAggregator
from fl_lightning.federation.transport import Upload

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "flower_robust_aggregators.json").read_text())


def _aggregator(case: dict) -> RobustAggregator:
    kw, strategy = case["kwargs"], case["strategy"]
    if strategy == "FedMedian":
        return RobustAggregator.of(AggregatorConfig(name="median"))
    if strategy == "FedTrimmedAvg":
        return RobustAggregator.of(
            AggregatorConfig(name="trimmed_mean", **({"trim_fraction": kw["beta"]} if "beta" in kw else {}))
        )
    f = kw.get("num_malicious_clients", 0)
    if strategy == "Bulyan":
        return RobustAggregator.of(AggregatorConfig(name="bulyan", num_malicious=f))
    keep = kw.get("num_clients_to_keep", 0)
    if keep:
        return RobustAggregator.of(AggregatorConfig(name="multi_krum", num_malicious=f, num_to_keep=keep))
    return RobustAggregator.of(AggregatorConfig(name="krum", num_malicious=f))


def _tensors(arrays: list) -> dict[str, torch.Tensor]:
    return {str(i): torch.tensor(a, dtype=torch.float32) for i, a in enumerate(arrays)}


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda c: f"{c['strategy']}-{json.dumps(c['kwargs'])}")
def test_each_round_equals_flowers_strategy(case):
    aggregator = _aggregator(case)
    for played in case["rounds"]:
        uploads = {
            c: Upload(_tensors(client["parameters"]), {"num_samples": client["num_examples"]})
            for c, client in enumerate(played["clients"])
        }
        state = {k: torch.zeros_like(t) for k, t in uploads[0].tensors.items()}  # Flower's rules ignore it
        ours = aggregator.aggregate(state, uploads)
        for key, flower in _tensors(played["global_parameters"]).items():
            torch.testing.assert_close(
                ours[key],
                flower,
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m, k=key, r=played["server_round"]: f"round {r}, array {k}: {m}",
            )


def test_flowers_defaults_are_ours():
    assert AggregatorConfig().trim_fraction == 0.2  # FedTrimmedAvg's beta
    assert AggregatorConfig().num_malicious == 0  # Krum's num_malicious_clients


def test_every_rule_is_in_the_fixture():
    assert {c["strategy"] for c in FIXTURE["cases"]} == {"FedMedian", "FedTrimmedAvg", "Krum", "Bulyan"}
    assert any(c["kwargs"].get("num_clients_to_keep") for c in FIXTURE["cases"]) and FIXTURE["flwr_version"]
