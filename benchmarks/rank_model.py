"""A per-phase model: one rank's phase times → an estimate of the same run on N ranks.

Each phase of a run is dealt over the ranks by one rule of the code (docs/ranks.md, "Phases"), and ends where the
ranks meet (a collective), so a phase lasts as long as its busiest rank:

* ``rank0`` — stays on rank 0 (the plan, most aggregates, FedOPAL's solve): T on rank 0, the others wait.
* ``blocks`` / ``strided`` — n equal items (the test batches in blocks, ``Deal.blocks``; the generation batches
  strided, ``Deal.strided``): rank r gets c_r items, busy c_r/n · T; the phase lasts max_r c_r / n · T
  (= ⌈n/N⌉/n · T).
* ``clients`` — each round's clients on the ranks ``placement.assign_clients`` gives them (by data size, longest
  first): rank r is busy s · Σ_{c on r} t_c in each round (t_c the client's measured seconds, s = T / Σ t_c, so
  the rounds add up to the phase's measured T: the phase's own overhead shared in proportion), and a round lasts
  its busiest rank (the round's records are gathered).
* ``pilots`` — the λ pilots strided (pilot i on rank i mod N), each pilot its measured seconds (scaled to T as the
  clients are); one gather at the end.
* ``pilots_all`` — the λ pilots under ``pilot_ranks: all``: one after another, each over all N ranks. A pilot is a
  smaller run of the same phases, so each pilot is taken to speed up as the run's other phases do together:
  T · Σ_other T_N / Σ_other T_1 (an assumption, printed), rank r busy T · Σ_other busy_r / Σ_other T_1.
* ``data_parallel`` — round 0's pre-training: T/N of compute on every rank plus, per step, a ring all-reduce of the
  gradients, 2(N−1)/N · bytes / bandwidth (the bandwidth an assumption, printed).

The estimate's total is the sum of the phases' durations; a rank's waiting share is the time it is idle, because
another rank still works, over that total. N = 1 returns the input times. Phases that stay on rank 0 bound the
speed-up (Amdahl): total_N ≥ Σ T_rank0, so speedup ≤ T_1 / Σ T_rank0.

Not modelled: the collectives' own latency (besides the pre-training's all-reduce), any overlap of communication
with compute, a rank's start-up, memory limits and a phase whose cost changes with N (DENSE's split ensemble is
taken as ``rank0``: an upper bound on its time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fl_lightning.dealing import Deal
from fl_lightning.federation.ranks.placement import assign_clients

__all__ = ["RULES", "Phase", "PhaseEstimate", "Estimate", "estimate", "phases_from_json", "format_estimate"]

RULES: tuple[str, ...] = ("rank0", "blocks", "strided", "clients", "pilots", "pilots_all", "data_parallel")
NVLINK_BYTES_PER_S = 150e9  # the default all-reduce bandwidth (an assumption: an H100 NVLink ring, per direction)


@dataclass(frozen=True)
class Phase:
    """One phase's time on one rank and what the model deals it by.

    Attributes:
        name: the phase (``generation``).
        seconds: T, its wall seconds on one rank.
        rule: one of :data:`RULES`.
        items: ``blocks``/``strided``: the number n of equal items dealt.
        rounds: ``clients``: per round, each client's seconds (client index → s); ``pilots``: one round, pilot i's
            seconds at key i.
        client_sizes: ``clients``: every client's data size (what ``assign_clients`` places by); empty: the
            clients' summed seconds stand in for it.
        steps: ``data_parallel``: the optimiser steps (each all-reduces the gradients once).
        gradient_bytes: ``data_parallel``: the bytes of one step's gradients.
    """

    name: str
    seconds: float
    rule: str
    items: int = 1
    rounds: tuple[Mapping[int, float], ...] = ()
    client_sizes: tuple[int, ...] = ()
    steps: int = 0
    gradient_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"phase {self.name!r}: rule must be one of {RULES}, got {self.rule!r}")
        if self.seconds < 0 or self.items < 1:
            raise ValueError(f"phase {self.name!r}: need seconds >= 0 and items >= 1")


@dataclass(frozen=True)
class PhaseEstimate:
    """A phase on N ranks: how long it lasts (its busiest rank) and each rank's busy seconds in it."""

    name: str
    rule: str
    one_rank_s: float
    seconds: float
    busy: tuple[float, ...]
    communication_s: float = 0.0  # data_parallel: the all-reduces' share of ``seconds``


@dataclass(frozen=True)
class Estimate:
    """The run on ``ranks`` ranks: its phases, total, speed-up over one rank and each rank's waiting share."""

    ranks: int
    phases: tuple[PhaseEstimate, ...]
    bandwidth: float
    one_rank_s: float = field(init=False)
    total_s: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "one_rank_s", sum(p.one_rank_s for p in self.phases))
        object.__setattr__(self, "total_s", sum(p.seconds for p in self.phases))

    @property
    def speedup(self) -> float:
        return self.one_rank_s / self.total_s if self.total_s > 0 else 1.0

    @property
    def wait_share(self) -> tuple[float, ...]:
        """Each rank's idle time (its phases' durations less its busy seconds) over the total."""
        if self.total_s <= 0:
            return tuple(0.0 for _ in range(self.ranks))
        return tuple(sum(p.seconds - p.busy[r] for p in self.phases) / self.total_s for r in range(self.ranks))

    @property
    def serial_bound(self) -> float:
        """Amdahl's bound: one rank's total over the seconds of the phases that stay on rank 0."""
        serial = sum(p.one_rank_s for p in self.phases if p.rule == "rank0")
        return self.one_rank_s / serial if serial > 0 else float("inf")


def _counts(deal: str, n: int, world: int) -> list[int]:
    """How many of n items each rank gets under ``Deal.blocks`` or ``Deal.strided``."""
    return [len(getattr(Deal(r, world), deal)(n)) for r in range(world)]


def _scaled_rounds(phase: Phase, owner: Sequence[Mapping[int, int]], world: int) -> tuple[float, list[float]]:
    """``clients``/``pilots``: (the phase's duration, each rank's busy seconds) from the items' seconds, each round
    lasting its busiest rank, scaled so that the items add up to T."""
    measured = sum(sum(r.values()) for r in phase.rounds)
    scale = phase.seconds / measured if measured > 0 else 0.0
    duration, busy = 0.0, [0.0] * world
    for items, where in zip(phase.rounds, owner):
        loads = [0.0] * world
        for i, seconds in items.items():
            loads[where[i]] += scale * seconds
        duration += max(loads)
        busy = [b + x for b, x in zip(busy, loads)]
    return duration, busy


def _client_owner(phase: Phase, world: int) -> dict[int, int]:
    clients = sorted({c for r in phase.rounds for c in r})
    if phase.client_sizes:
        sizes = list(phase.client_sizes)
    else:  # no data sizes: place by the clients' summed seconds (a stand-in; assign_clients only adds and compares)
        total = {c: sum(r.get(c, 0.0) for r in phase.rounds) for c in clients}
        sizes = [total.get(c, 0.0) for c in range(max(clients, default=-1) + 1)]
    return {c: r for r, mine in enumerate(assign_clients(sizes, world)) for c in mine}


def _phase_on(phase: Phase, world: int, bandwidth: float) -> PhaseEstimate:
    T = phase.seconds
    if world == 1:  # the input times, whatever the rule
        return PhaseEstimate(phase.name, phase.rule, T, T, (T,))
    if phase.rule == "rank0":
        return PhaseEstimate(phase.name, phase.rule, T, T, (T, *([0.0] * (world - 1))))
    if phase.rule in ("blocks", "strided"):
        busy = tuple(c / phase.items * T for c in _counts(phase.rule, phase.items, world))
        return PhaseEstimate(phase.name, phase.rule, T, max(busy), busy)
    if phase.rule == "data_parallel":
        comm = phase.steps * 2 * (world - 1) / world * phase.gradient_bytes / bandwidth
        each = T / world + comm
        return PhaseEstimate(phase.name, phase.rule, T, each, tuple([each] * world), comm)
    if not phase.rounds:  # clients/pilots without item times: equal items
        return _phase_on(Phase(phase.name, T, "strided", items=phase.items), world, bandwidth)
    if phase.rule == "pilots":
        owner = [{i: i % world for i in r} for r in phase.rounds]  # Deal.strided: pilot i on rank i mod N
    else:
        where = _client_owner(phase, world)
        owner = [where for _ in phase.rounds]
    duration, busy = _scaled_rounds(phase, owner, world)
    return PhaseEstimate(phase.name, phase.rule, T, duration, tuple(busy))


def estimate(phases: Sequence[Phase], ranks: int, *, bandwidth: float = NVLINK_BYTES_PER_S) -> Estimate:
    """The run of ``phases`` (one rank's times) on ``ranks`` ranks, by each phase's rule (module docstring).

    Args:
        bandwidth: bytes/s of the pre-training's gradient all-reduce (per rank, a ring's link).
    """
    if ranks < 1 or bandwidth <= 0:
        raise ValueError(f"need ranks >= 1 and bandwidth > 0, got {ranks} and {bandwidth}")
    own = {i: _phase_on(p, ranks, bandwidth) for i, p in enumerate(phases) if p.rule != "pilots_all"}
    others = [e for e in own.values() if e.rule != "pilots"]  # what a pilot is a smaller run of
    one = sum(e.one_rank_s for e in others)
    ratio = sum(e.seconds for e in others) / one if one > 0 else 1.0
    busy = [sum(e.busy[r] for e in others) / one if one > 0 else 1.0 for r in range(ranks)]
    out = []
    for i, p in enumerate(phases):
        if p.rule == "pilots_all":  # every pilot over all the ranks, sped up as the run's other phases are
            own[i] = PhaseEstimate(p.name, p.rule, p.seconds, p.seconds * ratio, tuple(p.seconds * b for b in busy))
        out.append(own[i])
    return Estimate(ranks, tuple(out), bandwidth)


def phases_from_json(data: Mapping[str, Any]) -> list[Phase]:
    """The phases of a JSON file's ``phases`` list (``{"name", "seconds", "rule", …}``; other keys, such as
    ``source``, are documentation); ``rounds`` as lists of ``{client: seconds}`` objects."""
    out = []
    for p in data["phases"]:
        rounds = tuple({int(k): float(v) for k, v in r.items()} for r in p.get("rounds", ()))
        out.append(
            Phase(
                name=str(p["name"]),
                seconds=float(p["seconds"]),
                rule=str(p["rule"]),
                items=int(p.get("items", 1)),
                rounds=rounds,
                client_sizes=tuple(int(v) for v in p.get("client_sizes", ())),
                steps=int(p.get("steps", 0)),
                gradient_bytes=float(p.get("gradient_bytes", 0.0)),
            )
        )
    return out


def format_estimate(est: Estimate) -> list[str]:
    """Lines: each phase's one-rank and N-rank seconds, then the total, speed-up, Amdahl's bound and waits."""
    lines = [f"N = {est.ranks} (all-reduce bandwidth {est.bandwidth / 1e9:g} GB/s)"]
    for p in est.phases:
        comm = f", all-reduce {p.communication_s:.4g} s" if p.communication_s else ""
        lines.append(f"  {p.name:<12} {p.rule:<13} 1 rank {p.one_rank_s:>10.4g} s -> {p.seconds:>10.4g} s{comm}")
    waits = ", ".join(f"{100 * w:.1f}" for w in est.wait_share)
    bound = f"rank-0 phases bound it at {est.serial_bound:.2f}x" if est.serial_bound != float("inf") else "no rank-0 phase"
    lines.append(f"  total {est.one_rank_s:.4g} s -> {est.total_s:.4g} s: speed-up {est.speedup:.2f}x ({bound})")
    lines.append(f"  waiting % per rank: {waits}")
    if est.phases and est.total_s > 0:
        longest = max(est.phases, key=lambda p: p.seconds)
        share = 100 * longest.seconds / est.total_s
        lines.append(f"  longest phase: {longest.name} ({longest.rule}), {share:.0f} % of the total")
    return lines
