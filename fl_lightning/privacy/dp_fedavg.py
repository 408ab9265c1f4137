"""User-level DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent language models",
Alg. 1 with the fixed-denominator estimator f̃_f; the clipping of Abadi et al. 2016, Eq. (3), per user):

    Δ_k      = w_k − w_t                                  (client k's update from the global state)
    Δ̃_k      = Δ_k · min(1, S / ‖Δ_k‖₂)                   (clipped: one user moves the sum by ≤ S)
    w_{t+1}  = w_t + (1/D) Σ_k Δ̃_k + N(0, (σ S / D)² I)    (Gaussian mechanism on the sum, divided by D)

D is fixed before the round — McMahan et al.'s qW with every user's weight 1: the expected number of uploads —
never the number that arrived. Under add/remove of one user the sum moves by at most S, so the noise multiplier
of the released w_{t+1} is σ. Dividing by the realized m instead (a plain mean) lets one user move the output
by up to 2S/m (its update, and the 1/m → 1/(m+1) reweighting of everyone else's), which halves the effective σ.

‖Δ_k‖₂ is the norm over every floating-point tensor the client shares with the global state, jointly. A key
that only m_key < D clients send is divided by D too: its (1/D) Σ over its holders is the same Gaussian
mechanism on the per-key sums (the sums, jointly, move by at most S per user).

Pure functions on tensors (no config, no files, no global RNG).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["shared_keys", "update_norm", "clip_update", "private_mean"]


def shared_keys(global_state: Mapping[str, Tensor], tensors: Mapping[str, Tensor]) -> list[str]:
    """The floating-point keys of ``tensors`` that the global state holds with the same shape: the update."""
    return [k for k, t in tensors.items() if t.is_floating_point() and k in global_state and global_state[k].shape == t.shape]


def update_norm(global_state: Mapping[str, Tensor], tensors: Mapping[str, Tensor], keys: list[str]) -> float:
    """‖Δ_k‖₂ = sqrt(Σ_key ‖w_k[key] − w_t[key]‖²), in float64."""
    total = 0.0
    for k in keys:
        total += float((tensors[k].detach().double() - global_state[k].detach().double().to(tensors[k].device)).pow(2).sum())
    return math.sqrt(total)


def clip_update(
    global_state: Mapping[str, Tensor], tensors: Mapping[str, Tensor], clip_norm: float
) -> tuple[dict[str, Tensor], float]:
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


def private_mean(
    previous: Mapping[str, Tensor],
    mean: Mapping[str, Tensor],
    holders: Mapping[str, int],
    *,
    denominator: int,
    noise_multiplier: float,
    clip_norm: float,
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """The fixed-denominator estimate with the Gaussian mechanism's noise, from the method's plain mean.

    For each averaged key, ``w_t + (m_key / D) (mean − w_t) + N(0, (σ S / D)²)``: the method's mean over its
    m_key holders turned back into their sum, divided by D (module docstring). With m_key = D (every planned
    client uploaded) this is ``mean + noise``, and with σ = 0 the mean itself, bit for bit.

    Args:
        previous: w_t, the state the round started from.
        mean: the method's aggregate, the (unweighted) mean of the clipped uploads per key.
        holders: m_key, how many uploads held each averaged key (keys not listed are returned as they are).
        denominator: D >= 1, fixed before the round (the expected number of uploads).
        noise_multiplier: σ >= 0.
        clip_norm: S (finite when σ > 0).
        generator: a CPU generator the noise is drawn from (keys in sorted order).
    """
    if denominator < 1:
        raise ValueError(f"the denominator must be >= 1, got {denominator!r}")
    if noise_multiplier > 0.0 and not math.isfinite(clip_norm):
        raise ValueError("noise needs a finite clip norm (the sensitivity of the sum is S)")
    out = dict(mean)
    for key in sorted(holders):
        m = holders[key]
        if key not in out or m <= 0:
            continue
        t = out[key]
        value = t.detach().double()
        if m != denominator:
            w = previous[key].detach().double().to(t.device)
            value = w + (value - w) * (m / denominator)
        if noise_multiplier > 0.0:
            std = noise_multiplier * clip_norm / denominator
            value = value + (torch.randn(t.shape, generator=generator, dtype=torch.float64) * std).to(t.device)
        elif m == denominator:
            continue  # the mean as it is (no rounding through float64)
        out[key] = value.to(t.dtype)
    return out
