"""Client-side prompt tuning of FedOPAL (Eq. (4)-(6)): VPT-shallow prompts + a temporary linear head.

A client trains its prompts P together with a throw-away linear head on cross-entropy. The proximal
term mu/2·||P − P_init||² of Eq. (6) is *not* in this module's loss: it is added to P's gradient by
:class:`fl_lightning.callbacks.proximal.ProximalCallback` (reference ``{"model.prompts": P_init}``,
see :attr:`PromptTuningModule.prompt_parameter_name`), so the loss logged here is the task loss.
After training the prompts are frozen and the head is discarded: the analytic classifier replaces it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn

from fl_lightning.models.vpt import PromptedViT
from fl_lightning.modules.optim import OPTIMIZERS, make_optimizer

__all__ = ["PromptTuningModule", "OPTIMIZERS"]


class PromptTuningModule(LightningModule):
    """A :class:`PromptedViT` (frozen trunk) with a temporary ``nn.Linear(feature_dim, num_classes)`` head.

    Args:
        model: the prompted ViT; only its prompts are trained.
        num_classes: c, the width of the temporary head.
        optimizer: ``'sgd'`` or ``'adamw'``.
        lr: learning rate (> 0).
        weight_decay: weight decay (≥ 0), applied to prompts and head.
        momentum: SGD momentum (ignored by AdamW).
        head_seed: seed of the head's initialisation (the same on every client).

    Example:
        >>> from fl_lightning.models.backbones import build_tiny_backbone
        >>> module = PromptTuningModule(model=PromptedViT(build_tiny_backbone("timm"), num_prompts=4),
        ...                             num_classes=10, lr=0.1)
        >>> module(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    #: name of the prompt parameter in ``named_parameters()`` (the ProximalCallback reference key)
    prompt_parameter_name = "model.prompts"

    def __init__(
        self,
        *,
        model: PromptedViT,
        num_classes: int,
        optimizer: str = "sgd",
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.9,
        head_seed: int = 0,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {optimizer!r}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.model = model
        self.num_classes = int(num_classes)
        self.optimizer_name = optimizer
        self.lr, self.weight_decay, self.momentum = float(lr), float(weight_decay), float(momentum)
        # Same head initialisation on every client, without touching the global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(head_seed)
            self.head = nn.Linear(model.feature_dim, num_classes)

    def features(self, images: Tensor) -> Tensor:
        """Prompt-rectified features h, shape (B, feature_dim) (Eq. (5))."""
        return self.model(images)

    def forward(self, images: Tensor) -> Tensor:
        """Logits of the temporary head, shape (B, num_classes)."""
        return self.head(self.model(images))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Cross-entropy of the temporary head (the proximal term comes as a gradient, see module doc)."""
        images, labels = batch
        return F.cross_entropy(self(images), labels)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The prompts and the head: all that the client optimises."""
        return [self.model.prompts, *self.head.parameters()]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(
            self.trainable_parameters(),
            name=self.optimizer_name,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )
