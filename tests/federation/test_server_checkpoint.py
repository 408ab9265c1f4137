"""server.pt with its large tensors in parts: an unchanged tensor is written once, a changed one again, a resumed
run reads the state it had bit for bit, a missing, swapped or foreign part is one line, an old checkpoint loads as
before, a killed write's temp files are swept on resume."""

import hashlib
import shutil

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.federation.algorithm import register
from fl_lightning.federation.run_state import RunState
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage import server_checkpoint
from fl_lightning.federation.storage.checkpoint import CorruptCheckpointError, atomic_save, safe_load
from fl_lightning.federation.storage.server_checkpoint import (
    ServerCheckpoint,
    load_server_checkpoint,
    load_server_state,
    tensor_digest,
)
from tests.tiny_runs import tiny_config


def _parts(folder):
    return sorted(p.name for p in folder.glob("state-*.pt"))


def test_unchanged_tensors_are_written_once_and_changed_ones_again(tmp_path):
    big, head = torch.randn(64, 64), torch.randn(10)  # 16 KiB: a part at min_bytes 1 KiB; 40 B: inline
    run = RunState(state={"backbone": big, "head": head}, completed_rounds=1)
    ckpt = ServerCheckpoint(tmp_path, min_bytes=1024)
    ckpt.save(run)
    ckpt.wait()
    assert _parts(tmp_path) == ["state-0000.pt"] and safe_load(tmp_path / "server.pt")["state"].keys() == {"head"}
    run.state, run.completed_rounds = {"backbone": big, "head": head + 1}, 2  # the backbone: the same object
    ckpt.save(run)
    ckpt.wait()
    assert _parts(tmp_path) == ["state-0000.pt"]  # nothing large written this round
    saved, parts = load_server_checkpoint(tmp_path)
    assert parts == {"backbone": "state-0000.pt"} and list(saved["state"]) == ["backbone", "head"]
    assert torch.equal(saved["state"]["backbone"], big) and torch.equal(saved["state"]["head"], head + 1)
    big.mul_(2)  # an in-place edit is a change
    run.completed_rounds = 3
    ckpt.save(run)
    ckpt.wait()
    assert _parts(tmp_path) == ["state-0002.pt"]  # the old part, named by no server.pt any more, is gone
    assert torch.equal(load_server_checkpoint(tmp_path)[0]["state"]["backbone"], big)
    run.state = {"head": head, "backbone": big.clone()}  # a new object (and another key order)
    run.completed_rounds = 4
    ckpt.save(run)
    ckpt.wait()
    saved, _ = load_server_checkpoint(tmp_path)
    assert _parts(tmp_path) == ["state-0003.pt"] and list(saved["state"]) == ["head", "backbone"]


def test_a_loaded_checkpoint_counts_as_written_and_a_missing_part_is_one_line(tmp_path):
    big = torch.randn(64, 64)
    first = ServerCheckpoint(tmp_path, min_bytes=1024)
    first.save(RunState(state={"backbone": big, "head": torch.zeros(3)}, completed_rounds=1))
    first.wait()
    again = ServerCheckpoint(tmp_path, min_bytes=1024)  # a resumed process
    run = again.load()
    run.state = {**run.state, "head": torch.ones(3)}
    run.completed_rounds = 2
    again.save(run)
    again.wait()
    assert _parts(tmp_path) == ["state-0000.pt"]  # the loaded backbone is not written again
    (tmp_path / "state-0000.pt").unlink()
    with pytest.raises(CorruptCheckpointError, match="names 'state-0000.pt', which is missing") as err:
        load_server_checkpoint(tmp_path)
    assert "\n" not in str(err.value)


def test_a_checkpoint_without_parts_loads_as_before(tmp_path):
    run = RunState(state={"w": torch.arange(4.0)}, completed_rounds=3)
    atomic_save(run.state_dict(), tmp_path / "server.pt")  # the format of every earlier run
    loaded = ServerCheckpoint(tmp_path).load()
    assert loaded.completed_rounds == 3 and torch.equal(loaded.state["w"], torch.arange(4.0))


def _two_rounds(folder):
    """A checkpoint after round 1 whose backbone changed in round 1, and round 0's part kept aside."""
    big = torch.randn(64, 64)
    ckpt = ServerCheckpoint(folder, min_bytes=1024)
    ckpt.save(RunState(state={"backbone": big, "head": torch.zeros(3)}, completed_rounds=1))
    ckpt.wait()
    shutil.copy(folder / "state-0000.pt", folder.parent / "round0-part.pt")
    big.add_(1)
    ckpt.save(RunState(state={"backbone": big, "head": torch.ones(3)}, completed_rounds=2))
    ckpt.wait()
    assert _parts(folder) == ["state-0001.pt"]
    return big


def test_a_part_swapped_for_another_rounds_is_one_line_not_mixed_weights(tmp_path):
    folder = tmp_path / "checkpoints"
    _two_rounds(folder)
    shutil.copy(tmp_path / "round0-part.pt", folder / "state-0001.pt")  # the right name, round 0's content
    with pytest.raises(
        CorruptCheckpointError,
        match=r"part '.*state-0001.pt' does not hold what 'server.pt' "
        r"recorded for 'backbone'",
    ) as err:
        ServerCheckpoint(folder, min_bytes=1024).load()
    assert "\n" not in str(err.value) and "another round's" in str(err.value)


def test_a_part_without_the_tensors_named_and_a_foreign_server_file_are_one_line(tmp_path):
    folder = tmp_path / "checkpoints"
    _two_rounds(folder)
    atomic_save({"other": torch.zeros(2)}, folder / "state-0001.pt")  # a valid torch file, not this run's part
    with pytest.raises(CorruptCheckpointError, match=r"lacks 1 tensor\(s\) 'server.pt' names in it \('backbone'"):
        load_server_checkpoint(folder)
    for foreign in ({"weights": torch.zeros(2)}, {"state": {}, "round": 0}, [1, 2]):  # no state; no totals; a list
        atomic_save(foreign, folder / "server.pt")
        with pytest.raises(CorruptCheckpointError, match="is not a server checkpoint of fl_lightning") as err:
            ServerCheckpoint(folder).load()
        assert "\n" not in str(err.value)


def test_parts_written_before_digests_still_load(tmp_path):
    folder = tmp_path / "checkpoints"
    big = _two_rounds(folder)
    saved = safe_load(folder / "server.pt")
    assert set(saved["state_digests"]) == {"backbone"}
    del saved["state_digests"]  # the format before this check
    atomic_save(saved, folder / "server.pt")
    assert torch.equal(ServerCheckpoint(folder, min_bytes=1024).load().state["backbone"], big)


def test_tensor_digest_is_sha256_of_dtype_shape_and_bytes():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    reference = hashlib.sha256(b"torch.float32|(3, 4)|" + np.arange(12, dtype=np.float32).tobytes()).hexdigest()
    assert tensor_digest(t) == reference == tensor_digest(t.t().contiguous().t())  # a strided view: the values
    assert tensor_digest(t.reshape(4, 3)) != reference  # the same bytes, another shape
    assert tensor_digest(t.view(torch.int32)) != reference  # the same bytes, another dtype
    assert tensor_digest(torch.tensor(1.0, dtype=torch.bfloat16)) != tensor_digest(torch.tensor(1.0))  # 0-dim, bf16


@register("test_frozen_table")
class _FrozenTable(FedAvg):
    """FedAvg of a head with a large frozen tensor in its state (as FeDiSyn's backbone), never changed."""

    def initial_state(self):
        return {**super().initial_state(), "frozen.table": torch.randn(128, 128, generator=torch.Generator().manual_seed(0))}

    def aggregate(self, round_idx, state, uploads, failures, plan):
        return {**super().aggregate(round_idx, state, uploads, failures, plan), "frozen.table": state["frozen.table"]}


def test_a_run_writes_its_frozen_tensor_once_and_resumes_to_the_same_state(tmp_path, monkeypatch):
    monkeypatch.setattr(server_checkpoint, "PART_MIN_BYTES", 1024)  # the head (1.3 KB) and the table in parts

    def cfg(name, rounds):
        return tiny_config(tmp_path / name, "--algorithm", "test_frozen_table", rounds=rounds)

    full = Simulation(cfg=cfg("full", 3), loggers=[]).run()
    folder = cfg("full", 3).run_dir / "checkpoints"
    assert _parts(folder) == ["state-0000.pt", "state-0002.pt"]  # the table's part of round 0, the head's of round 2
    assert "frozen.table" not in safe_load(folder / "state-0002.pt")  # written in round 0 only
    Simulation(cfg=cfg("cut", 2), loggers=[]).run()
    resumed = Simulation(cfg=cfg("cut", 3), loggers=[], resume=True).run()
    drop = ("wall_time_s", "world_size")
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    a, b = load_server_state(cfg("full", 3).run_dir), load_server_state(cfg("cut", 3).run_dir)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert _parts(cfg("cut", 3).run_dir / "checkpoints") == ["state-0000.pt", "state-0002.pt"]


def test_a_resumed_run_sweeps_killed_writes_and_refuses_a_swapped_part(tmp_path, monkeypatch):
    monkeypatch.setattr(server_checkpoint, "PART_MIN_BYTES", 1024)

    def cfg(rounds):
        return tiny_config(tmp_path, "--algorithm", "test_frozen_table", rounds=rounds)

    Simulation(cfg=cfg(2), loggers=[]).run()
    folder = cfg(2).run_dir / "checkpoints"
    killed = [folder / ".server.pt.k1ll3d.tmp", folder / ".state-0002.pt.k1ll3d.tmp"]  # kills between write and rename
    for path in killed:
        path.write_bytes(b"half a checkpoint")
    (folder / "notes.tmp").write_text("not ours")
    shutil.copy(folder / "state-0001.pt", tmp_path / "head-of-round-1.pt")
    Simulation(cfg=cfg(3), loggers=[], resume=True).run()
    assert not any(p.exists() for p in killed) and (folder / "notes.tmp").exists()
    shutil.copy(tmp_path / "head-of-round-1.pt", folder / "state-0002.pt")  # round 1's head under round 2's name
    with pytest.raises(CorruptCheckpointError, match=r"state-0002.pt' does not hold what 'server.pt' recorded"):
        Simulation(cfg=cfg(4), loggers=[], resume=True).run()


def test_waiting_on_a_save_whose_thread_start_a_signal_interrupted():
    """SIGTERM's handler can raise inside ``Thread.start()`` while it waits for the new thread: the thread runs but
    is not yet marked started, and ``join`` refuses it. The writer's wait joins it once it is, and gives up on one
    that never starts."""
    import threading
    import time

    from fl_lightning.federation.storage.checkpoint import _join

    done = []
    late = threading.Thread(target=lambda: done.append(1))
    threading.Timer(0.2, late.start).start()  # "started" only a moment after the wait begins
    _join(late)
    assert done == [1]
    start = time.monotonic()
    _join(threading.Thread(target=lambda: None), start_grace_s=0.3)  # never started: no hang, no error
    assert time.monotonic() - start < 5
