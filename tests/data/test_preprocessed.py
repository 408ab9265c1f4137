"""The preprocessed-tensor cache: the transform's own values, once per item; augmentation and unknown
steps keep the per-item transform; the memory budget is honoured; the store cannot be edited through a read."""

import pytest
import torch
from torch.utils.data import DataLoader, Subset
from torchvision.transforms import v2

from fl_lightning.data.preprocessed import PreprocessedSplit, is_deterministic
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import build_transform


def _splits(train: bool = False, size: int = 16):
    t = build_transform(normalization="imagenet", image_size=size, train=train)
    return build_dataset("digits", root=".", train_transform=t, test_transform=t), t


class _CountingTransform:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, x):
        self.calls += 1
        return self.inner(x)


@pytest.mark.parametrize("normalization, size, train, expected", [
    ("imagenet", 16, False, True),
    ("imagenet", 16, True, True),  # below 32 px the training pipeline does not augment
    ("imagenet", 32, True, False),  # RandomResizedCrop + flip
    ("clip", 32, True, True),
    ("none", 32, False, True),
])
def test_is_deterministic_follows_the_pipeline(normalization, size, train, expected):
    assert is_deterministic(build_transform(normalization=normalization, image_size=size, train=train)) is expected


def test_unknown_steps_are_not_deterministic():
    assert not is_deterministic(v2.Compose([v2.ToImage(), v2.Lambda(lambda x: x + torch.rand(()))]))
    assert not is_deterministic(v2.Compose([v2.ToImage(), v2.ColorJitter(0.5)]))
    assert is_deterministic(None)


def test_cached_items_equal_the_transform_and_it_runs_once_per_item():
    splits, t = _splits()
    counting = _CountingTransform(t)
    splits.test.transform = counting
    part = Subset(splits.test, list(range(0, 360, 6)))
    cached = PreprocessedSplit(part, budget_bytes=1 << 30)
    reference = [part[i] for i in range(len(part))]
    counting.calls = 0
    for _ in range(3):  # three passes, one transform call per item
        for i in range(len(cached)):
            x, y = cached[i]
            assert torch.equal(x, reference[i][0]) and y == reference[i][1]
    assert counting.calls == len(cached) and cached.stored == len(cached)


def test_a_loader_over_a_client_subset_gives_the_same_batches():
    splits, _ = _splits()
    idx = list(range(5, 300, 7))
    batches = []
    for data in (splits.train, PreprocessedSplit(splits.train, budget_bytes=1 << 30)):
        g = torch.Generator().manual_seed(3)
        batches.append([b for _ in range(2) for b in DataLoader(Subset(data, idx), batch_size=8, shuffle=True,
                                                                generator=g)])
    for (xa, ya), (xb, yb) in zip(*batches):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_a_split_over_the_budget_is_read_as_before():
    splits, _ = _splits()
    cached = PreprocessedSplit(splits.test, budget_bytes=3 * 16 * 16 * 4 * 10)  # room for 10 of 360 images
    assert torch.equal(cached[4][0], splits.test[4][0]) and cached.stored == 0


def test_a_read_is_a_copy_of_the_store():
    splits, _ = _splits()
    cached = PreprocessedSplit(splits.test, budget_bytes=1 << 30)
    first = cached[0][0]
    first.zero_()
    again = cached[0][0]
    again.add_(1.0)
    cached[1]
    for x, _ in cached.__getitems__([0, 1]):  # the batched read (what a DataLoader calls) too
        x.mul_(0.0)
    assert torch.equal(cached[0][0], splits.test[0][0]) and torch.equal(cached[1][0], splits.test[1][0])


def test_an_in_memory_split_fills_whole_in_one_call_with_the_per_item_values():
    """The digits split offers ``bulk_items``: the first read stores every item, through one transform call
    on the whole batch (plus the per-item reads that check it), and every stored item equals the per-item
    transform's output bit for bit."""
    splits, t = _splits()
    reference = [splits.test[i] for i in range(len(splits.test))]
    counting = _CountingTransform(t)
    splits.test.transform = counting
    cached = PreprocessedSplit(splits.test, budget_bytes=1 << 30)
    cached[7]
    assert cached.stored == len(cached) and counting.calls <= 4  # 1 batch + the read + 2 checks
    for i, (x, y) in enumerate(reference):
        got_x, got_y = cached[i]
        assert torch.equal(got_x, x) and got_y == y
    assert counting.calls <= 4


class _DriftingBulk(torch.utils.data.Dataset):
    """A split whose whole-batch values differ from its per-item ones in the last item (as a kernel that
    rounds a batch differently would)."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]

    def bulk_items(self):
        inputs, targets = self.inner.bulk_items()
        inputs = inputs.clone()
        inputs[-1] += 1e-6
        return inputs, targets


def test_a_bulk_fill_that_differs_from_the_items_is_not_used():
    splits, _ = _splits()
    cached = PreprocessedSplit(_DriftingBulk(splits.test), budget_bytes=1 << 30)
    assert torch.equal(cached[3][0], splits.test[3][0]) and cached.stored == 1  # item by item, as before
    last = len(cached) - 1
    assert torch.equal(cached[last][0], splits.test[last][0])


def test_collate_hands_on_the_gathered_batch_equal_to_the_default_one():
    """The engine's loaders collate a stored batch without re-stacking it: the same tensors (values, dtypes,
    shapes) as torch's default_collate of the same items; other batches are default_collate's."""
    from torch.utils.data import default_collate

    from fl_lightning.data.preprocessed import StoredBatch, collate

    splits, _ = _splits()
    cached = PreprocessedSplit(splits.train, budget_bytes=1 << 30)
    part = Subset(cached, list(range(3, 200, 5)))
    ours = list(DataLoader(part, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1),
                           collate_fn=collate))
    theirs = list(DataLoader(Subset(splits.train, list(range(3, 200, 5))), batch_size=8, shuffle=True,
                             generator=torch.Generator().manual_seed(1)))
    assert len(ours) == len(theirs)
    for (xa, ya), (xb, yb) in zip(ours, theirs):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and ya.dtype == yb.dtype == torch.int64
    batch = cached.__getitems__([0, 1, 2])
    assert isinstance(batch, StoredBatch) and len(batch) == 3 and torch.equal(batch[1][0], splits.train[1][0])
    pairs = [(torch.zeros(2), 1), (torch.ones(2), 0)]
    assert all(torch.equal(a, b) for a, b in zip(collate(pairs), default_collate(pairs)))
