"""Splitting one labelled data set among K simulated clients (pure, seeded, numpy only).

Three schemes are provided:

* :func:`dirichlet_partition` — label skew of Hsu, Qi & Brown (2019), "Measuring the Effects of
  Non-Identical Data Distribution for Federated Visual Classification" (Sec. 3): for every class c
  draw proportions q_c ~ Dir(alpha · 1_K) over the K clients and deal the (shuffled) samples of c
  to the clients in those proportions. Small alpha → each client sees few classes; alpha → inf →
  IID (``alpha=math.inf`` delegates to :func:`iid_partition`).
* :func:`iid_partition` — a seeded shuffle cut into K near-equal parts (sizes differ by at most 1).
* :func:`shard_partition` — McMahan et al. (2017), "Communication-Efficient Learning of Deep
  Networks from Decentralized Data" (Sec. 3, pathological non-IID): sort by label, cut into
  K·s shards, give every client s random shards.

Conventions of :func:`dirichlet_partition` and where they depart from other implementations
-----------------------------------------------------------------------------------------
* **Rounding.** Class c with n_c samples is cut at ``floor(n_c · cumsum(q_c))`` (the first K-1
  cumulative proportions); the last client of each class takes the remainder. This is the cut used
  by Hsu et al.'s reference code and by flwr-datasets.
* **No self-balancing by default (plain Hsu).** flwr-datasets' ``DirichletPartitioner`` applies,
  by default (``self_balancing=True``), a rule that sets q_{c,k} = 0 for every client k whose
  running size already exceeds the average N/K before dealing class c, then renormalises. That
  evens out client sizes but changes the distribution away from Dir(alpha), and makes the result
  depend on the order in which classes are visited. We keep plain Hsu sampling unless
  ``balance=True``, which implements the same self-balancing rule (classes are visited in
  ascending label order; if every client is already above average, the unmodified q_c is used
  instead of dividing by zero).
* **Minimum client size.** Like PFLlib (and flwr-datasets' ``min_partition_size``) we re-draw the
  *whole* partition while some client holds fewer than ``min_samples`` samples. Unlike PFLlib,
  which loops until the minimum is met (and can loop forever for large K / small alpha), we stop
  after ``max_redraws`` re-draws and raise :class:`~fl_lightning.errors.UsageError` saying what to
  change. Re-draws only resample the K×C count table (no index shuffling), so 1000 re-draws of a
  500-client partition take well under a second.
* **Determinism.** All randomness comes from ``np.random.default_rng(seed)`` owned by the call
  (never the global RNG), so the result depends only on (labels, K, alpha, seed, min_samples,
  balance). Each client's index array is returned sorted.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

from fl_lightning.errors import ConfigError, UsageError

__all__ = [
    "dirichlet_partition",
    "iid_partition",
    "shard_partition",
    "client_class_counts",
]


# ------------------------------------------------------------------------------------------------
# validation helpers


def _check_num_clients(num_clients: object, num_samples: int) -> int:
    if isinstance(num_clients, bool) or not isinstance(num_clients, Integral) or num_clients < 1:
        raise ConfigError("partition.num_clients", num_clients, "an integer >= 1")
    if num_clients > num_samples:
        raise ConfigError(
            "partition.num_clients", num_clients, f"at most the number of samples ({num_samples})"
        )
    return int(num_clients)


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ConfigError("labels", f"array of shape {labels.shape}", "a non-empty 1-D array")
    if not np.issubdtype(labels.dtype, np.integer):
        if not np.all(np.equal(np.mod(labels, 1), 0)):
            raise ConfigError("labels", str(labels.dtype), "integer class labels")
        labels = labels.astype(np.int64)
    if labels.min() < 0:
        raise ConfigError("labels", int(labels.min()), "class labels >= 0")
    return labels


def _check_int(key: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ConfigError(key, value, f"an integer >= {minimum}")
    return int(value)


# ------------------------------------------------------------------------------------------------
# partitioners


def iid_partition(num_samples: int, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """Shuffle ``range(num_samples)`` and cut it into ``num_clients`` near-equal parts.

    Args:
        num_samples: N, the size of the data set.
        num_clients: K, 1 <= K <= N.
        seed: seed of the call's own ``np.random.default_rng``.

    Returns:
        K sorted int64 index arrays whose sizes differ by at most one and that cover range(N)
        exactly once.
    """
    num_samples = _check_int("num_samples", num_samples, 1)
    num_clients = _check_num_clients(num_clients, num_samples)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_samples).astype(np.int64)
    return [np.sort(part) for part in np.array_split(perm, num_clients)]


def _draw_counts(
    class_sizes: np.ndarray, num_clients: int, alpha: float, balance: bool, rng: np.random.Generator
) -> np.ndarray:
    """One draw of the (K, C) table of how many samples of class c client k gets (Hsu et al.)."""
    num_classes = class_sizes.shape[0]
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    # Self-balancing compares running client sizes with the average N / K (flwr-datasets' rule).
    average = class_sizes.sum() / num_clients
    for c in range(num_classes):
        n_c = int(class_sizes[c])
        if n_c == 0:
            continue
        q = rng.dirichlet(np.full(num_clients, alpha))  # q_c ~ Dir(alpha 1_K)
        if not np.all(np.isfinite(q)) or q.sum() <= 0:
            # Extremely small alpha can underflow every component; all mass on one client is
            # the alpha -> 0 limit of the Dirichlet, so use that instead of NaNs.
            q = np.zeros(num_clients)
            q[rng.integers(num_clients)] = 1.0
        if balance:
            below = counts.sum(axis=1) < average
            if below.any():
                q_bal = q * below
                if q_bal.sum() > 0:
                    q = q_bal / q_bal.sum()
        cuts = np.floor(np.cumsum(q)[:-1] * n_c).astype(np.int64)
        cuts = np.clip(cuts, 0, n_c)  # cumsum may exceed 1 by rounding
        counts[:, c] = np.diff(np.concatenate(([0], cuts, [n_c])))
    return counts


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    *,
    seed: int,
    min_samples: int = 1,
    max_redraws: int = 1000,
    balance: bool = False,
) -> list[np.ndarray]:
    """Label-skewed split of Hsu et al. (2019): per class, proportions q_c ~ Dir(alpha · 1_K).

    See the module docstring for the rounding, balancing and minimum-size conventions.

    Args:
        labels: (N,) integer class labels of the data set to split.
        num_clients: K, 1 <= K <= N.
        alpha: Dirichlet concentration, > 0; ``math.inf`` gives an IID split.
        seed: seed of the call's own ``np.random.default_rng``.
        min_samples: every client must end up with at least this many samples; the whole
            partition is re-drawn until it does.
        max_redraws: how many re-draws to try before giving up with a :class:`UsageError`.
        balance: apply flwr-datasets' self-balancing rule (off by default: plain Hsu).

    Returns:
        K sorted int64 index arrays into ``labels``; every index appears in exactly one of them.

    Raises:
        ConfigError: an argument is out of range.
        UsageError: no partition with ``min_samples`` per client was found.
    """
    labels = _check_labels(labels)
    n = labels.shape[0]
    num_clients = _check_num_clients(num_clients, n)
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or math.isnan(alpha) or alpha <= 0:
        raise ConfigError("partition.alpha", alpha, "a float > 0, or inf for IID")
    min_samples = _check_int("partition.min_samples", min_samples, 0)
    max_redraws = _check_int("partition.max_redraws", max_redraws, 0)

    if math.isinf(alpha):
        parts = iid_partition(n, num_clients, seed=seed)
        smallest = min(len(p) for p in parts)
        if smallest < min_samples:
            raise UsageError(_min_error(min_samples, num_clients, alpha, n, smallest, 0))
        return parts

    if min_samples * num_clients > n:
        # Impossible for any draw: say so at once instead of spending max_redraws on it.
        raise UsageError(_min_error(min_samples, num_clients, alpha, n, n // num_clients, 0))

    rng = np.random.default_rng(seed)
    class_sizes = np.bincount(labels)
    smallest = 0
    for _attempt in range(max_redraws + 1):
        counts = _draw_counts(class_sizes, num_clients, float(alpha), balance, rng)
        smallest = int(counts.sum(axis=1).min())
        if smallest >= min_samples:
            break
    else:
        raise UsageError(_min_error(min_samples, num_clients, alpha, n, smallest, max_redraws))

    # Only the accepted draw is turned into indices: shuffle each class, deal it by the counts.
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in np.flatnonzero(class_sizes):
        idx_c = rng.permutation(np.flatnonzero(labels == c)).astype(np.int64)
        for k, chunk in enumerate(np.split(idx_c, np.cumsum(counts[:, c])[:-1])):
            if chunk.size:
                parts[k].append(chunk)
    return [
        np.sort(np.concatenate(p)) if p else np.empty(0, dtype=np.int64) for p in parts
    ]


def _min_error(
    min_samples: int, num_clients: int, alpha: float, n: int, smallest: int, redraws: int
) -> str:
    tried = f"after {redraws} re-draws " if redraws else ""
    return (
        f"cannot give each of {num_clients} clients >= {min_samples} samples "
        f"(partition.min_samples) from {n} samples with alpha={alpha} {tried}(smallest client got {smallest}); "
        f"lower partition.min_samples, raise partition.alpha, or use fewer clients"
    )


def shard_partition(
    labels: np.ndarray, num_clients: int, shards_per_client: int, *, seed: int
) -> list[np.ndarray]:
    """Pathological non-IID split of McMahan et al. (2017), Sec. 3: sort by label, deal shards.

    The samples are ordered by label (ties in a seeded random order), cut into
    ``num_clients * shards_per_client`` near-equal contiguous shards, and each client receives
    ``shards_per_client`` shards chosen at random without replacement.

    Args:
        labels: (N,) integer class labels.
        num_clients: K >= 1.
        shards_per_client: s >= 1, with K·s <= N.
        seed: seed of the call's own ``np.random.default_rng``.

    Returns:
        K sorted int64 index arrays covering range(N) exactly once.
    """
    labels = _check_labels(labels)
    n = labels.shape[0]
    num_clients = _check_num_clients(num_clients, n)
    shards_per_client = _check_int("partition.shards_per_client", shards_per_client, 1)
    num_shards = num_clients * shards_per_client
    if num_shards > n:
        raise ConfigError(
            "partition.shards_per_client",
            shards_per_client,
            f"at most N / num_clients = {n // num_clients} so that every shard is non-empty",
        )
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    order = perm[np.argsort(labels[perm], kind="stable")].astype(np.int64)
    shards = np.array_split(order, num_shards)
    shard_ids = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])) for row in shard_ids]


def client_class_counts(
    labels: np.ndarray, parts: list[np.ndarray], num_classes: int
) -> np.ndarray:
    """How many samples of each class every client holds.

    Args:
        labels: (N,) integer class labels in [0, num_classes).
        parts: K index arrays into ``labels`` (as returned by the partitioners).
        num_classes: C.

    Returns:
        (K, C) int64 array; entry [k, c] = #{i in parts[k] : labels[i] = c}.
    """
    labels = _check_labels(labels)
    num_classes = _check_int("num_classes", num_classes, 1)
    if labels.max() >= num_classes:
        raise ConfigError("labels", int(labels.max()), f"class labels < num_classes={num_classes}")
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for k, idx in enumerate(parts):
        counts[k] = np.bincount(labels[np.asarray(idx, dtype=np.int64)], minlength=num_classes)
    return counts
