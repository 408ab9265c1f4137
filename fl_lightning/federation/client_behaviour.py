"""Clients that are not always there (``federation.clients``), for any method: per-round availability and dropout
mid-round, the two system behaviours FLGo simulates for every algorithm (its ``availability`` and ``dropout``).

* **availability** a: in each round each client is online with probability a, independently (a Bernoulli draw
  from (seed, round, client)) — or as a trace file says (``availability_trace``,
  :mod:`~fl_lightning.federation.availability_trace`: one 0/1 row per round, one column per client); the server
  samples its ``client_fraction`` of the K clients from those online (``max(1, round(fraction·K))`` of them, or
  all of them when fewer are online). A round with none online has no
  clients and stops the run as any round with fewer than ``federation.min_clients`` successes does.
* **dropout** d: each sampled client drops out after receiving the global state with probability d (a draw from
  (seed, round, client)): its download is counted, its upload never arrives. It is a failure the engine sees —
  ``failed`` and ``dropped`` in metrics.csv, its reason in the run's ``failed_clients`` — that counts against
  ``federation.min_clients`` but never stops the run under ``on_client_error: raise`` (a dropout is not an error).

* **stragglers** s (FedProx's systems heterogeneity, Li et al., MLSys 2020, Sec. 5.2): each sampled client that is
  not dropped is a straggler with probability s; a straggler runs E_k of its E local epochs, E_k uniform on
  {1, …, E} (``train.epochs``: every ``fit_local`` of its update runs that share of its passes). With
  ``drop_stragglers`` it misses the round's deadline instead, and is dropped as FedAvg treats stragglers in that
  paper (its download counted, no upload, no error); without it its partial work is aggregated, as FedProx does.
  ``stragglers`` in metrics.csv counts the round's stragglers, dropped or not.

Every draw depends only on (``federation.clients.seed``, round, client), so ranks agree without a message, a
resumed run drops the same clients, and a = 1, d = 0, s = 0 (the defaults) draw nothing: runs stay bit-identical.
Refused where the numbers would no longer hold (``check_client_behaviour``): clients that miss a round (a < 1,
d > 0, dropped stragglers) with ``federation.privacy`` (the accountant's sampling rate assumes every sampled client
is there) and with a robust aggregator (its f-of-n bound assumes n uploads a round). Partial stragglers compose
with both: every sampled client uploads, and DP-SGD's accountant, counting E epochs, overstates ε, never
understates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fl_lightning.errors import UsageError
from fl_lightning.federation.availability_trace import read_availability_trace
from fl_lightning.federation.placement import clients_per_round, derive_seed

if TYPE_CHECKING:
    from fl_lightning.config import ClientBehaviourConfig, RunConfig

__all__ = ["DROPPED", "STRAGGLED", "NO_ERROR", "ClientBehaviour", "check_client_behaviour"]

DROPPED = "dropped out (federation.clients.dropout)"  # a dropped client's failure reason
STRAGGLED = "missed the round's deadline (federation.clients.drop_stragglers)"  # a dropped straggler's
NO_ERROR = (DROPPED, STRAGGLED)  # failures that are behaviour, never an error under on_client_error: raise
# separate the draws from each other and from every other (seed, round, client) seed
_AVAILABLE_TAG, _DROPOUT_TAG, _STRAGGLER_TAG, _EPOCHS_TAG = 0xA7A1, 0xD209, 0x5724, 0xE90C


def _uniform(seed: int, round_idx: int, client: int, tag: int) -> float:
    return float(np.random.default_rng(derive_seed(seed, round_idx, client, tag)).random())


@dataclass(frozen=True)
class ClientBehaviour:
    """The run's client behaviour: availability a (or a trace), dropout d, stragglers s and their seed."""

    availability: float
    dropout: float
    seed: int
    stragglers: float = 0.0
    drop_stragglers: bool = False
    trace: np.ndarray | None = field(default=None, compare=False, repr=False)  # (rows, K) bool: who is online

    @classmethod
    def of(cls, config: ClientBehaviourConfig, num_clients: int | None = None) -> ClientBehaviour | None:
        """``federation.clients`` over K = ``num_clients`` clients (None when every client is always there and on
        time: a = 1, no trace, d = 0, s = 0). Reads the availability trace, if any (one line when it is bad)."""
        path = config.availability_trace
        if config.availability >= 1.0 and path is None and config.dropout <= 0.0 and config.stragglers <= 0.0:
            return None
        trace = None if path is None else read_availability_trace(path, int(num_clients or 0))
        return cls(float(config.availability), float(config.dropout), int(config.seed), float(config.stragglers),
                   bool(config.drop_stragglers), trace)

    def online(self, num_clients: int, round_idx: int) -> list[int]:
        """The clients online in ``round_idx``: the trace's row ``round_idx`` mod its rows, else those drawn."""
        if self.trace is not None:
            return [int(c) for c in np.flatnonzero(self.trace[round_idx % len(self.trace)])]
        return [c for c in range(num_clients) if _uniform(self.seed, round_idx, c, _AVAILABLE_TAG) < self.availability]

    def sample(self, num_clients: int, fraction: float, *, seed: int, round_idx: int) -> list[int]:
        """``max(1, round(fraction·K))`` clients drawn from those online (all of them when fewer are), sorted; the
        draw from (``seed``, round) as :func:`~fl_lightning.federation.placement.sample_clients`'s."""
        online = self.online(num_clients, round_idx)
        m = clients_per_round(num_clients, fraction)
        if m >= len(online):
            return online
        rng = np.random.default_rng([seed, round_idx])
        return sorted(int(c) for c in rng.choice(online, size=m, replace=False))

    def drops(self, round_idx: int, client: int) -> bool:
        """Whether ``client`` drops out of ``round_idx`` after its download."""
        return self.dropout > 0 and _uniform(self.seed, round_idx, client, _DROPOUT_TAG) < self.dropout

    def straggles(self, round_idx: int, client: int) -> bool:
        """Whether ``client`` is a straggler in ``round_idx``."""
        return self.stragglers > 0 and _uniform(self.seed, round_idx, client, _STRAGGLER_TAG) < self.stragglers

    def local_work(self, round_idx: int, client: int, epochs: int) -> float | None:
        """A straggler's share E_k / E of its local work, E_k uniform on {1, …, E} (``epochs`` = E); None for a
        client that runs all of it."""
        if not self.straggles(round_idx, client):
            return None
        rng = np.random.default_rng(derive_seed(self.seed, round_idx, client, _EPOCHS_TAG))
        return int(rng.integers(1, max(epochs, 1) + 1)) / max(epochs, 1)

    def row(self, round_idx: int, clients: list[int], failures: dict[int, str]) -> dict[str, int]:
        """metrics.csv: how many of the round's clients dropped out, how many clients the trace had online (with
        a trace) and, when there are stragglers, how many straggled (dropped or not)."""
        out = {"dropped": sum(reason in NO_ERROR for reason in failures.values())}
        if self.trace is not None:
            out["online"] = int(self.trace[round_idx % len(self.trace)].sum())
        if self.stragglers > 0:
            out["stragglers"] = sum(failures.get(c) != DROPPED and self.straggles(round_idx, c) for c in clients)
        return out


def check_client_behaviour(cfg: RunConfig) -> None:
    """Refuse (one line, :class:`UsageError`) client behaviour where the run's numbers would no longer hold."""
    c, f = cfg.federation.clients, cfg.federation
    asked = [f"federation.clients.{k}={v}" for k, v, plain in (("availability", c.availability, 1.0),
                                                              ("availability_trace", c.availability_trace, None),
                                                              ("dropout", c.dropout, 0.0),
                                                              ("drop_stragglers", c.drop_stragglers, False))
             if v != plain]
    if not asked:
        return
    if f.privacy.mechanism != "off":
        raise UsageError(f"usage error: {asked[0]} with federation.privacy.mechanism={f.privacy.mechanism}: the "
                         f"accountant's sampling rate assumes every sampled client takes part; use one or the other")
    if f.aggregator.name != "mean":
        raise UsageError(f"usage error: {asked[0]} with federation.aggregator.name={f.aggregator.name}: its bound on "
                         f"f malicious of n clients assumes n uploads a round; use aggregator mean")
