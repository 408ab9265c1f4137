import pytest
import torch
from torch import nn

from fl_lightning.callbacks.proximal import ProximalCallback, proximal_penalty


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.prompts = nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
        self.head = nn.Linear(4, 2).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.prompts.mean(0))


@pytest.mark.parametrize("mu", [0.0, 0.1, 7.5])
def test_gradient_equals_autograd_of_explicit_term(mu: float) -> None:
    torch.manual_seed(0)
    m = _Tiny()
    ref = {"prompts": torch.randn(3, 4, dtype=torch.float64)}
    x = torch.randn(5, 4, dtype=torch.float64)

    m.zero_grad()
    (m(x).square().mean() + proximal_penalty(dict(m.named_parameters()), ref, mu)).backward()
    expected = {n: p.grad.clone() for n, p in m.named_parameters()}

    m.zero_grad()
    cb = ProximalCallback(mu=mu, reference=ref)
    m(x).square().mean().backward()
    cb.on_after_backward(module=m)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], rtol=1e-12, atol=1e-12)


def test_unknown_parameter_and_negative_mu() -> None:
    with pytest.raises(ValueError):
        ProximalCallback(mu=-1.0, reference={})
    cb = ProximalCallback(mu=1.0, reference={"nope": torch.zeros(1)})
    with pytest.raises(KeyError, match="nope"):
        cb.on_after_backward(module=_Tiny())
