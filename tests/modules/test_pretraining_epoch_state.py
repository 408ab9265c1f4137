"""Pre-training's epoch state is written in the background (``pretraining._EpochState``, ``background_write.py``):
the file holds the state of its epoch's end even when the next epoch's steps run before it is written, a failed
write surfaces at the next epoch's end or at the fit's end with its own line, and no writer thread outlives a fit.
"""

from __future__ import annotations

import errno
import os
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import lightning
import pytest
import torch
from torch.utils.data import TensorDataset

from fl_lightning.errors import DiskFullError
from fl_lightning.modules import pretraining
from fl_lightning.modules.pretraining import EPOCH_STATE
from tests.modules.tiny_vit import pretrain_tiny


def _pretrain(out: Path, max_epochs: int, callbacks=()):
    g = torch.Generator().manual_seed(1)
    y = torch.arange(24) % 3
    train = TensorDataset(torch.randn(24, 3, 16, 16, generator=g) + (y.float() - 1.0).view(-1, 1, 1, 1), y)
    val = TensorDataset(torch.randn(6, 3, 16, 16, generator=g), torch.arange(6) % 3)
    return pretrain_tiny(train, val, out, max_epochs=max_epochs, batch_size=8, lr=1e-2, seed=3, patience=5, callbacks=callbacks)


def _writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("epoch-state")]


class Stop(RuntimeError):
    pass


class Record(lightning.Callback):
    """The module's weights and the optimizer's moments at epoch 0's end (a copy); after epoch 1's first step,
    ``stepped`` is set (the weights have moved in place since); a crash at epoch 1's second step."""

    def __init__(self) -> None:
        self.at_end: dict[str, torch.Tensor] = {}
        self.stepped = threading.Event()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == 0:  # called before the epoch state's callback (a Checkpoint: last)
            self.at_end = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
            for i, s in trainer.optimizers[0].state_dict()["state"].items():
                self.at_end[f"exp_avg.{i}"] = s["exp_avg"].clone()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == 1 and batch_idx == 0:
            self.stepped.set()
        if trainer.current_epoch == 1 and batch_idx == 1:
            raise Stop("stopped in epoch 1")


def test_the_file_holds_its_epoch_s_end_while_the_next_epoch_trains(tmp_path: Path, one_thread, monkeypatch) -> None:
    """Epoch 0's write is held until epoch 1 has stepped (the weights and moments updated in place): the file must
    still hold epoch 0's end, so the state was copied when it was taken. The interrupted fit waits for the write."""
    record, real, late = Record(), pretraining.write_checkpoint, []

    def held(checkpoint, path) -> None:
        late.append(record.stepped.wait(timeout=60))  # serialized only once epoch 1 has trained a step
        real(checkpoint, path)

    monkeypatch.setattr(pretraining, "write_checkpoint", held)
    with pytest.raises(Stop):
        _pretrain(tmp_path, max_epochs=2, callbacks=[record])
    assert late == [True] and not _writers()
    state = torch.load(tmp_path / EPOCH_STATE, map_location="cpu", weights_only=True)
    assert state["epoch"] == 0
    saved = dict(state["state_dict"])
    for i, s in state["optimizer_states"][0]["state"].items():
        saved[f"exp_avg.{i}"] = s["exp_avg"]
    assert saved.keys() == record.at_end.keys()
    for k, v in record.at_end.items():
        assert torch.equal(saved[k], v), k
    best = torch.load(tmp_path / "checkpoints" / "best-epoch=0.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(best[k], record.at_end[k]) for k in best)  # the best one: epoch 0's weights too


def _failing_write(fail_at: int, calls: list[int]):
    real = pretraining.write_checkpoint

    def write(checkpoint, path) -> None:
        calls.append(int(checkpoint["epoch"]))
        if len(calls) == fail_at:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(checkpoint, path)

    return write


class Epochs(lightning.Callback):
    def __init__(self) -> None:
        self.started: list[int] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.started.append(trainer.current_epoch)


def test_a_failed_write_ends_the_fit_at_the_next_epoch_s_end(tmp_path: Path, one_thread, monkeypatch) -> None:
    """Epoch 1's write fails for lack of space: epoch 2 trains while it is written, and its end raises the error
    (epoch 3 never starts); the file is epoch 0's, whole, and a resumed pre-training starts from it."""
    calls: list[int] = []
    epochs = Epochs()
    monkeypatch.setattr(pretraining, "write_checkpoint", _failing_write(2, calls))
    with pytest.raises(OSError, match="No space left on device") as raised:
        _pretrain(tmp_path, max_epochs=4, callbacks=[epochs])
    assert raised.value.errno == errno.ENOSPC
    assert calls == [0, 1] and epochs.started == [0, 1, 2] and not _writers()
    assert torch.load(tmp_path / EPOCH_STATE, map_location="cpu", weights_only=True)["epoch"] == 0
    assert not (tmp_path / f"{EPOCH_STATE}.tmp").exists()


def test_the_last_write_s_full_disk_is_raised_at_the_fit_s_end(tmp_path: Path, one_thread, monkeypatch) -> None:
    """The last epoch's write runs out of space (a real torch.save whose pickling hits ENOSPC): the fit's end waits
    for it and raises the one line of a full disk naming the file; the file is the previous epoch's."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("epoch") == 1 and str(f).endswith(f"{EPOCH_STATE}.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(DiskFullError, match=rf"^disk full: '.*{EPOCH_STATE}' could not be written: it needs ") as raised:
        _pretrain(tmp_path, max_epochs=2)
    assert "\n" not in str(raised.value) and not _writers()
    assert torch.load(tmp_path / EPOCH_STATE, map_location="cpu", weights_only=True)["epoch"] == 0
    assert not (tmp_path / f"{EPOCH_STATE}.tmp").exists()


def test_a_finished_pretraining_leaves_no_state_and_no_thread(tmp_path: Path, one_thread) -> None:
    result = _pretrain(tmp_path, max_epochs=2)
    assert result.epochs == 2 and result.checkpoint.is_file()
    assert not (tmp_path / EPOCH_STATE).exists() and not _writers()


_KILLED_MID_WRITE = """
import io, os, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from fl_lightning.modules import pretraining
from tests.modules.test_pretraining_epoch_state import _pretrain

out, real = Path(sys.argv[1]), pretraining.write_checkpoint

def write(checkpoint, path):
    if checkpoint["epoch"] == 0:
        return real(checkpoint, path)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    with open(path.with_name(path.name + ".tmp"), "wb") as f:  # half of epoch 1's file, then killed
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (out / "killing").touch()
    time.sleep(120)

pretraining.write_checkpoint = write
_pretrain(out, max_epochs=2)
"""


@pytest.mark.slow  # ~20 s on 2 busy cores: a pre-training in a fresh process, killed, then two in this one
def test_a_kill_mid_write_leaves_the_previous_epoch_s_whole_file_and_resumes_exactly(tmp_path: Path, one_thread) -> None:
    """SIGKILL while epoch 1's state is half written: the file is epoch 0's, whole, and the pre-training called again
    reaches the uninterrupted run's weights bit for bit (the half-written temp file is replaced by the next write)."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    out = tmp_path / "killed"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", _KILLED_MID_WRITE, str(out)], cwd=REPO, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not (out / "killing").exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (out / "killing").exists(), child.stderr.read().decode()[-2000:] if child.poll() is not None else "timed out"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()
    assert (out / f"{EPOCH_STATE}.tmp").is_file()  # the half-written file
    assert torch.load(out / EPOCH_STATE, map_location="cpu", weights_only=True)["epoch"] == 0
    resumed = _pretrain(out, max_epochs=2)
    straight = _pretrain(tmp_path / "straight", max_epochs=2)
    assert resumed.checkpoint.name == straight.checkpoint.name
    a = torch.load(straight.checkpoint, weights_only=True)["state_dict"]
    b = torch.load(resumed.checkpoint, weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (out / EPOCH_STATE).exists() and not (out / f"{EPOCH_STATE}.tmp").exists()
