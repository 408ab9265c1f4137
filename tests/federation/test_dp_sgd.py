"""DP-SGD in the local loop (Abadi et al. 2016, Alg. 1): without clipping or noise it is the plain step; each
sample's gradient is clipped to C; the noise on the gradient has std σC/L (L the public expected lot); the lots
are Poisson-sampled, an empty one a step of noise alone, and any other loader is refused."""

from __future__ import annotations

import math

import pytest
import torch
from lightning import LightningModule
from lightning.fabric import Fabric

from fl_lightning.federation.local_training import DPSGD, _private_backward, fit_local
from fl_lightning.privacy.poisson_sampling import PoissonBatches


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


def _dp(C: float, sigma: float, seed: int = 0, *, q: float = 1.0, L: float = 8.0) -> DPSGD:
    return DPSGD(C, sigma, seed, sampling_rate=q, steps_per_epoch=math.ceil(1 / q), denominator=L, sampling_seed=1)


def _lots(x: torch.Tensor, y: torch.Tensor, dp: DPSGD) -> PoissonBatches:
    """Poisson lots over (x, y), collated by indexing."""
    return PoissonBatches(
        len(y),
        rate=dp.sampling_rate,
        steps_per_epoch=dp.steps_per_epoch,
        generator=torch.Generator().manual_seed(dp.sampling_seed),
        make_loader=lambda lots: ([x[lot], y[lot]] for lot in lots),
    )


def _fabric() -> Fabric:
    return Fabric(accelerator="cpu", devices=1, precision="32-true")


def _per_sample(module: _Linear, batch) -> list[torch.Tensor]:
    out = []
    for i in range(len(batch[1])):
        module.zero_grad()
        module.training_step([batch[0][i : i + 1], batch[1][i : i + 1]], 0).backward()
        out.append(torch.cat([p.grad.flatten() for p in module.parameters()]).double())
    return out


def test_without_clipping_or_noise_the_gradient_is_the_batch_gradient():
    module, batch = _Linear(), _batch()
    _private_backward(_fabric(), module, batch, 0, _dp(math.inf, 0.0), torch.Generator())
    private = torch.cat([p.grad.flatten() for p in module.parameters()])
    module.zero_grad()
    module.training_step(batch, 0).backward()
    assert torch.allclose(private, torch.cat([p.grad.flatten() for p in module.parameters()]), atol=1e-6)


def test_each_sample_contributes_at_most_the_clip_norm():
    module, batch, C = _Linear(), _batch(), 0.05
    grads = _per_sample(module, batch)
    assert min(float(g.norm()) for g in grads) > C  # every sample is clipped here
    _private_backward(_fabric(), module, batch, 0, _dp(C, 0.0), torch.Generator())
    private = torch.cat([p.grad.flatten() for p in module.parameters()]).double()
    expected = sum(g * (C / g.norm()) for g in grads) / len(grads)
    assert torch.allclose(private, expected, atol=1e-7)
    assert float(private.norm()) <= C * (1 + 1e-6)


def test_the_noise_on_the_gradient_has_std_sigma_C_over_the_public_lot_size():
    module, batch, C, sigma, B = _Linear(), _batch(B=4), 0.5, 2.0, 4
    gen, draws = torch.Generator().manual_seed(0), []
    for _ in range(150):
        _private_backward(_fabric(), module, batch, 0, _dp(C, sigma, L=B), gen)
        draws.append(torch.cat([p.grad.flatten() for p in module.parameters()]))
    spread = torch.stack(draws).std(dim=0)  # per coordinate, over the draws
    assert spread.mean().item() == pytest.approx(sigma * C / B, rel=0.05)


def test_fit_local_with_dp_sgd_trains_and_is_reproducible():
    x, y = _batch(B=24)
    dp, runs = _dp(1.0, 1.0, 7, q=0.25, L=6.0), []
    for _ in range(2):
        module = _Linear()
        result = fit_local(_fabric(), module, _lots(x, y, dp), epochs=2, dp_sgd=dp)
        runs.append(module.layer.weight.detach().clone())
        assert result.steps == 8 and math.isfinite(result.mean_loss)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], _Linear().layer.weight)


def test_an_empty_lot_is_a_step_of_noise_alone():
    module, C, sigma, L = _Linear(), 0.5, 2.0, 4.0
    before = [p.detach().clone() for p in module.parameters()]
    assert _private_backward(_fabric(), module, None, 0, _dp(C, sigma, L=L), torch.Generator().manual_seed(3)) is None
    expected = torch.Generator().manual_seed(3)
    for p in module.parameters():
        noise = torch.randn(p.shape, generator=expected, dtype=torch.float64) * sigma * C / L
        assert torch.allclose(p.grad.double(), noise, atol=1e-7)
    # σ = 0: an empty lot moves nothing
    x, y = _batch(B=4)
    dp = _dp(C, 0.0, q=0.5, L=L)
    result = fit_local(_fabric(), module, _lots(x[:0], y[:0], dp), epochs=1, dp_sgd=dp)  # no record to draw
    assert result.steps == 2 and all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_dp_sgd_refuses_batches_it_is_not_accounted_for():
    """Shuffled fixed-size batches (or lots at another rate) are not the Poisson sampling the accountant credits."""
    x, y = _batch(B=8)
    dp = _dp(1.0, 1.0, q=0.5)
    with pytest.raises(ValueError, match="Poisson-sampled lots at q = 0.5"):
        fit_local(_fabric(), _Linear(), [[x, y]], epochs=1, dp_sgd=dp)
    with pytest.raises(ValueError, match="Poisson-sampled"):
        fit_local(_fabric(), _Linear(), _lots(x, y, _dp(1.0, 1.0, q=0.25)), epochs=1, dp_sgd=dp)
