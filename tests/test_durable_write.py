"""The one durable write (fl_lightning/durable_write.py): a file holds its old content or its new content, never a
part; a failed write leaves no temp file; a full disk (faked: ENOSPC/EDQUOT where the write, the fsync or the
rename happens) is the one line of DiskFullError naming the file."""

from __future__ import annotations

import errno
import fnmatch
import os
from pathlib import Path

import pytest

from fl_lightning import durable_write
from fl_lightning.durable_write import atomic_path, place, write_bytes_atomic, write_text_atomic, written_temp
from fl_lightning.errors import DiskFullError

OLD = b"the old content\n"


class Boom(Exception):
    pass


@pytest.fixture
def old(tmp_path: Path) -> Path:
    path = tmp_path / "out" / "file.bin"
    path.parent.mkdir()
    path.write_bytes(OLD)
    return path


def _assert_kept(path: Path) -> None:
    assert path.read_bytes() == OLD
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


def _no_space(code: int = errno.ENOSPC) -> OSError:
    return OSError(code, os.strerror(code))


def test_a_write_is_whole_and_leaves_nothing_beside_it(old: Path) -> None:
    write_bytes_atomic(old, b"new" * 1000)
    assert old.read_bytes() == b"new" * 1000
    write_text_atomic(old, "a,b\r\né,ü\r\n", durable=True)  # as given (no newline translation), in UTF-8
    assert old.read_bytes() == "a,b\r\né,ü\r\n".encode()
    assert [p.name for p in old.parent.iterdir()] == [old.name]


def test_the_temp_file_is_beside_the_file_and_named_for_the_sweeps(old: Path) -> None:
    """``.<name>.<random>.tmp`` in the same folder (a rename, not a copy; server_checkpoint's sweep looks for it),
    each write its own (shares and threads may write one file at once)."""
    with atomic_path(old) as first, atomic_path(old) as second:
        assert first.parent == second.parent == old.parent and first != second
        assert fnmatch.fnmatch(first.name, f".{old.name}.*.tmp") and fnmatch.fnmatch(second.name, f".{old.name}.*.tmp")
        first.write_bytes(b"1")
        second.write_bytes(b"2")
    assert old.read_bytes() == b"1" and [p.name for p in old.parent.iterdir()] == [old.name]


@pytest.mark.parametrize(
    "error",
    [Boom("the writer failed"), KeyboardInterrupt(), _no_space(errno.EACCES)],
    ids=["exception", "interrupt", "another-OSError"],
)
def test_a_writer_that_fails_midway_keeps_the_old_file(old: Path, error: BaseException) -> None:
    with pytest.raises(type(error)) as caught, atomic_path(old, durable=True) as tmp:
        tmp.write_bytes(b"half of the new")
        raise error
    assert caught.value is error and not isinstance(caught.value, DiskFullError)  # not ours to rename
    _assert_kept(old)


@pytest.mark.parametrize(
    "code, says", [(errno.ENOSPC, "free there"), (errno.EDQUOT, "the disk quota there is used up")], ids=["ENOSPC", "EDQUOT"]
)
def test_no_space_while_writing_is_one_line_naming_the_file(old: Path, code: int, says: str) -> None:
    with pytest.raises(DiskFullError) as caught, atomic_path(old, needed=4096) as tmp:
        tmp.write_bytes(b"part")
        raise _no_space(code)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"disk full: '{old}' could not be written: it needs 4.0 KiB")
    assert says in message and caught.value.needed == 4096 and caught.value.path == str(old)
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == code  # --debug shows it
    _assert_kept(old)


@pytest.mark.parametrize("where", ["replace", "fsync"])
def test_no_space_at_the_rename_or_the_fsync_is_one_line_sized_by_the_temp_file(old, monkeypatch, where) -> None:
    """A network file system may report a full disk as late as the fsync or the rename."""

    def fail(*args, **kwargs):
        raise _no_space()

    monkeypatch.setattr(durable_write.os, where, fail)
    with pytest.raises(DiskFullError, match=rf"^disk full: '{old}' could not be written: it needs 3 bytes \(its size\)"):
        write_bytes_atomic(old, b"new", durable=True)
    monkeypatch.undo()
    _assert_kept(old)


def test_text_and_bytes_say_what_they_needed(old: Path, monkeypatch) -> None:
    real = Path.open

    def full_open(self, mode="r", *args, **kwargs):
        f = real(self, mode, *args, **kwargs)
        if "w" in mode:
            f.close()
            raise _no_space()
        return f

    monkeypatch.setattr(Path, "open", full_open)
    with pytest.raises(DiskFullError, match="it needs 5 bytes"):
        write_text_atomic(old, "ééx")  # 3 characters, 5 bytes of UTF-8
    with pytest.raises(DiskFullError, match="it needs 2 bytes"):
        write_bytes_atomic(old, b"ab")
    monkeypatch.undo()
    _assert_kept(old)


def test_an_unknown_size_is_estimated_by_the_previous_version(old: Path) -> None:
    with (
        pytest.raises(DiskFullError, match=r"it needs 16 bytes \(the size of its previous version, an estimate\)"),
        atomic_path(old),
    ):
        raise _no_space()
    _assert_kept(old)


def test_the_two_steps_apart_keep_the_temp_until_placed(old: Path) -> None:
    """:func:`written_temp` leaves the whole temp file for :func:`place` (a writer that renames in a thread)."""
    with written_temp(old) as tmp:
        tmp.write_bytes(b"new")
    assert tmp.read_bytes() == b"new" and old.read_bytes() == OLD
    place(tmp, old)
    assert old.read_bytes() == b"new" and not tmp.exists()


def test_the_file_gets_the_mode_open_gives_not_a_private_temps(tmp_path):
    import os

    from fl_lightning.durable_write import write_text_atomic as write

    old = os.umask(0o022)
    try:
        write(tmp_path / "shared.txt", "readable by the group's other users")
    finally:
        os.umask(old)
    assert (tmp_path / "shared.txt").stat().st_mode & 0o777 == 0o644


def test_the_temp_files_of_killed_writes_are_found_and_nothing_else(tmp_path):
    from fl_lightning.durable_write import leftover_temps, written_temp

    with written_temp(tmp_path / "metrics.csv") as tmp:  # a write a kill interrupts before its rename
        tmp.write_text("half")
    (tmp_path / ".bashrc").write_text("a user's dotfile")
    (tmp_path / ".other.tmp").write_text("another tool's")
    (tmp_path / "sub").mkdir()
    assert leftover_temps(tmp_path) == [tmp] and leftover_temps(tmp_path / "missing") == []


def test_a_resumed_run_deletes_the_temp_files_a_kill_left_in_its_folder(tmp_path):
    from fl_lightning.config.loading import load_config
    from fl_lightning.federation.simulation import Simulation
    from tests.conftest import CONF

    cfg = load_config(
        CONF / "fedavg_digits_tiny.yaml",
        ["--output_dir", str(tmp_path), "--federation.rounds", "1", "--logging.progress", "false"],
    )
    Simulation(cfg=cfg, loggers=[]).run()
    left = cfg.run_dir / ".metrics.csv.0123456789ab.tmp"
    left.write_text("half a file")
    Simulation(cfg=cfg, loggers=[], resume=True).run()
    assert not left.exists() and (cfg.run_dir / "metrics.csv").is_file()
