"""No rank dies waiting and no failure hangs the others (federation/ranks/collectives.py).

Unit tests (a fake Fabric): the helper that moves what crosses the wire to the CPU, the outcome that rank 0
broadcasts, the strategy built with ``federation.collective_timeout_s``. Then 2 CPU processes (gloo) running
the CLI (tests/federation/rank_safety_job.py): a server phase longer than a short key stops within seconds with
a line naming the key, the same phase under a long enough key completes, and a server that raises in its
aggregate ends both ranks at once — rank 0 with its one line, rank 1 quietly, both with exit status 2. Every
rank's part of a round reaches rank 0 as an outcome (``to_server``): rank 1 failing in its record step ends
both ranks within seconds — rank 0 with one line naming rank 1, rank 1 quietly, both with that error's status.
Code outside those phases (``on_round_start``, the round's end: ``on_round_end``, loggers, rank 0's files) ends
the same way (``everyone``; ``on_round_start`` travels with the plan or the records gather): a callback that
raises on rank 1, or on rank 0, ends both ranks within seconds.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from lightning.fabric.strategies import DDPStrategy

from fl_lightning.config.loading import load_config
from fl_lightning.errors import (
    ConfigError,
    DiskFullError,
    MissingResourceError,
    RemoteTraceback,
    RunFailure,
    TooFewClients,
    UsageError,
)
from fl_lightning.federation.algorithm import RoundPlan
from fl_lightning.federation.ranks import collectives
from fl_lightning.federation.ranks.collectives import (
    CollectiveTimeout,
    RankFailure,
    RankStopped,
    RankUsageError,
    _Outcome,
    everyone,
    from_server,
    to_cpu,
    to_server,
)
from fl_lightning.federation.ranks.ddp_strategy import fabric_strategy as _strategy
from fl_lightning.federation.ranks.liveness import PeerLost
from fl_lightning.federation.storage.round_store import ClientRecord, RoundResult
from fl_lightning.federation.transport import Download
from tests.conftest import CONF, REPO

JOB = Path(__file__).with_name("rank_safety_job.py")


# ------------------------------------------------------------------------------------------- to_cpu
def _tensors(obj):
    """Every tensor in the objects the engine broadcasts (dicts, sequences, its dataclasses)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from _tensors(getattr(obj, name))


def _broadcast_objects(device: str):
    """The state + row, a plan, a round result and an outcome as the engine broadcasts them."""

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float64).to(dtype).to(device)

    state = {
        "head.weight": t(10, 32),
        "head.bias": t(10, dtype=torch.bfloat16),
        "sys.clock": t(3, dtype=torch.float64),
        "count": torch.arange(5).to(device),
        "view": t(6, 4)[:, 1],
    }  # a non-contiguous view
    row = {"round": 0, "accuracy": 0.5, "per_class_accuracy": [0.1, 0.9]}
    plan = RoundPlan(
        {0: Download({"w": t(4, 4)}, {"n": 3}), 1: Download({"w": t(4, 4)})},
        {"depths": t(2), "round_time_s": 1.5, "names": ["a", "b"]},
    )
    result = RoundResult({0: ClientRecord(compute_s=0.1, bytes_down=64), 1: ClientRecord(0.2, 64, failure="boom")})
    return [(state, row), plan, result, _Outcome(value=(state, row))]


@pytest.mark.parametrize("which", range(4), ids=["state+row", "plan", "result", "outcome"])
def test_to_cpu_moves_every_tensor_and_keeps_its_bits(which, monkeypatch):
    """'meta' stands in for CUDA: to_cpu leaves no tensor on it. A meta tensor has no values, so its copy is
    faked (zeros); the values are checked on CPU tensors: the same objects, bit for bit, structure kept."""
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if self.device.type == "meta":
            return torch.zeros(self.shape, dtype=self.dtype)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    on_meta = _broadcast_objects("meta")[which]
    n = len(list(_tensors(on_meta)))  # the round result holds numbers and strings only
    assert [x.device.type for x in _tensors(on_meta)] == ["meta"] * n and (n > 0) == (which != 2)
    moved = to_cpu(on_meta)
    assert [x.device.type for x in _tensors(moved)] == ["cpu"] * n
    monkeypatch.undo()

    on_cpu = _broadcast_objects("cpu")[which]
    moved = to_cpu(on_cpu)
    assert type(moved) is type(on_cpu)
    before, after = list(_tensors(on_cpu)), list(_tensors(moved))
    assert len(before) == len(after) == n
    for a, b in zip(before, after):
        assert b is a  # a CPU tensor is not copied: its values cannot change
        assert a.dtype == b.dtype and a.stride() == b.stride()
    if which == 1:
        assert moved.downloads[0].meta == {"n": 3} and moved.decisions["names"] == ["a", "b"]
    if which == 2:
        assert moved.failures == {1: "boom"} and moved.succeeded == [0]


# -------------------------------------------------------------------------------------- from_server
@dataclass
class _FakeFabric:
    """One rank of ``world_size``; ``broadcast`` records what it sends and returns ``incoming`` on rank > 0."""

    global_rank: int = 0
    world_size: int = 2
    incoming: object = None
    sent: list = field(default_factory=list)

    def broadcast(self, obj, src=0):
        self.sent.append(obj)
        if isinstance(self.incoming, BaseException):
            raise self.incoming
        return obj if self.global_rank == src else self.incoming


def test_one_process_only_calls_the_step():
    fabric, state = _FakeFabric(world_size=1), {"w": torch.ones(2)}
    assert from_server(fabric, lambda: state, what="x", timeout_s=1) is state
    assert fabric.sent == []


def test_rank0_keeps_its_objects_and_sends_cpu_ones():
    fabric, state = _FakeFabric(), {"w": torch.ones(2)}
    assert from_server(fabric, lambda: state, what="x", timeout_s=1) is state
    (outcome,) = fabric.sent
    assert outcome.error is None and torch.equal(outcome.value["w"], state["w"])


@pytest.mark.parametrize(
    "error, status",
    [
        (MissingResourceError("weights not on disk: /w.pt"), 2),  # a usage error: exit 2
        (TooFewClients("round 0: 1 of 4 clients succeeded", 0, 1), 1),  # a run failure: exit 1
        (ValueError("a bug\nover two lines"), 1),  # a bug: exit 1 (rank 0 prints the traceback)
    ],
)
def test_a_failing_step_raises_on_rank0_and_stops_the_others_with_its_status(error, status):
    leader = _FakeFabric()

    def step():
        raise error

    with pytest.raises(type(error)) as raised:
        from_server(leader, step, what="round 0's aggregate", timeout_s=1)
    assert raised.value is error
    (outcome,) = leader.sent
    assert outcome.status == status and "\n" not in outcome.error and str(error).split()[0] in outcome.error

    follower = _FakeFabric(global_rank=1, incoming=outcome)
    with pytest.raises(RankStopped) as stopped:
        from_server(follower, step, what="round 0's aggregate", timeout_s=1)
    assert isinstance(stopped.value, SystemExit) and stopped.value.code == status
    assert stopped.value.message == outcome.error


def test_a_timed_out_wait_is_one_line_naming_the_key():
    gloo = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation")
    follower = _FakeFabric(global_rank=1, incoming=gloo)
    with pytest.raises(
        CollectiveTimeout,
        match=r"rank 1 waited more than federation.collective_timeout_s=3 s "
        r"for round 2's plan",
    ) as info:
        from_server(follower, dict, what="round 2's plan", timeout_s=3.0)
    assert isinstance(info.value, RunFailure) and info.value.__cause__ is gloo
    other = RuntimeError("Connection closed by peer")  # a peer gone (gloo): one line too (federation/ranks/liveness.py)
    with pytest.raises(
        PeerLost,
        match=r"rank 1 lost its connection to another rank during x \(Connection closed by "
        r"peer\); every rank stops",
    ):
        from_server(_FakeFabric(global_rank=1, incoming=other), dict, what="x", timeout_s=3.0)
    bug = RuntimeError("a bug in a collective's caller")  # neither: the backend's own error, as it is
    with pytest.raises(RuntimeError, match="a bug"):
        from_server(_FakeFabric(global_rank=1, incoming=bug), dict, what="x", timeout_s=3.0)


@pytest.mark.parametrize("host", ["here", "elsewhere"])
def test_a_stopping_rank_lets_rank0_on_its_host_exit_first(host):
    """torchrun's ranks are siblings: on rank 0's host a stopping rank waits until rank 0's process is gone (here
    a child reaped by a thread, as torchrun's agent reaps its workers); rank 0 on another host: no wait."""
    import threading

    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    threading.Thread(target=leader.wait, daemon=True).start()
    start = time.monotonic()
    collectives._let_leader_exit_first(
        _Outcome(error="x", status=2, pid=leader.pid, host=socket.gethostname() if host == "here" else "no-such-host")
    )
    waited = time.monotonic() - start
    leader.wait()
    assert (0.5 < waited < 20) if host == "here" else waited < 0.5


# ---------------------------------------------------------------------------------------- to_server
def _gather_of(parts_on_rank0: list, sent: list):
    """``dist.gather_object`` of a world whose other ranks contributed ``parts_on_rank0[1:]``: rank 0's list is
    filled (its own entry a pickled copy, as torch's is), every rank's contribution is recorded in ``sent``."""
    import pickle

    def gather_object(obj, object_gather_list=None, dst=0, group=None):
        sent.append(obj)
        if object_gather_list is not None:
            object_gather_list[:] = [pickle.loads(pickle.dumps(obj)), *parts_on_rank0[1:]]

    return gather_object


def _rank_outcome(err: Exception) -> _Outcome:
    """What a rank whose part raised ``err`` contributes to the gather."""
    try:
        raise err
    except Exception as raised:  # with its traceback, as a real failing rank has one
        return collectives._failed(raised)


def test_one_process_calls_the_step_and_the_check_without_a_gather(monkeypatch):
    monkeypatch.setattr(collectives.dist, "gather_object", lambda *a, **k: pytest.fail("no gather with one process"))
    fabric, records, checked = _FakeFabric(world_size=1), {"c0": 1}, []
    assert to_server(fabric, lambda: records, what="x", timeout_s=1, check=checked.append) == [records]
    assert checked == [[records]] and checked[0][0] is records and fabric.sent == []


def test_every_rank_succeeding_gives_rank0_every_value_and_its_check(monkeypatch):
    sent, checked = [], []
    mine = {"w": torch.ones(2)}
    monkeypatch.setattr(collectives.dist, "gather_object", _gather_of([None, _Outcome(value={1: "r1"})], sent))
    leader = _FakeFabric()
    values = to_server(leader, lambda: mine, what="round 0's clients", timeout_s=1, check=checked.append)
    assert values[0] is mine and values[1] == {1: "r1"} and checked == [values]
    (verdict,) = leader.sent  # one broadcast: the verdict, no value
    assert verdict.error is None and verdict.value is None

    follower = _FakeFabric(global_rank=1, incoming=_Outcome())
    assert to_server(follower, lambda: {1: "r1"}, what="x", timeout_s=1) == [{1: "r1"}]
    assert sent[-1].error is None and sent[-1].value == {1: "r1"}


@pytest.mark.parametrize(
    "error, error_class, status",
    [
        (
            DiskFullError("no space left for client 3's record in /full (needs 1 MB, 0 B free)", "/full", 1 << 20, 0),
            RankUsageError,
            2,
        ),  # a usage error on rank 1: exit 2 on every rank
        (OSError(5, "Input/output error", "/flaky/client3.pt"), RankFailure, 1),  # not ours: exit 1
        (TooFewClients("round 0: 1 of 4 clients succeeded", 0, 1), RankFailure, 1),
    ],
)
def test_a_rank_that_fails_reaches_rank0_as_one_error_naming_it(error, error_class, status, monkeypatch):
    failed = _rank_outcome(error)
    assert failed.status == status and "\n" not in failed.error and failed.host == socket.gethostname()
    assert "Traceback" in failed.traceback  # for --debug on rank 0
    sent, checked = [], []
    monkeypatch.setattr(collectives.dist, "gather_object", _gather_of([None, failed], sent))
    leader = _FakeFabric()
    with pytest.raises(error_class) as raised:
        to_server(leader, lambda: {0: "r0"}, what="round 0's clients", timeout_s=1, check=checked.append)
    line = str(raised.value)
    assert line.startswith(f"rank 1 on {socket.gethostname()} failed in round 0's clients: ")
    assert line.endswith(str(error) if isinstance(error, (UsageError, RunFailure)) else f"OSError: {error}")
    assert isinstance(raised.value, UsageError if status == 2 else RunFailure) and "\n" not in line
    assert raised.value.rank == 1 and isinstance(raised.value.__cause__, RemoteTraceback)
    assert checked == []  # no policy decision on a round a rank could not finish
    (verdict,) = leader.sent
    assert verdict.status == status and verdict.error == line

    # the failing rank itself: its error goes into the gather, then it stops quietly with rank 0's status
    def step():
        raise error

    follower = _FakeFabric(global_rank=1, incoming=verdict)
    with pytest.raises(RankStopped) as stopped:
        to_server(follower, step, what="round 0's clients", timeout_s=1)
    assert stopped.value.code == status and stopped.value.message == line
    assert sent[-1].error == failed.error and sent[-1].status == status


def test_rank0_failing_in_its_own_part_still_releases_the_others(monkeypatch):
    sent = []
    monkeypatch.setattr(collectives.dist, "gather_object", _gather_of([None, _rank_outcome(ValueError("rank 1 too"))], sent))
    own = MissingResourceError("rank 0's own record folder is gone: /gone")
    leader = _FakeFabric()

    def step():
        raise own

    with pytest.raises(MissingResourceError) as raised:  # its own error, as a failed server phase raises it
        to_server(leader, step, what="round 0's clients", timeout_s=1)
    assert raised.value is own and sent[0].error == str(own)  # it took part in the gather
    assert leader.sent[0].status == 2


def test_several_failing_ranks_name_the_first(monkeypatch):
    outcomes = [
        None,
        _rank_outcome(ValueError("one")),
        _Outcome(value={}),
        _rank_outcome(KeyError("three")),
        _rank_outcome(DiskFullError("full", "/f")),
    ]
    monkeypatch.setattr(collectives.dist, "gather_object", _gather_of(outcomes, []))
    with pytest.raises(RankFailure, match=r"^rank 1 on .* failed in x \(and 2 more ranks\): ValueError: one$"):
        to_server(_FakeFabric(world_size=5), dict, what="x", timeout_s=1)


# ----------------------------------------------------------------------------------------- everyone
def _all_gather_of(rank: int, others: dict[int, _Outcome], sent: list):
    """``dist.all_gather_object`` on ``rank`` of a world whose ranks in ``others`` contributed those outcomes,
    every other rank a success, and ``rank`` its own (a pickled copy, as torch's is); what it gives is recorded."""
    import pickle

    def all_gather_object(object_list, obj, group=None):
        sent.append(obj)
        object_list[:] = [others.get(r, _Outcome()) for r in range(len(object_list))]
        object_list[rank] = pickle.loads(pickle.dumps(obj))

    return all_gather_object


@pytest.mark.parametrize(
    "failing, status, first",
    [
        (
            {1: ValueError("a callback on rank 1")},
            1,
            "rank 1 on {host} failed in round 0's end: ValueError: a callback on rank 1",
        ),
        (
            {1: DiskFullError("full", "/f"), 2: ValueError("x")},
            2,
            "rank 1 on {host} failed in round 0's end (and 1 more rank): full",
        ),
        ({0: MissingResourceError("rank 0's file: /gone")}, 2, "rank 0's file: /gone"),  # rank 0's own error
        # rank 0 timed out in a compute collective that rank 1, failing elsewhere, never joined: rank 1's error is the cause
        (
            {0: RuntimeError("[gloo] Timed out waiting 900000ms for recv"), 2: DiskFullError("full", "/f")},
            2,
            "rank 2 on {host} failed in round 0's end: full",
        ),
        (
            {0: RuntimeError("[gloo] Timed out waiting 900000ms for recv")},
            1,  # a symptom only: rank 0's own, as it is
            "RuntimeError: [gloo] Timed out waiting 900000ms for recv",
        ),
        ({}, 0, None),  # every rank succeeded
    ],
    ids=["rank 1", "ranks 1 and 2", "rank 0", "rank 0 timed out, rank 2 the cause", "rank 0 timed out", "none"],
)
def test_the_end_of_a_round_exchange_gives_every_rank_the_same_verdict(failing, status, first, monkeypatch):
    """Every rank runs its part, then one all-gather of the outcomes (no broadcast, no values): rank 0 raises its
    own error or one naming the first failing rank; every other rank — the failing ones included — stops quietly
    with that error's status."""
    monkeypatch.setattr(collectives, "_let_leader_exit_first", lambda outcome: None)
    outcomes = {r: _rank_outcome(err) for r, err in failing.items()}
    line = first.format(host=socket.gethostname()) if first else None
    for rank in range(3):
        sent = []
        monkeypatch.setattr(collectives.dist, "all_gather_object", _all_gather_of(rank, outcomes, sent))
        fabric = _FakeFabric(global_rank=rank, world_size=3)

        def step():
            if rank in failing:
                raise failing[rank]
            return {"rank": rank}

        if not failing:
            assert everyone(fabric, step, what="round 0's end", timeout_s=1) == {"rank": rank}
        elif rank == 0:
            rank0_own = 0 in failing and len(failing) == 1 or isinstance(failing.get(0), MissingResourceError)
            with pytest.raises(type(failing[0]) if rank0_own else RankUsageError if status == 2 else RankFailure) as raised:
                everyone(fabric, step, what="round 0's end", timeout_s=1)
            assert collectives.one_line(raised.value) == line and (rank0_own or raised.value.rank == min(failing.keys() - {0}))
        else:
            with pytest.raises(RankStopped) as stopped:
                everyone(fabric, step, what="round 0's end", timeout_s=1)
            assert stopped.value.code == status and stopped.value.message == line
        (mine,) = sent  # one collective, carrying no value
        assert mine.value is None and (mine.error is not None) == (rank in failing)
        assert fabric.sent == []  # no broadcast


@pytest.mark.parametrize("outer", ["everyone", "gathered", "to_server"])
def test_an_error_decided_in_an_inner_exchange_is_never_gathered_again(outer, monkeypatch):
    """A phase inside a phase (a stage's aggregate in the round's end, a pre-training guard in a server phase): rank 1
    fails in the inner exchange and stops there (RankStopped, never caught as an Exception). Rank 0's error from that
    verdict passes every outer exchange untouched — one more gather would wait for a rank that has gone (NCCL does
    not notice, gloo does)."""
    monkeypatch.setattr(collectives, "_let_leader_exit_first", lambda outcome: None)
    sent = []
    failed = {1: _rank_outcome(ValueError("rank 1's shard"))}
    monkeypatch.setattr(collectives.dist, "all_gather_object", _all_gather_of(0, failed, sent))
    monkeypatch.setattr(collectives.dist, "gather_object", lambda *a, **k: pytest.fail("gathered again"))
    leader = _FakeFabric(world_size=2)

    def inner():
        return collectives.gathered(leader, lambda: 1, what="the test split's shards", timeout_s=1)

    call = {"everyone": everyone, "gathered": collectives.gathered, "to_server": to_server}[outer]
    with pytest.raises(
        RankFailure,
        match=r"rank 1 on .* failed in the test split's shards: ValueError: rank 1's "
        r"shard",
    ) as raised:
        call(leader, inner, what="round 0's end", timeout_s=1)
    assert collectives.decided(raised.value)
    assert len(sent) == 1 and leader.sent == []  # the inner exchange only: no outer gather, no broadcast

    # the other rank: the inner verdict stops it (a SystemExit), which no outer exchange catches
    follower = _FakeFabric(global_rank=1, world_size=2)
    monkeypatch.setattr(collectives.dist, "all_gather_object", _all_gather_of(1, {}, sent := []))

    def failing_inner():
        def shard():
            raise ValueError("rank 1's shard")

        return collectives.gathered(follower, shard, what="the test split's shards", timeout_s=1)

    with pytest.raises(RankStopped):
        call(follower, failing_inner, what="round 0's end", timeout_s=1)
    assert len(sent) == 1 and follower.sent == []


def _stays_after_stopping(rank: int, world: int, port: int, out: str, outer: str) -> None:
    """A gloo rank of a nested exchange whose rank 1 fails inside; rank 1 then stays alive (as a process NCCL
    cannot tell from a slow one), so rank 0 ends only if it never gathers again."""
    import torch.distributed as dist

    from fl_lightning.federation.ranks import collectives as c

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=20))
    fabric = _FakeFabric(global_rank=rank, world_size=world)
    fabric.broadcast = lambda obj, src=0: (lambda box: (dist.broadcast_object_list(box, src=src), box[0])[1])([obj])

    def inner():
        def shard():
            if rank == 1:
                raise ValueError("rank 1's shard")
            return rank

        return c.gathered(fabric, shard, what="the test split's shards", timeout_s=20)

    call = {"everyone": c.everyone, "to_server": c.to_server}[outer]
    start = time.monotonic()
    try:
        call(fabric, inner, what="round 0's end", timeout_s=20)
        result = ("returned", time.monotonic() - start)
    except c.RankStopped as stopped:
        result = ("stopped", stopped.code)
        Path(out, "rank1.pkl").write_bytes(__import__("pickle").dumps(result))
        deadline = time.monotonic() + 25  # alive, not in any collective, until rank 0 has reported
        while not Path(out, "rank0.pkl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)
    except Exception as err:  # noqa: BLE001
        result = (type(err).__name__, time.monotonic() - start)
    Path(out, f"rank{rank}.pkl").write_bytes(__import__("pickle").dumps(result))
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("outer", ["everyone", "to_server"])
def test_a_nested_failure_ends_rank0_at_once_though_the_stopped_rank_lives_on(outer, tmp_path):
    """2 gloo processes, the stopped rank alive and out of every collective (NCCL's view of a dead peer): rank 0
    raises the inner verdict's error within seconds, not after the 20 s process-group timeout."""
    from tests.gloo_ranks import run_ranks

    rank0, rank1 = run_ranks(_stays_after_stopping, 2, tmp_path, outer)
    assert rank1 == ("stopped", 1)
    assert rank0[0] == "RankFailure" and rank0[1] < 10, rank0


def test_one_process_only_calls_the_end_of_a_round(monkeypatch):
    monkeypatch.setattr(collectives.dist, "all_gather_object", lambda *a: pytest.fail("no exchange with one process"))
    state = {"w": torch.ones(2)}
    assert everyone(_FakeFabric(world_size=1), lambda: state, what="x", timeout_s=1) is state


def test_a_rank_error_survives_pickling():
    err = RankUsageError("rank 1 on h failed in x: full", 1, "h", "Traceback ...")
    back = __import__("pickle").loads(__import__("pickle").dumps(err))
    assert type(back) is RankUsageError and str(back) == str(err) and (back.rank, back.host) == (1, "h")


# ------------------------------------------------------------------------------------- config, strategy
def _cfg(*extra):
    return load_config(CONF / "fedavg_digits_tiny.yaml", list(extra))


def _two_cpu_devices(tmp_path, *extra):
    """The tiny FedAvg config into ``tmp_path`` on two CPU devices, then ``extra`` (a launcher's environment set
    by the test decides what the strategy sees)."""
    return _cfg("--output_dir", str(tmp_path), "--federation.accelerator", "cpu", "--federation.devices", "2", *extra)


@pytest.mark.parametrize(
    "extra, start_method",
    [
        (("--federation.devices", "2"), "popen"),  # auto on 2 ranks
        (("--federation.strategy", "ddp"), "popen"),
        (("--federation.strategy", "ddp_spawn"), "spawn"),
    ],
)
def test_a_ddp_strategy_carries_the_collective_timeout(extra, start_method):
    assert _cfg().federation.collective_timeout_s == 86400  # a day: longer than FeDiSyn's round 0 on the server
    strategy = _strategy(_cfg(*extra, "--federation.collective_timeout_s", "7.5", "--federation.compute_timeout_s", "3"))
    assert isinstance(strategy, DDPStrategy) and strategy._start_method == start_method
    assert strategy.object_timeout == timedelta(seconds=7.5)  # the object group's (federation/ranks/ddp_strategy.py)
    assert strategy._timeout == timedelta(seconds=3)  # the default (compute) group's


@pytest.mark.parametrize(
    "extra, name", [((), "auto"), (("--federation.strategy", "fsdp"), "fsdp"), (("--federation.strategy", "dp"), "dp")]
)
def test_other_strategies_stay_names(extra, name):
    assert _strategy(_cfg(*extra)) == name


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "2e9", "0.001", "0.5"])
def test_a_bad_collective_timeout_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"federation.collective_timeout_s=.* is not allowed; expected a float"):
        _cfg("--federation.collective_timeout_s", value)


# ------------------------------------------------------------------------------------ 2 CPU processes
def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _job(
    tmp_path: Path,
    algorithm: str,
    *extra: str,
    torchrun: bool,
    sleep_s: float = 0.0,
    timeout: float = 240,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess, float, Path]:
    """The job on 2 CPU ranks: under torchrun (the ranks start together) or the CLI's own Fabric launcher
    (rank 0 starts rank 1). Returns the launcher's process, its seconds and the folder of the ranks' files."""
    out = tmp_path / "ranks"
    cli = [
        "--config",
        str(CONF / "fedavg_digits_tiny.yaml"),
        "--output_dir",
        str(tmp_path / "runs"),
        "--algorithm",
        algorithm,
        "--federation.rounds",
        "1",
        "--federation.devices",
        "2",
        "--federation.accelerator",
        "cpu",
        "--logging.progress",
        "false",
        *extra,
    ]
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", _free_port()]
        if torchrun
        else [sys.executable]
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "FL_TEST_SERVER_SLEEP_S": str(sleep_s),
        "MASTER_PORT": _free_port(),
        **(env or {}),
    }
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [*launcher, str(JOB), str(out), *cli], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
        )
    finally:
        _wait_for_ranks(out)
    return proc, time.monotonic() - start, out


def _wait_for_ranks(out: Path, patience_s: float = 60) -> None:
    """Rank 1 outlives rank 0 under Fabric's launcher by a moment: wait for its exit status, kill it if late."""
    deadline = time.monotonic() + patience_s
    for pid_file in sorted(out.glob("rank*.pid")):
        rc = pid_file.with_suffix(".rc")
        while not rc.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not rc.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _read(out: Path, name: str) -> str:
    path = out / name
    return path.read_text() if path.exists() else ""


_SHORT_S, _SLEEP_S = 5.0, 9.0  # a server phase of 9 s against a key of 5 s


@pytest.mark.slow
def test_a_server_phase_longer_than_the_key_stops_within_seconds_with_one_line(tmp_path):
    """torchrun: the ranks start together, so a short key covers their rendezvous. Rank 1 waits in round 0's
    aggregate broadcast, times out after 5 s and stops with one line (exit 1); torchrun then stops rank 0."""
    proc, seconds, out = _job(
        tmp_path, "test_slow_server", "--federation.collective_timeout_s", str(_SHORT_S), torchrun=True, sleep_s=_SLEEP_S
    )
    rank1 = _read(out, "rank1.err")
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert (
        f"fl_lightning: rank 1 waited more than federation.collective_timeout_s={_SHORT_S:g} s for round 0's "
        f"aggregate and evaluation"
    ) in rank1, rank1[-3000:] + _read(out, "rank0.err")[-3000:]
    assert "Traceback" not in rank1 and _read(out, "rank1.rc") == "1"
    assert not (tmp_path / "runs" / "fedavg_digits_a0.5_s0" / "summary.json").exists()
    assert seconds < 120


@pytest.mark.slow
def test_the_same_phase_under_a_long_enough_key_completes(tmp_path):
    proc, _, out = _job(
        tmp_path, "test_slow_server", "--federation.collective_timeout_s", str(4 * _SLEEP_S), torchrun=True, sleep_s=_SLEEP_S
    )
    assert proc.returncode == 0, _read(out, "rank0.err")[-3000:] + _read(out, "rank1.err")[-3000:]
    assert _read(out, "rank0.rc") == _read(out, "rank1.rc") == "0"
    runs = list((tmp_path / "runs").glob("*/summary.json"))
    assert len(runs) == 1 and '"world_size": 2' in runs[0].read_text()


@pytest.mark.slow
def test_a_server_that_raises_ends_every_rank_at_once(tmp_path):
    """The CLI's own launcher (rank 0 starts rank 1; a child that exits non-zero makes Lightning SIGKILL rank
    0): rank 0 prints its one line and exits 2; rank 1 stops quietly with 2, after rank 0 has exited."""
    proc, _, out = _job(tmp_path, "test_failing_server", torchrun=False)
    rank0, rank1 = _read(out, "rank0.err"), _read(out, "rank1.err")
    assert proc.returncode == 2, rank0[-3000:] + rank1[-3000:]
    ours = [line for line in rank0.splitlines() if line.startswith("fl_lightning:")]
    assert ours == ["fl_lightning: the server's test weights are not on disk: /nowhere/weights.pt"], rank0[-3000:]
    assert "Traceback" not in rank0
    assert "Traceback" not in rank1 and "fl_lightning:" not in rank1, rank1[-3000:]
    assert _read(out, "rank1.rc") == "2"
    raised = float(_read(out, "raised"))
    for rank in (0, 1):  # both exited within seconds of the error (never waited for the collective timeout)
        assert (out / f"rank{rank}.rc").stat().st_mtime - raised < 20  # rank 1 waits at most 30 s for rank 0
    assert math.isfinite(raised)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, torchrun, status, message",
    [
        ("disk", False, 2, r"no space left for client \d+'s record in /full/disk \(needs 1 MB, 0 B free\)"),
        ("io", True, 1, r"OSError: \[Errno 5\] Input/output error: '/flaky/mount/client\d+\.pt'"),
    ],
    ids=["usage error, Fabric's launcher", "other error, torchrun"],
)
def test_a_rank_failing_in_its_record_step_ends_every_rank_with_one_line(kind, torchrun, status, message, tmp_path):
    """Rank 1 raises while saving its first client's record: it contributes the error to the records gather,
    rank 0 prints one line naming rank 1 and exits with the error's status; rank 1 stops quietly with it."""
    proc, _, out = _job(tmp_path, "test_failing_records", torchrun=torchrun, env={"FL_TEST_RECORD_ERROR": kind})
    rank0, rank1 = _read(out, "rank0.err"), _read(out, "rank1.err")
    assert proc.returncode == status, rank0[-3000:] + rank1[-3000:]
    ours = [line for line in rank0.splitlines() if line.startswith("fl_lightning:")]
    head = f"fl_lightning: rank 1 on {re.escape(socket.gethostname())} failed in round 0's clients: "
    assert len(ours) == 1 and re.fullmatch(head + message, ours[0]), rank0[-3000:]
    assert "Traceback" not in rank0  # no traceback through fl_lightning code, on either rank
    assert "Traceback" not in rank1 and "fl_lightning:" not in rank1, rank1[-3000:]  # the line is rank 0's only
    assert _read(out, "rank0.rc") == _read(out, "rank1.rc") == str(status)
    raised = float(_read(out, "raised"))
    for rank in (0, 1):  # both exited within seconds of the error, not after the collective timeout (a day)
        assert (out / f"rank{rank}.rc").stat().st_mtime - raised < 20
    assert not list((tmp_path / "runs").glob("*/summary.json"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "hook, rank, torchrun, status, line",
    [
        ("on_round_end", 1, False, 1, "rank 1 on {host} failed in round 0's end: ValueError: the test callback failed on rank 1"),
        ("on_round_end", 0, False, 2, "the test callback's file is not on disk on rank 0: /nowhere/cb.json"),
        (
            "on_round_start",
            1,
            True,
            1,
            "rank 1 on {host} failed in round 0's clients: ValueError: the test callback failed on rank 1",
        ),
    ],
    ids=[
        "on_round_end on rank 1, Fabric's launcher",
        "on_round_end on rank 0, Fabric's launcher",
        "on_round_start on rank 1, torchrun",
    ],
)
def test_a_callback_failing_on_any_rank_ends_every_rank_with_one_line(hook, rank, torchrun, status, line, tmp_path):
    """A callback raises outside the server's phases and the records gather: the round's end exchange (or, for
    on_round_start, the records gather) carries it; rank 0 prints one line, the other rank stops quietly, both
    with that error's status, within seconds."""
    proc, _, out = _job(tmp_path, "fedavg", torchrun=torchrun, env={"FL_TEST_FAILING_HOOK": f"{hook}:{rank}"})
    rank0, rank1 = _read(out, "rank0.err"), _read(out, "rank1.err")
    assert proc.returncode == status, rank0[-3000:] + rank1[-3000:]
    ours = [x for x in rank0.splitlines() if x.startswith("fl_lightning:")]
    assert ours == ["fl_lightning: " + line.format(host=socket.gethostname())], rank0[-3000:]
    assert "Traceback" not in rank0
    assert "Traceback" not in rank1 and "fl_lightning:" not in rank1, rank1[-3000:]
    assert _read(out, "rank0.rc") == _read(out, "rank1.rc") == str(status)
    raised = float(_read(out, "raised"))
    for r in (0, 1):  # both exited within seconds of the error, not after the collective timeout (a day)
        assert (out / f"rank{r}.rc").stat().st_mtime - raised < 20
    assert not list((tmp_path / "runs").glob("*/summary.json"))


@pytest.mark.parametrize("cli", ["ddp", "ddp_find_unused_parameters_true"])
def test_fabric_run_with_strategy_ddp_sets_up_ddp_with_the_collective_timeout(cli, tmp_path, monkeypatch):
    """``fabric run --strategy ddp`` sets LT_STRATEGY, and Fabric refuses any other strategy value beside it, a
    DDPStrategy instance included ("conflicts with the value --strategy=ddp set through the CLI"). The CLI's name
    is taken, and the strategy Fabric sets up (in ``Fabric()``, under its CLI) carries the collective timeout."""
    from fl_lightning.federation.simulation import Simulation

    seen = []
    monkeypatch.setattr(DDPStrategy, "setup_environment", lambda self: seen.append(self))  # no process group
    for key, value in {
        "LT_CLI_USED": "1",
        "LT_STRATEGY": cli,
        "LT_ACCELERATOR": "cpu",
        "LT_DEVICES": "2",
        "LT_NUM_NODES": "1",
        "WORLD_SIZE": "2",
    }.items():
        monkeypatch.setenv(key, value)
    cfg = _two_cpu_devices(tmp_path, "--federation.collective_timeout_s", "7.5", "--federation.compute_timeout_s", "3")
    strategy = Simulation(cfg=cfg, loggers=[]).fabric.strategy
    assert seen == [strategy] and strategy._timeout == timedelta(seconds=3)
    assert strategy.object_timeout == timedelta(seconds=7.5)
    assert strategy._ddp_kwargs.get("find_unused_parameters", False) == cli.endswith("true")
    assert os.environ["LT_STRATEGY"] == cli  # put back


def test_fabric_run_strategy_disagreeing_with_the_config_stops_in_one_line(tmp_path, monkeypatch):
    from fl_lightning.federation.simulation import Simulation

    monkeypatch.setenv("LT_CLI_USED", "1")
    monkeypatch.setenv("LT_STRATEGY", "ddp")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = _two_cpu_devices(tmp_path, "--federation.strategy", "ddp_spawn")
    with pytest.raises(ConfigError, match=r"federation.strategy.*'ddp', the strategy `fabric run --strategy`"):
        Simulation(cfg=cfg, loggers=[])
