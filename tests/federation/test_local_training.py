"""A client's local loop goes through Fabric's precision: 32-true is the plain loop bit for bit; 16-mixed scales
the loss, unscales before the hooks and skips a step whose gradients are not finite."""

from __future__ import annotations

import pytest
import torch
from lightning import LightningModule
from lightning.fabric import Fabric

from fl_lightning.federation.local_training import fit_local


class _Linear(LightningModule):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 3)
        self.scale = scale

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y) * self.scale

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fp16_mixed() -> Fabric:
    """``16-mixed`` with its GradScaler on the CPU (``Fabric(precision="16-mixed")`` turns into bf16-mixed on a
    CPU, which has no scaler; on a GPU it is this plugin)."""
    from lightning.fabric.plugins.precision import MixedPrecision

    fabric = Fabric(accelerator="cpu", devices=1, plugins=[MixedPrecision(precision="16-mixed", device="cpu")])
    assert fabric.strategy.precision.scaler is not None
    return fabric


def _batches(n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


class _GradSpy:
    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_after_backward(self, *, module) -> None:
        self.norms.append(float(module.layer.weight.grad.norm()))


def test_32_true_is_the_plain_loop_bit_for_bit():
    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    module, plain = _Linear(), _Linear()
    result = fit_local(fabric, module, _batches(), epochs=2)
    opt, losses = plain.configure_optimizers(), []
    for _ in range(2):
        for i, batch in enumerate(_batches()):
            loss = plain.training_step(batch, i)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss))
    for a, b in zip(module.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)
    assert result.steps == 6 and result.mean_loss == sum(losses) / 6  # the same float64 sum, read once


def test_16_mixed_hooks_see_unscaled_gradients_and_match_fp32_closely():
    spy16, spy32 = _GradSpy(), _GradSpy()
    m16, m32 = _Linear(), _Linear()
    fit_local(_fp16_mixed(), m16, _batches(), epochs=1, callbacks=[spy16])
    fit_local(Fabric(accelerator="cpu", devices=1, precision="32-true"), m32, _batches(), epochs=1, callbacks=[spy32])
    # a scaled gradient would be ~65536x larger; unscaled, fp16 autocast stays within fp16's precision
    assert spy16.norms == pytest.approx(spy32.norms, rel=2e-2)
    for a, b in zip(m16.state_dict().values(), m32.state_dict().values()):
        assert torch.allclose(a, b, atol=2e-3)


def test_16_mixed_skips_a_step_whose_gradients_are_not_finite():
    module = _Linear(scale=float("inf"))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    result = fit_local(_fp16_mixed(), module, _batches(1), epochs=1)
    assert result.steps == 1
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k])  # the scaler skipped the step: no inf/NaN in the weights
