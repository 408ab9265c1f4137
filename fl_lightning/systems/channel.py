"""Simulated FDMA wireless uplink of the FeDiSyn system model.

The server sits at the origin; the N devices are dropped uniformly at random in a disc of radius
R = 50 m centred at (300 m, 0). Device i, at distance d_i, sees the large-scale fading gain

    g_i = 10^(−PL0/10) · (d_i / d0)^(−α),   i.e.  PL(d) = PL0 + 10 α log10(d / d0) dB,

with d0 = 10 m, α = 3.5, and, with bandwidth B_i out of the total B = 10 MHz (FDMA, Σ B_i ≤ B),
uploads at the Shannon rate

    r_i = B_i · log2(1 + p_i g_i / σ²),   σ² = 1e-11 W

so that sending S bits takes S / r_i seconds. Assumption (as in the paper's model): σ² is a fixed
noise power, *not* a density times B_i, so the SNR p_i g_i / σ² and hence the spectral
efficiency e_i = log2(1 + p_i g_i / σ²) of a device do not depend on its bandwidth share; the rate
is then linear in B_i, which is what makes water-filling (``wfba.py``) a one-dimensional search.

Calibration. B, σ², α, d0 and the disc are the paper's; PL0 (the loss at d0) is the one number added,
and it is fitted so that the model is no slower than any time the paper reports
(``systems/calibration.py``, printed by ``python -m benchmarks fedisyn`` as
``paper_consistency``): on Food-101 with ViT-L/16, sending each method's reported traffic — with the
compute of the rounds that send it and, for the synthesis methods, the server's generation and
pre-training on an RTX 4090 (``systems/server.py``) — takes at most its reported time to 80 %:

=========  ============  ===========  =================================================
method     traffic       paper time   model at PL0 = 47.5 dB (ratio)
=========  ============  ===========  =================================================
FeDiSyn    7.4 MB        17,584 s     0.68 (10,100 s generation + 1,023 s pre-training
                                      + latent upload + 1 round)
CAFF       262.1 MB      31,905 s     0.28 (13.3 rounds)
SFLF       399.5 MB      41,885 s     0.33 (8.4 rounds)
FGL        12,002.8 MB   44,783 s     0.99 (1 round of full-model uploads; binding)
GPT-FL     13,676.3 MB   45,383 s     0.99 (1.1 rounds; binding)
=========  ============  ===========  =================================================

PL0 = 47.5 dB is the largest loss (0.5 dB grid) at which all hold; 48 dB makes FGL 1.01. The former
70 dB (fitted to CAFF alone, with ViT-B/16 constants) made a full-model upload take ~10^6 s. Read
physically: with the paper's σ² = −80 dBm (24 dB above the thermal kTB = −104 dBm of 10 MHz) it is
the link budget of free space at 10 m (60 dB at 2.4 GHz) plus 4.5 dB of shadowing seen by a
thermal-noise-limited receiver with a 7 dB noise figure (−97 dBm): 47.5 + (−80 + 97) = 64.5 dB. The
devices then see SNRs of about 0 to +5 dB, e_i ≈ 1.0–2.3 bit/s/Hz (placement seed 0), ~1–2.3 Mbit/s on
a 1 MHz share.

What the paper's numbers do not let hold at once: a channel fast enough for GPT-FL's and FGL's
full-model traffic makes a LoRA upload a small part of a round, so water-filling changes a CIFAR-10
FeDiSyn round by < 1 % (bench ``wfba_vs_equal``: 1.008) where the paper's w/o-WFBA ablation needs 41.7 %
more time; and CLC then picks deeper blocks than FeDiSyn's 7.4 MB of traffic allows (one round at its
depths sends ~29 MB; the check charges one round). Any PL0 that restores the WFBA gap makes FGL and
GPT-FL slower than the paper reports.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ChannelConfig",
    "place_devices",
    "path_gain",
    "spectral_efficiency",
    "upload_time",
    "device_spectral_efficiency",
    "REFERENCE_LOSS_DB",
]

REFERENCE_LOSS_DB: float = 47.5
"""PL0, path loss at d0 = 10 m (dB): fitted to the paper's times and traffic, see the module docstring."""


@dataclass(frozen=True)
class ChannelConfig:
    """The wireless channel's constants (defaults: the paper's simulation setting).

    Args:
        radius_m: radius of the disc the devices are dropped in (m).
        center_m: centre of that disc; the server is at (0, 0) (m).
        d0_m: reference distance of the path-loss model (m).
        path_loss_exponent: α in g = (d / d0)^-α.
        noise_power_w: σ², receiver noise power (W).
        total_bandwidth_hz: B, the uplink bandwidth shared by FDMA (Hz).
        reference_loss_db: PL0, the path loss at d0 (dB); 0 gives the bare (d / d0)^-α.
    """

    radius_m: float = 50.0
    center_m: tuple[float, float] = (300.0, 0.0)
    d0_m: float = 10.0
    path_loss_exponent: float = 3.5
    noise_power_w: float = 1e-11
    total_bandwidth_hz: float = 10e6
    reference_loss_db: float = REFERENCE_LOSS_DB

    def __post_init__(self) -> None:
        for key in ("radius_m", "d0_m", "path_loss_exponent", "noise_power_w", "total_bandwidth_hz"):
            value = getattr(self, key)
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
                raise ValueError(f"ChannelConfig.{key} must be a finite float > 0, got {value!r}")
        loss = self.reference_loss_db
        if not (isinstance(loss, numbers.Real) and math.isfinite(loss)):
            raise ValueError(f"ChannelConfig.reference_loss_db must be a finite float (dB), got {loss!r}")
        center = self.center_m
        if not (len(center) == 2 and all(math.isfinite(float(c)) for c in center)):
            raise ValueError(f"ChannelConfig.center_m must be a pair of finite floats (x, y), got {center!r}")
        if math.hypot(*center) <= self.radius_m:
            # A device could land on the server (d = 0, infinite gain).
            raise ValueError(
                f"ChannelConfig.center_m={center!r} must lie farther than radius_m={self.radius_m} from the server at (0, 0)"
            )


def place_devices(
    n: int,
    *,
    radius_m: float = 50.0,
    center_m: tuple[float, float] = (300.0, 0.0),
    seed: int,
) -> np.ndarray:
    """Drop n devices uniformly (in area) in a disc.

    Uniform in area means the radius is R·sqrt(u), not R·u (which would crowd the centre).

    Args:
        n: number of devices.
        radius_m: disc radius R (m).
        center_m: disc centre (m).
        seed: seed of the private ``np.random.default_rng``.

    Returns:
        (n, 2) float64 positions in metres.
    """
    if n < 0:
        raise ValueError(f"place_devices: n must be an int >= 0, got {n!r}")
    rng = np.random.default_rng(seed)
    r = radius_m * np.sqrt(rng.uniform(size=n))  # (n,)
    theta = rng.uniform(0.0, 2.0 * math.pi, size=n)  # (n,)
    offsets = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)  # (n, 2)
    return offsets + np.asarray(center_m, dtype=np.float64)


def path_gain(
    distance_m: float | np.ndarray, *, d0_m: float = 10.0, exponent: float = 3.5, reference_loss_db: float = REFERENCE_LOSS_DB
) -> np.ndarray:
    """Large-scale fading gain g = 10^(−PL0/10) · (d / d0)^(−α) (linear, not dB).

    In dB: PL(d) = PL0 + 10 α log10(d / d0), the log-distance model with PL0 the loss at d0.
    """
    d = np.asarray(distance_m, dtype=np.float64)
    if np.any(d <= 0):
        raise ValueError(f"path_gain: distances must be > 0 m, got {distance_m!r}")
    return 10.0 ** (-reference_loss_db / 10.0) * (d / d0_m) ** (-exponent)


def spectral_efficiency(transmit_power_w: float | np.ndarray, gain: float | np.ndarray, noise_power_w: float) -> np.ndarray:
    """Spectral efficiency e = log2(1 + p g / σ²) in bit/s/Hz (independent of the bandwidth)."""
    snr = np.asarray(transmit_power_w, dtype=np.float64) * np.asarray(gain, dtype=np.float64)
    return np.log2(1.0 + snr / noise_power_w)


def upload_time(
    payload_bits: float | np.ndarray, bandwidth_hz: float | np.ndarray, spectral_efficiency: float | np.ndarray
) -> np.ndarray:
    """Upload time S / (B_i · e_i) in seconds; 0 for an empty payload, inf for no bandwidth."""
    S = np.asarray(payload_bits, dtype=np.float64)
    rate = np.asarray(bandwidth_hz, dtype=np.float64) * np.asarray(spectral_efficiency, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = S / rate
    return np.where(S == 0, 0.0, t)


def device_spectral_efficiency(
    transmit_power_w: np.ndarray, *, config: ChannelConfig, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Drop one device per transmit power and return (positions (N, 2), efficiencies (N,)).

    Convenience for the planner: place → distance to the server → gain → spectral efficiency.
    """
    p = np.asarray(transmit_power_w, dtype=np.float64)  # (N,)
    positions = place_devices(p.shape[0], radius_m=config.radius_m, center_m=config.center_m, seed=seed)
    gain = path_gain(
        np.linalg.norm(positions, axis=1),
        d0_m=config.d0_m,
        exponent=config.path_loss_exponent,
        reference_loss_db=config.reference_loss_db,
    )
    return positions, spectral_efficiency(p, gain, config.noise_power_w)
