"""FeDiSyn's per-device contribution G_i, measured from LoRA gradients during local training.

The contribution-aware depth choice (CLC) scores device i by how much its LoRA layers still learn:

    G_i = Σ_{l ∈ layers of device i} ||∇_{θ_l} F_i||²,

the squared L2 norm of the gradients of its LoRA parameters θ_l, measured over the last round.
:class:`GradientContribution` measures the per-layer terms g_{i,l} while the client trains; the
pure estimator that fills in the layers a device did not train (which the depth planner needs to
price a deeper assignment) lives next to CLC, in :mod:`fl_lightning.systems.contributions`.

Sum vs mean over local steps: we take the MEAN over the backward passes of the round,
g_{i,l} = (1/S) Σ_s ||∇_{θ_l} F_i^{(s)}||². The paper's "gradients of the last round" does not fix
the aggregation over steps; a sum would grow with the number of local steps (i.e. with the data
size and batch size of a device) and mix data volume into a score that should say how much a
layer still learns. The mean keeps devices with different step counts comparable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fl_lightning.models.lora import is_lora_param, lora_layer_index

__all__ = ["GradientContribution"]


class GradientContribution:
    """Callback accumulating per-LoRA-layer squared gradient norms over a client's local steps.

    The local loop calls :meth:`on_after_backward` right after ``loss.backward()`` (same hook as
    ``ProximalCallback``); call :meth:`reset` before each client. Layers whose LoRA has no gradient
    (frozen, outside the client's depth) are not recorded.

    Example::

        contribution = GradientContribution()
        contribution.reset()
        ...  # loss.backward(); fabric.call("on_after_backward", module=module)
        G_i = contribution.total()
    """

    def __init__(self) -> None:
        # per layer: a Python float (nothing measured since a load) or a float64 tensor on the gradients' device,
        # the running sum; read back (one host sync per layer) only by per_layer/state_dict, once per client
        self._sums: dict[int, float | torch.Tensor] = {}
        self._steps = 0
        self._module: nn.Module | None = None  # the module the groups below are of
        self._groups: list[tuple[int, list[nn.Parameter]]] = []  # (block index, its LoRA parameters), in order

    def reset(self) -> None:
        """Forget the measurements (start of a client's local training)."""
        self._sums = {}
        self._steps = 0

    def _layers(self, module: nn.Module) -> list[tuple[int, list[nn.Parameter]]]:
        """``module``'s LoRA parameters grouped by block index, in parameter order: found by name once per module,
        not at every step."""
        if module is not self._module:
            groups: dict[int, list[nn.Parameter]] = {}
            for name, param in module.named_parameters():
                if is_lora_param(name):
                    groups.setdefault(lora_layer_index(name), []).append(param)
            self._module, self._groups = module, list(groups.items())
        return self._groups

    @torch.no_grad()
    def on_after_backward(self, *, module: nn.Module, **_: Any) -> None:
        """Add ||∇θ_l||² of every LoRA layer l that has a gradient after this backward pass (on the device: no host
        sync here)."""
        for layer, params in self._layers(module):
            step: torch.Tensor | None = None
            for param in params:
                if param.grad is None:
                    continue
                sq = param.grad.detach().double().pow(2).sum()
                step = sq if step is None else step + sq
            if step is not None:  # the same float64 additions, in the same order, as summing Python floats
                self._sums[layer] = self._sums.get(layer, 0.0) + step
        self._steps += 1

    def per_layer(self) -> dict[int, float]:
        """Mean over the recorded steps of the squared LoRA-gradient norm, per block index."""
        if self._steps == 0:
            return {}
        return {layer: float(total) / self._steps for layer, total in sorted(self._sums.items())}

    def total(self) -> float:
        """G_i: the sum of :meth:`per_layer` over the device's LoRA layers (0.0 before any step)."""
        return float(sum(self.per_layer().values()))

    def state_dict(self) -> dict[str, Any]:
        return {"sums": {k: float(v) for k, v in self._sums.items()}, "steps": self._steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._sums = {int(k): float(v) for k, v in state["sums"].items()}
        self._steps = int(state["steps"])
