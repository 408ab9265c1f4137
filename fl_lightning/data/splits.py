"""What every data set gives the engine (:class:`DatasetSplits`), and what the built-in data sets and the Hugging Face
ones share: the seeded 4:1 split of a data set with one split, the ``data.num_samples`` subset, and the one-line
error of an image that cannot be decoded. :mod:`fl_lightning.data.registry` and :mod:`fl_lightning.data.hf` both
build on it; neither imports the other's internals."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image
from torch.utils.data import Dataset, Subset

from fl_lightning.errors import ConfigError, UsageError

__all__ = ["DatasetSplits", "CorruptImageError", "IMAGE_ERRORS", "own_line", "split_4_to_1", "limit_train"]


def own_line(message: str, name: str) -> str:
    """Our one-line message, also when a DataLoader worker re-raised the error.

    torch re-raises an exception from a worker as ``type(err)("Caught X in DataLoader worker
    process 0.\nOriginal Traceback …")``: the traceback's last ``…X: <message>`` line is ours.
    """
    if "\n" not in message:
        return message
    for line in reversed(message.splitlines()):
        _, sep, rest = line.partition(f"{name}: ")
        if sep:
            return rest.strip()
    return message


class CorruptImageError(UsageError):
    """An image file of the data set cannot be decoded. The message names the file and says to
    remove or replace it; it stays one line when the error comes from a DataLoader worker."""

    def __init__(self, message: str) -> None:
        super().__init__(own_line(message, type(self).__name__))


@dataclass
class DatasetSplits:
    """The two splits of one data set and what partitioning needs to know about them.

    Attributes:
        train: training split; ``train[i]`` is ``(image, target)``.
        test: held-out split used to evaluate the global model.
        classes: class names; ``num_classes == len(classes)``.
        train_targets: (N_train,) int64 labels, aligned with ``train``.
        test_targets: (N_test,) int64 labels, aligned with ``test``.
        fingerprint: what identifies the data beyond the config (a Hugging Face data set's fingerprints);
            part of the feature cache's key when set. None for the built-in data sets.
        train_column: a training-split column's (N_train,) values by name, aligned with ``train``
            (``partition.scheme: natural``); None where the data set has no columns besides its labels.
    """

    train: Dataset
    test: Dataset
    classes: list[str]
    train_targets: np.ndarray
    test_targets: np.ndarray
    fingerprint: str | None = None
    train_column: Callable[[str], np.ndarray] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def split_4_to_1(targets: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded 80/20 split, stratified by class whenever every class has two or more samples."""
    from sklearn.model_selection import train_test_split

    counts = np.bincount(targets)
    stratify = targets if counts[counts > 0].min() >= 2 else None
    train_idx, test_idx = train_test_split(np.arange(targets.shape[0]), test_size=0.2, random_state=seed, stratify=stratify)
    return np.sort(train_idx), np.sort(test_idx)


def limit_train(splits: DatasetSplits, num_samples: int | None, seed: int) -> DatasetSplits:
    """Keep a seeded random subset of ``num_samples`` training images (for quick runs)."""
    if num_samples is None or num_samples == len(splits.train_targets):
        return splits
    n = len(splits.train_targets)
    if num_samples > n:
        raise ConfigError("data.num_samples", num_samples, f"at most the {n} training images")
    keep = np.sort(np.random.default_rng(seed).choice(n, size=num_samples, replace=False))
    splits.train = Subset(splits.train, keep.tolist())
    splits.train_targets = splits.train_targets[keep]
    if splits.train_column is not None:
        splits.train_column = _KeptColumn(splits.train_column, keep)
    return splits


@dataclass(frozen=True)
class _KeptColumn:
    """A column reader restricted to the rows ``keep`` (the ``num_samples`` subset)."""

    read: Callable[[str], np.ndarray]
    keep: np.ndarray

    def __call__(self, name: str) -> np.ndarray:
        return self.read(name)[self.keep]


# What PIL raises for a truncated, garbled or hostile file (UnidentifiedImageError is an OSError;
# some broken PNGs raise SyntaxError, short headers struct.error or EOFError).
IMAGE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError)
