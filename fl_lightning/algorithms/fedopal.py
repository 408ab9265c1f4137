"""FedOPAL: one-shot federated learning via analytic visual prompt tuning.

Client k (Eq. (6)): starting from the shared P_init, train M VPT-shallow prompts P_k and a temporary
linear head with cross-entropy + mu/2·||P_k − P_init||² for E epochs; then, with P_k frozen, stream
its data once to accumulate R_k = Σ h hᵀ and C_k = Σ h yᵀ (Eq. (7)) of the prompt-rectified
features h. It uploads P_k, the upper triangle of R_k, C_k and N_k.

Server: P_global = mean_k P_k (Eq. (8); ``weighted`` by N_k as an option) and
W* = (Σ_k R_k + λI)⁻¹ Σ_k C_k (Eq. (9)). Inference uses P_global and W* (Eq. (10)). One round,
zero server training.

Beyond the paper, ``fedopal.restat: global`` adds a second round in which every client recomputes
its statistics under P_global, so that W* is solved on the very features used at inference. Round 0
still reports the faithful FedOPAL result, so metrics.csv shows both.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric import Fabric
from torch import Tensor

from fl_lightning.algorithms.common import evaluate_on_test, frozen_backbone
from fl_lightning.analytic import AnalyticStatistics, regularization, solve_classifier
from fl_lightning.callbacks.proximal import ProximalCallback
from fl_lightning.federation.aggregate import weighted_average
from fl_lightning.federation.algorithm import Algorithm, Client, Environment, InputSpec, State, register
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.placement import client_seed
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.models.vpt import PromptedViT
from fl_lightning.modules.prompt_tuning import PromptTuningModule
from fl_lightning.modules.statistics import collect_statistics

__all__ = ["FedOPAL"]


@register("fedopal")
class FedOPAL(Algorithm):
    def _num_prompts(self) -> int:
        return self.cfg.fedopal.num_prompts

    def _local_epochs(self) -> int:
        return self.cfg.train.epochs if self._num_prompts() > 0 else 0

    @property
    def num_rounds(self) -> int:
        return 2 if self.cfg.fedopal.restat == "global" else 1

    # -- set-up ----------------------------------------------------------------------------------
    def build(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.backbone = frozen_backbone(self.cfg)
        self.model = PromptedViT(self.backbone, num_prompts=self._num_prompts(), seed=self.cfg.fedopal.prompt_seed)
        self.p_init = self.model.get_prompts().detach().cpu().clone()  # identical on every client and rank

    def input_spec(self) -> InputSpec:
        return InputSpec.of_backbone(self.backbone, self.cfg.data.image_size)

    def setup(self, env: Environment) -> None:
        super().setup(env)
        t = self.cfg.train
        self.module = PromptTuningModule(model=self.model, num_classes=env.num_classes, optimizer=t.optimizer,
                                         lr=t.lr, weight_decay=t.weight_decay, momentum=t.momentum,
                                         head_seed=self.cfg.seed)
        self.module = self.fabric.to_device(self.module)
        self._head_init = {k: v.detach().clone() for k, v in self.module.head.state_dict().items()}
        self._dtype = getattr(torch, self.cfg.analytic.dtype)

    def initial_state(self) -> State:
        return {"prompts": self.p_init.clone()}

    # -- client ----------------------------------------------------------------------------------
    def plan(self, round_idx: int, clients: Any, state: State, history: Any) -> dict[int, Download]:
        # round 0: the shared P_init; restat round: P_global. Prompts are all a client needs.
        return {c: Download({"prompts": state["prompts"]}) for c in clients}

    def _statistics(self, client: Client) -> AnalyticStatistics:
        loader = self.env.loader(client.dataset, shuffle=False)
        return collect_statistics(self.model, loader, num_classes=self.env.num_classes, device=self.fabric.device,
                                  dtype=self._dtype, autocast=self.fabric.autocast,
                                  feature_dim=self.model.feature_dim)

    def _train_prompts(self, round_idx: int, client: Client, p_init: Tensor) -> None:
        """Eq. (6): prompts + a fresh temporary head, cross-entropy + proximal term towards P_init."""
        self.module.head.load_state_dict(self._head_init)
        epochs = self._local_epochs()
        if epochs == 0 or client.num_samples == 0:
            return
        loader = self.env.loader(client.dataset, shuffle=True, batch_size=self.cfg.train.batch_size,
                                 seed=client_seed(self.cfg.seed, round_idx, client.index))
        proximal = ProximalCallback(mu=self.cfg.fedopal.mu,
                                    reference={PromptTuningModule.prompt_parameter_name: p_init})
        fit_local(self.fabric, self.module, loader, epochs=epochs, callbacks=[proximal])

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        prompts = download.tensors["prompts"]
        self.model.set_prompts(prompts)
        tensors: dict[str, Tensor] = {}
        if round_idx == 0:
            self._train_prompts(round_idx, client, prompts)
            tensors["prompts"] = self.model.get_prompts().detach().cpu().clone()
        stats = self._statistics(client)
        tensors.update({"R_upper": stats.upper_triangle().cpu(), "C": stats.C.cpu()})
        return Upload(tensors, {"num_samples": int(stats.N)})

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        d, c = self.model.feature_dim, self.env.num_classes
        shapes = {"R_upper": (d * (d + 1) // 2,), "C": (d, c)}
        if round_idx == 0:
            shapes["prompts"] = tuple(download.tensors["prompts"].shape)
        return shapes

    # -- server ----------------------------------------------------------------------------------
    def aggregate(self, round_idx: int, state: State, uploads: dict[int, Upload], failures: dict[int, str]) -> State:
        if not uploads:
            raise RuntimeError(f"round {round_idx}: no client uploaded statistics; nothing to solve")
        ups = list(uploads.values())
        state = dict(state)
        if round_idx == 0:  # Eq. (8)
            weights = [u.meta["num_samples"] if self.cfg.fedopal.prompt_aggregation == "weighted" else 1.0
                       for u in ups]
            state["prompts"] = weighted_average([u.tensors["prompts"] for u in ups], weights)
        total = sum(AnalyticStatistics.from_upper(u.tensors["R_upper"], u.tensors["C"], int(u.meta["num_samples"]))
                    for u in ups)
        a = self.cfg.analytic
        lam = regularization(a.lam, num_clients=len(ups), convention=a.regularization,
                             remove=a.remove_regularization)
        state["W"] = solve_classifier(total.R, total.C, lam=lam)  # Eq. (9), float64
        return state

    def _logits(self, images: Tensor) -> Tensor:  # Eq. (10)
        with self.fabric.autocast():
            h = self.model(images)
        return (h.to(self._W.dtype) @ self._W).float()

    def evaluate(self, state: State) -> dict[str, Any]:
        self.model.set_prompts(state["prompts"].to(self.fabric.device))
        self._W = state["W"].to(self.fabric.device)
        return evaluate_on_test(self.env, self._logits)

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {"num_prompts": self._num_prompts(), "restat": self.cfg.fedopal.restat,
                "feature_dim": int(state["W"].shape[0]) if "W" in state else None}
