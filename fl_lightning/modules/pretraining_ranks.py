"""Server pre-training data-parallel over every rank of a shared server phase (the pieces ``pretraining.py`` uses).

When every rank is inside the phase (``env.shared``, world size N > 1), :func:`~fl_lightning.modules.pretraining.
pretrain_classifier` runs one Lightning ``Trainer`` per rank that joins the run's existing process group
(:class:`JoinedDDP`: no launcher, no second ``init_process_group``; gloo on CPU, NCCL on GPU, under ``fabric run``,
torchrun or the Fabric launcher alike) and all-reduces the gradients (DDP).

* **Global batch = the configured batch.** Every epoch draws the one-rank permutation (the same generator, the same
  draws as the one-rank ``DataLoader(shuffle=True)``), cuts it into the one-rank batches of B rows, and rank r takes
  rows r, r + N, … of each (:class:`RankBatches`: ⌈B/N⌉ or ⌊B/N⌋ rows). Rank r's loss is (N / |b|) Σ_{i ∈ its rows}
  CE_i, so DDP's mean over ranks is (1/|b|) Σ_{i ∈ b} CE_i: the one-rank batch's mean loss, its gradient, the same
  number of optimizer steps and the same learning-rate schedule. Only float round-off differs (per-rank forwards
  of other batch companions, and the gradient sum in another order). A rank left without a row of a short last
  batch (|b| < N) runs its first row at weight 0. Validation is split the same way (unshuffled), its accuracy
  counts summed over ranks (exact integers), its loss the batches' means combined by batch size.
* **Augmentation.** Each rank's random states are reseeded at each epoch's start from (seed, epoch, rank)
  (:class:`RankSeeds`): ranks draw different crops, and a resumed epoch draws what the interrupted one drew.
* **A failure on any rank ends every rank** (:class:`RankGuard`): a step's error (a bad image, the forward) is
  caught before the backward's all-reduce, every step all-reduces one flag, and when it is set every rank joins one
  exchange of outcomes (``collectives.everyone``): rank 0 raises the error (or one naming the failing rank), the
  others stop quietly. Rank 0's checkpoint writes are checked the same way at each epoch's end (:class:`GuardedIO`;
  the epoch state, written in the background, at the next epoch's end or the fit's: ``pretraining._EpochState``).
  A failure inside the backward itself (out of memory there) leaves the others in DDP's all-reduce: the failing
  rank takes its error to the next exchange of outcomes, says so in its heartbeat, and the others' liveness watch
  ends the job two beats later with its line (federation/ranks/liveness.py), well inside the compute group's timeout
  (``federation.compute_timeout_s``: federation/ranks/ddp_strategy.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import Any

import lightning
import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate

from fl_lightning.dealing import Deal
from fl_lightning.federation.ranks.collectives import Ranks, everyone, waiting

__all__ = [
    "RankBatches",
    "RankItems",
    "FailedBatch",
    "collate_rank_items",
    "RankGuard",
    "GuardedIO",
    "RankSeeds",
    "JoinedDDP",
    "shard_rows",
    "seed_rank_worker",
]


def shard_rows(batch: Sequence[int], rank: int, world: int) -> list[tuple[int, float, int]]:
    """Rank ``rank``'s rows of one global batch b as ``(index, loss weight N/|b|, |b|)`` (rows r, r + N, …); a rank
    left without a row gets the batch's first row at weight 0 (it must still take part in the all-reduce). The rows
    are dealt in turn (:meth:`~fl_lightning.dealing.Deal.strided`), so every rank's share is ⌈|b|/N⌉ or ⌊|b|/N⌋."""
    rows = [batch[i] for i in Deal(rank, world).strided(len(batch))]
    if not rows:
        return [(int(batch[0]), 0.0, len(batch))]
    return [(int(i), world / len(batch), len(batch)) for i in rows]


class RankBatches:
    """A batch sampler: the one-rank batches of ``batch_size`` rows of the epoch's order, this rank's rows of each.

    Shuffled (``generator`` given), each epoch draws ``torch.randperm(n)`` twice from ``generator`` as
    ``RandomSampler`` does (the second is not used), so every rank's order, epoch after epoch, is the one-rank
    ``DataLoader(shuffle=True, generator=...)``'s. Without ``generator``: the dataset's order.

    Yields lists of ``(index, weight, global batch size)`` for :class:`RankItems`.
    """

    def __init__(self, n: int, batch_size: int, rank: int, world: int, generator: torch.Generator | None) -> None:
        if n < 1 or batch_size < 1 or not 0 <= rank < world:
            raise ValueError(f"RankBatches(n={n}, batch_size={batch_size}, rank={rank}, world={world}) is not allowed")
        self.n, self.batch_size, self.rank, self.world, self.generator = n, batch_size, rank, world, generator

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def __iter__(self) -> Iterator[list[tuple[int, float, int]]]:
        if self.generator is None:
            order = list(range(self.n))
        else:
            order = torch.randperm(self.n, generator=self.generator).tolist()
            torch.randperm(self.n, generator=self.generator)  # RandomSampler's second (empty-sliced) draw
        for start in range(0, self.n, self.batch_size):
            yield shard_rows(order[start : start + self.batch_size], self.rank, self.world)


class FailedBatch:
    """A batch whose loading raised: the error travels to the step, which reports it to every rank."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class RankItems(Dataset):
    """``dataset`` read by :class:`RankBatches`' keys: ``(image, label, weight, global batch size)``, or the loading
    error (a :class:`FailedBatch`)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, float, int]) -> Any:
        index, weight, size = key
        try:
            x, y = self.dataset[index]
        except Exception as err:  # noqa: BLE001 — reported to every rank by the step (RankGuard)
            return FailedBatch(err)
        return x, y, torch.tensor(weight, dtype=torch.float32), torch.tensor(size)


def collate_rank_items(items: list[Any]) -> Any:
    """``default_collate``, or the first :class:`FailedBatch` among the items."""
    for item in items:
        if isinstance(item, FailedBatch):
            return item
    try:
        return default_collate(items)
    except Exception as err:  # noqa: BLE001 — e.g. images of different sizes
        return FailedBatch(err)


class GuardedIO(TorchCheckpointIO):
    """Rank 0's checkpoint writes through the Trainer (the best checkpoint's), whose error is kept (not raised, which
    would leave the other ranks in the Trainer's barrier) until :meth:`RankGuard.agree` reports it to every rank at
    the epoch's end."""

    error: Exception | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        try:
            super().save_checkpoint(checkpoint, path, storage_options)
        except Exception as err:  # noqa: BLE001
            self.error = self.error or err

    def pop_error(self) -> Exception | None:
        error, self.error = self.error, None
        return error


class RankGuard:
    """One flag all-reduced every ``every`` steps (and at each epoch's end): set by any rank, every rank joins one
    exchange of outcomes (``collectives.everyone``) and stops: rank 0 with its error or one naming the failing rank.

    Each check costs an all-reduce and a host sync (``flag.item()``: the CPU waits for the GPU's queue to drain).
    Between checks a rank that fails raises at once (:meth:`due`): it enters the engine's exchange of outcomes with
    its error, saying so in its heartbeat, while the others wait in the step's next compute collective (DDP's
    gradient all-reduce) — the ranks' liveness watch ends every rank two beats later (``federation/ranks/liveness.py``),
    as for an error inside DDP's backward. ``every = 1`` checks every step: the failing rank's own line within the
    step, at a sync a step.
    """

    def __init__(self, ranks: Ranks, device: torch.device, every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"every={every!r} is not allowed; expected an int >= 1 (steps between checks)")
        self.ranks, self.device, self.every = ranks, device, int(every)

    def due(self, batch_idx: int) -> bool:
        """Whether the step of ``batch_idx`` (0-based, within its epoch) is a checked one: every ``every``-th."""
        return (batch_idx + 1) % self.every == 0

    def agree(self, own: Exception | None, what: str) -> None:
        """Every rank calls this at the same point; raises on every rank when any passed an error."""
        flag = torch.tensor([0 if own is None else 1], dtype=torch.int32, device=self.device)
        with waiting(what, self.ranks.compute_timeout_s, self.ranks.rank, key="federation.compute_timeout_s"):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not int(flag.item()):
            return

        def step() -> None:
            if own is not None:
                raise own

        everyone(self.ranks.fabric, step, what=what, timeout_s=self.ranks.timeout_s)
        raise RuntimeError(f"{what}: a rank reported a failure that the exchange did not show")  # not reached


class RankSeeds(Callback):
    """Reseeds torch / numpy / Python at each training epoch's start from (seed, epoch, rank): every rank its own
    augmentation stream, and a resumed epoch the same draws as the interrupted one."""

    def __init__(self, seed: int, rank: int) -> None:
        self.seed, self.rank = int(seed), int(rank)

    def on_train_epoch_start(self, trainer: lightning.Trainer, pl_module: lightning.LightningModule) -> None:
        _reseed(self.seed, trainer.current_epoch, self.rank)


def seed_rank_worker(rank: int, worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn`` on rank ``rank``: torch / numpy / Python reseeded from (the seed
    the DataLoader gave this worker, ``rank``). Every rank draws the same base seed from the shared data-order
    generator (the ranks' batches come from one permutation), so without this the ranks' workers would run the
    same augmentation stream."""
    _reseed(torch.initial_seed(), rank, worker_id)


def _reseed(*entropy: int) -> None:
    """torch / numpy / Python seeded from ``entropy`` (a SeedSequence: distinct tuples, independent streams)."""
    state = np.random.SeedSequence([int(e) for e in entropy]).generate_state(2)
    value = int(state[0]) << 32 | int(state[1])
    torch.manual_seed(value)
    np.random.seed(int(state[0]))
    random.seed(value)


class _JoinedEnvironment(ClusterEnvironment):
    """The ranks of the process group that exists already (the run's Fabric made it): its setters change nothing."""

    def __init__(self, ranks: Ranks) -> None:
        fabric = ranks.fabric
        self._world, self._rank = int(ranks.world), int(ranks.rank)
        self._local = int(getattr(fabric, "local_rank", ranks.rank))
        self._node = int(getattr(fabric, "node_rank", 0))

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return "127.0.0.1"  # never used: the process group is initialised

    @property
    def main_port(self) -> int:
        return 0

    @staticmethod
    def detect() -> bool:
        return dist.is_available() and dist.is_initialized()

    def world_size(self) -> int:
        return self._world

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return self._rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return self._local

    def node_rank(self) -> int:
        return self._node


class JoinedDDP(DDPStrategy):
    """Lightning's DDP on the run's process group and on this rank's device: no launcher (every rank is running),
    ``init_process_group`` skipped (Lightning's own check: the group exists), buffers not broadcast (the ViT has no
    running statistics; the ranks' weights are equal after every step)."""

    def __init__(self, ranks: Ranks, device: torch.device) -> None:
        super().__init__(
            cluster_environment=_JoinedEnvironment(ranks),
            parallel_devices=[device],
            process_group_backend=str(dist.get_backend()),
            forward_sync_buffers=False,
        )
        self._device = device

    @property
    def root_device(self) -> torch.device:
        return self._device

    def _configure_launcher(self) -> None:
        self._launcher = None
