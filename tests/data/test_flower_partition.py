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

from fl_lightning.config import load_config
from fl_lightning.data.flower_partition import flower_dirichlet_partition, flower_iid_partition, flower_preshuffle
from fl_lightning.data.partition import natural_partition, read_partition_json, write_partition_json
from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.simulation import partition_for
from tests.conftest import CONF, REPO

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "flower_partitions.json").read_text())
CASES = FIXTURE["cases"]


def _case_id(case: dict) -> str:
    keys = ("num_partitions", "alpha", "min_partition_size", "self_balancing", "seed", "shuffle_seed")
    return "-".join([case["partitioner"], case["data"]] + [f"{k}={case[k]}" for k in keys if k in case])


def _column(case: dict, name: str) -> np.ndarray:
    return np.asarray(FIXTURE["data"][case["data"]][name])


def _overrides(case: dict) -> list[str]:
    """The config that says what the case's Flower code says (docs/data_and_weights.md, the table)."""
    shuffle = case["shuffle_seed"]
    out = ["--partition.convention", "flower",
           "--partition.flower_shuffle_seed", "null" if shuffle is None else str(shuffle)]
    if case["partitioner"] == "dirichlet":
        return out + ["--partition.scheme", "dirichlet", "--partition.num_clients", str(case["num_partitions"]),
                      "--partition.alpha", str(case["alpha"]), "--partition.min_samples", str(case["min_partition_size"]),
                      "--partition.balance", str(case["self_balancing"]).lower(), "--partition.seed", str(case["seed"])]
    if case["partitioner"] == "iid":
        return out + ["--partition.scheme", "iid", "--partition.num_clients", str(case["num_partitions"])]
    values = np.unique(_column(case, case["partition_by"])).size  # NaturalIdPartitioner: one partition per value
    return out + ["--partition.scheme", "natural", "--partition.by", case["partition_by"],
                  "--partition.num_clients", str(values)]


def test_the_fixture_was_made_by_flwr_datasets_and_covers_every_partitioner():
    assert FIXTURE["versions"]["flwr_datasets"] == "0.6.1"
    kinds = {(c["partitioner"], c.get("self_balancing"), c["shuffle_seed"] is None, "redraws" in c, "error" in c)
             for c in CASES}
    for needed in [("dirichlet", False, True, False, False), ("dirichlet", True, True, False, False),
                   ("dirichlet", False, False, True, False), ("dirichlet", True, True, True, False),
                   ("dirichlet", False, True, False, True), ("iid", None, True, False, False),
                   ("iid", None, False, False, False), ("natural_id", None, False, False, False)]:
        assert needed in kinds, needed
    assert (REPO / "tests" / "data" / "fixtures" / "flower_partitions.json").stat().st_size < 200_000


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_config_convention_flower_equals_flwr_datasets(case):
    """The whole path a run takes (config -> partition_for) gives Flower's partitions, in our row indices."""
    cfg = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), _overrides(case))
    labels = _column(case, "label")
    if "error" in case:  # Flower: "The max number of attempts (10) was reached."
        with pytest.raises(UsageError, match="after 10 re-draws"):
            partition_for(cfg, labels, lambda name: _column(case, name))
        return
    parts = partition_for(cfg, labels, lambda name: _column(case, name))
    assert [p.tolist() for p in parts] == [sorted(p) for p in case["partitions"]]


@pytest.mark.parametrize("case", [c for c in CASES if c["shuffle_seed"] is None and "error" not in c], ids=_case_id)
def test_the_functions_equal_flwr_datasets_partitioners(case):
    """Without FederatedDataset's shuffle each function alone is the partitioner (partition k is Flower's k)."""
    theirs = [sorted(p) for p in case["partitions"]]
    if case["partitioner"] == "dirichlet":
        ours = flower_dirichlet_partition(_column(case, "label"), case["num_partitions"], case["alpha"],
                                          seed=case["seed"], min_partition_size=case["min_partition_size"],
                                          self_balancing=case["self_balancing"])
    elif case["partitioner"] == "iid":
        ours = flower_iid_partition(len(_column(case, "label")), case["num_partitions"])
        assert case["partitions"] == theirs  # IidPartitioner keeps the rows' order: contiguous blocks
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
        table.shard(num_shards=10, index=k, contiguous=True)["i"][:] for k in range(10)]
    np.testing.assert_array_equal(flower_preshuffle(103, 42), table.shuffle(seed=42)["i"][:])


def test_config_errors_of_the_flower_convention():
    with pytest.raises(ConfigError, match="partition.convention='flower'"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.convention", "flower",
                                                            "--partition.scheme", "shards"])
    with pytest.raises(ConfigError, match="partition.flower_shuffle_seed=1"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.flower_shuffle_seed", "1"])
    with pytest.raises(ConfigError, match=r"data.num_samples=200.*Flower partitions the whole training split"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.convention", "flower",
                                                            "--data.num_samples", "200"])
    with pytest.raises(ConfigError, match=r"data.test_split=None.*carves a test set out of the training split"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.convention", "flower", "--data.name", "hf",
                                                            "--data.path", "some/set", "--data.test_split", "null"])


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
