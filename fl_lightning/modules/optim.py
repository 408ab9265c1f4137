"""The local optimisers the configs name (``train.optimizer``)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["OPTIMIZERS", "make_optimizer"]

OPTIMIZERS = ("sgd", "adamw")


def make_optimizer(
    params: Iterable[nn.Parameter], *, name: str, lr: float, momentum: float = 0.9, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """SGD (with momentum) or AdamW over the trainable ``params``."""
    params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")
