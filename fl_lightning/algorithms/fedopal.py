"""FedOPAL: one-shot federated learning via analytic visual prompt tuning — AFL plus prompts.

Client k (Eq. (6)): starting from the shared P_init, train M VPT-shallow prompts P_k and a temporary
linear head with cross-entropy + mu/2·||P_k − P_init||² for ``train.epochs`` epochs (optimizer, lr,
momentum, weight decay and batch size from ``train.*``); then, with P_k frozen, stream its data once
to accumulate R_k = Σ h hᵀ and C_k = Σ h yᵀ (Eq. (7)) of the prompt-rectified features h. It uploads
P_k, the upper triangle of R_k, C_k and N_k.

Server: P_global = mean_k P_k (Eq. (8); ``weighted`` by N_k as an option) and
W* = (Σ_k R_k + λI)⁻¹ Σ_k C_k (Eq. (9), :class:`~fl_lightning.algorithms.afl.AFL`'s solve).
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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from torch import Tensor, nn

from fl_lightning.algorithms.afl import AFL, AFLConfig
from fl_lightning.algorithms.common import require_vit
from fl_lightning.analytic import AnalyticStatistics
from fl_lightning.callbacks.proximal import ProximalCallback
from fl_lightning.errors import check
from fl_lightning.federation.aggregate import weighted_average
from fl_lightning.federation.algorithm import Client, Environment, RoundHistory, RoundPlan, State, register
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.placement import client_seed
from fl_lightning.federation.stages import Stage, StagedAlgorithm
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.models.backbones import ViTBackbone
from fl_lightning.models.vpt import PromptedViT
from fl_lightning.modules.prompt_tuning import PromptTuningModule

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["FedOPAL", "FedOPALConfig", "AnalyticStage", "PromptTrainer", "StatisticsCollector", "StatisticsSolver",
           "PromptTuning", "PromptsWithStatistics", "Statistics", "aggregate_prompts"]


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


class PromptTrainer(Protocol):
    """What a prompt stage works with on a client: the prompted model's P and Eq. (6) (FedOPAL itself)."""

    def set_prompts(self, prompts: Tensor) -> None: ...

    def get_prompts(self) -> Tensor: ...

    def train_prompts(self, round_idx: int, client: Client, p_init: Tensor) -> None: ...


class StatisticsCollector(Protocol):
    """Eq. (7) on a client, under the prompts set last, and its upload (AFL's, on FedOPAL)."""

    def statistics(self, client: Client) -> AnalyticStatistics: ...

    def statistics_upload(self, stats: AnalyticStatistics, first: dict[str, Tensor] | None = None,
                          **meta: int) -> Upload: ...

    def statistics_shapes(self) -> dict[str, tuple[int, ...]]: ...


class StatisticsSolver(Protocol):
    """The server's Σ_k (R_k, C_k) and Eq. (9) (AFL's, on FedOPAL)."""

    def fold_statistics(self, round_idx: int, uploads: Mapping[int, Upload],
                        visit: Callable[[Upload], None] | None = None) -> tuple[AnalyticStatistics, int]: ...

    def solve(self, total: AnalyticStatistics, num_clients: int) -> Tensor: ...


class AnalyticStage(Stage):
    """A stage of FedOPAL (and FedOPAL+), handed its collaborators by the method (:meth:`FedOPAL.make_stage`):
    the method's section, the prompt trainer, the statistics collector and the solver — it never reaches into
    the method itself. A stage uses only those of them its rounds need (the server-only ones: none)."""

    def __init__(self, first_round: int, *, config: FedOPALConfig, trainer: PromptTrainer,
                 collector: StatisticsCollector, solver: StatisticsSolver) -> None:
        super().__init__(None, first_round)
        self.config, self.trainer, self.collector, self.solver = config, trainer, collector, solver

    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        return RoundPlan({c: Download({"prompts": state["prompts"]}) for c in clients})  # all a client needs


class Statistics(AnalyticStage):
    """AFL's round under the global prompts: R_k, C_k of Eq. (7) under P_global → W* of Eq. (9)."""

    config_class = AFLConfig

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        self.trainer.set_prompts(download.tensors["prompts"])
        return self.collector.statistics_upload(self.collector.statistics(client))

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return self.collector.statistics_shapes()

    def aggregate(self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str],
                  plan: RoundPlan) -> State:
        total, count = self.solver.fold_statistics(round_idx, uploads)
        return {**state, "W": self.solver.solve(total, count)}


class PromptTuning(AnalyticStage):
    """Eq. (6) on the clients (from the downloaded prompts), Eq. (8) on the server over the voters' P_k."""

    config_class = FedOPALConfig

    def trains(self, client: Client) -> bool:
        """Whether the client tunes its prompts (and its P_k votes in Eq. (8))."""
        return True

    def meta(self, client: Client, trains: bool) -> dict[str, int]:
        """The scalars an upload carries besides its tensors."""
        return {"num_samples": int(client.num_samples)}

    def upload(self, client: Client, prompts: dict[str, Tensor], trains: bool) -> Upload:
        return Upload(prompts, self.meta(client, trains))

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        prompts = download.tensors["prompts"]
        self.trainer.set_prompts(prompts)
        trains = self.trains(client)
        if trains:
            self.trainer.train_prompts(round_idx, client, prompts)  # Eq. (6)
        return self.upload(client, {"prompts": self.trainer.get_prompts().detach().cpu().clone()}, trains)

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return {"prompts": tuple(download.tensors["prompts"].shape)}

    def votes(self, upload: Upload) -> bool:
        return True

    def prompt_state(self, prompts: list[Tensor], weights: list[float], state: State) -> State:
        """The global state's prompt entries after Eq. (8)."""
        return {"prompts": aggregate_prompts(prompts, weights, state["prompts"].cpu())}

    def fold(self, round_idx: int, uploads: Mapping[int, Upload], visit: Callable[[Upload], None]) -> State:
        """One pass over the uploads (``visit`` collects the prompts); what else this stage solves."""
        for upload in uploads.values():
            visit(upload)
        return {}

    def aggregate(self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str],
                  plan: RoundPlan) -> State:
        if not uploads:
            raise RuntimeError(f"round {round_idx}: no client uploaded anything")
        weighted = self.config.prompt_aggregation == "weighted"
        prompts: list[Tensor] = []
        weights: list[float] = []

        def vote(upload: Upload) -> None:
            if self.votes(upload):
                prompts.append(upload.tensors["prompts"])
                weights.append(float(upload.meta["num_samples"]) if weighted else 1.0)

        solved = self.fold(round_idx, uploads, vote)
        return {**state, **self.prompt_state(prompts, weights, state), **solved}


class PromptsWithStatistics(PromptTuning):
    """FedOPAL's one shot: P_k, then R_k, C_k under the client's own P_k; the server solves W* too (Eq. (9))."""

    def upload(self, client: Client, prompts: dict[str, Tensor], trains: bool) -> Upload:
        return self.collector.statistics_upload(self.collector.statistics(client), prompts, **self.meta(client, trains))

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return {**self.collector.statistics_shapes(), **super().expected_shapes(round_idx, download)}

    def fold(self, round_idx: int, uploads: Mapping[int, Upload], visit: Callable[[Upload], None]) -> State:
        total, count = self.solver.fold_statistics(round_idx, uploads, visit)
        return {"W": self.solver.solve(total, count)}


@register("fedopal")
class FedOPAL(StagedAlgorithm, AFL):
    """AFL plus prompts: the stages of ``restat`` (see the module docstring)."""

    config_class = FedOPALConfig
    schedules = {"local": (PromptsWithStatistics,), "global": (PromptsWithStatistics, Statistics)}  # by restat

    @classmethod
    def privacy_gap(cls, cfg: RunConfig) -> str | None:
        """federation.privacy: the statistics mechanisms cover P_k by DP-SGD (``dp_sgd: true``) and R_k, C_k
        under them (adaptive composition, one σ); a prompt weight is never a client's count (federation/privacy.py)."""
        p = cfg.federation.privacy
        if p.mechanism == "dp_fedavg":
            return "it uploads R_k, C_k beside its prompts, which dp_fedavg neither clips nor noises"
        if not p.dp_sgd:
            return ("its prompts P_k are trained on the records without DP-SGD and R_k, C_k are computed under them, "
                    "so one record moves every feature (set federation.privacy.dp_sgd: true)")
        return None

    @classmethod
    def stages_for(cls, config: FedOPALConfig) -> tuple[type[Stage], ...]:
        return cls.schedules[config.restat]

    def make_stage(self, stage_class: type[Stage], first_round: int) -> Stage:
        """Each stage is handed its collaborators: this method is the prompt trainer (its prompted model and
        Eq. (6)), the statistics collector (AFL's Eq. (7)) and the solver (Eq. (9))."""
        return stage_class(first_round, config=self.config, trainer=self, collector=self, solver=self)

    # -- set-up ----------------------------------------------------------------------------------
    def feature_model(self, backbone: ViTBackbone) -> nn.Module:
        model = PromptedViT(require_vit(self.cfg, backbone), num_prompts=self.config.num_prompts, seed=self.config.prompt_seed)
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

    def set_prompts(self, prompts: Tensor) -> None:
        self.model.set_prompts(prompts)

    def get_prompts(self) -> Tensor:
        return self.model.get_prompts()

    def train_prompts(self, round_idx: int, client: Client, p_init: Tensor) -> None:
        """Eq. (6): prompts + a fresh temporary head, cross-entropy + proximal term towards P_init."""
        self.module.head.load_state_dict(self._head_init)
        if self.cfg.train.epochs == 0 or client.num_samples == 0:
            return
        dp_sgd = self.env.dp_sgd(round_idx, client)  # federation.privacy.dp_sgd: Poisson lots (docs/privacy.md)
        loader = self.env.loader(client.dataset, shuffle=True, batch_size=self.cfg.train.batch_size,
                                 seed=client_seed(self.cfg.seed, round_idx, client.index), dp_sgd=dp_sgd)
        proximal = ProximalCallback(mu=self.config.mu, reference={PromptTuningModule.prompt_parameter_name: p_init})
        fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs, callbacks=[proximal], dp_sgd=dp_sgd)

    # -- server ----------------------------------------------------------------------------------
    def evaluate(self, state: State) -> dict[str, Any]:
        if "W" not in state:  # after a prompts-only round there is no classifier yet
            return {}
        self.model.set_prompts(state["prompts"].to(self.fabric.device))
        return super().evaluate(state)

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {"num_prompts": self.config.num_prompts, "restat": self.config.restat, **super().summary_extras(state)}
