"""AFL (analytic federated learning, He et al. 2024): one round, no local training, exact.

Each client streams its data once through the frozen backbone and uploads the sufficient statistics
R_k = Σ h hᵀ (upper triangle) and C_k = Σ h yᵀ of its features h (FedOPAL's Eq. (7) without
prompts); the server solves the ridge regression W = (Σ_k R_k + λ_total·I)⁻¹ Σ_k C_k (Eq. (9)).
The federated W equals the centralized ridge solution on the same features for any number of
clients, partition and client order (tests), so AFL's accuracy does not depend on α.

Backbone: ``model.*``, any frozen backbone the framework builds: a ViT's CLS feature, or a timm CNN's
pooled pre-logit features (``model: {library: timm, name: resnet18}``, :mod:`fl_lightning.models.cnn_backbone`).
AFL's paper and official code (ZHUANGHP/Analytic-federated-learning, ``main.py``) use an ImageNet
ResNet-18 (torchvision weights, images resized to 224 px, the 512-d pooled features); FedOPAL's
comparison reports AFL on that backbone (its 82.50 on CIFAR-10 fits ResNet features) — the Table I–II
configs carry both that row and AFL on FedOPAL's CLIP ViT-B/16 (``conf/fedopal_table2_*.yaml``).
Core keys not used: ``train.*`` (there is no local training) and ``federation.rounds`` (one round).

Regularisation conventions (``afl.regularization``): ``once`` adds λ to the aggregate as FedOPAL's
Eq. (9); ``per_client`` follows AFL's published code, where every client adds γI so the aggregate
carries K·γ·I; ``remove_regularization: true`` takes it back out (the exact, or least-norm,
unregularised solution).

The server folds the uploads one at a time in client order (a sum: memory flat in K, bit-identical
for any number of ranks). Eq. (7)-(10) are one part, :class:`AnalyticHead` (a client's statistics and
their upload, the fold, the solve, the test images' logits), which AFL holds; FedCGS, FedOPAL and
FedOPAL+ (``fedopal.py``, ``fedopal_plus.py``) hold one too, FedOPAL with prompts in front of it.

The frozen backbone's features of the training and test splits are computed once per comparison
(``data.feature_cache``, :class:`~fl_lightning.algorithms.common.FrozenFeatures`): a client reads its
rows of the training split's table in its own batches, so a rank holds that table (N × d) rather than
streaming images. FedOPAL, whose prompts change the features, streams its images through the prompted ViT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager, Literal

import torch
from torch import Tensor

from fl_lightning.algorithms.common import client_feature_batches, evaluate_on_test
from fl_lightning.algorithms.feature_table import OneShotFeatureMethod
from fl_lightning.analytic import AnalyticStatistics, StatisticsSum, logits, regularization, solve_classifier
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import Client, Environment, RoundPlan, State, register
from fl_lightning.federation.policies.privacy_coverage import gap_by, statistics_only
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.modules.statistics import collect_statistics

if TYPE_CHECKING:
    from fl_lightning.config import PrivacyConfig, RunConfig

__all__ = ["AFL", "AFLConfig", "AnalyticHead"]


@dataclass
class AFLConfig:
    lam: float = 1e-6  # λ of Eq. (9)
    regularization: Literal["once", "per_client"] = "once"  # FedOPAL adds λ once; AFL's code K·γ
    remove_regularization: bool = False  # AFL's option to take the per-client γ back out
    dtype: Literal["float64", "float32"] = "float64"  # accumulation and solve precision

    def __post_init__(self) -> None:
        check(self.lam >= 0, "lam", self.lam, "a float >= 0")


class AnalyticHead:
    """AFL's analytic classifier as a part a method holds (AFL, FedCGS, FedOPAL, FedOPAL+): a client's statistics
    (Eq. (7)) and their upload, the server's fold of the uploads and the closed-form solve (Eq. (9)), and Eq. (10)
    on the test images.

    The server's part (:meth:`fold`, :meth:`solve`) reads the section alone; a client's (:meth:`statistics`,
    :meth:`shapes`) needs the feature space, known once the backbone is built and the data set read
    (:meth:`setup`). Each feature is clipped to ``federation.privacy.clip_norm`` under the statistics' DP
    (docs/privacy.md). FedCGS's section has no λ: it holds the head for the statistics and the fold only.
    """

    # the methods that hold one declare it as their own (Algorithm.true_precision)
    true_precision = "its statistics R, C and the closed-form solve stay in float64, not half precision"

    def __init__(self, config: AFLConfig, privacy: PrivacyConfig) -> None:
        self.config = config
        self.dtype = getattr(torch, config.dtype)  # accumulation and solve precision
        self.clip_norm = privacy.clip_norm if privacy.mechanism.startswith("statistics") else None
        self.feature_dim, self.num_classes, self.device = 0, 0, torch.device("cpu")

    def setup(self, *, feature_dim: int, num_classes: int, device: torch.device) -> None:
        """The feature space a client's statistics live in: h of ``feature_dim``, labels of ``num_classes``."""
        self.feature_dim, self.num_classes, self.device = feature_dim, num_classes, device

    def statistics(
        self,
        features: Callable[[Tensor], Tensor],
        batches: Iterable[tuple[Tensor, Tensor]],
        autocast: Callable[[], ContextManager] | None = None,
    ) -> AnalyticStatistics:
        """Eq. (7) of ``features`` (images or a table's rows → h) over one client's ``batches``, streamed."""
        return collect_statistics(
            features,
            batches,
            num_classes=self.num_classes,
            device=self.device,
            dtype=self.dtype,
            autocast=autocast,
            feature_dim=self.feature_dim,
            clip_norm=self.clip_norm,
        )

    def table_statistics(self, table: Tensor, env: Environment, client: Client) -> AnalyticStatistics:
        """Eq. (7) on one client, streamed batch by batch over its rows of the training split's feature ``table``
        (the frozen backbone's h, :class:`~fl_lightning.algorithms.common.FrozenFeatures`)."""
        batches = client_feature_batches(table, env.splits.train_targets, env.partition[client.index], env.cfg.data.batch_size)
        return self.statistics(_identity, batches)

    @staticmethod
    def upload(stats: AnalyticStatistics, first: dict[str, Tensor] | None = None, **meta: int) -> Upload:
        """An Upload of ``stats`` in their wire format (after the tensors ``first``), N as ``num_samples``
        (unless ``meta`` names it)."""
        wire = {k: v.cpu() for k, v in stats.to_upload().items()}
        return Upload({**(first or {}), **wire}, {"num_samples": int(stats.N), **meta})

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes of one client's :meth:`upload` (R's upper triangle, C)."""
        return AnalyticStatistics.upload_shapes(self.feature_dim, self.num_classes)

    @staticmethod
    def fold(
        round_idx: int, uploads: Mapping[int, Upload], visit: Callable[[Upload], None] | None = None
    ) -> tuple[AnalyticStatistics, int]:
        """Σ_k (R_k, C_k, N_k) folded in client order (:class:`~fl_lightning.analytic.StatisticsSum`), one
        upload in memory at a time; ``visit`` sees each upload on the way (FedOPAL's prompts, FedCGS's counts)."""
        fold = StatisticsSum()
        for upload in uploads.values():
            if visit is not None:
                visit(upload)
            fold.add_upload(upload.tensors, upload.meta["num_samples"])
        if fold.count == 0:
            raise RuntimeError(f"round {round_idx}: no client uploaded statistics; nothing to solve")
        return fold.total(), fold.count

    def solved(self, state: State, round_idx: int, uploads: Mapping[int, Upload]) -> State:
        """The server's new state: ``state`` with W the closed-form solve (Eq. (9)) of the fold of ``uploads``."""
        total, count = self.fold(round_idx, uploads)
        return {**state, "W": self.solve(total, count)}

    def solve(self, total: AnalyticStatistics, num_clients: int) -> Tensor:
        """Eq. (9): W* = (Σ R_k + λI)⁻¹ Σ C_k in ``afl.dtype`` (λ by the configured convention)."""
        c = self.config
        lam = regularization(c.lam, num_clients=num_clients, convention=c.regularization, remove=c.remove_regularization)
        return solve_classifier(total.R, total.C, lam=lam)

    @staticmethod
    def evaluate(env: Environment, features: Callable[[Tensor], Tensor], W: Tensor) -> dict[str, Any]:
        """Eq. (10) on the test images: h of ``features`` under the run's precision, logits h·W in float32."""
        W = W.to(env.fabric.device)

        def scores(images: Tensor) -> Tensor:
            with env.fabric.autocast():
                h = features(images)
            return logits(h, W).float()

        return evaluate_on_test(env, scores)


@register("afl")
class AFL(OneShotFeatureMethod):
    """The frozen backbone's features of the training split, each client's rows → R_k, C_k → W* (its
    :class:`AnalyticHead`)."""

    config_class = AFLConfig
    federated_evaluation = True  # the global head through FrozenFeatures.evaluate: the clients' test rows of the train table

    # federation.privacy: the statistics mechanisms cover R_k, C_k, each feature clipped
    # (federation/policies/privacy_coverage.py).
    privacy_gap = gap_by(statistics_only)

    true_precision = AnalyticHead.true_precision

    def __init__(self, *, cfg: RunConfig) -> None:
        super().__init__(cfg=cfg)
        self.head = AnalyticHead(self.config, cfg.federation.privacy)  # Eq. (7), the fold and Eq. (9)

    def setup(self, env: Environment) -> None:
        super().setup(env)  # the frozen backbone's feature tables
        self.head.setup(feature_dim=self.backbone.feature_dim, num_classes=env.num_classes, device=self.fabric.device)

    # -- client ----------------------------------------------------------------------------------
    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        return self.head.upload(self.head.table_statistics(self._train_h, self.env, client))

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return self.head.shapes()

    # -- server ----------------------------------------------------------------------------------
    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        return self.head.solved(state, round_idx, uploads)

    def _head(self, h: Tensor) -> Tensor:  # Eq. (10)
        return logits(h, self._W).float()

    def evaluate(self, state: State) -> dict[str, Any]:
        self._W = state["W"].to(self.fabric.device)
        return self._tables.evaluate(self._head)

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {"feature_dim": int(state["W"].shape[0]) if "W" in state else None}


def _identity(h: Tensor) -> Tensor:
    return h
