"""FeDiSyn as a package of stages: the ViT and its wire names, synthesis, fine-tuning, planning, pilots.

    config.py          the shared config pieces (the ViT, ``lora``, ``systems``)
    model.py           State / wire key prefixes and the LoRA-wrapped ViT's backbone keys
    synthesis.py       the synthesis stage (round 0) and its sources: feature-guided, text-only
    synthesis_step.py  the server side of round 0: latents → prompts → synthetic images → pre-trained ViT
    finetune.py        the fine-tuning stage (LoRA, CLC, WFBA) and the ImageNet start of SFLF / CAFF
    algorithm.py       :class:`FeDiSynFamily` (what the family shares) and :class:`FeDiSyn` = its two stages
    planning.py        per-round system plan: profiles → contributions → depths (CLC) → bandwidth (WFBA)
    pilots.py          pilot runs and the scaling-law fit (``python -m fl_lightning.algorithms.fedisyn.pilots``)
"""

from fl_lightning.algorithms.fedisyn.algorithm import FeDiSyn, FeDiSynConfig, FeDiSynFamily
from fl_lightning.algorithms.fedisyn.config import LoraConfig, SystemsConfig

__all__ = ["FeDiSyn", "FeDiSynConfig", "FeDiSynFamily", "LoraConfig", "SystemsConfig"]
