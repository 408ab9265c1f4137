"""Partitions exactly as flwr-datasets (Flower Datasets 0.6) makes them, without flwr-datasets (pure, numpy).

``partition.convention: flower`` gives a run the very clients of a Flower baseline, so that our numbers
sit beside theirs on the same data. Each function reproduces one partitioner of
``flwr_datasets.partitioner`` index for index (tested against partitions flwr-datasets 0.6.1 itself made on
generated data, ``tests/data/fixtures/flower_partitions.json``):

* :func:`flower_dirichlet_partition` — ``DirichletPartitioner`` (Yurochkin et al. 2019, "Bayesian
  Nonparametric Federated Learning of Neural Networks", as Flower implements it): for each label in sorted
  order draw q ~ Dir(alpha · 1_K) from the partitioner's own ``default_rng(seed)``; with
  ``self_balancing`` set q_k = 0 for every partition already holding MORE than N/K samples and
  renormalise by their left-to-right sum (as Python's ``sum`` adds Flower's dict values); split the
  label's indices, in ascending order, at ``int(cumsum(q) · n_c)``. The whole draw is repeated while a
  partition holds fewer than ``min_partition_size`` samples, at most 10 times after the first (Flower's
  limit; then it gives up).
* :func:`flower_iid_partition` — ``IidPartitioner``: ``Dataset.shard(K, k, contiguous=True)``, i.e.
  contiguous near-equal blocks of the rows, the first ``N mod K`` one longer. No shuffling of its own.
* ``NaturalIdPartitioner`` — one partition per value of a column, values in sorted order: that is
  :func:`~fl_lightning.data.partition.natural_partition` with one client per value.
* :func:`flower_preshuffle` — ``FederatedDataset(shuffle=True, seed=s)`` shuffles every split with
  ``Dataset.shuffle(seed=s)`` (a ``default_rng(s).permutation(N)``) before partitioning: the partitioner
  sees row i of the shuffled split, i.e. row ``perm[i]`` of ours. Flower's default is ``seed=42``.

Where we depart from Flower (each only where Flower would fail or where our order is the run's):

* Each client's indices are returned sorted; Flower's ``shuffle=True`` permutes the order inside each
  partition (the same samples: our loaders shuffle every epoch anyway).
* With self-balancing, when the draw gives exactly 0 (an underflow at a tiny alpha) to every partition
  still at or below the average, Flower divides by 0 and its cut is undefined (NaN cast to int); we raise a
  ``ValueError`` naming the case instead. (Some partition is always at or below the average.)
* Flower warns on every re-draw; we re-draw silently and, after the last, raise the
  :class:`~fl_lightning.errors.UsageError` of our own partitioner (which keys to change).
"""

from __future__ import annotations

import numpy as np

from fl_lightning.data.partition import _check_int, _check_num_clients, _group_by_owner, _min_error

__all__ = ["FLOWER_MAX_RETRIES", "flower_dirichlet_partition", "flower_iid_partition", "flower_preshuffle"]

FLOWER_MAX_RETRIES = 10  # DirichletPartitioner: "The max number of attempts (10) was reached"


def flower_iid_partition(num_samples: int, num_clients: int) -> list[np.ndarray]:
    """``IidPartitioner(num_partitions=K)``: K contiguous near-equal blocks of ``range(N)`` (no shuffle)."""
    num_samples = _check_int("num_samples", num_samples, 1)
    num_clients = _check_num_clients(num_clients, num_samples)
    return [a.astype(np.int64) for a in np.array_split(np.arange(num_samples), num_clients)]


def flower_dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, *, seed: int,
                               min_partition_size: int = 10, self_balancing: bool = False) -> list[np.ndarray]:
    """``DirichletPartitioner(num_partitions=K, partition_by=..., alpha, min_partition_size, self_balancing,
    seed)`` on a split whose ``partition_by`` column is ``labels`` (any sortable values).

    Args:
        labels: (N,) values of the column the partitioner splits by.
        num_clients: K, 1 <= K <= N.
        alpha: the (symmetric) Dirichlet concentration, > 0.
        seed: the partitioner's seed (Flower's default is 42).
        min_partition_size: re-draw while a partition is smaller (Flower's default is 10).
        self_balancing: Flower's balancing rule (its default is False).

    Returns:
        K sorted int64 index arrays: partition k holds exactly the rows Flower's partition k holds.

    Raises:
        ValueError: a bad argument, or a balancing step with every partition above the average.
        UsageError: no draw within Flower's 11 tries met ``min_partition_size``.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels: expected a non-empty 1-D array, got shape {labels.shape}")
    n = labels.shape[0]
    num_clients = _check_num_clients(num_clients, n)
    if not alpha > 0:
        raise ValueError(f"alpha={alpha!r} is not allowed; expected a float > 0")
    min_partition_size = _check_int("min_samples", min_partition_size, 0)
    rng = np.random.default_rng(seed)
    concentration = np.full(num_clients, float(alpha))
    average = n / num_clients
    by_class = [np.flatnonzero(labels == value) for value in np.unique(labels)]  # sorted values, ascending rows
    smallest = 0
    for _try in range(FLOWER_MAX_RETRIES + 1):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for idx in by_class:
            q = rng.dirichlet(concentration)
            if self_balancing:
                q = np.where(sizes > average, 0.0, q)
                # Flower's sum() over its dict adds left to right; q.sum() adds pairwise (8 lanes from K = 8 on),
                # which can differ in the last bit and move a cut by one sample. cumsum adds left to right.
                total = np.cumsum(q)[-1]
                if not total > 0:
                    raise ValueError("self-balancing: the Dirichlet draw gave 0 to every partition still at or "
                                     "below N/K (Flower's cut is undefined here); use a larger alpha or no balancing")
                q = q / total
            cuts = (np.cumsum(q) * idx.size).astype(int)[:-1]
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
                sizes[k] += piece.size
        smallest = int(sizes.min())
        if smallest >= min_partition_size:
            break
    else:
        from fl_lightning.errors import UsageError

        raise UsageError(_min_error(min_partition_size, num_clients, alpha, n, smallest, FLOWER_MAX_RETRIES))
    owner = np.empty(n, dtype=np.int64)
    for k, pieces in enumerate(parts):
        for piece in pieces:
            owner[piece] = k
    return _group_by_owner(owner, num_clients)


def flower_preshuffle(num_samples: int, seed: int) -> np.ndarray:
    """The row order ``FederatedDataset(shuffle=True, seed=seed)`` gives a split: row i of it is ``perm[i]``."""
    return np.random.default_rng(seed).permutation(num_samples).astype(np.int64)
