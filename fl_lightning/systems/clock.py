"""The simulated wall clock of FeDiSyn's system model.

FeDiSyn's total time is H = H_gene + H_pre + Σ_t H^t: generating the synthetic images, pre-training
on them, and the federated rounds, each of which lasts as long as its slowest device (compute plus
upload, made equal for all by water-filling). The federation loop charges each phase here as it
simulates it; the clock is what ``simulated_time_s`` reports, and it saves/restores with the run.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["SimulatedClock", "PHASES"]

PHASES: tuple[str, ...] = ("generation", "pretraining", "round")


class SimulatedClock:
    """Accumulates simulated seconds per phase.

    Example:
        >>> clock = SimulatedClock()
        >>> clock.add("generation", 120.0)
        >>> clock.add("round", 3.5)
        >>> clock.total_s, clock.phase_s("round"), clock.round_times
        (123.5, 3.5, [3.5])
    """

    def __init__(self) -> None:
        self._totals: dict[str, float] = {phase: 0.0 for phase in PHASES}
        self._round_times: list[float] = []  # H^t of every round, in order

    def add(self, phase: str, seconds: float) -> None:
        """Charge ``seconds`` to ``phase`` (one of :data:`PHASES`); a "round" is one H^t."""
        if phase not in self._totals:
            raise ValueError(f"unknown clock phase {phase!r}; expected one of {list(PHASES)}")
        seconds = float(seconds)
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"simulated seconds charged to {phase!r} must be finite and >= 0, got {seconds!r}")
        self._totals[phase] += seconds
        if phase == "round":
            self._round_times.append(seconds)

    @property
    def total_s(self) -> float:
        """H = H_gene + H_pre + Σ_t H^t."""
        return sum(self._totals.values())

    def phase_s(self, phase: str) -> float:
        """Seconds charged to one phase so far."""
        if phase not in self._totals:
            raise ValueError(f"unknown clock phase {phase!r}; expected one of {list(PHASES)}")
        return self._totals[phase]

    @property
    def phase_totals(self) -> dict[str, float]:
        """A copy of the per-phase totals."""
        return dict(self._totals)

    @property
    def round_times(self) -> list[float]:
        """A copy of the per-round times H^t."""
        return list(self._round_times)

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self._totals), "round_times": list(self._round_times)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        totals = state["totals"]
        if set(totals) != set(PHASES):
            raise ValueError(f"clock state holds the phases {sorted(totals)}; expected exactly {list(PHASES)}")
        self._totals = {phase: float(totals[phase]) for phase in PHASES}
        self._round_times = [float(t) for t in state["round_times"]]

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v:.6g}" for k, v in self._totals.items())
        return f"SimulatedClock(total_s={self.total_s:.6g}, {parts})"
