"""Poisson-sampled batches for DP-SGD (Abadi et al. 2016, §3.1 "lots"; the sampling the accountant assumes).

Each step's batch holds every record independently with probability q, so its size is random — possibly zero (a
step of noise alone). The privacy amplification the accountant credits (``PoissonSampledDpEvent(q, …)``) holds only
for this sampling with q fixed before the data are seen, and only while the draws stay hidden: the generator is
seeded from the run's noise source (OS entropy unless ``privacy.reproducible_noise``), never from the run's seed.
Shuffled fixed-size batches are a different mechanism (every record in exactly one batch per epoch) that the
Poisson accounting does not cover.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

__all__ = ["poisson_batches", "PoissonBatches"]


def poisson_batches(num_records: int, rate: float, steps: int, generator: torch.Generator) -> list[list[int]]:
    """``steps`` index lists over ``range(num_records)``, each record in each list independently with probability
    ``rate`` (lists may be empty), drawn one step at a time from ``generator``."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a sampling rate in (0, 1], got {rate}")
    return [torch.nonzero(torch.rand(num_records, generator=generator) < rate).flatten().tolist() for _ in range(steps)]


class PoissonBatches:
    """One epoch of DP-SGD's Poisson-sampled batches per iteration: ``steps_per_epoch`` items, each a collated batch
    or None for a step whose lot is empty (the step then applies the noise alone).

    The non-empty lots of an epoch are drawn up front and read through ``make_loader(lots)`` — a DataLoader with
    them as its ``batch_sampler`` (workers, pinned memory and the collate of the run's other loaders), so no
    collate ever sees an empty list. Each iteration draws a new epoch from the same generator.

    Args:
        num_records: the client's records (the dataset's length).
        rate: q, the public sampling rate.
        steps_per_epoch: the public number of steps of one epoch.
        generator: the draws' source (seeded from the run's noise source, never recorded).
        make_loader: builds the iterable of collated batches for a list of non-empty index lists, in order.
    """

    def __init__(
        self,
        num_records: int,
        *,
        rate: float,
        steps_per_epoch: int,
        generator: torch.Generator,
        make_loader: Callable[[list[list[int]]], Iterable[Any]],
    ) -> None:
        self.num_records, self.rate, self.steps_per_epoch = num_records, rate, steps_per_epoch
        self.generator, self.make_loader = generator, make_loader

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[Any]:
        lots = poisson_batches(self.num_records, self.rate, self.steps_per_epoch, self.generator)
        batches = iter(self.make_loader([lot for lot in lots if lot]))
        for lot in lots:
            yield next(batches) if lot else None
