"""FedCGS's Gaussian head and FedPFT's class mixtures against independent references (numpy, scipy,
scikit-learn), in float64 where the math is exact."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.mixture import GaussianMixture

from fl_lightning.analytic import AnalyticStatistics
from fl_lightning.feature_gaussians import (
    class_means,
    fit_class_gmms,
    gaussian_classifier,
    gaussian_head,
    gmm_numbers_per_class,
    sample_class_gmms,
    shared_covariance,
    train_linear_head,
)
from tests.outcomes import expect, outcome_seed


def _blobs(
    n_per_class: int, d: int, c: int, seed: int, spread: float = 3.0, shape: str = "correlated"
) -> tuple[np.ndarray, np.ndarray]:
    """Non-centred Gaussian class blobs sharing one covariance: a random correlated one (like real
    features), an axis-aligned one (``"axis"``) or the identity (``"isotropic"``)."""
    rng = np.random.default_rng(seed)
    centres = spread * rng.normal(size=(c, d)) + rng.normal(size=d)
    mix = {
        "correlated": np.eye(d) + 0.3 * rng.normal(size=(d, d)),
        "axis": np.diag(rng.uniform(0.5, 1.5, size=d)),
        "isotropic": np.eye(d),
    }[shape]
    H = np.concatenate([centres[j] + rng.normal(size=(n_per_class, d)) @ mix for j in range(c)])
    y = np.repeat(np.arange(c), n_per_class)
    perm = rng.permutation(len(y))
    return H[perm], y[perm]


def _federated_statistics(H: np.ndarray, y: np.ndarray, c: int, num_clients: int, seed: int):
    """Per-client (R, C, counts) on an uneven, label-sorted (non-IID) split, summed in a random order."""
    rng = np.random.default_rng(seed)
    order = np.argsort(y, kind="stable")
    cuts = np.sort(rng.choice(np.arange(1, len(y)), size=num_clients - 1, replace=False))
    clients = []
    for part in np.split(order, cuts):
        stats = AnalyticStatistics.zeros(H.shape[1], c)
        for start in range(0, len(part), 7):  # streamed, batch by batch
            idx = part[start : start + 7]
            stats.update(torch.from_numpy(H[idx]), torch.from_numpy(y[idx]))
        clients.append((stats, torch.from_numpy(np.bincount(y[part], minlength=c))))
    total = sum(clients[k][0] for k in rng.permutation(num_clients))
    counts = sum(clients[k][1] for k in rng.permutation(num_clients))
    return total.R, total.C, counts


def _fedcgs_numpy(H: np.ndarray, y: np.ndarray, c: int, gamma: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The official formula on pooled features: np.cov (total, ddof 1), class means, log priors."""
    M = np.stack([H[y == j].mean(axis=0) for j in range(c)])
    S = np.cov(H, rowvar=False)
    S = S + gamma * np.trace(S) / H.shape[1] * np.eye(H.shape[1])  # γ relative to the mean eigenvalue
    W = np.linalg.solve(S, M.T)
    b = -0.5 * np.einsum("jd,dj->j", M, W) + np.log(np.bincount(y, minlength=c) / len(y))
    return W, b


# -- FedCGS --------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_clients, seed", [(1, 0), (3, 1), (10, 2), (25, 3)])
@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_federated_fedcgs_head_equals_central_on_pooled_features(num_clients, seed, gamma):
    H, y = _blobs(60, 6, 4, seed)
    R, C, counts = _federated_statistics(H, y, 4, num_clients, seed)
    W, b = gaussian_head(R, C, counts, covariance="total", shrinkage=gamma)
    W_ref, b_ref = _fedcgs_numpy(H, y, 4, gamma)
    assert W.dtype == torch.float64 and W.shape == (6, 4) and b.shape == (4,)
    np.testing.assert_allclose(W.numpy(), W_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-8, atol=1e-10)


def test_moments_match_numpy():
    H, y = _blobs(50, 5, 3, seed=4)
    R, C, counts = _federated_statistics(H, y, 3, 4, seed=4)
    np.testing.assert_allclose(class_means(C, counts).numpy(), [H[y == j].mean(0) for j in range(3)], rtol=1e-10)
    np.testing.assert_allclose(shared_covariance(R, C, counts).numpy(), np.cov(H, rowvar=False), rtol=1e-9)
    within = sum((H[y == j] - H[y == j].mean(0)).T @ (H[y == j] - H[y == j].mean(0)) for j in range(3)) / len(y)
    np.testing.assert_allclose(shared_covariance(R, C, counts, covariance="within").numpy(), within, rtol=1e-9, atol=1e-12)


def test_gaussian_head_logits_are_the_bayes_posterior():
    """softmax(hW + b) equals Bayes' rule with N(μ^j, Σ) class densities (scipy) and priors N^j/N."""
    H, y = _blobs(40, 4, 3, seed=5, spread=1.0)
    R, C, counts = _federated_statistics(H, y, 3, 5, seed=5)
    W, b = gaussian_head(R, C, counts)
    M, S = class_means(C, counts).numpy(), shared_covariance(R, C, counts).numpy()
    log_joint = np.stack([multivariate_normal(M[j], S).logpdf(H) + np.log(counts[j].item() / len(y)) for j in range(3)], axis=1)
    posterior = np.exp(log_joint - log_joint.max(1, keepdims=True))
    posterior /= posterior.sum(1, keepdims=True)
    ours = torch.softmax(torch.from_numpy(H) @ W + b, dim=1).numpy()
    np.testing.assert_allclose(ours, posterior, rtol=1e-7, atol=1e-12)


def test_within_class_option_equals_sklearn_lda():
    H, y = _blobs(70, 5, 4, seed=6, spread=1.0)
    R, C, counts = _federated_statistics(H, y, 4, 6, seed=6)
    W, b = gaussian_head(R, C, counts, covariance="within")
    lda = LinearDiscriminantAnalysis(solver="lsqr").fit(H, y)
    np.testing.assert_allclose(W.numpy().T, lda.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(b.numpy(), lda.intercept_, rtol=1e-8, atol=1e-10)
    assert (np.argmax(H @ W.numpy() + b.numpy(), 1) == lda.predict(H)).all()


def test_absent_class_has_prior_zero_and_the_others_are_unchanged():
    H, y = _blobs(30, 4, 4, seed=7)
    keep = y != 2
    R, C, counts = _federated_statistics(H[keep], y[keep], 4, 3, seed=7)
    assert counts[2] == 0
    W, b = gaussian_head(R, C, counts)
    assert torch.equal(W[:, 2], torch.zeros(4, dtype=torch.float64)) and b[2] == -np.inf
    Hk, yk = H[keep], np.searchsorted([0, 1, 3], y[keep])  # the same data with 3 classes
    W3, b3 = _fedcgs_numpy(Hk, yk, 3)
    np.testing.assert_allclose(W.numpy()[:, [0, 1, 3]], W3, rtol=1e-8)
    np.testing.assert_allclose(b.numpy()[[0, 1, 3]], b3, rtol=1e-8)
    assert (torch.argmax(torch.from_numpy(H) @ W + b, 1) != 2).all()


def test_singular_covariance_without_shrinkage_is_finite_with_a_warning():
    H, y = _blobs(2, 8, 3, seed=8)  # 6 samples in 8 dimensions
    R, C, counts = _federated_statistics(H, y, 3, 2, seed=8)
    with pytest.warns(RuntimeWarning, match="singular"):
        W, b = gaussian_head(R, C, counts)
    assert torch.isfinite(W).all() and torch.isfinite(b).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gaussian_head(R, C, counts, shrinkage=1e-6)
    W_shrunk, _ = gaussian_head(R, C, counts, shrinkage=0.1)
    np.testing.assert_allclose(W_shrunk.numpy(), _fedcgs_numpy(H, y, 3, 0.1)[0], rtol=1e-8)


def test_features_in_a_hyperplane_warn_and_small_shrinkage_fixes_them():
    """LayerNorm-like features (each row centred) have a singular total covariance."""
    H, y = _blobs(50, 6, 3, seed=18)
    H = H - H.mean(axis=1, keepdims=True)
    R, C, counts = _federated_statistics(H, y, 3, 3, seed=18)
    with pytest.warns(RuntimeWarning) as caught:  # ours, and solve_classifier's rank-deficient lstsq
        gaussian_head(R, C, counts)
    assert any("LayerNorm" in str(w.message) for w in caught)
    W, b = gaussian_head(R, C, counts, shrinkage=1e-6)
    W_ref, b_ref = _fedcgs_numpy(H, y, 3, 1e-6)
    np.testing.assert_allclose(W.numpy(), W_ref, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-6)


@pytest.mark.parametrize("bad", [dict(covariance="pooled"), dict(shrinkage=-1.0), dict(shrinkage=float("nan"))])
def test_invalid_arguments_are_value_errors(bad):
    H, y = _blobs(10, 3, 2, seed=9)
    R, C, counts = _federated_statistics(H, y, 2, 2, seed=9)
    with pytest.raises(ValueError):
        gaussian_head(R, C, counts, **bad)


def test_mismatched_shapes_are_value_errors():
    R, C = torch.eye(3, dtype=torch.float64), torch.ones(3, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="counts"):
        shared_covariance(R, C, torch.ones(3))
    with pytest.raises(ValueError, match="C must"):
        shared_covariance(R, torch.ones(4, 2, dtype=torch.float64), torch.ones(2))
    with pytest.raises(ValueError, match="cov"):
        gaussian_classifier(torch.ones(2, 3), torch.eye(4), torch.ones(2))


# -- FedPFT --------------------------------------------------------------------------------------
@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_packed_parameters_are_sklearns_fit(covariance_type):
    H, y = _blobs(40, 5, 3, seed=10)
    packed = fit_class_gmms(
        torch.from_numpy(H),
        torch.from_numpy(y),
        num_classes=3,
        n_components=2,
        covariance_type=covariance_type,
        seed=3,
        wire_dtype=torch.float64,
    )
    assert packed["labels"].tolist() == [0, 1, 2] and packed["counts"].tolist() == [40, 40, 40]
    iu = np.triu_indices(5)
    for row, j in enumerate(packed["labels"].tolist()):
        ref = GaussianMixture(2, covariance_type=covariance_type, random_state=3).fit(H[y == j])
        np.testing.assert_allclose(packed["means"][row].numpy(), ref.means_, rtol=1e-12)
        np.testing.assert_allclose(packed["weights"][row].numpy(), ref.weights_, rtol=1e-12)
        cov = ref.covariances_[:, iu[0], iu[1]] if covariance_type == "full" else ref.covariances_
        np.testing.assert_allclose(packed["covariances"][row].numpy(), cov, rtol=1e-12)


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
@pytest.mark.parametrize("n_components", [1, 2, 4])
def test_upload_bytes_grow_with_components_times_classes(covariance_type, n_components):
    d, c = 6, 4
    H, y = _blobs(30, d, c, seed=11)
    for classes in (1, 2, 4):
        keep = y < classes
        packed = fit_class_gmms(
            torch.from_numpy(H[keep]),
            torch.from_numpy(y[keep]),
            num_classes=c,
            n_components=n_components,
            covariance_type=covariance_type,
            seed=0,
        )
        nbytes = sum(t.numel() * t.element_size() for t in packed.values())
        cov = {"full": d * (d + 1) // 2, "diag": d, "spherical": 1}[covariance_type]
        # float16 parameters (2 bytes) + an int64 label and count per class
        assert nbytes == classes * (n_components * (d + 1 + cov) * 2 + 16)
        assert gmm_numbers_per_class(d, n_components, covariance_type) == n_components * (d + 1 + cov)


def test_classes_with_at_most_k_samples_are_not_sent():
    H, y = _blobs(10, 3, 3, seed=12)
    keep = np.ones(len(y), bool)
    keep[np.flatnonzero(y == 1)[3:]] = False  # class 1: 3 samples
    packed = fit_class_gmms(
        torch.from_numpy(H[keep]), torch.from_numpy(y[keep]), num_classes=3, n_components=3, covariance_type="diag", seed=0
    )
    assert packed["labels"].tolist() == [0, 2]
    empty = fit_class_gmms(
        torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), num_classes=3, n_components=1, covariance_type="diag", seed=0
    )
    assert empty["means"].shape == (0, 1, 3) and empty["labels"].numel() == 0


def test_float16_overflow_is_a_value_error():
    H, y = _blobs(10, 3, 2, seed=13)
    with pytest.raises(ValueError, match="overflow"):
        fit_class_gmms(
            torch.from_numpy(H * 1e5), torch.from_numpy(y), num_classes=2, n_components=1, covariance_type="diag", seed=0
        )


def _known_mixture(covariance_type: str, d: int = 3) -> tuple[dict, list]:
    """Two classes with hand-set 2-component mixtures; returns the upload and dense (π, m, S) per class."""
    rng = np.random.default_rng(14)
    packed = {"labels": torch.tensor([1, 4]), "counts": torch.tensor([40000, 30000])}
    weights, means, covs, dense = [], [], [], []
    for _ in range(2):
        pi = np.array([0.3, 0.7])
        m = rng.normal(scale=3, size=(2, d))
        if covariance_type == "full":
            A = rng.normal(size=(2, d, d))
            S = A @ A.transpose(0, 2, 1) + 0.1 * np.eye(d)
            iu = np.triu_indices(d)
            packed_cov = S[:, iu[0], iu[1]]
        elif covariance_type == "diag":
            packed_cov = rng.uniform(0.2, 2.0, size=(2, d))
            S = np.stack([np.diag(v) for v in packed_cov])
        else:
            packed_cov = rng.uniform(0.2, 2.0, size=2)
            S = np.stack([v * np.eye(d) for v in packed_cov])
        weights.append(pi), means.append(m), covs.append(packed_cov), dense.append((pi, m, S))
    packed |= {
        "weights": torch.tensor(np.stack(weights)),
        "means": torch.tensor(np.stack(means)),
        "covariances": torch.tensor(np.stack(covs)),
    }
    return packed, dense


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_samples_have_the_mixture_moments(covariance_type):
    packed, dense = _known_mixture(covariance_type)
    X, y = sample_class_gmms(packed, covariance_type=covariance_type, generator=torch.Generator().manual_seed(0))
    assert X.dtype == torch.float32 and X.shape == (70000, 3)
    assert (y[:40000] == 1).all() and (y[40000:] == 4).all()
    for label, (pi, m, S) in zip((1, 4), dense):
        Xj = X[y == label].double().numpy()
        mean = pi @ m  # mixture mean and covariance, numpy reference
        cov = np.einsum("k,kij->ij", pi, S + np.einsum("ki,kj->kij", m, m)) - np.outer(mean, mean)
        se = np.sqrt(np.diag(cov) / len(Xj))
        assert np.all(np.abs(Xj.mean(0) - mean) < 5 * se)
        np.testing.assert_allclose(np.cov(Xj, rowvar=False), cov, atol=0.05 * np.abs(cov).max())


def test_sampling_is_seeded_and_classes_get_their_own_noise():
    packed, _ = _known_mixture("diag")
    packed = {
        **packed,
        "means": torch.zeros_like(packed["means"]),
        "covariances": torch.ones_like(packed["covariances"]),
        "counts": torch.tensor([50, 50]),
    }
    a, _ = sample_class_gmms(packed, covariance_type="diag", generator=torch.Generator().manual_seed(1))
    b, _ = sample_class_gmms(packed, covariance_type="diag", generator=torch.Generator().manual_seed(1))
    c, _ = sample_class_gmms(packed, covariance_type="diag", generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a[:50], a[50:])  # identical mixtures, different draws


def test_quantised_full_covariance_that_lost_definiteness_still_samples():
    packed, _ = _known_mixture("full")
    cov = packed["covariances"].clone()
    cov[0, 0] = torch.tensor([1.0, 2.0, 0.0, 1.0, 0.0, 1.0], dtype=cov.dtype)  # [[1,2,0],[2,1,0],[0,0,1]]: indefinite
    X, _ = sample_class_gmms({**packed, "covariances": cov}, covariance_type="full", generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(X).all()


def _accuracy(weight: torch.Tensor, bias: torch.Tensor, X: np.ndarray, y: np.ndarray) -> float:
    return float((torch.argmax(torch.from_numpy(X).float() @ weight.T + bias, 1).numpy() == y).mean())


@pytest.mark.outcome
@pytest.mark.parametrize(
    "covariance_type, n_components, shape",
    [("full", 1, "correlated"), ("full", 2, "correlated"), ("diag", 2, "axis"), ("spherical", 3, "isotropic")],
)
@pytest.mark.parametrize("seed", [15, 16])
def test_head_on_synthetic_features_is_within_3_points_of_head_on_real_features(covariance_type, n_components, shape, seed):
    """Separable toy features (4 classes, d = 8): the FedPFT head trained on features drawn from the
    uploaded (float16) mixtures is within 0.03 accuracy of the same head trained on the real ones,
    when the covariance type can represent the classes' shape. (A diagonal or spherical mixture on
    correlated features loses 3-10 points on these blobs: it cannot draw the correlation.)"""
    H, y = _blobs(300, 8, 4, seed=outcome_seed(seed), spread=1.2, shape=shape)
    Ht, yt = H[:800], y[:800]
    He, ye = H[800:], y[800:]
    packed = fit_class_gmms(
        torch.from_numpy(Ht),
        torch.from_numpy(yt),
        num_classes=4,
        n_components=n_components,
        covariance_type=covariance_type,
        seed=outcome_seed(),
    )
    Xs, ys = sample_class_gmms(packed, covariance_type=covariance_type, generator=torch.Generator().manual_seed(outcome_seed()))
    assert len(ys) == len(yt)
    settings = dict(num_classes=4, epochs=20, batch_size=64, optimizer="sgd", lr=0.01, momentum=0.9, seed=outcome_seed())
    real = _accuracy(*train_linear_head(torch.from_numpy(Ht).float(), torch.from_numpy(yt), **settings), He, ye)
    synthetic = _accuracy(*train_linear_head(Xs, ys, **settings), He, ye)
    expect("accuracy on real features (separable)", real, ">", 0.75)
    expect("accuracy on real features (not trivially)", real, "<", 1.0)
    expect("accuracy on synthetic features - on real features", synthetic - real, ">=", -0.03)


def test_linear_head_training_is_seeded():
    H, y = _blobs(20, 4, 3, seed=17)
    X, t = torch.from_numpy(H).float(), torch.from_numpy(y)
    kw = dict(num_classes=3, epochs=3, batch_size=8, optimizer="adamw", lr=1e-2)
    w1, b1 = train_linear_head(X, t, seed=5, **kw)
    w2, b2 = train_linear_head(X, t, seed=5, **kw)
    w3, _ = train_linear_head(X, t, seed=6, **kw)
    assert torch.equal(w1, w2) and torch.equal(b1, b2) and not torch.equal(w1, w3)
    assert w1.shape == (3, 4) and b1.shape == (3,)
