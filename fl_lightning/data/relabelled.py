"""A data set read with its labels changed: what a label-flipping client trains on (``federation.attack.kind:
label_flip``, :mod:`fl_lightning.federation.policies.attacks`).

The images, their order and the batched reads stay the dataset's own (a store's :class:`StoredBatch` stays one
gathered tensor, so the collate's fast path still applies); only each integer target ``y`` becomes
``label_map[y]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fl_lightning.data.preprocessed import StoredBatch

__all__ = ["Relabelled", "RelabelledBatches"]


class Relabelled(Dataset):
    """``dataset``'s ``(input, target)`` items as ``(input, label_map[target])``.

    Args:
        dataset: a map-style data set of ``(input, int target)`` pairs (a client's ``Subset`` of the training split).
        label_map: (C,) int array: the label each true class is read as.
    """

    def __init__(self, dataset: Dataset, label_map: np.ndarray) -> None:
        self.dataset = dataset  # float_part_of and the loaders look through ``.dataset``, as through a Subset
        self.label_map = [int(c) for c in np.asarray(label_map)]  # Python ints: the collate's int fast path holds

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        x, y = self.dataset[index]
        return x, self.label_map[int(y)]

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[Any, int]]:
        read = getattr(self.dataset, "__getitems__", None)
        items = read(list(indices)) if read is not None else [self.dataset[i] for i in indices]
        if isinstance(items, StoredBatch):
            return StoredBatch(items.inputs, [self.label_map[int(y)] for y in items.targets], items.finish)
        return [(x, self.label_map[int(y)]) for x, y in items]


class RelabelledBatches:
    """``loader``'s ``[inputs, int64 targets, ...]`` batches with each target ``y`` read as ``label_map[y]``: a
    :class:`Relabelled` client's pass when its rows are read through the run's one loader over the training split
    (``data/loader.py``'s ``ClientPasses``, whose workers never see the map). Sized and iterable as ``loader`` is."""

    def __init__(self, loader: Iterable[Any], label_map: Sequence[int]) -> None:
        self.loader, self.label_map = loader, torch.as_tensor(list(label_map), dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        for inputs, targets, *rest in self.loader:
            yield [inputs, self.label_map.to(targets.device)[targets], *rest]
