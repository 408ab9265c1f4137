"""``synthetic_lambda: auto`` on 2 ranks (``synthesis_step._auto_lambda_on_ranks``): each rank runs its share of the
pilots; a pilot that fails on one rank — out of GPU memory, as a pilot beside a parked run may — or a fit that fails
on rank 0 ends both ranks at once, rank 0 with one line naming the failing rank and the cause, the other quietly.
Two spawned gloo processes, the pilots' processes replaced by stand-ins (the pilots themselves are
``tests/algorithms/test_fedisyn_pilot_launchers.py``'s)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from fl_lightning.algorithms.synthetic_family import pilots, synthesis_step
from fl_lightning.federation.ranks.collectives import Ranks, RankStopped
from tests.gloo_ranks import report, run_ranks
from tests.run_records import GlooFabric

pytestmark = pytest.mark.slow  # two spawned processes per case: in CI's every-file pass, not the plain suite

_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
    "79.10 GiB of which 1.06 GiB is free"
)
_LAMBDAS = [0.1, 0.2, 0.4]


def _worker(rank: int, world: int, port: int, out: str, case: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    ran: list[float] = []
    launches: list[tuple] = []

    def run_pilot_processes(
        run_dir, section, lambdas, *, rounds, cuda_device=None, timeout_s=None, round0_root=None, launch=None
    ):
        assert round0_root == Path(out).parent / "round0"  # the run's own shared folder (<output_dir>/round0)
        ran.extend(lambdas)
        if launch is not None:  # pilot_ranks: all — where this rank's process of the pilot sits
            launches.append((launch.rank, launch.world, launch.devices, launch.num_nodes, launch.master_port))
        if case.startswith("oom") and rank == 1 and (launch is None or lambdas == [0.2]):
            raise RuntimeError(f"pilot at λ={lambdas[0]:g} failed: {_OOM}")
        return [Path(run_dir) / "pilots" / f"pilot_lam{lam:g}" for lam in lambdas]

    def auto_lambda(points, target):
        if case == "fit":
            raise ValueError("the fit has no interior minimum (κ2 ≤ 0)")
        return SimpleNamespace(lam_star=0.3, points=points)

    pilots.run_pilot_processes, pilots.auto_lambda = run_pilot_processes, auto_lambda
    pilots.pilot_points = lambda runs, pretrain_epochs: [r.name for r in runs]
    cfg = SimpleNamespace(
        pilot_lambdas=_LAMBDAS,
        pilot_rounds=1,
        pretrain_epochs=1,
        target_accuracy=0.5,
        pilot_ranks="all" if case.endswith("_all") else "one",
    )
    result: dict = {}
    start = time.monotonic()
    try:
        lam, fit = synthesis_step._auto_lambda_on_ranks(
            cfg,
            Ranks(GlooFabric(rank, world), 60.0),
            components=torch.nn.Identity(),
            run_dir=Path(out),
            section="fedisyn",
            device=torch.device("cpu"),
        )
        result["fit"] = (lam, fit.points)
    except (Exception, RankStopped) as err:  # noqa: BLE001 — what each rank ends with is the result
        result["error"] = (type(err).__name__, str(getattr(err, "message", err)))
    result["seconds"], result["ran"], result["launches"] = time.monotonic() - start, ran, launches
    report(out, rank, result)


def test_two_ranks_share_the_pilots_and_rank_0_fits_them_all_in_order(tmp_path):
    r0, r1 = run_ranks(_worker, 2, tmp_path, "ok")
    assert (r0["ran"], r1["ran"]) == ([0.1, 0.4], [0.2])  # λ_i on rank i mod 2
    assert r0["fit"] == r1["fit"] == (0.3, ["pilot_lam0.1", "pilot_lam0.2", "pilot_lam0.4"])


def test_a_pilot_out_of_memory_on_rank_1_ends_both_with_one_line_naming_it(tmp_path):
    r0, r1 = run_ranks(_worker, 2, tmp_path, "oom")
    kind, line = r0["error"]
    assert kind in ("RankFailure", "RankUsageError") and "\n" not in line, r0
    assert "rank 1" in line and "fedisyn.synthetic_lambda" in line and "CUDA out of memory" in line, line
    assert r1["error"][0] == "RankStopped" and r0["ran"] == [0.1, 0.4]  # rank 0 ran its own pilots, then stopped
    assert max(r0["seconds"], r1["seconds"]) < 30  # at the exchange, not after a timeout (60 s here)


def test_a_fit_that_fails_on_rank_0_ends_both_with_its_line(tmp_path):
    r0, r1 = run_ranks(_worker, 2, tmp_path, "fit")
    kind, line = r0["error"]
    assert kind == "ConfigError" and "fedisyn.synthetic_lambda" in line and "no interior minimum" in line, r0
    assert r1["error"][0] == "RankStopped" and max(r0["seconds"], r1["seconds"]) < 30


def test_pilots_over_all_ranks_run_each_pilot_on_every_rank_in_turn(tmp_path):
    r0, r1 = run_ranks(_worker, 2, tmp_path, "ok_all")
    assert r0["ran"] == r1["ran"] == _LAMBDAS  # every pilot on both ranks, one after another
    assert r0["fit"] == r1["fit"] == (0.3, ["pilot_lam0.1", "pilot_lam0.2", "pilot_lam0.4"])
    # rank r of a 2-rank world in the run's layout (1 node × 2), each pilot on the port rank 0 found for it
    assert [launch[:4] for launch in r0["launches"]] == [(0, 2, 2, 1)] * 3
    assert [launch[:4] for launch in r1["launches"]] == [(1, 2, 2, 1)] * 3
    assert [launch[4] for launch in r0["launches"]] == [launch[4] for launch in r1["launches"]]


def test_a_pilot_over_all_ranks_failing_on_rank_1_ends_both_before_the_next_pilot(tmp_path):
    r0, r1 = run_ranks(_worker, 2, tmp_path, "oom_all")
    kind, line = r0["error"]
    assert kind in ("RankFailure", "RankUsageError") and "\n" not in line, r0
    assert "rank 1" in line and "fedisyn.synthetic_lambda" in line and "CUDA out of memory" in line, line
    assert r1["error"][0] == "RankStopped" and r0["ran"] == r1["ran"] == [0.1, 0.2]  # λ = 0.4 never started
    assert max(r0["seconds"], r1["seconds"]) < 30
