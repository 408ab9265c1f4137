"""Closed-form (analytic) classifier from sufficient statistics — FedOPAL Eq. (7)-(9), AFL.

Each client k accumulates, over its features h_i ∈ R^d and one-hot labels y_i ∈ R^c,

    Eq. (7)   R_k = Σ_i h_i h_iᵀ  (d, d),    C_k = Σ_i h_i y_iᵀ  (d, c),

and the server solves the ridge regression on the union of all clients' data

    Eq. (9)   W* = (Σ_k R_k + λ I)⁻¹ Σ_k C_k  (d, c),    logits = h W*.

Because R and C are sums, the federated solution equals the centralised one exactly, for any
partition and client order. Everything here is pure torch (float64 by default): no I/O, no devices
chosen, no Lightning.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = [
    "AnalyticStatistics",
    "StatisticsSum",
    "solve_classifier",
    "regularization",
    "logits",
    "CONVENTIONS",
    "validation_loss",
    "RidgeChoice",
    "choose_ridge",
]

CONVENTIONS = ("once", "per_client")


@dataclass
class AnalyticStatistics:
    """Sufficient statistics of one client (or of a sum of clients), Eq. (7).

    The upper triangle of R (diagonal included) is canonical. :meth:`update` accumulates R with one
    GEMM per batch, whose lower triangle may differ from the upper by rounding; :meth:`upper_triangle`
    (the wire format) reads the upper entries and :meth:`from_upper` mirrors them, so every R a server
    builds from uploads is exactly symmetric, and a client's upload depends only on its own data.
    :meth:`symmetric` gives that exactly symmetric R for local use.

    Attributes:
        R: Σ h hᵀ, shape (d, d), symmetric positive semi-definite (up to rounding below the diagonal).
        C: Σ h yᵀ, shape (d, c).
        N: number of samples accumulated.
    """

    R: Tensor
    C: Tensor
    N: int = 0

    @classmethod
    def zeros(
        cls, d: int, c: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> AnalyticStatistics:
        """Empty statistics for features of dimension d and c classes."""
        return cls(R=torch.zeros(d, d, dtype=dtype, device=device), C=torch.zeros(d, c, dtype=dtype, device=device), N=0)

    @property
    def feature_dim(self) -> int:
        return int(self.R.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.C.shape[1])

    def update(self, h: Tensor, y: Tensor) -> AnalyticStatistics:
        """Eq. (7) in place: R += hᵀh, C += hᵀY, N += B.

        Args:
            h: features, shape (B, d); cast to the statistics' dtype before the products.
            y: one-hot labels (B, c), or integer class indices (B,).
        """
        if h.ndim != 2 or h.shape[1] != self.feature_dim:
            raise ValueError(f"features must have shape (B, {self.feature_dim}), got {tuple(h.shape)}")
        if y.ndim == 1:
            y = F.one_hot(y.long(), num_classes=self.num_classes)
        if y.shape != (h.shape[0], self.num_classes):
            raise ValueError(f"labels must have shape ({h.shape[0]}, {self.num_classes}), got {tuple(y.shape)}")
        h = h.to(self.R.dtype)
        # One in-place GEMM, no (d, d) temporaries: the per-batch cost that dominates a client with few
        # samples at d = 768. A blocked GEMM may round R[i, j] and R[j, i] differently (by an ulp); the
        # upper triangle is the canonical R (see the class docstring), so this is never visible on the wire.
        self.R.addmm_(h.T, h)  # (d, B) @ (B, d)
        self.C.addmm_(h.T, y.to(self.C.dtype))  # (d, B) @ (B, c)
        self.N += int(h.shape[0])
        return self

    def __add__(self, other: AnalyticStatistics) -> AnalyticStatistics:
        if not isinstance(other, AnalyticStatistics):
            return NotImplemented
        if self.R.shape != other.R.shape or self.C.shape != other.C.shape:
            raise ValueError(f"cannot add statistics of shapes {tuple(self.C.shape)} and {tuple(other.C.shape)}")
        return AnalyticStatistics(R=self.R + other.R, C=self.C + other.C, N=self.N + other.N)

    def __radd__(self, other: object) -> AnalyticStatistics:
        # lets sum(list_of_statistics) start from 0
        if isinstance(other, int) and other == 0:
            return self
        return NotImplemented

    def symmetric(self) -> AnalyticStatistics:
        """A copy whose R is exactly symmetric: the upper triangle mirrored (what a server receives)."""
        return AnalyticStatistics.from_upper(self.upper_triangle(), self.C.clone(), self.N)

    def upper_triangle(self) -> Tensor:
        """The d(d+1)/2 entries of R on and above the diagonal, row by row (the wire format:
        R is symmetric, so the lower triangle carries no information)."""
        # a gather of flat indices: ~4x faster than R[i, j] at d = 768, and paid by every client
        return self.R.reshape(-1).index_select(0, _triu_flat_indices(self.feature_dim, self.R.device))

    def to_upload(self) -> dict[str, Tensor]:
        """The wire format of one client's statistics: ``R_upper`` (d(d+1)/2,) and ``C`` (d, c); N travels
        as the upload's sample count. :class:`StatisticsSum` folds it back."""
        return {"R_upper": self.upper_triangle(), "C": self.C}

    @staticmethod
    def upload_shapes(d: int, c: int) -> dict[str, tuple[int, ...]]:
        """The shapes of :meth:`to_upload` for features of dimension d and c classes."""
        return {"R_upper": (d * (d + 1) // 2,), "C": (d, c)}

    @classmethod
    def from_upper(cls, vec: Tensor, C: Tensor, N: int) -> AnalyticStatistics:
        """Inverse of :meth:`upper_triangle`: rebuild the symmetric R from its upper entries."""
        n = int(vec.numel())
        d = (math.isqrt(8 * n + 1) - 1) // 2
        if d * (d + 1) // 2 != n:
            raise ValueError(f"{n} entries are not the upper triangle of a square matrix")
        i, j = _triu_indices(d, vec.device)
        R = torch.zeros(d, d, dtype=vec.dtype, device=vec.device)
        R[i, j] = vec.reshape(-1)
        R[j, i] = vec.reshape(-1)
        return cls(R=R, C=C, N=int(N))


class StatisticsSum:
    """Σ_k (R_k, C_k, N_k) of uploads in the wire format of :meth:`AnalyticStatistics.to_upload`, folded
    one upload at a time (server memory flat in K).

    The wire format is folded in place (R's upper triangle, C) and R is rebuilt once in :meth:`total`:
    the same additions in the same order as summing the full matrices, so the same bits, at a fraction
    of the cost per client.
    """

    def __init__(self) -> None:
        self._upper: Tensor | None = None
        self._C: Tensor | None = None
        self.num_samples = 0
        self.count = 0  # uploads folded in

    def add_upload(self, tensors: dict[str, Tensor], num_samples: int) -> None:
        upper, C = tensors["R_upper"], tensors["C"]
        if self._upper is None:
            self._upper, self._C = upper.clone(), C.clone()
        else:
            self._upper.add_(upper)
            self._C.add_(C)
        self.num_samples += int(num_samples)
        self.count += 1

    def total(self) -> AnalyticStatistics:
        if self._upper is None:
            raise ValueError("no statistics were added")
        return AnalyticStatistics.from_upper(self._upper, self._C, self.num_samples)


@functools.lru_cache(maxsize=8)
def _triu_flat_indices(d: int, device: torch.device) -> Tensor:
    """(d(d+1)/2,) row-major flat positions i·d + j of the upper triangle (see :func:`_triu_indices`)."""
    i, j = _triu_indices(d, device)
    return i * d + j


@functools.lru_cache(maxsize=8)
def _triu_indices(d: int, device: torch.device) -> Tensor:
    """(2, d(d+1)/2) row/column indices of the upper triangle, built once per (d, device): every client's
    upload and the server's fold use the same d."""
    return torch.triu_indices(d, d, device=device)


def solve_classifier(R: Tensor, C: Tensor, *, lam: float) -> Tensor:
    """Eq. (9): W = (R + λI)⁻¹ C, without forming an inverse.

    λ > 0: Cholesky of the SPD matrix R + λI (``cholesky_ex`` + ``cholesky_solve``). Should that
    fail (R not PSD through rounding), an LU solve, then least squares, with a warning.
    λ = 0: least squares through the SVD (``lstsq``, driver ``gelsd``), which is the exact solution
    when R is invertible and the minimum-norm solution R⁺C when it is singular (e.g. fewer samples
    than feature dimensions) — finite either way; a rank-deficient R is reported with a warning.

    Args:
        R: (d, d) symmetric PSD; C: (d, c). Computed in their dtype (use float64).
        lam: λ ≥ 0.

    Returns:
        W, shape (d, c).
    """
    if lam < 0 or not math.isfinite(lam):
        raise ValueError(f"lam must be a finite number >= 0, got {lam}")
    d = R.shape[0]
    if R.shape != (d, d) or C.shape[0] != d:
        raise ValueError(f"R must be (d, d) and C (d, c), got {tuple(R.shape)} and {tuple(C.shape)}")
    if lam == 0:
        return _least_norm(R, C)
    A = R + lam * torch.eye(d, dtype=R.dtype, device=R.device)
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) == 0:
        return torch.cholesky_solve(C, L)
    warnings.warn(
        f"R + {lam}·I is not positive definite (Cholesky failed at column {int(info)}); solving with LU instead",
        RuntimeWarning,
        stacklevel=2,
    )
    W, info = torch.linalg.solve_ex(A, C)
    if int(info) == 0 and bool(torch.isfinite(W).all()):
        return W
    return _least_norm(A, C)


def _least_norm(A: Tensor, C: Tensor) -> Tensor:
    """argmin ||W|| among the minimisers of ||A W − C||, via the SVD (gelsd runs on the CPU)."""
    result = torch.linalg.lstsq(A.cpu(), C.cpu(), driver="gelsd")
    if int(result.rank) < A.shape[0]:
        warnings.warn(
            f"R is singular (rank {int(result.rank)} < {A.shape[0]}) and λ = 0: "
            "returning the minimum-norm least-squares solution",
            RuntimeWarning,
            stacklevel=3,
        )
    return result.solution.to(A.device)


def regularization(lam: float, *, num_clients: int, convention: str, remove: bool = False) -> float:
    """The λ that :func:`solve_classifier` should add to Σ_k R_k.

    * ``'once'`` (FedOPAL, Eq. (9)): λ is added once to the aggregate → ``lam``.
    * ``'per_client'`` (AFL's published code): every client regularises its own R_k + γI, so the
      aggregate carries K·γ·I → ``num_clients * lam``.
    * ``remove=True`` (AFL's regularisation removal): the clients' γI terms are taken back out at
      the server, so the aggregate is the unregularised Σ_k R_k and the returned λ is 0 —
      :func:`solve_classifier` then gives the exact least-squares solution, or the minimum-norm one
      when Σ_k R_k is singular. Our clients upload raw R_k (not regularised inverses), so the
      removal is done exactly by solving without λ; AFL's step-by-step correction of a
      regularised W is not reproduced.

    Args:
        lam: λ (or AFL's γ) ≥ 0.
        num_clients: K ≥ 1.
        convention: ``'once'`` or ``'per_client'``.
        remove: remove the regularisation again (see above).
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    if remove:
        return 0.0
    return float(lam) if convention == "once" else float(num_clients * lam)


def logits(h: Tensor, W: Tensor) -> Tensor:
    """Class scores h W, shape (B, c); h is cast to W's dtype."""
    return h.to(W.dtype) @ W


def validation_loss(W: Tensor, val: AnalyticStatistics) -> float:
    """Mean squared error of the ridge head W on held-out data, from that data's statistics alone.

    With one-hot labels (tr(YᵀY) = N),

        ‖H W − Y‖²_F / N = (tr(Wᵀ R W) − 2·tr(Wᵀ C) + N) / N,    R = HᵀH, C = HᵀY (Eq. (7)),

    the least-squares objective that Eq. (9) minimises on the training statistics, measured on data
    it did not see: what a server can score a candidate head by without another round.

    Args:
        W: (d, c) a head.
        val: the held-out statistics (R, C of one-hot labels, N ≥ 1), in W's dtype.

    Returns:
        The mean squared error per held-out sample (≥ 0 up to rounding).
    """
    if val.N < 1:
        raise ValueError("validation statistics hold no samples")
    if W.shape != val.C.shape:
        raise ValueError(f"W of shape {tuple(W.shape)} does not fit statistics of shape {tuple(val.C.shape)}")
    R = val.symmetric().R
    quadratic = (W * (R @ W)).sum()  # tr(Wᵀ R W)
    linear = (W * val.C).sum()  # tr(Wᵀ C)
    return float((quadratic - 2 * linear + val.N) / val.N)


@dataclass
class RidgeChoice:
    """The head :func:`choose_ridge` picked: feature map ``feature``, ridge ``lam``, and every candidate's loss."""

    feature: int  # index into the candidate feature maps (0: the reference, e.g. AFL's prompt-free features)
    lam: float
    losses: Tensor  # (F, L) validation loss of feature map f with λ_l


def choose_ridge(full: list[AnalyticStatistics], val: list[AnalyticStatistics], lams: list[float]) -> RidgeChoice:
    """Pick a feature map and a λ by the validation loss of the heads fitted without the validation share.

    For every feature map f (its statistics over all the training data, ``full[f]``, and over the
    validation share carved from it, ``val[f]``) and every λ_l, the head of Eq. (9) fitted on the rest,
    W = (R_f − R_f^val + λ_l I)⁻¹ (C_f − C_f^val), is scored by :func:`validation_loss` on the share.
    Candidates are visited in order (f, then l) and a later one wins only if its loss is strictly
    lower: on a tie the earliest — (0, 0), the reference — is kept. The caller refits the winner on
    ``full`` (all the data).

    Args:
        full: F ≥ 1 statistics over all the training data, one per feature map.
        val: the matching F statistics of the validation share (a subset of the same samples, N ≥ 1).
        lams: L ≥ 1 ridge strengths λ ≥ 0, as :func:`solve_classifier` takes them.

    Returns:
        The :class:`RidgeChoice`.
    """
    if not full or len(full) != len(val):
        raise ValueError(f"need as many validation statistics as feature maps (≥ 1), got {len(full)} and {len(val)}")
    if not lams:
        raise ValueError("need at least one λ")
    losses = torch.empty(len(full), len(lams), dtype=torch.float64)
    best = (0, 0)
    for f, (a, v) in enumerate(zip(full, val)):
        if v.N > a.N:
            raise ValueError(f"feature map {f}: the validation share ({v.N}) is larger than the data ({a.N})")
        R, C = a.symmetric().R - v.symmetric().R, a.C - v.C  # the fit share's statistics
        for j, lam in enumerate(lams):
            losses[f, j] = validation_loss(solve_classifier(R, C, lam=float(lam)), v)
            if losses[f, j] < losses[best]:
                best = (f, j)
    return RidgeChoice(feature=best[0], lam=float(lams[best[1]]), losses=losses)
