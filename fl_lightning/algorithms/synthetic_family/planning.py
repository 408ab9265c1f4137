"""The FeDiSyn family's per-round system plan: device profiles → contributions → depths (CLC) → bandwidth (WFBA).

Pure functions on numpy arrays and config values (no Lightning, no I/O), used by
the fine-tuning stage (``finetune.py``) of FeDiSyn and its LoRA baselines on the server at the
start of every fine-tuning round:

    profiles (named boards, cycled over the clients; or fitted to this host's compute times)
    contributions Ĉ[i, l]  (``fl_lightning.systems.contributions``: last measured ||∇θ_l||², estimated elsewhere)
    depths x_i            (systems.depth_policy: clc | capacity | full | fixed, ``systems.clc.policy_depths``);
                          a device whose memory holds fewer blocks than asked trains what it holds and
                          is reported (``requested`` / ``limits`` / ``over_memory``)
    bandwidth B_i, H^t    (systems.bandwidth_allocation: wfba = water-filling, every device finishes
                          compute + upload at H^t; equal = B/N, the w/o-WFBA ablation)

Payload of device i: τ·x_i bits of LoRA plus ``extra_bits`` (the head, when it trains) — or, for
full-parameter FedAvg (GPT-FL, FGL), the whole model whatever the depth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from fl_lightning.algorithms.synthetic_family.config import SystemsConfig
from fl_lightning.systems.backbones import Backbone
from fl_lightning.systems.channel import ChannelConfig, device_spectral_efficiency
from fl_lightning.systems.clc import policy_depths
from fl_lightning.systems.devices import PAPER_TESTBED, PROFILES, DeviceProfile, board_profiles, profile_arrays
from fl_lightning.systems.wfba import allocate_bandwidth, equal_bandwidth

__all__ = ["SystemPlan", "client_profiles", "fit_host_times", "plan_round", "client_efficiency", "upload_time_s"]


@dataclass(frozen=True)
class SystemPlan:
    """What the server decided for one fine-tuning round (arrays over the participating clients, in order).

    It travels in the engine's :class:`~fl_lightning.federation.algorithm.RoundPlan` as its
    ``decisions`` (:meth:`as_decisions` / :meth:`from_decisions`), checkpointed with the round.

    Args:
        clients: participating client indices.
        depths: x_i, trained last blocks per client (within its memory).
        bandwidth_hz: B_i (water-filling or B/N).
        round_time_s: H^t, when the last device has computed and uploaded.
        compute_time_s: D_i E (h̄_i + x_i h_i) per client.
        requested: the depths the policy asked for, before memory.
        limits: each device's memory limit (largest x with m̄_i + x m_i ≤ M_i, at most L).
        payload_bits: S_i, what each device uploads (bits) in the channel model.
    """

    clients: list[int]
    depths: np.ndarray
    bandwidth_hz: np.ndarray
    round_time_s: float
    compute_time_s: np.ndarray
    requested: np.ndarray | None = None
    limits: np.ndarray | None = None
    payload_bits: np.ndarray | None = None

    @property
    def over_memory(self) -> np.ndarray:
        """(n,) bool: devices whose memory holds fewer blocks than the policy asked for."""
        if self.requested is None or self.limits is None:
            return np.zeros(len(self.clients), dtype=bool)
        return np.asarray(self.requested) > np.asarray(self.limits)

    def as_decisions(self) -> dict[str, object]:
        """Checkpointable form (tensors and plain values) for ``RoundPlan.decisions``."""

        def ints(a):
            return torch.as_tensor(self.depths if a is None else a, dtype=torch.int64)

        return {
            "clients": list(self.clients),
            "depths": ints(self.depths),
            "bandwidth_hz": torch.as_tensor(self.bandwidth_hz, dtype=torch.float64),
            "round_time_s": float(self.round_time_s),
            "compute_time_s": torch.as_tensor(self.compute_time_s, dtype=torch.float64),
            "requested": ints(self.requested),
            "limits": ints(self.limits),
            "payload_bits": torch.as_tensor(
                np.zeros(len(self.clients)) if self.payload_bits is None else self.payload_bits, dtype=torch.float64
            ),
        }

    @classmethod
    def from_decisions(cls, d: dict) -> SystemPlan:
        optional = {k: d[k].numpy() for k in ("requested", "limits", "payload_bits") if k in d}
        return cls(
            [int(c) for c in d["clients"]],
            d["depths"].numpy(),
            d["bandwidth_hz"].numpy(),
            float(d["round_time_s"]),
            d["compute_time_s"].numpy(),
            **optional,
        )


def client_profiles(
    cfg: SystemsConfig, num_clients: int, *, backbone: Backbone | None = None, batch_size: int = 32, lora_rank: int = 8
) -> list[DeviceProfile]:
    """Client i's device profile: ``systems.boards`` cycled over the clients, with ``systems.profiles`` overrides.

    Args:
        backbone: the ViT the boards train (``systems.backbones``); None: ViT-B/16 (:data:`PROFILES`).
        batch_size: ``train.batch_size`` (the activation memory of a trainable block).
        lora_rank: the adapters' rank.
    """
    table = dict(PROFILES) if backbone is None else board_profiles(backbone, batch_size, lora_rank=lora_rank)
    for name, fields in cfg.profiles.items():
        table[name] = replace(table[name], **fields) if name in table else DeviceProfile(name=name, **fields)
    names = list(PAPER_TESTBED) if cfg.boards == "paper_testbed" else list(cfg.boards)
    return [table[names[i % len(names)]] for i in range(num_clients)]


def fit_host_times(
    compute_s: Mapping[int, float], samples: Mapping[int, float], depths: Mapping[int, int]
) -> tuple[float, float] | None:
    """Per-sample forward time h̄ and per-block backward time h of this host, from measured client times.

    Least squares with h̄, h ≥ 0 on compute_c = S_c h̄ + S_c x_c h (S_c samples processed, x_c depth).
    Returns None when the clients do not determine both (fewer than 2, one depth only, or a zero fit).
    """
    clients = [c for c in compute_s if c in samples and c in depths and samples[c] > 0]
    if len(clients) < 2 or len({depths[c] for c in clients}) < 2:
        return None
    A = np.array([[samples[c], samples[c] * depths[c]] for c in clients], dtype=np.float64)
    y = np.array([compute_s[c] for c in clients], dtype=np.float64)
    from scipy.optimize import nnls  # here: SciPy's import costs every run's start

    (h_bar, h), _ = nnls(A, y)
    if not (h_bar > 0 and h > 0):
        return None
    return float(h_bar), float(h)


def client_efficiency(cfg: SystemsConfig, profiles: Sequence[DeviceProfile]) -> np.ndarray:
    """e_i of every client (bit/s/Hz): fixed positions, seeded over ALL clients so sampling moves no device."""
    channel = ChannelConfig(
        radius_m=cfg.radius_m,
        center_m=(cfg.center_x_m, 0.0),
        d0_m=cfg.d0_m,
        path_loss_exponent=cfg.path_loss_exponent,
        noise_power_w=cfg.noise_power_w,
        total_bandwidth_hz=cfg.total_bandwidth_hz,
        reference_loss_db=cfg.reference_loss_db,
    )
    power = profile_arrays(list(profiles))["transmit_power_w"]
    return device_spectral_efficiency(power, config=channel, seed=cfg.placement_seed)[1]


def upload_time_s(cfg: SystemsConfig, profiles: Sequence[DeviceProfile], payload_bits: Mapping[int, float]) -> float:
    """When the last of these clients has uploaded ``payload_bits`` (no compute first), under
    ``systems.bandwidth_allocation`` — e.g. the synthesis phase's latents, captions or counts."""
    if not payload_bits:
        return 0.0
    idx = np.asarray(sorted(payload_bits), dtype=np.int64)
    S = np.array([float(payload_bits[int(c)]) for c in idx])
    allocate = allocate_bandwidth if cfg.bandwidth_allocation == "wfba" else equal_bandwidth
    return float(allocate(np.zeros(len(idx)), S, client_efficiency(cfg, profiles)[idx], cfg.total_bandwidth_hz)[1])


def plan_round(
    cfg: SystemsConfig,
    *,
    clients: Sequence[int],
    profiles: Sequence[DeviceProfile],
    samples: np.ndarray,
    contributions: np.ndarray,
    layer_bits: float,
    num_layers: int,
    extra_bits: float = 0.0,
    full_model_bits: float | None = None,
) -> SystemPlan:
    """Depths, bandwidths and the round time H^t of one fine-tuning round.

    Args:
        cfg: the systems section (depth policy, bandwidth allocation, channel).
        clients: participating client indices (rows of ``contributions``/``samples`` are per client index).
        profiles: the profile of every client (index → profile).
        samples: (K,) samples each client processes this round, D_i · E.
        contributions: (K, L) Ĉ of every client (read by CLC only).
        layer_bits: τ, bits uploaded per trained LoRA block.
        num_layers: L.
        extra_bits: bits every device uploads besides its blocks (the head, when it trains). CLC's greedy
            prices depths with τ·x only (``systems.clc`` has no constant payload term); the round time
            and the bandwidths here include it.
        full_model_bits: full-parameter FedAvg (GPT-FL, FGL): every device trains and uploads the whole
            model (these bits), whatever ``depth_policy`` says; memory limits are still reported.
    """
    idx = np.asarray(list(clients), dtype=np.int64)
    arrays = profile_arrays([profiles[i] for i in idx])
    e = client_efficiency(cfg, profiles)[idx]
    D = np.asarray(samples, dtype=np.float64)[idx]
    timing = dict(forward_time_s=arrays["forward_time_s"], backward_time_per_layer_s=arrays["backward_time_per_layer_s"])
    memory = dict(
        fixed_memory_gb=arrays["fixed_memory_gb"],
        memory_per_layer_gb=arrays["memory_per_layer_gb"],
        memory_budget_gb=arrays["memory_budget_gb"],
    )
    policy = "full" if full_model_bits is not None else cfg.depth_policy
    decision = policy_depths(
        policy,
        num_layers=num_layers,
        **timing,
        **memory,
        contributions=np.asarray(contributions, dtype=np.float64)[idx],
        num_samples=D,
        layer_bits=layer_bits,
        spectral_efficiency=e,
        total_bandwidth_hz=cfg.total_bandwidth_hz,
        fixed_depth=cfg.fixed_depth,
        allocation=cfg.bandwidth_allocation,
    )
    if full_model_bits is not None:  # full-parameter training: nothing to cap, the whole model moves
        depths = np.asarray(decision.requested, dtype=np.int64)
        payload = np.full(len(idx), float(full_model_bits))
    else:
        depths = np.asarray(decision.depths, dtype=np.int64)
        payload = layer_bits * depths + float(extra_bits)
    compute = D * (arrays["forward_time_s"] + depths * arrays["backward_time_per_layer_s"])
    allocate = allocate_bandwidth if cfg.bandwidth_allocation == "wfba" else equal_bandwidth
    bandwidth, round_time = allocate(compute, payload, e, cfg.total_bandwidth_hz)
    return SystemPlan(
        [int(i) for i in idx],
        depths,
        bandwidth,
        float(round_time),
        compute,
        requested=np.asarray(decision.requested, dtype=np.int64),
        limits=np.asarray(decision.limits, dtype=np.int64),
        payload_bits=payload,
    )
