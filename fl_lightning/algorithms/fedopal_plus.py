"""FedOPAL+ : FedOPAL whose prompts never put the analytic classifier at odds with its features.

Departures from FedOPAL (``fedopal.py``), each measured in ``notebooks/fedopal_beyond.md`` on a real
DINOv2 ViT-S/14:

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

Stages: ``restat: global`` = :class:`CoveringPrompts` (round 0, prompts only) → FedOPAL's
:class:`~fl_lightning.algorithms.fedopal.Statistics` (round 1, under P_global); ``restat: local`` =
:class:`CoveringPromptsWithStatistics` (one round).

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

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from fl_lightning.algorithms.fedopal import (
    FedOPAL,
    FedOPALConfig,
    PromptsWithStatistics,
    PromptTuning,
    Statistics,
    aggregate_prompts,
)
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import Client, State, register
from fl_lightning.federation.transport import Upload

__all__ = ["FedOPALPlus", "FedOPALPlusConfig", "CoveringPrompts", "CoveringPromptsWithStatistics", "covering_clients",
           "aggregate_prompts"]


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


class CoveringPrompts(PromptTuning):
    """Departures 2 and 3: only a client holding ``min_classes`` labels trains, and only its P_k votes."""

    def trains(self, client: Client) -> bool:
        counts = torch.as_tensor(client.class_counts)[None]
        return bool(covering_clients(counts, self.method.config.min_classes)[0])

    def meta(self, client: Client, trains: bool) -> dict[str, int]:
        return {**super().meta(client, trains), "trained": int(trains)}

    def votes(self, upload: Upload) -> bool:
        return bool(int(upload.meta.get("trained", 1)))

    def prompt_state(self, prompts: list[Tensor], weights: list[float], state: State) -> State:
        return {"prompts": aggregate_prompts(prompts, weights, state["prompts"].cpu()),
                "prompt_voters": torch.tensor(len(prompts))}


class CoveringPromptsWithStatistics(CoveringPrompts, PromptsWithStatistics):
    """``restat: local``: one shot with FedOPAL's local statistics under P_k (and its mismatch)."""


@register("fedopal_plus")
class FedOPALPlus(FedOPAL):
    config_class = FedOPALPlusConfig
    schedules = {"global": (CoveringPrompts, Statistics), "local": (CoveringPromptsWithStatistics,)}  # by restat

    def summary_extras(self, state: State) -> dict[str, Any]:
        voters = int(state["prompt_voters"]) if "prompt_voters" in state else None
        return {**super().summary_extras(state), "min_classes": self.config.min_classes, "prompt_voters": voters}
