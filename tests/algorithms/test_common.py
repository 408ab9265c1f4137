"""The shared helpers split over ranks: evaluation and frozen-feature tables on 2 gloo processes equal one rank."""

import contextlib
import os
import pickle
import socket
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import Subset, TensorDataset

from fl_lightning.algorithms.common import FrozenFeatures, evaluate_on_test, evaluate_on_test_features, rank_rows
from fl_lightning.data.feature_cache import FeatureCache, split_features
from fl_lightning.federation.algorithm import Environment
from fl_lightning.federation.ranks import collectives
from fl_lightning.federation.ranks.collectives import RankFailure, RankStopped, everyone
from fl_lightning.modules.evaluation import evaluate_classifier
from fl_lightning.modules.federated_evaluation import federated_scores, row_outcomes

ROWS, BATCH, CLASSES, DIM = 37, 8, 5, 6  # 5 batches, the last one short: blocks of 2 and 3 batches on 2 ranks


@pytest.mark.parametrize("rows,batch,world", [(37, 8, 2), (37, 8, 4), (8, 8, 3), (100, 7, 5), (1, 4, 2)])
def test_rank_rows_are_whole_batches_in_order_covering_the_split(rows, batch, world):
    blocks = [rank_rows(rows, batch, r, world) for r in range(world)]
    assert [i for b in blocks for i in b] == list(range(rows))
    assert all(b.start % batch == 0 for b in blocks if len(b))


class _Fabric:
    """The few Fabric calls the helpers and collectives make, over an initialised gloo group."""

    device = torch.device("cpu")
    strategy = SimpleNamespace(precision=SimpleNamespace(precision="32-true"))  # what the precision helpers read

    def __init__(self, rank: int, world: int) -> None:
        self.global_rank, self.world_size = rank, world

    def autocast(self):
        return contextlib.nullcontext()

    def broadcast(self, obj, src=0):
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]


def _data():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(ROWS, 3, 4, 4, generator=g), torch.randint(0, CLASSES, (ROWS,), generator=g)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, DIM))
    torch.nn.init.normal_(model[1].weight, generator=g)
    torch.nn.init.normal_(model[1].bias, generator=g)
    return TensorDataset(x, y), y, model.eval()


CLIENT_TEST = [list(range(0, 9)), list(range(9, 30)), list(range(30, 37))]  # three clients' own test rows (of train)


def _env(fabric, cache_dir, client_test=None):
    dataset, y, _ = _data()
    cfg = SimpleNamespace(
        data=SimpleNamespace(
            batch_size=BATCH,
            num_workers=0,
            pin_memory="auto",
            persistent_workers="auto",
            normalize_on_device="auto",
            feature_cache=cache_dir,
        ),
        federation=SimpleNamespace(collective_timeout_s=60.0, devices=1),
    )
    splits = SimpleNamespace(
        train=dataset, test=dataset, test_targets=y.numpy(), train_targets=y.numpy(), classes=[str(c) for c in range(CLASSES)]
    )
    env = Environment(fabric, cfg, splits, [], Path("."), shared=True)
    env.client_test = None if client_test is None else [np.asarray(rows) for rows in client_test]
    return env


class _Tables(FrozenFeatures):
    """FrozenFeatures with a fixed key (its own key needs a whole run's config)."""

    def __init__(self, env, backbone, folder):
        self.algorithm, self.backbone, self.cache = SimpleNamespace(env=env), backbone, FeatureCache(folder)

    def key(self, split):
        return f"k-{split}"


def _head(h):
    return h[:, :CLASSES] * 3.0


def _worker(rank, world, port, out, case):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    fabric = _Fabric(rank, world)
    _, _, model = _data()
    result = {}
    try:
        if case == "shared":
            for name, folder in (("plain", None), ("cached", Path(out) / "cache")):
                env = _env(fabric, folder)
                table = _Tables(env, model, folder)
                result[name, "train"] = table.table("train", all_ranks=True)
                result[name, "again"] = _Tables(env, model, folder).table("train", all_ranks=True)  # cached: a hit
                result[name, "test"] = table.table("test", all_ranks=False)  # env.shared: every rank together
                result[name, "eval"] = evaluate_on_test(env, lambda x: _head(model(x)))
                result[name, "eval_features"] = evaluate_on_test_features(env, result[name, "test"], _head)
            env = _env(fabric, None, CLIENT_TEST)  # the clients' test rows: each rank its block of their batches
            seen = []
            result["fed"] = evaluate_on_test(env, lambda x: (seen.append(len(x)), _head(model(x)))[1])
            result["rows_seen"] = sum(seen)
            result["fed_features"] = evaluate_on_test_features(env, result["plain", "test"], _head, result["plain", "train"])
        else:  # "fails": rank 1 fails inside the shared helper, then outside it (before the round's end exchange)
            collectives._LEADER_EXIT_GRACE_S = 0.0  # rank 0 goes on to the next case: rank 1 need not wait for it
            env = _env(fabric, None)

            def logits(x):
                if rank == 1:
                    raise ValueError("bad batch")
                return _head(model(x))

            def step():
                if rank == 1:
                    raise ValueError("bad head")
                return evaluate_on_test(env, lambda x: _head(model(x)))

            for name, call in (
                ("inside", lambda: evaluate_on_test(env, logits)),
                ("before", lambda: everyone(fabric, step, what="the evaluation", timeout_s=60.0)),
            ):
                try:
                    call()
                except (RankFailure, RankStopped) as err:
                    result[name] = (type(err).__name__, str(getattr(err, "message", err)))
    except (RankFailure, RankStopped, ValueError) as err:
        result["error"] = (type(err).__name__, str(getattr(err, "message", err)))
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, case, world=2):
    mp.start_processes(_worker, args=(world, _free_port(), str(tmp_path), case), nprocs=world, start_method="spawn")
    return [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(world)]


def test_two_ranks_tabulate_and_evaluate_as_one(tmp_path):
    """Without and with a feature cache: the gathered tables and the split evaluation are one rank's, bit for bit."""
    torch.set_num_threads(1)
    dataset, y, model = _data()
    whole = split_features(model, dataset, batch_size=BATCH, device="cpu")
    expected = evaluate_classifier(
        lambda x: _head(model(x)),
        torch.utils.data.DataLoader(dataset, batch_size=BATCH),
        num_classes=CLASSES,
        device=torch.device("cpu"),
    )
    rows = [r for client in CLIENT_TEST for r in client]
    hits, losses = row_outcomes(
        lambda x: _head(model(x)),
        torch.utils.data.DataLoader(Subset(dataset, rows), batch_size=BATCH),
        device=torch.device("cpu"),
    )
    fed = federated_scores(hits, losses, [len(c) for c in CLIENT_TEST])
    results = _run(tmp_path, "shared")
    for result in results:
        assert "error" not in result, result
        for name in ("plain", "cached"):
            for key in ("train", "again", "test"):
                assert torch.equal(result[name, key], whole), (name, key)
            assert result[name, "eval"] == expected  # the same floats: loss, accuracy, per-class accuracy
            assert result[name, "eval_features"] == expected
        for key in ("fed", "fed_features"):  # the clients' test rows too: the floats of one process
            assert result[key] == {**expected, **fed}, key
    assert sum(r["rows_seen"] for r in results) == 2 * ROWS  # each test row and each client's row once over the ranks
    assert torch.equal(FeatureCache(tmp_path / "cache").load("k-train", rows=ROWS), whole)


def test_a_rank_failing_in_a_shared_evaluation_ends_every_rank(tmp_path):
    """Inside the shared helper (its gather carries the error) and outside it (rank 1 meets the others' gather in
    the round's end exchange): rank 0 raises one error naming rank 1, rank 1 stops quietly."""
    zero, one = _run(tmp_path, "fails")
    for case in ("inside", "before"):
        assert zero[case][0] == "RankFailure" and "rank 1" in zero[case][1], zero
        assert one[case][0] == "RankStopped" and "rank 1" in one[case][1], one
