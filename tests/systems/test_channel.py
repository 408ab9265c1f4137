"""Tests for fl_lightning.systems.channel: placement, path loss, Shannon rate, upload time."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fl_lightning.systems.channel import (
    REFERENCE_LOSS_DB,
    ChannelConfig,
    device_spectral_efficiency,
    path_gain,
    place_devices,
    spectral_efficiency,
    upload_time,
)


def test_defaults_are_the_papers_setting() -> None:
    cfg = ChannelConfig()
    assert (cfg.radius_m, tuple(cfg.center_m), cfg.d0_m) == (50.0, (300.0, 0.0), 10.0)
    assert (cfg.path_loss_exponent, cfg.noise_power_w, cfg.total_bandwidth_hz) == (3.5, 1e-11, 1e7)
    assert cfg.reference_loss_db == REFERENCE_LOSS_DB == 47.5  # fitted (systems/calibration.py)


def test_place_devices_is_seeded_and_inside_the_disc() -> None:
    a = place_devices(50, radius_m=50.0, center_m=(300.0, 0.0), seed=3)
    b = place_devices(50, radius_m=50.0, center_m=(300.0, 0.0), seed=3)
    c = place_devices(50, radius_m=50.0, center_m=(300.0, 0.0), seed=4)
    assert a.shape == (50, 2)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert np.all(np.hypot(a[:, 0] - 300.0, a[:, 1]) <= 50.0)


def test_place_devices_is_uniform_in_area() -> None:
    # Uniform in area ⇔ (r / R)² ~ U(0, 1) and the angle ~ U(−π, π); r = R·u would fail the first.
    pos = place_devices(4000, radius_m=2.0, center_m=(-7.0, 5.0), seed=0)
    rel = pos - np.array([-7.0, 5.0])
    assert stats.kstest((np.hypot(*rel.T) / 2.0) ** 2, "uniform").pvalue > 1e-3
    angle = np.arctan2(rel[:, 1], rel[:, 0])
    assert stats.kstest(angle, "uniform", args=(-math.pi, 2 * math.pi)).pvalue > 1e-3


@pytest.mark.parametrize("pl0", [0.0, 60.0, 70.0])
def test_path_gain_in_db(pl0: float) -> None:
    d = np.array([10.0, 20.0, 300.0, 350.0])
    # In dB: −PL0 − 10·α·log10(d/d0).
    expected_db = -pl0 - 10 * 3.5 * np.log10(d / 10.0)
    got = path_gain(d, d0_m=10.0, exponent=3.5, reference_loss_db=pl0)
    np.testing.assert_allclose(10 * np.log10(got), expected_db, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="> 0 m"):
        path_gain(np.array([1.0, 0.0]))


def test_default_path_gain_is_the_calibrated_one() -> None:
    # 300 m: 47.5 dB at 10 m + 35·log10(30) = 99.2 dB of loss.
    assert 10 * np.log10(path_gain(300.0)) == pytest.approx(-(47.5 + 35.0 * np.log10(30.0)), rel=1e-12)


def test_spectral_efficiency_is_shannon_in_bits() -> None:
    p, g, noise = np.array([0.1, 0.2]), np.array([1e-6, 3e-8]), 1e-11
    expected = np.log1p(p * g / noise) / math.log(2)
    np.testing.assert_allclose(spectral_efficiency(p, g, noise), expected, rtol=1e-12)
    # Calibrated channel: 0.1 W (20 dBm) at 300 m, 99.2 dB of loss, noise −80 dBm: SNR +0.8 dB
    # ≈ 1.2, i.e. ~1.15 bit/s/Hz: ~1.15 Mbit/s on a 1 MHz share (module docstring).
    e = float(spectral_efficiency(0.1, path_gain(300.0), 1e-11))
    snr = 0.1 * 10 ** (-4.75) * 30.0**-3.5 / 1e-11
    assert e == pytest.approx(math.log2(1 + snr), rel=1e-12) and 1.1 < e < 1.2


def test_upload_time() -> None:
    t = upload_time(np.array([8e6, 0.0, 1e6]), np.array([1e6, 0.0, 0.0]), np.array([4.0, 5.0, 5.0]))
    assert t[0] == pytest.approx(2.0)
    assert t[1] == 0.0  # nothing to send
    assert t[2] == math.inf  # no bandwidth for a payload


def test_device_spectral_efficiency_composes_the_pieces() -> None:
    cfg = ChannelConfig()
    power = np.array([0.1, 0.15, 0.2])
    pos, eff = device_spectral_efficiency(power, config=cfg, seed=11)
    np.testing.assert_array_equal(pos, place_devices(3, radius_m=50.0, center_m=(300.0, 0.0), seed=11))
    d = np.sqrt((pos**2).sum(1))
    expected = np.log2(1 + power * 10**-4.75 * (d / 10.0) ** -3.5 / 1e-11)  # PL0 = 47.5 dB
    np.testing.assert_allclose(eff, expected, rtol=1e-12)
    _, bare = device_spectral_efficiency(power, config=ChannelConfig(reference_loss_db=0.0), seed=11)
    np.testing.assert_allclose(bare, np.log2(1 + power * (d / 10.0) ** -3.5 / 1e-11), rtol=1e-12)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(radius_m=-1.0),
        dict(noise_power_w=0.0),
        dict(center_m=(30.0, 0.0)),
        dict(total_bandwidth_hz=math.inf),
        dict(reference_loss_db=math.nan),
    ],
)
def test_channel_config_validation(overrides: dict) -> None:
    with pytest.raises(ValueError, match="ChannelConfig"):
        ChannelConfig(**overrides)
