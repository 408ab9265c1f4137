"""The one interface of what happens to an update between a client and the server (in the spirit of
pfl-research's ``Postprocessor``): an :class:`UpdatePolicy` sees a client's upload on its way up, the round's
uploads on the server before the method aggregates them, and/or the method's aggregate after.

A policy is one implementation of one *kind* — ``attack``, ``privacy``, ``staleness``, ``aggregator``,
``server_optimizer`` — registered under a name like a method (:func:`register_policy`), built from the run's config
(``federation.<kind>``), asked once before the run whether it composes with the method and the other settings
(:meth:`UpdatePolicy.refusal`: one line, exit 2), and applied by the engine in the one order of
:mod:`fl_lightning.federation.policies.order`. A policy holds no state of its own between rounds: its state is a
mapping of tensors it reads and returns (:meth:`UpdatePolicy.on_aggregate`), which the run keeps in
``server.pt``'s ``policies/<kind>`` and a resumed run hands back, so a resume takes the same steps bit for bit.
Its byte accounting is the transport's: a client's bytes up are those of the tensors its upload holds after the
client-side policies (a compressing policy returns the compressed tensors, so they are counted as sent).

Example — a server-side policy defined outside the package is picked up by name::

    @register_policy("aggregator", "coordinate_clip")
    class CoordinateClip(RobustAggregator): ...
    # federation.aggregator.name: coordinate_clip
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from torch import Tensor

if TYPE_CHECKING:
    from fl_lightning.federation.transport import Upload

__all__ = ["KINDS", "PolicySetup", "RoundContext", "UpdatePolicy", "named", "register_policy", "registered"]

# every kind of policy, with the section of the config it is read from (federation.<kind>) and its "off" name
KINDS: dict[str, str] = {
    "attack": "none",
    "privacy": "off",
    "staleness": "off",
    "aggregator": "mean",
    "server_optimizer": "fedavg",
    # who takes part, read from federation.clients (federation/client_behaviour.py calls them, no update hook)
    "availability": "always",
    "dropout": "none",
}
_REGISTRY: dict[str, dict[str, type[UpdatePolicy]]] = {kind: {} for kind in KINDS}
P = TypeVar("P", bound="type[UpdatePolicy]")


@dataclass(frozen=True)
class PolicySetup:
    """What a policy may need to be built, known once the data is partitioned: the method's rounds and each
    client's number of training rows (client order)."""

    num_rounds: int
    client_sizes: list[int]


@dataclass
class RoundContext:
    """What a server-side policy reads of the round: its index, the state x_t it started from, and the fresh
    uploads by client (client order; the method's view of them may differ: privacy's clipping, late updates)."""

    round_idx: int
    previous: Mapping[str, Tensor]
    uploads: Mapping[int, Upload]
    arrived: Sequence[Any] = ()  # the late updates due in this round (federation/stale_updates.PendingUpdate)
    # the keys the method averages (Algorithm.averaged_keys): all a policy that reads or replaces a mean may touch;
    # None: every key of the state (a policy called outside a run)
    averaged: frozenset[str] | None = None

    def averages(self, key: str) -> bool:
        """Whether the method's aggregate is the weighted mean of the uploads at ``key``."""
        return self.averaged is None or key in self.averaged


class UpdatePolicy:
    """One thing that happens to an update between client and server; every hook is the identity by default.

    Subclasses get ``policy_kind`` (one of :data:`KINDS`) from :func:`register_policy` and override the hooks they use.
    """

    policy_kind: ClassVar[str] = ""  # one of KINDS, set by register_policy
    # True: it reads every client's upload whole on the server (privacy's clipping, a robust rule, late updates), so
    # the ranks may not fold the uploads into sums where they are made (federation/ranks/summed_uploads.py)
    reads_each_upload: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """The name this policy's class is registered under for its kind (the first, where it has several)."""
        return next(n for n, c in _REGISTRY[self.policy_kind].items() if c is type(self))

    @classmethod
    def build(cls, cfg: Any, setup: PolicySetup) -> UpdatePolicy:
        """The policy of run ``cfg`` (default: built with no arguments)."""
        return cls()

    @classmethod
    def refusal(cls, cfg: Any, algorithm: type) -> str | None:
        """Why this policy does not compose with ``algorithm`` and the rest of ``cfg`` (None: it does). The engine
        refuses the run with this line before anything starts."""
        return None

    def on_upload(self, upload: Upload, downloaded: Mapping[str, Tensor], round_idx: int, client: int) -> Upload:
        """A client's upload on its way up (after the method's client step, before the transport counts it)."""
        return upload

    def on_uploads(self, uploads: Mapping[int, Upload], ctx: RoundContext) -> Mapping[int, Upload]:
        """The round's uploads on the server, before the method aggregates them."""
        return uploads

    def on_aggregate(
        self, aggregate: dict[str, Tensor], ctx: RoundContext, state: Mapping[str, Tensor]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The method's aggregate after it aggregated (and this policy's ``state``): the new aggregate and state."""
        return aggregate, dict(state)

    def row(self, round_idx: int, clients: list[int]) -> dict[str, Any]:
        """This policy's columns of the round's metrics row."""
        return {}

    def summary(self, rounds_done: int) -> dict[str, Any]:
        """This policy's keys of summary.json."""
        return {}


def register_policy(kind: str, name: str) -> Callable[[P], P]:
    """Class decorator: make ``cls`` selectable as ``federation.<kind>.name: <name>`` (``kind`` for attacks).

    Example:
        >>> @register_policy("server_optimizer", "fedlion")
        ... class FedLion(ServerOptimizer): ...
    """
    if kind not in KINDS:
        raise ValueError(f"no policy kind {kind!r}: one of {', '.join(KINDS)}")
    if not name.isidentifier():
        raise ValueError(f"cannot register a policy named {name!r}: a policy name is an identifier")

    def deco(cls: P) -> P:
        previous = _REGISTRY[kind].get(name)
        if previous is not None and previous.__qualname__ != cls.__qualname__:
            raise ValueError(f"two {kind} policies named {name!r}: {previous.__qualname__} and {cls.__qualname__}")
        cls.policy_kind = kind
        _REGISTRY[kind][name] = cls
        return cls

    return deco


def named(kind: str, name: str, key: str) -> type[UpdatePolicy]:
    """The policy registered as ``name`` for ``kind``; else one line (:class:`UsageError`) naming the config ``key``,
    the registered names and the closest."""
    from fl_lightning.errors import UsageError, did_you_mean

    found = _REGISTRY[kind].get(name)
    if found is None:
        names = [KINDS[kind], *sorted(n for n in _REGISTRY[kind] if n != KINDS[kind])]
        raise UsageError(
            f"usage error: {key}={name!r}: one of {', '.join(repr(n) for n in names)}{did_you_mean(str(name), names)}"
        )
    return found


def registered(kind: str) -> dict[str, type[UpdatePolicy]]:
    """The policies registered so far for ``kind``, by name (``federation.policies.order`` imports the package's
    own first: use its :func:`~fl_lightning.federation.policies.order.policy_names`)."""
    return dict(_REGISTRY[kind])
