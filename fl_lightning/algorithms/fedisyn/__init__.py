"""FeDiSyn itself; the stages and model it shares with its baselines are in ``algorithms/synthetic_family/``.

algorithm.py  :class:`FeDiSynConfig` (the ``fedisyn:`` section) and :class:`FeDiSyn` = its two stages
pilots.py     FeDiSyn's pilots by hand: in-process pilot runs and the scaling-law fit
              (``python -m fl_lightning.algorithms.fedisyn.pilots``)
"""

from fl_lightning.algorithms.fedisyn.algorithm import FeDiSyn, FeDiSynConfig

__all__ = ["FeDiSyn", "FeDiSynConfig"]
