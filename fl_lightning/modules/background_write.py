"""A checkpoint written in the background: taken at once, copied to host memory, written whole by one thread.

Pre-training's epoch state (``pretraining.py``) is the Trainer's whole state: for ViT-L/16 a 3.6 GB file, written
at every epoch's end while every GPU waits. Here the write is split in two:

* :func:`host_copy` — at the epoch's end, on the training thread: the checkpoint's containers rebuilt and every
  tensor copied to host memory (on CUDA into pinned memory, ``non_blocking``, then one synchronize), so the steps
  that follow, which update the weights and the optimizer's moments in place, cannot reach what is written;
* :class:`BackgroundWriter` — one thread, at most one write in flight; the caller waits for the previous write (and
  takes its error) before it hands over the next;
* :func:`write_checkpoint` — the write itself: ``torch.save`` into a temp file beside the target, fsync, rename
  (``durable_write.place``): a kill at any point leaves the previous version whole.

Departure from Lightning's ``AsyncCheckpointIO`` (which also writes on a thread): it clones the checkpoint's
tensors where they are, so on a GPU it holds a second copy of the weights and moments in GPU memory until the write
ends (3.6 GB for ViT-L/16 with AdamW); :func:`host_copy` holds that copy in host memory instead, and its errors are
returned to the caller at a point it chooses (:meth:`BackgroundWriter.wait`), not raised at the next save.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fl_lightning.durable_write import disk_full_error, place

__all__ = ["host_copy", "BackgroundWriter", "write_checkpoint"]


def host_copy(obj: Any) -> Any:
    """``obj`` (a checkpoint: dicts, lists, tuples, tensors and plain values) with every container rebuilt and every
    tensor's storage copied to host memory, so that nothing in the copy changes when the original does.

    A storage that several tensors view is copied once and viewed alike (as ``torch.save`` writes it once), so the
    copy serializes to the original's bytes on CPU; from a GPU the storages' location in the file is ``cpu``. CUDA
    storages go into pinned host memory with ``non_blocking`` copies and one ``torch.cuda.synchronize`` at the end:
    the GPU holds no second copy. Other values are deep-copied (plain values: themselves).
    """
    storages: dict[Any, torch.Tensor] = {}  # a source storage -> its host bytes
    copied = _rebuilt(obj, storages)
    for device in {key[0] for key in storages if isinstance(key, tuple) and key[0].type == "cuda"}:
        torch.cuda.synchronize(device)  # the non_blocking copies into pinned memory have landed
    return copied


def _rebuilt(obj: Any, storages: dict[Any, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return _host_tensor(obj, storages)
    if isinstance(obj, dict):
        out = copy.copy(obj)  # the same type (OrderedDict, defaultdict) and attributes (a state dict's _metadata)
        for key, value in obj.items():
            out[key] = _rebuilt(value, storages)
        return out
    if isinstance(obj, list):
        return type(obj)(_rebuilt(v, storages) for v in obj)
    if isinstance(obj, tuple):
        items = [_rebuilt(v, storages) for v in obj]
        return type(obj)(*items) if hasattr(type(obj), "_fields") else type(obj)(items)  # a namedtuple, torch.Size
    return copy.deepcopy(obj)


def _host_tensor(t: torch.Tensor, storages: dict[Any, torch.Tensor]) -> torch.Tensor:
    """``t`` as a view of its storage's host copy (made once per storage), ``requires_grad`` and Parameter kept."""
    if t.layout != torch.strided or t.is_quantized or t.is_conj() or t.is_neg() or type(t) not in (torch.Tensor, nn.Parameter):
        return t.detach().to("cpu", copy=True)  # not seen in a Trainer's checkpoint: a plain copy
    storage = t.untyped_storage()
    key = (storage.device, storage.data_ptr()) if storage.data_ptr() else id(t)
    if key not in storages:
        whole = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)  # (nbytes,) bytes
        if whole.is_cuda:
            host = torch.empty(whole.shape, dtype=torch.uint8, pin_memory=True)
            host.copy_(whole, non_blocking=True)
        else:
            host = whole.to("cpu", copy=True)
        storages[key] = host
    out = torch.empty(0, dtype=t.dtype).set_(storages[key].untyped_storage(), t.storage_offset(), t.size(), t.stride())
    if isinstance(t, nn.Parameter):
        return nn.Parameter(out, requires_grad=t.requires_grad)
    return out.requires_grad_(t.requires_grad) if t.is_leaf else out


def write_checkpoint(checkpoint: Any, path: Path) -> None:
    """``torch.save`` of ``checkpoint`` into ``<path>.tmp``, fsync'ed and renamed over ``path``: ``path`` holds the
    new checkpoint or its previous version whole. On failure the temp file is removed; lack of space raises the one
    line of :class:`~fl_lightning.errors.DiskFullError` (the bytes needed estimated by the previous version)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")  # one fixed name: a killed write's leftover is replaced by the next
    try:
        torch.save(checkpoint, tmp)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        full = disk_full_error(err, path, lambda: _tensor_bytes(checkpoint), needed_is="its tensors' size")
        if full is not None:
            raise full from err
        raise
    place(tmp, path, durable=True)  # on disk before the rename: a crash leaves the previous version's whole file


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the storages the tensors in ``obj`` view, each storage once (a serialized checkpoint's bulk)."""
    seen: dict[Any, int] = {}
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            seen[(storage.device, storage.data_ptr()) if storage.data_ptr() else id(item)] = storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return sum(seen.values())


class BackgroundWriter:
    """Runs one write at a time on one thread (started at the first :meth:`submit`, ended by :meth:`close`).

    The caller keeps the order: :meth:`wait` for the write in flight, and deal with its error, before the next
    :meth:`submit`; :meth:`close` waits for the last one. Errors are returned, never raised, so the caller decides
    where they surface (on one process, at once; over ranks, through an agreement every rank joins).

    Example::

        writer = BackgroundWriter("epoch-state")
        writer.submit(write_checkpoint, host_copy(checkpoint), path)
        ...  # train the next epoch
        error = writer.wait()  # None: the file is on disk
        error = writer.close()
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    @property
    def busy(self) -> bool:
        """A write was submitted and not yet waited for."""
        return self._pending is not None

    def submit(self, write: Callable[..., None], *args: Any) -> None:
        """Start ``write(*args)`` on the writer's thread.

        Raises:
            RuntimeError: a write is in flight (call :meth:`wait` first).
        """
        if self._pending is not None:
            raise RuntimeError(f"{self.name}: a write is in flight; wait() for it before the next")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._pending = self._pool.submit(write, *args)

    def wait(self) -> BaseException | None:
        """Block until the write in flight has ended; its error, or None (it succeeded, or none was in flight)."""
        if self._pending is None:
            return None
        error = self._pending.exception()  # interrupted (Ctrl-C): the write stays pending for the next wait
        self._pending = None
        return error

    def close(self) -> BaseException | None:
        """:meth:`wait`, then end the thread; the writer may be used again (a new thread)."""
        error = self.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        return error
