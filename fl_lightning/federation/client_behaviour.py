"""Clients that are not always there (``federation.clients``), for any method: per-round availability and dropout
mid-round, the two system behaviours FLGo simulates for every algorithm (its ``availability`` and ``dropout``).

* **availability** a: in each round each client is online with probability a, independently (a Bernoulli draw
  from (seed, round, client); each model is one registered class, federation/policies/availability.py) — or as a
  trace file says (``availability_trace``,
  :mod:`~fl_lightning.federation.availability_trace`: one 0/1 row per round, one column per client); the server
  samples its ``client_fraction`` of the K clients from those online (``max(1, round(fraction·K))`` of them, or
  all of them when fewer are online). A round with none online has no
  clients and stops the run as any round with fewer than ``federation.min_clients`` successes does; with
  ``min_clients: 0`` (averaging methods) a round that no update reached keeps the global state and the run goes on.
* **dropout** d: each sampled client drops out after receiving the global state with probability d (a draw from
  (seed, round, client); federation/policies/dropout.py): its download is counted, its upload never arrives. It is
  a failure the engine sees —
  ``failed`` and ``dropped`` in metrics.csv, its reason in the run's ``failed_clients`` — that counts against
  ``federation.min_clients`` but never stops the run under ``on_client_error: raise`` (a dropout is not an error).

* **stragglers** s (FedProx's systems heterogeneity, Li et al., MLSys 2020, Sec. 5.2): each sampled client that is
  not dropped is a straggler with probability s; a straggler runs E_k of its E local epochs, E_k uniform on
  {1, …, E} (``train.epochs``: every ``fit_local`` of its update runs that share of its passes). With
  ``drop_stragglers`` it misses the round's deadline instead, and is dropped as FedAvg treats stragglers in that
  paper (its download counted, no upload, no error); without it its partial work is aggregated, as FedProx does.
  ``stragglers`` in metrics.csv counts the round's stragglers, dropped or not.
* **speeds and a deadline** (the system heterogeneity of FedScale, Lai et al., ICML 2022, and FLGo, Wang et al.
  2023: devices of unequal speed against a round's deadline): client k has a speed s_k = exp(σ z_k), z_k ~ N(0, 1)
  drawn once from the seed (σ = ``speed_spread``; the same in every round; σ = 0: all 1), and its round takes

      t_k = ceil(n_k / B) · E_k · step_s / s_k      (:func:`round_times`)

  simulated seconds: n_k its samples, B = ``train.batch_size`` (else ``data.batch_size``), E_k its passes
  (``train.epochs``, or a partial straggler's share as ``fit_local`` runs it), ``step_s`` the seconds of one step
  at speed 1. With ``deadline_s`` D, a client with t_k > D is late (:func:`late_mask`) and dropped as a dropped
  straggler is: its download counted, no upload, a failure that is no error (reason :data:`LATE`); ``late`` in
  metrics.csv counts the round's late clients. With ``late: stale`` a late client trains instead, and its update
  is aggregated τ = ceil(t_k / D) − 1 rounds later at FedAsync's staleness weight (federation/policies/stale_updates.py;
  reason :data:`LATE_STALE`, ``arrived`` in metrics.csv); until then it is busy, never sampled. Departures: t_k is
  the configured local work, not what a method's loop runs (a method's own batch size, a last partial batch
  dropped, work that is no training loop are not timed), and there is no network time.

Every draw depends only on (``federation.clients.seed``, round, client), so ranks agree without a message, a
resumed run drops the same clients, and a = 1, d = 0, s = 0, no deadline (the defaults) draw nothing: runs stay bit-identical.
Refused where the numbers would no longer hold (``check_client_behaviour``): clients that miss a round (a < 1,
d > 0, dropped stragglers, a deadline) with ``federation.privacy`` (the accountant's sampling rate assumes every sampled client
is there) and with a robust aggregator (its f-of-n bound assumes n uploads a round). Partial stragglers compose
with both: every sampled client uploads, and DP-SGD's accountant, counting E epochs, overstates ε, never
understates it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from fl_lightning.errors import UsageError
from fl_lightning.federation.local_training import epochs_run
from fl_lightning.federation.policies.availability import Availability, TraceAvailability, availability_name
from fl_lightning.federation.policies.dropout import Dropout, dropout_name
from fl_lightning.federation.policies.policy import named
from fl_lightning.federation.policies.stale_updates import arrival_delay
from fl_lightning.federation.ranks.placement import clients_per_round, derive_seed, seeded_uniform

if TYPE_CHECKING:
    from fl_lightning.config import ClientBehaviourConfig, RunConfig

__all__ = [
    "DROPPED",
    "STRAGGLED",
    "LATE",
    "LATE_STALE",
    "NO_ERROR",
    "ClientBehaviour",
    "check_client_behaviour",
    "client_speeds",
    "late_mask",
    "round_times",
]

DROPPED = "dropped out (federation.clients.dropout)"  # a dropped client's failure reason
STRAGGLED = "missed the round's deadline (federation.clients.drop_stragglers)"  # a dropped straggler's
LATE = "missed the round's deadline (federation.clients.deadline_s)"  # a client slower than the deadline
LATE_STALE = "missed the round's deadline; its update is aggregated later (federation.clients.late: stale)"
NO_ERROR = (DROPPED, STRAGGLED, LATE, LATE_STALE)  # failures that are behaviour, never an error under on_client_error: raise
# separate the draws from each other and from every other (seed, round, client) seed (availability's and dropout's:
# federation/policies/availability.py, dropout.py)
_STRAGGLER_TAG, _EPOCHS_TAG, _SPEED_TAG = 0x5724, 0xE90C, 0x5BEE


def client_speeds(seed: int, num_clients: int, spread: float) -> np.ndarray:
    """(K,) float64 speeds s_k = exp(σ z_k), z_k ~ N(0, 1) (σ = ``spread``): a log-normal spread of device speeds,
    fixed for the run; σ = 0: all exactly 1. z_k is the k-th draw of one stream from ``seed``, so client k's speed
    does not depend on K."""
    if spread <= 0:
        return np.ones(num_clients)
    z = np.random.default_rng(derive_seed(seed, _SPEED_TAG)).standard_normal(num_clients)  # (K,)
    return np.exp(spread * z)


def round_times(
    batches: np.ndarray | Sequence[int], epochs: np.ndarray | Sequence[int], speeds: np.ndarray | Sequence[float], step_s: float
) -> np.ndarray:
    """Simulated seconds of the clients' rounds, t_k = batches_k · E_k · step_s / s_k (float64).

    Args:
        batches: (K,) local steps per pass, ceil(n_k / B).
        epochs: (K,) passes E_k each runs this round.
        speeds: (K,) speeds s_k (:func:`client_speeds`).
        step_s: seconds of one step at speed 1.
    """
    b, e, s = (np.asarray(x, dtype=np.float64) for x in (batches, epochs, speeds))
    return b * e * float(step_s) / s


def late_mask(times: np.ndarray, deadline_s: float | None) -> np.ndarray:
    """(K,) bool: the clients whose simulated time exceeds the round's deadline (none without one)."""
    times = np.asarray(times, dtype=np.float64)
    return np.zeros(times.shape, dtype=bool) if deadline_s is None else times > deadline_s


@dataclass(frozen=True)
class ClientBehaviour:
    """The run's client behaviour: who is online (its availability model), who drops out (its dropout model),
    stragglers s, speeds and a deadline, and their seed. The clients' speeds and steps per pass come with
    :meth:`with_clients`, once the data is split."""

    availability: Availability
    dropout: Dropout
    seed: int
    stragglers: float = 0.0
    drop_stragglers: bool = False
    speed_spread: float = 0.0
    step_s: float = 1.0
    deadline_s: float | None = None
    late: str = "drop"  # a late client: "drop" (no upload) or "stale" (its update aggregated when it arrives)
    staleness_exponent: float = 0.5
    speeds: np.ndarray | None = field(default=None, compare=False, repr=False)  # (K,) s_k, from with_clients
    batches: np.ndarray | None = field(default=None, compare=False, repr=False)  # (K,) ceil(n_k / B), from with_clients

    @classmethod
    def of(cls, config: ClientBehaviourConfig, num_clients: int | None = None) -> ClientBehaviour | None:
        """``federation.clients`` over K = ``num_clients`` clients (None when every client is always there and on
        time: a = 1, no trace, d = 0, s = 0, no deadline). Reads the availability trace, if any (one line when it is
        bad)."""
        deadline, availability, dropout = config.deadline_s, availability_name(config), dropout_name(config)
        if availability == "always" and dropout == "none" and config.stragglers <= 0.0 and deadline is None:
            return None
        key = "federation.clients.{}_model"
        return cls(
            named("availability", availability, key.format("availability")).of_clients(config, int(num_clients or 0)),
            named("dropout", dropout, key.format("dropout")).of_clients(config, int(num_clients or 0)),
            int(config.seed),
            float(config.stragglers),
            bool(config.drop_stragglers),
            float(config.speed_spread),
            float(config.step_s),
            None if deadline is None else float(deadline),
            str(config.late),
            float(config.staleness_exponent),
        )

    def with_clients(self, sizes: Sequence[int], batch_size: int) -> ClientBehaviour:
        """This behaviour for clients of ``sizes`` samples n_k and batches of ``batch_size`` B: their speeds and
        steps per pass ceil(n_k / B), which the clients' simulated times need."""
        batches = np.array([-(-int(n) // int(batch_size)) for n in sizes], dtype=np.int64)
        return replace(self, speeds=client_speeds(self.seed, len(sizes), self.speed_spread), batches=batches)

    @property
    def trace(self) -> np.ndarray | None:
        """The (rows, K) bool table of who is online, where the availability is a trace's (else None)."""
        return self.availability.trace if isinstance(self.availability, TraceAvailability) else None

    def with_trace(self, trace: np.ndarray) -> ClientBehaviour:
        """This behaviour with the availability of ``trace`` (rank 0's table, which every rank samples from)."""
        return replace(self, availability=TraceAvailability(trace))

    def online(self, num_clients: int, round_idx: int) -> list[int]:
        """The clients online in ``round_idx``, as the availability model says."""
        return self.availability.online(num_clients, round_idx)

    def sample(self, num_clients: int, fraction: float, *, seed: int, round_idx: int, busy: Collection[int] = ()) -> list[int]:
        """``max(1, round(fraction·K))`` clients drawn from those online and not ``busy`` (a late update still in
        flight; all of them when fewer are), sorted; the draw from (``seed``, round) as
        :func:`~fl_lightning.federation.ranks.placement.sample_clients`'s."""
        online = [c for c in self.online(num_clients, round_idx) if c not in busy]
        m = clients_per_round(num_clients, fraction)
        if m >= len(online):
            return online
        rng = np.random.default_rng([seed, round_idx])
        return sorted(int(c) for c in rng.choice(online, size=m, replace=False))

    def drops(self, round_idx: int, client: int) -> bool:
        """Whether ``client`` drops out of ``round_idx`` after its download."""
        return self.dropout.drops(round_idx, client)

    def straggles(self, round_idx: int, client: int) -> bool:
        """Whether ``client`` is a straggler in ``round_idx``."""
        return self.stragglers > 0 and seeded_uniform(self.seed, round_idx, client, _STRAGGLER_TAG) < self.stragglers

    def local_work(self, round_idx: int, client: int, epochs: int) -> float | None:
        """A straggler's share E_k / E of its local work, E_k uniform on {1, …, E} (``epochs`` = E); None for a
        client that runs all of it."""
        if not self.straggles(round_idx, client):
            return None
        rng = np.random.default_rng(derive_seed(self.seed, round_idx, client, _EPOCHS_TAG))
        return int(rng.integers(1, max(epochs, 1) + 1)) / max(epochs, 1)

    def round_time(self, round_idx: int, client: int, epochs: int) -> float:
        """``client``'s simulated seconds in ``round_idx`` (:func:`round_times`; needs :meth:`with_clients`), running
        ``epochs`` passes or, a partial straggler, its share of them."""
        if self.speeds is None or self.batches is None:
            raise RuntimeError("ClientBehaviour.round_time before with_clients: the clients' sizes are not known")
        passes = epochs_run(epochs, self.local_work(round_idx, client, epochs))
        return float(round_times(self.batches[[client]], [passes], self.speeds[[client]], self.step_s)[0])

    def missed_deadline(self, round_idx: int, client: int, epochs: int) -> str | None:
        """Why ``client`` (not dropped out) uploads nothing in ``round_idx`` though it downloaded: a straggler
        dropped at the deadline (:data:`STRAGGLED`), or too slow for ``deadline_s`` (:data:`LATE`); None: it
        uploads."""
        if self.drop_stragglers and self.straggles(round_idx, client):
            return STRAGGLED
        if (
            self.late == "drop"
            and self.deadline_s is not None
            and late_mask(self.round_time(round_idx, client, epochs), self.deadline_s)
        ):
            return LATE
        return None

    def stale_delay(self, round_idx: int, client: int, epochs: int) -> int | None:
        """With ``late: stale``, how many rounds after ``round_idx`` a late ``client``'s update arrives (τ >= 1,
        :func:`~fl_lightning.federation.policies.stale_updates.arrival_delay`); None: on time, or late updates dropped."""
        if self.late != "stale" or self.deadline_s is None:
            return None
        tau = arrival_delay(self.round_time(round_idx, client, epochs), self.deadline_s)  # 0 exactly when not late
        return tau if tau > 0 else None

    def row(self, round_idx: int, clients: list[int], failures: dict[int, str]) -> dict[str, int]:
        """metrics.csv: how many of the round's clients dropped out, how many clients the trace had online (with
        a trace), when there are stragglers, how many straggled (dropped or not) and, with a deadline, how many
        were late (dropped, or their update carried to a later round: not in ``dropped``)."""
        out = {"dropped": sum(reason in NO_ERROR and reason != LATE_STALE for reason in failures.values())}
        out.update(self.availability.row(round_idx, clients))
        if self.stragglers > 0:
            out["stragglers"] = sum(failures.get(c) != DROPPED and self.straggles(round_idx, c) for c in clients)
        if self.deadline_s is not None:
            out["late"] = sum(failures.get(c) in (LATE, LATE_STALE) for c in clients)
        return out


def check_client_behaviour(cfg: RunConfig) -> None:
    """Refuse (one line, :class:`UsageError`) client behaviour where the run's numbers would no longer hold."""
    c, f = cfg.federation.clients, cfg.federation
    asked = [
        f"federation.clients.{k}={v}"
        for k, v, plain in (
            ("availability", c.availability, 1.0),
            ("availability_trace", c.availability_trace, None),
            ("availability_model", c.availability_model, None),
            ("dropout_model", c.dropout_model, None),
            ("dropout", c.dropout, 0.0),
            ("drop_stragglers", c.drop_stragglers, False),
            ("deadline_s", c.deadline_s, None),
        )
        if v != plain
    ]
    if not asked:
        return
    if f.privacy.mechanism != "off":
        raise UsageError(
            f"usage error: {asked[0]} with federation.privacy.mechanism={f.privacy.mechanism}: the "
            f"accountant's sampling rate assumes every sampled client takes part; use one or the other"
        )
    if f.aggregator.name != "mean":
        raise UsageError(
            f"usage error: {asked[0]} with federation.aggregator.name={f.aggregator.name}: its bound on "
            f"f malicious of n clients assumes n uploads a round; use aggregator mean"
        )
