"""Empirical ε lower bounds: Clopper–Pearson intervals, the exact Gaussian ε, and a sound, powerful audit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fl_lightning.privacy.audit import best_threshold, clopper_pearson, epsilon_lower_bound, gaussian_epsilon

N_DRAWS = 200_000
DELTA = 1e-3


def _gaussian_delta(eps: float, mu: float) -> float:
    """δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Thm. 8), in linear space with scipy.stats.norm."""
    return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))


def _draws(mu: float, seed: int, n: int = N_DRAWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n)


@pytest.mark.parametrize("k, n", [(1, 10), (3, 10), (7, 10), (17, 1000), (500, 1000), (123, 200_000)])
@pytest.mark.parametrize("confidence", [0.95, 0.99])
def test_clopper_pearson_matches_scipy_binomtest(k, n, confidence):
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    lo, hi = clopper_pearson(k, n, confidence)
    # binomtest root-finds the binomial tails with brentq's default tolerance (≈ 3e-10 relative at n = 2e5)
    assert (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-8)
    # the defining equations: each end leaves (1 − confidence)/2 in its tail
    half_alpha = (1 - confidence) / 2
    assert stats.binom.sf(k - 1, n, lo) == pytest.approx(half_alpha, rel=1e-9)
    assert stats.binom.cdf(k, n, hi) == pytest.approx(half_alpha, rel=1e-9)


def test_clopper_pearson_edges():
    lo, hi = clopper_pearson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-12)
    lo, hi = clopper_pearson(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10), rel=1e-12)
    with pytest.raises(ValueError):
        clopper_pearson(11, 10)
    with pytest.raises(ValueError):
        clopper_pearson(1, 10, confidence=1.0)


def test_gaussian_epsilon_is_monotone_in_mu():
    mus = [0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 4.0]
    for delta in (1e-3, 1e-5, 1e-10):
        eps = [gaussian_epsilon(mu, delta) for mu in mus]
        assert all(a < b for a, b in zip(eps, eps[1:]))
    assert gaussian_epsilon(0.0, 1e-5) == 0.0
    assert gaussian_epsilon(1e-3, 0.5) == 0.0  # δ(0) = 2Φ(μ/2) − 1 ≤ delta


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
def test_gaussian_epsilon_solves_the_delta_curve(mu, delta):
    eps = gaussian_epsilon(mu, delta)
    assert _gaussian_delta(eps, mu) == pytest.approx(delta, rel=1e-8)


def test_gaussian_epsilon_at_mu_one():
    # the exact value is 4.3772 (Φ(−3.877) − e^4.377 Φ(−4.877) = 1e-5); the classical bound gives 4.845
    eps = gaussian_epsilon(1.0, 1e-5)
    assert eps == pytest.approx(4.3772, abs=1e-3)
    assert _gaussian_delta(eps, 1.0) == pytest.approx(1e-5, rel=1e-8)


@pytest.mark.parametrize("mu", [0.05, 0.2, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
def test_gaussian_epsilon_is_at_most_the_classical_bound(mu, delta):
    assert gaussian_epsilon(mu, delta) <= mu * math.sqrt(2 * math.log(1.25 / delta))


@pytest.mark.parametrize("threshold", [2.0, 2.5, 3.0])
def test_audit_of_a_calibrated_gaussian_is_sound(threshold):
    d, d_prime = _draws(1.0, seed=0)
    bound = epsilon_lower_bound(d, d_prime, threshold, DELTA)
    assert 0.0 < bound < gaussian_epsilon(1.0, DELTA)


def test_audit_catches_a_mechanism_with_half_the_claimed_noise():
    d, d_prime = _draws(2.0, seed=1)  # shift / std = 2: the noise std is half that of the claimed μ = 1
    assert epsilon_lower_bound(d, d_prime, 3.0, DELTA) > gaussian_epsilon(1.0, DELTA)


def test_audit_is_symmetric_in_the_direction_of_the_attack():
    d, d_prime = _draws(2.0, seed=2)
    # swapping D, D' and negating the scores swaps the two inequalities: the bound is the same
    forward = epsilon_lower_bound(d, d_prime, 3.0, DELTA)
    backward = epsilon_lower_bound(-d_prime, -d, -3.0, DELTA)
    assert forward > 4.0
    assert backward == pytest.approx(forward, rel=1e-9)


@pytest.mark.parametrize("threshold", [-1.0, 0.0, 1.0, 2.0, 3.0])
def test_identical_distributions_prove_nothing(threshold):
    rng = np.random.default_rng(3)
    d, d_prime = rng.normal(size=N_DRAWS), rng.normal(size=N_DRAWS)
    assert epsilon_lower_bound(d, d_prime, threshold, DELTA) <= 1e-3


def test_best_threshold_chosen_on_one_half_transfers_to_the_other():
    d, d_prime = _draws(2.0, seed=4, n=2 * N_DRAWS)
    half = d.size // 2
    candidates = np.linspace(0.0, 5.0, 21)
    t = best_threshold(d[:half], d_prime[:half], DELTA, candidates)
    assert 2.0 <= t <= 4.5
    assert epsilon_lower_bound(d[half:], d_prime[half:], t, DELTA) > gaussian_epsilon(1.0, DELTA)
    with pytest.raises(ValueError):
        best_threshold(d, d_prime, DELTA, [])
