"""FedPFT (Beitollahi et al., ICML 2024, "Parametric Feature Transfer: One-shot Federated Learning
with Foundation Models"): one round; clients send class-conditional Gaussian mixtures of their
features, the server trains a linear head on features sampled from them.

Client k passes its data once through the frozen backbone, then for every class j it holds more
than K samples of, fits a K-component Gaussian mixture to those features with scikit-learn's EM
(``GaussianMixture``; k-means initialisation seeded per client) and uploads its weights, means and
covariances in float16, with j and the class count n_kj (:func:`~fl_lightning.feature_gaussians.fit_class_gmms`).
Per class that is K·(d + 1 + cov) numbers, cov = d(d+1)/2 (``full``), d (``diag``) or 1
(``spherical``): the upload grows linearly with components × classes.

Server: from each uploaded mixture it draws n_kj synthetic features (one seeded generator, client
order), pools them and trains ``nn.Linear(d, c)`` with cross-entropy; the test split is classified by
that head on the backbone's features.

Defaults are those of the FedPFT baseline in the FedCGS repository (``main_fedpft.py``), whose numbers
FedOPAL's comparison reports: K = 10 diagonal components, EM ``tol`` 1e-12 and ``max_iter`` 10000
(slow: EM usually runs to max_iter), a head trained with SGD (lr 0.01, momentum 0.9), batch 128,
50 epochs. The FedPFT authors' own Flower baseline uses K = 1 spherical and AdamW (lr 1e-4), batch 32,
50 epochs: ``fedpft: {n_components: 1, covariance_type: spherical, head_optimizer: adamw,
head_lr: 1.0e-4, head_batch_size: 32}``.

Departures: the quantised weights are renormalised before sampling and quantised full covariances
are clamped to PSD; every class gets its own noise (the public code reseeds each class's sampler
identically); the DP variant and the decentralised (chain) setting of the paper are not implemented.

Backbone: ``model.*``, a ViT or a timm CNN's pooled pre-logit features
(:mod:`fl_lightning.models.cnn_backbone`). The paper uses an ImageNet ResNet-50 and CLIP encoders
(the authors' Flower baseline a CLIP ViT-B/32), the FedCGS repository an ImageNet ResNet-18; the
Table I–II configs carry the ResNet-50 row and FedPFT on FedOPAL's CLIP ViT-B/16. Core keys not used:
``train.*`` (the server head has its own ``fedpft.head_*`` settings; clients train nothing) and
``federation.rounds`` (one round). Memory: a client holds its own features (n_k × d, what EM needs; never the
images), the server the pooled
synthetic features (N × d), as in the paper. The backbone's features of the training and test splits
are computed once per comparison (``data.feature_cache``; a rank holds the training split's table, N × d,
and each client gathers its rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from fl_lightning.algorithms.feature_table import OneShotFeatureMethod
from fl_lightning.errors import check
from fl_lightning.feature_gaussians import (
    COVARIANCE_TYPES,
    fit_class_gmms,
    gmm_numbers_per_class,
    sample_class_gmms,
    train_linear_head,
)
from fl_lightning.federation.algorithm import Client, RoundPlan, State, register
from fl_lightning.federation.policies.privacy_coverage import never_covered
from fl_lightning.federation.ranks.placement import client_seed
from fl_lightning.federation.transport import Download, Upload

__all__ = ["FedPFT", "FedPFTConfig"]

_WIRE_DTYPES = ("float16", "float32", "float64")


@dataclass
class FedPFTConfig:
    n_components: int = 10  # K per class mixture (FedCGS repo's FedPFT baseline)
    covariance_type: Literal["full", "diag", "spherical"] = "diag"  # FedCGS repo; the paper also uses full/spherical
    tol: float = 1e-12  # EM convergence tolerance (both public implementations)
    max_iter: int = 10000  # EM iterations (both public implementations)
    reg_covar: float = 1e-6  # scikit-learn's default, added to the covariance diagonals
    wire_dtype: Literal["float16", "float32", "float64"] = "float16"  # the paper quantises to 16 bits
    head_epochs: int = 50  # server head training (FedCGS repo and Flower baseline: 50)
    head_batch_size: int = 128  # FedCGS repo (Flower baseline: 32)
    head_optimizer: Literal["sgd", "adamw"] = "sgd"  # FedCGS repo (Flower baseline: adamw)
    head_lr: float = 0.01  # FedCGS repo (Flower baseline: 1e-4)
    head_momentum: float = 0.9  # FedCGS repo (SGD only)
    head_weight_decay: float = 0.0  # neither implementation decays (AdamW's default 0.01 in Flower's)

    def __post_init__(self) -> None:
        check(self.n_components >= 1, "n_components", self.n_components, "an int >= 1")
        check(self.covariance_type in COVARIANCE_TYPES, "covariance_type", self.covariance_type, f"one of {COVARIANCE_TYPES}")
        check(self.tol > 0, "tol", self.tol, "a float > 0")
        check(self.max_iter >= 1, "max_iter", self.max_iter, "an int >= 1")
        check(self.reg_covar >= 0, "reg_covar", self.reg_covar, "a float >= 0")
        check(self.wire_dtype in _WIRE_DTYPES, "wire_dtype", self.wire_dtype, f"one of {_WIRE_DTYPES}")
        check(self.head_epochs >= 1, "head_epochs", self.head_epochs, "an int >= 1")
        check(self.head_batch_size >= 1, "head_batch_size", self.head_batch_size, "an int >= 1")
        check(self.head_lr > 0, "head_lr", self.head_lr, "a float > 0")
        check(self.head_momentum >= 0, "head_momentum", self.head_momentum, "a float >= 0")
        check(self.head_weight_decay >= 0, "head_weight_decay", self.head_weight_decay, "a float >= 0")


@register("fedpft")
class FedPFT(OneShotFeatureMethod):
    true_precision = "its class Gaussians are fitted and sampled in float64, not half precision"
    config_class = FedPFTConfig
    federated_evaluation = True  # the global head through FrozenFeatures.evaluate: the clients' test rows of the train table

    privacy_gap = never_covered("it uploads Gaussian mixtures of its clients' features, which no mechanism clips or noises")

    # -- client ----------------------------------------------------------------------------------
    def _features(self, client: Client) -> tuple[Tensor, Tensor]:
        """The client's features (n, d) float32 on the CPU and labels (n,): its rows of the split's table."""
        idx = torch.as_tensor(self.env.partition[client.index], dtype=torch.int64)
        labels = torch.as_tensor(self.env.splits.train_targets, dtype=torch.int64)[idx]
        return self._train_h[idx].float(), labels

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        h, y = self._features(client)
        c = self.config
        packed = fit_class_gmms(
            h,
            y,
            num_classes=self.env.num_classes,
            n_components=c.n_components,
            covariance_type=c.covariance_type,
            seed=client_seed(self.cfg.seed, round_idx, client.index),
            tol=c.tol,
            max_iter=c.max_iter,
            reg_covar=c.reg_covar,
            wire_dtype=getattr(torch, c.wire_dtype),
        )
        return Upload(packed, {"num_samples": client.num_samples})

    # -- server ----------------------------------------------------------------------------------
    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        c = self.config
        generator = torch.Generator().manual_seed(self.cfg.seed)
        feats, labels, mixtures = [], [], 0
        for upload in uploads.values():  # client order: the draws do not depend on ranks
            x, y = sample_class_gmms(upload.tensors, covariance_type=c.covariance_type, generator=generator)
            feats.append(x)
            labels.append(y)
            mixtures += int(upload.tensors["labels"].numel())
        if mixtures == 0:
            raise RuntimeError(
                f"round {round_idx}: no client uploaded a class mixture (every class held "
                f"<= fedpft.n_components = {c.n_components} samples); nothing to train on"
            )
        device = self.fabric.device
        weight, bias = train_linear_head(
            torch.cat(feats).to(device),
            torch.cat(labels).to(device),
            num_classes=self.env.num_classes,
            epochs=c.head_epochs,
            batch_size=c.head_batch_size,
            optimizer=c.head_optimizer,
            lr=c.head_lr,
            momentum=c.head_momentum,
            weight_decay=c.head_weight_decay,
            seed=self.cfg.seed,
        )
        return {
            **state,
            "weight": weight.cpu(),
            "bias": bias.cpu(),
            "class_mixtures": torch.tensor(mixtures),
            "synthetic_features": torch.tensor(sum(len(y) for y in labels)),
        }

    def _head(self, h: Tensor) -> Tensor:
        return h.float() @ self._weight.T + self._bias

    def evaluate(self, state: State) -> dict[str, Any]:
        self._weight, self._bias = state["weight"].to(self.fabric.device), state["bias"].to(self.fabric.device)
        return self._tables.evaluate(self._head)

    def summary_extras(self, state: State) -> dict[str, Any]:
        c, d = self.config, self.backbone.feature_dim
        per_class = gmm_numbers_per_class(d, c.n_components, c.covariance_type)
        return {
            "n_components": c.n_components,
            "covariance_type": c.covariance_type,
            "feature_dim": d,
            # each uploaded class mixture: its parameters in wire_dtype + its int64 label and count
            "upload_bytes_per_class_mixture": per_class * torch.finfo(getattr(torch, c.wire_dtype)).bits // 8 + 16,
            "class_mixtures_uploaded": int(state["class_mixtures"]) if "class_mixtures" in state else None,
            "synthetic_features": int(state["synthetic_features"]) if "synthetic_features" in state else None,
        }
