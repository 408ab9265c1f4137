"""FeDiSyn's per-round system plan: device profiles → contributions → depths (CLC) → bandwidth (WFBA).

Pure functions on numpy arrays and config values (no Lightning, no I/O), used by
:class:`fl_lightning.algorithms.fedisyn.FeDiSyn` on the server at the start of every LoRA round:

    profiles (named boards, cycled over the clients; or fitted to this host's compute times)
    contributions Ĉ[i, l]  (last measured ||∇θ_l||² of device i, estimated where unmeasured)
    depths x_i            (systems.depth_policy: clc | capacity | full | fixed, capped by memory)
    bandwidth B_i, H^t    (water-filling: every device finishes compute + upload at H^t)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.optimize import nnls

from fl_lightning.callbacks.contribution import estimate_layer_contributions
from fl_lightning.algorithms.fedisyn.config import SystemsConfig
from fl_lightning.systems.channel import ChannelConfig, device_spectral_efficiency
from fl_lightning.systems.clc import (
    capacity_depths,
    contribution_aware_depths,
    depth_round_time,
    fixed_depths,
    full_depths,
    memory_depth_limits,
)
from fl_lightning.systems.devices import PAPER_TESTBED, PROFILES, DeviceProfile, profile_arrays

__all__ = ["SystemPlan", "client_profiles", "fit_host_times", "estimate_contributions", "plan_round"]


@dataclass(frozen=True)
class SystemPlan:
    """What the server decided for one LoRA round (arrays over the participating clients, in order).

    It travels in the engine's :class:`~fl_lightning.federation.algorithm.RoundPlan` as its
    ``decisions`` (:meth:`as_decisions` / :meth:`from_decisions`), checkpointed with the round.

    Args:
        clients: participating client indices.
        depths: x_i, trained last blocks per client.
        bandwidth_hz: B_i from WFBA.
        round_time_s: H^t, the WFBA round time (all devices finish together).
        compute_time_s: D_i E (h̄_i + x_i h_i) per client.
    """

    clients: list[int]
    depths: np.ndarray
    bandwidth_hz: np.ndarray
    round_time_s: float
    compute_time_s: np.ndarray

    def as_decisions(self) -> dict[str, object]:
        """Checkpointable form (tensors and plain values) for ``RoundPlan.decisions``."""
        return {"clients": list(self.clients), "depths": torch.as_tensor(self.depths, dtype=torch.int64),
                "bandwidth_hz": torch.as_tensor(self.bandwidth_hz, dtype=torch.float64),
                "round_time_s": float(self.round_time_s),
                "compute_time_s": torch.as_tensor(self.compute_time_s, dtype=torch.float64)}

    @classmethod
    def from_decisions(cls, d: dict) -> SystemPlan:
        return cls([int(c) for c in d["clients"]], d["depths"].numpy(), d["bandwidth_hz"].numpy(),
                   float(d["round_time_s"]), d["compute_time_s"].numpy())


def client_profiles(cfg: SystemsConfig, num_clients: int) -> list[DeviceProfile]:
    """Client i's device profile: ``systems.devices`` cycled over the clients, with ``systems.profiles`` overrides."""
    table = dict(PROFILES)
    for name, fields in cfg.profiles.items():
        table[name] = replace(table[name], **fields) if name in table else DeviceProfile(name=name, **fields)
    names = list(PAPER_TESTBED) if cfg.devices == "paper_testbed" else list(cfg.devices)
    return [table[names[i % len(names)]] for i in range(num_clients)]


def fit_host_times(compute_s: Mapping[int, float], samples: Mapping[int, float],
                   depths: Mapping[int, int]) -> tuple[float, float] | None:
    """Per-sample forward time h̄ and per-block backward time h of this host, from measured client times.

    Least squares with h̄, h ≥ 0 on compute_c = S_c h̄ + S_c x_c h (S_c samples processed, x_c depth).
    Returns None when the clients do not determine both (fewer than 2, one depth only, or a zero fit).
    """
    clients = [c for c in compute_s if c in samples and c in depths and samples[c] > 0]
    if len(clients) < 2 or len({depths[c] for c in clients}) < 2:
        return None
    A = np.array([[samples[c], samples[c] * depths[c]] for c in clients], dtype=np.float64)
    y = np.array([compute_s[c] for c in clients], dtype=np.float64)
    (h_bar, h), _ = nnls(A, y)
    if not (h_bar > 0 and h > 0):
        return None
    return float(h_bar), float(h)


def estimate_contributions(values: np.ndarray, measured_round: np.ndarray) -> np.ndarray:
    """Ĉ (N, L) from the per-device, per-block last measurements ``values`` and their rounds (−1: never).

    Per device, the blocks measured in its most recent round are ``last_round``; older measurements
    are ``history``; the prior for a device never measured is the mean over all measurements (1.0
    before any) — see :func:`fl_lightning.callbacks.contribution.estimate_layer_contributions`.
    """
    N, L = values.shape
    seen = measured_round >= 0
    prior = float(values[seen].mean()) if seen.any() else 1.0
    out = np.empty((N, L), dtype=np.float64)
    for i in range(N):
        layers = np.flatnonzero(seen[i])
        history = {int(l): float(values[i, l]) for l in layers}
        latest = measured_round[i].max()
        last = {int(l): float(values[i, l]) for l in layers if measured_round[i, l] == latest}
        out[i] = estimate_layer_contributions(history, L, prior=prior, last_round=last or None)
    return out


def plan_round(cfg: SystemsConfig, *, clients: Sequence[int], profiles: Sequence[DeviceProfile],
               samples: np.ndarray, contributions: np.ndarray, layer_bits: float, num_layers: int) -> SystemPlan:
    """Depths, bandwidths and the round time H^t of one LoRA round.

    Args:
        cfg: the systems section (depth policy, channel).
        clients: participating client indices (rows of ``contributions``/``samples`` are per client index).
        profiles: the profile of every client (index → profile).
        samples: (K,) samples each client processes this round, D_i · E.
        contributions: (K, L) Ĉ of every client.
        layer_bits: τ, bits uploaded per trained block.
        num_layers: L.
    """
    idx = np.asarray(list(clients), dtype=np.int64)
    arrays = profile_arrays([profiles[i] for i in idx])
    memory = dict(fixed_memory_gb=arrays["fixed_memory_gb"], memory_per_layer_gb=arrays["memory_per_layer_gb"],
                  memory_budget_gb=arrays["memory_budget_gb"])
    limits = memory_depth_limits(**memory, num_layers=num_layers)
    channel = ChannelConfig(radius_m=cfg.radius_m, center_m=(cfg.center_x_m, 0.0), d0_m=cfg.d0_m,
                            path_loss_exponent=cfg.path_loss_exponent, noise_power_w=cfg.noise_power_w,
                            total_bandwidth_hz=cfg.total_bandwidth_hz)
    # every client has a fixed position (seeded over ALL clients, so sampling does not move devices)
    all_p = profile_arrays(list(profiles))["transmit_power_w"]
    _, efficiency = device_spectral_efficiency(all_p, config=channel, seed=cfg.placement_seed)
    e = efficiency[idx]
    D = np.asarray(samples, dtype=np.float64)[idx]
    timing = dict(num_samples=D, forward_time_s=arrays["forward_time_s"],
                  backward_time_per_layer_s=arrays["backward_time_per_layer_s"])
    if cfg.depth_policy == "clc":
        depths = contribution_aware_depths(contributions=np.asarray(contributions)[idx], **timing, **memory,
                                           layer_bits=layer_bits, spectral_efficiency=e,
                                           total_bandwidth_hz=cfg.total_bandwidth_hz)
    elif cfg.depth_policy == "capacity":
        depths = capacity_depths(forward_time_s=arrays["forward_time_s"],
                                 backward_time_per_layer_s=arrays["backward_time_per_layer_s"], **memory,
                                 num_layers=num_layers)
    elif cfg.depth_policy == "full":
        depths = np.minimum(full_depths(len(idx), num_layers), limits)
    elif cfg.depth_policy == "fixed":
        if cfg.fixed_depth > num_layers:
            raise ValueError(f"fixed depth {cfg.fixed_depth} exceeds the model's {num_layers} blocks")
        depths = np.minimum(fixed_depths(len(idx), cfg.fixed_depth), limits)
    else:  # the config's Literal makes this unreachable
        raise ValueError(f"unknown depth policy {cfg.depth_policy!r}; expected clc, capacity, full or fixed")
    depths = np.asarray(depths, dtype=np.int64)
    bandwidth, round_time = depth_round_time(depths, **timing, layer_bits=layer_bits, spectral_efficiency=e,
                                             total_bandwidth_hz=cfg.total_bandwidth_hz)
    compute = D * (arrays["forward_time_s"] + depths * arrays["backward_time_per_layer_s"])
    return SystemPlan([int(i) for i in idx], depths, bandwidth, float(round_time), compute)
