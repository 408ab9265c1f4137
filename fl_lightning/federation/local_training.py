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

Under DP-SGD (Abadi et al. 2016, Alg. 1; ``dp_sgd``, a :class:`DPSGD`), the loader is Poisson-sampled
(:class:`~fl_lightning.privacy.poisson_sampling.PoissonBatches`: each record in each step's lot with probability
q) and each step's gradient is instead

    g = (Σ_{i ∈ lot} g_i · min(1, C/‖g_i‖₂) + N(0, σ²C² I)) / L

with L the public expected lot size (never the lot's realised size, nor the client's record count: both depend
on the data). An empty lot is a step of noise alone. Per-sample gradients come from one backward per sample
(micro-batches of one, as Opacus' "virtual steps"; any ``training_step`` works, at B× the backward cost), clipped
jointly over the trainable parameters, noised from the client's own generator. It runs in full precision (no loss
scaler).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from lightning import LightningModule
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

from fl_lightning.federation.precision import convert_input

__all__ = ["LocalFitResult", "DPSGD", "epochs_run", "fit_local", "fresh_grad_scaler"]


@dataclass
class LocalFitResult:
    steps: int
    mean_loss: float
    compute_s: float


@dataclass(frozen=True)
class DPSGD:
    """DP-SGD's settings for one client's training (module docstring), all public but the two seeds.

    Attributes:
        clip_norm: C, each sample's gradient bound.
        noise_multiplier: σ (noise std σC on the lot's sum).
        seed: the noise generator's seed.
        sampling_rate: q, each record's probability of being in a step's lot.
        steps_per_epoch: the steps of one local epoch (⌈1/q⌉: each record seen once per epoch in expectation).
        denominator: L, the expected lot size the noisy sum is divided by.
        sampling_seed: the lots' generator's seed (the draws must stay hidden as the noise must).
    """

    clip_norm: float
    noise_multiplier: float
    seed: int
    sampling_rate: float
    steps_per_epoch: int
    denominator: float
    sampling_seed: int


def _rows(batch: object, i: int) -> object:
    """Sample ``i`` of a collated batch as a batch of one (tensors, or a list/tuple of them)."""
    if isinstance(batch, torch.Tensor):
        return batch[i : i + 1]
    return type(batch)(_rows(t, i) for t in batch)


def _batch_size(batch: object) -> int:
    return int(batch.shape[0]) if isinstance(batch, torch.Tensor) else _batch_size(batch[0])


def _private_backward(
    fabric: Fabric, module: LightningModule, batch: object | None, batch_idx: int, dp: DPSGD, generator: torch.Generator
) -> torch.Tensor | None:
    """DP-SGD's gradient (module docstring) written into ``.grad``; returns the lot's mean loss (None: an empty lot,
    ``batch`` None, whose gradient is the noise alone)."""
    params = [p for p in module.parameters() if p.requires_grad]
    summed = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    B, total = (0 if batch is None else _batch_size(batch)), 0.0
    for i in range(B):
        with fabric.autocast():
            loss = module.training_step(_rows(batch, i), batch_idx)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
        norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads))
        scale = torch.clamp(dp.clip_norm / norm.clamp_min(1e-300), max=1.0)
        for s, g in zip(summed, grads):
            s.add_(g.double() * scale)
        total += float(loss.detach())
    for p, s in zip(params, summed):
        if dp.noise_multiplier > 0:  # σ = 0: no noise (and a clip norm of inf is then allowed)
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            s = s + (noise * (dp.noise_multiplier * dp.clip_norm)).to(s.device)
        p.grad = (s / dp.denominator).to(p.dtype)
    return torch.tensor(total / B) if B else None


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


_work_fraction: ContextVar[float | None] = ContextVar("fl_lightning_local_work", default=None)


@contextmanager
def local_work(fraction: float | None) -> Iterator[None]:
    """Every :func:`fit_local` inside the block runs ``max(1, round(fraction · epochs))`` of its ``epochs`` (a
    straggler's share of its local work: federation/client_behaviour.py); None: all of them. Set by the engine around
    one client's update, so that no method's file changes."""
    token = _work_fraction.set(fraction)
    try:
        yield
    finally:
        _work_fraction.reset(token)


def epochs_run(epochs: int, fraction: float | None) -> int:
    """The passes a client runs of ``epochs`` when it does ``fraction`` of its local work (None: all of them):
    ``max(1, round(fraction · epochs))``, none of none."""
    return epochs if fraction is None or epochs <= 0 else max(1, round(fraction * epochs))


def _epochs_to_run(epochs: int) -> int:
    return epochs_run(epochs, _work_fraction.get())


def fit_local(
    fabric: Fabric,
    module: LightningModule,
    loader: DataLoader,
    *,
    epochs: int,
    callbacks: Sequence[object] = (),
    dp_sgd: DPSGD | None = None,
) -> LocalFitResult:
    """Train ``module`` for ``epochs`` over ``loader`` on this rank's device.

    Args:
        fabric: gives the device and the autocast precision.
        module: a LightningModule whose ``training_step`` returns the loss and whose
            ``configure_optimizers`` returns an optimiser over its trainable parameters.
        loader: the client's data (already seeded by the caller).
        epochs: number of passes (0: no training); a straggler's share of them inside :func:`local_work`.
        callbacks: objects with an optional ``on_after_backward(module=...)`` hook.
        dp_sgd: DP-SGD's per-sample clipping and noise (None: plain steps); ``loader`` must then be its
            Poisson-sampled lots (``Environment.loader(..., dp_sgd=dp_sgd)``), anything else is refused.
    """
    start = time.monotonic()
    epochs = _epochs_to_run(epochs)
    module.train()
    optimizer = _optimizer(module)
    hooks = [cb.on_after_backward for cb in callbacks if hasattr(cb, "on_after_backward")]
    scaler = fresh_grad_scaler(fabric)
    if dp_sgd is not None:
        return _fit_private(fabric, module, loader, epochs, optimizer, hooks, dp_sgd, start)
    # float64 where the device has it (MPS has not): the same sum as adding the losses as Python floats
    acc_dtype = torch.float32 if fabric.device.type == "mps" else torch.float64
    steps, total = 0, torch.zeros((), dtype=acc_dtype, device=fabric.device)
    for _ in range(epochs):
        for batch_idx, batch in enumerate(loader):
            batch = convert_input(fabric, fabric.to_device(batch))  # *-true: float inputs in half precision
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


def _fit_private(
    fabric: Fabric,
    module: LightningModule,
    loader: DataLoader,
    epochs: int,
    optimizer: torch.optim.Optimizer,
    hooks: list,
    dp: DPSGD,
    start: float,
) -> LocalFitResult:
    """:func:`fit_local`'s loop with DP-SGD's gradient over Poisson-sampled lots (full precision: no loss scaler).
    The mean loss is over the steps whose lot was not empty."""
    from fl_lightning.privacy.poisson_sampling import PoissonBatches

    if fresh_grad_scaler(fabric) is not None:
        raise ValueError("DP-SGD runs in full precision: use federation.precision 32-true or bf16-mixed")
    if not (isinstance(loader, PoissonBatches) and loader.rate == dp.sampling_rate and len(loader) == dp.steps_per_epoch):
        raise ValueError(
            f"DP-SGD is accounted for Poisson-sampled lots at q = {dp.sampling_rate} over "
            f"{dp.steps_per_epoch} steps an epoch: pass Environment.loader(..., dp_sgd=...)'s loader"
        )
    generator = torch.Generator().manual_seed(dp.seed)
    steps, filled, total = 0, 0, 0.0
    for _ in range(epochs):
        for batch_idx, batch in enumerate(loader):
            batch = None if batch is None else fabric.to_device(batch)
            optimizer.zero_grad(set_to_none=True)
            loss = _private_backward(fabric, module, batch, batch_idx, dp, generator)
            for hook in hooks:  # e.g. the proximal term: data-independent, added to the private gradient
                hook(module=module)
            optimizer.step()
            steps += 1
            if loss is not None:
                filled, total = filled + 1, total + float(loss)
    module.eval()
    return LocalFitResult(steps, total / max(filled, 1), time.monotonic() - start)
