"""Tests for fl_lightning.systems.channel: placement, path loss, Shannon rate, upload time."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fl_lightning.errors import ConfigError
from fl_lightning.systems.channel import (
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


def test_path_gain_in_db() -> None:
    d = np.array([10.0, 20.0, 300.0, 350.0])
    # In dB: −10·α·log10(d/d0).
    expected_db = -10 * 3.5 * np.log10(d / 10.0)
    np.testing.assert_allclose(10 * np.log10(path_gain(d, d0_m=10.0, exponent=3.5)), expected_db,
                               rtol=1e-12)
    with pytest.raises(ConfigError):
        path_gain(np.array([1.0, 0.0]))


def test_spectral_efficiency_is_shannon_in_bits() -> None:
    p, g, noise = np.array([0.1, 0.2]), np.array([1e-6, 3e-8]), 1e-11
    expected = np.log1p(p * g / noise) / math.log(2)
    np.testing.assert_allclose(spectral_efficiency(p, g, noise), expected, rtol=1e-12)
    # A typical device: 0.1 W at 300 m sees an SNR of ~48 dB, i.e. ~16 bit/s/Hz.
    e = float(spectral_efficiency(0.1, path_gain(300.0), 1e-11))
    assert 15.0 < e < 17.0


def test_upload_time() -> None:
    t = upload_time(np.array([8e6, 0.0, 1e6]), np.array([1e6, 0.0, 0.0]), np.array([4.0, 5.0, 5.0]))
    assert t[0] == pytest.approx(2.0)
    assert t[1] == 0.0  # nothing to send
    assert t[2] == math.inf  # no bandwidth for a payload


def test_device_spectral_efficiency_composes_the_pieces() -> None:
    cfg = ChannelConfig()
    power = np.array([0.1, 0.15, 0.2])
    pos, eff = device_spectral_efficiency(power, config=cfg, seed=11)
    np.testing.assert_array_equal(pos, place_devices(3, radius_m=50.0, center_m=(300.0, 0.0),
                                                     seed=11))
    d = np.sqrt((pos ** 2).sum(1))
    expected = np.log2(1 + power * (d / 10.0) ** -3.5 / 1e-11)
    np.testing.assert_allclose(eff, expected, rtol=1e-12)


@pytest.mark.parametrize("overrides", [dict(radius_m=-1.0), dict(noise_power_w=0.0),
                                       dict(center_m=(30.0, 0.0)), dict(total_bandwidth_hz=math.inf)])
def test_channel_config_validation(overrides: dict) -> None:
    with pytest.raises(ConfigError):
        ChannelConfig(**overrides)
