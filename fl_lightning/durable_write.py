"""The one durable write: a file holds its old content or its new content, never a part.

Every file the library replaces goes through here: it is written to a new temp file beside it
(``.<name>.<random>.tmp``, the pattern the sweeps of killed writes look for), fsync'ed when asked, and renamed
over it. On any failure the temp file is removed and the file it would have replaced is intact; a failure for
lack of space (ENOSPC/EDQUOT, or torch's ``inline_container`` error on a full disk) is the one line of
:class:`~fl_lightning.errors.DiskFullError` naming the file, the bytes it needed and the space free.

* :func:`atomic_path`: a temp path to write with any library (``torch.save``, PIL, matplotlib, ``np.save``).
* :func:`write_text_atomic`, :func:`write_bytes_atomic`: the same for text and bytes.
* :func:`written_temp` and :func:`place`: the two steps apart, for a writer that renames later (in a thread, or
  on one rank after the others agree).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from fl_lightning.errors import DiskFullError

__all__ = ["atomic_path", "write_text_atomic", "write_bytes_atomic", "written_temp", "place", "disk_full_error", "leftover_temps"]

Needed = int | Callable[[], int | None] | None  # the bytes a write needs, a function giving them, or unknown
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")  # written_temp's names


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = False, needed: Needed = None, needed_is: str = "its size") -> Iterator[Path]:
    """A new temp file beside ``path`` for the block to write; renamed over ``path`` when the block ends.

    Args:
        durable: fsync before the rename (survives a power cut, not only a killed process).
        needed, needed_is: the bytes the write needs and where they come from, for the message of a full disk
            (see :func:`disk_full_error`); unknown, the temp file's size or the previous version's stands in.

    Raises:
        DiskFullError: one line when there is no space (the temp file removed, ``path`` intact).
    """
    path = Path(path)
    with written_temp(path, needed=needed, needed_is=needed_is) as tmp:
        yield tmp
    place(tmp, path, durable=durable, needed=needed, needed_is=needed_is)


def write_text_atomic(path: str | Path, text: str, *, durable: bool = False) -> None:
    """``path`` holds ``text`` in UTF-8 (as given: a CSV's ``\\r\\n`` stays) or what it held before, never a part."""
    with (
        atomic_path(path, durable=durable, needed=lambda: len(text.encode())) as tmp,
        tmp.open("w", encoding="utf-8", newline="") as f,
    ):
        f.write(text)


def write_bytes_atomic(path: str | Path, data: bytes, *, durable: bool = False) -> None:
    """``path`` holds ``data`` or what it held before, never a part."""
    with atomic_path(path, durable=durable, needed=len(data)) as tmp, tmp.open("wb") as f:
        f.write(data)


@contextlib.contextmanager
def written_temp(path: Path, *, needed: Needed = None, needed_is: str = "its size") -> Iterator[Path]:
    """A new empty temp file beside ``path`` (``.<name>.<random>.tmp``) for the block to write; it stays for
    :func:`place` when the block ends, and is removed when the block fails (lack of space: :class:`DiskFullError`)."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    # created as open() creates a file (mode 0o666 less the umask: others may read it, unlike mkstemp's 0o600)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        full = disk_full_error(err, path, needed, needed_is=needed_is)
        if full is not None:
            raise full from err
        raise


def leftover_temps(folder: str | Path) -> list[Path]:
    """The temp files of writes a kill interrupted in ``folder`` (not below it): ``.<name>.<12 hex digits>.tmp``, as
    :func:`written_temp` names them — no rename ever comes for them; the folder's owner deletes them at its next
    start. Nothing else matches (a user's dotfile, another tool's temp file)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and _TEMP_NAME.fullmatch(p.name))


def place(tmp: str | Path, path: str | Path, *, durable: bool = True, needed: Needed = None, needed_is: str = "its size") -> None:
    """Rename the whole file ``tmp`` over ``path``, fsync'ed first when ``durable``; on failure ``tmp`` is removed
    and lack of space raises :class:`DiskFullError` (``needed`` unknown: ``tmp``'s size)."""
    try:
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        if needed is None:
            needed = _file_size(tmp)
        Path(tmp).unlink(missing_ok=True)
        full = disk_full_error(err, Path(path), needed, needed_is=needed_is)
        if full is not None:
            raise full from err
        raise


def _fsync(name: str | Path) -> None:
    fd = os.open(name, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_size(name: str | Path) -> int | None:
    """The size of the file ``name``, or None when it cannot be read."""
    try:
        return os.stat(name).st_size
    except OSError:
        return None


# ----------------------------------------------------------------------------- a full disk, in one line


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _no_space_errno(err: BaseException) -> int | None:
    """ENOSPC or EDQUOT of an OSError anywhere in ``err``'s chain (torch buries it under its own RuntimeError)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            return err.errno
        err = err.__cause__ or err.__context__
    return None


def disk_full_error(err: BaseException, path: Path, needed: Needed, *, needed_is: str = "its size") -> DiskFullError | None:
    """The one-line error for a write of ``path`` that failed for lack of space, or None when ``err`` is another
    failure. Call it after the partial temp file is removed: the free space it reports is what the user has.

    Lack of space is an OSError ENOSPC/EDQUOT anywhere in the chain, or torch's ``inline_container``
    RuntimeError (its writer's failed write) while less than the bytes needed are free.

    Args:
        err: what the write raised.
        path: the file that was being written.
        needed: bytes the write needed, or a function giving them (asked only when ``err`` may be a lack of
            space); None (or None given) when unknown: then the size of ``path``'s previous version stands in,
            said to be an estimate.
        needed_is: where ``needed`` comes from, in words (``"its size"``, ``"its serialized size"``).
    """
    path = Path(path)
    code = _no_space_errno(err)
    if code is None and not (isinstance(err, RuntimeError) and "inline_container" in str(err)):
        return None
    size = needed() if callable(needed) else needed
    if size is None and path.is_file():
        size, needed_is = path.stat().st_size, "the size of its previous version, an estimate"
    try:
        free: int | None = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if code is None and (free is None or size is None or free >= size):
        return None  # torch's writer failed, but not for want of space
    need = f"it needs {_size(size)} ({needed_is})" if size is not None else "its size is unknown"
    room = "?" if free is None else _size(free)
    where = f"the disk quota there is used up ({room} free on the filesystem)" if code == errno.EDQUOT else f"{room} free there"
    return DiskFullError(
        f"disk full: '{path}' could not be written: {need}, {where}; any earlier version of it is "
        f"intact: free space there, or move output_dir to a disk with room; then continue the run "
        f"with --resume",
        str(path),
        size,
        free,
    )
