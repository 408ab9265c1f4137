"""The ε that FeDiSyn's forward-diffusion noise implies, read as a Gaussian mechanism on clipped latents.

A client uploads x_s = sqrt(ᾱ_s) x_0 + sqrt(1 − ᾱ_s) ε, ε ~ N(0, I) (DDPM forward process, Ho et al. 2020,
Eq. 4) for each summary x_0 of a class's VAE latents. Rescaling is post-processing, so the server holds

    x_s / sqrt(ᾱ_s) = x_0 + N(0, (1 − ᾱ_s)/ᾱ_s · I):

the Gaussian mechanism on x_0 with noise std sqrt((1 − ᾱ_s)/ᾱ_s), i.e. noise multiplier
σ = sqrt((1 − ᾱ_s)/ᾱ_s) / Δ for the L2 sensitivity Δ of the uploaded summaries to one record
(:func:`latent_noise_multiplier`); ε from the accountant (:func:`latent_epsilon`).

Assumptions (docs/privacy.md, "FeDiSyn's latents"):

* each latent is clipped to L2 norm ≤ B (today's FeDiSyn does not clip: the ε holds for a run whose latents
  lie within B, e.g. B = the largest latent norm seen, which is itself a data-dependent choice);
* the label set, the per-class counts D_i^k and the number of centroids Z' travel in the clear (not covered);
* ``summary="class_mean"`` (bounded sensitivity): only the class average of n ≥ n_min clipped latents is
  uploaded; replacing one record moves it by ≤ 2B/n_min, and a record lies in one class (one release);
* ``summary="kmeans"``: k-means is data-dependent — one record can reassign every cluster, so no bound
  better than the trivial one holds: each of the Z' centroids and the average lies in the ball of radius B,
  so they move by ≤ 2B each, jointly Δ = 2B·sqrt(Z' + 1). It is a valid, very loose guarantee.
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = ["latent_noise_multiplier", "summary_sensitivity", "latent_epsilon"]


def summary_sensitivity(
    clip_norm: float, *, summary: Literal["class_mean", "kmeans"], min_count: int = 1, num_centroids: int = 0
) -> float:
    """Δ of the uploaded summaries of one class to replacing one record (module docstring)."""
    if not clip_norm > 0 or math.isinf(clip_norm):
        raise ValueError(f"clip norm must be a finite float > 0, got {clip_norm!r}")
    if summary == "class_mean":
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count!r}")
        return 2.0 * clip_norm / min_count
    if summary == "kmeans":
        return 2.0 * clip_norm * math.sqrt(num_centroids + 1)
    raise ValueError(f"summary must be 'class_mean' or 'kmeans', got {summary!r}")


def latent_noise_multiplier(alpha_bar: float, sensitivity: float) -> float:
    """σ = sqrt((1 − ᾱ_s)/ᾱ_s) / Δ: the forward process at ᾱ_s as a Gaussian mechanism of sensitivity Δ."""
    if not 0.0 < alpha_bar < 1.0:
        raise ValueError(f"alpha_bar must be in (0, 1), got {alpha_bar!r}")
    return math.sqrt((1.0 - alpha_bar) / alpha_bar) / sensitivity


def latent_epsilon(
    alpha_bar: float,
    *,
    clip_norm: float,
    delta: float,
    summary: Literal["class_mean", "kmeans"] = "class_mean",
    min_count: int = 1,
    num_centroids: int = 0,
    accountant: Literal["rdp", "pld"] = "rdp",
) -> float:
    """ε of one client's upload (one release per record: classes are disjoint) at ᾱ_s, by the accountant."""
    from fl_lightning.privacy.accountant import epsilon

    sigma = latent_noise_multiplier(
        alpha_bar, summary_sensitivity(clip_norm, summary=summary, min_count=min_count, num_centroids=num_centroids)
    )
    return epsilon(sigma, q=1.0, steps=1, delta=delta, accountant=accountant)
