"""fl_lightning: federated learning with foundation models on PyTorch Lightning and Fabric."""

__version__ = "0.1.0"
