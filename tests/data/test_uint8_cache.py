"""The uint8 store of the preprocessed cache: the registry's CLIP and timm pipelines split at their uint8 image,
every read (item, batch, loader) bit-identical to the float32 path, a quarter of the bytes; anything else falls
back to the float32 store."""

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.transforms import v2

from fl_lightning.data.preprocessed import PreprocessedSplit, collate, uint8_stage
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import CLIP_MEAN, CLIP_STD, build_transform

# what InputSpec.of_backbone hands build_transform: open_clip's statistics, timm's "inception" ones, torchvision's
PIPELINES = {
    "clip": {"normalization": "clip", "mean": CLIP_MEAN, "std": CLIP_STD},
    "timm_inception": {"normalization": "imagenet", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)},
    "imagenet": {"normalization": "imagenet"},
}


class _Photos(Dataset):
    """JPEG-like PIL images of varied sizes (as Food-101's), transformed through ``self.transform``."""

    def __init__(self, n: int, transform) -> None:
        rng = np.random.default_rng(0)
        self.images = [
            Image.fromarray(rng.integers(0, 256, (int(rng.integers(200, 320)), int(rng.integers(200, 320)), 3), dtype=np.uint8))
            for _ in range(n)
        ]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), i % 3


@pytest.mark.parametrize("name", list(PIPELINES))
def test_the_registry_pipelines_split_at_their_uint8_image(name):
    t = build_transform(**PIPELINES[name], image_size=224, train=False)
    image, floats = uint8_stage(t)
    assert [type(s) for s in floats.transforms][:1] == [v2.ToDtype] and v2.Normalize in map(type, floats.transforms)
    assert len(image.transforms) + len(floats.transforms) == len(t.transforms)
    augmented = uint8_stage(build_transform(**PIPELINES[name], image_size=224, train=True))
    assert (augmented is not None) is (name == "clip")  # CLIP's training view is not augmented; the others are
    assert (
        uint8_stage(v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.RandomHorizontalFlip()])) is None
    )  # a random step after the conversion
    assert uint8_stage(None) is None


@pytest.mark.parametrize("name", list(PIPELINES))
def test_uint8_store_reads_equal_the_float32_path_on_photos(name):
    t = build_transform(**PIPELINES[name], image_size=224, train=False)
    split = _Photos(10, t)
    reference = [split[i] for i in range(len(split))]
    cached = PreprocessedSplit(split, budget_bytes=0, uint8_budget_bytes=1 << 30)
    for _ in range(2):  # first reads fill the store, later ones read it
        for i in range(len(cached)):
            x, y = cached[i]
            assert torch.equal(x, reference[i][0]) and x.dtype == torch.float32 and y == reference[i][1]
    assert cached.stored == len(split) and cached.stored_dtype == torch.uint8
    assert cached._inputs.element_size() * cached._inputs[0].numel() == 3 * 224 * 224  # 147 KiB an image
    rows = [7, 2, 9, 0, 4]
    g = torch.Generator().manual_seed(5)
    ours = list(DataLoader(Subset(cached, rows), batch_size=2, shuffle=True, generator=g, collate_fn=collate))
    g = torch.Generator().manual_seed(5)
    theirs = list(DataLoader(Subset(split, rows), batch_size=2, shuffle=True, generator=g))
    assert len(ours) == len(theirs) == 3
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ours, theirs, strict=True))


def test_uint8_store_fills_an_in_memory_split_at_once():
    t = build_transform(**PIPELINES["clip"], image_size=48, train=False)
    splits = build_dataset("digits", root=".", train_transform=t, test_transform=t)
    cached = PreprocessedSplit(splits.test, budget_bytes=0, uint8_budget_bytes=1 << 30)
    first = cached[17]
    assert cached.stored == len(splits.test) and cached.stored_dtype == torch.uint8  # the bulk fill
    assert torch.equal(first[0], splits.test[17][0])
    for i in (0, 5, 359):
        assert torch.equal(cached[i][0], splits.test[i][0])
    batch = collate(cached.__getitems__([3, 100, 200]))
    assert torch.equal(batch[0], torch.stack([splits.test[i][0] for i in (3, 100, 200)]))


def test_no_uint8_stage_keeps_the_float32_store():
    t = v2.Compose(
        [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Resize(32, antialias=True), v2.ToPureTensor()]
    )  # resized as floats: no uint8 image to keep
    split = _Photos(4, t)
    cached = PreprocessedSplit(split, budget_bytes=1 << 30, uint8_budget_bytes=1 << 30)
    assert torch.equal(cached[1][0], split[1][0]) and cached.stored_dtype == torch.float32
    # over the uint8 budget: the float32 store, as before (here over its budget too: not stored)
    clip = build_transform(**PIPELINES["clip"], image_size=64, train=False)
    small = PreprocessedSplit(_Photos(4, clip), budget_bytes=0, uint8_budget_bytes=3 * 64 * 64 * 3)
    assert torch.equal(small[0][0], _Photos(4, clip)[0][0]) and small.stored == 0


def test_a_split_that_ignores_its_transform_attribute_keeps_the_float32_store():
    class _Elsewhere(_Photos):
        def __init__(self, n, transform):
            super().__init__(n, transform)
            self.pipeline = transform

        def __getitem__(self, i):
            return self.pipeline(self.images[i]), 0

    t = build_transform(**PIPELINES["clip"], image_size=32, train=False)
    cached = PreprocessedSplit(_Elsewhere(3, t), budget_bytes=1 << 30, uint8_budget_bytes=1 << 30)
    assert torch.equal(cached[2][0], _Elsewhere(3, t)[2][0]) and cached.stored_dtype == torch.float32


@pytest.mark.parametrize("workers", [0, 2])
def test_the_float_part_on_the_device_gives_the_loaders_batches(workers):
    """data.normalize_on_device: the loader hands uint8 batches on, the float part runs after the copy; every batch
    (the first pass, made item by item, and the store's) equals the loader's that finishes them itself."""
    from pathlib import Path
    from types import SimpleNamespace

    from fl_lightning.data.feature_cache import split_features
    from fl_lightning.data.loader import DeviceFloatPart, LoaderSettings
    from fl_lightning.federation.algorithm import Environment

    t = build_transform(**PIPELINES["clip"], image_size=32, train=False)
    cfg = SimpleNamespace(data=SimpleNamespace(batch_size=3), federation=SimpleNamespace(devices=1))

    def env(on_device: bool) -> Environment:
        train = PreprocessedSplit(_Photos(11, t), budget_bytes=0, uint8_budget_bytes=1 << 30)
        return Environment(
            SimpleNamespace(device=torch.device("cpu")),
            cfg,
            SimpleNamespace(train=train, test=train),
            [],
            Path("."),
            loading=LoaderSettings(workers, False, workers > 0, on_device),
            one_train_loader=True,
        )

    plain, device = env(False), env(True)
    rows = [4, 0, 9, 2, 7, 10, 1]
    for seed in (3, 4):  # the first pass fills the store (item by item), the second reads it
        a = list(plain.loader(Subset(plain.splits.train, rows), shuffle=True, seed=seed))
        loader = device.loader(Subset(device.splits.train, rows), shuffle=True, seed=seed)
        assert isinstance(loader, DeviceFloatPart) and len(loader) == 3
        b = list(loader)
        assert all(
            torch.equal(x[0], y[0]) and x[0].dtype == y[0].dtype == torch.float32 and torch.equal(x[1], y[1])
            for x, y in zip(a, b, strict=True)
        )
    if workers == 0:  # the store is this process's: what leaves the loader is uint8, the bytes a GPU copy moves
        inner = device.loader(Subset(device.splits.train, rows), shuffle=False).loader
        assert next(iter(inner))[0].dtype == torch.uint8
        assert not isinstance(plain.loader(plain.splits.test, shuffle=False), DeviceFloatPart)
    flat = torch.nn.Flatten()
    assert torch.equal(
        split_features(flat, device.splits.test, batch_size=4, device="cpu", normalize_on_device=True),
        split_features(flat, plain.splits.test, batch_size=4, device="cpu"),
    )
