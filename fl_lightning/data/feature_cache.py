"""A frozen backbone's features of a whole split, computed once and shared by every run that reads them.

Methods whose clients only read a frozen backbone's features of unaugmented images (AFL, FedCGS,
FedPFT, FedAvg of a linear head) do not need the images at all once the features exist. A comparison
runs such a method many times (methods × α × seeds) on the same backbone and the same images; each
run used to repeat the same backbone pass. Here the features of a split are computed once, in one
fixed way — the whole split in dataset order, in batches of ``data.batch_size``, eval mode, no
augmentation (:func:`split_features`) — and every run gathers its clients' rows by index.

The same function computes them whether or not a cache is used, so the results are bit-identical with
and without it (a float32 forward may depend on the batch a row runs in: the batches are the split's,
never a client's). On disk (:class:`FeatureCache`) a table is one file ``<key>.pt`` whose key is the
sha256 of the backbone's state-dict tensors (:func:`state_dict_digest`) and of a description of
everything else that decides the numbers (:func:`cache_key`: the module, the transform, the dataset,
its split and subset, the batch size, the precision, the device (a GPU by its name), the torch version). A
file is used only when its recorded key, its shape and the sha256 of its tensor all match; anything else (a
torn, corrupt or foreign file) is recomputed and replaced. Files are written atomically (temporary
file + rename), and two processes that write the same key write the same bytes, so shards running at
once need no lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ContextManager

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

__all__ = ["FeatureCache", "accelerator_name", "cache_key", "split_features", "state_dict_digest", "targets_digest"]

_FORMAT = 1  # bump when the file layout or the way features are computed changes


def state_dict_digest(module: nn.Module) -> str:
    """sha256 of every tensor of ``module.state_dict()`` (names, dtypes, shapes and bytes, in name order).

    Generic over backbones (a timm ViT or CNN, an open_clip tower): what defines the function besides
    its weights (the class, the pooling) belongs in :func:`cache_key`'s description.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy())  # 0-dim buffers too (BatchNorm's count)
    return digest.hexdigest()


def accelerator_name(device: torch.device | str) -> str:
    """What computes the numbers, for a key: ``torch.cuda.get_device_name`` on CUDA (an H100 and an A100 pick other
    kernels, so their float round-off differs), the device type elsewhere (``"cpu"``, ``"mps"``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def cache_key(module: nn.Module, description: Mapping[str, Any], *, weights: str | None = None) -> str:
    """The key of a feature table: sha256 of the module's weights, its class and ``description``.

    Args:
        module: the frozen feature extractor (images → (B, d)).
        description: JSON-serialisable values that decide the features besides the weights (the
            transform, the dataset, its split and subset, batch size, precision, :func:`accelerator_name`).
        weights: ``state_dict_digest(module)`` when the caller has it already (it hashes every weight).

    Returns:
        64 hex digits.
    """
    text = json.dumps(
        {
            "format": _FORMAT,
            "class": f"{type(module).__module__}.{type(module).__qualname__}",
            "module": repr(module),
            "weights": weights or state_dict_digest(module),
            "torch": torch.__version__,
            **description,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def split_features(
    feature_fn: Callable[[Tensor], Tensor],
    dataset: Dataset,
    *,
    batch_size: int,
    device: torch.device | str,
    autocast: Callable[[], ContextManager] | None = None,
    num_workers: int = 0,
    normalize_on_device: bool = False,
) -> Tensor:
    """The features of every item of ``dataset``, in dataset order, in fixed batches of ``batch_size``.

    Args:
        feature_fn: images (B, 3, H, W) → features (B, d), frozen and in eval mode.
        dataset: ``(image, label)`` items with a deterministic transform.
        batch_size: rows per forward (the batches are ``[0, B), [B, 2B), …`` of the split).
        device: where the images go.
        autocast: a factory of the context to run ``feature_fn`` under (``fabric.autocast``).
        num_workers: DataLoader workers for the images.
        normalize_on_device: a uint8 store's batches finished on ``device`` (``data.normalize_on_device``;
            data/loader.py's ``DeviceFloatPart``).

    Returns:
        (N, d) on the CPU, in the dtype ``feature_fn`` returns (float32, or bf16 under bf16 autocast).
    """
    from fl_lightning.data.loader import DeviceFloatPart
    from fl_lightning.data.preprocessed import collate, collate_uint8, float_part_of

    context = autocast or contextlib.nullcontext
    float_part = float_part_of(dataset) if normalize_on_device else None
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=collate if float_part is None else collate_uint8,
    )
    if float_part is not None:
        loader = DeviceFloatPart(loader, device=device, float_part=float_part)
    rows = []
    with torch.inference_mode():
        for images, _ in loader:
            with context():
                rows.append(feature_fn(images.to(device)).cpu())  # (B, d)
    if not rows:
        raise ValueError("no items to compute features of")
    return torch.cat(rows)


def _tensor_sha256(t: Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


class FeatureCache:
    """Feature tables on disk under ``folder`` (None: no disk, every table is computed).

    Args:
        folder: where ``<key>.pt`` files live; created on the first write.

    Example:
        >>> cache = FeatureCache(Path("runs/cmp/feature_cache"))  # doctest: +SKIP
        >>> H = cache.get(key, rows=len(ds), compute=lambda: split_features(backbone, ds, batch_size=64,
        ...                                                                 device="cpu"))  # doctest: +SKIP
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = None if folder is None else Path(folder).expanduser()
        self.hits = 0
        self.misses = 0

    def path(self, key: str) -> Path:
        if self.folder is None:
            raise ValueError("this FeatureCache has no folder")
        return self.folder / f"{key}.pt"

    def load(self, key: str, *, rows: int) -> Tensor | None:
        """The table of ``key`` if its file exists and holds exactly it (key, row count, checksum), else None."""
        if self.folder is None:
            return None
        from fl_lightning.errors import UsageError
        from fl_lightning.federation.storage.checkpoint import safe_load

        path = self.path(key)
        if not path.is_file():
            return None
        try:
            record = safe_load(path)
        except UsageError:  # torn or not ours: recomputed
            return None
        if not isinstance(record, dict) or record.get("format") != _FORMAT or record.get("key") != key:
            return None
        features = record.get("features")
        if (
            not isinstance(features, Tensor)
            or features.ndim != 2
            or features.shape[0] != rows
            or record.get("sha256") != _tensor_sha256(features)
        ):
            return None
        return features

    def store(self, key: str, features: Tensor) -> None:
        """Write the table of ``key`` atomically (a killed writer never leaves a torn ``<key>.pt``)."""
        from fl_lightning.federation.storage.checkpoint import atomic_save

        features = features.detach().cpu().contiguous()
        atomic_save(
            {"format": _FORMAT, "key": key, "sha256": _tensor_sha256(features), "features": features},
            self.path(key),
            durable=False,
        )

    def get(self, key: str, *, rows: int, compute: Callable[[], Tensor]) -> Tensor:
        """The table of ``key``: read from disk when a valid file holds it, else ``compute()`` (and stored)."""
        features = self.load(key, rows=rows)
        if features is not None:
            self.hits += 1
            return features
        self.misses += 1
        features = compute()
        if features.shape[0] != rows:
            raise RuntimeError(f"computed {features.shape[0]} feature rows for a split of {rows}")
        if self.folder is not None:
            self.store(key, features)
        return features


def targets_digest(targets: np.ndarray) -> str:
    """sha256 of a split's labels (int64), part of the description of a split."""
    return hashlib.sha256(np.ascontiguousarray(targets, dtype=np.int64).tobytes()).hexdigest()
