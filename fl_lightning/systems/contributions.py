"""Contribution estimates Ĉ[i, l] for CLC (FeDiSyn Alg. 1): measured where a device trained, filled in elsewhere.

CLC prices a deeper assignment by the contributions of blocks a device has NOT trained yet, so the
planner needs an estimate for every (device, block). The measurements are the per-block squared
LoRA-gradient norms g_{i,l} (``fl_lightning.callbacks.contribution.GradientContribution``); this
file is the pure rule that turns the last measurements into the full (N, L) table.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["estimate_layer_contributions", "estimate_contributions"]


def estimate_layer_contributions(
    history: Mapping[int, float],
    num_layers: int,
    *,
    prior: float,
    last_round: Mapping[int, float] | None = None,
) -> np.ndarray:
    """Per-layer contribution estimates ĝ_{i,l} for l = 0..num_layers-1 for one device.

    A layer's gain can only be measured when the device trains it, yet the depth planner must
    price layers it did not train. The estimate, per layer l:

    1. the most recent measurement of layer l by this device, if there is one: ``last_round[l]``,
       else ``history[l]`` (layers change slowly between rounds, so an old measurement beats a guess);
    2. otherwise the mean per-layer contribution over the layers the device trained last round
       (``last_round``; default: all of ``history``) — the device's own current gradient scale,
       assuming a layer it has never trained learns about as much as an average one it did;
    3. ``prior`` when the device has no measurement at all (before its first round).

    Args:
        history: block index -> most recent measured g_{i,l} of this device.
        num_layers: number of blocks L.
        prior: value for a device with no measurement (e.g. the mean over all devices).
        last_round: block index -> g_{i,l} measured in the last round (``GradientContribution.per_layer()``).

    Returns:
        float64 array of shape (num_layers,).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    bad = [l for l in list(history) + list(last_round or {}) if not 0 <= l < num_layers]
    if bad:
        raise ValueError(f"layer index {bad[0]} is outside 0..{num_layers - 1}")
    recent = last_round if last_round else history
    fallback = float(np.mean(list(recent.values()))) if recent else float(prior)
    estimate = np.full(num_layers, fallback, dtype=np.float64)
    for layer, value in {**history, **(last_round or {})}.items():
        estimate[layer] = value
    return estimate


def estimate_contributions(values: np.ndarray, measured_round: np.ndarray) -> np.ndarray:
    """Ĉ (N, L) from each device's last per-block measurements ``values`` and their rounds (−1: never).

    Per device, the blocks measured in its most recent round are ``last_round`` and all its
    measurements are ``history`` of :func:`estimate_layer_contributions`; the prior of a device never
    measured is the mean over all measurements (1.0 before any).

    Args:
        values: (N, L) last measured g_{i,l} (anything where never measured).
        measured_round: (N, L) int round of that measurement, −1 where never measured.

    Returns:
        float64 array of shape (N, L).
    """
    values = np.asarray(values, dtype=np.float64)
    measured_round = np.asarray(measured_round)
    if values.ndim != 2 or measured_round.shape != values.shape:
        raise ValueError(
            f"values and measured_round must be (N, L) arrays of one shape, got {values.shape} and {measured_round.shape}"
        )
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
