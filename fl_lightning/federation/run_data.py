"""The run's data as the engine cuts it: the clients' partition of the training split (``partition``: Dirichlet,
IID, shards, pathological, natural, Flower's, or a file), the clients' own test rows
(``partition.client_test_fraction``) and which methods may have them, and the partition figure a comparison draws
once (:func:`drawn_twin`). Pure functions of the config and the labels: every rank computes the same."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fl_lightning.data.partition import (
    PartitionArgumentError,
    dirichlet_partition,
    iid_partition,
    natural_partition,
    read_partition_json,
    shard_partition,
)
from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.algorithm import ALGORITHMS, Algorithm

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["partition_for", "client_test_split", "check_client_test", "drawn_twin"]

_PARTITION_KEYS = ("num_clients", "alpha", "min_samples", "shards_per_client", "shard_size", "classes_per_client")


def partition_for(
    cfg: RunConfig, targets: np.ndarray, column: Callable[[str], np.ndarray] | None = None, *, row_order: bool = False
) -> list[np.ndarray]:
    """The clients' sample indices under ``cfg.partition`` (a bad value is a one-line config error), each sorted;
    with ``row_order`` under ``convention: flower``, each in the order Flower's ``load_partition`` returns them.

    ``column`` reads a training-split column by name (``DatasetSplits.train_column``): the natural scheme's
    ``partition.by``. ``convention: flower`` makes dirichlet / iid / natural as flwr-datasets does
    (``data/flower_partition.py``), after ``FederatedDataset``'s shuffle when ``flower_shuffle_seed`` is set.
    """
    p = cfg.partition
    if p.scheme == "file":
        return _partition_from_file(Path(p.path).expanduser(), len(targets), p.num_clients)
    groups = None
    if p.scheme == "natural":
        if column is None:
            raise ConfigError(
                "partition.scheme",
                p.scheme,
                f"a scheme other than 'natural' for data.name "
                f"{cfg.data.name!r} (it has no columns besides its labels; natural needs data.name: hf)",
            )
        groups = column(p.by)
    try:
        if p.convention == "flower":
            return _flower_partition(cfg, targets, groups, row_order)
        if p.scheme == "natural":
            return natural_partition(groups, _natural_count(groups, p.num_clients))
        if p.scheme == "iid" or math.isinf(p.alpha) and p.scheme == "dirichlet":
            return iid_partition(len(targets), p.num_clients, seed=p.seed)
        if p.scheme == "shards":
            return shard_partition(targets, p.num_clients, p.shards_per_client, seed=p.seed)
        if p.scheme == "pathological":
            return _pathological(cfg, targets)
        return dirichlet_partition(targets, p.num_clients, p.alpha, seed=p.seed, min_samples=p.min_samples, balance=p.balance)
    except PartitionArgumentError as err:
        if err.argument not in _PARTITION_KEYS:
            raise
        raise ConfigError(f"partition.{err.argument}", err.value, err.allowed) from None


def _natural_count(groups: np.ndarray, num_clients: int | None) -> int:
    """A natural partition's K: ``num_clients``, or one client per value when null (an unresolved config)."""
    return int(np.unique(groups).size) if num_clients is None else num_clients


def client_test_split(
    cfg: RunConfig, partition: list[np.ndarray], targets: np.ndarray, column: Callable[[str], np.ndarray] | None = None
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """The clients' (training rows, own test rows) of ``partition`` (``partition_for``'s, of the training split
    whose labels are ``targets``) under ``partition.client_test_fraction`` (data/client_test.py): ``(partition,
    None)`` at 0. The seed is ``client_test_seed``, or 42 (Flower's tutorials) under convention flower, else
    ``partition.seed``. Under convention flower each partition is cut in the row order Flower's ``load_partition``
    gives it (``partition_for(row_order=True)``, computed again here); else in ascending row order."""
    from fl_lightning.data.client_test import split_clients

    p = cfg.partition
    if p.client_test_fraction == 0:
        return partition, None
    seed = p.client_test_seed if p.client_test_seed is not None else 42 if p.convention == "flower" else p.seed
    ordered = partition_for(cfg, targets, column, row_order=True) if p.convention == "flower" else partition
    try:
        return split_clients(ordered, p.client_test_fraction, seed)
    except ValueError as err:
        raise UsageError(f"config error: partition.client_test_fraction: {err}") from None


def check_client_test(cfg: RunConfig, algorithm: type[Algorithm] | Algorithm) -> None:
    """``partition.client_test_fraction`` > 0 only for a method whose evaluation goes through the shared helpers
    with the global model (``Algorithm.federated_evaluation``) and reads the training split unaugmented (the
    clients' test rows are read through the training split's transform); one line otherwise."""
    if cfg.partition.client_test_fraction == 0:
        return
    if not algorithm.federated_evaluation:
        raise ConfigError(
            "partition.client_test_fraction",
            cfg.partition.client_test_fraction,
            f"0 for {cfg.algorithm} (federated evaluation on the clients' test rows: "
            f"{', '.join(sorted(n for n, a in ALGORITHMS.items() if a.federated_evaluation))})",
        )
    if isinstance(algorithm, Algorithm) and algorithm.augment:
        raise ConfigError(
            "partition.client_test_fraction",
            cfg.partition.client_test_fraction,
            f"0 while {cfg.algorithm} augments its training split (the clients' test rows are read through its transform)",
        )


def _pathological(cfg: RunConfig, targets: np.ndarray, row_order: bool = False) -> list[np.ndarray]:
    """``partition.scheme: pathological``: flwr-datasets' PathologicalPartitioner by the labels (either convention);
    its refusals are one line."""
    from fl_lightning.data.flower_partition import flower_pathological_partition

    p = cfg.partition
    try:
        return flower_pathological_partition(
            targets, p.num_clients, p.classes_per_client, seed=p.seed, class_assignment=p.class_assignment, row_order=row_order
        )
    except ValueError as err:
        if isinstance(err, PartitionArgumentError):
            raise
        raise UsageError(f"config error: partition (pathological): {err}") from None


def _flower_partition(
    cfg: RunConfig, targets: np.ndarray, groups: np.ndarray | None, row_order: bool = False
) -> list[np.ndarray]:
    """flwr-datasets' partition of the (optionally FederatedDataset-shuffled) training split, in our row indices
    (each sorted; ``row_order``: in Flower's order within each partition)."""
    from fl_lightning.data.flower_partition import (
        flower_dirichlet_partition,
        flower_iid_partition,
        flower_preshuffle,
        flower_shard_partition,
    )

    p = cfg.partition
    n = len(targets)
    order = None if p.flower_shuffle_seed is None else flower_preshuffle(n, p.flower_shuffle_seed)
    shuffled = (lambda values: values) if order is None else (lambda values: values[order])  # noqa: E731
    if p.scheme == "natural":
        parts = natural_partition(shuffled(groups), _natural_count(groups, p.num_clients))
    elif p.scheme == "iid":
        parts = flower_iid_partition(n, p.num_clients)
    else:
        try:
            if p.scheme == "shards":
                parts = flower_shard_partition(
                    shuffled(targets),
                    p.num_clients,
                    p.shards_per_client,
                    seed=p.seed,
                    shard_size=p.shard_size,
                    keep_incomplete_shard=p.keep_incomplete_shard,
                    row_order=row_order,
                )
            elif p.scheme == "pathological":
                parts = _pathological(cfg, shuffled(targets), row_order)
            else:
                parts = flower_dirichlet_partition(
                    shuffled(targets),
                    p.num_clients,
                    p.alpha,
                    seed=p.seed,
                    min_partition_size=p.min_samples,
                    self_balancing=p.balance,
                    row_order=row_order,
                )
        except ValueError as err:
            if isinstance(err, PartitionArgumentError):
                raise
            raise UsageError(f"config error: partition (convention flower): {err}") from None
    if order is None:
        return parts
    return [order[part] if row_order else np.sort(order[part]) for part in parts]


def _partition_from_file(path: Path, num_samples: int, num_clients: int) -> list[np.ndarray]:
    """``partition.scheme: file``: the exact assignment another run (or framework) used."""
    try:
        parts = read_partition_json(path, num_samples)
    except (ValueError, OSError) as err:
        raise UsageError(f"config error: partition.path: {err}") from None
    if len(parts) != num_clients:
        raise ConfigError("partition.num_clients", num_clients, f"{len(parts)}, the number of clients in '{path}'")
    return parts


def drawn_twin(run_dir: Path) -> Path | None:
    """A sibling run folder's ``partition.png`` drawn from a byte-identical ``partition.csv`` (the same
    clients, counts and class names, so the same figure): a comparison draws each partition once."""
    mine = run_dir / "partition.csv"
    if not mine.is_file():
        return None
    data = mine.read_bytes()
    for csv_path in sorted(run_dir.parent.glob("*/partition.csv")):
        png = csv_path.with_name("partition.png")
        if csv_path.parent != run_dir and png.is_file():
            try:
                if csv_path.stat().st_size == len(data) and csv_path.read_bytes() == data:
                    return png
            except OSError:  # a sibling being written or removed: draw our own
                continue
    return None
