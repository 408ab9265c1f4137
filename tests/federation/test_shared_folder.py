"""check_shared_run_folder (fl_lightning/federation/storage/shared_folder.py) on 2 CPU processes over gloo: every rank sees
the run folder rank 0 writes to, or every rank stops with one line naming the ranks and hosts that cannot.

One launch runs every case; a rank given its own folder stands for a node-local ``output_dir``. The quick
launch is two forked processes with a gloo group and the three members of Fabric the check uses (Fabric's
``broadcast`` is ``broadcast_object_list`` on its group); the slow one is ``Fabric(strategy="ddp_fork")``
itself (the ~6-10 s import of lightning, once: forked workers do not import it again).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from fl_lightning.errors import RunFolderError
from fl_lightning.federation.storage.shared_folder import SHARED_CHECK, check_shared_run_folder

WAIT_S = 1.0  # the default, 5 s, covers NFS's directory caching; a local folder needs no wait


def _every_case(fabric, root: str) -> None:
    """On each rank: the outcome of each case (None, or the error's message and how long the check took)."""
    root, rank = Path(root), fabric.global_rank
    (root / "node-local").mkdir(exist_ok=True)  # rank 1's own folder: it exists, but rank 0's token is not there
    (root / "a-file").write_text("")
    cases = {
        "shared": root / "shared",
        "split": root / "shared" if rank == 0 else root / "node-local",
        "unwritable": root / "a-file" / "run" if rank == 0 else root / "shared",
    }
    outcome = {}
    for case, run_dir in cases.items():
        start = time.monotonic()
        try:
            check_shared_run_folder(fabric, run_dir, wait_s=WAIT_S)
            error = None
        except RunFolderError as err:
            error = str(err)
        outcome[case] = {"error": error, "s": time.monotonic() - start}
    (root / f"rank{rank}.json").write_text(json.dumps(outcome))


@dataclass
class _Ranks:
    """What check_shared_run_folder uses of a launched Fabric, on a plain gloo group."""

    global_rank: int
    world_size: int

    def broadcast(self, obj, src=0):  # as lightning's DDPStrategy.broadcast
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]


def _gloo_worker(rank: int, root: str, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        _every_case(_Ranks(rank, 2), root)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(root: Path) -> tuple[Path, list[dict]]:
    return root, [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    import torch.multiprocessing as mp  # fork: the workers need not import torch again (~2 s each)

    root = tmp_path_factory.mktemp("shared_folder")
    mp.start_processes(_gloo_worker, args=(str(root), _free_port()), nprocs=2, start_method="fork")
    return _read(root)


def _check_shared(root: Path, ranks: list[dict]) -> None:
    assert [r["shared"]["error"] for r in ranks] == [None, None]
    assert max(r["shared"]["s"] for r in ranks) < WAIT_S  # seen at once: no rank waited out the retry
    assert not (root / "shared" / SHARED_CHECK).exists()  # rank 0 removed its token


def _check_split(root: Path, ranks: list[dict]) -> None:
    messages = [r["split"]["error"] for r in ranks]
    assert messages[0] is not None and messages[0] == messages[1]  # the same line on both: neither waits
    assert "\n" not in messages[0]
    host = socket.gethostname()
    assert messages[0].startswith(
        f"run folder error: rank 1 on host {host} (the token is not there; it looks in "
        f"'{root / 'node-local'}') cannot see the run folder '{root / 'shared'}' that "
        f"rank 0 (host {host}) writes to"
    )
    assert "put output_dir on a filesystem every node shares" in messages[0]


def _check_unwritable(root: Path, ranks: list[dict]) -> None:
    messages = [r["unwritable"]["error"] for r in ranks]
    assert messages[0] == messages[1] and f"'{root / 'a-file' / 'run'}' cannot be written on rank 0" in messages[0]


def test_a_shared_folder_passes_on_every_rank(outcomes):
    _check_shared(*outcomes)


def test_a_rank_with_its_own_folder_stops_every_rank_with_one_line(outcomes):
    _check_split(*outcomes)


def test_a_folder_rank_0_cannot_write_stops_every_rank(outcomes):
    _check_unwritable(*outcomes)


@pytest.mark.slow
def test_every_case_under_fabric(tmp_path):
    from lightning.fabric import Fabric

    Fabric(accelerator="cpu", devices=2, strategy="ddp_fork").launch(_every_case, str(tmp_path))
    for check in (_check_shared, _check_split, _check_unwritable):
        check(*_read(tmp_path))


def test_one_process_checks_nothing(tmp_path):
    check_shared_run_folder(SimpleNamespace(world_size=1, global_rank=0), tmp_path / "run")
    assert not (tmp_path / "run").exists()
