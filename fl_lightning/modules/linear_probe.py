"""A linear head on a frozen backbone's features (the FedAvg baseline's local model)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn

from fl_lightning.modules.optim import make_optimizer

__all__ = ["LinearProbe"]


class LinearProbe(LightningModule):
    """Frozen ``backbone`` (images → features) followed by a trainable ``nn.Linear`` head.

    Args:
        backbone: a frozen feature extractor, shared by every client of a rank (not copied).
        feature_dim: its output width.
        num_classes: number of classes.
        optimizer, lr, momentum, weight_decay: the local optimiser.
    """

    def __init__(
        self,
        *,
        backbone: nn.Module,
        feature_dim: int,
        num_classes: int,
        optimizer: str = "sgd",
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(feature_dim, num_classes)
        self._opt = dict(name=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay)

    def forward(self, images: Tensor) -> Tensor:
        with torch.no_grad():
            h = self.backbone(images)
        return self.head(h.float())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        return F.cross_entropy(self(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.head.parameters(), **self._opt)
