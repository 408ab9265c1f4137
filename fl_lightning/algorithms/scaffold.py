"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020) of a
linear head on a frozen backbone's features: FedAvg whose clients correct their drift with control variates.

Algorithm 1 of the paper, option II, on FedAvg's head (``fedavg.py``: the same feature tables, batches, sampling and
evaluation). The server keeps the head x and its control variate c; each client i keeps its own c_i across rounds
(:class:`~fl_lightning.federation.storage.client_state.ClientStateStore`, on disk: flat per-client cost and bounded memory at
any number of clients, exact after a kill). A sampled client downloads (x, c) and runs K local steps of

    y ← y − η_l (g_i(y) + c − c_i)                                         (the correction, added to every gradient)

then c_i⁺ = c_i − c + (x − y)/(K η_l) (option II), and uploads y and Δc_i = c_i⁺ − c_i (twice FedAvg's upload; the
download doubles too). The server moves x ← x + η_g/|S| Σ (y_i − x) and c ← c + 1/N Σ Δc_i, and keeps c_i⁺ for each
client of the round (:func:`client_control`, :func:`server_step`: the whole method on tensors, tested on
heterogeneous least squares, where SCAFFOLD reaches the global optimum and FedAvg stops short).

Departures: η_l is ``train.lr`` and the local optimizer ``train.optimizer: sgd`` (AdamW is refused: option II's
(x − y)/(K η_l) is the mean gradient of plain steps); with ``train.momentum`` > 0 or weight decay the same formula
is taken as the mean update direction, as common implementations do (the paper's analysis is for plain SGD). K is
the steps the client took (its batches × epochs), so clients of different sizes have different K, as in the paper's
experiments. The means over S are unweighted (the paper's); ``scaffold.weighted: true`` weights both by sample
counts, which is the rule of Flower's SCAFFOLD baseline (``baselines/niid_bench``: x ← x + Σ n_i Δy_i / Σ n_i,
c ← c + |S|/N · Σ n_i Δc_i / Σ n_i). Each c_i starts at zero (that baseline starts a client with no saved variate
from a copy of the model's parameters instead). The clients' variates are kept by the simulation, written by the
server from the uploaded Δc_i (c_i⁺ = c_i + Δc_i): the same numbers as a client keeping its own.

Config section ``scaffold``: ``server_lr`` (η_g) and ``weighted``.
The same on every trainable parameter of a whole CNN: ``scaffold_cnn`` (``drift_correction_cnn.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fl_lightning.algorithms.fedavg import HEAD_KEYS as _KEYS
from fl_lightning.algorithms.fedavg import FedAvg, FedAvgConfig, head_numel
from fl_lightning.algorithms.fedavg import flat_head as _flat
from fl_lightning.algorithms.fedavg import unflat_head as _unflat
from fl_lightning.errors import UsageError, check
from fl_lightning.federation.algorithm import Client, Environment, RoundPlan, State, register
from fl_lightning.federation.policies.privacy_coverage import never_covered
from fl_lightning.federation.storage.client_state import ClientStateStore
from fl_lightning.federation.transport import Download, Upload

__all__ = ["GradientCorrection", "Scaffold", "ScaffoldConfig", "StepCounter", "client_control", "require_sgd", "server_step"]

_C = "control."  # the server's control variate c: "control.head.weight", "control.head.bias"
_DC = "delta_control."  # a client's Δc_i in its upload


@dataclass
class ScaffoldConfig(FedAvgConfig):
    weighted: bool = False  # the paper's unweighted means over S (true: y and Δc by sample counts, as Flower's baseline)
    server_lr: float = 1.0  # η_g, the server's step on the mean Δy (Algorithm 1; 1: x becomes the mean y)

    def __post_init__(self) -> None:
        check(self.server_lr > 0, "server_lr", self.server_lr, "a float > 0 (η_g; 1 is the paper's default)")


def client_control(c_i: Tensor, c: Tensor, x: Tensor, y: Tensor, steps: int, lr: float) -> Tensor:
    """Option II: c_i⁺ = c_i − c + (x − y)/(K η_l) after K = ``steps`` local steps of size η_l = ``lr`` from x to y."""
    if steps <= 0:
        return c_i.clone()  # no step taken: nothing learnt about the client's gradient
    return c_i - c + (x - y) / (steps * lr)


def server_step(
    x: Tensor,
    c: Tensor,
    ys: list[Tensor],
    delta_cs: list[Tensor],
    num_clients: int,
    server_lr: float = 1.0,
    weights: list[float] | None = None,
) -> tuple[Tensor, Tensor]:
    """x ← x + η_g · mean_S(y_i − x), c ← c + (|S|/N) · mean_S(Δc_i) (Algorithm 1, lines 16–17: the unweighted means,
    so c's step is (1/N) Σ_S Δc_i). ``weights``: both means weighted by them instead, as Flower's SCAFFOLD baseline
    (niid_bench) weights them by sample counts."""
    if not ys:
        return x, c
    w = torch.as_tensor(weights if weights is not None else [1.0] * len(ys), dtype=torch.float64)
    w = w / w.sum()
    mean_y = sum(wi * yi.double() for wi, yi in zip(w, ys))
    mean_dc = sum(wi * di.double() for wi, di in zip(w, delta_cs))
    x_new = x + (server_lr * (mean_y - x.double())).to(x.dtype)
    c_new = c + (len(ys) / num_clients * mean_dc).to(c.dtype)
    return x_new, c_new


def require_sgd(method: str, optimizer: str) -> None:
    """Refuse (one line) a local optimizer other than plain SGD: option II's c_i⁺ reads (x − y)/(K η_l) as the mean
    gradient of the K steps."""
    if optimizer != "sgd":
        raise UsageError(
            f"usage error: {method} needs train.optimizer: sgd (option II's control variate is the "
            f"mean gradient of plain steps, (x − y)/(K·lr)); got {optimizer}"
        )


class GradientCorrection:
    """Adds (c − c_i) to the gradient of each parameter named in ``correction`` (``module.named_parameters()``'s
    names) after every backward (the corrected step); each correction is moved to its parameter's device and dtype
    once, at the first step."""

    def __init__(self, correction: Mapping[str, Tensor]) -> None:
        self.correction = dict(correction)

    @torch.no_grad()
    def on_after_backward(self, *, module: nn.Module, **_: object) -> None:
        for name, p in module.named_parameters():
            if name in self.correction:
                step = self.correction[name] = self.correction[name].to(p)
                p.grad = step.clone() if p.grad is None else p.grad.add_(step)


@register("scaffold")
class Scaffold(FedAvg):
    config_class = ScaffoldConfig

    privacy_gap = never_covered(
        "it uploads control-variate updates Δc_i beside its weights, which no mechanism here clips or noises "
        "(DP-FedAvg covers weights only)"
    )

    def setup(self, env: Environment) -> None:
        require_sgd(self.name, self.cfg.train.optimizer)
        super().setup(env)
        self.client_state = ClientStateStore.of_run(env.run_dir, "scaffold", len(env.partition), head_numel(self.module))

    def initial_state(self) -> State:
        head = super().initial_state()
        return {**head, **{_C + k: torch.zeros_like(head[k]) for k in _KEYS}}

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        shapes = {k: tuple(download.tensors[k].shape) for k in _KEYS}
        return {**shapes, **{_DC + k: s for k, s in shapes.items()}}

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        head = {k: download.tensors[k] for k in _KEYS}
        c = _flat(download.tensors, _C)
        c_i = torch.from_numpy(self.client_state.read(client.index, round_idx))
        self._local = GradientCorrection(_unflat(c - c_i, head))
        upload = super().client_update(round_idx, client, download)  # FedAvg's local fit, with the correction
        steps = self._last_fit_steps
        delta_c = client_control(c_i, c, _flat(head), _flat(upload.tensors), steps, self.cfg.train.lr) - c_i
        return Upload({**upload.tensors, **_unflat(delta_c, head, _DC)}, {**upload.meta, "local_steps": steps})

    def local_callbacks(self, download: Download) -> list[object]:
        return [self._local, StepCounter(self)]

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        if not uploads:
            self.client_state.write({}, round_idx)  # no client keeps what an aborted attempt of this round wrote
            return state
        head = {k: state[k] for k in _KEYS}
        clients = sorted(uploads)
        ys = [_flat(uploads[i].tensors) for i in clients]
        dcs = [_flat(uploads[i].tensors, _DC) for i in clients]
        weights = [float(uploads[i].meta["num_samples"]) for i in clients] if self.config.weighted else None
        x, c = server_step(_flat(head), _flat(state, _C), ys, dcs, len(self.env.partition), self.config.server_lr, weights)
        # each client of the round keeps c_i⁺ = c_i + Δc_i (client_state.py: exact under a kill)
        self.client_state.write(
            {i: (torch.from_numpy(self.client_state.read(i, round_idx)) + dc).numpy() for i, dc in zip(clients, dcs)}, round_idx
        )
        return {**_unflat(x, head), **_unflat(c, head, _C)}


class StepCounter:
    """Counts the local steps K (one backward each) of the client being trained, in ``owner._last_fit_steps``
    (set to 0 here)."""

    def __init__(self, owner: object) -> None:
        self.owner = owner
        owner._last_fit_steps = 0

    def on_after_backward(self, **_: object) -> None:
        self.owner._last_fit_steps += 1
