"""Partition invariants and statistics, checked against independent float64 references."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from fl_lightning.data.partition import (
    PartitionArgumentError,
    _draw_counts,
    _draw_proportions,
    client_class_counts,
    dirichlet_partition,
    iid_partition,
    read_partition_json,
    shard_partition,
    write_partition_json,
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
    shares = np.array([len(dirichlet_partition(labels, k, alpha, seed=s, min_samples=0)[0]) / n for s in range(draws)])
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
            sizes = [len(p) for p in dirichlet_partition(labels, 10, 0.1, seed=seed, min_samples=0, balance=balance)]
            cvs.append(np.std(sizes) / np.mean(sizes))
        return float(np.mean(cvs))

    assert spread(True) < 0.5 * spread(False)


@pytest.mark.parametrize("min_samples, draws", [(8, 1001), (50, 0)])
def test_impossible_minimum_fails_fast_with_advice(min_samples: int, draws: int, monkeypatch) -> None:
    """It stops after max_redraws + 1 draws (default 1000 + 1), or before any draw when no partition
    can exist (50 x 500 > 5000 samples). Counted, not timed: a wall-clock bound fails on a slow or
    loaded machine (it did, 3 s, with ATEN_CPU_CAPABILITY=default on 2 busy cores)."""
    import fl_lightning.data.partition as partition

    calls = []
    draw = partition._draw_counts
    monkeypatch.setattr(partition, "_draw_counts", lambda *args: calls.append(1) or draw(*args))
    labels = _labels(5000, 10)
    with pytest.raises(UsageError) as info:
        dirichlet_partition(labels, 500, 0.3, seed=0, min_samples=min_samples)
    assert len(calls) == draws
    message = str(info.value)
    assert "\n" not in message
    for token in (
        "500 clients",
        f">= {min_samples}",
        "alpha=0.3",
        "partition.min_samples",
        "raise partition.alpha",
        "fewer clients (partition.num_clients)",
    ):
        assert token in message


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(num_clients=5, alpha=0.0), "alpha"),
        (dict(num_clients=5, alpha=-1.0), "alpha"),
        (dict(num_clients=5, alpha=float("nan")), "alpha"),
        (dict(num_clients=5, alpha=True), "alpha"),
        (dict(num_clients=0, alpha=1.0), "num_clients"),
        (dict(num_clients=101, alpha=1.0), "num_clients"),
        (dict(num_clients=2.5, alpha=1.0), "num_clients"),
        (dict(num_clients=5, alpha=1.0, min_samples=-1), "min_samples"),
    ],
)
def test_dirichlet_rejects_bad_arguments(kwargs: dict, argument: str) -> None:
    """Pure functions raise ValueError naming the argument; only the config layer raises
    ConfigError (it maps ``argument`` to ``partition.<argument>``)."""
    with pytest.raises(PartitionArgumentError) as info:
        dirichlet_partition(_labels(100, 3), seed=0, **kwargs)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, ConfigError)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}=") and "\n" not in str(info.value)


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
    with pytest.raises(PartitionArgumentError) as info:
        shard_partition(labels, 10, 101, seed=0)
    assert info.value.argument == "shards_per_client"


def test_client_class_counts_matches_brute_force() -> None:
    labels = _labels(500, 6)
    parts = dirichlet_partition(labels, 8, 0.5, seed=0)
    counts = client_class_counts(labels, parts, 6)
    assert counts.shape == (8, 6)
    for k, p in enumerate(parts):
        for c in range(6):
            assert counts[k, c] == sum(1 for i in p if labels[i] == c)
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels, minlength=6))


def test_shards_match_the_reference_deal() -> None:
    """The vectorised deal equals dealing np.array_split's shards client by client (McMahan et al.)."""
    labels = _labels(997, 7)
    for k, s in [(10, 3), (1, 1), (97, 2), (997, 1)]:
        parts = shard_partition(labels, k, s, seed=11)
        rng = np.random.default_rng(11)
        perm = rng.permutation(labels.size)
        order = perm[np.argsort(labels[perm], kind="stable")]
        shards = np.array_split(order, k * s)
        shard_ids = rng.permutation(k * s).reshape(k, s)
        reference = [np.sort(np.concatenate([shards[j] for j in row])) for row in shard_ids]
        assert len(parts) == k
        for got, want in zip(parts, reference):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == np.int64


def test_dirichlet_deal_matches_the_class_by_class_reference() -> None:
    """The vectorised deal of the accepted count table equals the plain loop: shuffle the class,
    split it by the counts, give chunk k to client k (float64-free, exact)."""
    labels = _labels(3000, 10, seed=4)
    k, alpha, seed = 23, 0.3, 9
    parts = dirichlet_partition(labels, k, alpha, seed=seed, min_samples=0)
    counts = client_class_counts(labels, parts, 10)
    rng = np.random.default_rng(seed)
    drawn = _draw_counts(np.bincount(labels), k, alpha, False, rng)
    np.testing.assert_array_equal(drawn, counts)
    reference: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c in range(10):
        idx_c = rng.permutation(np.flatnonzero(labels == c))
        for client, chunk in enumerate(np.split(idx_c, np.cumsum(drawn[:, c])[:-1])):
            reference[client].append(chunk)
    for got, chunks in zip(parts, reference):
        np.testing.assert_array_equal(got, np.sort(np.concatenate(chunks)))


def test_proportions_equal_class_by_class_draws() -> None:
    for alpha in (0.05, 0.1, 1.0):
        a, b = np.random.default_rng(3), np.random.default_rng(3)
        rows = _draw_proportions(6, 50, alpha, a)
        np.testing.assert_array_equal(rows, np.stack([b.dirichlet(np.full(50, alpha)) for _ in range(6)]))
        assert a.random() == b.random()  # the generator is left at the same point


class _UnderflowingRng:
    """A generator whose second Dirichlet draw underflows (all NaN), as for alpha -> 0."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.bit_generator = self._rng.bit_generator
        self.calls = 0

    def dirichlet(self, alpha: np.ndarray, size: int | None = None) -> np.ndarray:
        q = self._rng.dirichlet(alpha, size=size)
        if size is None:
            self.calls += 1
            if self.calls == 2:
                q[:] = np.nan
        else:
            q[1] = np.nan
        return q

    def integers(self, high: int) -> int:
        return int(self._rng.integers(high))


def test_underflowing_class_gets_all_its_mass_on_one_client() -> None:
    rows = _draw_proportions(3, 8, 0.5, _UnderflowingRng(0))
    assert np.all(np.isfinite(rows))
    np.testing.assert_allclose(rows.sum(axis=1), 1.0)
    assert np.count_nonzero(rows[1]) == 1 and rows[1].max() == 1.0
    reference = np.random.default_rng(0)  # rows 0 and 2 are the sequential draws around it
    np.testing.assert_array_equal(rows[0], reference.dirichlet(np.full(8, 0.5)))
    reference.dirichlet(np.full(8, 0.5))
    assert rows[1].argmax() == reference.integers(8)
    np.testing.assert_array_equal(rows[2], reference.dirichlet(np.full(8, 0.5)))


@pytest.mark.parametrize("scheme", ["dirichlet-0.1", "dirichlet-inf", "dirichlet-balance", "iid", "shards"])
def test_ten_thousand_clients_build_and_cover(scheme: str) -> None:
    """K=10,000 clients of N=50,000 samples (5 per client on average) build and cover exactly."""
    n, k = 50_000, 10_000
    labels = _labels(n, 10, seed=1)
    if scheme == "iid":
        parts = iid_partition(n, k, seed=0)
    elif scheme == "shards":
        parts = shard_partition(labels, k, 2, seed=0)
    elif scheme == "dirichlet-inf":
        parts = dirichlet_partition(labels, k, math.inf, seed=0)
    else:  # at alpha=0.1 some of 10,000 clients get nothing: min_samples=1 is out of reach
        parts = dirichlet_partition(labels, k, 0.1, seed=0, min_samples=0, balance=scheme.endswith("balance"))
    assert len(parts) == k
    _assert_exact_cover(parts, n)
    counts = client_class_counts(labels, parts, 10)
    np.testing.assert_array_equal(counts.sum(axis=1), [len(p) for p in parts])
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels, minlength=10))
    k_check = np.random.default_rng(0).choice(k, 20, replace=False)  # spot-check against bincount
    for j in k_check:
        np.testing.assert_array_equal(counts[j], np.bincount(labels[parts[j]], minlength=10))


def test_client_class_counts_rejects_bad_input() -> None:
    labels = _labels(50, 3)
    with pytest.raises(PartitionArgumentError) as info:
        client_class_counts(labels, [np.arange(10)], 2)
    assert info.value.argument == "labels"
    with pytest.raises(PartitionArgumentError) as info:
        client_class_counts(labels, [np.array([0, 50])], 3)
    assert info.value.argument == "parts" and "50" in str(info.value)
    np.testing.assert_array_equal(client_class_counts(labels, [np.empty(0, dtype=np.int64)], 3), [[0, 0, 0]])


# ------------------------------------------------------------------------------------------------
# partitions you can bring


def test_partition_json_roundtrip_is_identical(tmp_path) -> None:
    labels = _labels(2000, 10)
    parts = dirichlet_partition(labels, 37, 0.1, seed=2, min_samples=0)
    path = write_partition_json(parts, tmp_path / "partition.json", meta={"scheme": "dirichlet", "alpha": 0.1})
    back = read_partition_json(path, 2000)
    assert len(back) == len(parts)
    for a, b in zip(parts, back):
        assert b.dtype == np.int64
        np.testing.assert_array_equal(a, b)
    # An empty client survives the trip, and so does a bare list-of-lists file from elsewhere.
    with_empty = [np.array([2, 0]), np.empty(0, dtype=np.int64), np.array([1])]
    back = read_partition_json(write_partition_json(with_empty, tmp_path / "e.json"), 3)
    assert [b.tolist() for b in back] == [[0, 2], [], [1]]
    (tmp_path / "bare.json").write_text("[[3, 1], [0, 2]]")
    assert [b.tolist() for b in read_partition_json(tmp_path / "bare.json", 4)] == [[1, 3], [0, 2]]
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write leaves no temporary behind


def test_a_partition_that_leaves_rows_out_records_how_many_and_reads_back(tmp_path) -> None:
    """Flower's shard and pathological partitioners may leave rows in no client: the file says how many, and a
    reader allows exactly those missing — never one more, never a duplicate."""
    parts = [np.array([0, 3]), np.array([5, 6, 9])]  # rows 1, 2, 4, 7, 8 in no client
    path = write_partition_json(parts, tmp_path / "p.json", num_samples=10)
    assert json.loads(path.read_text())["unassigned"] == 5
    assert [b.tolist() for b in read_partition_json(path, 10)] == [[0, 3], [5, 6, 9]]
    with pytest.raises(ValueError, match="written for 10 training samples"):
        read_partition_json(path, 11)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "unassigned": 4}))  # one row more missing than it says
    with pytest.raises(
        ValueError,
        match=r"5 of the 10 training samples are assigned to no client, but it records 4 "
        r"unassigned",
    ):
        read_partition_json(path, 10)
    path.write_text(json.dumps({**doc, "unassigned": -1}))
    with pytest.raises(ValueError, match=r"'unassigned' is -1; expected a count of rows"):
        read_partition_json(path, 10)
    with pytest.raises(ValueError, match="index 3 appears in clients 0 and 1"):
        write_partition_json([np.array([0, 3]), np.array([3])], tmp_path / "d.json", num_samples=10)
    exact = write_partition_json([np.arange(5), np.arange(5, 10)], tmp_path / "e.json", num_samples=10)
    assert "unassigned" not in json.loads(exact.read_text())  # an exact cover reads as before


def test_partition_json_at_ten_thousand_clients(tmp_path) -> None:
    labels = _labels(50_000, 10, seed=1)
    parts = dirichlet_partition(labels, 10_000, 0.1, seed=0, min_samples=0)
    back = read_partition_json(write_partition_json(parts, tmp_path / "p.json"), 50_000)
    assert all(np.array_equal(a, b) for a, b in zip(parts, back))
    assert (tmp_path / "p.json").stat().st_size < 1_000_000


def _corrupt(tmp_path, clients, *, num_samples=None, raw: str | None = None) -> str:
    path = tmp_path / "bad.json"
    if raw is not None:
        path.write_text(raw)
    else:
        doc = {"clients": clients} if num_samples is None else {"num_samples": num_samples, "clients": clients}
        path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as info:
        read_partition_json(path, 10)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


@pytest.mark.parametrize(
    "clients, expected",
    [
        ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 3]], "index 3 appears in clients 0 and 1"),
        ([[0, 1, 1, 2, 3, 4], [5, 6, 7, 8, 9]], "index 1 appears twice in client 0"),
        ([[0, 1, 2, 3, 4], [5, 6, 7, 9, 10]], "index 10 (client 1) is out of range for 10 training samples"),
        ([[-1, 0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], "index -1 (client 0) is out of range"),
        ([[0, 1, 2], [5, 6, 7, 8, 9]], "indices 3, 4 are assigned to no client"),
        ([[0], [9]], "indices 1, 2 (and 6 more) are assigned to no client"),
        ([[0, 1, 2, 3, 4, 5, 6, 7, 8], []], "index 9 is assigned to no client"),
        ([[0, 1, 2.0, 3, 4], [5, 6, 7, 8, 9]], "client 0 holds 2.0, which is not an integer"),
        ([[0, 1, 2, 3, 4], [5, 6, 7, 8, True]], "client 1 holds true, which is not an integer"),
        ([[0, 1, 2, 3, 4], [5, 6, 7, 8, "9"]], 'client 1 holds "9", which is not an integer'),
        ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 2**70]], f"index {2**70} (client 1) is out of range"),
        ([[0, 1, 2, 3, 4], 5], "client 1 is int, not a list"),
        ([], "holds no clients"),
    ],
)
def test_corrupt_partition_file_gives_one_line(tmp_path, clients, expected: str) -> None:
    assert expected in _corrupt(tmp_path, clients)


def test_partition_file_for_another_data_set_or_not_json(tmp_path) -> None:
    assert "written for 12 training samples" in _corrupt(tmp_path, [[0]], num_samples=12)
    assert "not valid JSON" in _corrupt(tmp_path, None, raw='{"clients": [[0, 1],')
    assert "not a partition" in _corrupt(tmp_path, None, raw='{"parts": []}')
    assert "not a partition" in _corrupt(tmp_path, None, raw='"hello"')
    with pytest.raises(ValueError, match="does not exist"):
        read_partition_json(tmp_path / "missing.json", 10)
    with pytest.raises(ValueError, match="is a directory"):
        read_partition_json(tmp_path, 10)


def test_write_refuses_a_partition_that_is_not_a_cover(tmp_path) -> None:
    with pytest.raises(ValueError, match="index 1 appears in clients 0 and 1"):
        write_partition_json([np.array([0, 1]), np.array([1, 2])], tmp_path / "p.json")
    with pytest.raises(ValueError, match="not integer"):
        write_partition_json([np.array([0.0, 1.0])], tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()
