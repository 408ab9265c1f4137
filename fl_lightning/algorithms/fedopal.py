"""FedOPAL: one-shot federated learning via analytic visual prompt tuning — AFL plus prompts.

Client k (Eq. (6)): starting from the shared P_init, train M VPT-shallow prompts P_k and a temporary
linear head with cross-entropy + mu/2·||P_k − P_init||² for ``train.epochs`` epochs (optimizer, lr,
momentum, weight decay and batch size from ``train.*``); then, with P_k frozen, stream its data once
to accumulate R_k = Σ h hᵀ and C_k = Σ h yᵀ (Eq. (7)) of the prompt-rectified features h. It uploads
P_k, the upper triangle of R_k, C_k and N_k.

Server: P_global = mean_k P_k (Eq. (8); ``weighted`` by N_k as an option) and
W* = (Σ_k R_k + λI)⁻¹ Σ_k C_k (Eq. (9), AFL's solve: :class:`~fl_lightning.algorithms.afl.AnalyticHead`).
Inference uses P_global and W* (Eq. (10)). One round, zero server training.

Settings — what the paper gives and what is ours. The paper (§IV-A): K = 10 clients, Dirichlet
α ∈ {0.01, 0.1, 1, 10}, E = 5 local epochs, μ = 0.1, λ = 1e-6, M = 10 prompts, a frozen CLIP ViT-B/16,
h = "the class token state at the last layer". Our choices where it is silent or ambiguous, in the
configs (``conf/fedopal_*.yaml``): SGD with lr 0.01, momentum 0.9, batch 64, no augmentation (the CLIP
preprocessing only), and h = the 512-d projected CLIP image embedding (``model.feature: proj``, the
default). ``model.feature`` also offers ``pre_proj`` (the 768-d ``ln_post(CLS)``) and ``cls`` (the last
block's CLS state itself, before ``ln_post``: the paper's words read literally). The Table configs keep
``proj``: it is CLIP's trained image-embedding space, its statistics are (512/768)² ≈ 0.44 of the size,
and it is what every number in this repository so far was measured with.

Stages: FedOPAL = one round of :class:`PromptsWithStatistics` (Eq. (6)-(9)). Beyond the paper,
``fedopal.restat: global`` adds a :class:`Statistics` round (AFL's, under P_global) in which every
client recomputes its statistics under P_global, so that W* is solved on the very features used at
inference. Round 0 still reports the faithful FedOPAL result, so metrics.csv shows both. FedOPAL+
(``fedopal_plus.py``) declares prompts first, then statistics.

Parts: FedOPAL *holds* AFL's :class:`~fl_lightning.algorithms.afl.AnalyticHead` (Eq. (7) streamed, the
fold over the uploads, Eq. (9), Eq. (10)) and a :class:`PromptTrainer` (the prompted ViT and Eq. (6));
the method hands both to each stage, and a stage's ``client_update`` and ``aggregate`` read straight
through: one client of FedOPAL is :meth:`PromptsWithStatistics.client_update`, :meth:`PromptTrainer.tune`
and :meth:`PromptTrainer.statistics`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from torch import Tensor

from fl_lightning.algorithms.afl import AFLConfig, AnalyticHead
from fl_lightning.algorithms.common import held_backbone, prompt_tuning_module, require_vit
from fl_lightning.analytic import AnalyticStatistics
from fl_lightning.callbacks.proximal import ProximalCallback
from fl_lightning.errors import check
from fl_lightning.federation.aggregate import weighted_average
from fl_lightning.federation.algorithm import Client, Environment, InputSpec, RoundHistory, RoundPlan, State, register
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.stages import Stage, StagedAlgorithm
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.models.backbones import ViTBackbone
from fl_lightning.models.vpt import PromptedViT
from fl_lightning.modules.prompt_tuning import PromptTuningModule

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fl_lightning.config import RunConfig

__all__ = [
    "FedOPAL",
    "FedOPALConfig",
    "AnalyticStage",
    "PromptTrainer",
    "PromptVotes",
    "PromptsWithStatistics",
    "Statistics",
    "aggregate_prompts",
]


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


def aggregate_prompts(prompts: Sequence[Tensor], weights: Sequence[float], p_init: Tensor) -> Tensor:
    """Eq. (8) over the voting clients: Σ_k w_k P_k / Σ_k w_k (``weighted_average``), or P_init when none votes.

    Args:
        prompts: the voters' P_k, each (M, D).
        weights: w_k >= 0 with a positive sum (1 for the plain mean, N_k for the weighted one).
        p_init: (M, D), returned (as a copy) when ``prompts`` is empty.

    Returns:
        P_global, (M, D), in ``p_init``'s dtype; accumulated in float64.
    """
    if len(prompts) != len(weights):
        raise ValueError(f"{len(prompts)} prompts but {len(weights)} weights")
    if not prompts:
        return p_init.clone()
    for p in prompts:
        if tuple(p.shape) != tuple(p_init.shape):
            raise ValueError(f"prompts of shape {tuple(p.shape)} do not fit {tuple(p_init.shape)}")
    return weighted_average([p.detach().cpu() for p in prompts], weights).to(p_init.dtype)


class PromptTrainer:
    """A FedOPAL client's model: the frozen backbone, the prompted ViT over it and Eq. (6) — set the downloaded P,
    tune it with a fresh temporary head, read P_k back — and Eq. (7) under the prompts it holds (its
    :class:`~fl_lightning.algorithms.afl.AnalyticHead`). Built empty with the method; :meth:`setup` hands it the
    run's Fabric, environment and models."""

    def __init__(self, cfg: RunConfig, config: FedOPALConfig, head: AnalyticHead) -> None:
        self.cfg, self.config, self.head = cfg, config, head

    def setup(self, fabric: Fabric, env: Environment, backbone: ViTBackbone, model: PromptedViT) -> None:
        self.fabric, self.env, self.backbone, self.model = fabric, env, backbone, model
        self.module = prompt_tuning_module(model, env.num_classes, self.cfg)
        self.module = fabric.to_device(self.module)
        self._head_init = {k: v.detach().clone() for k, v in self.module.head.state_dict().items()}

    def tune(self, round_idx: int, client: Client, prompts: Tensor, *, train: bool = True) -> Tensor:
        """P_k of one client: Eq. (6) from the downloaded ``prompts`` — a fresh temporary head, cross-entropy plus
        the proximal term towards them for ``train.epochs`` — or the downloaded P itself (``train`` False)."""
        self.model.set_prompts(prompts)
        if train:
            self.module.head.load_state_dict(self._head_init)
        if train and self.cfg.train.epochs > 0 and client.num_samples > 0:
            dp_sgd = self.env.dp_sgd(round_idx, client)  # federation.privacy.dp_sgd: Poisson lots (docs/privacy.md)
            loader = self.env.client_loader(client, round_idx, dp_sgd=dp_sgd)
            proximal = ProximalCallback(mu=self.config.mu, reference={PromptTuningModule.prompt_parameter_name: prompts})
            fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs, callbacks=[proximal], dp_sgd=dp_sgd)
        return self.model.get_prompts().detach().cpu().clone()

    def statistics(self, client: Client) -> AnalyticStatistics:
        """Eq. (7) of the client's data under the prompts the model holds, streamed through the prompted ViT."""
        return self.head.statistics(self.model, self.env.loader(client.dataset, shuffle=False), autocast=self.fabric.autocast)


class PromptVotes:
    """Eq. (8) collected on the way through the uploads (one pass, one upload in memory at a time): each voter's P_k
    and its weight (1, or N_k for ``prompt_aggregation: weighted``); :meth:`mean` is P_global."""

    def __init__(self, config: FedOPALConfig) -> None:
        self.weighted = config.prompt_aggregation == "weighted"
        self.prompts: list[Tensor] = []
        self.weights: list[float] = []

    def __call__(self, upload: Upload) -> None:
        self.prompts.append(upload.tensors["prompts"])
        self.weights.append(float(upload.meta["num_samples"]) if self.weighted else 1.0)

    def mean(self, p_init: Tensor) -> Tensor:
        return aggregate_prompts(self.prompts, self.weights, p_init.cpu())


class AnalyticStage(Stage):
    """A stage of FedOPAL (and FedOPAL+), handed its collaborators by the method (:meth:`FedOPAL.make_stage`): the
    method's section, the client's :class:`PromptTrainer` and the :class:`~fl_lightning.algorithms.afl.AnalyticHead`
    — it never reaches into the method itself. A stage uses only those of them its rounds need (the server's
    part: the section and the head's fold and solve). Every client downloads P_global, all it needs."""

    def __init__(
        self, first_round: int, *, config: FedOPALConfig, trainer: PromptTrainer | None, head: AnalyticHead | None
    ) -> None:
        super().__init__(None, first_round)
        self.config, self.trainer, self.head = config, trainer, head

    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        return RoundPlan({c: Download({"prompts": state["prompts"]}) for c in clients})


class PromptsWithStatistics(AnalyticStage):
    """FedOPAL's one shot: each client tunes P_k (Eq. (6)) and uploads it with R_k, C_k under its own P_k (Eq. (7));
    the server averages the P_k (Eq. (8)) and solves W* (Eq. (9)) in one pass over the uploads."""

    config_class = FedOPALConfig

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        p_k = self.trainer.tune(round_idx, client, download.tensors["prompts"])
        return self.head.upload(self.trainer.statistics(client), {"prompts": p_k}, num_samples=int(client.num_samples))

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return {**self.head.shapes(), "prompts": tuple(download.tensors["prompts"].shape)}

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        if not uploads:
            raise RuntimeError(f"round {round_idx}: no client uploaded anything")
        votes = PromptVotes(self.config)
        total, count = self.head.fold(round_idx, uploads, votes)
        return {**state, "prompts": votes.mean(state["prompts"]), "W": self.head.solve(total, count)}


class Statistics(AnalyticStage):
    """AFL's round under the global prompts: R_k, C_k of Eq. (7) under P_global → W* of Eq. (9)."""

    config_class = AFLConfig

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        self.trainer.tune(round_idx, client, download.tensors["prompts"], train=False)
        return self.head.upload(self.trainer.statistics(client))

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return self.head.shapes()

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        return self.head.solved(state, round_idx, uploads)


@register("fedopal")
class FedOPAL(StagedAlgorithm):
    """Prompts and AFL's analytic head: the stages of ``restat`` (see the module docstring), each handed the
    method's :class:`PromptTrainer` and :class:`~fl_lightning.algorithms.afl.AnalyticHead`."""

    config_class = FedOPALConfig
    schedules = {"local": (PromptsWithStatistics,), "global": (PromptsWithStatistics, Statistics)}  # by restat
    true_precision = AnalyticHead.true_precision
    shared_evaluation = True  # evaluate(state) is the test split through common.py: every rank its shard
    federated_evaluation = True  # P_global and W* through evaluate_on_test: the clients' test rows read by the prompted ViT

    @classmethod
    def privacy_gap(cls, cfg: RunConfig) -> str | None:
        """federation.privacy: the statistics mechanisms cover P_k by DP-SGD (``dp_sgd: true``) and R_k, C_k
        under them (adaptive composition, one σ); a prompt weight is never a client's count (federation/policies/privacy.py)."""
        p = cfg.federation.privacy
        if p.mechanism == "dp_fedavg":
            return "it uploads R_k, C_k beside its prompts, which dp_fedavg neither clips nor noises"
        if not p.dp_sgd:
            return (
                "its prompts P_k are trained on the records without DP-SGD and R_k, C_k are computed under them, "
                "so one record moves every feature (set federation.privacy.dp_sgd: true)"
            )
        return None

    @classmethod
    def stages_for(cls, config: FedOPALConfig) -> tuple[type[Stage], ...]:
        return cls.schedules[config.restat]

    def __init__(self, *, cfg: RunConfig) -> None:
        config = cfg.method if cfg.method is not None else self.config_class()
        self.head = AnalyticHead(config, cfg.federation.privacy)  # Eq. (7), the fold and Eq. (9)
        self.trainer = PromptTrainer(cfg, config, self.head)  # Eq. (6) and Eq. (7) on a client
        super().__init__(cfg=cfg)

    def make_stage(self, stage_class: type[Stage], first_round: int) -> Stage:
        """Each stage is handed its collaborators: the section, the prompt trainer and the analytic head."""
        return stage_class(first_round, config=self.config, trainer=self.trainer, head=self.head)

    # -- set-up ----------------------------------------------------------------------------------
    def build(self, fabric: Fabric) -> None:
        self.backbone = held_backbone(self.cfg, fabric)  # CUDA + mixed: in bf16/fp16 (its prompts float32)
        self.model = PromptedViT(
            require_vit(self.cfg, self.backbone), num_prompts=self.config.num_prompts, seed=self.config.prompt_seed
        )
        self.p_init = self.model.get_prompts().detach().cpu().clone()  # identical on every client and rank

    def input_spec(self) -> InputSpec:
        return InputSpec.of_backbone(self.backbone, self.cfg.data.image_size)

    def setup(self, env: Environment) -> None:
        self.env = env
        self.trainer.setup(self.fabric, env, self.backbone, self.model)
        self.model = self.fabric.to_device(self.model)
        self.head.setup(feature_dim=self.backbone.feature_dim, num_classes=env.num_classes, device=self.fabric.device)

    def initial_state(self) -> State:
        return {"prompts": self.p_init.clone()}

    # -- server ----------------------------------------------------------------------------------
    def evaluate(self, state: State) -> dict[str, Any]:
        """Eq. (10): P_global and W*; FedOPAL+'s AFL head (``head`` 0) reads the prompt-free backbone instead."""
        if "W" not in state:  # after a prompts-only round there is no classifier yet
            return {}
        self.model.set_prompts(state["prompts"].to(self.fabric.device))
        features = self.backbone if int(state.get("head", 1)) == 0 else self.model
        return self.head.evaluate(self.env, features, state["W"])

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {
            "num_prompts": self.config.num_prompts,
            "restat": self.config.restat,
            "feature_dim": int(state["W"].shape[0]) if "W" in state else None,
        }
