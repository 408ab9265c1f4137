"""The one order in which the engine applies a run's update policies, written down once.

On a client's way up (:meth:`PolicyChain.on_upload`), after the method's own client step:

1. ``attack``            an attacker's poisoned upload (federation/policies/attacks.py) — what its client computed, changed
                         before anything else sees it;
2. ``privacy``           local DP: the client's statistics noised before they leave it (federation/policies/privacy.py).

On the server, before the method aggregates (:meth:`PolicyChain.on_uploads`):

3. ``staleness``         late updates due this round join the fresh ones at weight (1 + τ)^−a · n_k
                         (federation/policies/stale_updates.py);
4. ``privacy``           DP-FedAvg's clipping of each update to S (weight 1), the checks that nothing uncovered
                         reaches the aggregate.

Then the method's own ``aggregate``, and after it (:meth:`PolicyChain.on_aggregate`):

5. ``privacy``           DP-FedAvg's noise on the mean (fixed denominator D), central DP's on the sum;
6. ``aggregator``        a robust rule over the clients' weights replaces the mean (federation/policies/robust_aggregation.py);
7. ``server_optimizer``  the server's step from x_t to x_{t+1} — post-processing of what was released
                         (federation/policies/server_optimizer.py).

Each kind is at most one policy, chosen by its config key (:data:`SELECTED`). What cannot be composed in this order is
refused before the run, in one line (:func:`check_policies`): a policy that reads or replaces a mean
(``needs_mean``) on a method whose aggregate is no weighted mean of its uploads (``Algorithm.averages_weights``),
a robust aggregator under a privacy mechanism (the noise is calibrated to the mean's sensitivity; 5 before 6 is
the only order in which privacy's release is what the rule reads, so the pair is refused rather than reordered), and
each policy's own :meth:`~fl_lightning.federation.policies.policy.UpdatePolicy.refusal`. docs/policies.md is this
page for users; tests/federation/test_policy_order.py checks the order against a recording of the hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from fl_lightning.federation.algorithm import ALGORITHMS, Algorithm, averages_weights

# the package's own policies register themselves on import
from fl_lightning.federation.policies import (  # noqa: F401
    attacks,
    availability,
    dropout,
    privacy,
    robust_aggregation,
    server_optimizer,
    stale_updates,
)
from fl_lightning.federation.policies.policy import KINDS, PolicySetup, RoundContext, UpdatePolicy, named, registered

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig
    from fl_lightning.federation.transport import Upload

__all__ = ["CLIENT_ORDER", "SERVER_ORDER", "SELECTED", "PolicyChain", "check_policies", "policy_names"]

CLIENT_ORDER = ("attack", "privacy")  # on_upload, in this order
UPLOADS_ORDER = ("staleness", "privacy")  # on_uploads, before the method's aggregate
SERVER_ORDER = ("privacy", "aggregator", "server_optimizer")  # on_aggregate, after it

# each kind's config key, as a user writes it, and how the run's choice is read from the config
SELECTED: dict[str, tuple[str, Callable[[Any], str]]] = {
    "attack": ("federation.attack.kind", lambda f: f.attack.kind),
    "privacy": ("federation.privacy.mechanism", lambda f: f.privacy.mechanism),
    "staleness": ("federation.clients.late", lambda f: "stale" if f.clients.late == "stale" else "off"),
    "aggregator": ("federation.aggregator.name", lambda f: f.aggregator.name),
    "server_optimizer": ("federation.server_optimizer.name", lambda f: f.server_optimizer.name),
}
# the kinds of who takes part, asked by federation/client_behaviour.py rather than applied in the order
PARTICIPATION_KEYS = {"availability": "federation.clients.availability_model", "dropout": "federation.clients.dropout_model"}
# Flower's strategy names (flwr.server.strategy, lower-cased) that are a policy here under another name
FLOWER_NAMES = {"fedmedian": "median", "fedtrimmedavg": "trimmed_mean", "multikrum": "multi_krum"}
# the kinds that read or replace a weighted mean of the clients' weights: only for methods that average
NEEDS_MEAN = frozenset({"attack", "staleness", "aggregator", "server_optimizer"})


def policy_names(kind: str) -> tuple[str, ...]:
    """The names registered for ``kind`` (the package's and any registered since), the "off" one first."""
    off = KINDS[kind]
    return (off, *sorted(n for n in registered(kind) if n != off))


def policy_setting_of(name: str) -> str | None:
    """``key=value`` that picks ``name`` where it names a registered policy that is not off, as written here or as
    Flower's strategy (``FedAdam``: ``federation.server_optimizer.name=fedadam``; ``FedMedian``:
    ``federation.aggregator.name=median``), else None."""
    wanted = FLOWER_NAMES.get(name.lower(), name.lower())
    keys = {**{kind: key for kind, (key, _) in SELECTED.items()}, **PARTICIPATION_KEYS}
    for kind, key in keys.items():
        if wanted != KINDS[kind] and wanted in registered(kind):
            return f"{key}={wanted}"
    return None


def chosen(cfg: RunConfig) -> dict[str, tuple[str, type[UpdatePolicy]]]:
    """The run's policy of each kind that is not off: ``kind → (its setting as key=value, its class)``; a name
    nobody registered is one line (:class:`UsageError`)."""
    out = {}
    for kind, (key, read) in SELECTED.items():
        name = read(cfg.federation)
        if name != KINDS[kind]:
            out[kind] = (f"{key}={name}", named(kind, name, key))
    return out


def check_policies(cfg: RunConfig, algorithm: type) -> None:
    """Refuse (one line, :class:`UsageError`, exit 2) a run whose policies cannot be composed in the order of the
    module docstring with ``algorithm`` and with each other."""
    from fl_lightning.errors import UsageError

    policies = chosen(cfg)
    asked = [setting for kind, (setting, _) in policies.items() if kind in NEEDS_MEAN]
    if cfg.federation.min_clients == 0:  # an empty round keeps the state: a mean's way to skip a round
        asked.append("federation.min_clients=0")
    if asked and not averages_weights(algorithm):
        raise UsageError(
            f"usage error: {asked[0]} needs a method whose state is the mean of its clients' weights "
            f"({', '.join(averaging_methods())}); {cfg.algorithm} does not declare averages_weights (docs/policies.md)"
        )
    if asked and algorithm.averaged_keys is Algorithm.averaged_keys:
        raise UsageError(
            f"usage error: {asked[0]} reads the keys a method averages; {cfg.algorithm} declares averages_weights "
            "but not averaged_keys(state) (docs/policies.md)"
        )
    for _, cls in policies.values():
        why = cls.refusal(cfg, algorithm)
        if why is not None:
            raise UsageError(f"usage error: {why}")


def averaging_methods() -> list[str]:
    """The registered methods that declare ``averages_weights`` (for the refusal's line: never a typed list)."""
    return sorted(name for name, cls in ALGORITHMS.items() if averages_weights(cls))


class PolicyChain:
    """The run's policies of every kind, applied in the module docstring's order; their states by kind
    (``RunState.policies``, saved in ``server.pt``) go in and out of :meth:`on_aggregate`."""

    def __init__(self, policies: Mapping[str, UpdatePolicy]) -> None:
        self.policies = {kind: policies[kind] for kind in KINDS if policies.get(kind) is not None}

    @classmethod
    def build(cls, cfg: RunConfig, setup: PolicySetup) -> PolicyChain:
        return cls({kind: policy.build(cfg, setup) for kind, (_, policy) in chosen(cfg).items()})

    @property
    def reads_each_upload(self) -> bool:
        """Whether a policy reads each upload whole on the server (no fold of the uploads on the ranks)."""
        return any(policy.reads_each_upload for policy in self.policies.values())

    def get(self, kind: str) -> Any:
        """The run's policy of ``kind`` (None: off)."""
        return self.policies.get(kind)

    def _in(self, order: tuple[str, ...]) -> list[UpdatePolicy]:
        return [self.policies[kind] for kind in order if kind in self.policies]

    def on_upload(self, upload: Upload, downloaded: Mapping[str, Tensor], round_idx: int, client: int) -> Upload:
        for policy in self._in(CLIENT_ORDER):
            upload = policy.on_upload(upload, downloaded, round_idx, client)
        return upload

    def on_uploads(self, uploads: Mapping[int, Upload], ctx: RoundContext) -> Mapping[int, Upload]:
        for policy in self._in(UPLOADS_ORDER):
            uploads = policy.on_uploads(uploads, ctx)
        return uploads

    def on_aggregate(
        self, aggregate: dict[str, Tensor], ctx: RoundContext, states: Mapping[str, Mapping[str, Tensor]]
    ) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:
        """The method's aggregate through the server-side policies; each policy's state in and out by kind (a
        policy whose state is empty keeps none)."""
        out = {kind: dict(v) for kind, v in states.items()}
        for kind in SERVER_ORDER:
            if kind in self.policies:
                aggregate, out[kind] = self.policies[kind].on_aggregate(aggregate, ctx, states.get(kind, {}))
        return aggregate, {kind: v for kind, v in out.items() if v}

    def row(self, round_idx: int, clients: list[int]) -> dict[str, Any]:
        return {k: v for policy in self.policies.values() for k, v in policy.row(round_idx, clients).items()}

    def summary(self, rounds_done: int) -> dict[str, Any]:
        return {k: v for policy in self.policies.values() for k, v in policy.summary(rounds_done).items()}
