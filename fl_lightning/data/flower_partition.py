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
* :func:`flower_shard_partition` — ``ShardPartitioner`` (McMahan et al. 2017's shards, as Flower deals them): sort
  the rows by the column (a stable sort: Arrow's, as ``Dataset.sort``), cut them into shards of ``shard_size``
  consecutive rows (by default ``int(N / (K·s))``), take ``permutation(usable shards)[:K·s]`` from the
  partitioner's ``default_rng(seed)`` and give partition k the k-th run of s of them (with ``shard_size`` and no
  ``s``: ``int(used / K)`` each, the first ``used mod K`` one more; the last shard may be incomplete with
  ``keep_incomplete_shard``). Rows in no chosen shard belong to no partition.
* :func:`flower_pathological_partition` — ``PathologicalPartitioner``: each partition gets
  ``num_classes_per_partition`` of the sorted distinct values (``random``: ``rng.choice(values, c,
  replace=False)`` per partition in order; ``deterministic``: values k, k+1, … mod V; ``first-deterministic``:
  value k mod V, then draws with replacement until c distinct), and each value's rows, in ascending order, are cut
  by ``np.array_split`` into as many runs as partitions hold it, dealt in partition order. A value no partition
  holds is not used (Flower warns).
* ``NaturalIdPartitioner`` — one partition per value of a column, values in sorted order: that is
  :func:`~fl_lightning.data.partition.natural_partition` with one client per value.
* :func:`flower_preshuffle` — ``FederatedDataset(shuffle=True, seed=s)`` shuffles every split with
  ``Dataset.shuffle(seed=s)`` (a ``default_rng(s).permutation(N)``) before partitioning: the partitioner
  sees row i of the shuffled split, i.e. row ``perm[i]`` of ours. Flower's default is ``seed=42``.

Where we depart from Flower (each only where Flower would fail or where our order is the run's):

* Each client's indices are returned sorted; Flower's ``shuffle=True`` permutes the order inside each
  partition (the same samples: our loaders shuffle every epoch anyway). ``row_order=True`` returns that order
  instead (the partitioner's generator, after its draws, shuffling partition 0, 1, … in place), which the
  clients' own test sets need (:mod:`fl_lightning.data.client_test`).
* Rows that the shard or pathological partitioner leaves out (an incomplete last shard, unused shards or values)
  stay out of every client, as in Flower; a run reports them in ``partition.json``'s coverage, and the run's
  training set is the clients' union.
* With self-balancing, when the draw gives exactly 0 (an underflow at a tiny alpha) to every partition
  still at or below the average, Flower divides by 0 and its cut is undefined (NaN cast to int); we raise a
  ``ValueError`` naming the case instead. (Some partition is always at or below the average.)
* Flower warns on every re-draw; we re-draw silently and, after the last, raise the
  :class:`~fl_lightning.errors.UsageError` of our own partitioner (which keys to change).
"""

from __future__ import annotations

import math

import numpy as np

from fl_lightning.data.partition import _check_int, _check_num_clients, _group_by_owner, _min_error

__all__ = [
    "FLOWER_MAX_RETRIES",
    "CLASS_ASSIGNMENTS",
    "flower_dirichlet_partition",
    "flower_iid_partition",
    "flower_shard_partition",
    "flower_pathological_partition",
    "flower_preshuffle",
]

CLASS_ASSIGNMENTS = ("random", "deterministic", "first-deterministic")  # PathologicalPartitioner's modes

FLOWER_MAX_RETRIES = 10  # DirichletPartitioner: "The max number of attempts (10) was reached"


def flower_iid_partition(num_samples: int, num_clients: int) -> list[np.ndarray]:
    """``IidPartitioner(num_partitions=K)``: K contiguous near-equal blocks of ``range(N)`` (no shuffle)."""
    num_samples = _check_int("num_samples", num_samples, 1)
    num_clients = _check_num_clients(num_clients, num_samples)
    return [a.astype(np.int64) for a in np.array_split(np.arange(num_samples), num_clients)]


def flower_dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    *,
    seed: int,
    min_partition_size: int = 10,
    self_balancing: bool = False,
    row_order: bool = False,
) -> list[np.ndarray]:
    """``DirichletPartitioner(num_partitions=K, partition_by=..., alpha, min_partition_size, self_balancing,
    seed)`` on a split whose ``partition_by`` column is ``labels`` (any sortable values).

    Args:
        labels: (N,) values of the column the partitioner splits by.
        num_clients: K, 1 <= K <= N.
        alpha: the (symmetric) Dirichlet concentration, > 0.
        seed: the partitioner's seed (Flower's default is 42).
        min_partition_size: re-draw while a partition is smaller (Flower's default is 10).
        self_balancing: Flower's balancing rule (its default is False).
        row_order: each partition's rows in the order ``load_partition`` returns them (Flower's ``shuffle=True``:
            :func:`_shuffled`) instead of sorted.

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
                    raise ValueError(
                        "self-balancing: the Dirichlet draw gave 0 to every partition still at or "
                        "below N/K (Flower's cut is undefined here); use a larger alpha or no balancing"
                    )
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
    if row_order:  # each partition: its pieces in label order, then shuffled by the partitioner's generator
        return _shuffled([np.concatenate(pieces).astype(np.int64) for pieces in parts], rng)
    owner = np.empty(n, dtype=np.int64)
    for k, pieces in enumerate(parts):
        for piece in pieces:
            owner[piece] = k
    return _group_by_owner(owner, num_clients)


def flower_shard_partition(
    labels: np.ndarray,
    num_clients: int,
    shards_per_client: int | None,
    *,
    seed: int,
    shard_size: int | None = None,
    keep_incomplete_shard: bool = False,
    row_order: bool = False,
) -> list[np.ndarray]:
    """``ShardPartitioner(num_partitions=K, partition_by=..., num_shards_per_partition=s, shard_size,
    keep_incomplete_shard, seed)`` on a split whose ``partition_by`` column is ``labels``.

    Args:
        labels: (N,) values of the column the rows are sorted by.
        num_clients: K, 1 <= K <= N.
        shards_per_client: s, or None (then ``shard_size`` decides how many shards there are).
        seed: the partitioner's seed (Flower's default is 42).
        shard_size: rows per shard; None: ``int(N / (K·s))``.
        keep_incomplete_shard: keep the last, shorter shard as a shard of its own.
        row_order: as :func:`flower_dirichlet_partition`'s (a partition's shards in the order drawn, then shuffled).

    Returns:
        K sorted int64 index arrays: partition k holds exactly the rows Flower's partition k holds (rows in no
        chosen shard are in none).

    Raises:
        ValueError: what Flower refuses (no shard_size nor s; fewer usable shards than partitions; K·s shards of
            ``shard_size`` rows larger than N), in its own terms.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels: expected a non-empty 1-D array, got shape {labels.shape}")
    n = labels.shape[0]
    num_clients = _check_num_clients(num_clients, n)
    if shard_size is not None:
        shard_size = _check_int("shard_size", shard_size, 1)
    if shards_per_client is not None:
        shards_per_client = _check_int("shards_per_client", shards_per_client, 1)
        if shard_size is not None and shard_size * shards_per_client * num_clients > n:
            raise ValueError(
                f"{num_clients} clients x {shards_per_client} shards x {shard_size} rows need at least "
                f"{shard_size * shards_per_client * num_clients} rows; the split has {n}"
            )
        used = num_clients * shards_per_client
        per_client = np.full(num_clients, shards_per_client)
        if shard_size is None:
            shard_size = int(n / used)
            if shard_size == 0:
                raise ValueError(f"{used} shards of {n} rows would be empty; use fewer clients or shards per client")
            usable = math.ceil(n / shard_size) if keep_incomplete_shard else n // shard_size
        else:
            usable = n // shard_size
    else:
        if shard_size is None:
            raise ValueError("shard_size is needed when shards_per_client is null")
        used = math.ceil(n / shard_size) if keep_incomplete_shard else n // shard_size
        usable = used
        per_client = np.full(num_clients, used // num_clients)
        per_client[: used - num_clients * (used // num_clients)] += 1
    if usable < num_clients:
        raise ValueError(
            f"only {usable} shards of {shard_size} rows for {num_clients} clients; use smaller shards or fewer clients"
        )
    order = np.argsort(labels, kind="stable")  # Dataset.sort(partition_by): Arrow's stable sort
    rng = np.random.default_rng(seed)
    chosen = rng.permutation(usable)[:used]
    dealt = np.split(chosen, np.cumsum(per_client))[:-1]
    if row_order:
        return _shuffled(
            [
                np.concatenate([order[shard * shard_size : min((shard + 1) * shard_size, n)] for shard in shards]).astype(
                    np.int64
                )
                for shards in dealt
            ],
            rng,
        )
    owner = np.full(n, -1, dtype=np.int64)
    for k, shards in enumerate(dealt):
        for shard in shards:
            owner[order[shard * shard_size : min((shard + 1) * shard_size, n)]] = k
    return _group_owned(owner, num_clients)


def flower_pathological_partition(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    *,
    seed: int,
    class_assignment: str = "random",
    row_order: bool = False,
) -> list[np.ndarray]:
    """``PathologicalPartitioner(num_partitions=K, partition_by=..., num_classes_per_partition=c,
    class_assignment_mode, seed)`` on a split whose ``partition_by`` column is ``labels``.

    Args:
        labels: (N,) values of the column (any sortable values).
        num_clients: K, 1 <= K <= N.
        classes_per_client: c, at most the number of distinct values.
        seed: the partitioner's seed (Flower's default is 42).
        class_assignment: ``random`` (Flower's default), ``deterministic`` or ``first-deterministic``.
        row_order: as :func:`flower_dirichlet_partition`'s (a partition's runs in value order, then shuffled).

    Returns:
        K sorted int64 index arrays: partition k holds exactly the rows Flower's partition k holds.

    Raises:
        ValueError: what Flower refuses (c above the distinct values; a value held by more partitions than it has
            rows), in its own terms.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels: expected a non-empty 1-D array, got shape {labels.shape}")
    n = labels.shape[0]
    num_clients = _check_num_clients(num_clients, n)
    classes_per_client = _check_int("classes_per_client", classes_per_client, 1)
    if class_assignment not in CLASS_ASSIGNMENTS:
        raise ValueError(f"class_assignment={class_assignment!r}: expected one of {', '.join(CLASS_ASSIGNMENTS)}")
    values = sorted(np.unique(labels).tolist())  # Dataset.unique, then sorted()
    if classes_per_client > len(values):
        raise ValueError(f"{classes_per_client} classes per client, but the column has {len(values)} distinct values")
    rng = np.random.default_rng(seed)
    held = _pathological_classes(values, num_clients, classes_per_client, class_assignment, rng)
    owner = np.full(n, -1, dtype=np.int64)
    runs: list[list[np.ndarray]] = [[np.zeros(0, dtype=np.int64)] for _ in range(num_clients)]
    for value in values:
        holders = [k for k in range(num_clients) if value in held[k]]
        rows = np.flatnonzero(labels == value)
        if len(holders) > rows.size:
            raise ValueError(
                f"class {value!r} would go to {len(holders)} clients but has {rows.size} rows; use fewer "
                f"clients or classes per client, or class_assignment: deterministic"
            )
        for k, run in zip(holders, np.array_split(rows, len(holders)) if holders else []):
            owner[run] = k
            runs[k].append(run)
    if row_order:
        return _shuffled([np.concatenate(mine).astype(np.int64) for mine in runs], rng)
    return _group_owned(owner, num_clients)


def _shuffled(partitions: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    """Flower's ``shuffle=True`` (the partitioners' default): each partition's rows shuffled in place by the
    partitioner's own generator, partition 0 first, after its draws."""
    for rows in partitions:
        rng.shuffle(rows)
    return partitions


def _group_owned(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Client k's sorted rows; rows whose owner is -1 belong to no client."""
    kept = np.flatnonzero(owner >= 0)
    return [kept[part] for part in _group_by_owner(owner[kept], num_clients)]


def _pathological_classes(values: list, num_clients: int, c: int, mode: str, rng: np.random.Generator) -> list[list]:
    """The values each partition holds, drawn as ``PathologicalPartitioner`` draws them (the same rng calls)."""
    if mode == "deterministic":
        return [[values[(k + i) % len(values)] for i in range(c)] for k in range(num_clients)]
    if mode == "random":
        return [rng.choice(values, size=c, replace=False).tolist() for _ in range(num_clients)]
    held = []
    for k in range(num_clients):  # first-deterministic
        mine = [values[k % len(values)]]
        while len(mine) < c:
            value = rng.choice(values, size=1)[0]
            if value not in mine:
                mine.append(value)
        held.append(mine)
    return held


def flower_preshuffle(num_samples: int, seed: int) -> np.ndarray:
    """The row order ``FederatedDataset(shuffle=True, seed=seed)`` gives a split: row i of it is ``perm[i]``."""
    return np.random.default_rng(seed).permutation(num_samples).astype(np.int64)
