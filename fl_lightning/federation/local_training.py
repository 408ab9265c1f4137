"""A client's local optimisation: a LightningModule driven by Fabric, in the style of Fabric's
"build your own trainer" example (``fit`` → ``train_loop`` → ``training_step``).

Each rank trains its clients one after another on its own device. The module is deliberately NOT
wrapped with ``fabric.setup`` — under DDP that would all-reduce gradients across ranks, mixing
different clients' updates. Precision comes from Fabric's precision plugin all the same: the forward runs
under ``fabric.autocast()``, and backward and the optimiser step go through the plugin, so that with
``16-mixed`` the loss is scaled, the gradients are unscaled before any hook sees them and a step with
non-finite gradients is skipped (torch's ``GradScaler``; fp16 gradients underflow without it). Each client
gets a fresh scaler: no client's loss scale depends on which clients this rank trained before it.
Callbacks that shape the gradient (proximal term, gradient contributions) receive
``on_after_backward(module=...)`` right after ``backward``, the hook name Lightning uses. The loss is
summed on the device (float64: the same sum as adding Python floats) and read once at the end, not
synchronised every step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from lightning import LightningModule
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

__all__ = ["LocalFitResult", "fit_local", "fresh_grad_scaler"]


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


def fresh_grad_scaler(fabric: Fabric) -> torch.amp.GradScaler | None:
    """A fresh ``GradScaler`` like the one Fabric's precision plugin holds (``16-mixed``), or None."""
    scaler = getattr(fabric.strategy.precision, "scaler", None)
    if scaler is None:
        return None
    return torch.amp.GradScaler(device=fabric.device.type)


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
    scaler = fresh_grad_scaler(fabric)
    # float64 where the device has it (MPS has not): the same sum as adding the losses as Python floats
    acc_dtype = torch.float32 if fabric.device.type == "mps" else torch.float64
    steps, total = 0, torch.zeros((), dtype=acc_dtype, device=fabric.device)
    for _ in range(epochs):
        for batch_idx, batch in enumerate(loader):
            batch = fabric.to_device(batch)
            with fabric.autocast():
                loss = module.training_step(batch, batch_idx)
            optimizer.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)  # hooks see (and shape) the true gradients
            for hook in hooks:
                hook(module=module)
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)  # skipped when a gradient is inf/NaN
                scaler.update()
            steps += 1
            total += loss.detach().to(acc_dtype)
    module.eval()
    return LocalFitResult(steps, float(total) / max(steps, 1), time.monotonic() - start)

