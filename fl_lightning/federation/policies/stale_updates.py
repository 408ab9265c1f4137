"""Late updates used in a later round (``federation.clients.late: stale``), FedAsync's polynomial staleness
(Xie, Koyejo & Gupta, "Asynchronous Federated Optimization", 2019: its polynomial s(t − τ) = (t − τ + 1)^−a).

A client whose simulated time t_k exceeds the round's deadline D (federation/client_behaviour.py) still trains on
round r's global state; its update reaches the server in round r + τ, the round whose deadline covers its time:

    τ = ceil(t_k / D) − 1                 (:func:`arrival_delay`; τ >= 1 for a late client)

and is folded into that round's weighted mean with its weight n_k scaled by

    w(τ) = (1 + τ)^−a                     (:func:`staleness_weight`, a = ``staleness_exponent``)

beside the round's fresh uploads, all in client order (:class:`ArrivedUploads`). Until it arrives the client is busy:
it is not sampled (``ClientBehaviour.sample(busy=...)``), so a client has at most one update in flight and a
round's fresh and arrived uploads never share a client. The updates in flight are part of the run's state
(``RunState.pending``, saved in ``server.pt`` with the round that made them), so a resumed run, killed anywhere,
aggregates them as the uninterrupted run does; every rank keeps their clients and rounds, the server their tensors.

Departures from FedAsync: the server stays synchronous (a round's mean, not a mixing step α·s(τ)); the staleness
weight multiplies the client's sample count in the mean, so a stale update's share is renormalised with the round's
others; an update due after the last round is never aggregated. The weight rides on the upload's
``meta["num_samples"]``, the weight every averaging method reads (as DP-FedAvg's weight 1 does): methods that
average unweighted are refused (:meth:`StaleUpdates.refusal`). As an update policy (federation/policies/order.py),
:class:`StaleUpdates` joins the updates due in a round to its fresh uploads before anything else on the server
reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fl_lightning.federation.policies.policy import RoundContext, UpdatePolicy, register_policy
from fl_lightning.federation.transport import Upload

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["ArrivedUploads", "PendingUpdate", "StaleUpdates", "arrival_delay", "carry_late_updates", "staleness_weight"]


def arrival_delay(time_s: float, deadline_s: float) -> int:
    """τ = ceil(t / D) − 1: how many rounds after its own an update of t simulated seconds arrives (0: on time, t <= D;
    at least 1 for t > D, whatever the rounding of t / D)."""
    return 0 if time_s <= deadline_s else max(1, math.ceil(time_s / deadline_s) - 1)


def staleness_weight(tau: int, exponent: float) -> float:
    """FedAsync's polynomial staleness w(τ) = (1 + τ)^−a (a = ``exponent``; w(0) = 1)."""
    return float((1.0 + tau) ** -exponent)


@dataclass
class PendingUpdate:
    """A late client's update in flight: made in round ``origin``, aggregated in round ``arrival``. ``upload`` is
    held on the server only (None on the other ranks, which need the client and the rounds)."""

    client: int
    origin: int
    arrival: int
    upload: Upload | None = None

    def state_dict(self) -> dict[str, Any]:
        upload = None if self.upload is None else self.upload.state_dict()
        return {"client": self.client, "origin": self.origin, "arrival": self.arrival, "upload": upload}

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> PendingUpdate:
        upload = None if d.get("upload") is None else Upload.from_state_dict(d["upload"])
        return cls(int(d["client"]), int(d["origin"]), int(d["arrival"]), upload)


class ArrivedUploads(Mapping[int, Upload]):
    """A round's fresh ``uploads`` and the updates ``arrived`` in it, ``client → Upload`` in client order: an arrived
    one with ``meta["num_samples"]`` = w(τ) · n_k (τ = its arrival − origin). A client is in one of the two only."""

    def __init__(self, uploads: Mapping[int, Upload], arrived: list[PendingUpdate], exponent: float) -> None:
        self._uploads, self._exponent = uploads, exponent
        self._arrived = {p.client: p for p in arrived}
        both = set(self._arrived).intersection(uploads)
        if both:
            raise RuntimeError(f"client {min(both)} has a fresh upload and one in flight (a busy client was sampled)")
        self._clients = sorted([*uploads, *self._arrived])

    def __getitem__(self, client: int) -> Upload:
        pending = self._arrived.get(client)
        if pending is None:
            return self._uploads[client]
        if pending.upload is None:
            raise RuntimeError(f"client {client}'s update from round {pending.origin} is not held on this rank")
        w = staleness_weight(pending.arrival - pending.origin, self._exponent)
        meta = {**pending.upload.meta, "num_samples": float(pending.upload.meta["num_samples"]) * w}
        return Upload(pending.upload.tensors, meta)

    def __iter__(self) -> Iterator[int]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)


@register_policy("staleness", "stale")
@dataclass(frozen=True)
class StaleUpdates(UpdatePolicy):
    """``federation.clients.late: stale``: the updates due in a round (``ctx.arrived``) join its fresh uploads at
    weight w(τ)·n_k (:class:`ArrivedUploads`)."""

    reads_each_upload = True

    exponent: float = 0.5

    @classmethod
    def build(cls, cfg: RunConfig, setup: Any) -> StaleUpdates:
        return cls(cfg.federation.clients.staleness_exponent)

    @classmethod
    def refusal(cls, cfg: RunConfig, algorithm: type) -> str | None:
        """A method that averages unweighted (its ``weighted`` false): the staleness weight rides on n_k."""
        if getattr(cfg.method, "weighted", True) is False:
            return (
                f"federation.clients.late=stale weighs a late update by its sample count; "
                f"{cfg.algorithm}.weighted is false (an unweighted mean): set it true or use late: drop"
            )
        return None

    def on_uploads(self, uploads: Mapping[int, Upload], ctx: RoundContext) -> Mapping[int, Upload]:
        return ArrivedUploads(uploads, list(ctx.arrived), self.exponent) if ctx.arrived else uploads


def carry_late_updates(
    pending: list[PendingUpdate],
    round_idx: int,
    delays: Mapping[int, int | None],
    upload_of: Callable[[int], Upload | None],
) -> tuple[list[PendingUpdate], int]:
    """The updates in flight after round ``round_idx`` and how many arrived in it: those that arrived gone, the
    round's late clients (``delays``: client → τ) added with their arrival round r + τ and their upload
    (``upload_of(client)``: the server's copy, read from the round's records; None on the other ranks)."""
    arrived = sum(p.arrival == round_idx for p in pending)
    kept = [p for p in pending if p.arrival > round_idx]
    for client, tau in delays.items():
        if tau is None:
            raise RuntimeError(f"client {client} was late in round {round_idx} but has no delay")
        kept.append(PendingUpdate(client, round_idx, round_idx + tau, upload_of(client)))
    return kept, arrived
