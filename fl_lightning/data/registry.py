"""Named data sets -> train/test splits with integer targets, loaded offline from local folders.

``build_dataset(name, root=..., ...)`` returns a :class:`DatasetSplits` whose ``train_targets`` /
``test_targets`` are int64 arrays, so partitioning a data set among clients never opens an image.
Building any of them only lists files or reads the data set's array files; images are decoded
lazily in ``__getitem__``.

Data sets:

* ``cifar10``, ``cifar100``, ``svhn``, ``food101`` — torchvision, official train/test splits.
* ``dtd`` — torchvision, partition 1: train+val as train, test as test.
* ``caltech101`` — the 101 categories (``BACKGROUND_Google`` dropped), read from
  ``<root>/caltech101/101_ObjectCategories`` and split 4:1 per class with ``seed`` (as FeDiSyn).
* ``imagefolder`` — ``<root>/{train,test}/<class>/<image>``, or ``<root>/<class>/<image>`` split
  4:1 per class with ``seed``.
* ``hf`` — a Hugging Face ``datasets`` data set (``data.path``: a hub id read from the HF cache, or a
  ``save_to_disk`` folder or parquet/arrow files), its splits and image/label columns
  (:mod:`fl_lightning.data.hf`).
* ``digits`` — scikit-learn's bundled 8×8 handwritten digits (1797 real images, 10 classes), a
  seeded stratified 80/20 split; needs no files at all.
* ``synthetic`` — seeded class-conditional 3×32×32 images a small model can learn (tests, demos).

Downloading is opt-in (``download=True``); otherwise a missing data set raises
:class:`~fl_lightning.errors.MissingResourceError` naming what was looked for and where. Data that
is there but unusable is reported as such, in one line that names the file and what to do:

* :class:`CorruptDatasetError` — the data set's folder or files exist but torchvision's integrity
  check rejects them (torchvision says "not found or corrupted" for both cases; we tell them apart
  by whether the expected files exist);
* :class:`CorruptImageError` — an image file (imagefolder, caltech101, food101, dtd) cannot be
  decoded; raised when that image is loaded (also from a DataLoader worker), naming the file;
* a folder data set with fewer than two class folders, or a test/ split with no images, is a
  :class:`~fl_lightning.errors.UsageError` when the data set is built.
"""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from PIL import Image
from torch.utils.data import ConcatDataset, Dataset
from torchvision import datasets
from torchvision.datasets import ImageFolder

from fl_lightning.data.hf import HF_PREFIX, HFSource, hf_shorthand
from fl_lightning.data.splits import IMAGE_ERRORS, CorruptImageError, DatasetSplits, limit_train, split_4_to_1
from fl_lightning.errors import ConfigError, MissingResourceError, UsageError

__all__ = [
    "CorruptDatasetError",
    "CorruptImageError",
    "DatasetSplits",
    "DATASETS",
    "register_dataset",
    "build_dataset",
]


class CorruptDatasetError(UsageError):
    """A data set's files are on disk but unusable (checksums fail, files truncated or missing
    from an existing folder). Not a :class:`MissingResourceError`: downloading is not the fix
    unless the broken copy is removed first, and the message says so."""


Transform = Callable[[Any], Any] | None
T = TypeVar("T")


class DatasetBuilder(Protocol):
    def __call__(
        self,
        *,
        root: Path,
        download: bool,
        train_transform: Transform,
        test_transform: Transform,
        seed: int,
        num_samples: int | None,
    ) -> DatasetSplits: ...


DATASETS: dict[str, DatasetBuilder] = {}


def register_dataset(name: str) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Decorator adding a builder to :data:`DATASETS` under ``name``."""

    def wrap(builder: DatasetBuilder) -> DatasetBuilder:
        if name in DATASETS:
            raise ValueError(f"dataset {name!r} is registered twice")
        DATASETS[name] = builder
        return builder

    return wrap


def build_dataset(
    name: str,
    *,
    root: str | Path,
    download: bool = False,
    train_transform: Transform = None,
    test_transform: Transform = None,
    seed: int = 0,
    num_samples: int | None = None,
    source: HFSource | None = None,
) -> DatasetSplits:
    """Build the train/test splits of a registered data set.

    Args:
        name: a key of :data:`DATASETS`, or ``hf:<id>`` (``hf`` with ``source.path`` ``<id>``).
        root: folder holding the data set (ignored by ``digits`` and ``synthetic``).
        download: let torchvision download a missing data set into ``root``.
        train_transform: applied to each training image (e.g. ``build_transform(train=True)``).
        test_transform: applied to each test image.
        seed: seed of the data sets' own splits (caltech101, imagefolder, digits, synthetic).
        num_samples: for ``synthetic``, the number of training images generated (default 512;
            the test split gets a quarter); for the others, keep a seeded random subset of this
            many training images (the test split is kept whole).
        source: for ``hf``, the data set's path (hub id or local), splits and columns.

    Returns:
        The :class:`DatasetSplits`.

    Raises:
        ConfigError: unknown ``name`` or a bad ``num_samples``.
        MissingResourceError: the data set's files are not under ``root``.
    """
    if isinstance(name, str) and name.startswith(HF_PREFIX):  # hf:<id> is hf with source.path <id>
        name, path = hf_shorthand(name, None if source is None else source.path, key_prefix="data.")
        source = replace(source or HFSource(), path=path)
    if name not in DATASETS:
        raise ConfigError("data.name", name, f"one of {sorted(DATASETS)}")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1):
        raise ConfigError("data.num_samples", num_samples, "an integer >= 1, or null for all")
    builder = DATASETS[name]
    extra = {"source": source} if "source" in inspect.signature(builder).parameters else {}  # hf: where it is
    return builder(
        root=Path(root).expanduser(),
        download=download,
        train_transform=train_transform,
        test_transform=test_transform,
        seed=seed,
        num_samples=num_samples,
        **extra,
    )


# ------------------------------------------------------------------------------------------------
# shared pieces


class _InMemoryImages(Dataset):
    """uint8 images (N, 3, H, W) held in memory; the transform runs per item (or on all of them at once:
    :meth:`bulk_items`, which :class:`~fl_lightning.data.preprocessed.PreprocessedSplit` uses)."""

    def __init__(self, *, images: torch.Tensor, targets: np.ndarray, transform: Transform) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[0] != len(targets):
            raise ValueError(f"expected uint8 (N, C, H, W) images for {len(targets)} targets")
        self.images, self.targets, self.transform = images, targets, transform

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = self.images[index]  # (3, H, W) uint8
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])

    def bulk_items(self) -> tuple[torch.Tensor, list[int]]:
        """Every item's input, the transform run once on the (N, 3, H, W) batch, and the targets."""
        images = self.images if self.transform is None else self.transform(self.images)
        return images, [int(t) for t in self.targets]


class _TransformedSubset(Dataset):
    """``base[indices[i]]`` with ``transform`` applied to the image (for seeded splits)."""

    def __init__(self, *, base: Dataset, indices: np.ndarray, transform: Transform) -> None:
        self.base, self.indices, self.transform = base, indices, transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, target = self.base[int(self.indices[index])]
        if self.transform is not None:
            image = self.transform(image)
        return image, target


def _targets(values: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _missing(name: str, root: Path, looked_for: str, *, downloadable: bool = True) -> MissingResourceError:
    how = "put it there or set data.root to its folder"
    if downloadable:
        how = "put it there, set data.root to its folder, or set data.download: true on a machine with internet access"
    return MissingResourceError(f"dataset {name!r} not found under '{root}' (looked for {looked_for}); {how}")


def _corrupt(name: str, root: Path, found: Sequence[Path], reason: str) -> CorruptDatasetError:
    listed = " and ".join(f"'{p}'" for p in found)
    return CorruptDatasetError(
        f"dataset {name!r} under '{root}' is corrupt or incomplete: {listed} "
        f"{'exists' if len(found) == 1 else 'exist'} but {reason}; delete "
        f"{'it' if len(found) == 1 else 'them'} and put a complete copy there, or set "
        f"data.download: true on a machine with internet access"
    )


def _torchvision(
    name: str,
    root: Path,
    looked_for: str,
    download: bool,
    build: Callable[[], T],
    expected: Sequence[Path] = (),
) -> T:
    """Run a torchvision constructor, turning its not-found / download failures into ours.

    torchvision raises the same "Dataset not found or corrupted" for a missing data set and for
    one whose files fail their checksums; ``expected`` (the data set's folder or files) tells the
    cases apart: if any of them exists, the copy on disk is corrupt, not missing.
    """
    try:
        return build()
    except RuntimeError as err:
        if "not found" in str(err).lower():
            found = [p for p in expected if p.exists()]
            if found:
                raise _corrupt(name, root, found, "fails torchvision's integrity check") from None
            raise _missing(name, root, looked_for) from None
        raise
    except OSError as err:  # download=True without network: URLError, socket errors, ...
        if not download:
            raise
        reason = " ".join(str(err).split())
        raise MissingResourceError(
            f"dataset {name!r} could not be downloaded into '{root}' ({reason}); download it on "
            f"a machine with internet access and set data.root to its folder"
        ) from None


# ------------------------------------------------------------------------------------------------
# torchvision data sets with official splits


@register_dataset("cifar10")
def _cifar10(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    return _cifar(
        "cifar10", datasets.CIFAR10, "cifar-10-batches-py", root, download, train_transform, test_transform, seed, num_samples
    )


@register_dataset("cifar100")
def _cifar100(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    return _cifar(
        "cifar100", datasets.CIFAR100, "cifar-100-python", root, download, train_transform, test_transform, seed, num_samples
    )


def _cifar(
    name: str,
    cls: type[datasets.CIFAR10],
    folder: str,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    looked_for = f"'{root / folder}'"

    def make(train: bool, transform: Transform) -> datasets.CIFAR10:
        return _torchvision(
            name,
            root,
            looked_for,
            download,
            lambda: cls(root, train=train, transform=transform, download=download),
            [root / folder],
        )

    train, test = make(True, train_transform), make(False, test_transform)
    splits = DatasetSplits(train, test, list(train.classes), _targets(train.targets), _targets(test.targets))
    return limit_train(splits, num_samples, seed)


@register_dataset("svhn")
def _svhn(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    looked_for = f"'{root / 'train_32x32.mat'}' and '{root / 'test_32x32.mat'}'"

    def make(split: str, transform: Transform) -> datasets.SVHN:
        return _torchvision(
            "svhn",
            root,
            looked_for,
            download,
            lambda: datasets.SVHN(root, split=split, transform=transform, download=download),
            [root / f"{split}_32x32.mat"],
        )

    train, test = make("train", train_transform), make("test", test_transform)
    # SVHN stores digit 0 as label 10; torchvision already maps it back to 0.
    classes = [str(d) for d in range(10)]
    splits = DatasetSplits(train, test, classes, _targets(train.labels), _targets(test.labels))
    return limit_train(splits, num_samples, seed)


@register_dataset("dtd")
def _dtd(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    looked_for = f"'{root / 'dtd' / 'dtd' / 'images'}' and '{root / 'dtd' / 'dtd' / 'labels'}'"

    def make(split: str, transform: Transform) -> datasets.DTD:
        return _torchvision(
            "dtd",
            root,
            looked_for,
            download,
            lambda: datasets.DTD(root, split=split, partition=1, transform=transform, download=download, loader=_load_rgb),
            [root / "dtd" / "dtd"],
        )

    train, val, test = (make("train", train_transform), make("val", train_transform), make("test", test_transform))
    splits = DatasetSplits(
        ConcatDataset([train, val]),
        test,
        list(train.classes),
        _targets(list(train._labels) + list(val._labels)),
        _targets(test._labels),
    )
    return limit_train(splits, num_samples, seed)


@register_dataset("food101")
def _food101(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    base = root / "food-101"
    looked_for = f"'{base / 'images'}' and '{base / 'meta'}'"

    def make(split: str, transform: Transform) -> datasets.Food101:
        return _torchvision(
            "food101",
            root,
            looked_for,
            download,
            lambda: datasets.Food101(root, split=split, transform=transform, download=download, loader=_load_rgb),
            [base / "images", base / "meta"],
        )

    train, test = make("train", train_transform), make("test", test_transform)
    splits = DatasetSplits(train, test, list(train.classes), _targets(train._labels), _targets(test._labels))
    return limit_train(splits, num_samples, seed)


# ------------------------------------------------------------------------------------------------
# folder data sets with a seeded 4:1 split


def _load_rgb(path: str | Path) -> Image.Image:
    """Decode one image file to RGB, or raise :class:`CorruptImageError` naming it.

    The image is fully decoded here (``convert`` reads every pixel), so a truncated file fails
    now rather than later inside a transform, where the path is no longer known.
    """
    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except IMAGE_ERRORS as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        raise CorruptImageError(f"image '{path}' cannot be read ({reason}); remove or replace it") from err


class _ClassFolder(ImageFolder):
    """ImageFolder that skips hidden folders (and ``exclude_prefix*`` ones) and can reuse another
    split's class list, so that train/ and test/ share one label mapping. A module-level class so
    that it pickles into DataLoader workers. Its loader converts every image to RGB and names the
    file when it cannot (:class:`CorruptImageError`)."""

    def __init__(
        self, root: Path, *, transform: Transform = None, exclude_prefix: str | None = None, classes: list[str] | None = None
    ) -> None:
        self._exclude_prefix, self._fixed_classes = exclude_prefix, classes
        # allow_empty: a test/ split may lack some of train/'s classes.
        super().__init__(str(root), transform=transform, loader=_load_rgb, allow_empty=classes is not None)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        if self._fixed_classes is not None:
            names = list(self._fixed_classes)
        else:
            names = _class_dirs(Path(directory), self._exclude_prefix)
            if not names:
                raise FileNotFoundError(f"no class folders in '{directory}'")
        return names, {c: i for i, c in enumerate(names)}


def _check_classes(name: str, folder: Path, classes: Sequence[str]) -> None:
    """A classification run needs two classes or more: say so about the folder, not about a key."""
    if len(classes) < 2:
        found = f"1 class folder ('{classes[0]}')" if classes else "no class folders"
        raise UsageError(
            f"{name} at '{folder}' has {found}; a classification run needs at least 2 (one sub-folder of images per class)"
        )


def _class_dirs(directory: Path, exclude_prefix: str | None = None) -> list[str]:
    return sorted(
        e.name
        for e in os.scandir(directory)
        if e.is_dir() and not e.name.startswith(".") and not (exclude_prefix and e.name.startswith(exclude_prefix))
    )


def _split_folder(
    name: str,
    folder: Path,
    root: Path,
    looked_for: str,
    exclude_prefix: str | None,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    *,
    downloadable: bool,
) -> DatasetSplits:
    try:
        base = _ClassFolder(folder, exclude_prefix=exclude_prefix)
    except FileNotFoundError:
        raise _missing(name, root, looked_for, downloadable=downloadable) from None
    _check_classes(name, folder, base.classes)
    targets = _targets(base.targets)
    train_idx, test_idx = split_4_to_1(targets, seed)
    return DatasetSplits(
        _TransformedSubset(base=base, indices=train_idx, transform=train_transform),
        _TransformedSubset(base=base, indices=test_idx, transform=test_transform),
        list(base.classes),
        targets[train_idx],
        targets[test_idx],
    )


@register_dataset("caltech101")
def _caltech101(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    """Read with ImageFolder rather than torchvision's Caltech101: RGB conversion comes with the
    loader, and a copy without the BACKGROUND_Google folder works too (torchvision's class
    insists on removing it). torchvision's class is used only to download."""
    folder = root / "caltech101" / "101_ObjectCategories"
    looked_for = f"'{folder}'"
    if download and not folder.is_dir():
        created = not (root / "caltech101").exists()
        try:
            _torchvision("caltech101", root, looked_for, download, lambda: datasets.Caltech101(root, download=True))
        except BaseException:
            # torchvision creates <root>/caltech101 before it fails; leave no empty folder behind.
            if created:
                _remove_empty_tree(root / "caltech101")
            raise
    if not folder.is_dir():
        raise _missing("caltech101", root, looked_for)
    splits = _split_folder(
        "caltech101", folder, root, looked_for, "BACKGROUND", train_transform, test_transform, seed, downloadable=True
    )
    return limit_train(splits, num_samples, seed)


def _remove_empty_tree(path: Path) -> None:
    """Remove ``path`` if it holds no files at any depth (only empty folders)."""
    if path.is_dir() and not any(p.is_file() for p in path.rglob("*")):
        shutil.rmtree(path)


@register_dataset("imagefolder")
def _imagefolder(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    looked_for = f"class folders of images in '{root}' (or in its train/ and test/)"
    if not root.is_dir():
        raise _missing("imagefolder", root, looked_for, downloadable=False)
    train_dir, test_dir = root / "train", root / "test"
    if train_dir.is_dir() and test_dir.is_dir():
        try:
            train = _ClassFolder(train_dir, transform=train_transform)
        except FileNotFoundError:
            raise _missing("imagefolder", root, looked_for, downloadable=False) from None
        _check_classes("imagefolder", train_dir, train.classes)
        unknown = sorted(set(_class_dirs(test_dir)) - set(train.classes))
        if unknown:
            raise ConfigError("data.root", str(root), f"test/ class folders that also exist in train/ (extra: {unknown})")
        test = _ClassFolder(test_dir, transform=test_transform, classes=list(train.classes))
        if len(test) == 0:
            raise UsageError(
                f"imagefolder at '{root}': test/ holds no images in folders named like train/'s "
                f"classes; put test images in test/<class>/"
            )
        splits = DatasetSplits(train, test, list(train.classes), _targets(train.targets), _targets(test.targets))
    else:
        splits = _split_folder(
            "imagefolder", root, root, looked_for, None, train_transform, test_transform, seed, downloadable=False
        )
    return limit_train(splits, num_samples, seed)


# ------------------------------------------------------------------------------------------------
# Hugging Face datasets (data/hf.py): the one builder that takes a source (build_dataset passes it)


@register_dataset("hf")
def _hf(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
    source: HFSource | None = None,
) -> DatasetSplits:
    from fl_lightning.data.hf import build_hf_dataset

    return build_hf_dataset(
        source or HFSource(),
        download=download,
        train_transform=train_transform,
        test_transform=test_transform,
        seed=seed,
        num_samples=num_samples,
    )


# ------------------------------------------------------------------------------------------------
# in-memory data sets: no files needed


@register_dataset("digits")
def _digits(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    """scikit-learn's bundled UCI handwritten digits: 1797 real 8×8 images with values 0..16."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    # 0..16 -> 0..255, replicated to 3 channels so RGB backbones take it: (N, 3, 8, 8) uint8.
    gray = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    images = torch.from_numpy(gray)[:, None].expand(-1, 3, -1, -1).contiguous()
    targets = _targets(digits.target)
    train_idx, test_idx = train_test_split(np.arange(targets.shape[0]), test_size=0.2, random_state=seed, stratify=targets)
    train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
    splits = DatasetSplits(
        _InMemoryImages(images=images[train_idx], targets=targets[train_idx], transform=train_transform),
        _InMemoryImages(images=images[test_idx], targets=targets[test_idx], transform=test_transform),
        [str(d) for d in range(10)],
        targets[train_idx],
        targets[test_idx],
    )
    return limit_train(splits, num_samples, seed)


_SYNTHETIC_CLASSES = 10
_SYNTHETIC_TRAIN = 512  # default number of generated training images; the test split gets 1/4
_SYNTHETIC_SIZE = 32
_SYNTHETIC_NOISE = 0.2  # per-pixel noise std on [0, 1] images: visible, yet classes stay apart


@register_dataset("synthetic")
def _synthetic(
    *,
    root: Path,
    download: bool,
    train_transform: Transform,
    test_transform: Transform,
    seed: int,
    num_samples: int | None,
) -> DatasetSplits:
    """Each class is a smooth random colour pattern (a 4×4×3 grid upsampled to 32×32); a sample is
    its class pattern plus Gaussian pixel noise — learnable by a small model in a few steps."""
    n_train = _SYNTHETIC_TRAIN if num_samples is None else num_samples
    n_test = max(n_train // 4, _SYNTHETIC_CLASSES)
    rng = np.random.default_rng(seed)
    coarse = torch.from_numpy(rng.uniform(0.0, 1.0, (_SYNTHETIC_CLASSES, 3, 4, 4)))
    patterns = torch.nn.functional.interpolate(
        coarse, size=(_SYNTHETIC_SIZE, _SYNTHETIC_SIZE), mode="bilinear", align_corners=False
    ).numpy()  # (C, 3, 32, 32) in [0, 1]

    def sample(n: int) -> tuple[torch.Tensor, np.ndarray]:
        # Balanced labels in random order.
        labels = rng.permutation(np.arange(n) % _SYNTHETIC_CLASSES).astype(np.int64)
        noisy = patterns[labels] + rng.normal(0.0, _SYNTHETIC_NOISE, (n, *patterns.shape[1:]))
        images = np.rint(np.clip(noisy, 0.0, 1.0) * 255.0).astype(np.uint8)
        return torch.from_numpy(images), labels

    train_images, train_targets = sample(n_train)
    test_images, test_targets = sample(n_test)
    return DatasetSplits(
        _InMemoryImages(images=train_images, targets=train_targets, transform=train_transform),
        _InMemoryImages(images=test_images, targets=test_targets, transform=test_transform),
        [f"class_{c}" for c in range(_SYNTHETIC_CLASSES)],
        train_targets,
        test_targets,
    )
