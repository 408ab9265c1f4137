"""FeDiSyn's forward-diffusion noise read as a Gaussian mechanism: σ from ᾱ_s, ε from the accountant."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("dp_accounting")  # the 'privacy' extra

from fl_lightning.privacy.accountant import epsilon  # noqa: E402
from fl_lightning.privacy.latents import latent_epsilon, latent_noise_multiplier, summary_sensitivity  # noqa: E402


def test_the_rescaled_upload_is_the_gaussian_mechanism_on_the_clean_summary():
    a, B, n = 0.25, 3.0, 12
    delta_sens = summary_sensitivity(B, summary="class_mean", min_count=n)
    assert delta_sens == pytest.approx(2 * B / n)
    sigma = latent_noise_multiplier(a, delta_sens)
    assert sigma * delta_sens == pytest.approx(math.sqrt((1 - a) / a))  # the noise std of x_s / sqrt(ᾱ_s)
    assert latent_epsilon(a, clip_norm=B, delta=1e-5, min_count=n) == epsilon(sigma, q=1.0, steps=1, delta=1e-5)


def test_later_timesteps_and_bounded_summaries_cost_less():
    eps = [latent_epsilon(a, clip_norm=1.0, delta=1e-5, min_count=20) for a in (0.9, 0.5, 0.1, 0.01)]
    assert eps == sorted(eps, reverse=True)
    kmeans = latent_epsilon(0.1, clip_norm=1.0, delta=1e-5, summary="kmeans", num_centroids=10)
    assert kmeans > latent_epsilon(0.1, clip_norm=1.0, delta=1e-5, min_count=20)
    with pytest.raises(ValueError, match="clip norm"):
        summary_sensitivity(math.inf, summary="kmeans")
