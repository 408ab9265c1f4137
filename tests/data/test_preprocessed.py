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


@pytest.mark.parametrize(
    "normalization, size, train, expected",
    [
        ("imagenet", 16, False, True),
        ("imagenet", 16, True, True),  # below 32 px the training pipeline does not augment
        ("imagenet", 32, True, False),  # RandomResizedCrop + flip
        ("clip", 32, True, True),
        ("none", 32, False, True),
    ],
)
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
        batches.append([b for _ in range(2) for b in DataLoader(Subset(data, idx), batch_size=8, shuffle=True, generator=g)])
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
    ours = list(DataLoader(part, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1), collate_fn=collate))
    theirs = list(
        DataLoader(
            Subset(splits.train, list(range(3, 200, 5))), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1)
        )
    )
    assert len(ours) == len(theirs)
    for (xa, ya), (xb, yb) in zip(ours, theirs):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and ya.dtype == yb.dtype == torch.int64
    batch = cached.__getitems__([0, 1, 2])
    assert isinstance(batch, StoredBatch) and len(batch) == 3 and torch.equal(batch[1][0], splits.train[1][0])
    pairs = [(torch.zeros(2), 1), (torch.ones(2), 0)]
    assert all(torch.equal(a, b) for a, b in zip(collate(pairs), default_collate(pairs)))


# ------------------------------------------------------------------------------------------- one store per rank
class _Decodes(torch.utils.data.Dataset):
    """Distinct images whose every decode is counted in shared memory, whichever process makes it."""

    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))
        self.decodes = torch.zeros(n, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.decodes[i] += 1
        return self.x[i].clone(), int(i) % 3


def _epochs(dataset, epochs: int, context: str | None = None) -> list:
    from fl_lightning.data.preprocessed import collate

    return [
        b
        for e in range(epochs)
        for b in DataLoader(  # a fresh loader and workers each time, as evaluation's
            dataset,
            batch_size=8,
            shuffle=True,
            generator=torch.Generator().manual_seed(e),
            num_workers=2,
            collate_fn=collate,
            multiprocessing_context=context,
        )
    ]


@pytest.mark.parametrize("context", [None, pytest.param("spawn", marks=pytest.mark.slow)])
def test_every_worker_fills_one_store_and_each_item_is_decoded_once(context):
    """A primed store lives in shared memory: two workers per loader, three loaders — each item decoded once, the
    rank holding every item after, the batches those of the split itself (fork, and spawn's pickled store)."""
    base = _Decodes(40)
    store = PreprocessedSplit(base, budget_bytes=1 << 20)
    store.prime()
    assert store.shared and store.stored == 1
    batches = _epochs(store, 3, context)
    assert base.decodes.tolist() == [1] * 40 and store.stored == 40
    expected = _epochs(_Decodes(40), 3)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, expected, strict=True))
    assert torch.equal(store[7][0], base.x[7]) and store[7][1] == 1 and type(store[7][1]) is int


def _no_room(*_):
    raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1>: No space left on device (28)")


@pytest.mark.parametrize("where", ["seen before", "taken by another rank meanwhile"])
def test_without_room_in_shared_memory_each_worker_fills_its_own_store(monkeypatch, where):
    import fl_lightning.data.preprocessed as preprocessed

    if where == "seen before":
        monkeypatch.setattr(preprocessed, "_shared_memory_free", lambda: 0)
    else:
        monkeypatch.setattr(preprocessed, "_shared_empty", _no_room)
    base = _Decodes(40)
    store = PreprocessedSplit(base, budget_bytes=1 << 20)
    store.prime()
    assert not store.shared
    expected = _epochs(_Decodes(40), 2)
    batches = _epochs(store, 2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, expected, strict=True))
    assert int(base.decodes.sum()) > 40 and store.stored == 1  # the workers' copies died with them


def test_a_target_that_is_not_an_int_reads_the_split_as_it_is():
    class _Named(_Decodes):
        def __getitem__(self, i: int):
            return super().__getitem__(i)[0], f"class {int(i) % 3}" if i else 0

    store = PreprocessedSplit(_Named(6), budget_bytes=1 << 20)
    store.prime()
    assert store.shared and store[3][1] == "class 0" and store[1][1] == "class 1" and store[0][1] == 0
