"""FeDiSyn's system model: devices, channel, water-filling, LoRA depth, contributions, scaling law.

The calibration against the paper's reported times and traffic is ``systems/calibration.py``.
Everything here is pure math on numpy float64 arrays (no Lightning, no I/O), so the federation
loop can plan a round (depths → compute times → bandwidths → round time) and tests can check each
piece against an independent reference.
"""

# Each submodule's ``__all__`` names its public API; the package re-exports the union, so the lists are written once.
from fl_lightning.systems import backbones, channel, clc, devices, scaling_law, server, wfba
from fl_lightning.systems.backbones import *  # noqa: F403
from fl_lightning.systems.channel import *  # noqa: F403
from fl_lightning.systems.clc import *  # noqa: F403
from fl_lightning.systems.devices import *  # noqa: F403
from fl_lightning.systems.scaling_law import *  # noqa: F403
from fl_lightning.systems.server import *  # noqa: F403
from fl_lightning.systems.wfba import *  # noqa: F403

__all__ = [
    *backbones.__all__,
    *server.__all__,
    *channel.__all__,
    *clc.__all__,
    *devices.__all__,
    *scaling_law.__all__,
    *wfba.__all__,
]
