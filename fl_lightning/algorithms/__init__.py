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

from fl_lightning.federation.algorithm import ALGORITHMS, RENAMED, Algorithm

__all__ = ["available_algorithms", "renamed_algorithms", "import_errors", "ALGORITHMS"]


@functools.cache
def _discover() -> dict[str, str]:
    """Import the method modules of this package and of plug-ins (once per process).

    A module that fails to import does not take the other methods down with it: its error is kept
    and reported when its method is asked for (:func:`import_errors`).
    """
    errors: dict[str, str] = {}
    for module in pkgutil.walk_packages(__path__, prefix=f"{__name__}.", onerror=lambda name: None):
        if not module.name.rsplit(".", 1)[-1].startswith("_"):
            try:
                importlib.import_module(module.name)
            except Exception as err:  # noqa: BLE001 — reported by import_errors(), where a user selects it
                errors[module.name] = f"{type(err).__name__}: {err}"
    for entry in entry_points(group="fl_lightning.algorithms"):
        try:
            entry.load()
        except Exception as err:  # noqa: BLE001
            errors[entry.value] = f"{type(err).__name__}: {err}"
    return errors


def import_errors() -> dict[str, str]:
    """Method modules that failed to import: module name → "ExceptionType: message"."""
    return dict(_discover())


def available_algorithms() -> dict[str, type[Algorithm]]:
    """Every registered method, by name (methods registered later, e.g. in a test file, included)."""
    _discover()
    return dict(ALGORITHMS)


def renamed_algorithms() -> dict[str, str]:
    """Former method names that still work: former name → the method's name now (see ``register``)."""
    _discover()
    return dict(RENAMED)
