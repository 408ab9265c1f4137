"""Python's cyclic garbage collector around the CLI's runs — opt-in start-up tuning, never the library's.

The library (``import fl_lightning``, ``Simulation.run``) leaves the collector as it finds it. A process that
owns its interpreter — ``python -m fl_lightning.train`` with ``FL_LIGHTNING_FAST_START=1``
(:mod:`fl_lightning.experiments.startup`) — may tune it for a run's start:

A run's start imports torch, timm, Lightning and the data set's library and builds the model and the
data: about a million long-lived objects. CPython runs a full collection whenever enough new objects have
survived, and every full collection rescans ALL of them, so a start-up triggers several, each slower
than the last. Two measures, one object (:class:`StartupCollector`):

* :func:`pause_collection` (the CLI, first thing): the collector is off until the run's rounds begin
  (``on_run_start``), or until :meth:`StartupCollector.release`; a collector someone else turned off stays off.
* at ``on_run_start`` the objects alive at that moment are frozen (``gc.freeze()``: the permanent generation,
  so no collection during the rounds rescans the start-up's objects) BEFORE the pause ends (a paused collector
  leaves every start-up object in its youngest generation: its first collection would scan them all);
  :meth:`StartupCollector.end_run` (the CLI, after each run, also when it fails) unfreezes them, so a process
  that runs many runs (a comparison) still collects each run's garbage afterwards.
"""

from __future__ import annotations

import gc
from typing import Any

__all__ = ["StartupCollector", "pause_collection"]


class StartupCollector:
    """The collector paused by :func:`pause_collection`; a Fabric callback that freezes the start-up's objects
    and turns the collector back on when the rounds begin (``on_run_start``)."""

    def __init__(self, turned_off: bool) -> None:
        self._turned_off = turned_off
        self._frozen = False

    def on_run_start(self, **_: Any) -> None:
        if not self._frozen:
            gc.freeze()
            self._frozen = True
        self._resume()

    def end_run(self) -> None:
        """After a run (finished or not): the start-up's objects are collectable again."""
        if self._frozen:
            self._frozen = False
            gc.unfreeze()

    def release(self) -> None:
        """Everything undone (idempotent): unfrozen, and the collector on if the pause turned it off."""
        self.end_run()
        self._resume()

    def _resume(self) -> None:
        if self._turned_off:
            self._turned_off = False
            gc.enable()


def pause_collection() -> StartupCollector:
    """Turn the collector off (if it is on) until the returned object is released or the rounds begin."""
    was_on = gc.isenabled()
    gc.disable()
    return StartupCollector(was_on)
