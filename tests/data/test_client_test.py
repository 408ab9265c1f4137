"""partition.client_test_fraction: every client's own test rows, as Flower's ``partition.train_test_split`` cuts them.

References: Hugging Face ``datasets``' own ``Dataset.train_test_split`` where it is installed (skipped otherwise), and
the partitions flwr-datasets 0.6.1 made (``fixtures/flower_partitions.json``), which hold each partition's rows in
the order ``load_partition`` returns them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fl_lightning.config.loading import load_config
from fl_lightning.data.client_test import hf_test_size, hf_train_test_split, split_clients
from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.run_data import client_test_split, partition_for
from tests.conftest import CONF

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "flower_partitions.json").read_text())
CASES = [c for c in FIXTURE["cases"] if "partitions" in c]


def _hf_rows(rows: np.ndarray, t: float, seed: int) -> tuple[list[int], list[int]]:
    """``Dataset.train_test_split`` itself on a table whose column holds ``rows`` (the reference)."""
    datasets = pytest.importorskip("datasets")
    out = datasets.Dataset.from_dict({"i": [int(r) for r in rows]}).train_test_split(test_size=t, seed=seed)
    return sorted(out["train"]["i"][:]), sorted(out["test"]["i"][:])


@pytest.mark.parametrize(
    ("n", "t", "seed"), [(100, 0.07, 42), (7, 0.2, 0), (101, 0.33, 5), (2, 0.5, 42), (10, 0.3, 42), (1000, 0.25, 123)]
)
def test_the_split_is_the_installed_datasets_train_test_split(n, t, seed):
    rows = np.random.default_rng(n).choice(10 * n, size=n, replace=False)  # a partition's ids, in its own order
    train, test = hf_train_test_split(rows, t, seed)
    assert (train.tolist(), test.tolist()) == _hf_rows(rows, t, seed)


def test_the_test_size_is_hf_ceiling_in_float_arithmetic():
    assert 0.07 * 100 > 7 and hf_test_size(100, 0.07) == 8  # as HF: ceil(7.000000000000001)
    assert hf_test_size(10, 0.3) == math.ceil(0.3 * 10) == 3 and hf_test_size(3, 0.5) == 2
    with pytest.raises(ValueError, match="keeps no training rows"):
        hf_test_size(1, 0.2)  # HF: "the resulting train set will be empty"
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        hf_test_size(10, 1.0)


def test_the_split_is_the_permutations_head_in_the_partitions_order():
    rows = np.array([50, 3, 17, 8, 99, 12, 40])
    perm = np.random.default_rng(9).permutation(7)
    train, test = hf_train_test_split(rows, 0.3, 9)
    assert test.tolist() == sorted(rows[perm[:3]]) and train.tolist() == sorted(rows[perm[3:]])
    assert hf_train_test_split(np.sort(rows), 0.3, 9)[1].tolist() != test.tolist()  # the order matters (this seed)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['partitioner']}-{c['data']}-shuffle={c['shuffle_seed']}")
def test_the_clients_test_rows_are_flowers_train_test_split_of_flowers_partitions(case):
    """Each fixture partition as load_partition returned it, cut by train_test_split(0.2, seed=42): what
    partition.client_test_fraction 0.2 under convention flower gives each client (partition_for's row order is
    tested against the same fixture in test_flower_partition.py)."""
    train, test = split_clients([np.asarray(p) for p in case["partitions"]], 0.2, 42)
    for part, a, b in zip(case["partitions"], train, test):
        ref_train, ref_test = _hf_rows(np.asarray(part), 0.2, 42)
        assert (a.tolist(), b.tolist()) == (ref_train, ref_test)


def test_every_client_is_cut_and_nothing_is_lost():
    parts = [np.arange(0, 10), np.arange(10, 13), np.arange(13, 40)]
    train, test = split_clients(parts, 0.25, 7)
    for part, a, b in zip(parts, train, test):
        assert np.array_equal(np.union1d(a, b), part) and np.intersect1d(a, b).size == 0
        assert len(b) == math.ceil(0.25 * len(part))
    with pytest.raises(ValueError, match="client 1: a client of 1 row"):
        split_clients([np.arange(5), np.array([5]), np.arange(6, 9)], 0.25, 7)


def _cfg(*extra: str):
    return load_config(str(CONF / "fedavg_digits_tiny.yaml"), list(extra))


def test_the_config_key_cuts_the_partition_with_its_seed():
    cfg = _cfg("--partition.client_test_fraction", "0.2")
    targets = np.random.default_rng(0).integers(0, 10, size=400)
    whole = partition_for(cfg, targets)
    train, test = client_test_split(cfg, whole, targets)
    assert [t.tolist() for t in test] == [hf_train_test_split(p, 0.2, cfg.partition.seed)[1].tolist() for p in whole]
    assert all(np.array_equal(np.union1d(a, b), p) for a, b, p in zip(train, test, whole))
    assert client_test_split(_cfg(), whole, targets) == (whole, None)  # 0: the partition as it is
    flower = _cfg(
        "--partition.client_test_fraction",
        "0.2",
        "--partition.convention",
        "flower",
        "--partition.flower_shuffle_seed",
        "42",
        "--partition.alpha",
        "0.5",
    )
    parts = partition_for(flower, targets)
    ordered = partition_for(flower, targets, row_order=True)  # Flower's rows in Flower's order
    assert [np.sort(p).tolist() for p in ordered] == [p.tolist() for p in parts]
    assert [t.tolist() for t in client_test_split(flower, parts, targets)[1]] == [
        hf_train_test_split(p, 0.2, 42)[1].tolist() for p in ordered
    ]  # seed 42 by default under flower
    assert [t.tolist() for t in client_test_split(flower, parts, targets)[1]] != [
        hf_train_test_split(p, 0.2, 42)[1].tolist() for p in parts
    ]  # the order matters


def test_config_errors_of_client_test_sets():
    with pytest.raises(ConfigError, match="partition.client_test_fraction"):
        _cfg("--partition.client_test_fraction", "1.0")
    with pytest.raises(ConfigError, match="partition.client_test_seed"):
        _cfg("--partition.client_test_seed", "3")  # without a fraction: nothing to seed
    cfg = _cfg("--partition.client_test_fraction", "0.5", "--partition.num_clients", "4")
    with pytest.raises(UsageError, match="partition.client_test_fraction: client 0: a client of 1 row"):
        client_test_split(cfg, [np.array([0]), np.arange(1, 5)], np.zeros(5, dtype=np.int64))
