"""FedCGS (Guan, Zhou & Gu, AAAI 2025, "Capture Global Feature Statistics for One-Shot Federated
Learning"; official code ``Yuqin-G/FedCGS``, ``main_fedcgs.py`` and ``utils_fl.eval``): one round,
training-free, exact.

Client i streams its data once through the frozen backbone and uploads its class feature sums
A_i^j (as the columns of C_i = Σ h yᵀ, d × c), its class counts N_i^j and the second moment
B_i = Σ h hᵀ (upper triangle, d(d+1)/2) — all float64 as in the official code. The server adds them
and builds (:mod:`fl_lightning.feature_gaussians`)

    μ^j = A^j / N^j,   Σ = (B − N μ μᵀ) / (N − 1)   (the *total* covariance, as the official code),
    w_j = Σ̂⁻¹ μ^j,   b_j = −½ μ^jᵀ Σ̂⁻¹ μ^j + log(N^j / N),   logits = hᵀ w_j + b_j,   Σ̂ = Σ + γ (tr Σ / d) I.

All statistics are sums, so the head equals the one computed centrally on the pooled features of
the same backbone: FedCGS's accuracy does not depend on the partition (α) or on the number of clients.

Departures and options:
- ``fedcgs.shrinkage`` γ: the official code has ``S + γI`` with γ = 0 in every run; we keep γ = 0 as
  the default, scale γ by the mean eigenvalue tr Σ / d (one value for every backbone's feature
  scale) and solve instead of inverting (``np.linalg.inv`` there). The official runs use ResNet
  features; a ViT feature taken right after its final LayerNorm (timm CLS tokens, DINOv2) lies in a
  hyperplane, so Σ is singular and γ = 0 gives a head that follows rounding noise — a warning says
  so; use a small γ (1e-6) there. CLIP's projected features (``feature: proj``) do not have this
  problem when the projection is narrower than the width.
- ``fedcgs.covariance: within`` (beyond the paper): the class-centred (textbook LDA) covariance.
- A class no client holds gets prior 0 (bias −inf) where the official code would divide 0 by 0.
- The official code also uploads Σ h, which is the row sum of C; we do not send it twice.
- The paper's personalisation round (clients download the global statistics) is not implemented.

Backbone: ``model.*`` — any frozen backbone the framework builds, a ViT or a timm CNN's pooled
pre-logit features (:mod:`fl_lightning.models.cnn_backbone`). The official code
(``main_fedcgs.py``: ``resnet18_imagenet``) uses an ImageNet ResNet-18's 512-d penultimate features
on 32-px images (its 224-px resize is commented out); the Table I–II configs carry that row and
FedCGS on FedOPAL's CLIP ViT-B/16. Core keys not used: ``train.*`` (no training anywhere) and
``federation.rounds`` (one round). Client memory is flat in its number of samples (streamed
statistics, like AFL); the server folds the uploads one at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from fl_lightning.algorithms.afl import AnalyticHead
from fl_lightning.algorithms.feature_table import OneShotFeatureMethod
from fl_lightning.analytic import logits
from fl_lightning.errors import check
from fl_lightning.feature_gaussians import COVARIANCES, gaussian_head
from fl_lightning.federation.algorithm import Client, Environment, RoundPlan, State, register
from fl_lightning.federation.policies.privacy_coverage import gap_by, statistics_only
from fl_lightning.federation.transport import Download, Upload

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["FedCGS", "FedCGSConfig"]


@dataclass
class FedCGSConfig:
    covariance: Literal["total", "within"] = "total"  # the official code's total covariance
    shrinkage: float = 0.0  # γ of Σ + γ(tr Σ/d)I: 0 as every published run (ViT LayerNorm features: 1e-6)
    dtype: Literal["float64", "float32"] = "float64"  # accumulation and solve precision (official: float64)

    def __post_init__(self) -> None:
        check(self.covariance in COVARIANCES, "covariance", self.covariance, f"one of {COVARIANCES}")
        check(math.isfinite(self.shrinkage) and self.shrinkage >= 0, "shrinkage", self.shrinkage, "a finite float >= 0")


@register("fedcgs")
class FedCGS(OneShotFeatureMethod):
    """AFL's streamed statistics plus class counts; a Gaussian discriminant head instead of ridge.

    It holds AFL's :class:`~fl_lightning.algorithms.afl.AnalyticHead` for a client's statistics, their upload and
    the fold; the classifier is :func:`~fl_lightning.feature_gaussians.gaussian_head`, not the head's ridge solve.
    The frozen backbone's feature tables and the one round are the engine's
    (:class:`~fl_lightning.algorithms.feature_table.OneShotFeatureMethod`)."""

    config_class = FedCGSConfig
    federated_evaluation = True  # the global head through FrozenFeatures.evaluate: the clients' test rows of the train table
    true_precision = AnalyticHead.true_precision

    # federation.privacy: the statistics mechanisms cover R_k, C_k and the class counts (the counts are in the
    # sensitivity; federation/policies/privacy_coverage.py).
    privacy_gap = gap_by(statistics_only)

    def __init__(self, *, cfg: RunConfig) -> None:
        super().__init__(cfg=cfg)
        self.head = AnalyticHead(self.config, cfg.federation.privacy)  # fedcgs.dtype: the statistics' precision

    def setup(self, env: Environment) -> None:
        super().setup(env)  # the frozen backbone's feature tables
        self.head.setup(feature_dim=self.backbone.feature_dim, num_classes=env.num_classes, device=self.fabric.device)

    # -- client ----------------------------------------------------------------------------------
    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        stats = self.head.table_statistics(self._train_h, self.env, client)  # R = B_i, C = [A_i^1 … A_i^c], streamed
        counts = torch.as_tensor(client.class_counts, dtype=torch.int64)  # N_i^j
        if int(counts.sum()) != stats.N:
            raise RuntimeError(f"client {client.index}: {stats.N} features but class counts sum to {int(counts.sum())}")
        upload = self.head.upload(stats)
        upload.tensors["counts"] = counts  # after R_upper and C on the wire
        return upload

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return {**self.head.shapes(), "counts": (self.env.num_classes,)}

    # -- server ----------------------------------------------------------------------------------
    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        counts = torch.zeros(self.env.num_classes, dtype=torch.int64)

        def add_counts(upload: Upload) -> None:
            counts.add_(upload.tensors["counts"])

        total, _ = self.head.fold(round_idx, uploads, visit=add_counts)
        W, b = gaussian_head(total.R, total.C, counts, covariance=self.config.covariance, shrinkage=self.config.shrinkage)
        return {**state, "W": W, "b": b, "counts": counts}

    def evaluate(self, state: State) -> dict[str, Any]:
        W, b = state["W"].to(self.fabric.device), state["b"].to(self.fabric.device)
        return self._tables.evaluate(lambda h: (logits(h, W) + b).float())  # hᵀ w_j + b_j on the test split

    def summary_extras(self, state: State) -> dict[str, Any]:
        d, c = self.backbone.feature_dim, self.env.num_classes
        item = torch.finfo(self.head.dtype).bits // 8
        return {
            "feature_dim": int(state["W"].shape[0]) if "W" in state else None,
            "covariance": self.config.covariance,
            "shrinkage": self.config.shrinkage,
            # B (upper triangle) + class sums + class counts (int64) + the sample count
            "upload_bytes_per_client": (d * (d + 1) // 2 + d * c) * item + 8 * c + 8,
            "classes_seen": int((state["counts"] > 0).sum()) if "counts" in state else None,
        }
