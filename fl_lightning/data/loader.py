"""How a rank loads its clients' images: the DataLoader settings, and one loader kept for the whole run.

Two pieces, both used by :meth:`~fl_lightning.federation.algorithm.Environment.loader`:

* :func:`resolve_loader_settings` turns ``data.num_workers`` / ``data.pin_memory`` /
  ``data.persistent_workers`` (each an explicit value or ``"auto"``) into the values a DataLoader gets. A pure
  function of its inputs (the accelerator, the CPU cores this process may use, the ranks on the node):
  ``auto`` means no worker on the CPU (the rank loads in its own process, as every CPU test does) and, on CUDA,
  ``min(4, cores // ranks)`` workers per rank, pinned memory, and workers that live as long as the loader.
* :class:`ClientPasses`: with workers, ONE DataLoader over the training split per rank, kept for the run,
  whose batch sampler (:class:`ClientBatchSampler`) is pointed at a client's rows (indices and seed) before
  each pass. The workers are started once (``persistent_workers``), not once per client and pass, and a
  worker's preprocessed cache (data/preprocessed.py) survives from one client to the next. The batches are
  exactly those of the per-client ``DataLoader(Subset(train, rows), shuffle=True, generator=seeded)`` of
  before: the sampler draws from the client's generator what that loader drew — first the int64 base seed
  every DataLoader iterator takes from its generator, then ``torch.randperm`` over the client's rows (torch's
  ``RandomSampler``) — and reads the same rows in the same order (tested against the old construction).
* :class:`DeviceFloatPart` (``data.normalize_on_device``, on CUDA by default): a uint8 store's batches
  (data/preprocessed.py) leave the loader as uint8 — a quarter of the bytes through the workers' queues, the
  pinned buffer and the host-to-device copy — and their float part (``ToDtype``, clamp, ``Normalize``, elementwise)
  runs on the device. The loader processes then only gather stored rows: on the CPU the float part was most of
  what a worker did per image once the store is full (docs/gpu.md). The values are the same ops on the same
  bytes (on the CPU bit for bit, tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = [
    "LoaderSettings",
    "resolve_loader_settings",
    "ClientBatchSampler",
    "ClientPasses",
    "DeviceFloatPart",
    "TensorBatches",
    "AUTO_MAX_WORKERS",
]

AUTO_MAX_WORKERS = 4  # auto's cap on workers per rank: enough for a CLIP 224-px pipeline on one GPU (docs/gpu.md)


@dataclass(frozen=True)
class LoaderSettings:
    """What a rank's DataLoaders get (the ``auto`` values resolved)."""

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    normalize_on_device: bool = False  # a uint8 store's float part after the copy to the device (DeviceFloatPart)


def resolve_loader_settings(
    num_workers: int | str,
    pin_memory: bool | str,
    persistent_workers: bool | str,
    *,
    cuda: bool,
    cpus: int,
    ranks_on_node: int,
    normalize_on_device: bool | str = False,
) -> LoaderSettings:
    """The DataLoader settings of one rank.

    Args:
        num_workers: an int >= 0, or ``"auto"``: 0 when ``cuda`` is false (the CPU: the rank's own process loads,
            no worker start-up, no core taken from the ranks), else ``min(AUTO_MAX_WORKERS, cpus // ranks_on_node
            - 1)`` and at least 0 — the cores of this node's share left after the rank's own process.
        pin_memory: a bool, or ``"auto"``: on CUDA only (page-locked batches copy to the GPU asynchronously).
        persistent_workers: a bool, or ``"auto"``: whenever there are workers. Forced off without workers
            (DataLoader refuses it then).
        normalize_on_device: a bool, or ``"auto"``: on CUDA (:class:`DeviceFloatPart`).
        cuda: whether the rank's device is a CUDA GPU.
        cpus: the CPU cores this process may use (``cores.available_cpus``).
        ranks_on_node: the ranks that share those cores (``federation.devices``).

    Example:
        >>> resolve_loader_settings("auto", "auto", "auto", cuda=True, cpus=16, ranks_on_node=2, normalize_on_device="auto")
        LoaderSettings(num_workers=4, pin_memory=True, persistent_workers=True, normalize_on_device=True)
        >>> resolve_loader_settings("auto", "auto", "auto", cuda=False, cpus=16, ranks_on_node=1)
        LoaderSettings(num_workers=0, pin_memory=False, persistent_workers=False, normalize_on_device=False)
    """
    if num_workers == "auto":
        workers = max(0, min(AUTO_MAX_WORKERS, max(1, cpus) // max(1, ranks_on_node) - 1)) if cuda else 0
    else:
        workers = int(num_workers)
    pin = cuda if pin_memory == "auto" else bool(pin_memory)
    persistent = workers > 0 and (True if persistent_workers == "auto" else bool(persistent_workers))
    on_device = cuda if normalize_on_device == "auto" else bool(normalize_on_device)
    return LoaderSettings(workers, pin, persistent, on_device)


class ClientBatchSampler(Sampler[list[int]]):
    """The batches of one pass over a client's rows of the training split; :meth:`set` before each pass.

    ``shuffle`` with ``seed``: each iteration draws from the pass's own generator (seeded once in :meth:`set`,
    so a second epoch continues it, as a DataLoader's generator does) what the DataLoader did, at the same
    points: one int64 (the base seed of its iterator), ``torch.randperm(n)`` of the rows, and, as torch's
    ``BatchSampler`` runs its ``RandomSampler`` dry, that sampler's second ``randperm(n)`` (its empty tail);
    without shuffle, the rows in order.
    """

    def __init__(self) -> None:
        self._rows: list[int] = []
        self._batch_size = 1
        self._generator: torch.Generator | None = None

    def set(self, rows: Sequence[int], *, batch_size: int, shuffle: bool, seed: int = 0) -> None:
        self._rows = [int(r) for r in rows]
        self._batch_size = int(batch_size)
        self._generator = torch.Generator().manual_seed(seed) if shuffle else None

    def __len__(self) -> int:
        return -(-len(self._rows) // self._batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        # the pass is read now, not at the first batch: a later set() cannot reach a pass already started
        return self._batches(self._rows, self._batch_size, self._generator)

    @staticmethod
    def _batches(rows: list[int], size: int, generator: torch.Generator | None) -> Iterator[list[int]]:
        if generator is None:
            for start in range(0, len(rows), size):
                yield rows[start : start + size]
            return
        n = len(rows)
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the DataLoader iterator's base seed
        order = [rows[i] for i in torch.randperm(n, generator=generator).tolist()]
        full = n - n % size
        for start in range(0, full, size):
            yield order[start : start + size]
        # RandomSampler's second randperm (its empty tail, num_samples % n), drawn as BatchSampler runs it dry
        torch.randperm(n, generator=generator)
        if full < n:
            yield order[full:]


class ClientPasses:
    """One DataLoader over ``dataset`` (a rank's training split) for the run; :meth:`pass_over` gives one client's
    pass. Iterate a pass to completion, or stop early: the next pass starts clean (torch discards what the
    persistent workers had fetched ahead)."""

    def __init__(
        self, dataset: Dataset, *, num_workers: int, pin_memory: bool, persistent_workers: bool, collate_fn: Any
    ) -> None:
        self.dataset = dataset
        self.sampler = ClientBatchSampler()
        # its own generator: the loader's base seed never touches the global RNG
        self.loader = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            collate_fn=collate_fn,
            generator=torch.Generator().manual_seed(0),
        )

    def pass_over(self, rows: Sequence[int], *, batch_size: int, shuffle: bool, seed: int = 0) -> _Pass:
        return _Pass(self, list(rows), batch_size, shuffle, seed)


class _Pass:
    """A client's loader as its method sees it: iterable (every epoch) and sized. Each epoch continues the
    client's generator, as iterating one seeded DataLoader again does."""

    def __init__(self, passes: ClientPasses, rows: list[int], batch_size: int, shuffle: bool, seed: int) -> None:
        self.passes, self.dataset = passes, passes.dataset
        self._sampler = ClientBatchSampler()
        self._sampler.set(rows, batch_size=batch_size, shuffle=shuffle, seed=seed)

    def __len__(self) -> int:
        return len(self._sampler)

    def __iter__(self) -> Iterator[Any]:
        shared = self.passes.sampler
        shared._rows, shared._batch_size, shared._generator = (
            self._sampler._rows,
            self._sampler._batch_size,
            self._sampler._generator,
        )
        return iter(self.passes.loader)


class DeviceFloatPart:
    """``loader``'s batches with their uint8 images finished on ``device``: each batch ``[images, *rest]`` whose
    images are uint8 (a uint8 store's rows, collated without their float part) is copied to ``device``
    (asynchronously from pinned memory) and put through ``float_part`` there; any other batch (a float32 store's,
    a first pass made item by item) is handed on as it is. The rest of the batch (the labels) stays where the
    loader put it: the callers move it as before. Sized and iterable as ``loader`` is; other attributes are
    ``loader``'s (``dataset``, ``batch_size``).

    Args:
        loader: a DataLoader (or a :class:`ClientPasses` pass) whose collate keeps uint8 batches uint8.
        device: the rank's device.
        float_part: the uint8 store's float part (``PreprocessedSplit.float_part``), elementwise.
    """

    def __init__(self, loader: Any, *, device: torch.device | str, float_part: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.loader, self.device, self.float_part = loader, torch.device(device), float_part

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for images, *rest in self.loader:
            if isinstance(images, torch.Tensor) and images.dtype == torch.uint8:
                images = self.float_part(images.to(self.device, non_blocking=True))  # (B, 3, H, W) float32
            yield [images, *rest]

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "device", "float_part"):  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


class TensorBatches:
    """The batches ``DataLoader(TensorDataset(*tensors), batch_size, shuffle, generator=seeded)`` gives — the same
    rows in the same order (its draws, through :class:`ClientBatchSampler`), the same values — gathered by one
    indexing call per batch from tensors that stay where they are (a frozen-feature table on the GPU): no worker, no
    per-row collate, no host-to-device copy per step. For a head trained on features (FedAvg of a head), whose steps
    take microseconds.

    Args:
        tensors: (N, ...) tensors of one length, on one device.
        batch_size: rows per batch (the last batch may be short).
        shuffle: a new order each epoch from the generator seeded with ``seed`` (as a seeded DataLoader's).
        seed: the generator's seed.
    """

    def __init__(self, *tensors: torch.Tensor, batch_size: int, shuffle: bool, seed: int = 0) -> None:
        if not tensors or len({len(t) for t in tensors}) != 1:
            raise ValueError("TensorBatches needs tensors of one length")
        self.tensors = tensors
        self.sampler = ClientBatchSampler()
        self.sampler.set(range(len(tensors[0])), batch_size=batch_size, shuffle=shuffle, seed=seed)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        device = self.tensors[0].device
        for rows in self.sampler:
            index = torch.as_tensor(rows, dtype=torch.int64, device=device)
            yield [t[index] for t in self.tensors]
