"""A checkpoint written in the background (``modules/background_write.py``): the host copy is independent of the
original and serializes to its bytes, the write is whole or absent, and the writer runs one write at a time,
returning its error."""

from __future__ import annotations

import errno
import io
import threading
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

from fl_lightning.errors import DiskFullError
from fl_lightning.modules.background_write import BackgroundWriter, host_copy, write_checkpoint

Pair = namedtuple("Pair", "a b")


def _checkpoint() -> dict:
    """A Trainer-like checkpoint: a module's state dict (an OrderedDict with ``_metadata``), optimizer moments, two
    views of one storage, nested plain containers, a namedtuple, a torch.Size and a Parameter."""
    layer = nn.Linear(3, 2)
    base = torch.arange(12.0)
    return {
        "state_dict": layer.state_dict(),
        "optimizer_states": [
            {"state": {0: {"exp_avg": torch.ones(2, 3), "step": torch.tensor(4.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
        ],
        "views": [base[2:5], base.view(3, 4)[:, 1]],  # one storage, two strided views
        "callbacks": {
            "best_k_models": {"a.ckpt": torch.tensor(0.5)},
            "pair": Pair(1, torch.zeros(2)),
            "size": torch.Size([2, 3]),
        },
        "param": nn.Parameter(torch.full((2,), 3.0)),
        "epoch": 1,
    }


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_the_host_copy_serializes_to_the_original_s_bytes_and_keeps_its_structure() -> None:
    original = _checkpoint()
    copied = host_copy(original)
    assert _saved(copied) == _saved(original)  # same values, same storages shared, same containers
    assert copied["state_dict"]._metadata == original["state_dict"]._metadata
    assert type(copied["callbacks"]["pair"]).__name__ == "Pair" and type(copied["callbacks"]["size"]) is torch.Size
    assert isinstance(copied["param"], nn.Parameter) and copied["param"].requires_grad
    a, b = copied["views"]
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # still one storage
    assert a.untyped_storage().data_ptr() != original["views"][0].untyped_storage().data_ptr()  # but not the original's


def test_the_host_copy_does_not_change_when_the_original_does() -> None:
    original = _checkpoint()
    before = _saved(original)
    copied = host_copy(original)
    with torch.no_grad():  # what the next epoch's steps and callbacks do: in-place updates, dict edits
        for tensor in original["state_dict"].values():
            tensor.add_(1.0)
        original["optimizer_states"][0]["state"][0]["exp_avg"].mul_(2.0)
        original["views"][0].zero_()
        original["param"].fill_(0.0)
    original["callbacks"]["best_k_models"]["b.ckpt"] = torch.tensor(0.9)
    original["optimizer_states"][0]["param_groups"][0]["lr"] = 0.05
    assert _saved(original) != before
    assert _saved(copied) == before


def test_a_full_disk_is_one_line_and_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    class NoSpace:
        def __reduce__(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "state.ckpt"
    write_checkpoint({"w": torch.ones(4)}, path)
    with pytest.raises(DiskFullError, match=r"^disk full: '.*state\.ckpt' could not be written: it needs 16 bytes"):
        write_checkpoint({"w": torch.zeros(4), "x": NoSpace()}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.ckpt"]  # the temp file removed
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(4))


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("test-writer")]


def test_the_writer_runs_one_write_at_a_time_and_returns_its_error() -> None:
    writer, done = BackgroundWriter("test-writer"), []

    def slow(tag: str) -> None:
        time.sleep(0.05)
        done.append(tag)

    writer.submit(slow, "first")
    assert writer.busy and done == []  # not waited for: the caller goes on
    with pytest.raises(RuntimeError, match="a write is in flight"):
        writer.submit(slow, "second")
    assert writer.wait() is None and done == ["first"] and not writer.busy
    assert writer.wait() is None  # nothing in flight

    def fails() -> None:
        raise OSError(errno.EACCES, "Permission denied")

    writer.submit(fails)
    error = writer.wait()
    assert isinstance(error, OSError) and error.errno == errno.EACCES  # returned, not raised
    writer.submit(slow, "third")
    assert _writer_threads()
    assert writer.close() is None and done == ["first", "third"]
    assert not _writer_threads()  # the thread has ended
    assert writer.close() is None
