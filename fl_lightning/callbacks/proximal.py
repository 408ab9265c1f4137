"""Proximal term mu/2·||P − P_ref||² applied as a gradient (FedProx; FedOPAL Eq. (6)).

The local loop calls ``on_after_backward(module=...)`` right after ``loss.backward()``. Adding
``mu·(P − P_ref)`` to ``P.grad`` there is exactly the gradient of ``mu/2·||P − P_ref||²``, so the
LightningModule's loss stays the task loss (what it logs is comparable across methods) and the same
callback serves every module that names its parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

__all__ = ["ProximalCallback", "proximal_penalty"]


def proximal_penalty(params: Mapping[str, Tensor], reference: Mapping[str, Tensor], mu: float) -> Tensor:
    """mu/2·Σ||p − p_ref||² over the named parameters (for logging and for tests)."""
    total = sum(((params[n] - reference[n].to(params[n])) ** 2).sum() for n in reference)
    return 0.5 * mu * total


class ProximalCallback:
    """Pull the named parameters of a module towards a reference.

    Args:
        mu: strength of the proximal term (>= 0; 0 disables it).
        reference: parameter name (as in ``module.named_parameters()``) → reference tensor.

    Example:
        >>> cb = ProximalCallback(mu=0.1, reference={"model.prompts": p_init})
        >>> loss.backward(); cb.on_after_backward(module=module)
    """

    def __init__(self, *, mu: float, reference: Mapping[str, Tensor]) -> None:
        if mu < 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        self.mu = float(mu)
        self.reference = {n: t.detach().clone() for n, t in reference.items()}

    def _params(self, module: nn.Module) -> dict[str, nn.Parameter]:
        named = dict(module.named_parameters())
        missing = [n for n in self.reference if n not in named]
        if missing:
            raise KeyError(f"ProximalCallback: module has no parameter(s) {missing}")
        return {n: named[n] for n in self.reference}

    @torch.no_grad()
    def on_after_backward(self, *, module: nn.Module, **_: object) -> None:
        if self.mu == 0:
            return
        for name, p in self._params(module).items():
            step = self.mu * (p - self.reference[name].to(p))  # d/dp of mu/2·||p − p_ref||²
            p.grad = step if p.grad is None else p.grad.add_(step)

    def penalty(self, module: nn.Module) -> Tensor:
        return proximal_penalty(self._params(module), self.reference, self.mu)
