"""A split's preprocessed training inputs, kept in memory: a deterministic transform runs once per item.

A multi-round method visits every training image ``rounds × epochs`` times and the test split once a
round; when the split's transform has no randomness (resize, crop, normalise: the same tensor every
pass), running it again is pure overhead. :class:`PreprocessedSplit` wraps such a split: the first
read of item ``i`` runs the split as before (its own ``__getitem__``, transform included) and stores
the resulting tensor in one preallocated ``(N, *shape)`` block; every later read returns the stored
tensor. The values are the transform's own, so results are bit-identical to the uncached split.

* Only a transform made entirely of known deterministic steps is cached
  (:func:`is_deterministic`): any random step (augmentation) — or a step this module does not know —
  keeps the per-item transform.
* Memory is bounded: the block is allocated only when ``N × item bytes`` fits ``budget_bytes``
  (``data.cache_mb``); otherwise the split is read as before.
* A split that holds its raw inputs as one tensor may offer them whole (``bulk_items()``: every item's
  input, the transform run ONCE on the stacked batch, and the targets; the registry's in-memory data sets
  do). Then the first read fills the whole store in one call — milliseconds instead of a Python-level
  transform per item. It is used only when it reproduces the per-item values exactly: the first item
  the caller asked for, and the first and last item, are computed both ways and compared with
  ``torch.equal``; on any difference the store fills item by item as before.
* Batched reads (``__getitems__``, which ``DataLoader`` and ``Subset`` use) gather the stored items in
  one indexing call, without a transform call each; with :func:`collate` (the engine's loaders use it)
  that gathered tensor is the batch itself, not unbound and re-stacked. A read returns a copy, so a
  caller that edits its tensor in place never changes the store.
* Per rank and per split, keyed by what it wraps: the cache lives as long as the split object (a
  run's ``Environment``), so a different transform or data set is a different split object and never
  sees these tensors.
* **One store per rank, filled once, whoever reads.** With ``data.num_workers > 0`` the rank allocates the store
  before its loader workers start (:meth:`PreprocessedSplit.prime`, called by ``Environment.loader``) in shared
  memory — the inputs, the targets and the filled flags, reserved whole at once (so a full ``/dev/shm`` is seen
  there, never as a SIGBUS later) — so an item any worker decodes is decoded once: every other worker, every later
  loader (each evaluation's) and the rank itself read it from there. Host memory is one split per rank, not one
  per worker. Shared memory is used only when ``/dev/shm`` has room for the whole store (otherwise each worker
  fills its own copy, as before: correct, slower) and only for integer targets. A split filled whole at once
  (``bulk_items``) is filled in the rank and shared with the forked workers as it is. Two workers that fill one
  item write the same values; a loader's epoch deals each item to one worker, so a flag is never read while its
  item is being written.

**The uint8 store** (``uint8_budget_bytes``, ``data.cache_uint8_mb``). The registry's pipelines end with
"uint8 image → ``ToDtype(float32, scale=True)`` → clamp → ``Normalize`` → ``ToPureTensor``"
(:func:`uint8_stage` splits such a transform there). Then the store holds the uint8 image the first part makes
(1 byte a value instead of 4: 147 KiB instead of 588 KiB per 224-px image), and every read runs the float part on
it — on the whole gathered batch in one call (:func:`collate`), elementwise steps, so each value is the one the
per-item float32 path gives. It is used only when that holds: on the first read the item is made both ways and
compared with ``torch.equal`` (and the float part on a batch of it, too); a split that applies its transform
elsewhere than its ``transform`` attribute, a stage that is not uint8, or any difference keeps the float32 store.

This caches *training inputs*; the frozen-backbone feature cache of the statistics methods is another
piece (it caches a model's outputs, not the data pipeline's).
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate, get_worker_info
from torchvision.transforms import v2

__all__ = [
    "PreprocessedSplit",
    "StoredBatch",
    "collate",
    "collate_uint8",
    "float_part_of",
    "is_deterministic",
    "store_of",
    "uint8_stage",
    "DETERMINISTIC_STEPS",
]

# transforms.v2 steps whose output depends only on their input (no random draw)
DETERMINISTIC_STEPS: tuple[type, ...] = (
    v2.ToImage,
    v2.RGB,
    v2.Resize,
    v2.CenterCrop,
    v2.ToDtype,
    v2.Normalize,
    v2.ToPureTensor,
    v2.Grayscale,
    v2.Pad,
)


def is_deterministic(transform: Any) -> bool:
    """Whether ``transform`` (a ``v2.Compose`` of steps, or one step) maps an input to one fixed output.

    ``v2.Lambda`` counts only for a module-level function of this package (e.g. the [0, 1] clamp);
    anything unknown — a random step, a user's callable — is not deterministic as far as we can tell.
    """
    if transform is None:
        return True
    if isinstance(transform, v2.Compose):
        return all(is_deterministic(t) for t in transform.transforms)
    if isinstance(transform, v2.Lambda):
        return getattr(transform.lambd, "__module__", "").startswith("fl_lightning.")
    return type(transform) in DETERMINISTIC_STEPS


def _elementwise(step: Any) -> bool:
    """A step that maps every value on its own (the same result on one image or a batch of them)."""
    if isinstance(step, v2.Lambda):
        return getattr(step.lambd, "__module__", "").startswith("fl_lightning.")  # e.g. the [0, 1] clamp
    return type(step) in (v2.ToDtype, v2.Normalize, v2.ToPureTensor)


def uint8_stage(transform: Any) -> tuple[v2.Compose, v2.Compose] | None:
    """``transform`` split as ``(image part, float part)`` at its ``ToDtype(float32, scale=True)``, or None.

    The image part is every step before it (it must be deterministic; whether it yields uint8 is seen on the
    data); the float part that step and what follows, all elementwise (``ToDtype``, ``Normalize``, this package's
    clamp, ``ToPureTensor``), so it may run on a batch of images at once.
    """
    if not isinstance(transform, v2.Compose) or not is_deterministic(transform):
        return None
    steps = list(transform.transforms)
    at = next((i for i, t in enumerate(steps) if type(t) is v2.ToDtype and t.dtype is torch.float32 and t.scale), None)
    if at is None or at == 0 or not all(_elementwise(t) for t in steps[at:]):
        return None
    return v2.Compose(steps[:at]), v2.Compose(steps[at:])


class PreprocessedSplit(Dataset):
    """``split[i]`` computed once and then served from memory (see the module docstring).

    Args:
        split: a map-style data set whose items are ``(tensor, target)``.
        budget_bytes: the most memory the stored float tensors may take; a larger split is not stored.
        uint8_budget_bytes: the most memory a uint8 store may take (see the module docstring); 0: none.

    Example:
        >>> cached = PreprocessedSplit(splits.test, budget_bytes=1 << 30)  # doctest: +SKIP
    """

    def __init__(self, split: Dataset, *, budget_bytes: int, uint8_budget_bytes: int = 0) -> None:
        self.split, self.budget_bytes = split, int(budget_bytes)
        self.uint8_budget_bytes = int(uint8_budget_bytes)
        self._n = len(split)  # type: ignore[arg-type]
        self._inputs: torch.Tensor | None = None  # (N, *item shape), filled as items are first read
        self._targets: list[Any] = [None] * self._n
        self._target_ints: torch.Tensor | None = None  # (N,) int64 in shared memory: the targets of a shared store
        self._filled = torch.zeros(self._n, dtype=torch.bool)
        self._disabled = False  # items do not fit the budget, or are not same-shape tensors
        self._bulk_tried = False  # the whole-split fill is tried once, on the first read
        self._source: Dataset = split  # what is stored: the split's items, or their uint8 images
        self._finish: Callable[[torch.Tensor], torch.Tensor] | None = None  # the float part run on a read

    def __len__(self) -> int:
        return self._n

    @property
    def stored(self) -> int:
        """How many items are held in memory."""
        return int(self._filled.sum())

    @property
    def float_part(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What a uint8 batch of this split goes through to become the split's float32 items: the float part of
        its transform (:func:`uint8_stage`) when a uint8 store may hold it, else None. Known before any read (the
        workers' stores are filled in their own processes): a batch comes out uint8 only from the uint8 store."""
        stages = uint8_stage(getattr(self.split, "transform", None)) if self.uint8_budget_bytes else None
        return None if stages is None else stages[1]

    @property
    def stored_dtype(self) -> torch.dtype | None:
        """The dtype of the store (``torch.uint8`` for the uint8 store), None before it exists."""
        return None if self._inputs is None else self._inputs.dtype

    @property
    def shared(self) -> bool:
        """Whether the store is in shared memory: what any loader worker of this rank fills, all of them read."""
        return self._target_ints is not None

    def prime(self) -> None:
        """Make the store's decisions (float32 or uint8, whole or item by item) and allocate it in this process — in
        shared memory when there is room — by reading the first item: before a loader's workers start, so that they
        fill one store (module docstring). Does nothing once decided, or in a loader worker."""
        if self._n and self._inputs is None and not self._disabled and get_worker_info() is None:
            self[0]

    def _allocate(self, first: torch.Tensor, budget: int) -> bool:
        nbytes = first.element_size() * first.numel() * self._n if isinstance(first, torch.Tensor) else 0
        if not isinstance(first, torch.Tensor) or nbytes > budget:
            self._disabled = True
            return False
        shape = (self._n, *first.shape)
        if get_worker_info() is None and nbytes + 8 * self._n <= 0.9 * _shared_memory_free():
            try:  # torch reserves the whole block (no SIGBUS later); another rank may have taken the room meanwhile
                self._inputs = _shared_empty(shape, first.dtype)
                self._target_ints = _shared_empty((self._n,), torch.int64)
                self._filled.share_memory_()
                return True
            except RuntimeError:  # "unable to allocate shared memory": each worker fills its own, as before
                self._inputs = self._target_ints = None
        self._inputs = torch.empty(shape, dtype=first.dtype)
        return True

    def _put(self, index: int, stored: torch.Tensor, target: Any) -> bool:
        """Store item ``index``; False (nothing stored) for a target a shared store cannot hold (not an int)."""
        if self._target_ints is not None:
            if type(target) is not int:
                return False
            self._target_ints[index] = target
        else:
            self._targets[index] = target
        self._inputs[index] = stored  # type: ignore[index]
        self._filled[index] = True  # last: a reader that sees the flag finds the item
        return True

    def _target(self, index: int) -> Any:
        return self._targets[index] if self._target_ints is None else int(self._target_ints[index])

    def _disable(self) -> None:
        """Read every item as the split gives it from now on (items of mixed shapes or target types)."""
        self._disabled, self._inputs, self._finish, self._target_ints = True, None, None, None
        self._filled = torch.zeros(self._n, dtype=torch.bool)  # this process's own flags: a shared store stays

    def _try_uint8(self, index: int, x: Any) -> torch.Tensor | None:
        """Switch to the uint8 store when item ``index`` (``x``, read the usual way) comes out the same through it
        (module docstring); returns the item's uint8 image then, else None."""
        stages = uint8_stage(getattr(self.split, "transform", None)) if self.uint8_budget_bytes else None
        if stages is None or not isinstance(x, torch.Tensor):
            return None
        source = copy.copy(self.split)
        source.transform = stages[0]  # type: ignore[attr-defined]
        x8 = source[index][0]
        if not (isinstance(x8, torch.Tensor) and x8.dtype == torch.uint8 and x8.numel() * self._n <= self.uint8_budget_bytes):
            return None
        x8 = x8.as_subclass(torch.Tensor)
        finish = stages[1]
        made = finish(x8)
        if not (torch.equal(made, x) and made.dtype == x.dtype and torch.equal(finish(x8[None])[0], x)):
            return None
        self._source, self._finish = source, finish
        return x8

    def _read(self, index: int) -> tuple[Any, Any]:
        if self._finish is None:  # a copy: a caller that edits its batch in place cannot reach the store
            return self._inputs[index].clone(), self._target(index)  # type: ignore[index]
        return self._finish(self._inputs[index]), self._target(index)  # type: ignore[index]

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        index = int(index)
        if index < 0:
            index += self._n
        if self._filled[index]:
            return self._read(index)
        if self._disabled:
            return self.split[index]
        if self._finish is not None:  # the uint8 store: keep the image part, hand on the float part's result
            x8, y = self._source[index]
            x8 = x8.as_subclass(torch.Tensor) if isinstance(x8, torch.Tensor) else x8
            if (
                not isinstance(x8, torch.Tensor)
                or x8.shape != self._inputs.shape[1:]
                or x8.dtype != torch.uint8
                or not self._put(index, x8, y)
            ):
                self._disable()  # mixed shapes: read as before
                return self.split[index]
            return self._finish(x8), y
        x, y = self.split[index]
        if self._inputs is None:
            x8 = self._try_uint8(index, x)
            stored = x if x8 is None else x8
            if not self._allocate(stored, self.budget_bytes if x8 is None else self.uint8_budget_bytes):
                return x, y
        else:
            stored = x
        if not self._bulk_tried:
            self._bulk_tried = True
            if self._fill_in_bulk(index, stored):
                return x, y
        if (
            not isinstance(stored, torch.Tensor)
            or stored.shape != self._inputs.shape[1:]
            or stored.dtype != self._inputs.dtype
            or not self._put(index, stored, y)
        ):
            self._disable()  # a split of mixed shapes: read as before
        return x, y

    def _fill_in_bulk(self, index: int, x: torch.Tensor) -> bool:
        """Fill every item from ``bulk_items()`` of what is stored when it matches the per-item values (see the
        module docstring); ``x`` is item ``index`` as stored. Returns whether the store is now full."""
        bulk = getattr(self._source, "bulk_items", None)
        if bulk is None or not isinstance(x, torch.Tensor):
            return False
        inputs, targets = bulk()
        if not (
            isinstance(inputs, torch.Tensor)
            and inputs.shape == self._inputs.shape
            and inputs.dtype == x.dtype
            and len(targets) == self._n
        ):
            return False
        checks = {index: x, **{i: self._source[i][0] for i in {0, self._n - 1} - {index}}}
        if not all(torch.equal(inputs[i], v) for i, v in checks.items()):
            return False  # e.g. a kernel that rounds a batch differently from one image: keep the per-item values
        self._inputs = inputs.as_subclass(torch.Tensor).contiguous()  # in the rank: forked workers share its pages
        self._targets, self._target_ints = list(targets), None
        self._filled.fill_(True)
        return True

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[Any, Any]]:
        idx = torch.as_tensor([int(i) for i in indices], dtype=torch.long)
        if self._inputs is None or not bool(self._filled[idx].all()):
            return [self[i] for i in indices]
        # one gather: a fresh tensor, so nothing read from it aliases the store
        targets = [self._targets[int(i)] for i in idx] if self._target_ints is None else self._target_ints[idx].tolist()
        return StoredBatch(self._inputs[idx], targets, self._finish)


def _shared_memory_free() -> int:
    """Bytes free in ``/dev/shm``, where torch keeps shared memory (0 where there is none: macOS, a full one)."""
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return 0


def _shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in shared memory, reserved whole by torch (``RuntimeError`` when there is no room);
    no copy, as ``share_memory_()`` makes of a tensor first allocated privately."""
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(nbytes), 0, shape)


class StoredBatch(Sequence):
    """The ``(input, target)`` items of one batch read from a :class:`PreprocessedSplit`, with the inputs
    already gathered into one ``(B, ...)`` tensor: :func:`collate` hands that tensor on instead of
    unbinding and stacking it again. Any other reader sees a sequence of pairs, as ``__getitems__`` gives.
    ``finish``: the float part of a uint8 store, run on the whole batch by :func:`collate` (on each item otherwise).
    """

    def __init__(
        self, inputs: torch.Tensor, targets: list[Any], finish: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> None:
        self.inputs, self.targets, self.finish = inputs, targets, finish

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return (self.inputs[i] if self.finish is None else self.finish(self.inputs[i])), self.targets[i]


def collate(batch: Sequence[Any], *, float_part: bool = True) -> Any:
    """``torch.utils.data.default_collate``, except that a :class:`StoredBatch` of integer targets comes
    out as ``[inputs, int64 targets]`` at once — the same two tensors, values and dtypes (a uint8 store's batch
    through its float part, in one call; ``float_part=False``: left uint8, for the device to finish)."""
    if isinstance(batch, StoredBatch) and all(type(t) is int for t in batch.targets):
        inputs = batch.inputs if batch.finish is None or not float_part else batch.finish(batch.inputs)
        return [inputs, torch.tensor(batch.targets, dtype=torch.int64)]
    if isinstance(batch, StoredBatch) and not float_part and batch.finish is not None:
        return default_collate(list(zip(batch.inputs, batch.targets)))  # uint8 images, targets of another type
    return default_collate(list(batch) if isinstance(batch, StoredBatch) else batch)


def collate_uint8(batch: Sequence[Any]) -> Any:
    """:func:`collate` that leaves a uint8 store's batch uint8 (``DeviceFloatPart`` finishes it on the device)."""
    return collate(batch, float_part=False)


def store_of(dataset: Dataset) -> PreprocessedSplit | None:
    """The :class:`PreprocessedSplit` under ``dataset`` (through ``Subset`` s and other wrappers' ``.dataset``), or
    None."""
    while not isinstance(dataset, PreprocessedSplit):
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            return None
    return dataset


def float_part_of(dataset: Dataset) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The float part of the :class:`PreprocessedSplit` under ``dataset`` (through ``Subset`` s), or None."""
    store = store_of(dataset)
    return None if store is None else store.float_part
