"""One file per federated method; importing this package registers them all."""

from fl_lightning.algorithms import afl, fedavg, fedisyn, fedopal  # noqa: F401
from fl_lightning.federation.algorithm import ALGORITHMS

__all__ = ["ALGORITHMS"]
