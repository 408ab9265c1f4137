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

Each optimizer is a small subclass of :class:`ServerOptimizer` registered by name
(:func:`~fl_lightning.federation.policies.policy.register_policy`): it states the keys of
``federation.server_optimizer`` it reads, with their defaults (``defaults``), and its elementwise step
(:meth:`ServerOptimizer.step_tensor`). A new one (FedAdamW, FedLion) is one such class in one file, anywhere:
docs/adding_a_method.md, "A new server optimizer".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from fl_lightning.errors import UsageError
from fl_lightning.federation.policies.policy import RoundContext, UpdatePolicy, named, register_policy

__all__ = ["HYPER_PARAMETERS", "ServerOptimizer", "FedAvgM", "FedAdagrad", "FedAdam", "FedYogi"]

# the keys of federation.server_optimizer an optimizer may read (each states which, with its defaults)
HYPER_PARAMETERS = ("lr", "momentum", "beta_1", "beta_2", "tau", "weight_decay")


@dataclasses.dataclass(frozen=True)
class ServerOptimizer(UpdatePolicy):
    """``fedavg``: the aggregate x̄_t is the new state. The base of every server optimizer, with its
    hyper-parameters resolved (the module docstring's η, μ, β₁, β₂, τ; λ for a decoupled weight decay)."""

    defaults: ClassVar[dict[str, float]] = {}  # the keys it reads, with their defaults (Flower's where it has them)
    lr: float = 1.0
    momentum: float = 0.0
    beta_1: float = 0.0
    beta_2: float = 0.0
    tau: float = 0.0
    weight_decay: float = 0.0

    @classmethod
    def of(cls, config: Any) -> ServerOptimizer:
        """``federation.server_optimizer``: the optimizer named ``config.name``, each unset (null) value its
        default; a value it does not read, or a name nobody registered, is one line (:class:`UsageError`)."""
        chosen = named("server_optimizer", config.name, "federation.server_optimizer.name")
        unused = chosen.unused_setting(config)
        if unused is not None:
            raise UsageError(f"usage error: {unused}")
        given = {k: getattr(config, k) for k in HYPER_PARAMETERS if getattr(config, k, None) is not None}
        return chosen(**{**chosen.defaults, **given})

    @classmethod
    def unused_setting(cls, config: Any) -> str | None:
        """The first value of ``config`` this optimizer does not read, as one line (None: there is none)."""
        for key in HYPER_PARAMETERS:
            value = getattr(config, key, None)
            if value is not None and key not in cls.defaults:
                return (
                    f"federation.server_optimizer.{key}={value}: null: {config.name} has no {key} "
                    f"(it uses {', '.join(cls.defaults) or 'none'})"
                )
        return None

    @classmethod
    def refusal(cls, cfg: Any, algorithm: type) -> str | None:
        return cls.unused_setting(cfg.federation.server_optimizer)

    @classmethod
    def build(cls, cfg: Any, setup: Any) -> ServerOptimizer:
        return cls.of(cfg.federation.server_optimizer)

    @property
    def is_mean(self) -> bool:
        return type(self).step_tensor is ServerOptimizer.step_tensor

    def on_aggregate(
        self, aggregate: dict[str, Tensor], ctx: RoundContext, state: Mapping[str, Tensor]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The server's step from x_t = ``ctx.previous`` to x_{t+1} on the keys the method averages; its moments are
        this policy's state."""
        averaged = {k: t for k, t in aggregate.items() if ctx.averages(k)}
        stepped, moments = self.step(ctx.previous, averaged, state, ctx.round_idx)
        return {**aggregate, **stepped}, moments

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
            own = {name.partition("/")[0]: t for name, t in moments.items() if name.partition("/")[2] == key}
            state[key], moved = self.step_tensor(x.to(mean.device, dtype), mean.to(dtype), own, round_idx)
            state[key] = state[key].to(x.dtype)
            new_moments.update({f"{name}/{key}": t for name, t in moved.items()})
        return state, new_moments

    def step_tensor(
        self, x: Tensor, mean: Tensor, moments: Mapping[str, Tensor], round_idx: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """One tensor's step: x_{t+1} from x_t = ``x`` and x̄_t = ``mean`` with this tensor's ``moments`` by short
        name (``"m"``, ``"v"``; absent in the first round), and the moments to keep. The base: x̄_t, none kept."""
        return mean, {}


register_policy("server_optimizer", "fedavg")(ServerOptimizer)


@register_policy("server_optimizer", "fedavgm")
@dataclasses.dataclass(frozen=True)
class FedAvgM(ServerOptimizer):
    """FedAvgM (Hsu et al. 2019; Flower's ``FedAvgM``): p_t = x_t − x̄_t, v_t = μ·v_{t−1} + p_t, x_{t+1} = x_t − η·v_t."""

    defaults: ClassVar[dict[str, float]] = {"lr": 1.0, "momentum": 0.0}

    def step_tensor(self, x: Tensor, mean: Tensor, moments: Mapping[str, Tensor], round_idx: int):
        p = x - mean
        v = p if (self.momentum == 0.0 or "v" not in moments) else self.momentum * moments["v"].to(p) + p
        return x - self.lr * v, ({"v": v} if self.momentum != 0.0 else {})


@dataclasses.dataclass(frozen=True)
class _Adaptive(ServerOptimizer):
    """Reddi et al.'s Alg. 2: Δ_t = x̄_t − x_t, m_t = β₁m_{t−1} + (1−β₁)Δ_t, x_{t+1} = x_t + η_t·m_t/(√v_t + τ), with
    v_t the subclass's :meth:`second_moment` and η_t its :meth:`step_size`."""

    def step_tensor(self, x: Tensor, mean: Tensor, moments: Mapping[str, Tensor], round_idx: int):
        delta = mean - x
        m = self.beta_1 * moments.get("m", torch.zeros_like(delta)).to(delta) + (1 - self.beta_1) * delta
        v = self.second_moment(moments.get("v", torch.zeros_like(delta)).to(delta), delta * delta)
        return x + self.step_size(round_idx) * m / (torch.sqrt(v) + self.tau), {"m": m, "v": v}

    def second_moment(self, v: Tensor, square: Tensor) -> Tensor:
        raise NotImplementedError

    def step_size(self, round_idx: int) -> float:
        return self.lr


@register_policy("server_optimizer", "fedadagrad")
@dataclasses.dataclass(frozen=True)
class FedAdagrad(_Adaptive):
    """FedAdagrad: v_t = v_{t−1} + Δ_t² (Flower's ``FedAdagrad``)."""

    defaults: ClassVar[dict[str, float]] = {"lr": 0.1, "beta_1": 0.0, "tau": 1e-9}

    def second_moment(self, v: Tensor, square: Tensor) -> Tensor:
        return v + square


@register_policy("server_optimizer", "fedadam")
@dataclasses.dataclass(frozen=True)
class FedAdam(_Adaptive):
    """FedAdam: v_t = β₂v_{t−1} + (1−β₂)Δ_t², η_t = η·√(1−β₂^{t+1})/(1−β₁^{t+1}) with t the 1-based server round
    (Flower's ``FedAdam`` and its bias correction)."""

    defaults: ClassVar[dict[str, float]] = {"lr": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-9}

    def second_moment(self, v: Tensor, square: Tensor) -> Tensor:
        return self.beta_2 * v + (1 - self.beta_2) * square

    def step_size(self, round_idx: int) -> float:
        t = round_idx + 1  # Flower's 1-based server round
        return self.lr * math.sqrt(1 - self.beta_2 ** (t + 1)) / (1 - self.beta_1 ** (t + 1))


@register_policy("server_optimizer", "fedyogi")
@dataclasses.dataclass(frozen=True)
class FedYogi(_Adaptive):
    """FedYogi: v_t = v_{t−1} − (1−β₂)Δ_t²·sign(v_{t−1} − Δ_t²) (Flower's ``FedYogi``)."""

    defaults: ClassVar[dict[str, float]] = {"lr": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3}

    def second_moment(self, v: Tensor, square: Tensor) -> Tensor:
        return v - (1 - self.beta_2) * square * torch.sign(v - square)
