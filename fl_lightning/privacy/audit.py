"""Empirical privacy auditing by a distinguishing test (Jagielski et al. 2020; Nasr et al. 2021).

Run the mechanism many times on neighbouring inputs D and D', score each output, and let an attack answer
"D" when the score exceeds a threshold t. With TPR = P[score > t | D], FPR = P[score > t | D'] and
FNR = 1 − TPR, TNR = 1 − FPR, an (ε, δ)-DP mechanism satisfies, for both output events {score > t} and
{score ≤ t} (the hypothesis-testing reading of DP used by both papers),

    TPR ≤ e^ε · FPR + δ        and        TNR ≤ e^ε · FNR + δ,

so any ε it claims is at least ln((TPR − δ) / FPR) and ln((TNR − δ) / FNR). The rates are estimated from
Bernoulli counts; :func:`epsilon_lower_bound` replaces them by Clopper–Pearson bounds, which makes the
result an ε that the draws *prove* at the given confidence (a claimed ε below it is refuted).

Confidence convention (exact, Bonferroni): at overall confidence 1 − α, TPR is bounded below and FPR above,
each one-sided at level 1 − α/2; these are the two ends of the two-sided Clopper–Pearson interval at
confidence 1 − α (:func:`clopper_pearson`). Both bounds hold together with probability ≥ 1 − α, and the
second direction needs no further bound (TNR_lo = 1 − FPR_hi, FNR_hi = 1 − TPR_lo), so the maximum over the
two directions holds at 1 − α. The threshold must not be chosen on the draws it is evaluated on:
:func:`best_threshold` picks it on a separate half.

:func:`gaussian_epsilon` is the exact ε of the Gaussian mechanism (Balle & Wang 2018, Thm. 8), the value an
audit of a correctly calibrated Gaussian mechanism must stay below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special, stats

__all__ = ["clopper_pearson", "epsilon_lower_bound", "gaussian_epsilon", "best_threshold"]


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def _check_delta(delta: float) -> None:
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact two-sided Clopper–Pearson interval for a binomial proportion.

    Each end is a one-sided bound at level 1 − (1 − confidence)/2: lower = Beta(α/2; k, n − k + 1),
    upper = Beta(1 − α/2; k + 1, n − k), with lower = 0 at k = 0 and upper = 1 at k = n.
    """
    _check_confidence(confidence)
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes!r}, {trials!r}")
    half_alpha = (1.0 - confidence) / 2.0
    lower = 0.0 if successes == 0 else float(stats.beta.ppf(half_alpha, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(stats.beta.isf(half_alpha, successes + 1, trials - successes))
    return lower, upper


def _log_ratio(numerator: float, denominator: float) -> float:
    """ln(numerator / denominator), 0 where the numerator is ≤ 0 (nothing is proven)."""
    return math.log(numerator / denominator) if numerator > 0.0 else 0.0


def _counts(scores: ArrayLike, threshold: float) -> tuple[int, int]:
    s = np.asarray(scores, dtype=float).ravel()
    if s.size == 0:
        raise ValueError("need at least one score per input")
    return int(np.count_nonzero(s > threshold)), int(s.size)


def epsilon_lower_bound(
    scores_d: ArrayLike, scores_d_prime: ArrayLike, threshold: float, delta: float, confidence: float = 0.95
) -> float:
    """The largest ε the draws prove at ``confidence`` for the attack "D when score > threshold".

    max(ln((TPR_lo − δ)/FPR_hi), ln((TNR_lo − δ)/FNR_hi), 0), with TPR_lo, FPR_hi the ends of the two-sided
    Clopper–Pearson intervals at ``confidence`` (one-sided at 1 − α/2 each: Bonferroni, module docstring).
    FPR_hi and FNR_hi = 1 − TPR_lo are > 0 for any counts, so the bound is finite.
    """
    _check_delta(delta)
    k_d, n_d = _counts(scores_d, threshold)
    k_dp, n_dp = _counts(scores_d_prime, threshold)
    tpr_lo, _ = clopper_pearson(k_d, n_d, confidence)
    _, fpr_hi = clopper_pearson(k_dp, n_dp, confidence)
    forward = _log_ratio(tpr_lo - delta, fpr_hi)
    backward = _log_ratio((1.0 - fpr_hi) - delta, 1.0 - tpr_lo)
    return max(forward, backward, 0.0)


def _log_gaussian_delta(eps: float, mu: float) -> float:
    """ln δ(ε) for δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), as ln a + ln(−expm1(ln b − ln a))."""
    log_a = float(special.log_ndtr(-eps / mu + mu / 2.0))
    log_b = eps + float(special.log_ndtr(-eps / mu - mu / 2.0))
    return log_a + math.log(-math.expm1(log_b - log_a))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε ≥ 0 at ``delta`` of a Gaussian mechanism with sensitivity / noise std = ``mu``.

    Solves δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = delta (Balle & Wang 2018, Thm. 8) in log space with
    brentq on [0, μ(μ/2 − Φ⁻¹(delta))], where the first term alone equals delta (so δ(ε) < delta there).
    0 when δ(0) ≤ delta (including μ = 0).
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not mu >= 0.0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    if math.isinf(mu):
        return math.inf
    if mu == 0.0 or 2.0 * float(stats.norm.cdf(mu / 2.0)) - 1.0 <= delta:
        return 0.0
    log_delta = math.log(delta)
    upper = mu * (mu / 2.0 - float(special.ndtri(delta)))
    return float(optimize.brentq(lambda e: _log_gaussian_delta(e, mu) - log_delta, 0.0, upper, xtol=1e-14, rtol=1e-14))


def best_threshold(
    scores_d: ArrayLike, scores_d_prime: ArrayLike, delta: float, candidates: Sequence[float], confidence: float = 0.95
) -> float:
    """The candidate threshold with the largest ε bound on these draws (pass a half not used for the audit).

    The criterion is :func:`epsilon_lower_bound` itself rather than the plug-in estimate ln((TPR − δ)/FPR),
    which is +∞ at any threshold no D' draw exceeds and would pick the most extreme candidate. Ties go to the
    first candidate.
    """
    if len(candidates) == 0:
        raise ValueError("need at least one candidate threshold")
    bounds = [epsilon_lower_bound(scores_d, scores_d_prime, t, delta, confidence) for t in candidates]
    return float(candidates[int(np.argmax(bounds))])
