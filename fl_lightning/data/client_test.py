"""Each client's own test rows, cut from its partition as Hugging Face ``Dataset.train_test_split`` cuts a split
(pure, numpy only).

Flower's federated evaluation gives every client a local test set: ``partition = fds.load_partition(k)`` then
``partition.train_test_split(test_size=t, seed=s)`` (Flower's tutorials: ``seed=42``); each client trains on
``["train"]`` and evaluates the global model on ``["test"]``. :func:`hf_train_test_split` reproduces the rows that
call picks (checked against ``datasets`` 5.2's source and output; ``shuffle=True``, no ``stratify_by_column``,
``test_size`` a float):

* ``n_test = ceil(t · n)`` in Python float arithmetic (so 0.07 · 100 = 7.000000000000001 gives 8, as HF does),
  ``n_train = n − n_test``; ``n_train == 0`` is refused, as HF refuses it (a client of one row has no train rows);
* ``perm = np.random.default_rng(seed).permutation(n)``; the test rows are ``perm[:n_test]``, the train rows
  ``perm[n_test:]`` (positions in the partition's row order).

:func:`split_clients` applies it to every client with the same seed (each client calls ``train_test_split`` with
the same ``seed`` in Flower's client code), to the rows in the order its partition holds them: under
``partition.convention: flower`` the order ``load_partition`` returns (``partition_for(row_order=True)``: after
``FederatedDataset``'s preshuffle, and after the in-partition shuffle Flower's Dirichlet, shard and pathological
partitioners make with their own generator, ``shuffle=True`` being their default); under ``fl_lightning`` ascending
row ids. Departure: each client's train and test rows come back sorted (our loaders shuffle every epoch; the
evaluation does not depend on the order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["hf_test_size", "hf_train_test_split", "split_clients"]


def hf_test_size(num_rows: int, test_fraction: float) -> int:
    """``n_test`` of ``Dataset.train_test_split(test_size=test_fraction)`` on ``num_rows`` rows: ``ceil(t · n)``.

    Raises:
        ValueError: ``test_fraction`` not in (0, 1), or the train part would be empty (HF's own refusals).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_size={test_fraction} should be a float in the (0, 1) range")
    n_test = math.ceil(test_fraction * num_rows)
    if num_rows - n_test <= 0:
        raise ValueError(f"a client of {num_rows} row(s) with test fraction {test_fraction} keeps no training rows")
    return n_test


def hf_train_test_split(rows: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The (train, test) rows ``Dataset.train_test_split(test_size=test_fraction, seed=seed)`` picks of ``rows``
    (a partition's row ids in its row order), each sorted."""
    rows = np.asarray(rows, dtype=np.int64)
    n_test = hf_test_size(len(rows), test_fraction)
    perm = np.random.default_rng(seed).permutation(len(rows))
    return np.sort(rows[perm[n_test:]]), np.sort(rows[perm[:n_test]])


def split_clients(partition: Sequence[np.ndarray], test_fraction: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every client's (train rows, test rows) by :func:`hf_train_test_split` with the one ``seed``.

    Args:
        partition: the clients' row ids, each in its partition's row order (Flower's: ``partition_for(...,
            row_order=True)``).
        test_fraction: ``test_size``, in (0, 1).
        seed: ``train_test_split``'s seed (the same for every client, as in Flower's client code).

    Raises:
        ValueError: a client too small to keep a training row (the message names it).
    """
    train, test = [], []
    for k, part in enumerate(partition):
        try:
            a, b = hf_train_test_split(part, test_fraction, seed)
        except ValueError as err:
            raise ValueError(f"client {k}: {err}") from None
        train.append(a)
        test.append(b)
    return train, test
