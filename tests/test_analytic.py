"""Analytic classifier (FedOPAL Eq. (7)-(9)) against an independent numpy float64 reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fl_lightning.analytic import AnalyticStatistics, logits, regularization, solve_classifier


def _data(n: int, d: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    H = rng.normal(size=(n, d)) + rng.normal(size=d)  # non-centred, like real features
    y = rng.integers(0, c, size=n)
    return H, y


def _ridge_numpy(H: np.ndarray, y: np.ndarray, c: int, lam: float) -> np.ndarray:
    Y = np.eye(c)[y]
    return np.linalg.solve(H.T @ H + lam * np.eye(H.shape[1]), H.T @ Y)


@pytest.mark.parametrize("num_clients", [1, 3, 7])
@pytest.mark.parametrize("lam", [1e-3, 1.0, 50.0])
def test_federated_solution_equals_centralised_ridge(num_clients, lam):
    n, d, c = 300, 12, 5
    H, y = _data(n, d, c, seed=num_clients)
    rng = np.random.default_rng(100 + num_clients)
    # an uneven, non-IID split: sort by label, cut at random places
    order = np.argsort(y, kind="stable")
    cuts = np.sort(rng.choice(np.arange(1, n), size=num_clients - 1, replace=False))
    parts = np.split(order, cuts)
    clients = [AnalyticStatistics.zeros(d, c).update(torch.from_numpy(H[p]), torch.from_numpy(y[p])) for p in parts]
    expected = _ridge_numpy(H, y, c, lam)
    for permutation in (range(num_clients), reversed(range(num_clients)), rng.permutation(num_clients)):
        total = sum(clients[k] for k in permutation)
        assert total.N == n
        W = solve_classifier(total.R, total.C, lam=lam)
        assert W.dtype == torch.float64 and W.shape == (d, c)
        np.testing.assert_allclose(W.numpy(), expected, rtol=1e-8, atol=1e-12)


def test_singular_R_with_zero_lambda_gives_least_norm_solution():
    n, d, c = 6, 10, 3  # fewer samples than dimensions: R has rank 6 < 10
    H, y = _data(n, d, c, seed=0)
    stats = AnalyticStatistics.zeros(d, c).update(torch.from_numpy(H), torch.from_numpy(y))
    with pytest.warns(RuntimeWarning, match="singular"):
        W = solve_classifier(stats.R, stats.C, lam=0.0)
    assert torch.isfinite(W).all()
    R, C = H.T @ H, H.T @ np.eye(c)[y]
    expected = np.linalg.lstsq(R, C, rcond=None)[0]
    np.testing.assert_allclose(W.numpy(), expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(W.numpy(), np.linalg.pinv(R) @ C, rtol=1e-6, atol=1e-9)


def test_zero_lambda_full_rank_is_exact_least_squares_without_warning():
    H, y = _data(200, 8, 4, seed=1)
    stats = AnalyticStatistics.zeros(8, 4).update(torch.from_numpy(H), torch.from_numpy(y))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        W = solve_classifier(stats.R, stats.C, lam=0.0)
    np.testing.assert_allclose(W.numpy(), _ridge_numpy(H, y, 4, 0.0), rtol=1e-8)


def test_non_psd_R_falls_back_without_nan():
    R = torch.diag(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))  # indefinite: Cholesky fails
    C = torch.eye(3, 2, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="not positive definite"):
        W = solve_classifier(R, C, lam=0.5)
    np.testing.assert_allclose(W.numpy(), np.linalg.solve(R.numpy() + 0.5 * np.eye(3), C.numpy()), rtol=1e-12)


def test_streaming_update_equals_one_shot():
    H, y = _data(97, 6, 4, seed=2)
    Y = np.eye(4)[y]
    stats = AnalyticStatistics.zeros(6, 4)
    for start in range(0, 97, 10):
        stats.update(torch.from_numpy(H[start : start + 10]), torch.from_numpy(Y[start : start + 10]))  # one-hot labels
    np.testing.assert_allclose(stats.R.numpy(), H.T @ H, rtol=1e-12)
    np.testing.assert_allclose(stats.C.numpy(), H.T @ Y, rtol=1e-12)
    assert stats.N == 97


def test_float32_features_are_accumulated_in_float64():
    H, y = _data(50, 5, 3, seed=3)
    stats = AnalyticStatistics.zeros(5, 3).update(torch.from_numpy(H).float(), torch.from_numpy(y))
    H32 = H.astype(np.float32).astype(np.float64)
    assert stats.R.dtype == torch.float64
    np.testing.assert_allclose(stats.R.numpy(), H32.T @ H32, rtol=1e-12)


def test_upper_triangle_round_trip():
    H, y = _data(40, 7, 3, seed=4)
    stats = AnalyticStatistics.zeros(7, 3).update(torch.from_numpy(H), torch.from_numpy(y))
    np.testing.assert_allclose(stats.R.numpy(), stats.R.numpy().T, rtol=1e-14)  # symmetric up to rounding
    vec = stats.upper_triangle()
    assert vec.shape == (7 * 8 // 2,)
    np.testing.assert_allclose(vec.numpy(), (H.T @ H)[np.triu_indices(7)], rtol=1e-12)  # row-major upper entries
    back = AnalyticStatistics.from_upper(vec, stats.C, stats.N)
    assert torch.equal(back.R, back.R.T)  # the server's R is exactly symmetric
    assert torch.equal(back.R.triu(), stats.R.triu()) and torch.equal(back.C, stats.C) and back.N == stats.N
    assert torch.equal(stats.symmetric().R, back.R)
    with pytest.raises(ValueError):
        AnalyticStatistics.from_upper(torch.zeros(5), stats.C, 1)


def test_shape_checks():
    stats = AnalyticStatistics.zeros(4, 3)
    with pytest.raises(ValueError):
        stats.update(torch.zeros(2, 5), torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        stats.update(torch.zeros(2, 4), torch.zeros(2, 2))
    with pytest.raises(ValueError):
        stats + AnalyticStatistics.zeros(5, 3)
    with pytest.raises(ValueError):
        solve_classifier(stats.R, stats.C, lam=-1.0)


@pytest.mark.parametrize(
    "convention,remove,expected",
    [
        ("once", False, 0.1),
        ("per_client", False, 0.5),
        ("per_client", True, 0.0),
        ("once", True, 0.0),
    ],
)
def test_regularization_conventions(convention, remove, expected):
    assert regularization(0.1, num_clients=5, convention=convention, remove=remove) == pytest.approx(expected)


def test_per_client_convention_equals_each_client_adding_gamma():
    H, y = _data(120, 6, 3, seed=5)
    gamma, K = 0.3, 4
    parts = np.array_split(np.arange(120), K)
    # AFL's clients regularise their own R_k + γI; the sum then carries Kγ I
    R_reg = sum(H[p].T @ H[p] + gamma * np.eye(6) for p in parts)
    expected = np.linalg.solve(R_reg, H.T @ np.eye(3)[y])
    stats = AnalyticStatistics.zeros(6, 3).update(torch.from_numpy(H), torch.from_numpy(y))
    lam = regularization(gamma, num_clients=K, convention="per_client")
    np.testing.assert_allclose(solve_classifier(stats.R, stats.C, lam=lam).numpy(), expected, rtol=1e-10)
    with pytest.raises(ValueError):
        regularization(0.1, num_clients=2, convention="twice")


def test_logits():
    h = torch.randn(4, 3)
    W = torch.randn(3, 2, dtype=torch.float64)
    np.testing.assert_allclose(logits(h, W).numpy(), h.double().numpy() @ W.numpy(), rtol=1e-12)


# -- validation_loss / choose_ridge (FedOPAL+'s federated validation) -----------------------------


def _stats(H: np.ndarray, y: np.ndarray, c: int) -> AnalyticStatistics:
    return AnalyticStatistics.zeros(H.shape[1], c).update(torch.from_numpy(H), torch.from_numpy(y))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_validation_loss_is_the_mean_squared_error_of_the_held_out_samples(seed):
    from fl_lightning.analytic import validation_loss

    n, d, c = 40, 6, 4
    H, y = _data(n, d, c, seed)
    W = np.random.default_rng(seed + 10).normal(size=(d, c))
    expected = ((H @ W - np.eye(c)[y]) ** 2).sum() / n  # brute force over the samples
    assert validation_loss(torch.from_numpy(W), _stats(H, y, c)) == pytest.approx(expected, rel=1e-10)


def _two_feature_maps(seed: int, good: int):
    """Feature map ``good`` separates the labels (one-hot + small noise); the other is pure noise."""
    rng = np.random.default_rng(seed)
    n, d, c = 200, 8, 4
    y = rng.integers(0, c, size=n)
    informative = np.eye(c, d)[y] * 3 + 0.1 * rng.normal(size=(n, d))
    noise = rng.normal(size=(n, d))
    maps = [informative, noise] if good == 0 else [noise, informative]
    held = rng.permutation(n)[:40]
    return maps, y, held, c


@pytest.mark.parametrize("good", [0, 1])
def test_choose_ridge_picks_the_feature_map_that_predicts_the_held_out_share(good):
    from fl_lightning.analytic import choose_ridge, validation_loss

    maps, y, held, c = _two_feature_maps(seed=good, good=good)
    full = [_stats(H, y, c) for H in maps]
    val = [_stats(H[held], y[held], c) for H in maps]
    lams = [1e-6, 1.0]
    choice = choose_ridge(full, val, lams)
    assert choice.feature == good
    # every loss is that of the head fitted on the rest only (numpy reference), scored on the share
    rest = np.setdiff1d(np.arange(len(y)), held)
    for f, H in enumerate(maps):
        for j, lam in enumerate(lams):
            W = _ridge_numpy(H[rest], y[rest], c, lam)
            ref = validation_loss(torch.from_numpy(W), val[f])
            assert float(choice.losses[f, j]) == pytest.approx(ref, rel=1e-7)
    f, j = np.unravel_index(int(torch.argmin(choice.losses)), tuple(choice.losses.shape))
    assert (choice.feature, choice.lam) == (f, lams[j])


def test_choose_ridge_keeps_the_reference_on_a_tie():
    """Identical candidates: the first (AFL's head at the configured λ) is kept, never a later copy."""
    from fl_lightning.analytic import choose_ridge

    maps, y, held, c = _two_feature_maps(seed=3, good=0)
    full = [_stats(maps[0], y, c)] * 3
    val = [_stats(maps[0][held], y[held], c)] * 3
    choice = choose_ridge(full, val, [0.5, 0.5])
    assert (choice.feature, choice.lam) == (0, 0.5)


@pytest.mark.parametrize("full, val, lams", [([], [], [1.0]), ("one", "two", [1.0]), ("one", "one", [])])
def test_choose_ridge_rejects_bad_input(full, val, lams):
    from fl_lightning.analytic import choose_ridge

    H, y = _data(10, 3, 2, 0)
    s = {"one": [_stats(H, y, 2)], "two": [_stats(H, y, 2)] * 2}
    with pytest.raises(ValueError):
        choose_ridge(s.get(full, full) if isinstance(full, str) else full, s.get(val, val) if isinstance(val, str) else val, lams)
