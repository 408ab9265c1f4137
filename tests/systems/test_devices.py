"""Tests for fl_lightning.systems.devices: profiles, compute time, memory bound, measured mode."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fl_lightning.systems.backbones import backbone
from fl_lightning.systems.devices import (
    PROFILES,
    DeviceProfile,
    board_profiles,
    compute_time,
    max_depth,
    measured_profiles,
    paper_testbed,
    profile_arrays,
)


def _profile(**overrides: float) -> DeviceProfile:
    fields = dict(
        name="toy",
        forward_time_s=0.02,
        backward_time_per_layer_s=0.004,
        fixed_memory_gb=2.0,
        memory_per_layer_gb=1.5,
        memory_budget_gb=11.0,
        transmit_power_w=0.1,
    )
    fields.update(overrides)
    return DeviceProfile(**fields)


def test_paper_testbed_is_the_ten_boards_in_order() -> None:
    names = [p.name for p in paper_testbed()]
    assert names == (["jetson_agx_xavier"] + ["jetson_orin_nx"] * 5 + ["jetson_agx_orin"] * 3 + ["jetson_agx_thor"])


def test_calibrated_profiles_follow_the_stated_relative_speeds_and_budgets() -> None:
    xavier = PROFILES["jetson_agx_xavier"]
    for name, speed, board_gb in [
        ("jetson_agx_xavier", 1.0, 32),
        ("jetson_orin_nx", 1.5, 16),
        ("jetson_agx_orin", 3.0, 64),
        ("jetson_agx_thor", 8.0, 128),
    ]:
        p = PROFILES[name]
        assert xavier.forward_time_s / p.forward_time_s == pytest.approx(speed)
        assert xavier.backward_time_per_layer_s / p.backward_time_per_layer_s == pytest.approx(speed)
        assert 0 < p.memory_budget_gb < board_gb  # the OS keeps a share
        assert 0.1 <= p.transmit_power_w <= 0.2


@pytest.mark.parametrize("shape", ["profile", "list", "arrays"])
def test_compute_time_matches_the_formula_per_device(shape: str) -> None:
    rng = np.random.default_rng(0)
    profiles = [
        _profile(forward_time_s=float(f), backward_time_per_layer_s=float(b)) for f, b in rng.uniform(0.001, 0.05, size=(4, 2))
    ]
    D = np.array([10, 250, 0, 77])
    x = np.array([1, 12, 3, 5])
    expected = [D[i] * profiles[i].forward_time_s + D[i] * x[i] * profiles[i].backward_time_per_layer_s for i in range(4)]
    if shape == "profile":
        got = [float(compute_time(D[i], profiles[i], x[i])) for i in range(4)]
    elif shape == "list":
        got = compute_time(D, profiles, x)
    else:
        arrays = profile_arrays(profiles)
        got = compute_time(D, (arrays["forward_time_s"], arrays["backward_time_per_layer_s"]), x)
    np.testing.assert_allclose(got, expected, rtol=1e-14)


def test_compute_time_rejects_negative_depth() -> None:
    with pytest.raises(ValueError):
        compute_time(10, _profile(), -1)


@pytest.mark.parametrize("budget", [3.5, 5.0, 7.9, 11.0, 11.1, 100.0])
def test_max_depth_is_the_largest_depth_that_fits(budget: float) -> None:
    p = _profile(memory_budget_gb=budget)
    brute = max(x for x in range(1, 13) if p.fixed_memory_gb + x * p.memory_per_layer_gb <= budget)
    assert max_depth(p, num_layers=12) == brute


def test_max_depth_keeps_an_exact_fit() -> None:
    # 2.0 + 6 × 1.5 = 11.0 exactly: depth 6 fits even though (11 − 2) / 1.5 may round below 6.
    assert max_depth(_profile(memory_budget_gb=11.0), num_layers=12) == 6
    assert max_depth(_profile(memory_budget_gb=1.1 + 3 * 0.1, fixed_memory_gb=1.1, memory_per_layer_gb=0.1), num_layers=12) == 3


def test_max_depth_raises_when_one_block_does_not_fit() -> None:
    with pytest.raises(ValueError, match="memory_budget_gb"):
        max_depth(_profile(memory_budget_gb=3.0), num_layers=12)


def test_paper_testbed_depth_limits_are_heterogeneous_for_vit_large() -> None:
    # Food-101's ViT-L/16 at the configs' batch 32: an Orin NX holds 20 of 24 blocks, ViT-B/16 fits everywhere.
    large = paper_testbed(board_profiles(backbone("vit_large_patch16_224"), 32))
    limits = {p.name: max_depth(p, 24) for p in large}
    assert limits["jetson_orin_nx"] == 20 < 24 == limits["jetson_agx_thor"]
    assert all(max_depth(p, 12) == 12 for p in paper_testbed())


def test_board_profiles_follow_the_backbone_and_the_batch() -> None:
    b, l = backbone("vit_base_patch16_224"), backbone("vit_large_patch16_224")
    xb, xl = board_profiles(b, 32)["jetson_agx_xavier"], board_profiles(l, 32)["jetson_agx_xavier"]
    assert xb.forward_time_s == pytest.approx(0.020, rel=0.01)  # 17.6 GMAC at 0.88 TMAC/s
    assert xl.forward_time_s / xb.forward_time_s == pytest.approx(l.forward_macs / b.forward_macs)  # ~3.5x
    assert xb.backward_time_per_layer_s == pytest.approx(2 * xb.forward_time_s / 12)
    assert xl.backward_time_per_layer_s == pytest.approx(2 * xl.forward_time_s / 24)
    # memory per trainable block: the batch's saved activations (+ LoRA state), linear in the batch
    m32, m128 = xb.memory_per_layer_gb, board_profiles(b, 128)["jetson_agx_xavier"].memory_per_layer_gb
    assert m32 == pytest.approx(32 * b.activation_bytes_per_block() / 1e9, rel=0.01)
    assert m128 - m32 == pytest.approx(96 * b.activation_bytes_per_block() / 1e9)
    assert xl.fixed_memory_gb > xb.fixed_memory_gb  # ViT-L's weights
    with pytest.raises(ValueError, match="batch_size"):
        board_profiles(b, 0)


def test_measured_profiles_anchor_the_host_to_the_slowest_and_keep_ratios() -> None:
    base = paper_testbed()
    out = measured_profiles(base, host_forward_s=0.5, host_backward_per_layer_s=0.07)
    assert [p.name for p in out] == [p.name for p in base]
    assert out[0].forward_time_s == pytest.approx(0.5)  # the Xavier is the slowest
    assert out[0].backward_time_per_layer_s == pytest.approx(0.07)
    for old, new in zip(base, out):
        assert new.forward_time_s / out[0].forward_time_s == pytest.approx(old.forward_time_s / base[0].forward_time_s)
        assert new.backward_time_per_layer_s / out[0].backward_time_per_layer_s == pytest.approx(
            old.backward_time_per_layer_s / base[0].backward_time_per_layer_s
        )
        assert (new.memory_budget_gb, new.transmit_power_w) == (old.memory_budget_gb, old.transmit_power_w)


def test_measured_profiles_with_an_explicit_reference() -> None:
    thor = PROFILES["jetson_agx_thor"]
    out = measured_profiles(paper_testbed(), 0.01, 0.002, reference=thor)
    assert out[-1].forward_time_s == pytest.approx(0.01)
    assert out[0].forward_time_s == pytest.approx(0.08)  # Xavier is 8× slower than Thor


def test_measured_profiles_rejects_bad_host_times() -> None:
    with pytest.raises(ValueError):
        measured_profiles(paper_testbed(), 0.0, 0.01)


def test_profile_validation_and_immutability() -> None:
    with pytest.raises(ValueError, match="forward_time_s"):
        _profile(forward_time_s=-1.0)
    with pytest.raises(ValueError, match="fixed_memory_gb"):
        _profile(fixed_memory_gb=float("nan"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        _profile().forward_time_s = 1.0  # type: ignore[misc]
