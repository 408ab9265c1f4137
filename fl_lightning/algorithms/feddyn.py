"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021) of a linear head on a frozen
backbone's features: FedAvg whose clients' objectives are re-weighted each round so that their stationary points
agree with the global one.

Algorithm 1 of the paper, in the form of the authors' code (``alpemreacar/FedDyn``, ``train_FedDyn``), on FedAvg's
head (``fedavg.py``: the same feature tables, batches, sampling and evaluation). Each client k keeps
h_k = Σ (θ_k − θ_cloud) over the rounds it took part in — ``−∇L_k(θ_k)/α`` in the paper's notation — across rounds
(:class:`~fl_lightning.federation.storage.client_state.ClientStateStore`, on disk, exact after a kill). A sampled client
downloads the cloud model θ_cloud and minimises, by ``train.epochs`` of local steps,

    L_k(θ) + α_k ⟨θ, h_k − θ_cloud⟩ + α_k/2 ‖θ‖²       (gradient: ∇L_k(θ) + α_k (θ − θ_cloud + h_k), Eq. (1))

and uploads θ_k (FedAvg's traffic). The server keeps h_k ← h_k + θ_k − θ_cloud for each client of the round and
the sum H = Σ_k h_k over all N clients, and sets (:func:`server_step`)

    θ_avg = mean_P θ_k,        θ_cloud = θ_avg + H / N        (the paper's θ^t = mean_P θ_k − h^t/α, h^t = −α H/N)

θ_avg is the head evaluated each round (the code's "sel" model); θ_cloud is what clients download next round.
α_k = α / (n_k / mean_j n_j) by default (the code's "adaptive alpha coef": clients with more data are pulled less).

Departures from the authors' code: no per-round learning-rate decay (``lr_decay_per_round``: ``train.lr`` is
constant) and no gradient clipping (their ``max_norm = 10``); the α_k/2 ‖θ‖² term is added to the gradient rather
than folded into SGD's weight decay (the same step, ``train.weight_decay`` kept separate); any ``train.optimizer``
runs (theirs is SGD). Not run: DP (``federation.privacy``), server optimizers, robust aggregators and attacks — the
cloud model is not the mean of the clients' weights.

Config section ``feddyn``: ``alpha`` (α) and ``adaptive_alpha``.
The same on every trainable parameter of a whole CNN: ``feddyn_cnn`` (``drift_correction_cnn.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from fl_lightning.algorithms.fedavg import HEAD_KEYS as _KEYS
from fl_lightning.algorithms.fedavg import FedAvg, FedAvgConfig, head_numel
from fl_lightning.algorithms.fedavg import flat_head as _flat
from fl_lightning.algorithms.fedavg import unflat_head as _unflat
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import Client, Environment, RoundPlan, State, register
from fl_lightning.federation.policies.privacy_coverage import never_covered
from fl_lightning.federation.storage.client_state import ClientStateStore
from fl_lightning.federation.transport import Download, Upload

if TYPE_CHECKING:
    from fl_lightning.federation.algorithm import RoundHistory

__all__ = ["DynamicRegulariser", "FedDyn", "FedDynConfig", "client_alphas", "server_step"]

_CLOUD = "cloud."  # θ_cloud: what the clients download
_H = "drift_sum."  # H = Σ_k h_k over every client


@dataclass
class FedDynConfig(FedAvgConfig):
    alpha: float = 0.01  # α of the dynamic regulariser (the paper tunes {0.1, 0.01, 0.001}; the code's default 0.01)
    adaptive_alpha: bool = True  # α_k = α / (n_k / mean n), as the authors' code; false: α for every client

    def __post_init__(self) -> None:
        check(self.alpha > 0, "alpha", self.alpha, "a float > 0 (α of FedDyn's regulariser)")


def client_alphas(alpha: float, sizes: Sequence[int], adaptive: bool) -> np.ndarray:
    """α_k of every client: α / (n_k / mean_j n_j) (the code's "adaptive alpha coef", its weight_list), or α for all."""
    n = np.asarray(sizes, dtype=np.float64)
    return alpha / (n / n.mean()) if adaptive else np.full(len(n), alpha / 1.0)


def server_step(cloud: Tensor, drift_sum: Tensor, thetas: list[Tensor], num_clients: int) -> tuple[Tensor, Tensor, Tensor]:
    """One round's server update: ``(θ_avg, H', θ_cloud')`` with θ_avg = mean_P θ_k, H' = H + Σ_P (θ_k − θ_cloud),
    θ_cloud' = θ_avg + H'/N (module docstring)."""
    if not thetas:
        return cloud, drift_sum, cloud
    stacked = torch.stack([t.double() for t in thetas])
    avg = stacked.mean(0)
    new_sum = drift_sum.double() + (stacked - cloud.double()).sum(0)
    return avg.to(cloud.dtype), new_sum.to(drift_sum.dtype), (avg + new_sum / num_clients).to(cloud.dtype)


class DynamicRegulariser:
    """Adds α_k (θ − θ_cloud + h_k) to the gradient of each parameter named in ``cloud`` (``module.named_parameters()``'s
    names) after every backward (Eq. (1)'s terms); each offset h_k − θ_cloud is moved to its parameter's device and
    dtype once, at the first step."""

    def __init__(self, alpha: float, cloud: Mapping[str, Tensor], drift: Mapping[str, Tensor]) -> None:
        self.alpha = float(alpha)
        self.offset = {k: drift[k] - cloud[k] for k in cloud}  # h_k − θ_cloud

    @torch.no_grad()
    def on_after_backward(self, *, module: nn.Module, **_: object) -> None:
        for name, p in module.named_parameters():
            if name in self.offset:
                offset = self.offset[name] = self.offset[name].to(p)
                step = self.alpha * (p + offset)
                p.grad = step if p.grad is None else p.grad.add_(step)


@register("feddyn")
class FedDyn(FedAvg):
    config_class = FedDynConfig

    # federation.privacy: not covered: the cloud model adds every client's accumulated drift H/N to the mean of the
    # round's weights, so DP-FedAvg's bound on the mean's sensitivity does not bound what the server publishes.
    privacy_gap = never_covered(
        "its cloud model adds the clients' accumulated drift to the mean of their weights, which DP-FedAvg's "
        "sensitivity bound (the mean's) does not cover"
    )

    def setup(self, env: Environment) -> None:
        super().setup(env)
        self.client_state = ClientStateStore.of_run(env.run_dir, "feddyn", len(env.partition), head_numel(self.module))
        self._alphas = client_alphas(self.config.alpha, [len(p) for p in env.partition], self.config.adaptive_alpha)

    def initial_state(self) -> State:
        head = super().initial_state()
        return {**head, **{_CLOUD + k: head[k].clone() for k in _KEYS}, **{_H + k: torch.zeros_like(head[k]) for k in _KEYS}}

    def plan(self, round_idx: int, clients: list[int], state: State, history: RoundHistory) -> RoundPlan:
        """Each client downloads θ_cloud (as ``head.*``): FedAvg's download size."""
        return RoundPlan({c: Download({k: state[_CLOUD + k] for k in _KEYS}) for c in clients})

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        cloud = {k: download.tensors[k] for k in _KEYS}
        drift = _unflat(torch.from_numpy(self.client_state.read(client.index, round_idx)), cloud)
        self._local = DynamicRegulariser(float(self._alphas[client.index]), cloud, drift)
        return super().client_update(round_idx, client, download)

    def local_callbacks(self, download: Download) -> list[object]:
        return [self._local]

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        clients = sorted(uploads)
        head = {k: state[k] for k in _KEYS}
        cloud = _flat(state, _CLOUD)
        thetas = [_flat(uploads[i].tensors) for i in clients]
        # each client of the round keeps h_k + θ_k − θ_cloud (client_state.py: exact under a kill; called with no
        # client too, so nothing an aborted attempt of this round wrote stays)
        self.client_state.write(
            {i: self.client_state.read(i, round_idx) + (t - cloud).numpy() for i, t in zip(clients, thetas)}, round_idx
        )
        if not thetas:
            return state
        avg, drift_sum, new_cloud = server_step(cloud, _flat(state, _H), thetas, len(self.env.partition))
        return {**_unflat(avg, head), **_unflat(new_cloud, head, _CLOUD), **_unflat(drift_sum, head, _H)}
