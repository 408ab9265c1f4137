"""FedOPAL+ : FedOPAL whose prompts never put the analytic classifier at odds with its features.

Departures from FedOPAL (``fedopal.py``), each measured in ``notebooks/fedopal_beyond.md`` on a real
DINOv2 ViT-S/14 (issue 14):

1. **Prompts first, statistics second** (``restat: global``, the default here; two rounds).
   Faithful FedOPAL solves W* (Eq. (9)) from statistics taken under each client's own drifted
   prompts P_k but infers under P_global = mean_k P_k (Eq. (8), (10)): under label skew the two
   feature maps disagree and accuracy collapses. Here round 0 uploads the prompts *only*
   (M·D numbers, no R_k, C_k), the server averages them, and round 1 streams every client's data
   once under P_global for R_k, C_k — so W* is solved on exactly the features used at inference,
   and the federated W* equals the centralized ridge solution under P_global for any partition
   (the AFL exactness argument). Compared with FedOPAL's ``restat: global`` this sends the big
   statistics once instead of twice (bytes ≈ AFL's + 2·M·D). ``restat: local`` keeps one round
   with FedOPAL's local statistics (and its mismatch), with departure 2 still applied.

2. **Adaptive μ by label coverage** (``min_classes``). A client holding fewer than ``min_classes``
   distinct labels trains nothing (μ = ∞: its P_k = P_init), and its prompts are left out of the
   mean of Eq. (8). Cross-entropy on a single class is minimised by the head's bias alone, so such
   a client's prompt gradient carries no class-discriminative signal, only drift; at α = 0.01
   most clients are in that case. If no client trains, P_global = P_init.

3. **Prompt aggregation over contributing clients** (``prompt_aggregation``): the plain mean (the
   paper) or the N_k-weighted mean, over the clients that trained (departure 2).

Everything else is FedOPAL's: VPT-shallow prompts (``num_prompts``, ``prompt_seed``), Eq. (6) with
the proximal ``mu`` for the clients that train, the temporary linear head and ``train.*``
(epochs, optimizer, lr, momentum, weight decay, batch size), and AFL's solve (``lam``,
``regularization``, ``remove_regularization``, ``dtype``). The faithful method is one switch away:
``algorithm: fedopal``.

Costs (per client): round 0 uploads M·D floats (and trains E epochs, as FedOPAL); round 1 uploads
d(d+1)/2 + d·c floats and runs one inference pass — i.e. AFL's bytes and AFL's statistics pass plus
FedOPAL's prompt training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from fl_lightning.algorithms.fedopal import FedOPAL, FedOPALConfig
from fl_lightning.config import check
from fl_lightning.federation.aggregate import weighted_average
from fl_lightning.federation.algorithm import Client, RoundPlan, State, register
from fl_lightning.federation.transport import Download, Upload

__all__ = ["FedOPALPlus", "FedOPALPlusConfig", "covering_clients", "aggregate_prompts"]


@dataclass
class FedOPALPlusConfig(FedOPALConfig):
    restat: Literal["local", "global"] = "global"  # global: prompts in round 0, statistics under P_global in round 1
    min_classes: int = 2  # clients with fewer distinct labels keep P_init (μ = ∞) and do not vote in Eq. (8)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.min_classes >= 1, "min_classes", self.min_classes, "an int >= 1 (1: every client trains)")


def covering_clients(class_counts: Tensor, min_classes: int) -> Tensor:
    """Which clients hold at least ``min_classes`` distinct labels.

    Args:
        class_counts: (K, C) non-negative label counts per client.
        min_classes: m ≥ 1.

    Returns:
        (K,) bool: ``(class_counts > 0).sum(1) >= m``.
    """
    if class_counts.ndim != 2:
        raise ValueError(f"class_counts must be (K, C), got shape {tuple(class_counts.shape)}")
    if min_classes < 1:
        raise ValueError(f"min_classes must be >= 1, got {min_classes}")
    return (class_counts > 0).sum(dim=1) >= min_classes


def aggregate_prompts(prompts: Sequence[Tensor], weights: Sequence[float], p_init: Tensor) -> Tensor:
    """Eq. (8) over the contributing clients: Σ_k w_k P_k / Σ_k w_k, or P_init when none contributes.

    Args:
        prompts: the contributing clients' P_k, each (M, D).
        weights: w_k > 0 (1 for the plain mean, N_k for the weighted one).
        p_init: (M, D), returned (as a copy) when ``prompts`` is empty.

    Returns:
        P_global, (M, D), in ``p_init``'s dtype; accumulated in float64.
    """
    if len(prompts) != len(weights):
        raise ValueError(f"{len(prompts)} prompts but {len(weights)} weights")
    if not prompts:
        return p_init.clone()
    if any(not w > 0 for w in weights):
        raise ValueError(f"weights must be > 0, got {list(weights)}")
    for p in prompts:
        if tuple(p.shape) != tuple(p_init.shape):
            raise ValueError(f"prompts of shape {tuple(p.shape)} do not fit {tuple(p_init.shape)}")
    return weighted_average([p.detach().cpu() for p in prompts], weights).to(p_init.dtype)


@register("fedopal_plus")
class FedOPALPlus(FedOPAL):
    config_class = FedOPALPlusConfig

    def _prompts_only(self, round_idx: int) -> bool:
        """Round 0 of the two-round schedule carries prompts and no statistics."""
        return self.config.restat == "global" and round_idx == 0

    def _trains(self, client: Client) -> bool:
        return bool(covering_clients(torch.as_tensor(client.class_counts)[None], self.config.min_classes)[0])

    # -- client ----------------------------------------------------------------------------------
    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: Any) -> RoundPlan:
        return RoundPlan({c: Download({"prompts": state["prompts"]}) for c in clients})

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        prompts = download.tensors["prompts"]
        self.model.set_prompts(prompts)
        if round_idx > 0:  # statistics under P_global (Eq. (7))
            return self.statistics_upload(self.statistics(client))
        trains = self._trains(client)
        if trains:
            self.train_prompts(round_idx, client, prompts)  # Eq. (6)
        tensors = {"prompts": self.model.get_prompts().detach().cpu().clone()}
        if not self._prompts_only(round_idx):  # one shot: FedOPAL's local statistics under P_k
            return self.statistics_upload(self.statistics(client), tensors, trained=int(trains))
        return Upload(tensors, {"num_samples": int(client.num_samples), "trained": int(trains)})

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        if self._prompts_only(round_idx):
            return {"prompts": tuple(download.tensors["prompts"].shape)}
        return super().expected_shapes(round_idx, download)

    # -- server ----------------------------------------------------------------------------------
    def aggregate(self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str],
                  plan: RoundPlan) -> State:
        if not uploads:
            raise RuntimeError(f"round {round_idx}: no client uploaded anything")
        state = dict(state)
        if round_idx == 0:
            voters = [u for u in uploads.values() if int(u.meta.get("trained", 1))]
            weights = [float(u.meta["num_samples"]) if self.config.prompt_aggregation == "weighted" else 1.0
                       for u in voters]
            state["prompts"] = aggregate_prompts([u.tensors["prompts"] for u in voters], weights,
                                                 state["prompts"].cpu())
            state["prompt_voters"] = torch.tensor(len(voters))
        if not self._prompts_only(round_idx):
            total, count = self.fold_statistics(round_idx, uploads)
            state["W"] = self.solve(total, count)  # Eq. (9)
        return state

    def evaluate(self, state: State) -> dict[str, Any]:
        if "W" not in state:  # after the prompts-only round there is no classifier yet
            return {}
        return super().evaluate(state)

    def summary_extras(self, state: State) -> dict[str, Any]:
        voters = int(state["prompt_voters"]) if "prompt_voters" in state else None
        return {**super().summary_extras(state), "min_classes": self.config.min_classes, "prompt_voters": voters}
