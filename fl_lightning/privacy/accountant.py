"""Privacy accounting by a maintained library: Google's ``dp-accounting`` (RDP and PLD accountants).

Every mechanism of this package is a (subsampled) Gaussian mechanism composed over releases — the
Gaussian mechanism of Dwork & Roth (2014, Thm. A.1) with noise std σ·Δ for an L2 sensitivity Δ, sampled
with probability q per release (Poisson subsampling, Abadi et al. 2016; McMahan et al. 2018) and composed
``steps`` times. No ε formula is written here: :func:`epsilon` asks the library's accountant, and
:func:`noise_multiplier` asks the library's own calibration (``mechanism_calibration``, a bracketed
bisection over σ) for the smallest σ that meets a target ε.

* ``rdp`` — Rényi DP (Mironov 2017; Mironov, Talwar & Zhang 2019) over the orders below: fast, a little
  loose. The default.
* ``pld`` — privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022): tighter, but a calibration
  takes tens of seconds (an ε alone ~2 s).

Pure: numbers in, numbers out; raises ``ValueError`` on bad input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

__all__ = ["ACCOUNTANTS", "epsilon", "noise_multiplier", "MAX_NOISE_MULTIPLIER"]

ACCOUNTANTS = ("rdp", "pld")
MAX_NOISE_MULTIPLIER = 1e3  # σ above this destroys any signal; a target that needs more is "not reachable"
# RDP orders: integers (the library's exact binomial expansion; its series for fractional orders fails to
# converge for q around 0.5 and is skipped with a log line), dense where the optimum lies for ε in [0.1, 50]
_RDP_ORDERS = (*range(2, 64), 80, 96, 128, 192, 256, 512, 1024)
_PLD_DISCRETIZATION = 1e-3  # the PLD accountant's value grid; 1e-4 (its default) is ~5x slower, ε within 1%


def _accountant(kind: str):
    from dp_accounting import pld, rdp

    if kind == "rdp":
        return rdp.RdpAccountant(orders=list(_RDP_ORDERS))
    if kind == "pld":
        return pld.PLDAccountant(value_discretization_interval=_PLD_DISCRETIZATION)
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {kind!r}")


def _event(sigma: float, parts: Sequence[tuple[float, int]]):
    """The composition, over ``parts`` = [(q, steps), …], of ``steps`` Gaussian mechanisms of noise multiplier σ
    each Poisson-sampled at rate q (one σ for all: e.g. the statistics' release and DP-SGD's steps)."""
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(sigma)
    sampled = [(gaussian if q >= 1.0 else dp_accounting.PoissonSampledDpEvent(q, gaussian), steps) for q, steps in parts]
    events = [dp_accounting.SelfComposedDpEvent(event, steps) for event, steps in sampled]
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def _check(parts: Sequence[tuple[float, int]], delta: float) -> None:
    if not parts:
        raise ValueError("nothing to account: no releases")
    for q, steps in parts:
        if not 0.0 < q <= 1.0:
            raise ValueError(f"sampling rate q must be in (0, 1], got {q!r}")
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def epsilon(
    sigma: float,
    *,
    q: float = 1.0,
    steps: int = 1,
    delta: float,
    accountant: Literal["rdp", "pld"] = "rdp",
    parts: Sequence[tuple[float, int]] | None = None,
) -> float:
    """ε of ``steps`` releases of a Gaussian mechanism with noise multiplier σ (std σ·Δ), sampled at rate q.

    Args:
        sigma: the noise multiplier σ > 0 (``inf``: no information released, ε = 0).
        q: the probability that a given unit (user or record) takes part in a release.
        steps: the number of releases composed.
        delta: the target δ.
        accountant: ``"rdp"`` or ``"pld"``.
        parts: instead of (q, steps), a composition [(q, steps), …] sharing σ (:func:`_event`).

    Returns:
        the ε for which the composition is (ε, δ)-DP, as the library computes it.
    """
    parts = list(parts) if parts is not None else [(q, steps)]
    _check(parts, delta)
    if not sigma > 0.0:
        raise ValueError(f"noise multiplier must be > 0, got {sigma!r}")
    if math.isinf(sigma):
        return 0.0
    acc = _accountant(accountant)
    acc.compose(_event(sigma, parts))
    return float(acc.get_epsilon(delta))


def noise_multiplier(
    target_epsilon: float,
    *,
    q: float = 1.0,
    steps: int = 1,
    delta: float,
    accountant: Literal["rdp", "pld"] = "rdp",
    tol: float = 1e-3,
    parts: Sequence[tuple[float, int]] | None = None,
) -> float:
    """The smallest σ (within ``tol``) whose ``steps`` releases at rate q are (target_epsilon, δ)-DP.

    Found by ``dp_accounting.mechanism_calibration.calibrate_dp_mechanism`` with the chosen accountant.

    Raises:
        ValueError: the target needs σ > :data:`MAX_NOISE_MULTIPLIER` (not reachable in practice).
    """
    from dp_accounting import mechanism_calibration as mc

    parts = list(parts) if parts is not None else [(q, steps)]
    _check(parts, delta)
    if not (target_epsilon > 0.0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target epsilon must be a finite float > 0, got {target_epsilon!r}")
    # reachability by RDP (an upper bound on ε that is cheap at any σ; the PLD grid is slow for huge σ)
    if epsilon(MAX_NOISE_MULTIPLIER, delta=delta, accountant="rdp", parts=parts) > target_epsilon:
        shown = ", ".join(f"{steps} at rate {q:g}" for q, steps in parts)
        raise ValueError(
            f"no noise multiplier <= {MAX_NOISE_MULTIPLIER:g} reaches epsilon={target_epsilon:g} at "
            f"delta={delta:g} over the releases ({shown})"
        )
    return float(
        mc.calibrate_dp_mechanism(
            lambda: _accountant(accountant),
            lambda s: _event(s, parts),
            target_epsilon,
            delta,
            mc.LowerEndpointAndGuess(1e-2, 1.0),
            tol=tol,
        )
    )
