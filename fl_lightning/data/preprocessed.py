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
* Per process and per split, keyed by what it wraps: the cache lives as long as the split object (a
  run's ``Environment``), so a different transform or data set is a different split object and never
  sees these tensors. With ``data.num_workers > 0`` each worker fills its own copy (still correct).

This caches *training inputs*; the frozen-backbone feature cache of the statistics methods is another
piece (it caches a model's outputs, not the data pipeline's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate
from torchvision.transforms import v2

__all__ = ["PreprocessedSplit", "StoredBatch", "collate", "is_deterministic", "DETERMINISTIC_STEPS"]

# transforms.v2 steps whose output depends only on their input (no random draw)
DETERMINISTIC_STEPS: tuple[type, ...] = (v2.ToImage, v2.RGB, v2.Resize, v2.CenterCrop, v2.ToDtype, v2.Normalize,
                                         v2.ToPureTensor, v2.Grayscale, v2.Pad)


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


class PreprocessedSplit(Dataset):
    """``split[i]`` computed once and then served from memory (see the module docstring).

    Args:
        split: a map-style data set whose items are ``(tensor, target)``.
        budget_bytes: the most memory the stored tensors may take; a larger split is not stored.

    Example:
        >>> cached = PreprocessedSplit(splits.test, budget_bytes=1 << 30)  # doctest: +SKIP
    """

    def __init__(self, split: Dataset, *, budget_bytes: int) -> None:
        self.split, self.budget_bytes = split, int(budget_bytes)
        self._n = len(split)  # type: ignore[arg-type]
        self._inputs: torch.Tensor | None = None  # (N, *item shape), filled as items are first read
        self._targets: list[Any] = [None] * self._n
        self._filled = torch.zeros(self._n, dtype=torch.bool)
        self._disabled = False  # items do not fit the budget, or are not same-shape tensors
        self._bulk_tried = False  # the whole-split fill is tried once, on the first read

    def __len__(self) -> int:
        return self._n

    @property
    def stored(self) -> int:
        """How many items are held in memory."""
        return int(self._filled.sum())

    def _allocate(self, first: torch.Tensor) -> bool:
        if not isinstance(first, torch.Tensor) or first.element_size() * first.numel() * self._n > self.budget_bytes:
            self._disabled = True
            return False
        self._inputs = torch.empty((self._n, *first.shape), dtype=first.dtype)
        return True

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        index = int(index)
        if index < 0:
            index += self._n
        if self._filled[index]:  # a copy: a caller that edits its batch in place cannot reach the store
            return self._inputs[index].clone(), self._targets[index]  # type: ignore[index]
        x, y = self.split[index]
        if self._disabled or (self._inputs is None and not self._allocate(x)):
            return x, y
        if not self._bulk_tried:
            self._bulk_tried = True
            if self._fill_in_bulk(index, x):
                return x, y
        if not isinstance(x, torch.Tensor) or x.shape != self._inputs.shape[1:] or x.dtype != self._inputs.dtype:
            self._disabled, self._inputs = True, None  # a split of mixed shapes: read it as before
            self._filled.zero_()
            return x, y
        self._inputs[index] = x
        self._targets[index] = y
        self._filled[index] = True
        return x, y

    def _fill_in_bulk(self, index: int, x: torch.Tensor) -> bool:
        """Fill every item from ``split.bulk_items()`` when it matches the per-item values (see the module
        docstring); ``x`` is item ``index`` read the usual way. Returns whether the store is now full."""
        bulk = getattr(self.split, "bulk_items", None)
        if bulk is None or not isinstance(x, torch.Tensor):
            return False
        inputs, targets = bulk()
        if not (isinstance(inputs, torch.Tensor) and inputs.shape == self._inputs.shape and inputs.dtype == x.dtype
                and len(targets) == self._n):
            return False
        checks = {index: x, **{i: self.split[i][0] for i in {0, self._n - 1} - {index}}}
        if not all(torch.equal(inputs[i], v) for i, v in checks.items()):
            return False  # e.g. a kernel that rounds a batch differently from one image: keep the per-item values
        self._inputs = inputs.contiguous()
        self._targets = list(targets)
        self._filled.fill_(True)
        return True

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[Any, Any]]:
        idx = torch.as_tensor([int(i) for i in indices], dtype=torch.long)
        if self._inputs is None or not bool(self._filled[idx].all()):
            return [self[i] for i in indices]
        # one gather: a fresh tensor, so nothing read from it aliases the store
        return StoredBatch(self._inputs[idx], [self._targets[int(i)] for i in idx])


class StoredBatch(Sequence):
    """The ``(input, target)`` items of one batch read from a :class:`PreprocessedSplit`, with the inputs
    already gathered into one ``(B, ...)`` tensor: :func:`collate` hands that tensor on instead of
    unbinding and stacking it again. Any other reader sees a sequence of pairs, as ``__getitems__`` gives."""

    def __init__(self, inputs: torch.Tensor, targets: list[Any]) -> None:
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.inputs[i], self.targets[i]


def collate(batch: Sequence[Any]) -> Any:
    """``torch.utils.data.default_collate``, except that a :class:`StoredBatch` of integer targets comes
    out as ``[inputs, int64 targets]`` at once — the same two tensors, values and dtypes."""
    if isinstance(batch, StoredBatch) and all(type(t) is int for t in batch.targets):
        return [batch.inputs, torch.tensor(batch.targets, dtype=torch.int64)]
    return default_collate(list(batch) if isinstance(batch, StoredBatch) else batch)
