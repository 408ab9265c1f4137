"""Server optimizers of averaging methods: FedAvgM (Hsu et al. 2019) and FedAdagrad, FedAdam, FedYogi (Reddi et
al., "Adaptive Federated Optimization", ICLR 2021, Alg. 2), computed as Flower's strategies of the same names.

The method's aggregate x̄_t (its weighted mean of the clients' weights, after ``federation.privacy``) is read as a
pseudo-gradient Δ_t = x̄_t − x_t against the state x_t the round started from, and the new state is

* ``fedavg``      x_{t+1} = x̄_t (the aggregate itself: today's runs, bit for bit);
* ``fedavgm``     p_t = x_t − x̄_t; v_t = p_t in round 1, else μ·v_{t−1} + p_t (μ = 0: v_t = p_t);
                  x_{t+1} = x_t − η·v_t;
* ``fedadagrad``  m_t = β₁m_{t−1} + (1−β₁)Δ_t;  v_t = v_{t−1} + Δ_t²;                         x_{t+1} = x_t + η·m_t/(√v_t + τ);
* ``fedadam``     m_t as above;  v_t = β₂v_{t−1} + (1−β₂)Δ_t²;
                  x_{t+1} = x_t + η_t·m_t/(√v_t + τ), η_t = η·√(1−β₂^{t+1})/(1−β₁^{t+1}) (Flower's bias correction,
                  t the 1-based server round);
* ``fedyogi``     m_t as above;  v_t = v_{t−1} − (1−β₂)Δ_t²·sign(v_{t−1} − Δ_t²);             x_{t+1} = x_t + η·m_t/(√v_t + τ);

with m and v starting at zero, elementwise, over every floating-point tensor the aggregate and x_t share (any other
tensor, e.g. a BatchNorm count, is the aggregate's). The moments are tensors of the run's state
(:class:`~fl_lightning.federation.run_state.RunState`'s ``server_optimizer``), checkpointed with it, so a resumed
run takes the same steps. Applied after the privacy mechanism, the step is post-processing of what it released:
it costs no ε.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from fl_lightning.config import ServerOptimizerConfig

__all__ = ["ServerOptimizer"]

# Flower's defaults (flwr.server.strategy: FedAvgM, FedAdagrad, FedAdam, FedYogi), one per config.SERVER_OPTIMIZERS
_DEFAULTS: dict[str, dict[str, float]] = {
    "fedavg": {},
    "fedavgm": {"lr": 1.0, "momentum": 0.0},
    "fedadagrad": {"lr": 0.1, "beta_1": 0.0, "tau": 1e-9},
    "fedadam": {"lr": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-9},
    "fedyogi": {"lr": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3},
}


@dataclasses.dataclass(frozen=True)
class ServerOptimizer:
    """One server optimizer with its hyper-parameters resolved (the module docstring's η, μ, β₁, β₂, τ)."""

    name: str = "fedavg"
    lr: float = 1.0
    momentum: float = 0.0
    beta_1: float = 0.0
    beta_2: float = 0.0
    tau: float = 0.0

    @classmethod
    def of(cls, config: ServerOptimizerConfig) -> ServerOptimizer:
        """``federation.server_optimizer`` with each unset (null) value Flower's default for that optimizer."""
        given = {k: getattr(config, k) for k in ("lr", "momentum", "beta_1", "beta_2", "tau")}
        return cls(config.name, **{**_DEFAULTS[config.name], **{k: v for k, v in given.items() if v is not None}})

    @property
    def is_mean(self) -> bool:
        return self.name == "fedavg"

    def step(
        self, previous: Mapping[str, Tensor], aggregate: Mapping[str, Tensor], moments: Mapping[str, Tensor], round_idx: int
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The new state and moments after round ``round_idx`` (0-based) from x_t = ``previous`` and x̄_t =
        ``aggregate`` (module docstring); ``moments`` (``"m/<key>"``, ``"v/<key>"``) are not changed in place."""
        state, new_moments = dict(aggregate), dict(moments)
        if self.is_mean:
            return state, new_moments
        for key, mean in aggregate.items():
            x = previous.get(key)
            if x is None or not (mean.is_floating_point() and x.is_floating_point()) or x.shape != mean.shape:
                continue
            dtype = torch.promote_types(x.dtype, torch.float32)  # the step in at least float32, where x̄ lies
            state[key], moved = self._step_tensor(x.to(mean.device, dtype), mean.to(dtype), key, moments, round_idx)
            state[key] = state[key].to(x.dtype)
            new_moments.update(moved)
        return state, new_moments

    def _step_tensor(
        self, x: Tensor, mean: Tensor, key: str, moments: Mapping[str, Tensor], round_idx: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        m_key, v_key = f"m/{key}", f"v/{key}"
        if self.name == "fedavgm":
            p = x - mean
            v = p if (self.momentum == 0.0 or v_key not in moments) else self.momentum * moments[v_key].to(p) + p
            return x - self.lr * v, ({v_key: v} if self.momentum != 0.0 else {})
        delta = mean - x
        m = self.beta_1 * moments.get(m_key, torch.zeros_like(delta)).to(delta) + (1 - self.beta_1) * delta
        v = moments.get(v_key, torch.zeros_like(delta)).to(delta)
        square = delta * delta
        if self.name == "fedadagrad":
            v = v + square
        elif self.name == "fedadam":
            v = self.beta_2 * v + (1 - self.beta_2) * square
        else:  # fedyogi
            v = v - (1 - self.beta_2) * square * torch.sign(v - square)
        lr = self.lr
        if self.name == "fedadam":
            t = round_idx + 1  # Flower's 1-based server round
            lr = self.lr * math.sqrt(1 - self.beta_2 ** (t + 1)) / (1 - self.beta_1 ** (t + 1))
        return x + lr * m / (torch.sqrt(v) + self.tau), {m_key: m, v_key: v}
