"""Rank 0's state on every rank after each aggregate: only what changed since its last broadcast, the large tensors
over the backend.

Rank 0 records each tensor it broadcast and its in-place version (:class:`SentState`); a key whose tensor is the
same object at the same version is unchanged and the other ranks keep their copy (FeDiSyn's frozen 1.2 GB ViT-L
backbone travels once). Of what changed, the small tensors and the keys travel in the phase's outcome (pickled over
the gloo object group, collectives.from_server); each tensor of at least :data:`LARGE_BYTES` follows it over the
default group, one ``dist.broadcast`` a key from the rank's device (NCCL on GPUs: GPT-FL's whole new model every
fine-tuning round, round 0's pre-trained ViT) instead of through pickled bytes on the CPU (:func:`send_large` on rank
0, :func:`received_large` on the others). The values are copies: every rank holds rank 0's state bit for bit, on the
CPU as rank 0 holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from fl_lightning.federation.ranks.collectives import waiting
from fl_lightning.federation.run_state import unchanged

if TYPE_CHECKING:
    from lightning.fabric import Fabric

__all__ = ["LARGE_BYTES", "SentState", "StateChanges", "received_large", "send_large"]

LARGE_BYTES = 1 << 20  # from this size a changed tensor is broadcast over the backend, not pickled


@dataclass(frozen=True)
class _Large:
    """A large tensor's place in the outcome: what the others allocate to receive it."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class StateChanges:
    """A state as rank 0 broadcasts it: its keys in order, the changed tensors that travel in the outcome, and the
    changed large ones that follow it over the backend (:class:`_Large` in their place).

    Args:
        keys: every key of the state, in its order.
        tensors: the entries sent (new keys, new objects, tensors edited in place); a large one as its ``_Large``.
    """

    def __init__(self, keys: list[str], tensors: dict[str, Any]) -> None:
        self.keys, self.tensors = keys, tensors

    @property
    def large(self) -> list[str]:
        """The keys whose tensors follow over the backend, in state order."""
        return [k for k, v in self.tensors.items() if isinstance(v, _Large)]

    def to(self, device: Any) -> StateChanges:  # collectives.to_cpu moves what crosses the wire
        return StateChanges(self.keys, {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.tensors.items()})

    def apply(self, previous: dict, large: dict[str, torch.Tensor] | None = None) -> dict:
        """The state on a rank holding ``previous`` (rank 0's last broadcast state) and the ``large`` tensors received."""
        sent = {**self.tensors, **(large or {})}
        return {k: sent[k] if k in sent else previous[k] for k in self.keys}


class SentState:
    """Rank 0's record of the state it last broadcast: each tensor object and its in-place version
    (``Tensor._version``, which every in-place op bumps); the first broadcast of a process sends everything.

    Args:
        large_bytes: the size from which a changed tensor follows over the backend (None: every tensor pickled).
    """

    def __init__(self, large_bytes: int | None = LARGE_BYTES) -> None:
        self._sent: dict[str, tuple[Any, int]] = {}
        self.large_bytes = large_bytes

    def changes(self, state: dict) -> StateChanges:
        tensors = {k: v for k, v in state.items() if not unchanged(self._sent.get(k), v)}
        self._sent = {k: (v, v._version) for k, v in state.items() if isinstance(v, torch.Tensor)}
        if self.large_bytes is not None:
            tensors = {k: _Large(tuple(v.shape), v.dtype) if self._is_large(v) else v for k, v in tensors.items()}
        return StateChanges(list(state), tensors)

    def _is_large(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.numel() * value.element_size() >= self.large_bytes


def send_large(fabric: Fabric, changes: StateChanges, state: dict, *, what: str, timeout_s: float) -> None:
    """Rank 0: broadcast ``state``'s large changed tensors over the default group, key by key, from its device."""
    with waiting(what, timeout_s, fabric.global_rank, key="federation.compute_timeout_s"):
        for key in changes.large:
            dist.broadcast(state[key].detach().to(fabric.device).contiguous(), src=0)


def received_large(fabric: Fabric, changes: StateChanges, *, what: str, timeout_s: float) -> dict[str, torch.Tensor]:
    """Another rank: the large changed tensors rank 0 broadcasts (:func:`send_large`), each received on the device
    and kept on the CPU, as rank 0 holds them."""
    received = {}
    with waiting(what, timeout_s, fabric.global_rank, key="federation.compute_timeout_s"):
        for key in changes.large:
            spec = changes.tensors[key]
            buffer = torch.empty(spec.shape, dtype=spec.dtype, device=fabric.device)
            dist.broadcast(buffer, src=0)
            received[key] = buffer.cpu()
    return received
