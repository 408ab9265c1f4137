"""fl_lightning: federated learning with foundation models on PyTorch Lightning and Fabric."""

__version__ = "0.1.0"

# Lightning imports torchmetrics at import time for two names; its root package imports every metric domain
# (transformers, scipy.signal, ...). Defer that root until a name only it provides is asked for.
from fl_lightning import _lazy_torchmetrics  # noqa: E402

_lazy_torchmetrics.install()
