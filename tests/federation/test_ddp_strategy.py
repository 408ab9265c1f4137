"""Two process groups (federation/ranks/ddp_strategy.py): the compute collectives under a short timeout, the server's
object collectives on a gloo group under the long one.

Unit: the strategy that ``federation.strategy`` builds carries both timeouts, and pickles (``ddp_spawn``) without its
group. Two CPU processes launched as torchrun launches them (a real Fabric, the strategy the CLI builds): an object
wait four times the compute timeout completes — rank 0 busy alone, as in a server phase — and a compute collective
that the other rank, alive, never joins (NCCL's view of a stuck peer) ends after the compute timeout with one line
naming ``federation.compute_timeout_s``.
"""

from __future__ import annotations

import os
import pickle
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError
from fl_lightning.federation.ranks.collectives import CollectiveTimeout, gathered, to_server, waiting
from fl_lightning.federation.ranks.ddp_strategy import FederatedDDPStrategy, object_group
from fl_lightning.federation.ranks.ddp_strategy import fabric_strategy as _strategy
from tests.conftest import CONF
from tests.gloo_ranks import report, run_ranks

_COMPUTE_S = 2.0  # the compute group's timeout in the 2-process test; rank 0's lone work takes 4 of it


def _cfg(*extra: str):
    return load_config(CONF / "fedavg_digits_tiny.yaml", list(extra))


def test_the_ddp_strategy_carries_a_short_compute_and_a_long_object_timeout():
    cfg = _cfg("--federation.devices", "2")
    assert cfg.federation.compute_timeout_s == 900 and cfg.federation.collective_timeout_s == 86400
    strategy = _strategy(
        _cfg("--federation.devices", "2", "--federation.compute_timeout_s", "60", "--federation.collective_timeout_s", "7200")
    )
    assert isinstance(strategy, FederatedDDPStrategy)
    assert strategy._timeout == timedelta(seconds=60) and strategy.object_timeout == timedelta(seconds=7200)
    assert strategy.object_group is None  # made in setup_environment, by every rank


def test_the_compute_groups_backend_is_fabrics_pick_unless_the_config_names_one():
    assert _strategy(_cfg("--federation.devices", "2"))._process_group_backend is None  # auto: Fabric's pick
    for name in ("ddp", "ddp_spawn"):
        strategy = _strategy(
            _cfg("--federation.devices", "2", "--federation.strategy", name, "--federation.process_group_backend", "gloo")
        )
        assert strategy._process_group_backend == "gloo"  # two ranks may share one GPU
    with pytest.raises(ConfigError, match="process_group_backend.*nccl runs only on CUDA GPUs"):
        _cfg("--federation.accelerator", "cpu", "--federation.process_group_backend", "nccl")
    with pytest.raises(ConfigError, match="process_group_backend='mpi' is not allowed; expected one of 'auto', 'nccl', 'gloo'"):
        _cfg("--federation.process_group_backend", "mpi")


def test_the_strategy_pickles_without_its_group_for_spawned_children():
    strategy = _strategy(_cfg("--federation.strategy", "ddp_spawn"))
    strategy.object_group = object()  # stands for a ProcessGroup, which does not pickle
    copy = pickle.loads(pickle.dumps(strategy))
    assert copy.object_group is None and copy.object_timeout == strategy.object_timeout
    assert strategy.object_group is not None  # the original keeps its own


def test_object_group_is_none_without_the_strategy():
    class Plain:
        strategy = object()

    assert object_group(Plain()) is None and object_group(object()) is None


@pytest.mark.parametrize("value", ["0", "0.5", "nan", "2e9"])
def test_a_bad_compute_timeout_is_one_config_error(value):
    with pytest.raises(ConfigError, match=r"federation.compute_timeout_s=.* is not allowed; expected a float in \[1"):
        _cfg("--federation.compute_timeout_s", value)


# ------------------------------------------------------------------------------------ 2 CPU processes
def _worker(rank: int, world: int, port: int, out: str) -> None:
    from lightning.fabric import Fabric

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        TORCHELASTIC_RUN_ID="t",
    )
    cfg = _cfg(
        "--federation.accelerator",
        "cpu",
        "--federation.devices",
        str(world),
        "--federation.compute_timeout_s",
        str(_COMPUTE_S),
        "--federation.collective_timeout_s",
        "600",
    )
    fabric = Fabric(accelerator="cpu", devices=world, strategy=_strategy(cfg))
    fabric.launch()
    result: dict = {"groups": (dist.get_backend(), dist.get_backend(object_group(fabric)))}

    def lone_work(value):  # rank 0 alone, longer than the compute timeout: a server phase
        if rank == 0:
            time.sleep(2 * _COMPUTE_S)
        return value

    start = time.monotonic()
    result["broadcast"] = fabric.broadcast(lone_work("rank 0's outcome"))
    result["gathered"] = gathered(fabric, lambda: lone_work(rank), what="a shard", timeout_s=600)
    result["to_server"] = to_server(fabric, lambda: lone_work(rank * 10), what="the clients", timeout_s=600)
    result["object_wait_s"] = time.monotonic() - start
    if rank == 1:  # a compute collective rank 0 never joins, rank 0 alive: stuck, not gone
        start = time.monotonic()
        try:
            with waiting("a stuck all-reduce", _COMPUTE_S, rank, key="federation.compute_timeout_s"):
                dist.all_reduce(torch.ones(1))
            result["compute"] = ("returned", 0.0)
        except CollectiveTimeout as err:
            result["compute"] = (str(err), time.monotonic() - start)
    else:
        time.sleep(3 * _COMPUTE_S)
    report(out, rank, result)


@pytest.mark.slow
def test_long_object_waits_complete_and_a_stuck_compute_collective_ends_after_its_timeout(tmp_path):
    rank0, rank1 = run_ranks(_worker, 2, tmp_path)
    for result in (rank0, rank1):
        assert result["groups"] == ("gloo", "gloo")  # on GPUs the first is NCCL; the object group is always gloo
        assert result["broadcast"] == "rank 0's outcome" and result["gathered"] == [0, 1]
    assert rank0["to_server"] == [0, 10] and rank1["to_server"] == [10]
    assert rank1["object_wait_s"] > 3 * 2 * _COMPUTE_S * 0.9  # three waits of 2× the compute timeout each
    line, seconds = rank1["compute"]
    assert line == (
        "rank 1 waited more than federation.compute_timeout_s=2 s for a stuck all-reduce; raise it above "
        "the longest step of one rank that the others wait for (a checkpoint write)"
    )
    assert _COMPUTE_S * 0.9 <= seconds < _COMPUTE_S + 5
