"""Defer torchmetrics' root package until something asks it for a name only the root provides — an opt-in
start-up trick of the CLI (``FL_LIGHTNING_FAST_START=1``, :mod:`fl_lightning.experiments.startup`), never done by
``import fl_lightning``, and only for the torchmetrics versions in :data:`PINNED` (the ones its tests ran on; any
other version is imported normally).

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

What this does (:func:`install`, called by the CLI's fast start before anything imports Lightning): it puts the
real ``torchmetrics`` package into ``sys.modules`` WITHOUT executing its ``__init__`` yet — the module object of
torchmetrics' own spec, with ``__version__`` (from the installed distribution's metadata), the ``_logger`` /
``_PACKAGE_ROOT`` / ``_PROJECT_ROOT`` names that its submodules import from the root, and a module
``__getattr__``:
* ``Metric`` / ``MetricCollection`` come from ``torchmetrics.metric`` / ``torchmetrics.collections`` (the
  real classes; ``torchmetrics.utilities`` first, the order torchmetrics' own imports resolve in);
* any other name runs the real ``__init__`` in that same module object, once, and returns the name:
  ``torchmetrics.Accuracy``, ``torchmetrics.functional``… work as always, only later.

Submodules (``from torchmetrics.classification import MulticlassAccuracy``) import as usual, with
``torchmetrics.utilities`` first (:class:`_UtilitiesFirst`: torchmetrics' own import order). Nothing of
torchmetrics' code is copied or changed; values are the library's own. When torchmetrics is absent or
already imported, or its version is not :data:`PINNED`, nothing is done; any error while installing leaves
the normal import in place.

**matplotlib on first use** (:class:`_PlotOnFirstUse`). ``torchmetrics.metric`` — which Lightning needs
for ``Metric`` — imports ``torchmetrics.utilities.plot``, and that module imports ``matplotlib.pyplot``
at its top whenever matplotlib is installed (~0.6 s of a run's start on a 2-core CPU), only to name three
annotation types and to wrap its three plot functions in ``plt.style.context``. The upstream fix
(Lightning-AI/torchmetrics PR "Do not import scipy.signal and matplotlib at package import time", for
the open issue on import time named above) was closed unmerged. Here the plot module is executed with its
"matplotlib not installed" branch (the annotation types are ``object``, as that PR has them at runtime), and
then completed on first use: its ``_MATPLOTLIB_AVAILABLE`` becomes an object that, the first time a plot
function asks it,
imports matplotlib and puts ``plt``, ``matplotlib`` and ``style_change = plt.style.context`` into the
module, exactly the names its top would have bound; and its three plot functions enter
``plt.style.context`` at call time rather than at definition. ``metric.plot()`` draws the same figure
as before; matplotlib is imported when something plots (or draws ``partition.png``), not at start.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
from typing import Any

__all__ = ["PINNED", "install", "is_deferred", "supported"]

#: The torchmetrics (major, minor) releases whose private names (``_logger``, ``_PACKAGE_ROOT``,
#: ``utilities.plot``'s layout) this module was checked against (tests/experiments/test_torchmetrics_deferral.py).
PINNED = ((1, 9),)

_NAME = "torchmetrics"
_LIGHT = {"Metric": "torchmetrics.metric", "MetricCollection": "torchmetrics.collections"}


def is_deferred() -> bool:
    """Whether ``torchmetrics`` is in ``sys.modules`` with its root ``__init__`` not run yet."""
    module = sys.modules.get(_NAME)
    return module is not None and getattr(module, "_fl_lightning_deferred", {}).get("pending", False)


def supported(version: str) -> bool:
    """Whether a torchmetrics version is one of :data:`PINNED`."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) in PINNED


def install() -> bool:
    """Put the deferred ``torchmetrics`` into ``sys.modules``; returns whether it did (see the module docstring)."""
    if _NAME in sys.modules:
        return False
    try:
        if not supported(importlib.metadata.version(_NAME)):
            return False
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
    if "matplotlib.pyplot" not in sys.modules and importlib.util.find_spec("matplotlib") is not None:
        sys.meta_path.insert(0, _PlotOnFirstUse())
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
        if not fullname.startswith(_NAME + ".") or fullname.startswith(_NAME + ".utilities") or fullname == _NAME + ".__about__":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if _NAME + ".utilities" not in sys.modules:
            importlib.import_module(_NAME + ".utilities")
        done = sys.modules.get(fullname)
        if done is None:  # not imported on the way: the normal finders take it from here
            return None
        return importlib.util.spec_from_loader(
            fullname, _Existing(done), origin=getattr(done, "__file__", None), is_package=hasattr(done, "__path__")
        )


_PLOT = _NAME + ".utilities.plot"


class _PlotOnFirstUse:
    """A ``sys.meta_path`` finder for ``torchmetrics.utilities.plot`` alone (see the module docstring): it
    executes the real module with ``torchmetrics.utilities.imports._MATPLOTLIB_AVAILABLE`` false for the
    duration of that one execution, then completes it on first use (:class:`_MatplotlibOnFirstUse`). It
    removes itself after that one import."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _PLOT:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PlotLoader(spec.loader)
        return spec


class _PlotLoader:
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        flags = importlib.import_module(_NAME + ".utilities.imports")
        available = flags._MATPLOTLIB_AVAILABLE
        flags._MATPLOTLIB_AVAILABLE = False
        try:
            self.loader.exec_module(module)
        finally:
            flags._MATPLOTLIB_AVAILABLE = available
        if not available:  # matplotlib is not installed after all: the module is exactly as torchmetrics made it
            return
        style = module.__dict__.get("_style", ["default"])
        for name, fn in list(module.__dict__.items()):  # the functions its top wrapped in style_change
            if callable(fn) and getattr(fn, "__module__", None) == _PLOT and hasattr(fn, "__wrapped__"):
                module.__dict__[name] = _styled_at_call(module, fn.__wrapped__, style)
        module._AX_TYPE = _Axes  # what isinstance checks elsewhere in torchmetrics import from it
        module._MATPLOTLIB_AVAILABLE = _MatplotlibOnFirstUse(module, available)


class _AxesCheck(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        axes = sys.modules.get("matplotlib.axes")  # no Axes can exist before matplotlib.axes is imported
        return axes is not None and isinstance(obj, axes.Axes)

    def __subclasscheck__(cls, sub: Any) -> bool:
        axes = sys.modules.get("matplotlib.axes")
        return axes is not None and issubclass(sub, axes.Axes)


class _Axes(metaclass=_AxesCheck):
    """``matplotlib.axes.Axes`` for ``isinstance`` / ``issubclass`` (the plot module's ``_AX_TYPE``, which
    ``MetricCollection.plot`` and ``MultitaskWrapper.plot`` use to check their ``ax``), without importing
    matplotlib: false for everything until matplotlib.axes is imported, then exactly ``Axes``'s answer."""


class _MatplotlibOnFirstUse:
    """The plot module's ``_MATPLOTLIB_AVAILABLE``: true or false as matplotlib's presence, and the first
    time it is asked, the plot module receives the names its top binds when matplotlib is there."""

    def __init__(self, module: Any, available: Any) -> None:
        self.module, self.available = module, available

    def __bool__(self) -> bool:
        if not self.available:
            return False
        import matplotlib
        import matplotlib.axes
        import matplotlib.pyplot as plt

        names = self.module.__dict__
        names.update(matplotlib=matplotlib, plt=plt, style_change=plt.style.context, _AX_TYPE=matplotlib.axes.Axes)
        names["_MATPLOTLIB_AVAILABLE"] = self.available
        return True


def _styled_at_call(module: Any, fn: Any, style: Any) -> Any:
    """``fn`` run inside ``plt.style.context(style)``, entered when it is called (the module's top did it at
    definition, which needs pyplot)."""
    import functools

    @functools.wraps(fn)
    def plot_function(*args: Any, **kwargs: Any) -> Any:
        if not module._MATPLOTLIB_AVAILABLE:  # the first plot completes the module (or finds matplotlib gone)
            return fn(*args, **kwargs)  # torchmetrics' own "install matplotlib" error
        with module.plt.style.context(style):
            return fn(*args, **kwargs)

    return plot_function
