"""Partition invariants and statistics, checked against independent float64 references."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from fl_lightning.data.partition import (
    client_class_counts,
    dirichlet_partition,
    iid_partition,
    shard_partition,
)
from fl_lightning.errors import ConfigError, UsageError


def _labels(n: int, num_classes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_classes, n)


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "each client's indices are sorted and distinct"
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


@pytest.mark.parametrize(
    "num_clients, alpha, balance",
    [(1, 0.5, False), (7, 0.1, False), (20, 1.0, False), (20, 0.3, True), (50, 100.0, False)],
)
def test_dirichlet_is_an_exact_cover(num_clients: int, alpha: float, balance: bool) -> None:
    labels = _labels(3000, 10)
    parts = dirichlet_partition(labels, num_clients, alpha, seed=3, balance=balance)
    assert len(parts) == num_clients
    _assert_exact_cover(parts, labels.size)
    assert min(len(p) for p in parts) >= 1  # default min_samples


def test_dirichlet_depends_only_on_its_arguments() -> None:
    labels = _labels(2000, 10)
    np.random.seed(1)
    torch.manual_seed(1)
    state = np.random.get_state()[1].copy()
    a = dirichlet_partition(labels, 12, 0.5, seed=7)
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # global RNG untouched
    np.random.seed(999)
    torch.manual_seed(999)
    np.random.rand(10)
    b = dirichlet_partition(labels.copy(), 12, 0.5, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = dirichlet_partition(labels, 12, 0.5, seed=8)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def _classes_for_90_percent(counts: np.ndarray) -> np.ndarray:
    """Per client: how many of its largest classes are needed to hold > 90% of its samples."""
    ordered = -np.sort(-counts, axis=1).astype(np.float64)
    share = np.cumsum(ordered, axis=1) / ordered.sum(axis=1, keepdims=True)
    return (share <= 0.9).sum(axis=1) + 1


def test_small_alpha_gives_few_classes_per_client() -> None:
    labels = _labels(4000, 10)
    parts = dirichlet_partition(labels, 10, 0.01, seed=0)
    counts = client_class_counts(labels, parts, 10)
    assert np.median(_classes_for_90_percent(counts)) <= 2
    # Strong dependence between client and class: the contingency test rejects independence.
    assert chi2_contingency(counts[counts.sum(axis=1) > 0][:, counts.sum(axis=0) > 0])[1] < 1e-10


@pytest.mark.parametrize("alpha", [math.inf, 1e5])
def test_large_alpha_is_near_iid(alpha: float) -> None:
    labels = _labels(6000, 10)
    parts = dirichlet_partition(labels, 10, alpha, seed=0)
    counts = client_class_counts(labels, parts, 10)
    # Client and class independent: chi-square test of the (K, C) table does not reject.
    assert chi2_contingency(counts)[1] > 1e-3
    assert np.median(_classes_for_90_percent(counts)) >= 9


def test_alpha_inf_is_the_iid_partition() -> None:
    labels = _labels(1001, 5)
    a = dirichlet_partition(labels, 10, math.inf, seed=4)
    b = iid_partition(1001, 10, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_dirichlet_shares_match_the_dirichlet_moments() -> None:
    """One class of n samples over K clients: client 0's share q ~ Beta(alpha, (K-1) alpha), so
    E[q] = 1/K and Var[q] = (1/K)(1 - 1/K) / (K alpha + 1) (float64 reference)."""
    k, alpha, n, draws = 4, 0.5, 20000, 400
    labels = np.zeros(n, dtype=np.int64)
    shares = np.array(
        [len(dirichlet_partition(labels, k, alpha, seed=s, min_samples=0)[0]) / n
         for s in range(draws)]
    )
    mean_ref = 1.0 / k
    var_ref = (1.0 / k) * (1.0 - 1.0 / k) / (k * alpha + 1.0)
    assert abs(shares.mean() - mean_ref) < 4 * math.sqrt(var_ref / draws)
    assert abs(shares.var() / var_ref - 1.0) < 0.25


def test_min_samples_is_met() -> None:
    labels = _labels(2000, 10)
    parts = dirichlet_partition(labels, 40, 0.2, seed=1, min_samples=10)
    assert min(len(p) for p in parts) >= 10
    _assert_exact_cover(parts, labels.size)


def test_balance_evens_client_sizes() -> None:
    # Many classes give the self-balancing rule many chances to steer samples to small clients.
    labels = _labels(10000, 100)

    def spread(balance: bool) -> float:
        cvs = []
        for seed in range(5):
            sizes = [len(p) for p in dirichlet_partition(
                labels, 10, 0.1, seed=seed, min_samples=0, balance=balance)]
            cvs.append(np.std(sizes) / np.mean(sizes))
        return float(np.mean(cvs))

    assert spread(True) < 0.5 * spread(False)


@pytest.mark.parametrize("min_samples", [8, 50])
def test_impossible_minimum_fails_fast_with_advice(min_samples: int) -> None:
    labels = _labels(5000, 10)
    start = time.monotonic()
    with pytest.raises(UsageError) as info:
        dirichlet_partition(labels, 500, 0.3, seed=0, min_samples=min_samples)
    assert time.monotonic() - start < 3.0
    message = str(info.value)
    assert "\n" not in message
    for token in ("500 clients", f">= {min_samples}", "alpha=0.3", "partition.min_samples",
                  "raise partition.alpha", "fewer clients"):
        assert token in message


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(num_clients=5, alpha=0.0), "partition.alpha"),
        (dict(num_clients=5, alpha=-1.0), "partition.alpha"),
        (dict(num_clients=5, alpha=float("nan")), "partition.alpha"),
        (dict(num_clients=0, alpha=1.0), "partition.num_clients"),
        (dict(num_clients=101, alpha=1.0), "partition.num_clients"),
        (dict(num_clients=5, alpha=1.0, min_samples=-1), "partition.min_samples"),
    ],
)
def test_dirichlet_rejects_bad_arguments(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        dirichlet_partition(_labels(100, 3), seed=0, **kwargs)
    assert info.value.key == key


@pytest.mark.parametrize("n, k", [(10, 3), (1000, 7), (5, 5), (64, 1)])
def test_iid_sizes_differ_by_at_most_one(n: int, k: int) -> None:
    parts = iid_partition(n, k, seed=2)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    _assert_exact_cover(parts, n)


def test_shards_give_each_client_few_classes() -> None:
    # 10 classes x 100 samples, 10 clients x 2 shards of 50: every shard is inside one class.
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 100))
    parts = shard_partition(labels, 10, 2, seed=5)
    _assert_exact_cover(parts, labels.size)
    assert all(len(p) == 100 for p in parts)
    counts = client_class_counts(labels, parts, 10)
    assert np.all((counts > 0).sum(axis=1) <= 2)
    again = shard_partition(labels, 10, 2, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(parts, again))
    with pytest.raises(ConfigError):
        shard_partition(labels, 10, 101, seed=0)


def test_client_class_counts_matches_brute_force() -> None:
    labels = _labels(500, 6)
    parts = dirichlet_partition(labels, 8, 0.5, seed=0)
    counts = client_class_counts(labels, parts, 6)
    assert counts.shape == (8, 6)
    for k, p in enumerate(parts):
        for c in range(6):
            assert counts[k, c] == sum(1 for i in p if labels[i] == c)
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels, minlength=6))
