"""Data set registry on generated, bundled and folder data; clear errors for missing data sets."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fl_lightning.data.registry import DATASETS, CorruptDatasetError, CorruptImageError, build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.errors import ConfigError, MissingResourceError, UsageError


def _tf(size: int, train: bool = False):
    return build_transform(normalization="imagenet", image_size=size, train=train)


def _check_aligned(dataset, targets: np.ndarray, shape: tuple[int, ...], picks=(0, 1, -1)) -> None:
    assert targets.dtype == np.int64 and targets.shape == (len(dataset),)
    for i in picks:
        i = i % len(dataset)
        image, target = dataset[i]
        assert tuple(image.shape) == shape
        assert target == targets[i]


def test_registry_lists_the_data_sets() -> None:
    assert {"cifar10", "cifar100", "svhn", "dtd", "food101", "caltech101", "imagefolder", "digits", "synthetic"} <= set(DATASETS)


def test_synthetic_shapes_targets_and_determinism() -> None:
    s = build_dataset("synthetic", root="unused", train_transform=_tf(16, True), test_transform=_tf(16), seed=3)
    assert (len(s.train), len(s.test), s.num_classes) == (512, 128, 10)
    _check_aligned(s.train, s.train_targets, (3, 16, 16))
    _check_aligned(s.test, s.test_targets, (3, 16, 16))
    assert np.bincount(s.train_targets).min() >= 51  # balanced
    raw = build_dataset("synthetic", root="unused", train_transform=None, test_transform=None, seed=3, num_samples=40)
    assert (len(raw.train), len(raw.test)) == (40, 10)
    image, _ = raw.train[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32)
    again = build_dataset("synthetic", root="unused", seed=3, num_samples=40)
    other = build_dataset("synthetic", root="unused", seed=4, num_samples=40)
    assert torch.equal(raw.train.images, again.train.images)
    assert not torch.equal(raw.train.images, other.train.images)


def test_synthetic_is_learnable() -> None:
    """A nearest-class-mean classifier (float64, numpy) separates the classes on the test split."""
    s = build_dataset("synthetic", root="unused", seed=0)
    x_train = s.train.images.numpy().reshape(len(s.train), -1).astype(np.float64)
    x_test = s.test.images.numpy().reshape(len(s.test), -1).astype(np.float64)
    means = np.stack([x_train[s.train_targets == c].mean(axis=0) for c in range(10)])
    dist = ((x_test[:, None, :] - means[None]) ** 2).sum(-1)
    assert (dist.argmin(axis=1) == s.test_targets).mean() > 0.9


def test_digits_is_the_bundled_sklearn_set_split_80_20() -> None:
    from sklearn.datasets import load_digits

    s = build_dataset("digits", root="unused", train_transform=_tf(32, True), test_transform=_tf(32), seed=0)
    assert (len(s.train), len(s.test), s.classes) == (1437, 360, [str(d) for d in range(10)])
    _check_aligned(s.train, s.train_targets, (3, 32, 32))
    _check_aligned(s.test, s.test_targets, (3, 32, 32))
    reference = load_digits()
    total = np.bincount(s.train_targets, minlength=10) + np.bincount(s.test_targets, minlength=10)
    np.testing.assert_array_equal(total, np.bincount(reference.target))
    # Stratified: every class is ~20% test.
    share = np.bincount(s.test_targets, minlength=10) / np.bincount(reference.target)
    assert np.all(np.abs(share - 0.2) < 0.02)
    # Raw items are the real images, rescaled 0..16 -> 0..255 and replicated to 3 channels.
    raw = build_dataset("digits", root="unused", seed=0)
    expected = {tuple(np.rint(img * 255 / 16).astype(np.uint8).ravel()) for img in reference.images}
    image, _ = raw.test[5]
    assert image.dtype == torch.uint8 and image.shape == (3, 8, 8)
    assert torch.equal(image[0], image[2]) and tuple(image[0].numpy().ravel()) in expected
    capped = build_dataset("digits", root="unused", seed=1, num_samples=100)
    assert len(capped.train) == 100 == len(capped.train_targets)
    _check_aligned(capped.train, capped.train_targets, (3, 8, 8))


def _write_png(path: Path, rng: np.random.Generator, gray: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (6, 7) if gray else (6, 7, 3)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(path)


def test_imagefolder_with_train_and_test(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for i in range(3):
        _write_png(tmp_path / "train" / "ant" / f"{i}.png", rng)
        _write_png(tmp_path / "train" / "bee" / f"{i}.png", rng, gray=True)
    _write_png(tmp_path / "test" / "bee" / "0.png", rng, gray=True)  # test/ lacks "ant"
    s = build_dataset("imagefolder", root=tmp_path, train_transform=_tf(12, True), test_transform=_tf(12))
    assert s.classes == ["ant", "bee"]
    np.testing.assert_array_equal(s.train_targets, [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(s.test_targets, [1])  # same label mapping as train/
    _check_aligned(s.train, s.train_targets, (3, 12, 12), picks=range(6))
    _check_aligned(s.test, s.test_targets, (3, 12, 12))
    pickle.dumps(s.train)  # DataLoader workers need it


def test_imagefolder_without_splits_is_split_4_to_1(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for c in ("a", "b"):
        for i in range(10):
            _write_png(tmp_path / c / f"{i}.png", rng)
    s = build_dataset("imagefolder", root=tmp_path, train_transform=_tf(8), test_transform=_tf(8), seed=0)
    assert (len(s.train), len(s.test)) == (16, 4)
    np.testing.assert_array_equal(np.bincount(s.test_targets), [2, 2])
    _check_aligned(s.train, s.train_targets, (3, 8, 8), picks=range(16))
    _check_aligned(s.test, s.test_targets, (3, 8, 8), picks=range(4))
    same = build_dataset("imagefolder", root=tmp_path, seed=0)
    np.testing.assert_array_equal(same.test.indices, s.test.indices)


def test_caltech101_layout_drops_background_and_converts_gray(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    base = tmp_path / "caltech101" / "101_ObjectCategories"
    for c in ("BACKGROUND_Google", "accordion", "airplanes"):
        for i in range(5):
            _write_png(base / c / f"image_{i + 1:04d}.jpg", rng, gray=(c == "accordion"))
    s = build_dataset("caltech101", root=tmp_path, train_transform=None, test_transform=None)
    assert s.classes == ["accordion", "airplanes"]
    assert (len(s.train), len(s.test)) == (8, 2)
    image, target = s.train[0]
    assert image.mode == "RGB" and target == s.train_targets[0] == 0


def _assert_one_line_missing(err: MissingResourceError, name: str, root: Path) -> None:
    message = str(err)
    assert "\n" not in message
    for token in (f"'{name}'", str(root), "data.root", "data.download"):
        assert token in message


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "svhn", "dtd", "food101"])
def test_missing_torchvision_dataset_says_where_and_how(tmp_path: Path, name: str) -> None:
    with pytest.raises(MissingResourceError) as info:
        build_dataset(name, root=tmp_path, download=False)
    _assert_one_line_missing(info.value, name, tmp_path)


def test_missing_cifar10_names_its_folder(tmp_path: Path) -> None:
    with pytest.raises(MissingResourceError) as info:
        build_dataset("cifar10", root=tmp_path)
    assert "cifar-10-batches-py" in str(info.value)


def test_missing_caltech101_leaves_no_stray_folder(tmp_path: Path) -> None:
    with pytest.raises(MissingResourceError) as info:
        build_dataset("caltech101", root=tmp_path)
    _assert_one_line_missing(info.value, "caltech101", tmp_path)
    assert "101_ObjectCategories" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_missing_imagefolder(tmp_path: Path) -> None:
    with pytest.raises(MissingResourceError) as info:
        build_dataset("imagefolder", root=tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value) and "data.root" in str(info.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingResourceError):
        build_dataset("imagefolder", root=tmp_path / "empty")


def test_unknown_name_and_bad_num_samples() -> None:
    with pytest.raises(ConfigError) as info:
        build_dataset("mnist-ish", root=".")
    assert info.value.key == "data.name" and "synthetic" in info.value.allowed
    with pytest.raises(ConfigError) as info:
        build_dataset("digits", root=".", num_samples=5000)
    assert info.value.key == "data.num_samples"
    with pytest.raises(ConfigError):
        build_dataset("synthetic", root=".", num_samples=0)


# ------------------------------------------------------------------------------------------------
# data that is there but unusable: one line naming the file and what to do


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _two_class_folder(root: Path, rng: np.random.Generator, n: int = 3) -> None:
    for c in ("ant", "bee"):
        for i in range(n):
            _write_png(root / "train" / c / f"{i}.png", rng)
            _write_png(root / "test" / c / f"{i}.png", rng)


def _assert_names_file(err: BaseException, path: Path) -> None:
    message = str(err)
    assert "\n" not in message
    assert f"image '{path}' cannot be read (" in message and message.endswith("remove or replace it")


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("damage", ["truncated-png", "truncated-jpeg", "not-an-image"])
def test_corrupt_image_names_the_file(tmp_path: Path, split: str, damage: str) -> None:
    rng = np.random.default_rng(0)
    _two_class_folder(tmp_path, rng)
    bad = tmp_path / split / "bee" / "1.png"
    if damage == "truncated-jpeg":
        bad = bad.with_suffix(".jpg")
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(bad, quality=90)
        _truncate(bad)
    elif damage == "truncated-png":
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(bad)
        _truncate(bad)
    else:
        bad.write_bytes(b"this is not an image at all")
    s = build_dataset("imagefolder", root=tmp_path, train_transform=_tf(8), test_transform=_tf(8))
    dataset = s.train if split == "train" else s.test
    position = next(i for i, (p, _) in enumerate(dataset.samples) if p == str(bad))
    with pytest.raises(CorruptImageError) as info:
        dataset[position]
    assert isinstance(info.value, UsageError)  # the CLI prints it as one line, exit 2
    _assert_names_file(info.value, bad)
    dataset[(position + 1) % len(dataset)]  # the other images still load


def test_corrupt_image_in_a_dataloader_worker_stays_one_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    _two_class_folder(tmp_path, rng)
    bad = tmp_path / "train" / "ant" / "0.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    s = build_dataset("imagefolder", root=tmp_path, train_transform=_tf(8), test_transform=_tf(8))
    loader = torch.utils.data.DataLoader(s.train, batch_size=2, num_workers=1)
    with pytest.raises(CorruptImageError) as info:
        list(loader)
    _assert_names_file(info.value, bad)


def test_corrupt_image_in_a_split_folder_and_caltech(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    base = tmp_path / "caltech101" / "101_ObjectCategories"
    for c in ("accordion", "airplanes"):
        for i in range(5):
            _write_png(base / c / f"image_{i + 1:04d}.jpg", rng)
    bad = base / "airplanes" / "image_0003.jpg"
    _truncate(bad, 0.3)
    s = build_dataset("caltech101", root=tmp_path)
    with pytest.raises(CorruptImageError) as info:
        for i in range(len(s.train)):
            s.train[i]
        for i in range(len(s.test)):
            s.test[i]
    _assert_names_file(info.value, bad)


@pytest.mark.parametrize("classes", [["only"], []])
def test_one_class_folder_names_the_folder_not_a_key(tmp_path: Path, classes: list[str]) -> None:
    rng = np.random.default_rng(3)
    for c in classes:
        for i in range(5):
            _write_png(tmp_path / "train" / c / f"{i}.png", rng)
            _write_png(tmp_path / "flat" / c / f"{i}.png", rng)
    (tmp_path / "test").mkdir()
    if classes:
        for root, folder in ((tmp_path, tmp_path / "train"), (tmp_path / "flat", tmp_path / "flat")):
            with pytest.raises(UsageError) as info:
                build_dataset("imagefolder", root=root)
            message = str(info.value)
            assert message == (
                f"imagefolder at '{folder}' has 1 class folder ('only'); a "
                f"classification run needs at least 2 (one sub-folder of images per class)"
            )
            assert "num_classes" not in message
    else:
        (tmp_path / "train").mkdir()
        with pytest.raises(MissingResourceError):
            build_dataset("imagefolder", root=tmp_path)


def test_empty_test_split_is_reported(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    for c in ("a", "b"):
        for i in range(2):
            _write_png(tmp_path / "train" / c / f"{i}.png", rng)
    (tmp_path / "test" / "a").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"test/ holds no images"):
        build_dataset("imagefolder", root=tmp_path)


@pytest.mark.parametrize(
    "name, files",
    [
        ("cifar10", ["cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/test_batch"]),
        ("cifar100", ["cifar-100-python/train", "cifar-100-python/test"]),
        ("svhn", ["train_32x32.mat", "test_32x32.mat"]),
        ("cifar10", ["cifar-10-batches-py/.keep"]),  # the folder alone: incomplete
    ],
)
def test_corrupt_torchvision_folder_is_not_reported_as_missing(tmp_path: Path, name: str, files: list[str]) -> None:
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"garbage " * 64)
    with pytest.raises(CorruptDatasetError) as info:
        build_dataset(name, root=tmp_path)
    message = str(info.value)
    assert not isinstance(info.value, MissingResourceError)
    assert "\n" not in message and "corrupt or incomplete" in message and "not found" not in message
    assert str(tmp_path / files[0].split("/")[0]) in message and "delete" in message


def test_corrupt_image_in_food101_names_the_file(tmp_path: Path) -> None:
    """torchvision's file-backed sets load through our loader too (a tiny fake Food-101 layout)."""
    import json

    rng = np.random.default_rng(5)
    base = tmp_path / "food-101"
    meta = {c: [f"{c}/{i}" for i in range(2)] for c in ("pho", "ramen")}
    (base / "meta").mkdir(parents=True)
    for split in ("train", "test"):
        (base / "meta" / f"{split}.json").write_text(json.dumps(meta))
    for ids in meta.values():
        for image_id in ids:
            _write_png(base / "images" / f"{image_id}.jpg", rng)
    bad = base / "images" / "ramen" / "1.jpg"
    _truncate(bad, 0.2)
    s = build_dataset("food101", root=tmp_path, train_transform=_tf(8), test_transform=_tf(8))
    assert s.classes == ["pho", "ramen"]
    assert tuple(s.train[0][0].shape) == (3, 8, 8)
    with pytest.raises(CorruptImageError) as info:
        s.test[3]
    _assert_names_file(info.value, bad)
