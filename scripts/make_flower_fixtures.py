"""Golden partitions made by flwr-datasets itself: ``tests/data/fixtures/flower_partitions.json``.

Run in a virtual environment that holds flwr-datasets (it pins ``datasets<5``, so not beside this package)::

    python -m venv /tmp/venv-flwr && /tmp/venv-flwr/bin/pip install flwr-datasets==0.6.1
    HF_DATASETS_OFFLINE=1 /tmp/venv-flwr/bin/python scripts/make_flower_fixtures.py [--check]

``--check`` writes nothing and exits 1 when the stored fixture is not what the installed flwr-datasets makes.

It generates small tables with fixed seeds (a label column, a writer column and a ``row`` column holding
each row's index), writes each to a parquet file and builds, for every case, the
``FederatedDataset(dataset="parquet", data_files=..., partitioners={"train": ...}, shuffle=..., seed=...)``
a Flower user would. Each partition is recorded as the ``row`` values Flower's ``load_partition(k)`` returns,
i.e. indices into the generated table in Flower's own order; a case whose partitioner gives up records
Flower's error instead. The tables, the settings and the versions are stored beside the partitions, so the
tests (``tests/data/test_flower_partition.py``) need neither flwr-datasets nor this script's numpy.
Holds no logic of the package.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path

import flower_strategy_fixtures as fixtures
import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "fixtures" / "flower_partitions.json"


def tables() -> dict[str, dict[str, list]]:
    """The generated data sets: integer labels with skewed classes, string labels with integer writer ids."""
    rng = np.random.default_rng(20261202)
    skewed = rng.choice(7, size=600, p=[0.34, 0.22, 0.16, 0.12, 0.08, 0.05, 0.03])
    writers = rng.choice(23, size=600, p=rng.dirichlet(np.full(23, 2.0)))
    rng = np.random.default_rng(7)
    animals = np.array(["cat", "dog", "eel", "ant"])[rng.choice(4, size=250, p=[0.4, 0.3, 0.2, 0.1])]
    writer_ids = np.array([3, 17, 100, 101, 2500, 42])[rng.integers(0, 6, 250)]
    return {
        "skewed600": {"label": skewed.tolist(), "writer": [f"w{w:02d}" for w in writers]},
        "strings250": {"label": animals.tolist(), "writer": writer_ids.tolist()},
    }


# (data set, num_partitions, alpha, min_partition_size, self_balancing, seed, FederatedDataset shuffle seed or None)
DIRICHLET = [
    ("skewed600", 5, 0.5, 10, False, 42, None),
    ("skewed600", 8, 0.1, 0, False, 0, None),
    ("skewed600", 6, 1.0, 5, True, 7, None),
    ("skewed600", 10, 0.3, 2, True, 42, 42),
    ("skewed600", 10, 0.5, 10, False, 42, 42),  # Flower's defaults: min_partition_size=10, seed=42, shuffle seed 42
    ("skewed600", 20, 0.3, 10, False, 1, None),  # re-draws before it meets min_partition_size
    ("skewed600", 20, 0.5, 10, False, 2, 42),  # re-draws, after FederatedDataset's shuffle
    ("skewed600", 12, 0.2, 15, True, 1, None),  # self-balancing with re-draws
    ("skewed600", 20, 0.1, 10, False, 1, None),  # gives up after 10 re-draws
    ("strings250", 4, 0.3, 5, False, 42, 42),
    ("strings250", 3, 2.0, 10, True, 5, None),
]
IID = [("skewed600", 7, None), ("skewed600", 7, 42), ("strings250", 9, 3)]  # (data set, num_partitions, shuffle)
NATURAL = [("skewed600", None), ("skewed600", 42), ("strings250", 42)]  # (data set, shuffle), by "writer"
# (data set, num_partitions, num_shards_per_partition, shard_size, keep_incomplete_shard, seed, shuffle), by "label"
SHARD = [
    ("skewed600", 10, 2, None, False, 42, None),  # McMahan et al.'s shards: 20 of 30 rows, every row used
    ("skewed600", 7, 3, None, True, 1, 42),  # int(600 / 21) = 28 rows: 12 rows in no partition
    ("skewed600", 8, None, 50, False, 3, None),  # shard_size alone: 12 shards dealt 2, 2, 2, 2, 1, 1, 1, 1
    ("skewed600", 5, None, 70, True, 0, None),  # ... with the last, incomplete shard (40 rows)
    ("skewed600", 6, 2, 40, False, 42, 42),  # both given: 12 of 15 usable shards
    ("strings250", 4, 2, None, False, 42, None),  # string labels
    ("skewed600", 10, None, 100, False, 0, None),  # 6 usable shards for 10 partitions: Flower refuses
]
# (data set, num_partitions, num_classes_per_partition, class_assignment_mode, seed, shuffle), by "label"
PATHOLOGICAL = [
    ("skewed600", 10, 2, "random", 42, None),  # Flower's defaults
    ("skewed600", 8, 3, "deterministic", 0, 42),
    ("skewed600", 12, 2, "first-deterministic", 7, None),
    ("strings250", 5, 2, "random", 1, 42),  # string labels
    ("skewed600", 3, 1, "random", 3, None),  # classes no partition holds: their rows in none
    ("skewed600", 5, 8, "random", 0, None),  # 8 classes of 7: Flower refuses
]


def federated(parquet: Path, partitioner, shuffle_seed: int | None):
    """The FederatedDataset a Flower user builds over the parquet file."""
    from flwr_datasets import FederatedDataset

    return FederatedDataset(
        dataset="parquet",
        data_files={"train": str(parquet)},
        partitioners={"train": partitioner},
        shuffle=shuffle_seed is not None,
        seed=42 if shuffle_seed is None else shuffle_seed,
    )


def record(parquet: Path, partitioner, shuffle_seed: int | None) -> dict:
    """Flower's partitions as row lists (or its error), and how many re-draw warnings it gave."""
    fds = federated(parquet, partitioner, shuffle_seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            first = fds.load_partition(0)["row"][:]  # assigns the partitioner its data set
            parts = [first] + [fds.load_partition(k)["row"][:] for k in range(1, partitioner.num_partitions)]
        except ValueError as err:
            return {"error": f"{type(err).__name__}: {err}"}
    redraws = sum("min_partition_size" in str(w.message) for w in caught)
    return {"partitions": parts, **({"redraws": redraws} if redraws else {})}


def case(kind: str, data: str, parquet: Path, shuffle_seed: int | None, partitioner, **settings) -> dict:
    """One fixture case: the partitioner's kind and recorded settings, the table, the shuffle seed, and Flower's
    partitions of that table (:func:`record`)."""
    return {
        "partitioner": kind,
        "data": data,
        **settings,
        "shuffle_seed": shuffle_seed,
        **record(parquet, partitioner, shuffle_seed),
    }


def main(argv: list[str]) -> int:
    import datasets
    import flwr_datasets
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        NaturalIdPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
    )

    data = tables()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, columns in data.items():
            files[name] = Path(tmp) / f"{name}.parquet"
            datasets.Dataset.from_dict({**columns, "row": list(range(len(columns["label"])))}).to_parquet(files[name])
        for name, k, alpha, min_size, balance, seed, shuffle in DIRICHLET:
            settings = dict(num_partitions=k, alpha=alpha, min_partition_size=min_size, self_balancing=balance, seed=seed)
            partitioner = DirichletPartitioner(partition_by="label", **settings)
            cases.append(case("dirichlet", name, files[name], shuffle, partitioner, **settings))
        for name, k, shuffle in IID:
            cases.append(case("iid", name, files[name], shuffle, IidPartitioner(num_partitions=k), num_partitions=k))
        for name, shuffle in NATURAL:
            partitioner = NaturalIdPartitioner(partition_by="writer")
            cases.append(case("natural_id", name, files[name], shuffle, partitioner, partition_by="writer"))
        for name, k, s, size, keep, seed, shuffle in SHARD:
            settings = dict(num_partitions=k, num_shards_per_partition=s, shard_size=size, keep_incomplete_shard=keep, seed=seed)
            partitioner = ShardPartitioner(partition_by="label", **settings)
            cases.append(case("shard", name, files[name], shuffle, partitioner, **settings))
        for name, k, c, mode, seed, shuffle in PATHOLOGICAL:
            settings = dict(num_partitions=k, num_classes_per_partition=c, class_assignment_mode=mode, seed=seed)
            partitioner = PathologicalPartitioner(partition_by="label", **settings)
            cases.append(case("pathological", name, files[name], shuffle, partitioner, **settings))
    fixture = {
        "made_by": "HF_DATASETS_OFFLINE=1 python scripts/make_flower_fixtures.py (in a venv with flwr-datasets)",
        "versions": {
            "flwr_datasets": flwr_datasets.__version__,
            "datasets": datasets.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
        },
        "how": "FederatedDataset(dataset='parquet', data_files={'train': <table>.parquet}, partitioners={'train': P}, "
        "shuffle=shuffle_seed is not None, seed=shuffle_seed); partitions[k] = load_partition(k)['row']",
        "data": data,
        "cases": cases,
    }
    text = json.dumps(fixture, separators=(",", ":")) + "\n"
    return fixtures.write_or_check(OUT, text, argv, f"{len(cases)} cases", f"flwr-datasets {flwr_datasets.__version__}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
