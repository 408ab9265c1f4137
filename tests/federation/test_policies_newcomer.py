"""A newcomer's three tasks, each one class in one file (this one), picked up without editing the package
(docs/adding_a_method.md): a new server optimizer (FedLion), a new robust aggregator (the geometric median) and a
new averaging method with its own client-side step (FedAvg with each update's norm clipped), each checked against
a replay by hand of what the engine must have done."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar

import pytest
import torch
from torch import Tensor

from fl_lightning.algorithms.fedavg import FedAvg, FedAvgConfig
from fl_lightning.errors import UsageError
from fl_lightning.federation.algorithm import register
from fl_lightning.federation.policies.policy import register_policy
from fl_lightning.federation.policies.robust_aggregation import RobustAggregator
from fl_lightning.federation.policies.server_optimizer import ServerOptimizer
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.federation.transport import Upload
from tests.tiny_runs import tiny_config


# ------------------------------------------------------------------------------------ 1. a new server optimizer
@register_policy("server_optimizer", "fedlion")
@dataclasses.dataclass(frozen=True)
class FedLion(ServerOptimizer):
    """Lion (Chen et al. 2023, Alg. 2) on the pseudo-gradient g_t = x_t − x̄_t: c = β₁m + (1−β₁)g,
    x_{t+1} = x_t − η(sign(c) + λx_t), m ← β₂m + (1−β₂)g."""

    defaults: ClassVar[dict[str, float]] = {"lr": 0.01, "beta_1": 0.9, "beta_2": 0.99, "weight_decay": 0.0}
    seen: ClassVar[list[tuple[str, Tensor, Tensor]]] = []  # what the engine handed it, for the test's replay

    def step(self, previous, aggregate, moments, round_idx):
        FedLion.seen.extend((k, previous[k].clone(), aggregate[k].clone()) for k in sorted(aggregate))
        return super().step(previous, aggregate, moments, round_idx)

    def step_tensor(self, x: Tensor, mean: Tensor, moments: Mapping[str, Tensor], round_idx: int):
        g = x - mean
        m = moments.get("m", torch.zeros_like(g)).to(g)
        c = self.beta_1 * m + (1 - self.beta_1) * g
        return x - self.lr * (torch.sign(c) + self.weight_decay * x), {"m": self.beta_2 * m + (1 - self.beta_2) * g}


# ------------------------------------------------------------------------------------ 2. a new robust aggregator
@register_policy("aggregator", "geometric_median")
@dataclasses.dataclass(frozen=True)
class GeometricMedian(RobustAggregator):
    """RFA's geometric median (Pillutla et al. 2022, Alg. 2: smoothed Weiszfeld, ν = 1e-6, 8 iterations), weighted
    by the clients' example counts."""

    reads_each_upload = True
    seen: ClassVar[list[tuple[Tensor, Tensor]]] = []  # the rows and weights of every call, for the test's replay

    def combine(self, rows: Tensor, weights: Sequence[float]) -> Tensor:
        alpha = torch.tensor([float(w) for w in weights], dtype=torch.float64)
        GeometricMedian.seen.append((rows.clone(), alpha))
        return weiszfeld(rows, alpha)


def weiszfeld(rows: Tensor, alpha: Tensor, iterations: int = 8, nu: float = 1e-6) -> Tensor:
    x, z = rows.double(), (rows.double() * alpha[:, None]).sum(0) / alpha.sum()
    for _ in range(iterations):
        beta = alpha / torch.clamp((x - z).norm(dim=1), min=nu)
        z = (x * beta[:, None]).sum(0) / beta.sum()
    return z.to(rows.dtype)


# ------------------------------------------------------------------ 3. a new averaging method, its own client step
@dataclasses.dataclass
class FedAvgClippedConfig(FedAvgConfig):
    clip: float = 0.05  # C: each client's update Δ = u − x_t scaled to norm ≤ C before it leaves


@register("fedavg_clipped")
class FedAvgClipped(FedAvg):
    """FedAvg with each update's L2 norm clipped to C on the client: its aggregate is still the weighted mean of what
    the clients upload, so it declares averages_weights and every policy composes with it (a robust rule reads the
    clipped uploads)."""

    averages_weights = True
    config_class = FedAvgClippedConfig
    uploads: ClassVar[list[tuple[dict[str, Tensor], dict[str, Tensor]]]] = []

    def client_update(self, round_idx, client, download) -> Upload:
        upload = super().client_update(round_idx, client, download)
        delta = {k: upload.tensors[k] - download.tensors[k] for k in download.tensors}
        norm = sum(float((d.double() ** 2).sum()) for d in delta.values()) ** 0.5
        scale = min(1.0, self.config.clip / max(float(norm), 1e-12))
        tensors = {k: download.tensors[k] + scale * delta[k] for k in delta}
        FedAvgClipped.uploads.append(
            ({k: v.cpu() for k, v in download.tensors.items()}, {k: v.cpu() for k, v in tensors.items()})
        )
        return Upload(tensors, upload.meta)


@register("fedavg_clipped_server")
class FedAvgClippedOnTheServer(FedAvg):
    """The same clipping done inside aggregate(): no weighted mean of the uploads, so it does not declare
    averages_weights, and a robust aggregator (which would replace that aggregate) is refused."""

    config_class = FedAvgClippedConfig


def _cfg(tmp_path, *extra: str):
    return tiny_config(tmp_path, "--data.num_samples", "300", *extra, rounds=3, clients=5)


def _saved(cfg) -> dict:
    return safe_load(cfg.run_dir / "checkpoints" / "server.pt")


def test_a_server_optimizer_defined_here_runs_by_name_and_the_run_takes_its_steps(tmp_path):
    """The engine hands FedLion x_t and x̄_t each round, keeps its output as x_{t+1} (the next round starts there)
    and its moments in server.pt: replayed by hand from the pairs it was handed, the run's state and m."""
    FedLion.seen.clear()
    cfg = _cfg(tmp_path, "--federation.server_optimizer.name", "fedlion", "--federation.server_optimizer.weight_decay", "0.1")
    Simulation(cfg=cfg, loggers=[]).run()
    assert len(FedLion.seen) == 3 * 2  # 3 rounds × the head's two tensors
    by_key: dict[str, list[tuple[Tensor, Tensor]]] = {}
    for key, x, mean in FedLion.seen:
        by_key.setdefault(key, []).append((x, mean))
    saved = _saved(cfg)
    for key, steps in by_key.items():
        m = torch.zeros_like(steps[0][0])
        x_next = None
        for x, mean in steps:
            if x_next is not None:
                assert torch.equal(x, x_next), key  # the round started from the optimizer's output
            g = x - mean
            x_next = x - 0.01 * (torch.sign(0.9 * m + (1 - 0.9) * g) + 0.1 * x)
            m = 0.99 * m + (1 - 0.99) * g
        assert torch.equal(saved["state"][key], x_next) and torch.equal(saved["server_optimizer"][f"m/{key}"], m), key
    with pytest.raises(UsageError, match="fedlion has no tau"):
        Simulation(
            cfg=_cfg(tmp_path / "bad", "--federation.server_optimizer.name", "fedlion", "--federation.server_optimizer.tau", "1"),
            loggers=[],
        )


def test_a_robust_aggregator_defined_here_runs_by_name_and_its_rule_is_the_new_state(tmp_path):
    GeometricMedian.seen.clear()
    cfg = _cfg(tmp_path, "--federation.aggregator.name", "geometric_median")
    Simulation(cfg=cfg, loggers=[]).run()
    assert len(GeometricMedian.seen) == 3 and all(rows.shape[0] == 5 for rows, _ in GeometricMedian.seen)
    state = _saved(cfg)["state"]
    flat = torch.cat([state[k].reshape(-1) for k in state if state[k].is_floating_point()])
    rows, weights = GeometricMedian.seen[-1]
    assert torch.equal(flat, weiszfeld(rows, weights))  # the last round's rule, replayed, is the run's final state
    assert not torch.equal(flat, (rows.double() * weights[:, None]).sum(0).div(weights.sum()).to(rows.dtype))
    with pytest.raises(UsageError, match="did you mean 'geometric_median'"):
        Simulation(cfg=_cfg(tmp_path / "typo", "--federation.aggregator.name", "geometric_medain"), loggers=[])


def test_an_averaging_method_defined_here_keeps_its_clipping_under_krum(tmp_path):
    FedAvgClipped.uploads.clear()
    cfg = _cfg(
        tmp_path,
        "--algorithm",
        "fedavg_clipped",
        "--federation.aggregator.name",
        "krum",
        "--federation.aggregator.num_malicious",
        "1",
    )
    Simulation(cfg=cfg, loggers=[]).run()
    assert len(FedAvgClipped.uploads) == 15
    for downloaded, sent in FedAvgClipped.uploads:
        norm = torch.sqrt(sum(((sent[k] - downloaded[k]).double() ** 2).sum() for k in sent))
        assert float(norm) <= 0.05 + 1e-6
    # Krum keeps one client's upload: the final state is one of the last round's clipped uploads
    state = _saved(cfg)["state"]
    last_round = FedAvgClipped.uploads[-5:]
    assert any(all(torch.equal(state[k], sent[k].to(state[k].dtype)) for k in sent) for _, sent in last_round)


def test_a_method_that_does_not_declare_averages_weights_is_refused_a_robust_rule_in_one_line(tmp_path):
    with pytest.raises(UsageError) as err:
        Simulation(cfg=_cfg(tmp_path, "--algorithm", "fedavg_clipped_server", "--federation.aggregator.name", "krum"), loggers=[])
    message = str(err.value)
    assert "federation.aggregator.name=krum" in message and "averages_weights" in message and "\n" not in message
    assert "fedavg_clipped," in message and "fedavg_clipped_server" not in message.split(";")[0]  # from the registry
