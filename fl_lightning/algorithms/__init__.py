"""One file (or package) per federated method, found by discovery: adding a method edits nothing here.

:func:`available_algorithms` imports every module of this package once (and any installed
distribution that declares an ``fl_lightning.algorithms`` entry point), which runs their
``@register`` decorators, and returns the registry. Method modules keep their module-level imports
light (heavy libraries are imported where they are used), so discovery stays cheap.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from importlib.metadata import entry_points

from fl_lightning.federation.algorithm import ALGORITHMS, Algorithm

__all__ = ["available_algorithms", "ALGORITHMS"]

@functools.cache
def _discover() -> None:
    """Import the method modules of this package and of plug-ins (once per process)."""
    for module in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        if not module.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(module.name)
    for entry in entry_points(group="fl_lightning.algorithms"):
        entry.load()


def available_algorithms() -> dict[str, type[Algorithm]]:
    """Every registered method, by name (methods registered later, e.g. in a test file, included)."""
    _discover()
    return dict(ALGORITHMS)
