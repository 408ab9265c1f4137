"""DP-SGD in the local loop (Abadi et al. 2016, Alg. 1): without clipping or noise it is the plain step; each
sample's gradient is clipped to C; the noise on the mean gradient has std σC/B."""

from __future__ import annotations

import math

import pytest
import torch
from lightning import LightningModule
from lightning.fabric import Fabric

from fl_lightning.federation.local_training import DPSGD, _private_backward, fit_local


class _Linear(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _batch(seed: int = 1, B: int = 8) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, 4, generator=g) * 5, torch.randint(0, 3, (B,), generator=g)]


def _fabric() -> Fabric:
    return Fabric(accelerator="cpu", devices=1, precision="32-true")


def _per_sample(module: _Linear, batch) -> list[torch.Tensor]:
    out = []
    for i in range(len(batch[1])):
        module.zero_grad()
        module.training_step([batch[0][i:i + 1], batch[1][i:i + 1]], 0).backward()
        out.append(torch.cat([p.grad.flatten() for p in module.parameters()]).double())
    return out


def test_without_clipping_or_noise_the_gradient_is_the_batch_gradient():
    module, batch = _Linear(), _batch()
    _private_backward(_fabric(), module, batch, 0, DPSGD(math.inf, 0.0, 0), torch.Generator())
    private = torch.cat([p.grad.flatten() for p in module.parameters()])
    module.zero_grad()
    module.training_step(batch, 0).backward()
    assert torch.allclose(private, torch.cat([p.grad.flatten() for p in module.parameters()]), atol=1e-6)


def test_each_sample_contributes_at_most_the_clip_norm():
    module, batch, C = _Linear(), _batch(), 0.05
    grads = _per_sample(module, batch)
    assert min(float(g.norm()) for g in grads) > C  # every sample is clipped here
    _private_backward(_fabric(), module, batch, 0, DPSGD(C, 0.0, 0), torch.Generator())
    private = torch.cat([p.grad.flatten() for p in module.parameters()]).double()
    expected = sum(g * (C / g.norm()) for g in grads) / len(grads)
    assert torch.allclose(private, expected, atol=1e-7)
    assert float(private.norm()) <= C * (1 + 1e-6)


def test_the_noise_on_the_mean_gradient_has_std_sigma_C_over_B():
    module, batch, C, sigma, B = _Linear(), _batch(B=4), 0.5, 2.0, 4
    gen, draws = torch.Generator().manual_seed(0), []
    for _ in range(150):
        _private_backward(_fabric(), module, batch, 0, DPSGD(C, sigma, 0), gen)
        draws.append(torch.cat([p.grad.flatten() for p in module.parameters()]))
    spread = torch.stack(draws).std(dim=0)  # per coordinate, over the draws
    assert spread.mean().item() == pytest.approx(sigma * C / B, rel=0.05)


def test_fit_local_with_dp_sgd_trains_and_is_reproducible():
    runs = []
    for _ in range(2):
        module = _Linear()
        result = fit_local(_fabric(), module, [_batch(s) for s in range(3)], epochs=1, dp_sgd=DPSGD(1.0, 1.0, 7))
        runs.append(module.layer.weight.detach().clone())
        assert result.steps == 3 and math.isfinite(result.mean_loss)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], _Linear().layer.weight)
