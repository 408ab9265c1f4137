"""partition.convention: flower gives flwr-datasets' partitions index for index.

Against flwr-datasets itself when it is installed (the optional extra ``flower``), and always against a
line-by-line transcription of its DirichletPartitioner loop (flwr_datasets/partitioner/dirichlet_partitioner.py,
0.6.1) and against ``datasets.Dataset.shuffle`` / ``shard`` for FederatedDataset's shuffle and IidPartitioner."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.config import load_config
from fl_lightning.data.flower_partition import flower_dirichlet_partition, flower_iid_partition, flower_preshuffle
from fl_lightning.data.partition import natural_partition, read_partition_json, write_partition_json
from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.simulation import partition_for
from tests.conftest import CONF

CASES = [  # (num_clients, alpha, min_partition_size, self_balancing, seed)
    (5, 0.5, 10, False, 42), (8, 0.1, 0, False, 0), (6, 1.0, 5, True, 7), (10, 0.3, 2, True, 42),
]


def _labels(n: int = 600, classes: int = 7, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


def _flower_reference(targets, num_partitions, alpha, min_partition_size, self_balancing, seed):
    """DirichletPartitioner._determine_partition_id_to_indices_if_needed, transcribed (dicts and lists kept)."""
    rng = np.random.default_rng(seed=seed)
    alpha = np.array([float(alpha)], dtype=float).repeat(num_partitions)
    unique_classes = sorted(set(targets.tolist()))
    avg = len(targets) / num_partitions
    sampling_try = 0
    while True:
        pid_to_indices = {nid: [] for nid in range(num_partitions)}
        for k in unique_classes:
            idx_k = np.nonzero(targets == k)[0]
            props = rng.dirichlet(alpha)
            nid_to_prop = {nid: props[nid] for nid in range(num_partitions)}
            if self_balancing:
                for nid in nid_to_prop.copy():
                    if len(pid_to_indices[nid]) > avg:
                        nid_to_prop[nid] = 0
                total = sum(nid_to_prop.values())
                for nid, prop in nid_to_prop.copy().items():
                    nid_to_prop[nid] = prop / total
            cuts = (np.cumsum(list(nid_to_prop.values())) * len(idx_k)).astype(int)[:-1]
            for nid, piece in enumerate(np.split(idx_k, cuts)):
                pid_to_indices[nid].extend(piece.tolist())
        if min(len(v) for v in pid_to_indices.values()) >= min_partition_size:
            break
        if sampling_try == 10:
            raise ValueError("The max number of attempts (10) was reached.")
        sampling_try += 1
    return [sorted(pid_to_indices[k]) for k in range(num_partitions)]


@pytest.mark.parametrize("k, alpha, min_size, balance, seed", CASES)
def test_dirichlet_matches_the_transcribed_flower_loop(k, alpha, min_size, balance, seed):
    labels = _labels()
    ours = flower_dirichlet_partition(labels, k, alpha, seed=seed, min_partition_size=min_size,
                                      self_balancing=balance)
    assert [p.tolist() for p in ours] == _flower_reference(labels, k, alpha, min_size, balance, seed)


def test_dirichlet_gives_up_after_flowers_ten_retries():
    with pytest.raises(UsageError, match="after 10 re-draws"):
        flower_dirichlet_partition(_labels(60, 3), 20, 0.01, seed=0, min_partition_size=3)


def test_iid_and_preshuffle_match_datasets():
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"i": list(range(103))})
    assert [p.tolist() for p in flower_iid_partition(103, 10)] == [
        table.shard(num_shards=10, index=k, contiguous=True)["i"][:] for k in range(10)]
    np.testing.assert_array_equal(flower_preshuffle(103, 42), table.shuffle(seed=42)["i"][:])


def test_config_convention_flower_with_federated_dataset_shuffle():
    labels = _labels(300)
    cfg = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), [
        "--partition.convention", "flower", "--partition.num_clients", "6", "--partition.alpha", "0.5",
        "--partition.min_samples", "10", "--partition.seed", "42", "--partition.flower_shuffle_seed", "42"])
    parts = partition_for(cfg, labels)
    order = flower_preshuffle(300, 42)  # row i of Flower's shuffled split is our row order[i]
    expected = _flower_reference(labels[order], 6, 0.5, 10, False, 42)
    assert [p.tolist() for p in parts] == [sorted(order[e].tolist()) for e in expected]
    with pytest.raises(ConfigError, match="partition.convention='flower'"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.convention", "flower",
                                                            "--partition.scheme", "shards"])
    with pytest.raises(ConfigError, match="partition.flower_shuffle_seed=1"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.flower_shuffle_seed", "1"])


def test_a_flower_partition_json_is_read_back(tmp_path):
    """A Flower user's dump ``[partitioner._partition_id_to_indices[k] for k]`` (shuffled within clients)."""
    import json

    labels = _labels(200)
    dump = [list(reversed(p)) for p in _flower_reference(labels, 4, 0.5, 1, False, 42)]
    (tmp_path / "flower.json").write_text(json.dumps(dump))
    parts = read_partition_json(tmp_path / "flower.json", 200)
    assert [p.tolist() for p in parts] == _flower_reference(labels, 4, 0.5, 1, False, 42)
    write_partition_json(parts, tmp_path / "ours.json")
    assert [p.tolist() for p in read_partition_json(tmp_path / "ours.json", 200)] == [p.tolist() for p in parts]


# ---------------------------------------------------------------------------------- flwr-datasets itself
def _table(labels, writers=None):
    datasets = pytest.importorskip("datasets")
    columns = {"label": labels.tolist()}
    if writers is not None:
        columns["writer"] = writers.tolist()
    return datasets.Dataset.from_dict(columns)


@pytest.mark.parametrize("k, alpha, min_size, balance, seed", CASES)
def test_dirichlet_equals_flwr_datasets(k, alpha, min_size, balance, seed):
    partitioner_module = pytest.importorskip("flwr_datasets.partitioner")
    labels = _labels()
    p = partitioner_module.DirichletPartitioner(num_partitions=k, partition_by="label", alpha=alpha,
                                                min_partition_size=min_size, self_balancing=balance, seed=seed)
    p.dataset = _table(labels)
    p.load_partition(0)
    theirs = [sorted(p._partition_id_to_indices[i]) for i in range(k)]
    ours = flower_dirichlet_partition(labels, k, alpha, seed=seed, min_partition_size=min_size, self_balancing=balance)
    assert [q.tolist() for q in ours] == theirs


def test_iid_and_natural_id_equal_flwr_datasets():
    partitioner_module = pytest.importorskip("flwr_datasets.partitioner")
    labels = _labels(97)
    writers = np.array([f"w{(5 * i) % 13:02d}" for i in range(97)])
    table = _table(labels, writers)
    iid = partitioner_module.IidPartitioner(num_partitions=7)
    iid.dataset = table.add_column("row", list(range(97)))
    assert [iid.load_partition(k)["row"][:] for k in range(7)] == [q.tolist() for q in flower_iid_partition(97, 7)]
    natural = partitioner_module.NaturalIdPartitioner(partition_by="writer")
    natural.dataset = table
    natural.load_partition(0)
    theirs = [sorted(natural._partition_id_to_indices[k]) for k in range(natural.num_partitions)]
    assert [q.tolist() for q in natural_partition(writers, 13)] == theirs
