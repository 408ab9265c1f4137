"""fl_lightning: federated learning with foundation models on PyTorch Lightning and Fabric.

Importing it changes nothing outside the package (tests/test_no_side_effects.py).
"""

__version__ = "0.1.0"
