"""Rank 0's state on every rank: only the tensors that changed, the large ones over the backend, bit for bit."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from fl_lightning.federation.ranks.collectives import to_cpu
from fl_lightning.federation.ranks.state_broadcast import SentState
from fl_lightning.federation.serve import RoundServer
from tests.gloo_ranks import GlooFabric, run_ranks


def test_the_state_broadcast_sends_only_the_tensors_that_changed():
    """Rank 0 sends a tensor again only when it is a new object or was edited in place; the other ranks rebuild
    rank 0's state from their copy of the last one (the frozen backbone travels once)."""
    sent = SentState()
    frozen, head, clock = torch.randn(4, 4), torch.randn(2), torch.zeros(3)
    state = {"backbone.w": frozen, "head.b": head, "sys.clock": clock}
    first = sent.changes(state)
    assert set(first.tensors) == set(state) and first.large == []  # a process's first broadcast: everything
    other = first.apply({})
    state2 = dict(state, **{"head.b": head + 1})  # a new head; the clock edited in place; the backbone as it was
    clock += 1.0
    second = to_cpu(sent.changes(state2))
    assert set(second.tensors) == {"head.b", "sys.clock"} and second.keys == list(state2)
    rebuilt = second.apply(other)
    assert all(torch.equal(rebuilt[k], state2[k]) for k in state2) and rebuilt["backbone.w"] is other["backbone.w"]
    third = sent.changes({"head.b": state2["head.b"]})  # a key gone: gone on the other ranks too
    assert third.tensors == {} and third.apply(rebuilt).keys() == {"head.b"}


def test_large_changed_tensors_leave_the_pickled_outcome():
    sent = SentState(large_bytes=1024)
    state = {"big": torch.randn(16, 16), "small": torch.randn(3), "ids": torch.arange(128)}  # 1 kB of int64: large
    changes = sent.changes(state)
    assert changes.large == ["big", "ids"] and torch.equal(changes.tensors["small"], state["small"])
    assert len(pickle.dumps(changes)) < 1024  # the big tensors' shapes and dtypes only
    assert sent.changes(state).tensors == {}  # nothing changed: nothing at all goes


def _steps() -> list[Callable[[], dict]]:
    """Rank 0's aggregates: every tensor new (the big ones past 1 MiB: float32, int64, bf16); the big one replaced;
    the ids edited in place (a bumped version: sent again)."""
    g = torch.Generator().manual_seed(0)
    state = {
        "big": torch.randn(600, 600, generator=g),
        "small": torch.randn(5, generator=g),
        "ids": torch.arange(200_000),
        "half": torch.randn(700, 800, generator=g).bfloat16(),
    }

    def replace_big() -> dict:
        state["big"] = state["big"] * 3.0
        return dict(state)

    def edit_ids() -> dict:
        state["ids"].add_(7)
        return dict(state)

    return [lambda: dict(state), replace_big, edit_ids]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    fabric = GlooFabric(rank, world)
    engine = RoundServer(fabric, SimpleNamespace(federation=SimpleNamespace(compute_timeout_s=60.0, collective_timeout_s=60.0)))
    wanted = [{k: v.clone() for k, v in step().items()} for step in _steps()]  # rank 0's states, made here again
    held, got = {}, []
    for i, step in enumerate(_steps()):  # run by rank 0 only
        before = dict(held)
        held, tag = engine.state_from_server(lambda s=step, i=i: (s(), f"round {i}"), held, "the state")
        got.append(
            {
                "tag": tag,
                "equal": all(torch.equal(held[k], wanted[i][k]) and held[k].dtype == wanted[i][k].dtype for k in wanted[i]),
                "keys": list(held),
                "kept": sorted(k for k in before if k in held and held[k] is before[k]),
            }
        )
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(got))
    dist.destroy_process_group()


@pytest.mark.slow  # three spawned processes
def test_three_ranks_hold_rank0s_state_with_its_large_tensors_sent_over_the_backend(tmp_path):
    zero, *others = run_ranks(_worker, 3, tmp_path)
    for got in (zero, *others):
        assert [r["tag"] for r in got] == ["round 0", "round 1", "round 2"]
        assert all(r["equal"] and r["keys"] == ["big", "small", "ids", "half"] for r in got), got
    for got in others:  # what rank 0 left as it was stays the same object on the others
        assert got[1]["kept"] == ["half", "ids", "small"] and got[2]["kept"] == ["big", "half", "small"], got
