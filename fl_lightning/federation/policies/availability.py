"""Who is online in each round (``federation.clients``; FLGo's ``availability``): one registered implementation per
model, picked by ``federation.clients.availability_model`` (null: ``bernoulli`` when ``availability`` < 1,
``trace`` with an ``availability_trace``, else ``always``). The server samples the round's clients from those online
(:meth:`~fl_lightning.federation.client_behaviour.ClientBehaviour.sample`).

* ``always``     every client, every round (the default: nothing drawn, runs bit-identical to a run without it);
* ``bernoulli``  client k online in round t with probability a, independently: a uniform draw from
                 (``federation.clients.seed``, t, k) below a — the same on every rank and after a resume;
* ``trace``      row t mod rows of the 0/1 table of ``availability_trace`` (:mod:`~fl_lightning.federation.availability_trace`).

Example — a model defined outside the package::

    @register_policy("availability", "diurnal")
    @dataclass(frozen=True)
    class Diurnal(Availability):
        @classmethod
        def of_clients(cls, config, num_clients): return cls()
        def online(self, num_clients, round_idx): return [c for c in range(num_clients) if (c + round_idx) % 2]
    # federation.clients.availability_model: diurnal
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fl_lightning.federation.availability_trace import read_availability_trace
from fl_lightning.federation.policies.policy import UpdatePolicy, register_policy
from fl_lightning.federation.ranks.placement import seeded_uniform

if TYPE_CHECKING:
    from fl_lightning.config import ClientBehaviourConfig

__all__ = ["Availability", "BernoulliAvailability", "TraceAvailability", "availability_name"]

_AVAILABLE_TAG = 0xA7A1  # separates this draw from every other (seed, round, client) draw


def availability_name(config: ClientBehaviourConfig) -> str:
    """The availability model ``config`` asks for (``availability_model``, else read off its other keys)."""
    if config.availability_model is not None:
        return config.availability_model
    if config.availability_trace is not None:
        return "trace"
    return "bernoulli" if config.availability < 1.0 else "always"


class Availability(UpdatePolicy):
    """Every client online in every round; subclasses say who is online otherwise (:meth:`online`)."""

    @classmethod
    def of_clients(cls, config: ClientBehaviourConfig, num_clients: int) -> Availability:
        """The model of ``federation.clients`` = ``config`` over K = ``num_clients`` clients."""
        return cls()

    def online(self, num_clients: int, round_idx: int) -> list[int]:
        """The clients online in round ``round_idx`` (sorted)."""
        return list(range(num_clients))

    def row(self, round_idx: int, clients: list[int]) -> dict[str, Any]:
        return {}


register_policy("availability", "always")(Availability)


@register_policy("availability", "bernoulli")
@dataclass(frozen=True)
class BernoulliAvailability(Availability):
    """Each client online with probability ``probability`` in each round, independently (module docstring)."""

    probability: float
    seed: int

    @classmethod
    def of_clients(cls, config: ClientBehaviourConfig, num_clients: int) -> BernoulliAvailability:
        return cls(float(config.availability), int(config.seed))

    def online(self, num_clients: int, round_idx: int) -> list[int]:
        return [c for c in range(num_clients) if seeded_uniform(self.seed, round_idx, c, _AVAILABLE_TAG) < self.probability]


@register_policy("availability", "trace")
@dataclass(frozen=True)
class TraceAvailability(Availability):
    """Who is online as a trace says: row ``round_idx`` mod its rows of a (rows, K) bool table."""

    trace: np.ndarray = field(compare=False, repr=False)

    @classmethod
    def of_clients(cls, config: ClientBehaviourConfig, num_clients: int) -> TraceAvailability:
        return cls(read_availability_trace(config.availability_trace, int(num_clients or 0)))

    def online(self, num_clients: int, round_idx: int) -> list[int]:
        return [int(c) for c in np.flatnonzero(self.trace[round_idx % len(self.trace)])]

    def row(self, round_idx: int, clients: list[int]) -> dict[str, Any]:
        """metrics.csv: how many clients the trace had online."""
        return {"online": int(self.trace[round_idx % len(self.trace)].sum())}
