"""Tests for fl_lightning.systems.clc: the CLC greedy (Alg. 1) and the baseline depth policies."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import brentq

from fl_lightning.systems.backbones import backbone
from fl_lightning.systems.clc import (
    DEPTH_POLICIES,
    capacity_depths,
    contribution_aware_depths,
    depth_contribution,
    fixed_depths,
    full_depths,
    memory_depth_limits,
    policy_depths,
)
from fl_lightning.systems.devices import board_profiles, max_depth, paper_testbed, profile_arrays


def _tight_testbed():
    """The testbed at ViT-B/16 and batch 128: memory binds (an Orin NX holds 6 of 12 blocks)."""
    return paper_testbed(board_profiles(backbone("vit_base_patch16_224"), 128))


def _case(seed: int, n: int, L: int) -> dict:
    """A small instance where compute and upload times are of the same order."""
    rng = np.random.default_rng(seed)
    return dict(
        contributions=rng.uniform(0.0, 1.0, (n, L)),
        num_samples=rng.integers(50, 300, n).astype(float),
        forward_time_s=rng.uniform(0.005, 0.02, n),
        backward_time_per_layer_s=rng.uniform(0.002, 0.02, n),
        fixed_memory_gb=np.full(n, 1.0),
        memory_per_layer_gb=np.full(n, 1.0),
        memory_budget_gb=rng.integers(3, L + 2, n).astype(float),  # limits 2..L
        layer_bits=2e6,
        spectral_efficiency=rng.uniform(2.0, 10.0, n),
        total_bandwidth_hz=1e6,
    )


def _ref_utility(case: dict, x: tuple[int, ...]) -> float:
    """Σ_i c_i(x_i) / T(x), with T from scipy's brentq (or B/N by hand) and contributions summed by hand."""
    C = case["contributions"]
    L = C.shape[1]
    contribution = sum(C[i, L - xi :].sum() for i, xi in enumerate(x))
    xs = np.array(x, dtype=float)
    H = case["num_samples"] * (case["forward_time_s"] + xs * case["backward_time_per_layer_s"])
    a = case["layer_bits"] * xs / case["spectral_efficiency"]
    B = case["total_bandwidth_hz"]
    if case.get("allocation") == "equal":
        return contribution / max(H[i] + a[i] * len(x) / B for i in range(len(x)))
    f = lambda T: float(np.sum(a / (T - H))) - B  # noqa: E731
    lo, hi = H.max(), H.max() + a.sum() / B
    T = brentq(f, lo + 1e-12 * (hi - lo), hi, xtol=1e-14, rtol=1e-15)
    return contribution / T


def _ref_greedy(case: dict) -> tuple[int, ...]:
    """Alg. 1 replayed on the brute-force table of U over every depth vector within memory."""
    n, L = case["contributions"].shape
    limits = [
        int(min(L, (M - mb) // m))
        for M, mb, m in zip(case["memory_budget_gb"], case["fixed_memory_gb"], case["memory_per_layer_gb"])
    ]
    table = {x: _ref_utility(case, x) for x in itertools.product(*(range(1, lim + 1) for lim in limits))}
    x = (1,) * n
    while True:
        moves = [x[:i] + (x[i] + 1,) + x[i + 1 :] for i in range(n) if x[i] < limits[i]]
        if not moves:
            return x
        best = max(moves, key=lambda y: table[y])  # max keeps the first (lowest index) on ties
        if not table[best] > table[x]:
            return x
        x = best


def test_hand_computed_two_device_case() -> None:
    # Upload is negligible (1 bit per block, 1 GHz), so T(x) ≈ 1 + max(x) with D = h̄ = h = 1.
    # C = [[2, 1], [b, 1]]: U(1,1) = 2/2 = 1, U(2,1) = 4/3 > U(1,2) = (2+b)/3, so device 0 grows
    # first; then U(2,2) = (4+b)/3 beats 4/3 only if b > 0.
    def depths(b: float) -> list[int]:
        return contribution_aware_depths(
            contributions=np.array([[2.0, 1.0], [b, 1.0]]),
            num_samples=np.ones(2),
            forward_time_s=np.ones(2),
            backward_time_per_layer_s=np.ones(2),
            fixed_memory_gb=np.zeros(2),
            memory_per_layer_gb=np.ones(2),
            memory_budget_gb=np.full(2, 10.0),
            layer_bits=1.0,
            spectral_efficiency=np.ones(2),
            total_bandwidth_hz=1e9,
        ).tolist()

    assert depths(0.5) == [2, 2]
    assert depths(0.0) == [2, 1]


@pytest.mark.parametrize("seed, n, L", [(0, 2, 3), (1, 2, 4), (2, 3, 3), (3, 3, 4), (4, 3, 4), (5, 2, 5), (6, 3, 3), (7, 3, 4)])
@pytest.mark.parametrize("allocation", ["wfba", "equal"])
def test_greedy_follows_the_brute_force_path(seed: int, n: int, L: int, allocation: str) -> None:
    case = dict(_case(seed, n, L), allocation=allocation)
    got = contribution_aware_depths(**case)
    assert tuple(got.tolist()) == _ref_greedy(case)


def test_brute_force_cases_are_not_trivial() -> None:
    # The parametrised cases above must stop in the interior, not only at all-1 or at the limits.
    interior = 0
    for seed, n, L in [(0, 2, 3), (1, 2, 4), (2, 3, 3), (3, 3, 4), (4, 3, 4), (5, 2, 5)]:
        case = _case(seed, n, L)
        limits = memory_depth_limits(
            fixed_memory_gb=case["fixed_memory_gb"],
            memory_per_layer_gb=case["memory_per_layer_gb"],
            memory_budget_gb=case["memory_budget_gb"],
            num_layers=L,
        )
        x = contribution_aware_depths(**case)
        interior += int(np.any((x > 1) & (x < limits)))  # stopped by U, not by memory
    assert interior >= 2


def test_result_is_a_local_optimum_within_memory() -> None:
    case = _case(11, 4, 6)
    x = contribution_aware_depths(**case)
    limits = memory_depth_limits(
        fixed_memory_gb=case["fixed_memory_gb"],
        memory_per_layer_gb=case["memory_per_layer_gb"],
        memory_budget_gb=case["memory_budget_gb"],
        num_layers=6,
    )
    assert np.all(x >= 1) and np.all(x <= limits)
    u = _ref_utility(case, tuple(x))
    for i in np.flatnonzero(x < limits):
        y = x.copy()
        y[i] += 1
        assert _ref_utility(case, tuple(y)) <= u * (1 + 1e-12)


def test_free_layers_fill_memory_and_useless_layers_stay_at_one() -> None:
    case = _case(12, 4, 6)
    limits = memory_depth_limits(
        fixed_memory_gb=case["fixed_memory_gb"],
        memory_per_layer_gb=case["memory_per_layer_gb"],
        memory_budget_gb=case["memory_budget_gb"],
        num_layers=6,
    )
    # Nearly free depth (no backward cost, negligible upload): every block adds contribution.
    free = dict(case, backward_time_per_layer_s=np.zeros(4), layer_bits=1e-3, contributions=case["contributions"] + 0.1)
    np.testing.assert_array_equal(contribution_aware_depths(**free), limits)
    # Only the last block contributes: deeper costs time for nothing.
    useless = dict(case, contributions=np.pad(np.ones((4, 1)), ((0, 0), (5, 0))))
    np.testing.assert_array_equal(contribution_aware_depths(**useless), np.ones(4))


def test_invariant_to_contribution_scale_and_time_units() -> None:
    case = _case(13, 3, 5)
    x = contribution_aware_depths(**case)
    scaled = dict(case, contributions=7.0 * case["contributions"])
    np.testing.assert_array_equal(contribution_aware_depths(**scaled), x)
    # Twice as slow compute and half the bandwidth: every time doubles, U halves uniformly.
    slower = dict(
        case,
        forward_time_s=2 * case["forward_time_s"],
        backward_time_per_layer_s=2 * case["backward_time_per_layer_s"],
        total_bandwidth_hz=case["total_bandwidth_hz"] / 2,
    )
    np.testing.assert_array_equal(contribution_aware_depths(**slower), x)


def test_more_valuable_device_goes_at_least_as_deep() -> None:
    # Two identical devices except that device 1's contributions are larger in every block.
    base = dict(
        num_samples=np.full(2, 100.0),
        forward_time_s=np.full(2, 0.01),
        backward_time_per_layer_s=np.full(2, 0.005),
        fixed_memory_gb=np.zeros(2),
        memory_per_layer_gb=np.ones(2),
        memory_budget_gb=np.full(2, 8.0),
        layer_bits=1e6,
        spectral_efficiency=np.full(2, 5.0),
        total_bandwidth_hz=1e6,
    )
    C = np.linspace(0.2, 1.0, 8)
    x = contribution_aware_depths(contributions=np.stack([C, 3 * C]), **base)
    assert x[1] >= x[0]


def _ten_devices(rng: np.random.Generator, *, layer_bits: float, efficiency: tuple[float, float]) -> dict:
    """CLC's inputs besides the profiles for 10 devices of 500 samples, 12 layers, 10 MHz: contributions uniform in
    [0, 1), then spectral efficiencies uniform in ``efficiency`` (drawn from ``rng`` in that order)."""
    return dict(
        contributions=rng.uniform(0, 1, (10, 12)),
        num_samples=np.full(10, 500.0),
        layer_bits=layer_bits,
        spectral_efficiency=rng.uniform(*efficiency, 10),
        total_bandwidth_hz=10e6,
    )


def test_paper_testbed_runs_and_respects_memory() -> None:
    profiles = paper_testbed()
    arrays = profile_arrays(profiles)
    arrays.pop("transmit_power_w")
    x = contribution_aware_depths(**_ten_devices(np.random.default_rng(0), layer_bits=3e6, efficiency=(15, 18)), **arrays)
    assert np.all(x <= [max_depth(p, 12) for p in profiles]) and np.all(x >= 1)


def test_depth_contribution_sums_the_last_blocks() -> None:
    C = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(depth_contribution(C, np.array([1, 4, 2])), [3.0, 4 + 5 + 6 + 7, 10 + 11])


def test_memory_limits_match_max_depth_and_raise_when_nothing_fits() -> None:
    arrays = profile_arrays(paper_testbed())
    limits = memory_depth_limits(
        fixed_memory_gb=arrays["fixed_memory_gb"],
        memory_per_layer_gb=arrays["memory_per_layer_gb"],
        memory_budget_gb=arrays["memory_budget_gb"],
        num_layers=12,
    )
    assert limits.tolist() == [max_depth(p, 12) for p in paper_testbed()]
    with pytest.raises(ValueError):
        memory_depth_limits(
            fixed_memory_gb=np.array([4.0]), memory_per_layer_gb=np.array([1.0]), memory_budget_gb=np.array([4.5]), num_layers=12
        )


def test_capacity_depths_are_proportional_to_speed() -> None:
    arrays = profile_arrays(paper_testbed())
    kw = {k: arrays[k] for k in ("forward_time_s", "backward_time_per_layer_s", "fixed_memory_gb", "memory_per_layer_gb")}
    big_memory = np.full(10, 1e3)
    x = capacity_depths(memory_budget_gb=big_memory, num_layers=12, **kw)
    # Relative speeds 1, 1.5, 3, 8 (Thor fastest): 12 · speed / 8, rounded.
    assert x.tolist() == [2] + [2] * 5 + [5] * 3 + [12]  # 1.5, 2.25, 4.5 → 2, 2, 5 (half up)
    capped = capacity_depths(memory_budget_gb=arrays["memory_budget_gb"], num_layers=12, **kw)
    assert np.all(capped <= [max_depth(p, 12) for p in paper_testbed()])
    assert np.all(capped >= 1)


def test_capacity_depths_give_slow_devices_at_least_one_block() -> None:
    x = capacity_depths(
        forward_time_s=np.array([1.0, 100.0]),
        backward_time_per_layer_s=np.array([0.1, 10.0]),
        fixed_memory_gb=np.zeros(2),
        memory_per_layer_gb=np.ones(2),
        memory_budget_gb=np.full(2, 12.0),
        num_layers=12,
    )
    assert x.tolist() == [12, 1]


def test_full_and_fixed_depths() -> None:
    assert full_depths(3, 12).tolist() == [12, 12, 12]
    assert fixed_depths(4, 2).tolist() == [2, 2, 2, 2]
    with pytest.raises(ValueError):
        fixed_depths(3, 0)
    with pytest.raises(ValueError):
        full_depths(3, 0)


# -- policies by name ---------------------------------------------------------------------------------
def _testbed_kw() -> dict:
    arrays = profile_arrays(_tight_testbed())
    return {
        k: arrays[k]
        for k in ("forward_time_s", "backward_time_per_layer_s", "fixed_memory_gb", "memory_per_layer_gb", "memory_budget_gb")
    }


def test_policy_depths_matches_each_policy_function() -> None:
    kw = _testbed_kw()
    limits = [max_depth(p, 12) for p in _tight_testbed()]
    clc_kw = _ten_devices(np.random.default_rng(3), layer_bits=1.2e6, efficiency=(0.01, 0.03))
    for policy in DEPTH_POLICIES:
        d = policy_depths(policy, num_layers=12, fixed_depth=9, **kw, **clc_kw)
        expected_request = {
            "clc": contribution_aware_depths(**kw, **clc_kw),
            "capacity": np.array([2] * 6 + [5] * 3 + [12]),  # 12 · speed / 8, before memory
            "full": full_depths(10, 12),
            "fixed": fixed_depths(10, 9),
        }[policy]
        np.testing.assert_array_equal(d.requested, expected_request)
        np.testing.assert_array_equal(d.limits, limits)
        np.testing.assert_array_equal(d.depths, np.minimum(expected_request, limits))
        np.testing.assert_array_equal(d.over_memory, expected_request > np.array(limits))
    np.testing.assert_array_equal(policy_depths("capacity", num_layers=12, **kw).depths, capacity_depths(num_layers=12, **kw))
    # SFLF asks for all 12 blocks; the boards whose memory holds fewer are named, not hidden.
    full = policy_depths("full", num_layers=12, **kw)
    assert full.over_memory.tolist() == [lim < 12 for lim in limits] and full.over_memory.any()
    assert not policy_depths("clc", num_layers=12, **kw, **clc_kw).over_memory.any()  # CLC searches within memory


def test_policy_depths_clc_with_the_equal_split_is_clc_against_that_round_time() -> None:
    case = _case(4, 3, 4)
    kw = {k: v for k, v in case.items() if k != "contributions"}
    got = policy_depths("clc", num_layers=4, contributions=case["contributions"], allocation="equal", **kw)
    assert tuple(got.depths.tolist()) == _ref_greedy(dict(case, allocation="equal"))


def test_policy_depths_rejects_bad_requests() -> None:
    kw = _testbed_kw()
    with pytest.raises(ValueError, match="unknown depth policy"):
        policy_depths("deepest", num_layers=12, **kw)
    with pytest.raises(ValueError, match="fixed_depth"):
        policy_depths("fixed", num_layers=12, fixed_depth=13, **kw)
    with pytest.raises(TypeError, match="contributions"):
        policy_depths("clc", num_layers=12, **kw)
    with pytest.raises(ValueError, match="allocation"):
        contribution_aware_depths(**dict(_case(0, 2, 3), allocation="proportional"))
