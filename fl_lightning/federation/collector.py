"""Python's cyclic garbage collector around a run: paused while a process starts, and the start-up's
long-lived objects kept out of the rounds' collections.

A run's start imports torch, timm, Lightning and the data set's library and builds the model and the
data: about a million long-lived objects. CPython runs a full collection whenever enough new objects have
survived, and every full collection rescans ALL of them, so a start-up triggers several, each slower
than the last (~0.5–1.5 s in all on a 2-core CPU, measured as ``import torch, timm, lightning, sklearn``
with and without ``gc.disable()``). Two measures:

* :func:`pause_collection` (the CLI, first thing): the collector is off until the run's rounds begin
  (``on_run_start``), or until :meth:`Paused.release` — whichever comes first; a collector someone else
  turned off stays off.
* :func:`frozen_during_rounds` (``Simulation.run``, around ``on_run_start`` and the rounds):
  ``gc.freeze()`` moves every object alive at that moment into the permanent generation, so no
  collection during the rounds rescans the start-up's objects; at the end ``gc.unfreeze()`` hands them
  back, so a process that runs many runs (a comparison) still collects each run's garbage afterwards.
  The freeze comes BEFORE the pause ends: a paused collector leaves every start-up object in its
  youngest generation, so its first collection would otherwise scan them all (~0.4 s measured between
  the set-up and the first client).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Paused", "pause_collection", "frozen_during_rounds"]


class Paused:
    """The collector turned off by :func:`pause_collection`; a Fabric callback that turns it back on when
    the rounds begin (``on_run_start``). :meth:`release` does the same at any time (idempotent)."""

    def __init__(self, turned_off: bool) -> None:
        self._turned_off = turned_off

    def release(self) -> None:
        if self._turned_off:
            self._turned_off = False
            gc.enable()

    def on_run_start(self, **_: Any) -> None:
        self.release()


def pause_collection() -> Paused:
    """Turn the collector off (if it is on) until the returned object is released or the rounds begin."""
    was_on = gc.isenabled()
    gc.disable()
    return Paused(was_on)


@contextmanager
def frozen_during_rounds() -> Iterator[None]:
    """``gc.freeze()`` for the block, ``gc.unfreeze()`` after it (see the module docstring)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
