"""FedAvg (McMahan et al. 2017) of VPT prompts plus a linear head on a frozen CLIP: "FedAvg (CLIP)".

FedOPAL's comparison trains the same parameters as FedOPAL's clients — M VPT-shallow prompt tokens
P ∈ R^{M×D} (FedOPAL Eq. (4)-(5)) and a linear head W, b — but aggregates them by multi-round
FedAvg instead of the analytic solve. Each round, the sampled clients load the global (P, W, b),
train them for ``train.epochs`` epochs with cross-entropy (``train.*``: optimizer, lr, momentum, weight
decay, batch size; no proximal term), and upload them with their sample count; the server averages
each tensor, weighted by n_k (``fedavg_prompts.weighted``) or plainly.

Backbone: ``model.*``, frozen and never sent — the paper's is OpenAI CLIP ViT-B/16 (``library:
open_clip``); any timm ViT works too. The prompted model and the client module are FedOPAL's own
(:class:`~fl_lightning.models.vpt.PromptedViT`, :class:`~fl_lightning.modules.prompt_tuning.PromptTuningModule`).
P starts from FedOPAL's P_init (``prompt_seed``) and the head from ``seed``, identical on every rank.
The head-only variant is the ``fedavg`` method. Core keys not used: none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from fl_lightning.algorithms.common import evaluate_on_test, held_backbone, prompt_tuning_module, require_vit
from fl_lightning.errors import check
from fl_lightning.federation.aggregate import mean_of_uploads
from fl_lightning.federation.algorithm import Algorithm, Client, Environment, InputSpec, RoundPlan, State, every_key, register
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.policies.privacy_coverage import gap_by, weights_only
from fl_lightning.federation.transport import Download, Upload

if TYPE_CHECKING:
    from lightning.fabric import Fabric


__all__ = ["FedAvgPrompts", "FedAvgPromptsConfig"]

_HEAD = ("head.weight", "head.bias")


@dataclass
class FedAvgPromptsConfig:
    num_prompts: int = 10  # M prompt tokens, as FedOPAL's clients
    prompt_seed: int = 0  # P_init, identical on every client (FedOPAL's)
    weighted: bool = True  # weight clients by their sample counts (McMahan et al.)

    def __post_init__(self) -> None:
        check(self.num_prompts >= 1, "num_prompts", self.num_prompts, "an int >= 1 (head only: algorithm fedavg)")


@register("fedavg_prompts", renamed_from=("fedavg_clip",))  # any ViT, not CLIP only
class FedAvgPrompts(Algorithm):
    averages_weights = True  # aggregate(): the weighted mean of its uploads (federation/policies/order.py)
    config_class = FedAvgPromptsConfig
    averaged_keys = every_key  # every key of the state (the prompts and the head) is the uploads' weighted mean

    # federation.privacy: DP-FedAvg covers the prompts and head a client uploads
    # (federation/policies/privacy_coverage.py).
    privacy_gap = gap_by(weights_only)

    true_precision = "its prompts and head keep float32 master weights (prompt tuning in bf16-mixed)"
    shared_evaluation = True  # evaluate(state) is the test split through common.py: every rank its shard
    federated_evaluation = True  # the global model through common.py: the clients' test rows too

    def build(self, fabric: Fabric) -> None:
        from fl_lightning.models.vpt import PromptedViT

        self.backbone = require_vit(self.cfg, held_backbone(self.cfg, fabric))  # CUDA + mixed: bf16/fp16
        self.model = PromptedViT(self.backbone, num_prompts=self.config.num_prompts, seed=self.config.prompt_seed)

    def input_spec(self) -> InputSpec:
        return InputSpec.of_backbone(self.backbone, self.cfg.data.image_size)

    def setup(self, env: Environment) -> None:
        super().setup(env)
        self.module = self.fabric.to_device(prompt_tuning_module(self.model, env.num_classes, self.cfg))
        self._initial = self._trainable()

    def _trainable(self) -> State:
        """What a client trains and uploads: P (M, D), W (C, d), b (C,)."""
        head = self.module.head.state_dict()
        return {"prompts": self.model.get_prompts().cpu(), **{k: head[k.split(".")[1]].detach().cpu().clone() for k in _HEAD}}

    def _load(self, tensors: Mapping[str, Tensor]) -> None:
        self.model.set_prompts(tensors["prompts"].to(self.fabric.device))
        self.module.head.load_state_dict({k.split(".")[1]: tensors[k].to(self.fabric.device) for k in _HEAD})

    def initial_state(self) -> State:
        return {k: v.clone() for k, v in self._initial.items()}

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self._initial.items()}

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        self._load(download.tensors)
        if client.num_samples and self.cfg.train.epochs:
            loader = self.env.client_loader(client, round_idx)
            fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs)
        return Upload(self._trainable(), {"num_samples": client.num_samples})

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        return mean_of_uploads(state, uploads, weighted=self.config.weighted)

    def evaluate(self, state: State) -> dict[str, Any]:
        self._load(state)
        self.module.eval()
        return evaluate_on_test(self.env, self.module)

    def summary_extras(self, state: State) -> dict[str, Any]:
        m = self.cfg.model
        return {"backbone": f"{m.library} {m.name}", "num_prompts": self.config.num_prompts}
