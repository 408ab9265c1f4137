"""Relabelled: a client's data read with its labels changed (label flipping) — the same inputs, order and batched
reads, only each target mapped."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from fl_lightning.data.preprocessed import PreprocessedSplit, StoredBatch, collate
from fl_lightning.data.relabelled import Relabelled
from fl_lightning.federation.policies.attacks import flipped_labels


class _Pairs(torch.utils.data.Dataset):
    """(image, int label) items, as the registry's data sets give them."""

    def __init__(self, n: int, classes: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 3, 4, 4, generator=g), [i % classes for i in range(n)]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def test_flipping_reverses_the_classes():
    assert flipped_labels(4).tolist() == [3, 2, 1, 0] and flipped_labels(1).tolist() == [0]


def test_items_and_batches_keep_their_inputs_and_map_their_labels():
    base = _Pairs(12, 4)
    rows = [7, 2, 9, 4]
    flipped = Relabelled(Subset(base, rows), flipped_labels(4))
    assert len(flipped) == 4
    for i, row in enumerate(rows):
        x, y = flipped[i]
        assert torch.equal(x, base.x[row]) and y == 3 - base.y[row] and type(y) is int
    ((xs, ys),) = DataLoader(flipped, batch_size=4)
    assert torch.equal(xs, base.x[rows]) and ys.tolist() == [3 - base.y[r] for r in rows]


def test_a_stores_batch_stays_one_gathered_tensor_with_mapped_int_labels():
    store = PreprocessedSplit(_Pairs(10, 5), budget_bytes=1 << 20)
    for i in range(len(store)):  # a first pass fills the store
        store[i]
    rows = [1, 6, 3]
    plain = Subset(store, rows).__getitems__([0, 1, 2])
    batch = Relabelled(Subset(store, rows), np.array([4, 3, 2, 1, 0])).__getitems__([0, 1, 2])
    assert isinstance(plain, StoredBatch) and isinstance(batch, StoredBatch)
    assert batch.targets == [4 - t for t in plain.targets] and all(type(t) is int for t in batch.targets)
    inputs, targets = collate(batch)
    assert torch.equal(inputs, collate(plain)[0]) and targets.dtype == torch.int64


def test_a_tensor_dataset_without_batched_reads_is_mapped_item_by_item():
    data = TensorDataset(torch.arange(6.0), torch.tensor([0, 1, 2, 0, 1, 2]))
    assert [int(y) for _, y in Relabelled(data, flipped_labels(3)).__getitems__([0, 1, 2])] == [2, 1, 0]
