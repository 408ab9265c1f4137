"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020) of a linear head on a frozen
backbone's features.

FedAvg of a head (``fedavg.py``: the same feature tables, sampling, weighted mean and evaluation) whose clients
minimise, each round, their loss plus the proximal term μ/2·‖w − w_t‖² towards the global head w_t they downloaded
(Li et al., Eq. 2): its gradient μ(w − w_t) is added to every local step (``callbacks/proximal.py``). μ = 0 is FedAvg
bit for bit. The paper tunes μ over {0.001, 0.01, 0.1, 1}; the default is 0.01. Not implemented: the paper's
γ-inexact variable local work (every client runs ``train.epochs``; stragglers are ``federation.clients``' concern).

Config section ``fedprox``: ``mu`` and FedAvg's ``weighted``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fl_lightning.algorithms.fedavg import FedAvg, FedAvgConfig
from fl_lightning.callbacks.proximal import ProximalCallback
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import register
from fl_lightning.federation.policies.privacy_coverage import gap_by, weights_only
from fl_lightning.federation.transport import Download

__all__ = ["FedProx", "FedProxConfig"]


@dataclass
class FedProxConfig(FedAvgConfig):
    mu: float = 0.01  # μ of the proximal term μ/2·‖w − w_t‖² (Li et al. 2020, Eq. 2)

    def __post_init__(self) -> None:
        check(self.mu >= 0, "mu", self.mu, "a float >= 0 (0: FedAvg)")


@register("fedprox")
class FedProx(FedAvg):
    averages_weights = True  # aggregate(): the weighted mean of its uploads (federation/policies/order.py)
    config_class = FedProxConfig

    # federation.privacy: DP-FedAvg covers the head, the one thing a client uploads (the proximal term reads only the
    # global head).
    privacy_gap = gap_by(weights_only)

    def local_callbacks(self, download: Download) -> list[object]:
        """The proximal term towards the downloaded global head w_t."""
        reference = {k: t for k, t in download.tensors.items() if k in dict(self.module.named_parameters())}
        return [ProximalCallback(mu=self.config.mu, reference=reference)]
