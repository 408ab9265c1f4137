"""The settings that only averaging methods take — ``federation.server_optimizer``, ``federation.aggregator`` and
``federation.attack`` — refused in one line (exit 2) on any other method, and where they would clash.

An averaging method is one whose global state is the mean of its clients' weights: exactly the methods DP-FedAvg
covers (their ``privacy_gap`` under ``dp_fedavg`` is None: ``fedavg``, ``fedprox``, ``fedavg_cnn``, ``fedavg_prompts``). Adam on
AFL's closed-form W, a median of FedOPAL's statistics or a sign-flipped synthetic-image count would be no optimizer,
aggregator or attack of anything.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fl_lightning.errors import UsageError
from fl_lightning.federation.placement import clients_per_round

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["averaging_gap", "check_averaging_settings"]


def averaging_gap(cfg: RunConfig, algorithm: type) -> str | None:
    """Why ``algorithm``'s state is not a mean of its clients' weights (None: it is)."""
    from fl_lightning.config import PrivacyConfig
    from fl_lightning.federation.privacy_coverage import privacy_gap

    as_averaging = dataclasses.replace(
        cfg, federation=dataclasses.replace(cfg.federation, privacy=PrivacyConfig(mechanism="dp_fedavg", epsilon=1.0))
    )
    return privacy_gap(algorithm, as_averaging)


def _settings(cfg: RunConfig) -> list[str]:
    """The averaging-only settings this run asks for, each as ``key=value``."""
    f = cfg.federation
    asked = [
        ("server_optimizer.name", f.server_optimizer.name, "fedavg"),
        ("aggregator.name", f.aggregator.name, "mean"),
        ("attack.kind", f.attack.kind, "none"),
    ]
    empty_rounds = ["federation.min_clients=0"] if f.min_clients == 0 else []  # an empty round keeps the state
    return [f"federation.{key}={value}" for key, value, plain in asked if value != plain] + empty_rounds


def check_averaging_settings(cfg: RunConfig, algorithm: type) -> None:
    """Refuse (one line, :class:`UsageError`) an averaging-only setting on a method that does not average weights,
    and a robust aggregator under a privacy mechanism (the noise is calibrated to the mean's sensitivity)."""
    asked = _settings(cfg)
    if not asked:
        return
    gap = averaging_gap(cfg, algorithm)
    if gap is not None:
        raise UsageError(
            f"usage error: {asked[0]} needs a method whose state is the mean of its clients' weights "
            f"(fedavg, fedprox, fedavg_cnn, fedavg_prompts); {cfg.algorithm} is not: {gap}"
        )
    f = cfg.federation
    per_round = clients_per_round(cfg.partition.num_clients, f.client_fraction)
    if f.aggregator.name == "bulyan" and per_round < 4 * f.aggregator.num_malicious + 3:
        raise UsageError(
            f"usage error: federation.aggregator.name=bulyan with num_malicious f = "
            f"{f.aggregator.num_malicious} needs n >= 4f + 3 = {4 * f.aggregator.num_malicious + 3} "
            f"clients a round; this run has {per_round} (partition.num_clients × client_fraction)"
        )
    if f.aggregator.name != "mean" and f.privacy.mechanism != "off":
        raise UsageError(
            f"usage error: federation.aggregator.name={f.aggregator.name} with federation.privacy."
            f"mechanism={f.privacy.mechanism}: DP-FedAvg's noise is calibrated to the mean's sensitivity "
            f"S/D, not to a {f.aggregator.name}'s; use aggregator mean under privacy"
        )
