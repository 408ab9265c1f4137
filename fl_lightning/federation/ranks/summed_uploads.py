"""Uploads the server only sums, folded where they are made: whole models (GPT-FL, FGL) never cross the run folder.

A stage whose aggregate is a weighted mean of some upload tensors and nothing else (FedAvg of whole models,
McMahan et al. 2017: ``w = Σ_k n_k w_k / Σ_k n_k``) says so with :class:`UploadSum`. The engine then deals the
round's clients to ranks in contiguous blocks in client order (placement.deal_in_order) and each rank folds its
clients' tensors into one :class:`~fl_lightning.federation.aggregate.WeightedMean` — the fold every averaging method
uses — in client order:

* rank 0 folds each of its clients' uploads on its device the moment the client ends (its block comes first, so it
  starts from nothing);
* after the round's records gather, rank 0 hands its float64 sums to the next rank with a block, which folds its own
  clients' uploads (held on the host until then) onto them and hands them on; the last rank hands the whole sum back
  to rank 0 (:func:`carry_fold`).

That is the one left fold over every client in client order that rank 0 alone computed from the records before, on
the same float64 sums (a carried sum travels exactly), so every float of the new global model is the same for any
number of ranks; only the ``float64`` sums cross the backend (point to point, on the device's group: NCCL on
GPUs), once per rank with a block. Each rank's own part of the traffic accounting travels with its records
(:class:`FoldedUpload`: the meta and the byte count of what was folded).

What it gives up: a round's folded clients live in memory only, so a run killed in the round re-runs the whole round
on resume (to the same result); ``federation.record_after_s: 0`` keeps today's record per client on disk instead.
The engine folds only where nothing needs the uploads one by one: no ``federation.privacy``, the mean aggregator, no
late (stale) updates.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from fl_lightning.federation.aggregate import WeightedMean
from fl_lightning.federation.ranks.collectives import everyone, waiting
from fl_lightning.federation.ranks.ddp_strategy import object_group
from fl_lightning.federation.transport import Upload
from fl_lightning.phase_times import timed

if TYPE_CHECKING:
    from lightning.fabric import Fabric

__all__ = ["UploadSum", "FoldedUpload", "FoldedUploads", "UploadFold", "carry_fold", "summed_mean"]


@dataclass(frozen=True)
class UploadSum:
    """What of an upload the aggregate only sums: the tensors named with one of ``prefixes``, weighted by the upload's
    ``meta[weight]`` (its sample count n_k)."""

    prefixes: tuple[str, ...]
    weight: str = "num_samples"

    def of(self, upload: Upload) -> dict[str, torch.Tensor]:
        """The upload's summed tensors."""
        return {k: v for k, v in upload.tensors.items() if k.startswith(self.prefixes)}


@dataclass
class FoldedUpload(Upload):
    """What is left of an upload once its summed tensors are folded: its other tensors and meta, and how many bytes the
    folded ones took (``num_bytes`` counts them: the traffic is the upload's)."""

    folded_bytes: int = 0

    @property
    def num_bytes(self) -> int:
        return super().num_bytes + self.folded_bytes


class FoldedUploads(Mapping[int, Upload]):
    """``client → FoldedUpload`` in client order, with the whole round's fold (``mean``) of their summed tensors."""

    def __init__(self, rests: Mapping[int, Upload], mean: WeightedMean) -> None:
        self._rests, self.mean = dict(sorted(rests.items())), mean

    def __getitem__(self, client: int) -> Upload:
        return self._rests[client]

    def __iter__(self) -> Iterator[int]:
        return iter(self._rests)

    def __len__(self) -> int:
        return len(self._rests)


def summed_mean(uploads: Mapping[int, Upload], summed: UploadSum) -> WeightedMean:
    """The fold of the uploads' summed tensors in client order: the ranks' carried fold when the engine folded them
    (:class:`FoldedUploads`), else folded here from the whole uploads — the same floats either way."""
    if isinstance(uploads, FoldedUploads):
        return uploads.mean
    mean = WeightedMean()
    for _, upload in uploads.items():
        mean.add(summed.of(upload), upload.meta[summed.weight])
    return mean


def _host_copy(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies (a client's tensors may alias the module the next client trains in place)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}


class UploadFold:
    """One rank's part of the round's fold: its clients' summed tensors, in client order.

    Args:
        summed: what of each upload is summed.
        device: where the sums live (the rank's device: the backend sends them from there).
        starts: this rank's block is the round's first (rank 0): it folds each upload at once; the others hold theirs
            on the host until the sum before them arrives (:meth:`fold_onto`).
    """

    def __init__(self, summed: UploadSum, device: torch.device, *, starts: bool) -> None:
        self.summed, self.device = summed, torch.device(device)
        self.mean: WeightedMean | None = WeightedMean() if starts else None
        self._queue: list[tuple[dict[str, torch.Tensor], float]] = []
        self.total: WeightedMean | None = None  # the whole round's fold, on rank 0 once carry_fold has run

    def add(self, upload: Upload) -> FoldedUpload:
        """Fold (or hold) one client's summed tensors; what is left of its upload."""
        tensors, weight = self.summed.of(upload), float(upload.meta[self.summed.weight])
        if self.mean is not None:
            self.mean.add({k: v.to(self.device) for k, v in tensors.items()}, weight)
        else:
            self._queue.append((_host_copy(tensors), weight))
        rest = {k: v for k, v in upload.tensors.items() if k not in tensors}
        folded = sum(t.numel() * t.element_size() for t in tensors.values())
        return FoldedUpload(_host_copy(rest), dict(upload.meta), folded_bytes=folded)

    def fold_onto(self, carried: WeightedMean) -> WeightedMean:
        """``carried`` (the fold of every client before this rank's block) with this rank's held uploads folded on."""
        for tensors, weight in self._queue:
            carried.add({k: v.to(self.device) for k, v in tensors.items()}, weight)
        self._queue.clear()
        return carried


def carry_fold(fabric: Fabric, fold: UploadFold, path: Sequence[int], *, what: str, timeout_s: float) -> WeightedMean | None:
    """This rank's link of the round's fold: receive the sum from the rank before it in ``path``, fold its clients on,
    hand it to the next (the last hands it back to rank 0). Every rank calls it (inside ``collectives.everyone``).

    A rank that fails in its link hands a failure on instead of sums, then raises: no rank waits for sums that will
    not come, and the exchange of outcomes after it names that rank on every rank.

    Args:
        fabric: the launched Fabric.
        fold: this rank's fold.
        path: rank 0, then the ranks with a block in the round, in rank (= client) order.
        what: the step, in words, for a timeout's message.
        timeout_s: ``federation.collective_timeout_s``.

    Returns:
        On rank 0 the whole round's fold (None when a rank failed); None on the other ranks.
    """
    rank = fabric.global_rank
    if rank not in path:
        return None
    if len(path) == 1:  # one rank with clients (one process): rank 0's own fold is the round's
        return fold.mean
    at = path.index(rank)
    successor = path[at + 1] if at + 1 < len(path) else 0
    carried = fold.mean if at == 0 else _received(fabric, path[at - 1], fold.device, what=what, timeout_s=timeout_s)
    if carried is not None:
        try:
            carried = fold.fold_onto(carried)
        except Exception:
            _send(fabric, None, successor)
            raise
    _send(fabric, carried, successor)
    fold.mean = carried = None  # sent (the backend keeps what it still reads): its memory, 2× the model, is free
    if at == 0:
        return _received(fabric, path[-1], fold.device, what=what, timeout_s=timeout_s)
    return None


def _send(fabric: Fabric, mean: WeightedMean | None, dst: int) -> None:
    """The fold's description over the object group (None: a failure before this rank), then its sums over the default
    group (from the device: NCCL's point to point on GPUs)."""
    parts = None if mean is None else mean.parts()
    dist.send_object_list([None if parts is None else (parts[0], parts[2])], dst, group=object_group(fabric))
    if parts is not None:
        for key in parts[0]:
            dist.send(parts[1][key].contiguous(), dst)


def _received(fabric: Fabric, src: int, device: torch.device, *, what: str, timeout_s: float) -> WeightedMean | None:
    """The fold ``src`` sent (:func:`_send`) on ``device``; None when it sent a failure."""
    box: list = [None]
    with waiting(what, timeout_s, fabric.global_rank):
        dist.recv_object_list(box, src, group=object_group(fabric))
    if box[0] is None:
        return None
    header, total = box[0]
    sums = {}
    for key, (shape, _, _) in header.items():
        sums[key] = torch.empty(shape, dtype=torch.float64, device=device)
        dist.recv(sums[key], src)
    return WeightedMean.carried(header, sums, total)


def summed_uploads_of(algorithm: Any, round_idx: int, policies: Any, record_after_s: float) -> UploadSum | None:
    """What of round ``round_idx``'s uploads the ranks fold where they are made: the method's summed tensors, unless
    something needs each upload whole on the server — an update policy that reads each one (privacy's clipping, a
    robust aggregator, late updates carried to a later round), an aggregate every rank runs from the round's files
    — or ``federation.record_after_s: 0`` asks for every client's record on disk (a resumed round then re-runs only
    its unfinished clients)."""
    if policies.reads_each_upload or record_after_s <= 0 or algorithm.shared_aggregate(round_idx):
        return None
    return algorithm.summed_uploads(round_idx)


def carry_round_fold(fabric: Any, fold: UploadFold | None, path: list[int], what: str, timeout_s: float) -> None:
    """The round's fold carried along ``path`` to rank 0 (:func:`carry_fold`; a failure on any rank ends every
    rank), a timed part of the aggregate; ``what``: the round, for the lines that name a failure."""
    assert fold is not None
    what = f"{what}'s summed uploads"
    with timed("aggregate"):
        fold.total = everyone(
            fabric, partial(carry_fold, fabric, fold, path, what=what, timeout_s=timeout_s), what=what, timeout_s=timeout_s
        )
