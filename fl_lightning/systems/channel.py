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

Calibration. Without PL0 (the loss at d0) the model had a gain of 1 at 10 m: an SNR of
~48 dB and ~16 bit/s/Hz at 300 m, so a 12-block LoRA upload took < 1 s against 117–310 s of
compute and water-filling changed a round by < 0.3 %, whereas the paper simulates the edge network
precisely so that communication is not negligible. PL0 is the one number added; it is fitted to the
paper's reported figures as follows (reproduced by ``python -m fl_lightning.bench fedisyn``,
figure ``calibration_caff_time``):

=========================  ===================  ==================================================
quantity                   value                source / derivation
=========================  ===================  ==================================================
B, FDMA                    10 MHz               paper setting
σ² (fixed, not a density)  1e-11 W (−80 dBm)    paper setting (as implemented before)
α, d0, disc                3.5, 10 m, R=50 m    paper setting (as implemented before)
                           at (300 m, 0)
p_i                        0.10–0.20 W          ``devices.py`` (assumed, per board)
τ, bits per LoRA block     1,179,648 bit        ViT-B/16, rank 8 on attn.qkv (8·(768+2304) =
                           (147,456 B)          24,576) + attn.proj (8·(768+768) = 12,288) =
                                                36,864 float32 parameters per block
traffic is uploads, fp32   —                    GPT-FL 13,676 MB / 343.5 MB (ViT-B/16, 85.9 M
                                                fp32 params) = 39.8 ≈ 40 = 10 devices × 4 rounds
FeDiSyn LoRA traffic       50 block uploads     7.4 MB / 147,456 B = 50.2 (non-IID Food-101),
                                                e.g. 5 rounds × 10 devices × depth 1
CAFF LoRA traffic          1,778 block uploads  262.1 MB / 147,456 B
CAFF depths (capacity)     [2]*6+[5]*3+[12]     ``clc.capacity_depths`` on the testbed: 39/round
CAFF rounds                45.6                 1,778 / 39 (assumed: IID needs as many rounds as
                                                the non-IID traffic figure implies)
CAFF round time            700 s                31,905 s (Food-101 IID, 80 %) / 45.6 rounds
CAFF compute per round     ≤ 205 s              7,575 images/device (75,750 / 10), 1 epoch,
                                                ``devices.py`` times; the rest is the upload
CAFF bandwidth             B/N                  assumed: the baselines have no allocation of
                                                their own (``wfba.equal_bandwidth``)
PL0                        70 dB                solves model CAFF time = 31,905 s (exact:
                                                70.45 dB; 70 dB gives 29,181 s, −8.5 %). Free
                                                space at 10 m is 60 dB at 2.4 GHz and 67.7 dB at
                                                5.8 GHz; 70 dB is that plus a few dB of
                                                shadowing/penetration — a calibration, not a
                                                measurement
resulting e_i              0.008–0.033 bit/s/Hz SNR −21 to −15 dB: ~8–33 kbit/s on a 1 MHz share,
                           (placement seed 0)   36–150 s per block at B/N
=========================  ===================  ==================================================

Checks against figures *not* used in the fit (bench figures ``wfba_vs_equal`` and
``clc_vs_capacity``): on CIFAR-10 (5,000 images/device) FeDiSyn's CLC round lasts 1.42× longer
with the equal split than with WFBA (paper: w/o WFBA needs 41.7 % more time to 74 %); on Food-101
a FeDiSyn round (CLC + WFBA) lasts ~310 s, so its 50 block uploads (2–5 rounds) leave
16,000–17,000 s of the paper's 17,584 s to generation and pre-training on the server. Not checked (the paper's numbers
are not at hand): full-model FedAvg (GPT-FL, FGL) would take ~3.5·10^5 s per round on this
channel at B/N — if the paper's time axes show those baselines within the same range as CAFF, the
calibration is too pessimistic for them and should be revisited.
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

REFERENCE_LOSS_DB: float = 70.0
"""PL0, path loss at d0 = 10 m (dB): calibrated to the paper's CAFF time, see the module docstring."""


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
        for key in ("radius_m", "d0_m", "path_loss_exponent", "noise_power_w",
                    "total_bandwidth_hz"):
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
            raise ValueError(f"ChannelConfig.center_m={center!r} must lie farther than radius_m="
                             f"{self.radius_m} from the server at (0, 0)")


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


def path_gain(distance_m: float | np.ndarray, *, d0_m: float = 10.0, exponent: float = 3.5,
              reference_loss_db: float = REFERENCE_LOSS_DB) -> np.ndarray:
    """Large-scale fading gain g = 10^(−PL0/10) · (d / d0)^(−α) (linear, not dB).

    In dB: PL(d) = PL0 + 10 α log10(d / d0), the log-distance model with PL0 the loss at d0.
    """
    d = np.asarray(distance_m, dtype=np.float64)
    if np.any(d <= 0):
        raise ValueError(f"path_gain: distances must be > 0 m, got {distance_m!r}")
    return 10.0 ** (-reference_loss_db / 10.0) * (d / d0_m) ** (-exponent)


def spectral_efficiency(transmit_power_w: float | np.ndarray, gain: float | np.ndarray,
                        noise_power_w: float) -> np.ndarray:
    """Spectral efficiency e = log2(1 + p g / σ²) in bit/s/Hz (independent of the bandwidth)."""
    snr = np.asarray(transmit_power_w, dtype=np.float64) * np.asarray(gain, dtype=np.float64)
    return np.log2(1.0 + snr / noise_power_w)


def upload_time(payload_bits: float | np.ndarray, bandwidth_hz: float | np.ndarray,
                spectral_efficiency: float | np.ndarray) -> np.ndarray:
    """Upload time S / (B_i · e_i) in seconds; 0 for an empty payload, inf for no bandwidth."""
    S = np.asarray(payload_bits, dtype=np.float64)
    rate = np.asarray(bandwidth_hz, dtype=np.float64) * np.asarray(spectral_efficiency,
                                                                    dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = S / rate
    return np.where(S == 0, 0.0, t)


def device_spectral_efficiency(transmit_power_w: np.ndarray, *, config: ChannelConfig,
                               seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop one device per transmit power and return (positions (N, 2), efficiencies (N,)).

    Convenience for the planner: place → distance to the server → gain → spectral efficiency.
    """
    p = np.asarray(transmit_power_w, dtype=np.float64)  # (N,)
    positions = place_devices(p.shape[0], radius_m=config.radius_m, center_m=config.center_m,
                              seed=seed)
    gain = path_gain(np.linalg.norm(positions, axis=1), d0_m=config.d0_m,
                     exponent=config.path_loss_exponent, reference_loss_db=config.reference_loss_db)
    return positions, spectral_efficiency(p, gain, config.noise_power_w)
