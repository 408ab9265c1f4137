"""FeDiSyn ("Scaling Synthetic-Image Pre-Training for Federated Fine-Tuning of Large Vision Models").

    FeDiSyn = synthesis (feature-guided, ``synthetic_family/synthesis.py``) → LoRA fine-tuning (CLC, WFBA,
    ``synthetic_family/finetune.py``)

Round 0 — synthesis and server pre-training (steps 1, 2); rounds 1..T (``federation.rounds`` = T) —
LoRA fine-tuning (step 3). ``generation: text_only`` (the "w/o FG" ablation) swaps the synthesis
stage for :class:`~fl_lightning.algorithms.synthetic_family.synthesis.TextOnlySynthesis`; "w/o CLC" and "w/o
WFBA" are ``systems.depth_policy`` / ``systems.bandwidth_allocation`` (``conf/fedisyn_ablations_tiny.yaml``).

The ViT, the devices, the evaluation and the State's bookkeeping are those of the whole family
(:class:`~fl_lightning.algorithms.synthetic_family.family.FeDiSynFamily`, shared with the baselines SFLF,
CAFF, GPT-FL and FGL); this file declares FeDiSyn's section and its two stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from fl_lightning.algorithms.synthetic_family.family import FeDiSynFamily
from fl_lightning.algorithms.synthetic_family.finetune import LoRAFineTuning, LoRAFineTuningConfig
from fl_lightning.algorithms.synthetic_family.synthesis import (
    FeatureGuidedConfig,
    FeatureGuidedSynthesis,
    TextOnlySynthesis,
)
from fl_lightning.federation.algorithm import register
from fl_lightning.federation.policies.privacy_coverage import never_covered
from fl_lightning.federation.stages import Stage

__all__ = ["FeDiSyn", "FeDiSynConfig"]


@dataclass
class FeDiSynConfig(FeatureGuidedConfig, LoRAFineTuningConfig):
    """The ``fedisyn:`` section: feature-guided synthesis + LoRA fine-tuning (``lora.*``, ``systems.*``)."""


@register("fedisyn")
class FeDiSyn(FeDiSynFamily):
    """FeDiSyn: feature-guided synthesis, then LoRA fine-tuning with CLC and WFBA (see the module docstring)."""

    config_class = FeDiSynConfig

    privacy_gap = never_covered(
        "its synthesis round uploads class latents, counts and the number of centroids whose ε holds only "
        "under assumptions (docs/privacy.md, 'FeDiSyn's latents'), and its LoRA uploads carry per-block "
        "gradient contributions in the clear"
    )

    _synthesis = {"feature_guided": FeatureGuidedSynthesis, "text_only": TextOnlySynthesis}  # by `generation`

    @classmethod
    def stages_for(cls, config: FeDiSynConfig) -> tuple[type[Stage], ...]:
        return cls._synthesis[config.generation], LoRAFineTuning
