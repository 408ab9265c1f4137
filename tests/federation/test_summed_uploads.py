"""Uploads folded where they are made: contiguous blocks in client order, a fold carried from rank to rank that gives
the floats of one fold over every client, over gloo ranks too, and a rank failing in it ending every rank."""

from __future__ import annotations

import itertools
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from fl_lightning.algorithms.gptfl import FullFedAvg
from fl_lightning.federation.aggregate import WeightedMean
from fl_lightning.federation.ranks import collectives
from fl_lightning.federation.ranks.collectives import RankFailure, RankStopped, everyone
from fl_lightning.federation.ranks.placement import deal_in_order
from fl_lightning.federation.ranks.summed_uploads import FoldedUploads, UploadFold, UploadSum, carry_fold, summed_mean
from fl_lightning.federation.transport import Upload
from tests.gloo_ranks import GlooFabric, run_ranks

SUM = UploadSum(("backbone.", "head."))


def _best_bound(loads: list[int], world: int) -> int:
    """The smallest largest block over every way to cut ``loads`` into at most ``world`` contiguous blocks."""
    best = sum(loads)
    for cuts in itertools.combinations(range(1, len(loads)), min(world - 1, len(loads) - 1)):
        edges = (0, *cuts, len(loads))
        best = min(best, max(sum(loads[a:b]) for a, b in zip(edges, edges[1:])))
    return best


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_blocks_are_contiguous_in_order_and_as_balanced_as_any(world):
    g = torch.Generator().manual_seed(world)
    for _ in range(30):
        sizes = torch.randint(0, 50, (9,), generator=g).tolist()
        clients = sorted(torch.randperm(9, generator=g)[: int(torch.randint(1, 9, (1,), generator=g))].tolist())
        blocks = deal_in_order(clients, sizes, world)
        assert len(blocks) == world and [c for b in blocks for c in b] == clients  # in order, every client once
        assert max(sum(sizes[c] for c in b) for b in blocks) == _best_bound([sizes[c] for c in clients], world)
        assert blocks == deal_in_order(clients, sizes, world)
    assert deal_in_order([], [], 3) == [[], [], []]
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        deal_in_order([0], [1], 0)


def _uploads(n: int, seed: int = 0) -> dict[int, Upload]:
    g = torch.Generator().manual_seed(seed)
    ups = {}
    for c in range(n):
        tensors = {
            "backbone.w": torch.randn(64, 300, generator=g),  # a large key (the fold's scratch path)
            "backbone.count": torch.randint(0, 9, (3,), generator=g),  # an integer buffer
            "head.b": torch.randn(5, generator=g) * 10 ** float(c),  # magnitudes that make the order matter
            "contribution": torch.randn(2, generator=g),  # not summed: travels with the record
        }
        if c % 3 == 1:
            del tensors["head.b"]  # a key only some uploads hold
        ups[c] = Upload(tensors, {"num_samples": int(torch.randint(1, 40, (1,), generator=g))})
    return ups


def _carried(ups: dict[int, Upload], blocks: list[list[int]]) -> FoldedUploads:
    """The fold of ``blocks`` carried as the ranks carry it (each fold's parts to the next), in one process."""
    folds = [UploadFold(SUM, torch.device("cpu"), starts=r == 0) for r in range(len(blocks))]
    rests = {c: folds[r].add(ups[c]) for r, block in enumerate(blocks) for c in block}
    carried = folds[0].mean
    for fold in folds[1:]:
        header, sums, total = carried.parts()
        carried = fold.fold_onto(WeightedMean.carried(header, {k: v.clone() for k, v in sums.items()}, total))
    return FoldedUploads(rests, carried)


def test_a_carried_fold_is_the_one_fold_bit_for_bit():
    ups = _uploads(7)
    stage = FullFedAvg.__new__(FullFedAvg)  # the aggregation needs no model
    whole = stage.fold(1, {}, ups)
    for blocks in ([[0, 1, 2, 3, 4, 5, 6]], [[0, 1], [2, 3, 4], [5, 6]], [[], [0], [], [1, 2, 3, 4, 5, 6]]):
        folded = _carried(ups, blocks)
        new = stage.fold(1, {}, folded)
        assert new.keys() == whole.keys() == {"backbone.w", "backbone.count", "head.b"}
        for k in whole:
            assert torch.equal(new[k], whole[k]) and new[k].dtype == whole[k].dtype, (blocks, k)
        for c, up in ups.items():  # the traffic is the upload's, the unsummed tensors and the meta travel
            assert folded[c].num_bytes == up.num_bytes and folded[c].meta == up.meta
            assert folded[c].tensors.keys() == {"contribution"}
    # one left fold in client order, not a sum of the ranks' own sums: (1 + 1e20) − 1e20 = 0 where 1 + (1e20 − 1e20) = 1
    big = {c: Upload({"head.b": torch.tensor([v])}, {"num_samples": 1}) for c, v in enumerate((1.0, 1e20, -1e20))}
    assert stage.fold(1, {}, _carried(big, [[0], [1, 2]]))["head.b"].item() == 0.0


def test_a_rank_that_holds_its_uploads_copies_them_off_the_module():
    """A held upload may alias the parameters the next client trains in place: the fold keeps a copy."""
    weight = torch.ones(3)
    fold = UploadFold(SUM, torch.device("cpu"), starts=False)
    fold.add(Upload({"backbone.w": weight}, {"num_samples": 2}))
    weight.add_(5.0)
    assert torch.equal(fold.fold_onto(WeightedMean()).result()["backbone.w"], torch.ones(3))


# -- over gloo ranks -----------------------------------------------------------------------------------------------
def _worker(rank: int, world: int, port: int, out: str, blocks: list[list[int]], failing: int | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    collectives._LEADER_EXIT_GRACE_S = 0.0
    fabric, ups, result = GlooFabric(rank, world), _uploads(7), {}
    fold = UploadFold(SUM, fabric.device, starts=rank == 0)
    for c in blocks[rank]:
        fold.add(ups[c])
    if rank == failing:
        fold.fold_onto = lambda carried: (_ for _ in ()).throw(MemoryError("out of memory in the fold"))
    path = [0, *(r for r, b in enumerate(blocks) if r and b)]
    try:
        total = everyone(
            fabric, lambda: carry_fold(fabric, fold, path, what="the fold", timeout_s=60.0), what="the fold", timeout_s=60.0
        )
        result["total"] = None if total is None else total.result()
    except (RankFailure, RankStopped) as err:
        result["error"] = (type(err).__name__, str(getattr(err, "message", err)))
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.destroy_process_group()


@pytest.mark.slow  # four spawned processes, then three
def test_ranks_carry_the_fold_to_rank0_as_one_fold_and_a_failing_link_ends_every_rank(tmp_path):
    # rank 0 has no client this round (it starts the fold empty), rank 2 neither (not on the path)
    blocks = [[], [0, 1], [], [2, 3, 4, 5, 6]]
    whole = summed_mean(_uploads(7), SUM).result()
    (tmp_path / "ok").mkdir()
    zero, *others = run_ranks(_worker, 4, tmp_path / "ok", blocks, None)
    assert "error" not in zero and others == [{"total": None}] * 3, (zero, others)
    for k in whole:
        assert torch.equal(zero["total"][k], whole[k]), k
    (tmp_path / "fails").mkdir()
    zero, one, two = run_ranks(_worker, 3, tmp_path / "fails", [[0], [1, 2], [3, 4, 5, 6]], 1)
    assert zero["error"][0] == "RankFailure" and "rank 1" in zero["error"][1] and "out of memory" in zero["error"][1], zero
    assert one["error"][0] == two["error"][0] == "RankStopped", (one, two)
