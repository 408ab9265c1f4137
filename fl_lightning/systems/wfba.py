"""Bandwidth allocation: water-filling (WFBA, FeDiSyn Alg. 2) and the equal split B/N (w/o WFBA).

A round lasts until the slowest device has computed and uploaded. With device i's compute time
H_i, payload S_i bits and spectral efficiency e_i (``channel.py``), giving it bandwidth B_i makes
it finish at H_i + S_i / (B_i e_i). The round time is minimised when every device finishes at the
same moment T (any device finishing early could hand bandwidth to the last one):

    H_i + S_i / (B_i e_i) = T  ⇒  B_i = S_i / (e_i (T − H_i)),      Σ_i B_i = B          (Alg. 2)

so T is the root, above max_i H_i, of the "waterline" equation

    φ(T) = Σ_i a_i / (T − H_i) − B = 0,    a_i = S_i / e_i.

φ is decreasing and convex on (max H_i, ∞), from +∞ to −B, so the root is unique. As in the
paper we find it with Newton's method, safeguarded so it converges from any start: a bracket
[lo, hi] with φ(lo) ≥ 0 ≥ φ(hi) is kept, and a Newton step that leaves it is replaced by
bisection. The bracket needs no search: with k the device of largest H (T − H_k = T − max H),
a_k / (T − max H) ≤ B gives lo = max H + a_k / B, and T − H_i ≥ T − max H gives
hi = max H + Σ a_i / B (where the paper doubles a guess until φ < 0, this bound is immediate).
Starting at lo, Newton on a convex decreasing φ climbs monotonically to the root (quadratically).

Devices with an empty payload need no bandwidth: they get B_i = 0 and do not enter φ; if one of
them computes longer than the waterline, the round lasts until it finishes.

The ablation "w/o WFBA" gives every device the same share, B_i = B/N (``equal_bandwidth``); its
round lasts max_i (H_i + S_i N / (B e_i)) (``finish_time``), never less than WFBA's T.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["allocate_bandwidth", "equal_bandwidth", "finish_time", "ALLOCATIONS"]

ALLOCATIONS: tuple[str, ...] = ("wfba", "equal")
"""Names of the bandwidth allocations: water-filling (FeDiSyn) and the equal split (w/o WFBA)."""


def allocate_bandwidth(
    compute_time: np.ndarray,
    payload_bits: np.ndarray,
    spectral_efficiency: np.ndarray,
    total_bandwidth: float,
    *,
    initial_round_time: float | None = None,
    rtol: float = 1e-13,
    max_iter: int = 200,
) -> tuple[np.ndarray, float]:
    """Bandwidths that make all devices finish together, and the resulting round time.

    Args:
        compute_time: H_i, (N,) seconds.
        payload_bits: S_i, (N,) bits to upload (0 allowed).
        spectral_efficiency: e_i, (N,) bit/s/Hz (> 0 where S_i > 0).
        total_bandwidth: B, Hz shared by FDMA.
        initial_round_time: Newton's starting waterline T (any value; out-of-bracket starts are
            pulled back by bisection). Default: the lower end of the bracket.
        rtol: stop when |Σ B_i − B| ≤ rtol · B.
        max_iter: iteration cap (bisection alone halves the bracket each time, so 200 suffices
            for float64).

    Returns:
        ``(bandwidth, round_time)``: (N,) float64 Hz summing to B (over devices with a payload),
        and T in seconds.
    """
    H, S, e = _check_inputs(compute_time, payload_bits, spectral_efficiency, total_bandwidth)
    B = float(total_bandwidth)
    bandwidth = np.zeros_like(H)
    if H.size == 0:
        return bandwidth, 0.0
    active = S > 0
    if not np.any(active):
        return bandwidth, float(H.max())

    a = S[active] / e[active]  # Hz·s of "work" each device puts on the channel
    H_max = float(H[active].max())
    gap = H_max - H[active]  # ≥ 0; solving for u = T − max H avoids cancellation in T − H_i

    def phi(u: float) -> tuple[float, float]:
        inv = 1.0 / (gap + u)
        return float(a @ inv) - B, -float(a @ (inv * inv))  # φ, φ'

    lo = float(a[gap == 0].max()) / B  # φ(lo) ≥ 0
    hi = float(a.sum()) / B  # φ(hi) ≤ 0
    u = lo if initial_round_time is None else float(initial_round_time) - H_max
    if not lo <= u <= hi:
        u = 0.5 * (lo + hi)
    for _ in range(max_iter):
        value, slope = phi(u)
        if value > 0:
            lo = u
        else:
            hi = u
        if abs(value) <= rtol * B or hi - lo <= 4 * np.finfo(np.float64).eps * hi:
            break
        step = u - value / slope  # Newton on the waterline (Alg. 2)
        u = step if lo < step < hi else 0.5 * (lo + hi)

    bandwidth[active] = a / (gap + u)  # B_i = S_i / (e_i (T − H_i))
    round_time = H_max + u
    return bandwidth, float(max(round_time, H.max()))


def equal_bandwidth(
    compute_time: np.ndarray,
    payload_bits: np.ndarray,
    spectral_efficiency: np.ndarray,
    total_bandwidth: float,
) -> tuple[np.ndarray, float]:
    """The equal split B_i = B / N (the "w/o WFBA" ablation), and the round time it gives.

    Same arguments and return value as :func:`allocate_bandwidth`, so a caller can swap them. N
    counts the devices with a payload (a device with nothing to send gets no bandwidth; in a LoRA
    round every device uploads at least one block, so this is B / N over all devices).

    Returns:
        ``(bandwidth, round_time)``: (N,) float64 Hz and max_i (H_i + S_i / (B_i e_i)) in seconds.
    """
    H, S, e = _check_inputs(compute_time, payload_bits, spectral_efficiency, total_bandwidth)
    bandwidth = np.zeros_like(H)
    active = S > 0
    if np.any(active):
        bandwidth[active] = float(total_bandwidth) / int(active.sum())
    return bandwidth, finish_time(H, S, e, bandwidth)


def finish_time(
    compute_time: np.ndarray, payload_bits: np.ndarray, spectral_efficiency: np.ndarray, bandwidth: np.ndarray
) -> float:
    """Round time of any allocation: max_i (H_i + S_i / (B_i e_i)); 0 for no device.

    A device with an empty payload finishes at H_i; one with a payload and no bandwidth never does
    (inf).
    """
    H = np.asarray(compute_time, dtype=np.float64)
    S = np.asarray(payload_bits, dtype=np.float64)
    rate = np.asarray(bandwidth, dtype=np.float64) * np.asarray(spectral_efficiency, dtype=np.float64)
    if H.shape != S.shape or rate.shape != H.shape or H.ndim != 1:
        raise ValueError(
            "finish_time: compute_time, payload_bits, spectral_efficiency and bandwidth must be "
            f"arrays of one shape (N,), got {H.shape}, {S.shape} and {rate.shape}"
        )
    if H.size == 0:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        upload = np.where(S > 0, S / rate, 0.0)
    upload = np.where((S > 0) & ~(rate > 0), np.inf, upload)
    return float(np.max(H + upload))


def _check_inputs(
    compute_time: np.ndarray,
    payload_bits: np.ndarray,
    spectral_efficiency: np.ndarray,
    total_bandwidth: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    H = np.asarray(compute_time, dtype=np.float64)
    S = np.asarray(payload_bits, dtype=np.float64)
    e = np.asarray(spectral_efficiency, dtype=np.float64)
    if H.ndim != 1 or S.shape != H.shape or e.shape != H.shape:
        raise ValueError(
            "compute_time, payload_bits and spectral_efficiency must be arrays of one shape (N,), "
            f"got {H.shape}, {S.shape} and {e.shape}"
        )
    if not np.all(np.isfinite(H) & (H >= 0)):
        raise ValueError(f"compute_time must be finite times >= 0 s, got {H.tolist()}")
    if not np.all(np.isfinite(S) & (S >= 0)):
        raise ValueError(f"payload_bits must be finite sizes >= 0 bits, got {S.tolist()}")
    if not np.all(np.isfinite(e[S > 0]) & (e[S > 0] > 0)):
        raise ValueError(f"spectral_efficiency must be finite and > 0 bit/s/Hz for every device with a payload, got {e.tolist()}")
    if not (math.isfinite(float(total_bandwidth)) and float(total_bandwidth) > 0):
        raise ValueError(f"total_bandwidth must be a finite float > 0 Hz, got {total_bandwidth!r}")
    return H, S, e
