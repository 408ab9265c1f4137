"""SCAFFOLD and FedDyn of a whole timm CNN: ``fedavg_cnn``'s clients (every parameter trained end to end; the same
model, loaders, augmentation and evaluation, ``fedavg_cnn.py``) with the drift corrections of ``scaffold.py`` and
``feddyn.py`` added to each local step.

``scaffold_cnn`` — SCAFFOLD (Karimireddy et al., ICML 2020), Algorithm 1 option II: a sampled client downloads
(x, c), runs K local steps y ← y − η_l (g_i(y) + c − c_i) and uploads y and Δc_i = c_i⁺ − c_i with
c_i⁺ = c_i − c + (x − y)/(K η_l); the server moves x ← x + η_g·mean_S(y_i − x), c ← c + (|S|/N)·mean_S(Δc_i).
``feddyn_cnn`` — FedDyn (Acar et al., ICLR 2021), Algorithm 1 as the authors' code: a sampled client downloads
θ_cloud and adds α_k (θ − θ_cloud + h_k) to each gradient (the gradient of −⟨∇L_k(θ_k^{t−1}), θ⟩ +
α/2 ‖θ − θ^{t−1}‖², Eq. (1), with h_k = −∇L_k/α); the server keeps h_k ← h_k + θ_k − θ_cloud, H = Σ_k h_k, and sets
θ_avg = mean_P θ_k (evaluated) and θ_cloud = θ_avg + H/N (downloaded next round).

The math is the head versions', not a copy: :func:`~fl_lightning.algorithms.scaffold.client_control`,
:func:`~fl_lightning.algorithms.scaffold.server_step` and :func:`~fl_lightning.algorithms.feddyn.server_step` on the
flat float32 vector of the CNN's trainable parameters (``flat_named``, state-dict order), the gradient hooks
:class:`~fl_lightning.algorithms.scaffold.GradientCorrection` and
:class:`~fl_lightning.algorithms.feddyn.DynamicRegulariser` on the module's parameters, and the per-client store
:class:`~fl_lightning.federation.storage.client_state.ClientStateStore` (c_i or h_k on disk, P = the trainable parameters:
``checkpoints/client_state/scaffold_cnn`` or ``feddyn_cnn``). The server's c, or θ_cloud and H, are in the run's
state (``control.<name>``; ``cloud.<name>``, ``drift_sum.<name>``), so a resume is exact. Each module docstring's
departures hold here too (SCAFFOLD: SGD only, momentum read as the mean update direction, per-client K, c_i from
zero; FedDyn: constant lr, no clipping, α_k/2‖θ‖² in the gradient, adaptive α_k).

Departures of the whole model. Only trainable parameters (``requires_grad``) carry a control variate or a drift;
BatchNorm's buffers (running mean and variance, the batch counter) have none — as Flower's SCAFFOLD baseline
(``baselines/niid_bench``), whose c_i is a list over ``net.parameters()`` — and are averaged as ``fedavg_cnn``
averages them (float64 fold, the counter rounded), weighted by sample counts when the section's ``weighted`` is
true; η_g and H/N do not touch them. ``weighted`` thus weighs SCAFFOLD's parameter means too (the head's rule) but
only FedDyn's buffers (its θ_avg is the paper's plain mean over P). The server holds the round's flat uploads at
once (|S| models, the pure functions' lists), where ``fedavg_cnn`` folds them one at a time.

Documented in docs/client_drift.md, "On the whole model". Config sections ``scaffold_cnn`` (``server_lr``,
``weighted``, ``augment``) and ``feddyn_cnn`` (``alpha``, ``adaptive_alpha``, ``weighted``, ``augment``): the head
sections' keys plus ``fedavg_cnn.augment``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fl_lightning.algorithms.fedavg import flat_named, unflat_named
from fl_lightning.algorithms.fedavg_cnn import FedAvgCNN
from fl_lightning.algorithms.feddyn import DynamicRegulariser, FedDyn, FedDynConfig, client_alphas
from fl_lightning.algorithms.feddyn import server_step as feddyn_server_step
from fl_lightning.algorithms.scaffold import (
    GradientCorrection,
    Scaffold,
    ScaffoldConfig,
    StepCounter,
    client_control,
    require_sgd,
)
from fl_lightning.algorithms.scaffold import server_step as scaffold_server_step
from fl_lightning.federation.aggregate import WeightedMean
from fl_lightning.federation.algorithm import Client, Environment, RoundPlan, State, register
from fl_lightning.federation.policies.privacy_coverage import gap_by
from fl_lightning.federation.storage.client_state import ClientStateStore
from fl_lightning.federation.transport import Download, Upload

if TYPE_CHECKING:
    from fl_lightning.federation.algorithm import RoundHistory

__all__ = ["FedDynCNN", "FedDynCNNConfig", "ScaffoldCNN", "ScaffoldCNNConfig"]

_MODULE = "model."  # ImageClassifier's parameter names: "model." + the CNN's state-dict key
_C, _DC = "control.", "delta_control."  # SCAFFOLD's c in the state, a client's Δc_i in its upload
_CLOUD, _H = "cloud.", "drift_sum."  # FedDyn's θ_cloud and H in the state


@dataclass
class ScaffoldCNNConfig(ScaffoldConfig):
    weighted: bool = False  # the paper's unweighted means over S (true: y, Δc and the BatchNorm buffers by sample counts)
    augment: bool = False  # CIFAR's pad (S/8) + random crop + horizontal flip on the clients' images (fedavg_cnn's)


@dataclass
class FedDynCNNConfig(FedDynConfig):
    weighted: bool = True  # average the BatchNorm buffers by sample counts, as fedavg_cnn (θ_avg: the plain mean over P)
    augment: bool = False  # CIFAR's pad (S/8) + random crop + horizontal flip on the clients' images (fedavg_cnn's)


class _CorrectedCNN(FedAvgCNN):
    """What both methods add to ``fedavg_cnn``: the split of the state into trainable parameters (corrected, kept
    per client) and buffers (averaged), the client store, and one pass over a round's uploads."""

    true_precision = (
        "its control variates and drifts are differences of weights over a round ((x − y)/(K·lr), "
        "θ_k − θ_cloud) that half-precision weights round away — use bf16-mixed"
    )

    def setup(self, env: Environment) -> None:
        super().setup(env)
        self._params = tuple(k for k, p in self.module.model.named_parameters() if p.requires_grad)
        self._buffers = tuple(k for k in self._initial if k not in set(self._params))
        numel = sum(self._initial[k].numel() for k in self._params)
        self.client_state = ClientStateStore.of_run(env.run_dir, self.name, len(env.partition), numel)
        self._local: list[object] = []  # the gradient hooks of the client being trained (client_update sets them)

    def local_callbacks(self) -> list[object]:
        return [*super().local_callbacks(), *self._local]

    def _as_module_names(self, vector: Tensor) -> dict[str, Tensor]:
        """A flat parameter vector as ``{"model." + name: tensor}``: the gradient hooks' names."""
        return unflat_named(vector, self._initial, self._params, _MODULE)

    def _read_uploads(
        self, uploads: Mapping[int, Upload], prefixes: tuple[str, ...]
    ) -> tuple[list[int], dict[str, list[Tensor]], list[float], State]:
        """One pass over the round's uploads (each read once): the clients in order, each prefix's flat trainable
        parameters per client, the sample counts, and the buffers' FedAvg mean (weighted by the counts when the
        section's ``weighted``, else equal)."""
        clients, flats, counts, fold = sorted(uploads), {p: [] for p in prefixes}, [], WeightedMean()
        for i in clients:
            upload = uploads[i]
            for p in prefixes:
                flats[p].append(flat_named(upload.tensors, self._params, p))
            counts.append(float(upload.meta["num_samples"]))
            if self._buffers:
                fold.add({k: upload.tensors[k] for k in self._buffers}, counts[-1] if self.config.weighted else 1.0)
        return clients, flats, counts, fold.result() if self._buffers and clients else {}

    def _model_state(self, params: Tensor, buffers: State) -> State:
        """The model's state dict (its key order) from the flat parameters and the averaged buffers."""
        named = {**unflat_named(params, self._initial, self._params), **buffers}
        return {k: named[k] for k in self._initial}


@register("scaffold_cnn")
class ScaffoldCNN(_CorrectedCNN):
    config_class = ScaffoldCNNConfig

    # federation.privacy: not covered, as ``scaffold``: its clients upload Δc_i beside their weights.
    privacy_gap = gap_by(Scaffold.privacy_gap)

    def setup(self, env: Environment) -> None:
        require_sgd(self.name, self.cfg.train.optimizer)
        super().setup(env)

    def initial_state(self) -> State:
        state = super().initial_state()
        return {**state, **{_C + k: torch.zeros_like(state[k]) for k in self._params}}

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return {**self._shapes, **{_DC + k: self._shapes[k] for k in self._params}}

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        weights = {k: download.tensors[k] for k in self._initial}
        x, c = flat_named(weights, self._params), flat_named(download.tensors, self._params, _C)
        c_i = torch.from_numpy(self.client_state.read(client.index, round_idx))
        self._local = [GradientCorrection(self._as_module_names(c - c_i)), StepCounter(self)]
        upload = super().client_update(round_idx, client, Download(weights))  # fedavg_cnn's fit, corrected
        steps = self._last_fit_steps
        y = flat_named(upload.tensors, self._params)
        delta_c = client_control(c_i, c, x, y, steps, self.cfg.train.lr) - c_i
        return Upload(
            {**upload.tensors, **unflat_named(delta_c, self._initial, self._params, _DC)}, {**upload.meta, "local_steps": steps}
        )

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        if not uploads:
            self.client_state.write({}, round_idx)  # no client keeps what an aborted attempt of this round wrote
            return state
        clients, flats, counts, buffers = self._read_uploads(uploads, ("", _DC))
        x, c = scaffold_server_step(
            flat_named(state, self._params),
            flat_named(state, self._params, _C),
            flats[""],
            flats[_DC],
            len(self.env.partition),
            self.config.server_lr,
            counts if self.config.weighted else None,
        )
        # each client of the round keeps c_i⁺ = c_i + Δc_i (client_state.py: exact under a kill)
        self.client_state.write(
            {i: (torch.from_numpy(self.client_state.read(i, round_idx)) + dc).numpy() for i, dc in zip(clients, flats[_DC])},
            round_idx,
        )
        return {**self._model_state(x, buffers), **unflat_named(c, state, self._params, _C)}


@register("feddyn_cnn")
class FedDynCNN(_CorrectedCNN):
    config_class = FedDynCNNConfig

    # federation.privacy: not covered, as ``feddyn``: the cloud model adds the clients' accumulated drift to the mean.
    privacy_gap = gap_by(FedDyn.privacy_gap)

    def setup(self, env: Environment) -> None:
        super().setup(env)
        self._alphas = client_alphas(self.config.alpha, [len(p) for p in env.partition], self.config.adaptive_alpha)

    def initial_state(self) -> State:
        state = super().initial_state()
        return {
            **state,
            **{_CLOUD + k: state[k].clone() for k in self._params},
            **{_H + k: torch.zeros_like(state[k]) for k in self._params},
        }

    def plan(self, round_idx: int, clients: list[int], state: State, history: RoundHistory) -> RoundPlan:
        """Each client downloads θ_cloud's parameters and the averaged buffers: FedAvg's download size."""
        model = {k: state[_CLOUD + k] if k in self._params else state[k] for k in self._initial}
        return RoundPlan({c: Download(dict(model)) for c in clients})

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        cloud = flat_named(download.tensors, self._params)
        drift = torch.from_numpy(self.client_state.read(client.index, round_idx))
        self._local = [
            DynamicRegulariser(float(self._alphas[client.index]), self._as_module_names(cloud), self._as_module_names(drift))
        ]
        return super().client_update(round_idx, client, download)

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        clients, flats, _, buffers = self._read_uploads(uploads, ("",))
        cloud, thetas = flat_named(state, self._params, _CLOUD), flats[""]
        # each client of the round keeps h_k + θ_k − θ_cloud (client_state.py: exact under a kill; called with no
        # client too, so nothing an aborted attempt of this round wrote stays)
        self.client_state.write(
            {i: self.client_state.read(i, round_idx) + (t - cloud).numpy() for i, t in zip(clients, thetas)}, round_idx
        )
        if not thetas:
            return state
        avg, drift_sum, new_cloud = feddyn_server_step(
            cloud, flat_named(state, self._params, _H), thetas, len(self.env.partition)
        )
        return {
            **self._model_state(avg, buffers),
            **unflat_named(new_cloud, state, self._params, _CLOUD),
            **unflat_named(drift_sum, state, self._params, _H),
        }
