"""Tests for fl_lightning.systems.scaling_law: the model, the LM fit and λ* (the command line is
FeDiSyn's: tests/algorithms/test_fedisyn_pilots.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from fl_lightning.systems.scaling_law import (
    ScalingLawParams,
    fit_scaling_law,
    optimal_lambda,
    synthesis_cost_per_unit_lambda,
    total_time,
)

# Pilot times of ~3e3–2e4 s, of which κ4 = 2000 s is a visible part.
TRUE = ScalingLawParams(kappa1=0.05, kappa2=0.6, kappa3=5.0, kappa4=2000.0)
H0 = 2000.0


def _pilots(noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pilot runs at small λ reaching several accuracies, with multiplicative noise."""
    lam, acc = (g.ravel() for g in np.meshgrid(np.geomspace(0.02, 0.5, 6), [0.55, 0.65, 0.75, 0.85]))
    rng = np.random.default_rng(seed)
    H = total_time(lam, acc, h0=H0, params=TRUE) * (1 + noise * rng.standard_normal(lam.size))
    return lam, acc, H


def test_total_time_formula() -> None:
    p = ScalingLawParams(kappa1=0.5, kappa2=2.0, kappa3=1.0, kappa4=3.0)
    # h0 λ + e^{κ3 Acc} / (κ1 λ^κ2) + κ4 at λ = 2, Acc = ln 4: 10·2 + 4 / (0.5·4) + 3 = 25.
    assert float(total_time(2.0, math.log(4.0), h0=10.0, params=p)) == pytest.approx(25.0)


def test_synthesis_cost_per_unit_lambda() -> None:
    # (ĥ + h̃ T̂) D = (0.5 + 0.01·20)·1000 = 700 s per unit λ.
    assert synthesis_cost_per_unit_lambda(0.5, 0.01, 20, 1000) == pytest.approx(700.0)
    with pytest.raises(ValueError):
        synthesis_cost_per_unit_lambda(-1.0, 0.01, 20, 1000)


def test_fit_recovers_known_parameters_exactly_without_noise() -> None:
    fit = fit_scaling_law(*_pilots(noise=0.0), h0=H0)
    for name in ("kappa1", "kappa2", "kappa3", "kappa4"):
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=1e-5), name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_parameters_from_noisy_pilots(seed: int) -> None:
    fit = fit_scaling_law(*_pilots(noise=0.005, seed=seed), h0=H0)
    assert fit.kappa1 == pytest.approx(TRUE.kappa1, rel=0.1)  # κ1 and κ3 trade off (e^{κ3 Acc}/κ1)
    assert fit.kappa2 == pytest.approx(TRUE.kappa2, rel=0.03)
    assert fit.kappa3 == pytest.approx(TRUE.kappa3, rel=0.03)
    assert fit.kappa4 == pytest.approx(TRUE.kappa4, rel=0.03)
    # What matters downstream: λ* at the target accuracy.
    assert optimal_lambda(0.9, h0=H0, params=fit) == pytest.approx(optimal_lambda(0.9, h0=H0, params=TRUE), rel=0.03)


def test_fit_from_an_explicit_initial_guess() -> None:
    start = ScalingLawParams(kappa1=0.02, kappa2=1.0, kappa3=4.0, kappa4=0.0)
    fit = fit_scaling_law(*_pilots(noise=0.0), h0=H0, initial=start)
    assert fit.kappa2 == pytest.approx(TRUE.kappa2, rel=1e-5)


@pytest.mark.parametrize("acc", [0.6, 0.8, 0.95])
def test_optimal_lambda_minimises_total_time(acc: float) -> None:
    ref = minimize_scalar(
        lambda lam: float(total_time(lam, acc, h0=H0, params=TRUE)),
        bounds=(1e-6, 1e3),
        method="bounded",
        options={"xatol": 1e-10, "maxiter": 2000},
    )
    assert optimal_lambda(acc, h0=H0, params=TRUE) == pytest.approx(ref.x, rel=1e-4)


def test_optimal_lambda_grows_with_target_accuracy_and_falls_with_cost() -> None:
    assert optimal_lambda(0.9, h0=H0, params=TRUE) > optimal_lambda(0.7, h0=H0, params=TRUE)
    assert optimal_lambda(0.8, h0=2 * H0, params=TRUE) < optimal_lambda(0.8, h0=H0, params=TRUE)


def test_optimal_lambda_needs_an_interior_minimum() -> None:
    with pytest.raises(ValueError):
        optimal_lambda(0.8, h0=H0, params=ScalingLawParams(1e-3, -0.5, 6.0, 0.0))
    with pytest.raises(ValueError):
        optimal_lambda(0.8, h0=0.0, params=TRUE)


@pytest.mark.parametrize("n", [0, 3])
def test_fit_needs_four_pilots(n: int) -> None:
    lam, acc, H = _pilots(0.0)
    with pytest.raises(ValueError, match="pilot"):
        fit_scaling_law(lam[:n], acc[:n], H[:n], h0=H0)


def test_fit_rejects_non_positive_lambda() -> None:
    lam, acc, H = _pilots(0.0)
    lam[0] = 0.0
    with pytest.raises(ValueError, match="lambda"):
        fit_scaling_law(lam, acc, H, h0=H0)
