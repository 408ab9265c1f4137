"""A client's local optimisation: a LightningModule driven by Fabric, in the style of Fabric's
"build your own trainer" example (``fit`` → ``train_loop`` → ``training_step``).

Each rank trains its clients one after another on its own device. The module is deliberately NOT
wrapped with ``fabric.setup`` — under DDP that would all-reduce gradients across ranks, mixing
different clients' updates. Precision comes from ``fabric.autocast()``. Callbacks that shape the
gradient (proximal term, gradient contributions) receive ``on_after_backward(module=...)`` right after
``backward``, the hook name Lightning uses.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from lightning import LightningModule
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

__all__ = ["LocalFitResult", "fit_local"]


@dataclass
class LocalFitResult:
    steps: int
    mean_loss: float
    compute_s: float


def _optimizer(module: LightningModule) -> torch.optim.Optimizer:
    opt = module.configure_optimizers()
    if isinstance(opt, dict):
        opt = opt["optimizer"]
    if isinstance(opt, (list, tuple)):
        opt = opt[0]
    return opt


def fit_local(fabric: Fabric, module: LightningModule, loader: DataLoader, *, epochs: int,
              callbacks: Sequence[object] = ()) -> LocalFitResult:
    """Train ``module`` for ``epochs`` over ``loader`` on this rank's device.

    Args:
        fabric: gives the device and the autocast precision.
        module: a LightningModule whose ``training_step`` returns the loss and whose
            ``configure_optimizers`` returns an optimiser over its trainable parameters.
        loader: the client's data (already seeded by the caller).
        epochs: number of passes (0: no training).
        callbacks: objects with an optional ``on_after_backward(module=...)`` hook.
    """
    start = time.monotonic()
    module.train()
    optimizer = _optimizer(module)
    hooks = [cb.on_after_backward for cb in callbacks if hasattr(cb, "on_after_backward")]
    steps, total = 0, 0.0
    for _ in range(epochs):
        for batch_idx, batch in enumerate(loader):
            batch = fabric.to_device(batch)
            with fabric.autocast():
                loss = module.training_step(batch, batch_idx)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for hook in hooks:
                hook(module=module)
            optimizer.step()
            steps += 1
            total += float(loss.detach())
    module.eval()
    return LocalFitResult(steps, total / max(steps, 1), time.monotonic() - start)

