"""The CLI's opt-in start-up tuning: ``FL_LIGHTNING_FAST_START=1 python -m fl_lightning.train ...``.

The library changes no other package and no interpreter setting on import or in a run; a process that owns its
interpreter may ask for two tricks that shorten a run's start, both undone or harmless for what runs after:

* torchmetrics' root package deferred (:mod:`fl_lightning.experiments.torchmetrics_deferral`; only for the
  torchmetrics releases it pins), so ``import lightning`` does not import every metric domain;
* Python's cyclic collector paused through the start-up and the start-up's objects frozen during the rounds
  (:mod:`fl_lightning.experiments.collector`).

What either saves is measured in docs/benchmarks.md; without the variable the CLI starts as any program would.
"""

from __future__ import annotations

import os

from fl_lightning.experiments.collector import StartupCollector, pause_collection

__all__ = ["FAST_START", "fast_start", "fast_start_requested"]

FAST_START = "FL_LIGHTNING_FAST_START"


def fast_start_requested() -> bool:
    """Whether the environment asks for the fast start (``FL_LIGHTNING_FAST_START=1``; inherited by DDP ranks)."""
    return os.environ.get(FAST_START) == "1"


def fast_start() -> StartupCollector:
    """Apply both tricks (call before anything imports Lightning); returns the paused collector, which the
    caller passes to each run as a callback and releases at the end."""
    from fl_lightning.experiments import torchmetrics_deferral

    collector = pause_collection()
    torchmetrics_deferral.install()
    return collector
