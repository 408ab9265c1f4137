"""A full disk is one line (fl_lightning/durable_write.py, under checkpoint.py's and run_folder.py's writes): a save that fails
for lack of space raises DiskFullError naming the file, the bytes it needed and the space free; the file it
would have replaced is intact and no temp file is left.

The disk is faked (a write that raises ENOSPC/EDQUOT, torch's own error with a faked ``shutil.disk_usage``), and
real where this process may mount a 600 KiB tmpfs (root): one test in process, one CLI run (slow).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from fl_lightning import durable_write
from fl_lightning.durable_write import write_text_atomic
from fl_lightning.errors import DiskFullError, UsageError
from fl_lightning.federation.storage import checkpoint
from fl_lightning.federation.storage.checkpoint import DurableWriter, atomic_save, safe_load
from fl_lightning.federation.storage.run_folder import write_metrics_csv
from tests.conftest import run_cli
from tests.tiny_runs import TINY, tiny_overrides

_TORCH_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"  # what torch says
_Usage = namedtuple("_Usage", "total used free")


def _state(n: int) -> dict:
    return {"round": 3, "weights": torch.arange(n, dtype=torch.float32)}


def _serialized(obj) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return len(buffer.getvalue())


def _save(how: str, obj, path: Path) -> None:
    if how == "atomic_save":
        atomic_save(obj, path)
    else:  # the server's per-round checkpoint: the temp file at once, fsync + rename in a thread
        writer = DurableWriter()
        writer.save(obj, path)
        writer.wait()


@pytest.fixture
def old(tmp_path):
    """An earlier, good server.pt."""
    path = tmp_path / "checkpoints" / "server.pt"
    atomic_save(_state(10), path)
    return path, path.read_bytes()


def _assert_kept(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before and safe_load(path)["weights"].numel() == 10
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the partial temp file is gone


class _FullAfter:
    """A file that takes ``room`` bytes, then fails as a full disk does (the write of the rest raises)."""

    def __init__(self, f, room: int, code: int) -> None:
        self._f, self._room, self._code = f, room, code

    def write(self, data) -> int:
        if len(data) > self._room:
            self._f.write(data[: self._room])
            self._room = 0
            raise OSError(self._code, os.strerror(self._code))
        self._room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


@pytest.mark.parametrize("how", ["DurableWriter", "atomic_save"])
@pytest.mark.parametrize(
    "code, says", [(errno.ENOSPC, "free there"), (errno.EDQUOT, "the disk quota there is used up")], ids=["ENOSPC", "EDQUOT"]
)
def test_no_space_while_writing_is_one_line(old, monkeypatch, how, code, says):
    path, before = old
    monkeypatch.setattr(checkpoint, "open", lambda *a, **k: _FullAfter(builtins.open(*a, **k), 1000, code), raising=False)
    state = _state(300_000)
    with pytest.raises(DiskFullError) as caught:
        _save(how, state, path)
    err = caught.value
    message = str(err)
    assert isinstance(err, UsageError) and "\n" not in message  # the CLI prints it as one line, exit status 2
    assert message.startswith(f"disk full: '{path}' could not be written: it needs 1.1 MiB (its serialized size), ")
    assert says in message and message.endswith("then continue the run with --resume")
    assert err.needed == _serialized(state) and err.free is not None
    assert isinstance(err.__cause__, RuntimeError) and "inline_container" in str(err.__cause__)  # --debug shows it
    _assert_kept(path, before)


@pytest.mark.parametrize("free, full", [(1000, True), (10**12, False)], ids=["disk-full", "room-left"])
def test_torchs_own_error_is_a_full_disk_only_when_the_space_is_short(old, monkeypatch, free, full):
    """torch's writer error with no OSError under it: a full disk when less than the checkpoint's size is free."""
    path, before = old
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if hasattr(f, "fileno"):  # the checkpoint's file (not a size count)
            f.write(b"PK\x03\x04 partial")
            raise RuntimeError(_TORCH_FULL)
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    monkeypatch.setattr(durable_write.shutil, "disk_usage", lambda p: _Usage(10**12, 10**12 - free, free))
    if full:
        with pytest.raises(DiskFullError, match=r"it needs 1\.1 MiB \(its serialized size\), 1000 bytes free there"):
            _save("DurableWriter", _state(300_000), path)
    else:
        with pytest.raises(RuntimeError, match="inline_container") as caught:  # another failure: not ours to name
            _save("DurableWriter", _state(300_000), path)
        assert not isinstance(caught.value, DiskFullError)
    _assert_kept(path, before)


def test_without_its_size_the_previous_checkpoint_is_the_estimate(old, monkeypatch):
    path, before = old

    def save(obj, f, *args, **kwargs):
        raise RuntimeError(_TORCH_FULL)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    monkeypatch.setattr(durable_write.shutil, "disk_usage", lambda p: _Usage(10**9, 10**9 - 100, 100))
    with pytest.raises(
        DiskFullError,
        match=r"it needs 1\.5 KiB \(the size of its previous version, an estimate\), "
        r"100 bytes free there",
    ) as caught:
        atomic_save(_state(300_000), path)
    assert caught.value.needed == len(before)
    _assert_kept(path, before)


def test_no_space_at_the_background_fsync_is_one_line(old, monkeypatch):
    """A network file system reports a full disk as late as the fsync: the writer's thread keeps the one line."""
    path, before = old

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable_write.os, "fsync", fsync)
    writer, state = DurableWriter(), _state(300_000)
    writer.save(state, path)
    with pytest.raises(DiskFullError, match=r"it needs 1\.1 MiB \(its serialized size\)") as caught:
        writer.wait()
    assert caught.value.needed == _serialized(state)
    _assert_kept(path, before)


def test_no_space_for_a_text_file_of_the_run_folder_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.csv"
    write_metrics_csv(path, [{"round": 0, "accuracy": 0.5}])
    before = path.read_bytes()
    real = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: _FullAfter(real(self, *a, **k), 2, errno.ENOSPC))
    rows = [{"round": r, "accuracy": 0.5} for r in range(3)]
    with pytest.raises(
        DiskFullError,
        match=rf"disk full: '{path}' could not be written: it needs 37 bytes \(its "
        rf"size\), .* free there",
    ):  # "round,accuracy\r\n" + 3 * "0,0.5\r\n"
        write_metrics_csv(path, rows)
    with pytest.raises(DiskFullError, match="it needs 3 bytes"):
        write_text_atomic(path, "abc")
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]


# ----------------------------------------------------------------------------- a real 600 KiB disk


def test_a_real_full_disk(tiny_disk):
    path = tiny_disk / "checkpoints" / "server.pt"
    writer = DurableWriter()
    writer.save(_state(10), path)
    writer.wait()
    before = path.read_bytes()
    with pytest.raises(DiskFullError) as caught:
        writer.save(_state(300_000), path)  # 1.1 MiB into 600 KiB
        writer.wait()
    message = str(caught.value)
    assert message.startswith(f"disk full: '{path}' could not be written: it needs 1.1 MiB (its serialized size), ")
    assert caught.value.free > 500 * 1024  # the partial temp file is gone again: the disk is nearly empty
    _assert_kept(path, before)
    with pytest.raises(DiskFullError, match="metrics.csv' could not be written: it needs"):
        write_metrics_csv(tiny_disk / "metrics.csv", [{"round": r, "note": "x" * 1000} for r in range(700)])
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["checkpoints"]


@pytest.mark.slow
def test_a_run_into_a_full_disk_stops_with_one_line(tiny_disk):
    """The CLI into a 600 KiB disk with 150 KiB free: the frozen features' cache (180 KiB) does not fit."""
    (tiny_disk / "filler").write_bytes(bytes(450_000))
    out = run_cli("--config", str(TINY), *tiny_overrides(tiny_disk / "runs", rounds=1, clients=3))
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fl_lightning: disk full: "), out.stderr[-3000:]
    assert "feature_cache" in lines[0] and "--resume" in lines[0]
    assert not (tiny_disk / "runs" / "fedavg_digits_a0.5_s0" / ".lock").exists()


def test_the_error_survives_the_broadcast_to_the_other_ranks():
    import pickle

    err = DiskFullError("disk full: 'x' could not be written", "x", 1200, 500)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is DiskFullError and str(back) == str(err) and vars(back) == vars(err)
