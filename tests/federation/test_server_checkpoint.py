"""server.pt with its large tensors in parts: an unchanged tensor is written once, a changed one again, a resumed
run reads the state it had bit for bit, a missing part is one line, an old checkpoint loads as before."""

import pytest
import torch

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.config_loading import load_config
from fl_lightning.federation import server_checkpoint
from fl_lightning.federation.algorithm import register
from fl_lightning.federation.checkpoint import CorruptCheckpointError, atomic_save, safe_load
from fl_lightning.federation.run_state import RunState
from fl_lightning.federation.server_checkpoint import ServerCheckpoint, load_server_checkpoint, load_server_state
from fl_lightning.federation.simulation import Simulation
from tests.conftest import CONF


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
        return load_config(CONF / "fedavg_digits_tiny.yaml",
                           ["--output_dir", str(tmp_path / name), "--federation.rounds", str(rounds),
                            "--partition.num_clients", "4", "--logging.progress", "false",
                            "--algorithm", "test_frozen_table"])

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
