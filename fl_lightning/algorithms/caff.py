"""CAFF — the capacity-aware federated fine-tuning baseline of FeDiSyn's Benchmarks paragraph.

    CAFF = ImageNet init → LoRA fine-tuning (capacity-proportional depths, equal bandwidth)

As the paper defines it: the ViT starts from ImageNet weights (no synthetic data) and each device
LoRA-tunes a depth proportional to its compute capability, 1 / (h̄_i + L h_i): the fastest device
gets all L blocks, device i round(L · cap_i / max cap) (``systems.clc.capacity_depths``), capped by
its memory and reported when capped. Uploads share the bandwidth equally (B/N), as the channel
calibration assumes for every baseline (``systems/calibration.py``). The head: CAFF's ImageNet model gets a
fresh C-way head, which trains with LoRA (``train_head: auto``) and travels in every upload. Everything
else is FeDiSyn's fine-tuning stage.

Config: the ``caff:`` section holds the keys of its two stages (``pretrain_model``,
``pretrain_checkpoint`` = the local ImageNet weights, ``finetune_lr``, ``train_head``, ``lora.*``,
``systems.*``); a synthesis key is an unknown key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fl_lightning.algorithms.synthetic_family.config import BaselineSystemsConfig
from fl_lightning.algorithms.synthetic_family.family import FeDiSynFamily
from fl_lightning.algorithms.synthetic_family.finetune import (
    LORA_UPLOADS_GAP,
    ImageNetInit,
    ImageNetInitConfig,
    LoRAFineTuning,
    LoRAFineTuningConfig,
)
from fl_lightning.federation.algorithm import register
from fl_lightning.federation.policies.privacy_coverage import never_covered

__all__ = ["CAFF", "CAFFConfig", "CAFFSystemsConfig"]


@dataclass
class CAFFSystemsConfig(BaselineSystemsConfig):
    """``caff.systems``: FeDiSyn's system model with this baseline's defaults (equal bandwidth)."""

    depth_policy: Literal["clc", "capacity", "full", "fixed"] = "capacity"


@dataclass
class CAFFConfig(ImageNetInitConfig, LoRAFineTuningConfig):
    systems: CAFFSystemsConfig = field(default_factory=CAFFSystemsConfig)


@register("caff")
class CAFF(FeDiSynFamily):
    """FeDiSyn's fine-tuning from ImageNet weights at capacity-proportional depths (see the module docstring)."""

    config_class = CAFFConfig

    privacy_gap = never_covered(LORA_UPLOADS_GAP)

    stages = (ImageNetInit, LoRAFineTuning)
