"""FedAvg (McMahan et al. 2017) of a linear head on a frozen backbone's features.

Each round, sampled clients start from the global head, train it for ``train.epochs`` local epochs
with cross-entropy, and upload it with their sample count; the server averages the heads (weighted
by sample counts when ``fedavg.weighted``). The backbone is frozen, built once per rank and never
crosses the network.

Backbone: any frozen backbone the framework builds — a ViT's CLS feature or a timm CNN's pooled
pre-logit features (``model.name: resnet18``, :mod:`fl_lightning.models.cnn_backbone`).

Core keys used: ``model.*`` (the frozen backbone), ``train.*`` (local epochs, optimizer, lr, momentum,
weight decay, batch size) and ``federation.rounds`` / ``client_fraction``.

The head only ever sees the frozen backbone's features of unaugmented images, so those are computed once
per comparison (``data.feature_cache``): a client trains on its rows of the training split's feature
table, shuffled by the same seeded generator as its images would be; the rank holds the table (N × d).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fl_lightning.algorithms.feature_table import FeatureTableMethod
from fl_lightning.data.loader import TensorBatches
from fl_lightning.federation.aggregate import mean_of_uploads
from fl_lightning.federation.algorithm import Client, Environment, RoundPlan, State, every_key, register
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.policies.privacy_coverage import gap_by, weights_only
from fl_lightning.federation.ranks.placement import client_seed
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.modules.linear_probe import LinearProbe

__all__ = ["FedAvg", "FedAvgConfig", "HEAD_KEYS", "flat_head", "head_numel", "flat_named", "unflat_head", "unflat_named"]

_KEYS = ("head.weight", "head.bias")
HEAD_KEYS = _KEYS  # the linear head's state keys, in the order flat_head lays them out


def flat_named(tensors: Mapping[str, torch.Tensor], keys: Sequence[str], prefix: str = "") -> torch.Tensor:
    """The tensors ``prefix + k`` (k in ``keys``, in that order) as one float32 CPU vector."""
    return torch.cat([tensors[prefix + k].detach().reshape(-1).to(torch.float32).cpu() for k in keys])


def unflat_named(
    vector: torch.Tensor, like: Mapping[str, torch.Tensor], keys: Sequence[str], prefix: str = ""
) -> dict[str, torch.Tensor]:
    """:func:`flat_named`'s inverse: ``{prefix + k: tensor}`` shaped and typed as ``like[k]``."""
    out, at = {}, 0
    for k in keys:
        n = like[k].numel()
        out[prefix + k] = vector[at : at + n].reshape(like[k].shape).to(like[k].dtype)
        at += n
    return out


def flat_head(tensors: Mapping[str, torch.Tensor], prefix: str = "") -> torch.Tensor:
    """The head's tensors ``prefix + k`` (k in :data:`HEAD_KEYS`) as one float32 CPU vector (W then b)."""
    return flat_named(tensors, _KEYS, prefix)


def unflat_head(vector: torch.Tensor, like: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """:func:`flat_head`'s inverse: ``{prefix + k: tensor}`` shaped and typed as ``like[k]``."""
    return unflat_named(vector, like, _KEYS, prefix)


def head_numel(module: nn.Module) -> int:
    """P, the values of the head ``module`` holds (W and b): what a client of a head's method keeps per vector."""
    return sum(int(module.state_dict()[k].numel()) for k in _KEYS)


@dataclass
class FedAvgConfig:
    weighted: bool = True  # weight client heads by their sample counts


@register("fedavg")
class FedAvg(FeatureTableMethod):
    averages_weights = True  # aggregate(): the weighted mean of its uploads (federation/policies/order.py)
    config_class = FedAvgConfig
    averaged_keys = every_key  # every key of the state (the head) is the uploads' weighted mean

    # federation.privacy: DP-FedAvg covers the head, the one thing a client uploads
    # (federation/policies/privacy_coverage.py).
    privacy_gap = gap_by(weights_only)

    true_precision = "its head trains on the frozen backbone's float32 feature table"
    federated_evaluation = True  # the global model through common.py: the clients' test rows too

    def setup(self, env: Environment) -> None:
        super().setup(env)  # the frozen backbone's feature tables
        t = self.cfg.train
        self._train_on_device: tuple[torch.Tensor, torch.Tensor] | None = None
        # the head reads the feature tables: the backbone is not in the module
        self.module = LinearProbe(
            backbone=nn.Identity(),
            feature_dim=self.backbone.feature_dim,
            num_classes=env.num_classes,
            optimizer=t.optimizer,
            lr=t.lr,
            momentum=t.momentum,
            weight_decay=t.weight_decay,
        )
        self.module = self.fabric.to_device(self.module)

    def initial_state(self) -> State:
        torch.manual_seed(self.cfg.seed)  # identical initial head on every rank
        self.module.head.reset_parameters()
        return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items() if k in _KEYS}

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return {k: tuple(download.tensors[k].shape) for k in _KEYS}

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        self.module.load_state_dict(download.tensors, strict=False)  # swap in the global head
        if self._train_on_device is None:  # the feature table and targets on the device, once: no loader per step
            targets = torch.as_tensor(self.env.splits.train_targets, dtype=torch.int64)
            self._train_on_device = (self._train_h.to(self.fabric.device), targets.to(self.fabric.device))
        h, y = self._train_on_device
        idx = torch.as_tensor(self.env.partition[client.index], dtype=torch.int64, device=h.device)
        labels = y[idx] if client.label_map is None else torch.as_tensor(client.label_map, device=y.device)[y[idx]]
        # the batches of DataLoader(TensorDataset(h[idx], labels), shuffle=True, seeded), gathered on the device
        loader = TensorBatches(
            h[idx],
            labels,
            batch_size=self.cfg.train.batch_size or self.cfg.data.batch_size,
            shuffle=True,
            seed=client_seed(self.cfg.seed, round_idx, client.index),
        )
        fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs, callbacks=self.local_callbacks(download))
        head = {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items() if k in _KEYS}
        return Upload(head, {"num_samples": client.num_samples})

    def local_callbacks(self, download: Download) -> list[object]:
        """The local training's gradient hooks (none: plain FedAvg; FedProx adds its proximal term)."""
        return []

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        return mean_of_uploads(state, uploads, weighted=self.config.weighted, keys=_KEYS)

    def evaluate(self, state: State) -> dict[str, Any]:
        self.module.load_state_dict({k: v.to(self.fabric.device) for k, v in state.items()}, strict=False)
        return self._tables.evaluate(self.module)
