"""Fabric's DDP strategy with two process groups: one for the compute, one for the server's objects.

A federated run waits in two kinds of collective. *Compute* collectives (DDP's gradient all-reduce in the joined
pre-training, the pre-training's failure flag, the split ensemble's gathers and broadcasts) run in lockstep: every
rank reaches them within seconds of the others, so a rank that has not arrived after minutes is stuck — a
mismatched collective, a deadlock — and waiting a day for it costs a day of N GPUs. *Object* collectives (rank 0's
outcome of a server phase, the gather of each rank's clients, the exchanges of outcomes) legitimately wait for
hours: the other ranks wait while rank 0 plans, synthesises or evaluates alone.

:class:`FederatedDDPStrategy` therefore keeps

* the default process group — the backend Fabric picks (NCCL on GPUs, gloo on the CPU) — for compute, under
  ``federation.compute_timeout_s`` (15 min by default; NCCL's watchdog ends a rank whose collective outlives it);
* a gloo group (``object_group``) over the same ranks for every object collective, under
  ``federation.collective_timeout_s`` (a day): pickled objects cross as CPU bytes (no GPU round trip, no copy to
  and from the device, no NCCL kernel spinning on a waiting GPU), and a long wait never meets the short timeout.

A rank that dies or freezes is noticed by neither timeout but by its peers' liveness watch
(``federation/ranks/liveness.py``) within ``federation.liveness_timeout_s``.

``fabric.broadcast`` runs on the object group; :func:`object_group` gives it to the collectives that call
``torch.distributed`` directly (``federation/ranks/collectives.py``). Across nodes gloo picks its network interface from
the host name; where that address is not reachable from the other nodes set ``GLOO_SOCKET_IFNAME`` (as
``NCCL_SOCKET_IFNAME`` for NCCL).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch.distributed as dist
from lightning.fabric.strategies import STRATEGY_REGISTRY, DDPStrategy, Strategy

from fl_lightning.errors import ConfigError

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["FederatedDDPStrategy", "cli_strategy_taken", "fabric_strategy", "object_group"]

T = TypeVar("T")


class FederatedDDPStrategy(DDPStrategy):
    """:class:`~lightning.fabric.strategies.DDPStrategy` whose default process group carries the compute under a short
    ``timeout`` and whose gloo ``object_group`` carries the object collectives under ``object_timeout``.

    Args:
        *args: as :class:`DDPStrategy` (a registered variant's ``init_params``: ``start_method``,
            ``find_unused_parameters`` …).
        object_timeout: the object group's timeout (``federation.collective_timeout_s``).
        **kwargs: as :class:`DDPStrategy`; its ``timeout`` is the default group's (``federation.compute_timeout_s``).
    """

    def __init__(self, *args: Any, object_timeout: timedelta, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.object_timeout = object_timeout
        self.object_group: dist.ProcessGroup | None = None

    def setup_environment(self) -> None:
        """The default process group (Fabric's set-up), then the gloo group over the same ranks: every rank creates
        it here, at the same point, as ``new_group`` requires."""
        super().setup_environment()
        if self.object_group is None and dist.is_initialized():
            self.object_group = dist.new_group(backend="gloo", timeout=self.object_timeout)

    def broadcast(self, obj: T, src: int = 0) -> T:
        """``fabric.broadcast``: ``obj`` from ``src`` on every rank, over the object group."""
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src, group=self.object_group)
        return box[0]

    def __getstate__(self) -> dict[str, Any]:
        """Picklable for ``ddp_spawn``'s children (a process group is not): they create their own."""
        return {**self.__dict__, "object_group": None}


def object_group(fabric: Any) -> dist.ProcessGroup | None:
    """The process group for ``fabric``'s object collectives: its strategy's gloo group, or None (the default group)
    for a strategy without one."""
    return getattr(getattr(fabric, "strategy", None), "object_group", None)


def fabric_strategy(cfg: RunConfig, environ: Mapping[str, str] = os.environ) -> str | Strategy:
    """Fabric's strategy: ``auto`` is DDP on more than one rank; under ``fabric run --strategy NAME`` it is NAME, as
    Fabric itself would take it (a different ``federation.strategy`` stops in one line). A DDP strategy (``ddp`` or
    one of its registered variants, ``ddp_spawn`` …) is built here as a
    :class:`FederatedDDPStrategy`: its compute group under
    ``federation.compute_timeout_s``, its object group under ``federation.collective_timeout_s`` (by name, Fabric
    would use torch's default timeout, 10 min for NCCL, for both). A strategy class registered by someone else (a
    subclass of DDPStrategy) is built with the long timeout for its one group. ``federation.process_group_backend``
    other than auto is the DDP strategy's ``process_group_backend`` (gloo: several ranks on one GPU)."""
    f = cfg.federation
    name = f.strategy if f.strategy != "auto" else "ddp" if f.devices * f.num_nodes > 1 else "auto"
    cli = environ.get("LT_STRATEGY") if environ.get("LT_CLI_USED") == "1" else None
    if cli:
        if f.strategy not in ("auto", cli):
            raise ConfigError("federation.strategy", f.strategy, f"'{cli}', the strategy `fabric run --strategy` names (or auto)")
        name = cli
    entry = STRATEGY_REGISTRY[name] if name in STRATEGY_REGISTRY else None  # its .get() would build one
    if entry is None or not issubclass(entry["strategy"], DDPStrategy):
        return name
    backend = {} if f.process_group_backend == "auto" else {"process_group_backend": f.process_group_backend}
    if entry["strategy"] is DDPStrategy:
        return FederatedDDPStrategy(
            **{**entry["init_params"], **backend},
            timeout=timedelta(seconds=f.compute_timeout_s),
            object_timeout=timedelta(seconds=f.collective_timeout_s),
        )
    return entry["strategy"](**{**entry["init_params"], **backend}, timeout=timedelta(seconds=f.collective_timeout_s))


@contextmanager
def cli_strategy_taken() -> Iterator[None]:
    """``LT_STRATEGY`` out of the environment while ``Fabric(...)`` is built: :func:`fabric_strategy` has taken the
    name ``fabric run --strategy`` set, and Fabric refuses any strategy object beside that variable ("conflicts
    with the value --strategy=ddp set through the CLI"), the one that carries the timeout included. Put back
    at once: nothing reads it later."""
    cli = os.environ.pop("LT_STRATEGY", None) if os.environ.get("LT_CLI_USED") == "1" else None
    try:
        yield
    finally:
        if cli is not None:
            os.environ["LT_STRATEGY"] = cli
