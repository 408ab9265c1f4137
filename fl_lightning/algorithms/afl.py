"""AFL (analytic federated learning, He et al. 2024): FedOPAL's pipeline with no prompts and no
local training — each client uploads R_k = Σ h hᵀ and C_k = Σ h yᵀ of the frozen backbone's
features, and the server solves the ridge regression W = (Σ_k R_k + λ_total·I)⁻¹ Σ_k C_k.

Regularisation conventions (``analytic.regularization``): ``once`` adds λ to the aggregate as
FedOPAL's Eq. (9); ``per_client`` follows AFL's published code, where every client adds γI so the
aggregate carries K·γ·I; ``analytic.remove_regularization: true`` takes it back out (the exact,
or least-norm, unregularised solution). The federated W equals the centralized ridge solution on
the same features for any number of clients, partition and client order (tests).
"""

from __future__ import annotations

from fl_lightning.algorithms.fedopal import FedOPAL
from fl_lightning.federation.algorithm import register

__all__ = ["AFL"]


@register("afl")
class AFL(FedOPAL):
    def _num_prompts(self) -> int:
        return 0

    def _local_epochs(self) -> int:
        return 0

    @property
    def num_rounds(self) -> int:
        return 1
