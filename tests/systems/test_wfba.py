"""Tests for fl_lightning.systems.wfba.allocate_bandwidth against scipy's brentq."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from fl_lightning.systems.wfba import allocate_bandwidth, equal_bandwidth, finish_time


def _instance(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng(seed)
    H = rng.uniform(0.5, 20.0, n)
    S = rng.uniform(1e5, 5e7, n)
    e = rng.uniform(2.0, 18.0, n)
    return H, S, e, 10e6


def _finish_times(H, S, e, bw):
    return H + S / (bw * e)


def _brentq_round_time(H, S, e, B) -> float:
    a = S / e
    f = lambda T: np.sum(a / (T - H)) - B  # noqa: E731
    lo = H.max() + 1e-15 * max(1.0, H.max())
    hi = H.max() + 1.0
    while f(hi) > 0:
        hi = H.max() + 2 * (hi - H.max())
    return brentq(f, lo + (hi - lo) * 1e-14, hi, xtol=1e-15, rtol=1e-15, maxiter=500)


@pytest.mark.parametrize("seed, n", [(0, 2), (1, 5), (2, 10), (3, 40), (4, 10)])
def test_all_finish_together_and_bandwidth_sums_to_B(seed: int, n: int) -> None:
    H, S, e, B = _instance(seed, n)
    bw, T = allocate_bandwidth(H, S, e, B)
    assert np.all(bw > 0)
    np.testing.assert_allclose(_finish_times(H, S, e, bw), T, rtol=1e-9)
    assert bw.sum() == pytest.approx(B, rel=1e-9)
    assert T == pytest.approx(_brentq_round_time(H, S, e, B), rel=1e-10)


def test_round_time_is_optimal_among_other_allocations() -> None:
    H, S, e, B = _instance(7, 6)
    _, T = allocate_bandwidth(H, S, e, B)
    rng = np.random.default_rng(0)
    for _ in range(50):
        w = rng.dirichlet(np.ones(6)) * B
        assert _finish_times(H, S, e, w).max() >= T * (1 - 1e-12)


def test_invariant_to_device_order() -> None:
    H, S, e, B = _instance(5, 8)
    bw, T = allocate_bandwidth(H, S, e, B)
    perm = np.random.default_rng(1).permutation(8)
    bw_p, T_p = allocate_bandwidth(H[perm], S[perm], e[perm], B)
    assert T_p == pytest.approx(T, rel=1e-12)
    np.testing.assert_allclose(bw_p, bw[perm], rtol=1e-9)


def test_one_device_takes_all_the_bandwidth() -> None:
    bw, T = allocate_bandwidth(np.array([3.0]), np.array([8e6]), np.array([4.0]), 2e6)
    assert bw[0] == pytest.approx(2e6, rel=1e-12)
    assert T == pytest.approx(3.0 + 8e6 / (2e6 * 4.0), rel=1e-12)


def test_identical_devices_get_equal_shares() -> None:
    n = 7
    bw, T = allocate_bandwidth(np.full(n, 2.0), np.full(n, 1e6), np.full(n, 5.0), 7e6)
    np.testing.assert_allclose(bw, 1e6, rtol=1e-12)
    assert T == pytest.approx(2.0 + 1e6 / (1e6 * 5.0), rel=1e-12)


@pytest.mark.parametrize("start", [-1e9, 0.0, 1.0, 19.9, 1e3, 1e12, float("nan")])
def test_converges_from_any_start(start: float) -> None:
    H, S, e, B = _instance(3, 12)
    bw_ref, T_ref = allocate_bandwidth(H, S, e, B)
    bw, T = allocate_bandwidth(H, S, e, B, initial_round_time=start)
    assert T == pytest.approx(T_ref, rel=1e-12)
    assert bw.sum() == pytest.approx(B, rel=1e-9)


def test_zero_payload_devices_get_no_bandwidth() -> None:
    H = np.array([1.0, 2.0, 1.5])
    S = np.array([1e6, 0.0, 2e6])
    e = np.array([5.0, 0.0, 5.0])  # efficiency does not matter without a payload
    bw, T = allocate_bandwidth(H, S, e, 1e6)
    assert bw[1] == 0.0
    assert bw.sum() == pytest.approx(1e6, rel=1e-9)
    active = S > 0
    np.testing.assert_allclose(_finish_times(H[active], S[active], e[active], bw[active]), T, rtol=1e-9)


def test_a_slow_device_without_payload_sets_the_round_time() -> None:
    bw, T = allocate_bandwidth(np.array([1.0, 50.0]), np.array([1e6, 0.0]), np.array([5.0, 5.0]), 1e6)
    assert T == 50.0
    assert bw.tolist() == [1e6, 0.0]


def test_no_payload_at_all() -> None:
    bw, T = allocate_bandwidth(np.array([1.0, 4.0]), np.zeros(2), np.ones(2), 1e6)
    assert bw.tolist() == [0.0, 0.0] and T == 4.0


def test_tiny_uploads_after_long_compute_keep_precision() -> None:
    # T − H_i is ~1e-6 s against H ~ 1e5 s: solving for T − max H avoids the cancellation.
    H = np.array([1e5, 1e5 - 1e-7, 1e5 - 3e-7])
    S = np.array([10.0, 20.0, 5.0])
    e = np.array([10.0, 8.0, 12.0])
    bw, T = allocate_bandwidth(H, S, e, 1e7)
    assert bw.sum() == pytest.approx(1e7, rel=1e-9)
    # Finishing times relative to max H, where float64 can resolve them (T itself cannot).
    finish = (H - H.max()) + S / (bw * e)
    np.testing.assert_allclose(finish, finish.mean(), rtol=1e-9)
    assert T == pytest.approx(H.max() + finish.mean(), rel=1e-15)


@pytest.mark.parametrize(
    "args",
    [
        (np.array([1.0, -1.0]), np.ones(2), np.ones(2), 1.0),
        (np.ones(2), np.array([1.0, math.nan]), np.ones(2), 1.0),
        (np.ones(2), np.ones(2), np.array([1.0, 0.0]), 1.0),
        (np.ones(2), np.ones(3), np.ones(2), 1.0),
        (np.ones(2), np.ones(2), np.ones(2), 0.0),
    ],
)
def test_bad_inputs_raise(args: tuple) -> None:
    with pytest.raises(ValueError):
        allocate_bandwidth(*args)


# -- the equal split B/N (the "w/o WFBA" ablation) -------------------------------------------------
@pytest.mark.parametrize("seed, n", [(0, 2), (1, 5), (2, 10), (3, 40)])
def test_equal_split_matches_its_definition_and_never_beats_water_filling(seed: int, n: int) -> None:
    H, S, e, B = _instance(seed, n)
    bw, T = equal_bandwidth(H, S, e, B)
    np.testing.assert_allclose(bw, B / n, rtol=0)
    # Round time by hand: the last device to finish compute + upload at B/N.
    assert T == pytest.approx(max(H[i] + S[i] * n / (B * e[i]) for i in range(n)), rel=1e-15)
    _, T_wfba = allocate_bandwidth(H, S, e, B)
    assert T >= T_wfba * (1 - 1e-12)  # water-filling minimises the round time


def test_equal_split_equals_water_filling_on_identical_devices() -> None:
    # Identical devices: water-filling also gives B/N, so the two agree.
    H, S, e = np.full(4, 3.0), np.full(4, 2e6), np.full(4, 0.5)
    bw_eq, T_eq = equal_bandwidth(H, S, e, 1e6)
    bw_wf, T_wf = allocate_bandwidth(H, S, e, 1e6)
    np.testing.assert_allclose(bw_wf, bw_eq, rtol=1e-12)
    assert T_eq == pytest.approx(T_wf, rel=1e-12) == 3.0 + 2e6 * 4 / (1e6 * 0.5)


def test_equal_split_skips_devices_without_a_payload() -> None:
    bw, T = equal_bandwidth(np.array([1.0, 9.0, 2.0]), np.array([4e6, 0.0, 4e6]), np.array([2.0, 0.0, 1.0]), 4e6)
    assert bw.tolist() == [2e6, 0.0, 2e6]
    assert T == pytest.approx(max(1.0 + 1.0, 9.0, 2.0 + 2.0))  # the idle device's compute counts


def test_finish_time_of_water_filling_is_its_round_time_and_bad_shapes_raise() -> None:
    H, S, e, B = _instance(5, 7)
    bw, T = allocate_bandwidth(H, S, e, B)
    assert finish_time(H, S, e, bw) == pytest.approx(T, rel=1e-9)
    assert finish_time(np.array([1.0]), np.array([5.0]), np.array([1.0]), np.array([0.0])) == math.inf
    assert finish_time(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)) == 0.0
    with pytest.raises(ValueError, match="one shape"):
        finish_time(np.ones(2), np.ones(3), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="total_bandwidth"):
        equal_bandwidth(np.ones(2), np.ones(2), np.ones(2), -1.0)
