"""Defer torchmetrics' root package until something asks it for a name only the root provides.

Why: ``import lightning`` costs ~3 CPU-seconds more than ``import torch, timm`` on a 2-core machine, and
nearly all of it is torchmetrics' ``__init__``, which imports every metric domain (``functional.text``
imports transformers, ``functional.audio`` scipy.signal, ``functional.image`` torchvision's models). What
Lightning needs from it at import time is small:

* ``lightning/fabric/utilities/imports.py`` calls lightning_utilities' ``compare_version("torchmetrics",
  ...)``, which ``importlib.import_module``\\ s the package only to read ``__version__``;
* ``lightning/pytorch/{core/module.py, utilities/types.py, trainer/connectors/logger_connector/result.py}``
  do ``from torchmetrics import Metric`` (and ``MetricCollection``).

Upstream: Lightning-AI/torchmetrics "Import time: scipy.signal, torchvision and matplotlib are imported
eagerly by import torchmetrics" (open) and "Don't import all modules from torchmetrics root" (open);
Lightning-AI/pytorch-lightning "import lightning takes 6 seconds" was closed as a third-party cost.

What this does (:func:`install`, called from ``fl_lightning/__init__.py`` before anything imports
Lightning): it puts the real ``torchmetrics`` package into ``sys.modules`` WITHOUT executing its
``__init__`` yet — the module object of torchmetrics' own spec, with ``__version__`` (from the installed
distribution's metadata), the ``_logger`` / ``_PACKAGE_ROOT`` / ``_PROJECT_ROOT`` names that its
submodules import from the root, and a module ``__getattr__``:

* ``Metric`` / ``MetricCollection`` come from ``torchmetrics.metric`` / ``torchmetrics.collections`` (the
  real classes; ``torchmetrics.utilities`` first, the order torchmetrics' own imports resolve in);
* any other name runs the real ``__init__`` in that same module object, once, and returns the name:
  ``torchmetrics.Accuracy``, ``torchmetrics.functional``… work as always, only later.

Submodules (``from torchmetrics.classification import MulticlassAccuracy``) import as usual, with
``torchmetrics.utilities`` first (:class:`_UtilitiesFirst`: torchmetrics' own import order). Nothing of
torchmetrics' code is copied or changed; values are the library's own. When torchmetrics is absent or
already imported, or ``FL_LIGHTNING_EAGER_TORCHMETRICS=1`` is set, nothing is done; any error while
installing leaves the normal import in place.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
from typing import Any

__all__ = ["install", "is_deferred"]

_NAME = "torchmetrics"
_LIGHT = {"Metric": "torchmetrics.metric", "MetricCollection": "torchmetrics.collections"}


def is_deferred() -> bool:
    """Whether ``torchmetrics`` is in ``sys.modules`` with its root ``__init__`` not run yet."""
    module = sys.modules.get(_NAME)
    return module is not None and getattr(module, "_fl_lightning_deferred", {}).get("pending", False)


def install() -> bool:
    """Put the deferred ``torchmetrics`` into ``sys.modules``; returns whether it did (see the module docstring)."""
    if _NAME in sys.modules or os.environ.get("FL_LIGHTNING_EAGER_TORCHMETRICS") == "1":
        return False
    try:
        spec = importlib.util.find_spec(_NAME)
        if spec is None or spec.loader is None or spec.origin is None:
            return False
        module = importlib.util.module_from_spec(spec)
        module.__version__ = importlib.metadata.version(_NAME)
        module._logger = logging.getLogger(_NAME)  # the root's names its submodules import from it
        module._PACKAGE_ROOT = os.path.dirname(spec.origin)
        module._PROJECT_ROOT = os.path.dirname(module._PACKAGE_ROOT)
    except Exception:  # noqa: BLE001 — an unusual installation: keep the normal import
        return False
    state = {"pending": True}
    module._fl_lightning_deferred = state

    def __getattr__(name: str) -> Any:  # noqa: N807 — a module-level __getattr__ (PEP 562)
        if not state["pending"] or name.startswith("__"):
            raise AttributeError(f"module {_NAME!r} has no attribute {name!r}")
        if name in _LIGHT:
            importlib.import_module("torchmetrics.utilities")
            return getattr(importlib.import_module(_LIGHT[name]), name)
        state["pending"] = False  # the real __init__, once, in this module object
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        if name not in module.__dict__:
            raise AttributeError(f"module {_NAME!r} has no attribute {name!r}")
        return module.__dict__[name]

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[_NAME] = module
    sys.meta_path.insert(0, _UtilitiesFirst())
    return True


class _Existing:
    """A loader that hands back a module some other import already finished (never runs it twice)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def create_module(self, spec: Any) -> Any:
        return self.module

    def exec_module(self, module: Any) -> None:
        pass


class _UtilitiesFirst:
    """A ``sys.meta_path`` finder that imports ``torchmetrics.utilities`` before any other submodule.

    torchmetrics' modules import each other in a cycle (``metric`` → ``utilities`` → ``utilities.checks``
    → ``metric``) that resolves only when ``utilities`` is entered first — the order the root ``__init__``
    happens to import them in. With the root deferred, ``from torchmetrics.classification import ...``
    would enter the cycle at ``metric``; this finder restores torchmetrics' own order and then steps aside
    (it removes itself once ``torchmetrics.utilities`` is imported).
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(_NAME + ".") or fullname.startswith(_NAME + ".utilities") \
                or fullname == _NAME + ".__about__":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if _NAME + ".utilities" not in sys.modules:
            importlib.import_module(_NAME + ".utilities")
        done = sys.modules.get(fullname)
        if done is None:  # not imported on the way: the normal finders take it from here
            return None
        return importlib.util.spec_from_loader(fullname, _Existing(done), origin=getattr(done, "__file__", None),
                                               is_package=hasattr(done, "__path__"))
