"""FedOPAL: one-shot federated learning via analytic visual prompt tuning — AFL plus prompts.

Client k (Eq. (6)): starting from the shared P_init, train M VPT-shallow prompts P_k and a temporary
linear head with cross-entropy + mu/2·||P_k − P_init||² for ``train.epochs`` epochs (optimizer, lr,
momentum, weight decay and batch size from ``train.*``); then, with P_k frozen, stream its data once
to accumulate R_k = Σ h hᵀ and C_k = Σ h yᵀ (Eq. (7)) of the prompt-rectified features h. It uploads
P_k, the upper triangle of R_k, C_k and N_k.

Server: P_global = mean_k P_k (Eq. (8); ``weighted`` by N_k as an option) and
W* = (Σ_k R_k + λI)⁻¹ Σ_k C_k (Eq. (9), :class:`~fl_lightning.algorithms.afl.AFL`'s solve).
Inference uses P_global and W* (Eq. (10)). One round, zero server training.

Beyond the paper, ``fedopal.restat: global`` adds a second round in which every client recomputes
its statistics under P_global, so that W* is solved on the very features used at inference. Round 0
still reports the faithful FedOPAL result, so metrics.csv shows both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn

from fl_lightning.algorithms.afl import AFL, AFLConfig
from fl_lightning.callbacks.proximal import ProximalCallback
from fl_lightning.config import check
from fl_lightning.federation.aggregate import weighted_average
from fl_lightning.federation.algorithm import Client, Environment, RoundHistory, RoundPlan, State, register
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.placement import client_seed
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.models.backbones import ViTBackbone
from fl_lightning.models.vpt import PromptedViT
from fl_lightning.modules.prompt_tuning import PromptTuningModule

__all__ = ["FedOPAL", "FedOPALConfig"]


@dataclass
class FedOPALConfig(AFLConfig):
    num_prompts: int = 10  # M prompt tokens (VPT-shallow)
    mu: float = 0.1  # proximal strength of Eq. (6)
    prompt_aggregation: Literal["mean", "weighted"] = "mean"  # Eq. (8): the paper's plain mean
    restat: Literal["local", "global"] = "local"  # global: recompute statistics under P_global (beyond the paper)
    prompt_seed: int = 0  # identical P_init on every client

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_prompts >= 1, "num_prompts", self.num_prompts, "an int >= 1 (no prompts: algorithm afl)")
        check(self.mu >= 0, "mu", self.mu, "a float >= 0")


@register("fedopal")
class FedOPAL(AFL):
    config_class = FedOPALConfig

    @property
    def num_rounds(self) -> int:
        return 2 if self.config.restat == "global" else 1

    # -- set-up ----------------------------------------------------------------------------------
    def feature_model(self, backbone: ViTBackbone) -> nn.Module:
        model = PromptedViT(backbone, num_prompts=self.config.num_prompts, seed=self.config.prompt_seed)
        self.p_init = model.get_prompts().detach().cpu().clone()  # identical on every client and rank
        return model

    def setup(self, env: Environment) -> None:
        t = self.cfg.train
        self.module = PromptTuningModule(model=self.model, num_classes=env.num_classes, optimizer=t.optimizer,
                                         lr=t.lr, weight_decay=t.weight_decay, momentum=t.momentum,
                                         head_seed=self.cfg.seed)
        self.module = self.fabric.to_device(self.module)
        super().setup(env)
        self._head_init = {k: v.detach().clone() for k, v in self.module.head.state_dict().items()}

    def initial_state(self) -> State:
        return {"prompts": self.p_init.clone()}

    # -- client ----------------------------------------------------------------------------------
    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        # round 0: the shared P_init; restat round: P_global. Prompts are all a client needs.
        return RoundPlan({c: Download({"prompts": state["prompts"]}) for c in clients})

    def train_prompts(self, round_idx: int, client: Client, p_init: Tensor) -> None:
        """Eq. (6): prompts + a fresh temporary head, cross-entropy + proximal term towards P_init."""
        self.module.head.load_state_dict(self._head_init)
        if self.cfg.train.epochs == 0 or client.num_samples == 0:
            return
        loader = self.env.loader(client.dataset, shuffle=True, batch_size=self.cfg.train.batch_size,
                                 seed=client_seed(self.cfg.seed, round_idx, client.index))
        proximal = ProximalCallback(mu=self.config.mu, reference={PromptTuningModule.prompt_parameter_name: p_init})
        fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs, callbacks=[proximal])

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        prompts = download.tensors["prompts"]
        self.model.set_prompts(prompts)
        if round_idx == 0:
            self.train_prompts(round_idx, client, prompts)
        first = {"prompts": self.model.get_prompts().detach().cpu().clone()} if round_idx == 0 else None
        return self.statistics_upload(self.statistics(client), first)  # statistics under this client's prompts

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        shapes = super().expected_shapes(round_idx, download)
        if round_idx == 0:
            shapes["prompts"] = tuple(download.tensors["prompts"].shape)
        return shapes

    # -- server ----------------------------------------------------------------------------------
    def aggregate(self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str],
                  plan: RoundPlan) -> State:
        prompts: list[Tensor] = []
        weights: list[float] = []

        def keep_prompts(upload: Upload) -> None:
            prompts.append(upload.tensors["prompts"])
            weights.append(upload.meta["num_samples"] if self.config.prompt_aggregation == "weighted" else 1.0)

        total, count = self.fold_statistics(round_idx, uploads, keep_prompts if round_idx == 0 else None)
        state = dict(state)
        if round_idx == 0:  # Eq. (8)
            state["prompts"] = weighted_average(prompts, weights)
        state["W"] = self.solve(total, count)
        return state

    def evaluate(self, state: State) -> dict[str, Any]:
        self.model.set_prompts(state["prompts"].to(self.fabric.device))
        return super().evaluate(state)

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {"num_prompts": self.config.num_prompts, "restat": self.config.restat, **super().summary_extras(state)}
