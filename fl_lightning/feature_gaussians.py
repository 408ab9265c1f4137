"""Class-conditional Gaussian models of frozen features: FedCGS's closed-form head and FedPFT's mixtures.

**FedCGS** (Guan et al., AAAI 2025, "Capture Global Feature Statistics for One-Shot Federated
Learning"; official code ``Yuqin-G/FedCGS``). Client i uploads, over its features h ∈ R^d,

    A_i^j = Σ_{y=j} h  (class sums),   N_i^j = #{y = j}  (class counts),   B_i = Σ h hᵀ  (second moment).

The server adds them up (A^j, N^j, B, N = Σ_j N^j) and forms

    μ^j = A^j / N^j                                 global class means
    μ   = Σ_j A^j / N                               global mean
    Σ   = (B − N μ μᵀ) / (N − 1)                    global (total) covariance, shared by all classes

and the Gaussian classifier with a shared covariance (a linear discriminant), the official code's
``eval``: with Σ̂ = Σ + γ·(tr Σ / d)·I (the official code adds an absolute γI, γ = 0 in every
published run; we scale γ by the mean eigenvalue so one value suits every backbone's feature scale),

    w_j = Σ̂⁻¹ μ^j,    b_j = −½ μ^jᵀ Σ̂⁻¹ μ^j + log(N^j / N),    logits_j(h) = w_jᵀ h + b_j.

Everything is a sum over clients, so the federated head equals the head computed centrally on the
pooled features, for any partition. The statistics are exactly FedOPAL's Eq. (7) pair
(R = Σ h hᵀ = B, C = Σ h yᵀ = [A^1 … A^c]) plus the class counts, so clients accumulate them with
:class:`fl_lightning.analytic.AnalyticStatistics`; this module takes (R, C, counts).

Note that FedCGS's Σ is the *total* covariance (about the global mean), not the within-class
covariance of textbook LDA. ``covariance="within"`` gives the latter — pooled about the class means
with divisor N, which is exactly scikit-learn's ``LinearDiscriminantAnalysis(solver="lsqr")``
— as an option beyond the paper.

**FedPFT** (Beitollahi et al., ICML 2024, "Parametric Feature Transfer: One-shot Federated Learning
with Foundation Models"). Each client fits, for every class j it holds, a Gaussian mixture
Σ_k π_jk N(m_jk, S_jk) with K components to its features of that class (scikit-learn's EM) and
uploads the parameters, quantised to float16 as in both public implementations. The server draws
from each mixture as many synthetic features as the client had samples of that class and trains a
linear head on them with cross-entropy. Per class the upload holds K·d means, K weights and the
covariances: K·d(d+1)/2 (``full``, upper triangle), K·d (``diag``) or K (``spherical``) numbers — so
it grows linearly with components × classes (FedPFT's communication analysis).

Pure functions of tensors (float64 for the statistics); no configs, devices, files or logging.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from fl_lightning.analytic import solve_classifier

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "COVARIANCES",
    "COVARIANCE_TYPES",
    "class_means",
    "shared_covariance",
    "gaussian_classifier",
    "gaussian_head",
    "gmm_numbers_per_class",
    "fit_class_gmms",
    "sample_class_gmms",
    "train_linear_head",
]

COVARIANCES = ("total", "within")
COVARIANCE_TYPES = ("full", "diag", "spherical")


# -- FedCGS --------------------------------------------------------------------------------------
def _check_moments(R: Tensor, C: Tensor, counts: Tensor) -> None:
    d = R.shape[0]
    if R.ndim != 2 or R.shape != (d, d):
        raise ValueError(f"R must be a square (d, d) matrix, got {tuple(R.shape)}")
    if C.ndim != 2 or C.shape[0] != d:
        raise ValueError(f"C must be (d, c) = ({d}, c), got {tuple(C.shape)}")
    if counts.shape != (C.shape[1],):
        raise ValueError(f"counts must have shape ({C.shape[1]},), got {tuple(counts.shape)}")
    if bool((counts < 0).any()):
        raise ValueError("class counts must be >= 0")


def class_means(C: Tensor, counts: Tensor) -> Tensor:
    """μ^j = A^j / N^j, shape (c, d); classes with no sample get a zero mean.

    Args:
        C: class sums as columns, (d, c) (``AnalyticStatistics.C``).
        counts: N^j, shape (c,).
    """
    if C.ndim != 2 or counts.shape != (C.shape[1],):
        raise ValueError(f"C must be (d, c) and counts (c,), got {tuple(C.shape)} and {tuple(counts.shape)}")
    n = counts.to(C.dtype)
    return (C / n.clamp(min=1)).T  # (c, d); a zero column stays zero


def shared_covariance(R: Tensor, C: Tensor, counts: Tensor, *, covariance: str = "total") -> Tensor:
    """The covariance shared by all classes, from the summed statistics.

    * ``"total"`` (FedCGS): Σ = (B − N μ μᵀ) / (N − 1), μ = Σ_j A^j / N — ``np.cov`` of the pooled
      features.
    * ``"within"`` (textbook LDA, beyond the paper): Σ_w = (B − Σ_j N^j μ^j μ^jᵀ) / N, the pooled
      class-centred scatter with scikit-learn LDA's divisor N.

    Args:
        R: B = Σ h hᵀ, (d, d).  C: class sums (d, c).  counts: N^j (c,).
        covariance: ``"total"`` or ``"within"``.

    Returns:
        (d, d), symmetric, in R's dtype.
    """
    _check_moments(R, C, counts)
    if covariance not in COVARIANCES:
        raise ValueError(f"covariance must be one of {COVARIANCES}, got {covariance!r}")
    N = float(counts.sum())
    if covariance == "total":
        if N < 2:
            raise ValueError(f"the total covariance needs at least 2 samples, got {N:g}")
        s = C.sum(dim=1)  # (d,) Σ h
        S = (R - torch.outer(s, s) / N) / (N - 1)  # N μ μᵀ = s sᵀ / N
    else:
        if N < 1:
            raise ValueError("the within-class covariance needs at least 1 sample")
        M = class_means(C, counts)  # (c, d)
        S = (R - (M.T * counts.to(R.dtype)) @ M) / N  # Σ_j N^j μ^j μ^jᵀ = Mᵀ diag(N) M
    return 0.5 * (S + S.T)


def gaussian_classifier(means: Tensor, cov: Tensor, counts: Tensor, *, shrinkage: float = 0.0) -> tuple[Tensor, Tensor]:
    """Gaussian class-conditionals with a shared covariance → a linear head (FedCGS, official ``eval``).

        W = Σ̂⁻¹ Mᵀ  (d, c),   b_j = −½ μ^jᵀ Σ̂⁻¹ μ^j + log(N^j / N),   Σ̂ = Σ + γ (tr Σ / d) I.

    Σ̂ is solved, never inverted (:func:`fl_lightning.analytic.solve_classifier`: Cholesky for γ > 0;
    for γ = 0 the SVD least-squares solution, the minimum-norm one when Σ is singular). Features
    taken right after a LayerNorm (a ViT's CLS token without projection) lie in a hyperplane, so
    their Σ is singular and W is then dominated by rounding noise: a ``RuntimeWarning`` says so when
    λ_min(Σ̂) < 1e-10 λ_max(Σ̂); a small γ (1e-6) removes the problem.
    A class with N^j = 0 has prior 0: its column of W is 0 and its bias −inf (the Bayes rule never
    predicts it), where the official code would divide 0 by 0.

    Args:
        means: μ^j, (c, d).  cov: Σ, (d, d).  counts: N^j, (c,).
        shrinkage: γ ≥ 0, relative to the mean eigenvalue tr Σ / d (the official code: an absolute
            γ, always 0).

    Returns:
        ``(W, b)``: W (d, c), b (c,); logits = h W + b.
    """
    c, d = means.shape
    if cov.shape != (d, d) or counts.shape != (c,):
        raise ValueError(f"cov must be ({d}, {d}) and counts ({c},), got {tuple(cov.shape)} and {tuple(counts.shape)}")
    if not (shrinkage >= 0 and math.isfinite(shrinkage)):
        raise ValueError(f"shrinkage must be a finite number >= 0, got {shrinkage}")
    present = counts > 0
    if not bool(present.any()):
        raise ValueError("no class has a sample")
    lam = shrinkage * float(torch.diagonal(cov).sum()) / d
    evals = torch.linalg.eigvalsh(cov)  # ascending
    if float(evals[0]) + lam < 1e-10 * (float(evals[-1]) + lam):
        warnings.warn(
            f"the shared covariance is (nearly) singular (eigenvalues {float(evals[0]):.3g} .. "
            f"{float(evals[-1]):.3g}); the head follows rounding noise along its null directions. "
            "Features after a LayerNorm lie in a hyperplane: use a small shrinkage (e.g. 1e-6)",
            RuntimeWarning,
            stacklevel=2,
        )
    W = solve_classifier(cov, means.T, lam=lam)  # (d, c) = Σ̂⁻¹ [μ^1 … μ^c]
    W[:, ~present] = 0
    n = counts.to(means.dtype)
    log_prior = torch.where(present, torch.log(n / n.sum()), torch.full_like(n, -math.inf))
    b = -0.5 * (means * W.T).sum(dim=1) + log_prior  # μ^jᵀ Σ̂⁻¹ μ^j, row by row
    return W, b


def gaussian_head(
    R: Tensor, C: Tensor, counts: Tensor, *, covariance: str = "total", shrinkage: float = 0.0
) -> tuple[Tensor, Tensor]:
    """FedCGS's server step from the summed statistics: means, shared covariance, then (W, b)."""
    cov = shared_covariance(R, C, counts, covariance=covariance)
    return gaussian_classifier(class_means(C, counts), cov, counts, shrinkage=shrinkage)


# -- FedPFT --------------------------------------------------------------------------------------
def _covariance_numbers(d: int, covariance_type: str) -> int:
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
    return {"full": d * (d + 1) // 2, "diag": d, "spherical": 1}[covariance_type]


def gmm_numbers_per_class(d: int, n_components: int, covariance_type: str) -> int:
    """Floating-point numbers one class's mixture uploads: K(d + 1 + cov), cov = d(d+1)/2, d or 1."""
    return n_components * (d + 1 + _covariance_numbers(d, covariance_type))


def fit_class_gmms(
    features: Tensor,
    labels: Tensor,
    *,
    num_classes: int,
    n_components: int,
    covariance_type: str,
    seed: int,
    tol: float = 1e-3,
    max_iter: int = 100,
    reg_covar: float = 1e-6,
    wire_dtype: torch.dtype = torch.float16,
) -> dict[str, Tensor]:
    """Fit one ``sklearn.mixture.GaussianMixture`` per class and pack the parameters for upload.

    As in both public FedPFT implementations, a class is fitted only when the client holds more than
    K samples of it (EM needs at least K); the others are not sent.

    Args:
        features: (n, d) features of one client.  labels: (n,) class indices in [0, num_classes).
        num_classes: c.  n_components: K ≥ 1.  covariance_type: ``full``, ``diag`` or ``spherical``.
        seed: ``random_state`` of the k-means initialisation.
        tol, max_iter, reg_covar: EM settings, passed to scikit-learn.
        wire_dtype: dtype of the uploaded parameters (float16 as the paper; float32/float64 to avoid
            quantisation).

    Returns:
        The upload, m = number of fitted classes:
        ``labels`` (m,) int64, ``counts`` (m,) int64 samples per class, ``weights`` (m, K),
        ``means`` (m, K, d), ``covariances`` (m, K, d(d+1)/2) upper triangles row by row for
        ``full``, (m, K, d) for ``diag``, (m, K) for ``spherical``.
    """
    from sklearn.mixture import GaussianMixture  # heavy import, only where it is used

    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"features must be (n, d) and labels (n,), got {tuple(features.shape)} and {tuple(labels.shape)}")
    if n_components < 1:
        raise ValueError(f"n_components must be >= 1, got {n_components}")
    d = int(features.shape[1])
    _covariance_numbers(d, covariance_type)
    X = features.detach().cpu().double().numpy()
    y = labels.detach().cpu().long().numpy()
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    iu = np.triu_indices(d)
    out: dict[str, list] = {"labels": [], "counts": [], "weights": [], "means": [], "covariances": []}
    for j in range(num_classes):
        Xj = X[y == j]
        if len(Xj) <= n_components:
            continue
        gmm = GaussianMixture(
            n_components=n_components,
            covariance_type=covariance_type,
            tol=tol,
            max_iter=max_iter,
            reg_covar=reg_covar,
            random_state=seed,
        ).fit(Xj)
        cov = gmm.covariances_
        out["labels"].append(j)
        out["counts"].append(len(Xj))
        out["weights"].append(gmm.weights_)
        out["means"].append(gmm.means_)
        out["covariances"].append(cov[:, iu[0], iu[1]] if covariance_type == "full" else cov)
    m = len(out["labels"])
    cov_shape = {"full": (n_components, d * (d + 1) // 2), "diag": (n_components, d), "spherical": (n_components,)}
    packed = {
        "labels": torch.tensor(out["labels"], dtype=torch.int64),
        "counts": torch.tensor(out["counts"], dtype=torch.int64),
        "weights": torch.from_numpy(np.asarray(out["weights"]).reshape(m, n_components)).to(wire_dtype),
        "means": torch.from_numpy(np.asarray(out["means"]).reshape(m, n_components, d)).to(wire_dtype),
        "covariances": torch.from_numpy(np.asarray(out["covariances"]).reshape(m, *cov_shape[covariance_type])).to(wire_dtype),
    }
    for name in ("weights", "means", "covariances"):
        if not bool(torch.isfinite(packed[name]).all()):
            raise ValueError(f"GMM {name} overflow {wire_dtype}; upload them in a wider dtype")
    return packed


def _component_factors(cov: Tensor, d: int, covariance_type: str) -> Tensor:
    """A (K, d, d) factor A with A Aᵀ = S for each component (PSD-clamped: quantised covariances
    may lose definiteness), or a (K, d) standard deviation for diagonal/spherical ones."""
    if covariance_type == "spherical":
        return cov.clamp(min=0).sqrt()[:, None].expand(-1, d)
    if covariance_type == "diag":
        return cov.clamp(min=0).sqrt()
    K = cov.shape[0]
    i, j = torch.triu_indices(d, d)
    S = torch.zeros(K, d, d, dtype=cov.dtype)
    S[:, i, j] = cov
    S[:, j, i] = cov
    evals, evecs = torch.linalg.eigh(S)
    return evecs * evals.clamp(min=0).sqrt()[:, None, :]


def sample_class_gmms(packed: Mapping[str, Tensor], *, covariance_type: str, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Draw ``counts[j]`` synthetic features from each uploaded class mixture (FedPFT's server).

    Component k is chosen with probability π_k (weights renormalised after quantisation), then
    x = m_k + A_k ε with ε ~ N(0, I) and A_k A_kᵀ = S_k. Computed in float64 from one seeded generator,
    so every class gets its own noise (the public code reseeds each class's sampler identically).

    Args:
        packed: one client's upload from :func:`fit_class_gmms`.
        covariance_type: the type it was fitted with.
        generator: a seeded CPU ``torch.Generator``.

    Returns:
        ``(features, labels)``: (Σ counts, d) float32 and (Σ counts,) int64.
    """
    means = packed["means"].double()  # (m, K, d)
    m, K, d = means.shape
    feats, labs = [], []
    for row in range(m):
        n = int(packed["counts"][row])
        w = packed["weights"][row].double().clamp(min=0)
        comp = torch.multinomial(w / w.sum(), n, replacement=True, generator=generator)  # (n,)
        A = _component_factors(packed["covariances"][row].double(), d, covariance_type)
        eps = torch.randn(n, d, dtype=torch.float64, generator=generator)
        if covariance_type == "full":
            x = means[row, comp] + torch.einsum("nij,nj->ni", A[comp], eps)
        else:
            x = means[row, comp] + A[comp] * eps
        feats.append(x)
        labs.append(torch.full((n,), int(packed["labels"][row]), dtype=torch.int64))
    if not feats:
        return torch.zeros(0, d), torch.zeros(0, dtype=torch.int64)
    return torch.cat(feats).float(), torch.cat(labs)


def train_linear_head(
    features: Tensor,
    labels: Tensor,
    *,
    num_classes: int,
    epochs: int,
    batch_size: int,
    optimizer: str,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Train ``nn.Linear(d, c)`` with cross-entropy on (features, labels): FedPFT's server head.

    PyTorch's default initialisation and minibatch shuffling, both from ``seed``; runs where the
    features are.

    Returns:
        ``(weight, bias)``: (c, d) and (c,), float32; logits = h weightᵀ + bias.
    """
    from fl_lightning.modules.optim import make_optimizer

    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"features must be (n, d) and labels (n,), got {tuple(features.shape)} and {tuple(labels.shape)}")
    if features.shape[0] == 0:
        raise ValueError("no features to train the head on")
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = torch.nn.Linear(features.shape[1], num_classes)
    head = head.to(features.device)
    opt = make_optimizer(head.parameters(), name=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay)
    x, y = features.float(), labels.long()
    n = x.shape[0]
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).to(x.device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            loss = F.cross_entropy(head(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return head.weight.detach().clone(), head.bias.detach().clone()
