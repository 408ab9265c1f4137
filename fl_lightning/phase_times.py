"""Wall seconds of a run's phases, for the ranks benchmark's per-phase model (``benchmarks/rank_model.py``).

Off unless :func:`recording_phases` installs a :class:`PhaseLog` (the benchmark's own processes, as
``federation.collectives.recording_waits`` does for the waits): then each :func:`timed` phase costs two
``time.monotonic()`` calls, once per phase and never per step; without a log, :func:`timed` and :func:`note` do
nothing. Timing never changes a number of the run.

Phases nest (round 0's aggregate holds the pilots, the generation, the store and the pre-training): each phase is
charged its own seconds, those of the phases timed inside it taken off, so the phases add up to the time timed.

Pure bookkeeping: no torch and no import of the package, so ``modules/``, ``synthesis/``, ``algorithms/`` and
``federation/`` may all import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["SecondsTally", "PhaseLog", "installed", "recording_phases", "timed", "note", "item"]

T = TypeVar("T")


class SecondsTally:
    """Seconds and calls by name, summed: what a benchmark's process records of its phases or its waits."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1


@contextmanager
def installed(stack: list[T], log: T) -> Iterator[T]:
    """``log`` on top of ``stack`` (a module's installed logs, at most one in use) while the block runs."""
    stack.append(log)
    try:
        yield log
    finally:
        stack.remove(log)


class PhaseLog(SecondsTally):
    """What :func:`recording_phases` collects in this process.

    Attributes:
        seconds: each phase's own wall seconds (the phases timed inside it taken off), summed over its calls.
        calls: how many times each phase ran.
        items: per-item wall seconds of a dealt phase (``pilot``: one pilot run each), in the order they ran.
        facts: the sizes a dealt phase is modelled by (``generation batches``, ``pretraining steps``,
            ``pretraining gradient bytes``), summed over the phase's calls.
    """

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[str, list[float]] = {}
        self.facts: dict[str, float] = {}
        self._open: list[list] = []  # the open phases: [name, seconds of the phases timed inside it]


_phase_log: list[PhaseLog] = []  # the installed log (at most one), for the benchmark's processes only


@contextmanager
def recording_phases() -> Iterator[PhaseLog]:
    """Record every :func:`timed` phase of this process into a fresh :class:`PhaseLog` while the block runs."""
    with installed(_phase_log, PhaseLog()) as log:
        yield log


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """The block's wall seconds, less those of the phases timed inside it, charged to ``phase`` (when recording)."""
    if not _phase_log:
        yield
        return
    log = _phase_log[-1]
    log._open.append([phase, 0.0])
    start = time.monotonic()
    try:
        yield
    finally:
        total = time.monotonic() - start
        log.add(phase, total - log._open.pop()[1])
        if log._open:
            log._open[-1][1] += total


def note(fact: str, value: float | Callable[[], float], *, within: str | None = None) -> None:
    """Add ``value`` to a size of a phase (``generation batches``: the batches dealt over the ranks), when recording;
    with ``within``, only while a phase of that name is open (the generation's batches, not a probe's). A callable
    ``value`` is called only then: nothing is computed in a run that does not record."""
    if _phase_log and (within is None or any(name == within for name, _ in _phase_log[-1]._open)):
        facts = _phase_log[-1].facts
        facts[fact] = facts.get(fact, 0.0) + float(value() if callable(value) else value)


def item(phase: str, seconds: float) -> None:
    """One item's wall seconds of a dealt phase (``pilot``), when recording."""
    if _phase_log:
        _phase_log[-1].items.setdefault(phase, []).append(float(seconds))
