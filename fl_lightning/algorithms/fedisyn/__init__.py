"""FeDiSyn as a package: its config, the method, the round planning, the synthesis step and pilots.

    config.py          the ``fedisyn:`` section (with ``lora`` and ``systems`` nested)
    algorithm.py       :class:`FeDiSyn` on the federation engine (rounds, wire format, State)
    planning.py        per-round system plan: profiles → contributions → depths (CLC) → bandwidth (WFBA)
    synthesis_step.py  server round 0: latents → prompts → synthetic images → pre-trained ViT
    pilots.py          pilot runs and the scaling-law fit (``python -m fl_lightning.algorithms.fedisyn.pilots``)
"""

from fl_lightning.algorithms.fedisyn.algorithm import FeDiSyn
from fl_lightning.algorithms.fedisyn.config import FeDiSynConfig, LoraConfig, SystemsConfig

__all__ = ["FeDiSyn", "FeDiSynConfig", "LoraConfig", "SystemsConfig"]
