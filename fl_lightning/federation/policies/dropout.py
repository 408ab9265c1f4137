"""Which sampled clients drop out after their download (``federation.clients``; FLGo's ``dropout``): one registered
implementation per model, picked by ``federation.clients.dropout_model`` (null: ``bernoulli`` when ``dropout`` > 0,
else ``none``). A dropped client's download is counted and its upload never arrives: a failure the engine sees
(``dropped`` in metrics.csv), never an error (federation/client_phase.py).

* ``none``       nobody drops out (the default: nothing drawn);
* ``bernoulli``  client k drops out of round t with probability d: a uniform draw from (``federation.clients.seed``,
                 t, k) below d — the same on every rank and after a resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fl_lightning.federation.policies.policy import UpdatePolicy, register_policy
from fl_lightning.federation.ranks.placement import seeded_uniform

if TYPE_CHECKING:
    from fl_lightning.config import ClientBehaviourConfig

__all__ = ["Dropout", "BernoulliDropout", "dropout_name"]

_DROPOUT_TAG = 0xD209  # separates this draw from every other (seed, round, client) draw


def dropout_name(config: ClientBehaviourConfig) -> str:
    """The dropout model ``config`` asks for (``dropout_model``, else read off ``dropout``)."""
    if config.dropout_model is not None:
        return config.dropout_model
    return "bernoulli" if config.dropout > 0.0 else "none"


class Dropout(UpdatePolicy):
    """Nobody drops out; subclasses say who does (:meth:`drops`)."""

    @classmethod
    def of_clients(cls, config: ClientBehaviourConfig, num_clients: int) -> Dropout:
        """The model of ``federation.clients`` = ``config`` over K = ``num_clients`` clients."""
        return cls()

    def drops(self, round_idx: int, client: int) -> bool:
        """Whether ``client`` drops out of round ``round_idx`` after its download."""
        return False


register_policy("dropout", "none")(Dropout)


@register_policy("dropout", "bernoulli")
@dataclass(frozen=True)
class BernoulliDropout(Dropout):
    """Each sampled client drops out with probability ``probability`` (module docstring)."""

    probability: float
    seed: int

    @classmethod
    def of_clients(cls, config: ClientBehaviourConfig, num_clients: int) -> BernoulliDropout:
        return cls(float(config.dropout), int(config.seed))

    def drops(self, round_idx: int, client: int) -> bool:
        return seeded_uniform(self.seed, round_idx, client, _DROPOUT_TAG) < self.probability
