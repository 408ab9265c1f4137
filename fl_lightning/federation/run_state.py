"""What the server carries from round to round, checkpointed as ``checkpoints/server.pt`` (server_checkpoint.py).

:class:`RunState` is the whole resumable state of a run between rounds: the global model state,
the metrics rows so far, the history the planner reads, the traffic and time totals and the failed
clients. ``state_dict()`` holds only tensors, numbers, strings, lists and dicts, so the checkpoint
loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from fl_lightning.federation.algorithm import RoundHistory
from fl_lightning.federation.policies.policy import KINDS
from fl_lightning.federation.policies.stale_updates import PendingUpdate

__all__ = ["RunState", "unchanged"]


def unchanged(seen: tuple[Tensor, int] | None, value: Any) -> bool:
    """Whether ``value`` is the tensor object ``seen`` recorded as ``(tensor, tensor._version)``, not edited in place
    since (every in-place op bumps ``Tensor._version``): the state broadcast and the checkpoint skip such a tensor."""
    return isinstance(value, Tensor) and seen is not None and seen[0] is value and seen[1] == value._version


@dataclass
class RunState:
    """The server's record of a run after ``completed_rounds`` rounds."""

    state: dict[str, Tensor]  # the global model state (the Algorithm's State)
    completed_rounds: int = 0
    history: RoundHistory = field(default_factory=RoundHistory)  # per-client compute times, round times, metric rows
    bytes_up: int = 0
    bytes_down: int = 0
    wall_time_s: float = 0.0
    failed_clients: dict[str, str] = field(default_factory=dict)  # "client" → "round t: why"
    per_class_accuracy: list[float] | None = None  # of the last evaluated round
    # the update policies' states by kind (federation/policies/order.py), e.g. "server_optimizer": its moments
    # ("m/<key>", "v/<key>"; none for fedavg); each saved in server.pt under its kind, only when it has one
    policies: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    # late updates in flight (federation.clients.late: stale), their uploads on the server: federation/policies/stale_updates.py
    pending: list[PendingUpdate] = field(default_factory=list)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.history.metrics

    def state_dict(self, *, tensors: dict[str, Tensor] | None = None) -> dict[str, Any]:
        """Everything, with ``tensors`` (default: the whole state, on the CPU) as its ``state``."""
        state = {k: v.detach().cpu() for k, v in self.state.items()} if tensors is None else tensors
        return {
            "round": self.completed_rounds - 1,
            "state": state,
            "rows": self.history.metrics,
            "client_compute_s": self.history.client_compute_s,
            "round_s": self.history.round_s,
            "totals": {"bytes_up": self.bytes_up, "bytes_down": self.bytes_down, "wall_time_s": self.wall_time_s},
            "failed_clients": self.failed_clients,
            "per_class_accuracy": self.per_class_accuracy,
            **{kind: {k: v.detach().cpu() for k, v in held.items()} for kind, held in self.policies.items() if held},
            **({"pending": [p.state_dict() for p in self.pending]} if self.pending else {}),
        }

    @classmethod
    def from_state_dict(cls, saved: dict[str, Any]) -> RunState:
        totals = saved["totals"]
        return cls(
            state=dict(saved["state"]),
            completed_rounds=int(saved["round"]) + 1,
            history=RoundHistory(dict(saved["client_compute_s"]), list(saved["round_s"]), list(saved["rows"])),
            bytes_up=int(totals["bytes_up"]),
            bytes_down=int(totals["bytes_down"]),
            wall_time_s=float(totals["wall_time_s"]),
            failed_clients=dict(saved["failed_clients"]),
            per_class_accuracy=saved["per_class_accuracy"],
            policies={kind: dict(saved[kind]) for kind in KINDS if saved.get(kind)},
            pending=[PendingUpdate.from_state_dict(p) for p in saved.get("pending") or []],
        )
