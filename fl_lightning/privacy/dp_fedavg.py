"""User-level DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent language models",
Alg. 1 with the fixed-denominator estimator; the clipping of Abadi et al. 2016, Eq. (3), per user):

    Δ_k      = w_k − w_t                                  (client k's update from the global state)
    Δ̃_k      = Δ_k · min(1, S / ‖Δ_k‖₂)                   (clipped: one user moves the sum by ≤ S)
    w_{t+1}  = w_t + (1/m) Σ_k Δ̃_k + N(0, (σ S / m)² I)    (Gaussian mechanism on the mean of m updates)

‖Δ_k‖₂ is the norm over every floating-point tensor the client shares with the global state, jointly.
A key that only some clients send (FeDiSyn's depth-aware LoRA: block l over the m_l devices that trained it)
is averaged over its m_l holders and gets noise of std σ S / m_l: rescaling each key's mean by m_l is an
invertible linear map onto the per-key sums, each of which moves by at most S per user, with noise σ S —
so the guarantee is that of the Gaussian mechanism on the sum.

Pure functions on tensors (no config, no files, no global RNG).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["shared_keys", "update_norm", "clip_update", "add_mean_noise"]


def shared_keys(global_state: Mapping[str, Tensor], tensors: Mapping[str, Tensor]) -> list[str]:
    """The floating-point keys of ``tensors`` that the global state holds with the same shape: the update."""
    return [k for k, t in tensors.items()
            if t.is_floating_point() and k in global_state and global_state[k].shape == t.shape]


def update_norm(global_state: Mapping[str, Tensor], tensors: Mapping[str, Tensor], keys: list[str]) -> float:
    """‖Δ_k‖₂ = sqrt(Σ_key ‖w_k[key] − w_t[key]‖²), in float64."""
    total = 0.0
    for k in keys:
        total += float((tensors[k].detach().double() - global_state[k].detach().double().to(tensors[k].device))
                       .pow(2).sum())
    return math.sqrt(total)


def clip_update(global_state: Mapping[str, Tensor], tensors: Mapping[str, Tensor],
                clip_norm: float) -> tuple[dict[str, Tensor], float]:
    """``w_t + Δ_k · min(1, S/‖Δ_k‖)`` for the shared keys, the other tensors as they are.

    Args:
        global_state: w_t.
        tensors: one client's upload (w_k and anything else it sends).
        clip_norm: S > 0 (``inf``: no clipping).

    Returns:
        the clipped tensors (each in its own dtype; a key is returned as is when no scaling is needed, so an
        unclipped update is bit for bit the client's own) and ‖Δ_k‖₂ before clipping.
    """
    if not clip_norm > 0:
        raise ValueError(f"clip norm must be > 0, got {clip_norm!r}")
    keys = shared_keys(global_state, tensors)
    norm = update_norm(global_state, tensors, keys)
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    out = dict(tensors)
    if scale < 1.0:
        for k in keys:
            g = global_state[k].detach().double().to(tensors[k].device)
            out[k] = (g + (tensors[k].detach().double() - g) * scale).to(tensors[k].dtype)
    return out, norm


def add_mean_noise(state: Mapping[str, Tensor], holders: Mapping[str, int], *, noise_multiplier: float,
                   clip_norm: float, generator: torch.Generator) -> dict[str, Tensor]:
    """The mean with the Gaussian mechanism's noise: ``state[key] + N(0, (σ S / m_key)²)`` for each averaged key.

    Args:
        state: the aggregate (the mean of the clipped updates) per key.
        holders: m_key, how many uploads held each averaged key (keys not listed are returned as they are).
        noise_multiplier: σ >= 0.
        clip_norm: S (finite when σ > 0).
        generator: a CPU generator the noise is drawn from (keys in sorted order).
    """
    out = dict(state)
    if noise_multiplier == 0.0:
        return out
    if not math.isfinite(clip_norm):
        raise ValueError("noise needs a finite clip norm (the sensitivity of the mean is S/m)")
    for key in sorted(holders):
        if key not in out or holders[key] <= 0:
            continue
        t = out[key]
        std = noise_multiplier * clip_norm / holders[key]
        noise = torch.randn(t.shape, generator=generator, dtype=torch.float64) * std
        out[key] = (t.detach().double() + noise.to(t.device)).to(t.dtype)
    return out
