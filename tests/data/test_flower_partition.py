"""partition.convention: flower gives flwr-datasets' partitions index for index.

The truth is ``tests/data/fixtures/flower_partitions.json``: partitions that flwr-datasets itself made
(``scripts/make_flower_fixtures.py``, run in a venv holding flwr-datasets; its version is in the file) on
small generated tables through ``FederatedDataset`` — DirichletPartitioner with and without
self-balancing, with re-draws and giving up, IidPartitioner, NaturalIdPartitioner, each with and without
FederatedDataset's shuffle. These tests need neither flwr-datasets nor its ``datasets``; where
flwr-datasets is installed, ``scripts/make_flower_fixtures.py --check`` says whether it still makes them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fl_lightning.config.loading import load_config
from fl_lightning.data.flower_partition import (
    flower_dirichlet_partition,
    flower_iid_partition,
    flower_pathological_partition,
    flower_preshuffle,
    flower_shard_partition,
)
from fl_lightning.data.partition import natural_partition, read_partition_json, write_partition_json
from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.run_data import partition_for
from tests.conftest import CONF, REPO

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "flower_partitions.json").read_text())
CASES = FIXTURE["cases"]


def _case_id(case: dict) -> str:
    keys = (
        "num_partitions",
        "alpha",
        "min_partition_size",
        "self_balancing",
        "num_shards_per_partition",
        "shard_size",
        "keep_incomplete_shard",
        "num_classes_per_partition",
        "class_assignment_mode",
        "seed",
        "shuffle_seed",
    )
    return "-".join([case["partitioner"], case["data"]] + [f"{k}={case[k]}" for k in keys if k in case])


def _column(case: dict, name: str) -> np.ndarray:
    return np.asarray(FIXTURE["data"][case["data"]][name])


def _overrides(case: dict) -> list[str]:
    """The config that says what the case's Flower code says (docs/data_and_weights.md, the table)."""
    shuffle = case["shuffle_seed"]
    out = ["--partition.convention", "flower", "--partition.flower_shuffle_seed", "null" if shuffle is None else str(shuffle)]
    if case["partitioner"] == "dirichlet":
        return out + [
            "--partition.scheme",
            "dirichlet",
            "--partition.num_clients",
            str(case["num_partitions"]),
            "--partition.alpha",
            str(case["alpha"]),
            "--partition.min_samples",
            str(case["min_partition_size"]),
            "--partition.balance",
            str(case["self_balancing"]).lower(),
            "--partition.seed",
            str(case["seed"]),
        ]
    if case["partitioner"] == "iid":
        return out + ["--partition.scheme", "iid", "--partition.num_clients", str(case["num_partitions"])]
    if case["partitioner"] == "shard":
        s, size = case["num_shards_per_partition"], case["shard_size"]
        return out + [
            "--partition.scheme",
            "shards",
            "--partition.num_clients",
            str(case["num_partitions"]),
            "--partition.shards_per_client",
            "null" if s is None else str(s),
            "--partition.shard_size",
            "null" if size is None else str(size),
            "--partition.keep_incomplete_shard",
            str(case["keep_incomplete_shard"]).lower(),
            "--partition.seed",
            str(case["seed"]),
        ]
    if case["partitioner"] == "pathological":
        return out + [
            "--partition.scheme",
            "pathological",
            "--partition.num_clients",
            str(case["num_partitions"]),
            "--partition.classes_per_client",
            str(case["num_classes_per_partition"]),
            "--partition.class_assignment",
            case["class_assignment_mode"],
            "--partition.seed",
            str(case["seed"]),
        ]
    values = np.unique(_column(case, case["partition_by"])).size  # NaturalIdPartitioner: one partition per value
    return out + ["--partition.scheme", "natural", "--partition.by", case["partition_by"], "--partition.num_clients", str(values)]


def test_the_fixture_was_made_by_flwr_datasets_and_covers_every_partitioner():
    assert FIXTURE["versions"]["flwr_datasets"] == "0.6.1"
    kinds = {(c["partitioner"], c.get("self_balancing"), c["shuffle_seed"] is None, "redraws" in c, "error" in c) for c in CASES}
    for needed in [
        ("dirichlet", False, True, False, False),
        ("dirichlet", True, True, False, False),
        ("dirichlet", False, False, True, False),
        ("dirichlet", True, True, True, False),
        ("dirichlet", False, True, False, True),
        ("iid", None, True, False, False),
        ("iid", None, False, False, False),
        ("natural_id", None, False, False, False),
        ("shard", None, True, False, False),
        ("shard", None, False, False, False),
        ("shard", None, True, False, True),
        ("pathological", None, True, False, False),
        ("pathological", None, False, False, False),
        ("pathological", None, True, False, True),
    ]:
        assert needed in kinds, needed
    modes = {c["class_assignment_mode"] for c in CASES if c["partitioner"] == "pathological"}
    assert modes == {"random", "deterministic", "first-deterministic"}
    left_out = [c for c in CASES if "partitions" in c and sum(map(len, c["partitions"])) < len(_column(c, "label"))]
    assert {c["partitioner"] for c in left_out} == {"shard", "pathological"}  # rows in no partition, as Flower
    assert (REPO / "tests" / "data" / "fixtures" / "flower_partitions.json").stat().st_size < 200_000


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_config_convention_flower_equals_flwr_datasets(case):
    """The whole path a run takes (config -> partition_for) gives Flower's partitions, in our row indices."""
    cfg = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), _overrides(case))
    labels = _column(case, "label")
    if "error" in case:  # Flower refuses (dirichlet: "The max number of attempts (10) was reached.")
        words = {
            "dirichlet": "after 10 re-draws",
            "shard": r"only 6 shards of 100 rows for 10 clients",
            "pathological": "8 classes per client, but the column has 7 distinct values",
        }
        with pytest.raises(UsageError, match=words[case["partitioner"]]):
            partition_for(cfg, labels, lambda name: _column(case, name))
        return
    parts = partition_for(cfg, labels, lambda name: _column(case, name))
    assert [p.tolist() for p in parts] == [sorted(p) for p in case["partitions"]]
    # row_order (the clients' own test sets cut the rows in this order): the order load_partition returns them,
    # Flower's in-partition shuffle included
    ordered = partition_for(cfg, labels, lambda name: _column(case, name), row_order=True)
    assert [p.tolist() for p in ordered] == case["partitions"]


@pytest.mark.parametrize("case", [c for c in CASES if c["shuffle_seed"] is None and "error" not in c], ids=_case_id)
def test_the_functions_equal_flwr_datasets_partitioners(case):
    """Without FederatedDataset's shuffle each function alone is the partitioner (partition k is Flower's k)."""
    theirs = [sorted(p) for p in case["partitions"]]
    if case["partitioner"] == "dirichlet":
        ours = flower_dirichlet_partition(
            _column(case, "label"),
            case["num_partitions"],
            case["alpha"],
            seed=case["seed"],
            min_partition_size=case["min_partition_size"],
            self_balancing=case["self_balancing"],
        )
    elif case["partitioner"] == "iid":
        ours = flower_iid_partition(len(_column(case, "label")), case["num_partitions"])
        assert case["partitions"] == theirs  # IidPartitioner keeps the rows' order: contiguous blocks
    elif case["partitioner"] == "shard":
        ours = flower_shard_partition(
            _column(case, "label"),
            case["num_partitions"],
            case["num_shards_per_partition"],
            seed=case["seed"],
            shard_size=case["shard_size"],
            keep_incomplete_shard=case["keep_incomplete_shard"],
        )
    elif case["partitioner"] == "pathological":
        ours = flower_pathological_partition(
            _column(case, "label"),
            case["num_partitions"],
            case["num_classes_per_partition"],
            seed=case["seed"],
            class_assignment=case["class_assignment_mode"],
        )
    else:
        writers = _column(case, case["partition_by"])
        ours = natural_partition(writers, np.unique(writers).size)
    assert [p.tolist() for p in ours] == theirs


def test_preshuffle_is_federated_datasets_shuffle():
    """An IID case after FederatedDataset(shuffle=True, seed=s): its blocks, in order, are the permutation."""
    for case in [c for c in CASES if c["partitioner"] == "iid" and c["shuffle_seed"] is not None]:
        n = len(_column(case, "label"))
        flat = [i for part in case["partitions"] for i in part]
        assert flat == flower_preshuffle(n, case["shuffle_seed"]).tolist()


def test_iid_and_preshuffle_match_the_installed_datasets():
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"i": list(range(103))})
    assert [p.tolist() for p in flower_iid_partition(103, 10)] == [
        table.shard(num_shards=10, index=k, contiguous=True)["i"][:] for k in range(10)
    ]
    np.testing.assert_array_equal(flower_preshuffle(103, 42), table.shuffle(seed=42)["i"][:])


def test_config_errors_of_the_flower_convention():
    with pytest.raises(ConfigError, match="partition.convention='flower'"):
        load_config(
            str(CONF / "fedcgs_digits_tiny.yaml"),
            ["--partition.convention", "flower", "--partition.scheme", "file", "--partition.path", "p.json"],
        )
    with pytest.raises(ConfigError, match=r"partition.shard_size=30 is not allowed.*unless partition.convention is"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.scheme", "shards", "--partition.shard_size", "30"])
    with pytest.raises(ConfigError, match=r"partition.shards_per_client=None is not allowed"):
        load_config(
            str(CONF / "fedcgs_digits_tiny.yaml"),
            ["--partition.convention", "flower", "--partition.scheme", "shards", "--partition.shards_per_client", "null"],
        )
    with pytest.raises(ConfigError, match="partition.flower_shuffle_seed=1"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.flower_shuffle_seed", "1"])
    with pytest.raises(ConfigError, match=r"data.num_samples=200.*Flower partitions the whole training split"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.convention", "flower", "--data.num_samples", "200"])
    with pytest.raises(ConfigError, match=r"data.test_split=None.*carves a test set out of the training split"):
        load_config(
            str(CONF / "fedcgs_digits_tiny.yaml"),
            ["--partition.convention", "flower", "--data.name", "hf", "--data.path", "some/set", "--data.test_split", "null"],
        )


def test_a_flower_partition_json_is_read_back(tmp_path):
    """A Flower user's dump ``[partitioner._partition_id_to_indices[k] for k]`` (shuffled within clients)."""
    case = next(c for c in CASES if c["partitioner"] == "dirichlet" and c["shuffle_seed"] is None and "error" not in c)
    n = len(_column(case, "label"))
    assert case["partitions"] != [sorted(p) for p in case["partitions"]]  # Flower's order inside a partition
    (tmp_path / "flower.json").write_text(json.dumps(case["partitions"]))
    parts = read_partition_json(tmp_path / "flower.json", n)
    assert [p.tolist() for p in parts] == [sorted(p) for p in case["partitions"]]
    write_partition_json(parts, tmp_path / "ours.json")
    assert [p.tolist() for p in read_partition_json(tmp_path / "ours.json", n)] == [p.tolist() for p in parts]


@pytest.mark.slow  # two runs each, ~15 s
@pytest.mark.parametrize(
    "extra",
    [
        [
            "--partition.convention",
            "flower",
            "--partition.scheme",
            "shards",
            "--partition.num_clients",
            "7",
            "--partition.shards_per_client",
            "3",
            "--partition.seed",
            "42",
            "--partition.flower_shuffle_seed",
            "42",
        ],
        ["--partition.scheme", "pathological", "--partition.num_clients", "4", "--partition.classes_per_client", "1"],
    ],
    ids=["flower shards", "pathological"],
)
def test_a_run_on_a_partition_that_leaves_rows_out(extra, tmp_path):
    """A run whose clients hold part of the training split (as Flower's would): it trains on their union, and its
    partition.json records the rows left out and serves as a scheme-file partition."""
    from tests.conftest import run_cli

    proc = run_cli(
        "--config",
        str(CONF / "fedcgs_digits_tiny.yaml"),
        "--output_dir",
        str(tmp_path / "runs"),
        "--logging.progress",
        "false",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (d.parent for d in (tmp_path / "runs").glob("*/summary.json"))
    doc = json.loads((run / "partition.json").read_text())
    held = sum(map(len, doc["clients"]))
    assert doc["unassigned"] > 0 and held + doc["unassigned"] == doc["num_samples"]
    again = run_cli(
        "--config",
        str(CONF / "fedcgs_digits_tiny.yaml"),
        "--output_dir",
        str(tmp_path / "again"),
        "--logging.progress",
        "false",
        "--partition.scheme",
        "file",
        "--partition.path",
        str(run / "partition.json"),
        "--partition.num_clients",
        str(len(doc["clients"])),
    )
    assert again.returncode == 0, again.stderr[-3000:]
    (rerun,) = (d.parent for d in (tmp_path / "again").glob("*/summary.json"))
    assert (
        json.loads((rerun / "summary.json").read_text())["accuracy"] == json.loads((run / "summary.json").read_text())["accuracy"]
    )
