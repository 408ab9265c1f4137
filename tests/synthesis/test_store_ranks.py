"""The synthetic images' store built by every rank of a shared server phase (``build_stores(ranks=)``): each rank
decodes its block of rows once, the store is the one-rank store byte for byte, a failure on any rank ends both with
nothing left behind, and a block that is not what its rank wrote is refused in one line."""

from __future__ import annotations

import errno
import os
import shutil
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from fl_lightning.federation.ranks.collectives import Ranks, RankStopped
from fl_lightning.federation.storage import checkpoint
from fl_lightning.synthesis import store
from fl_lightning.synthesis.store import STORE_DIR, build_stores, split_transform
from tests.gloo_ranks import report, run_ranks
from tests.run_records import GlooFabric
from tests.synthesis.test_store import _folder, _transforms

pytestmark = pytest.mark.slow  # two spawned processes per case: in CI's every-file pass, not the plain suite


def _heads():
    train, val = _transforms(32)
    return [split_transform(train).head, split_transform(val).head]  # the generated size, and 32 px


def _worker(rank: int, world: int, port: int, out: str, case: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    ranks = Ranks(GlooFabric(rank, world), 60.0)
    decoded: list[str] = []
    real_decode = store._decode
    store._decode = lambda path: (decoded.append(path.name), real_decode(path))[1]
    if case == "lost" and rank == 1:  # a file system that lost this rank's pages: its digests no longer match
        real_fill = store._fill
        store._fill = lambda *a: (lambda p, d, r: (p, {k: "0" * 64 for k in d}, r))(*real_fill(*a))
    if case == "full" and rank == 0:  # no room for the store rank 0 reserves

        def no_room(fd, offset, length):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        checkpoint.os.posix_fallocate = no_room
    result: dict = {}
    try:
        result["paths"] = [str(p) for p in build_stores(Path(out) / "folder", _heads(), ranks)]
    except (Exception, RankStopped) as err:  # noqa: BLE001 — what each rank ends with is the result
        result["error"] = (type(err).__name__, str(getattr(err, "message", err)))
    result["decoded"] = decoded
    report(out, rank, result)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / STORE_DIR).glob("*.tmp"))


def test_two_ranks_build_the_one_rank_store_each_decoding_its_block_once(tmp_path):
    folder = _folder(tmp_path / "folder", n=13)
    results = run_ranks(_worker, 2, tmp_path, "build")
    assert results[0]["paths"] == results[1]["paths"] and "error" not in results[0]
    blocks = [sorted(r["decoded"]) for r in results]
    assert blocks[1] == [f"{i:05d}.png" for i in range(6, 13)]  # rows [13·1/2, 13): once each
    assert sorted(blocks[0]) == sorted([f"{i:05d}.png" for i in range(6)] + ["00000.png"])  # + the first, to size
    together = {p: np.load(p) for p in results[0]["paths"]}
    records = {p: Path(p).with_suffix(".json").read_text() for p in together}
    shutil.rmtree(folder / STORE_DIR)
    alone = build_stores(folder, _heads())
    assert [str(p) for p in alone] == results[0]["paths"]
    for path in alone:
        assert np.array_equal(np.load(path), together[str(path)]) and path.with_suffix(".json").read_text() == records[str(path)]
    assert not _leftovers(folder)


def test_a_rank_that_cannot_decode_its_block_ends_both_and_leaves_nothing(tmp_path):
    folder = _folder(tmp_path / "folder", n=13)
    bad = next(folder.rglob("00009.png"))  # in rank 1's block
    bad.write_bytes(b"not a png")
    results = run_ranks(_worker, 2, tmp_path, "fails")
    (kind0, line0), (kind1, _) = results[0]["error"], results[1]["error"]
    assert kind0 in ("RankFailure", "RankUsageError") and "rank 1" in line0 and kind1 == "RankStopped"
    assert "\n" not in line0
    assert not _leftovers(folder) and not list((folder / STORE_DIR).glob("*.npy"))


def test_a_block_that_is_not_what_its_rank_wrote_is_refused_in_one_line(tmp_path):
    folder = _folder(tmp_path / "folder", n=13)
    results = run_ranks(_worker, 2, tmp_path, "lost")
    kind, line = results[0]["error"]
    assert kind == "RuntimeError" and "not what rank 1 wrote" in line and "\n" not in line
    assert results[1]["error"][0] == "RankStopped"
    assert not _leftovers(folder) and not list((folder / STORE_DIR).glob("*.npy"))


def test_a_full_disk_on_rank_0_while_the_store_is_reserved_ends_both_in_one_line(tmp_path):
    folder = _folder(tmp_path / "folder", n=13)
    results = run_ranks(_worker, 2, tmp_path, "full")
    kind, line = results[0]["error"]
    assert kind == "DiskFullError" and line.startswith("disk full:") and "\n" not in line
    assert results[1]["error"][0] == "RankStopped" and results[1]["decoded"] == []  # nothing decoded for nothing
    assert not list((folder / STORE_DIR).iterdir())
