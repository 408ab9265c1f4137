"""Atomic, safe checkpoints: temp file + rename, and ``torch.load(weights_only=True)`` only.

A save that fails for lack of space (ENOSPC/EDQUOT, or torch's ``inline_container`` error on a full disk)
raises :class:`~fl_lightning.errors.DiskFullError`: one line naming the file, the bytes it needed, the space
free and what to do; the file it would have replaced is intact and its temp file removed.
"""

from __future__ import annotations

import errno
import os
import pickle
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_lightning.durable_write import disk_full_error, place, written_temp
from fl_lightning.errors import UsageError

__all__ = ["atomic_save", "safe_load", "reserved_memmap", "CorruptCheckpointError", "DurableWriter"]

_SERIALIZED = "its serialized size"  # where a checkpoint's needed bytes come from, in a full disk's line


class CorruptCheckpointError(UsageError):
    """A checkpoint file of the run that cannot be read back (truncated, edited, or not ours)."""


def atomic_save(obj: Any, path: str | Path, *, durable: bool = True, checksum: bool = True) -> None:
    """Write ``obj`` (tensors, dicts, lists, numbers, strings) so that ``path`` is never half-written.

    Args:
        durable: fsync before the rename (survives a power cut, not only a killed process).
        checksum: let torch compute the zip format's CRC-32 of every tensor. ``torch.load`` never checks
            it, so a file only other tools read needs it; the engine's transient per-client records skip
            it (~0.7 ms per 2.4 MB record).
    """
    path = Path(path)
    place(
        _write_temp(obj, path, checksum=checksum),
        path,
        durable=durable,
        needed=lambda: _serialized_bytes(obj),
        needed_is=_SERIALIZED,
    )


def _write_temp(obj: Any, path: Path, *, checksum: bool) -> Path:
    """``torch.save(obj)`` into a new temp file beside ``path`` (:func:`~fl_lightning.durable_write.written_temp`),
    its name returned; on any failure the temp file is removed, and lack of space raises
    :class:`~fl_lightning.errors.DiskFullError`."""
    from torch.utils.serialization import config as serialization

    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        written_temp(path, needed=lambda: _serialized_bytes(obj), needed_is=_SERIALIZED) as tmp,
        open(tmp, "wb") as f,
        serialization.patch({"save.compute_crc32": checksum}),
    ):
        torch.save(obj, f)
    return tmp


def reserved_memmap(path: Path, shape: tuple[int, ...], dtype: np.dtype | type) -> np.memmap:
    """A new zero-filled ``.npy`` memory map of ``shape`` at ``path`` with its blocks reserved on disk
    (``posix_fallocate``): a full disk raises :class:`~fl_lightning.errors.DiskFullError` (one line; the file
    removed) here, not SIGBUS at the first page the map cannot back. A file system that cannot reserve blocks
    (EOPNOTSUPP) gets the map as it is."""
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    try:
        with open(path, "r+b") as f:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            return array
        del array
        Path(path).unlink(missing_ok=True)
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raise disk_full_error(err, Path(path), size, needed_is="its size") from err
    return array


class _Counter:
    """A file that keeps only the count of the bytes written to it."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data: bytes) -> int:
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def _serialized_bytes(obj: Any) -> int | None:
    """The size of ``torch.save(obj)``, serialized into a counter (no memory, no disk; the failure path only)."""
    from torch.utils.serialization import config as serialization

    counter = _Counter()
    try:
        with serialization.patch({"save.compute_crc32": False}):  # the CRC's field has its size either way
            torch.save(obj, counter)
    except Exception:  # noqa: BLE001 — the size is only for the message
        return None
    return counter.n


class DurableWriter:
    """``atomic_save(obj, path, durable=True)`` with the fsync and the rename off the caller's path.

    :meth:`save` writes the temp file at once (into the page cache: a killed process loses nothing) and a
    thread then fsyncs it and renames it over ``path``, so ``path`` is always a whole, durable file: the
    previous one until the new one is on disk. The next :meth:`save` and :meth:`wait` join that thread
    first (and re-raise its error). The server's per-round checkpoint uses it: a round no longer waits for
    the disk, and a crash before the rename resumes from the round before, to the same result.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(
        self,
        obj: Any,
        path: str | Path,
        *,
        first: Sequence[tuple[Any, Path]] = (),
        remove: Callable[[], list[Path]] | None = None,
    ) -> None:
        """Write ``obj`` to ``path`` durably in the background.

        Args:
            first: ``(obj, path)`` pairs made durable and renamed into place before ``path`` (files ``path`` refers
                to: a crash leaves either the old ``path`` or the new one with everything it names).
            remove: called once ``path`` is in place: the files it returns are deleted (files no checkpoint names
                any more).
        """
        self.wait()
        pairs = [*((o, Path(p)) for o, p in first), (obj, Path(path))]
        temps: list[tuple[Path, Path]] = []
        try:
            for item, target in pairs:
                temps.append((_write_temp(item, target, checksum=True), target))
        except BaseException:
            for tmp, _ in temps:
                tmp.unlink(missing_ok=True)
            raise
        self._thread = threading.Thread(target=self._finish, args=(temps, remove), name="fl-checkpoint")
        self._thread.start()  # not a daemon: an interpreter that exits still finishes the rename

    def _finish(self, temps: list[tuple[Path, Path]], remove: Callable[[], list[Path]] | None) -> None:
        for i, (tmp, path) in enumerate(temps):
            try:
                place(tmp, path, durable=True, needed_is=_SERIALIZED)  # needed: the temp file's size
            except BaseException as err:  # noqa: BLE001 — re-raised by wait()
                for later, _ in temps[i + 1 :]:
                    later.unlink(missing_ok=True)
                self._error = err
                return
        if remove is not None:
            try:
                for stale in remove():
                    stale.unlink(missing_ok=True)
            except OSError:  # a file left behind costs space, not correctness: the next save tries again
                pass

    def wait(self) -> None:
        """Block until the last save is durable at its path; raise its error, if any."""
        if self._thread is not None:
            _join(self._thread)
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err


def _join(thread: threading.Thread, start_grace_s: float = 5.0) -> None:
    """``thread.join()``, also for a thread whose ``start()`` a signal interrupted (SIGTERM's handler raises inside
    ``start()``'s wait for the new thread): the thread runs, but ``join`` refuses it until it has marked itself
    started. A thread that never started is given up after ``start_grace_s`` (its temp files are swept at resume)."""
    deadline = time.monotonic() + start_grace_s
    while True:
        try:
            thread.join()
            return
        except RuntimeError:  # "cannot join thread before it is started"
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def safe_load(path: str | Path) -> Any:
    """Load a checkpoint without unpickling arbitrary objects.

    Raises:
        CorruptCheckpointError: one line naming the file when it cannot be read (never torch's advice to
            turn ``weights_only`` off: a checkpoint that needs it is not one of ours).
    """
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, ValueError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        why = (
            "it is empty"
            if path.is_file() and path.stat().st_size == 0
            else (
                "it holds objects other than tensors and plain values"
                if isinstance(err, pickle.UnpicklingError)
                else "it is truncated or not a torch checkpoint"
            )
        )
        raise CorruptCheckpointError(
            f"checkpoint '{path}' cannot be read: {why}; delete it to redo that step (a client record or a plan), "
            f"or start the run afresh in a new folder"
        ) from None
