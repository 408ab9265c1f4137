"""Work over ranks: which of n items a rank takes, and the gathered parts put back in item order.

Every place that shares work over the ranks of a run (or the shares of a comparison) deals indices ``0 … n-1`` by
one of two rules, and :class:`Deal` holds both, with the inverse of each:

* **blocks** — rank r of W takes the contiguous block ``[⌊n·r/W⌋, ⌊n·(r+1)/W⌋)``: the blocks are in order, their
  sizes differ by at most one, and the gathered parts joined in rank order are the items in order
  (:meth:`Deal.unblock`). Used for the test split's batches and the frozen-feature tables
  (``algorithms/common.py`` ``rank_rows``), the synthetic-image store's rows (``synthesis/store.py``) and the split
  ensemble's teachers (``modules/data_free_kd_ranks.py``, DENSE's client models): gathered results that are
  concatenated come back in item order without a permutation.
* **strided** — rank r takes ``r, r+W, r+2W, …``; item i is ``parts[i mod W][i div W]`` of the gathered parts
  (:meth:`Deal.unstride`). Used where neighbouring items differ in cost and a turn mixes them: the generation
  batches (sorted by start timestep: each rank about as many long sampling chains as short ones,
  ``synthesis/generate.py``), the rows of one pre-training batch (``modules/pretraining_ranks.py``), the λ pilots
  (``algorithms/synthetic_family/synthesis_step.py``) and a comparison's ``--shard``/``--jobs`` shares (its runs are
  listed method by method: ``experiments/plan.py``).

A site's rule is part of its results — which images share a sampling batch, which rows a rank's forward sees,
which run folder a share writes — so each call site names its rule, and changing one changes numbers or files.

Fabric's ``Strategy`` is the model: the object knows its rank and world, deals the work and puts the gathered
parts back; the gather itself is done by whoever holds the process group (``federation.collectives.Ranks`` and
``gathered``, the split ensemble's all-gather). Pure index arithmetic: no torch, no process group, and no import
of the package, so ``modules/``, ``synthesis/``, ``federation/`` and ``experiments/`` may all import it.

Not here, because they are scheduling policies rather than deals: ``federation/ranks/placement.py``
``assign_clients`` (clients to ranks by data size, longest first), ``deal_in_order`` (contiguous blocks in client
order, for uploads folded on the ranks) and ``cores.py`` ``core_shares`` (CPU cores to
``--jobs`` children, wrapping around when there are fewer cores than jobs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Deal"]

T = TypeVar("T")


@dataclass(frozen=True)
class Deal:
    """Rank ``rank`` of ``world``: its share of n items by either rule, and every rank's parts back in item order.

    Args:
        rank: this rank, ``0 <= rank < world``.
        world: how many ranks share the items (1: this one takes all).

    Example:
        >>> Deal(1, 3).blocks(7), Deal(1, 3).strided(7)
        (range(2, 4), range(1, 7, 3))
        >>> Deal.unstride([[0, 3, 6], [1, 4], [2, 5]])
        [0, 1, 2, 3, 4, 5, 6]
    """

    rank: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1:
            raise ValueError(f"world must be an int >= 1, got {self.world!r}")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world - 1}], got {self.rank!r}")

    @classmethod
    def of(cls, fabric: Any) -> Deal:
        """The deal of a launched Fabric (or anything with ``global_rank`` and ``world_size``)."""
        return cls(fabric.global_rank, fabric.world_size)

    def blocks(self, n: int) -> range:
        """This rank's contiguous block of ``n`` items: ``[⌊n·r/W⌋, ⌊n·(r+1)/W⌋)`` (empty where n < W leaves none)."""
        _check_count(n)
        return range(n * self.rank // self.world, n * (self.rank + 1) // self.world)

    def strided(self, n: int) -> range:
        """This rank's items of ``n`` dealt in turn: ``r, r+W, r+2W, …`` (the items ``i`` with ``i mod W = r``)."""
        _check_count(n)
        return range(self.rank, n, self.world)

    @staticmethod
    def unblock(parts: Sequence[Sequence[T]]) -> list[T]:
        """Every rank's part of a :meth:`blocks` deal (``parts[r]``: rank r's results, in its items' order) as one
        list in item order: the parts joined in rank order.

        Raises:
            ValueError: a part's length is not its rank's block of the total.
        """
        _check_parts(parts, "blocks")
        return [x for part in parts for x in part]

    @staticmethod
    def unstride(parts: Sequence[Sequence[T]]) -> list[T]:
        """Every rank's part of a :meth:`strided` deal as one list in item order: item i is ``parts[i mod W][i div W]``.

        Raises:
            ValueError: a part's length is not its rank's turns of the total.
        """
        _check_parts(parts, "strided")
        world = len(parts)
        return [parts[i % world][i // world] for i in range(sum(map(len, parts)))]


def _check_count(n: int) -> None:
    if n < 0:
        raise ValueError(f"the number of items must be >= 0, got {n!r}")


def _check_parts(parts: Sequence[Sequence[Any]], rule: str) -> None:
    """Each ``parts[r]`` as long as rank r's share of all the parts' items by ``rule`` (a rank lost or added items)."""
    if not parts:
        raise ValueError("no parts to put back in order (one per rank, rank 0 first)")
    n, world = sum(map(len, parts)), len(parts)
    want = [len(getattr(Deal(r, world), rule)(n)) for r in range(world)]
    if [len(p) for p in parts] != want:
        raise ValueError(f"parts of {[len(p) for p in parts]} items are not a {rule} deal of {n} over {world} ranks ({want})")
