"""Synthetic-data scaling law of FeDiSyn: how many synthetic images to generate.

With λ·D synthetic images (D = total real samples), the total time to reach accuracy Acc is

    H(λ, Acc) = h0 · λ + e^{κ3 · Acc} / (κ1 · λ^{κ2}) + κ4,     h0 = (ĥ + h̃ · T̂) · D

the first term the cost of generating (ĥ per image) and pre-training on (h̃ per image per epoch,
T̂ epochs) the synthetic set, the second the federated fine-tuning time, which shrinks as a
better pre-trained model needs fewer rounds, and κ4 a constant. κ1..κ4 are fitted by
Levenberg–Marquardt to a few cheap pilot runs at small λ; at a target accuracy H is convex in λ
with its minimum where ∂H/∂λ = h0 − κ2 e^{κ3 Acc} / (κ1 λ^{κ2+1}) = 0:

    λ* = (κ2 · e^{κ3 · Acc} / (h0 · κ1))^{1 / (κ2 + 1)}.

Pure math only; the pilots of ``synthetic_lambda: auto`` are ``fl_lightning.algorithms.synthetic_family.pilots``,
and the command line that fits pilot runs and plots H(λ) is ``python -m fl_lightning.algorithms.fedisyn.pilots``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ScalingLawParams",
    "total_time",
    "synthesis_cost_per_unit_lambda",
    "fit_scaling_law",
    "optimal_lambda",
]


@dataclass
class ScalingLawParams:
    """κ1..κ4 of H(λ, Acc) = h0 λ + e^{κ3 Acc} / (κ1 λ^{κ2}) + κ4."""

    kappa1: float
    kappa2: float
    kappa3: float
    kappa4: float


def total_time(lam: float | np.ndarray, acc: float | np.ndarray, *, h0: float, params: ScalingLawParams) -> np.ndarray:
    """H(λ, Acc) = h0 λ + e^{κ3 Acc} / (κ1 λ^{κ2}) + κ4, in seconds."""
    lam = np.asarray(lam, dtype=np.float64)
    acc = np.asarray(acc, dtype=np.float64)
    p = params
    return h0 * lam + np.exp(p.kappa3 * acc) / (p.kappa1 * lam**p.kappa2) + p.kappa4


def synthesis_cost_per_unit_lambda(
    gen_time_per_image: float, pretrain_time_per_image_epoch: float, pretrain_epochs: int, num_real_samples: int
) -> float:
    """h0 = (ĥ + h̃ · T̂) · D: seconds spent on synthesis and pre-training per unit of λ."""
    values = {
        "gen_time_per_image": gen_time_per_image,
        "pretrain_time_per_image_epoch": pretrain_time_per_image_epoch,
        "pretrain_epochs": pretrain_epochs,
        "num_real_samples": num_real_samples,
    }
    for key, value in values.items():
        if not (math.isfinite(float(value)) and float(value) >= 0):
            raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
    return float((gen_time_per_image + pretrain_time_per_image_epoch * pretrain_epochs) * num_real_samples)


def fit_scaling_law(
    lam: np.ndarray, acc: np.ndarray, observed_time: np.ndarray, *, h0: float, initial: ScalingLawParams | None = None
) -> ScalingLawParams:
    """Fit κ1..κ4 to pilot runs by Levenberg–Marquardt (least squares on H).

    κ1 is fitted through log κ1 so it stays positive. Without ``initial``, the start comes from a
    grid over (κ2, κ3) on which the model is linear in (1/κ1, κ4) and solved exactly — LM on an
    exponential model is sensitive to its start, and this makes the fit need no hand tuning.

    Args:
        lam: (n,) λ of each pilot run (> 0), n ≥ 4.
        acc: (n,) accuracy each pilot reached.
        observed_time: (n,) total time H each pilot took to reach it (s).
        h0: synthesis cost per unit λ (see :func:`synthesis_cost_per_unit_lambda`).
        initial: optional starting parameters.
    """
    lam, acc, y = (np.asarray(v, dtype=np.float64) for v in (lam, acc, observed_time))
    if lam.ndim != 1 or acc.shape != lam.shape or y.shape != lam.shape:
        raise ValueError(
            f"pilot lambda, accuracy and time must be arrays of one shape (n,), got {lam.shape}, {acc.shape} and {y.shape}"
        )
    if lam.size < 4:
        raise ValueError(f"the scaling law needs at least 4 pilot runs for its 4 parameters, got {lam.size}")
    if not (np.all(np.isfinite(lam)) and np.all(lam > 0)):
        raise ValueError(f"pilot lambda values must be finite and > 0, got {lam.tolist()}")
    if not (np.all(np.isfinite(acc)) and np.all(np.isfinite(y))):
        raise ValueError("pilot accuracy and time values must be finite")
    if not (math.isfinite(h0) and h0 >= 0):
        raise ValueError(f"h0 must be a finite float >= 0, got {h0!r}")

    rest = y - h0 * lam  # what the fitted terms must explain
    scale = max(float(np.abs(rest).max()), 1e-12)  # conditions LM; does not move the minimum

    def residuals(theta: np.ndarray) -> np.ndarray:
        log_k1, k2, k3, k4 = theta
        model = np.exp(k3 * acc - log_k1 - k2 * np.log(lam)) + k4
        return (model - rest) / scale

    if initial is None:
        start = _grid_start(lam, acc, rest)
    else:
        if not initial.kappa1 > 0:
            raise ValueError(f"initial.kappa1 must be > 0, got {initial.kappa1!r}")
        start = np.array([math.log(initial.kappa1), initial.kappa2, initial.kappa3, initial.kappa4])
    from scipy.optimize import least_squares  # here: SciPy's import costs every run's start, few runs fit

    fit = least_squares(residuals, start, method="lm", xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=20000)
    log_k1, k2, k3, k4 = fit.x
    return ScalingLawParams(kappa1=float(math.exp(log_k1)), kappa2=float(k2), kappa3=float(k3), kappa4=float(k4))


def _grid_start(lam: np.ndarray, acc: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """Best (log κ1, κ2, κ3, κ4) on a (κ2, κ3) grid, with (1/κ1, κ4) by linear least squares."""
    acc_c = acc - acc.mean()  # centring keeps e^{κ3 Acc} in range for large |κ3|
    k2 = np.linspace(0.05, 4.0, 80)
    # κ3 such that e^{κ3 Acc} varies by at most ~e^20 across the pilots.
    k3 = np.linspace(-20.0, 20.0, 81) / max(float(np.ptp(acc)), 1e-3)
    K2, K3 = (g.ravel() for g in np.meshgrid(k2, k3, indexing="ij"))  # (G,)
    basis = np.exp(K3[:, None] * acc_c[None, :] - K2[:, None] * np.log(lam)[None, :])  # (G, n)
    # Normal equations of rest ≈ c·basis + κ4, solved for every grid point at once.
    n = float(lam.size)
    s_bb, s_b = (basis * basis).sum(1), basis.sum(1)
    s_br, s_r = basis @ rest, float(rest.sum())
    det = s_bb * n - s_b * s_b
    with np.errstate(divide="ignore", invalid="ignore"):
        c = (s_br * n - s_b * s_r) / det
        k4 = (s_bb * s_r - s_b * s_br) / det
        sse = (((c[:, None] * basis + k4[:, None]) - rest[None, :]) ** 2).sum(1)
    ok = np.isfinite(sse) & (c > 0) & (np.abs(det) > 1e-12 * s_bb * n)
    if not np.any(ok):
        return np.array([0.0, 1.0, 1.0, 0.0])
    g = int(np.flatnonzero(ok)[np.argmin(sse[ok])])
    # e^{κ3 Acc}/κ1 = c e^{κ3 (Acc − mean)}  ⇒  log κ1 = κ3 · mean(Acc) − log c
    return np.array([K3[g] * acc.mean() - math.log(c[g]), K2[g], K3[g], k4[g]])


def optimal_lambda(acc: float, *, h0: float, params: ScalingLawParams) -> float:
    """λ* = (κ2 e^{κ3 Acc} / (h0 κ1))^{1/(κ2+1)}, the minimiser of H(·, Acc)."""
    p = params
    if not (h0 > 0 and p.kappa1 > 0 and p.kappa2 > 0):
        raise ValueError(
            f"optimal_lambda needs h0 > 0, kappa1 > 0 and kappa2 > 0 (otherwise H has no minimum "
            f"in λ), got h0={h0!r}, kappa1={p.kappa1!r}, kappa2={p.kappa2!r}"
        )
    log_lam = (math.log(p.kappa2) + p.kappa3 * acc - math.log(h0 * p.kappa1)) / (p.kappa2 + 1.0)
    return float(math.exp(log_lam))
