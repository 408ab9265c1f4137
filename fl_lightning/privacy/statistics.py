"""Record-level DP of the sufficient statistics R = Σ h hᵀ, C = Σ h yᵀ (AFL, FedOPAL Eq. (7), FedCGS).

With every feature clipped, h ← h · min(1, c/‖h‖₂) (:func:`clip_features`), adding or removing one record
(h, y) with one-hot y moves the wire format (R's upper triangle, C, and FedCGS's class counts) by at most

    Δ² = ‖upper(h hᵀ)‖² + ‖h yᵀ‖² (+ 1 for the counts) ≤ c⁴ + c² (+ 1)          (:func:`sensitivity`)

in L2, so Gaussian noise of std σΔ on every entry is the Gaussian mechanism (Dwork & Roth 2014, Thm. A.1).
It goes on each client's statistics (local DP: the server learns only noisy R_k, C_k) or once on their
sum (central DP: the other clients and whoever sees W* learn only the noisy sum).

The noisy R is kept usable by **a larger ridge, chosen from the noise alone**: with Z the symmetric noise
matrix, R + Z + ‖Z‖₂ I ⪰ R ⪰ 0 (Weyl), so the solve (R + λI)⁻¹ stays well posed for any λ ≥ 0. The shift
depends on the noise only (post-processing: no privacy cost); its bias is that of a ridge of ‖Z‖₂
(≈ 2σΔ√d for a Wigner matrix). :func:`noise_statistics` returns the noised wire tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["clip_features", "sensitivity", "noise_statistics", "STATISTICS_KEYS"]

STATISTICS_KEYS = ("R_upper", "C")  # the wire format of fl_lightning.analytic.AnalyticStatistics.to_upload


def clip_features(h: Tensor, clip_norm: float) -> Tensor:
    """Per-sample clipping of features (B, d): each row scaled to L2 norm ≤ c (rows within it unchanged)."""
    if not clip_norm > 0:
        raise ValueError(f"clip norm must be > 0, got {clip_norm!r}")
    if math.isinf(clip_norm):
        return h
    norms = torch.linalg.vector_norm(h, dim=1, keepdim=True)
    return h * torch.clamp(clip_norm / norms.clamp_min(torch.finfo(h.dtype).tiny), max=1.0)


def sensitivity(clip_norm: float, *, with_counts: bool = False) -> float:
    """The L2 sensitivity Δ = sqrt(c⁴ + c² (+ 1)) of (upper(R), C (, counts)) to one record (module docstring)."""
    return math.sqrt(clip_norm**4 + clip_norm**2 + (1.0 if with_counts else 0.0))


def _upper_to_symmetric(vec: Tensor) -> Tensor:
    n = int(vec.numel())
    d = (math.isqrt(8 * n + 1) - 1) // 2
    i, j = torch.triu_indices(d, d)
    Z = torch.zeros(d, d, dtype=vec.dtype)
    Z[i, j] = vec
    Z[j, i] = vec
    return Z


def _diagonal_positions(d: int) -> Tensor:
    """Positions of the diagonal entries in the row-major upper triangle of a (d, d) matrix."""
    i, j = torch.triu_indices(d, d)
    return torch.nonzero(i == j).flatten()


def noise_statistics(
    tensors: Mapping[str, Tensor], *, std: float, generator: torch.Generator, psd_shift: bool = True
) -> dict[str, Tensor]:
    """``tensors`` (one client's, or the first of a sum) with N(0, std²) on R_upper, C (and ``counts``).

    Args:
        tensors: a statistics upload (``R_upper``, ``C``; FedCGS also ``counts``, int64: rounded after the noise,
            which is post-processing of the noise since the counts are integers).
        std: σΔ (0: returned unchanged).
        generator: a CPU generator (R, C, counts drawn in this order).
        psd_shift: add ‖Z‖₂ to R's diagonal (Z: the symmetric noise of R), so that R + Z + ‖Z‖₂ I ⪰ R.
    """
    out = dict(tensors)
    if std == 0.0:
        return out
    upper = tensors["R_upper"]
    z_upper = torch.randn(upper.shape, generator=generator, dtype=torch.float64) * std
    if psd_shift:
        d = (math.isqrt(8 * upper.numel() + 1) - 1) // 2
        shift = float(torch.linalg.matrix_norm(_upper_to_symmetric(z_upper), ord=2))
        z_upper[_diagonal_positions(d)] += shift
    out["R_upper"] = (upper.double() + z_upper.to(upper.device)).to(upper.dtype)
    C = tensors["C"]
    out["C"] = (C.double() + (torch.randn(C.shape, generator=generator, dtype=torch.float64) * std).to(C.device)).to(C.dtype)
    if "counts" in tensors:
        n = tensors["counts"]
        z = torch.randn(n.shape, generator=generator, dtype=torch.float64) * std
        out["counts"] = (
            (n + torch.round(z).to(n.device).to(n.dtype))
            if not n.is_floating_point()
            else (n.double() + z.to(n.device)).to(n.dtype)
        )
    return out
