"""SFLF — the "split-free LoRA fine-tuning" baseline of FeDiSyn's Benchmarks paragraph.

    SFLF = ImageNet init → LoRA fine-tuning (all blocks, equal bandwidth)

As the paper defines it: the ViT starts from ImageNet weights (no synthetic data, no server
pre-training) and every device LoRA-tunes ALL blocks; uploads share the bandwidth equally (B/N:
the baselines have no allocation of their own, the assumption behind the channel calibration in
``systems/calibration.py``); the fresh C-way head on the ImageNet model trains with LoRA (``train_head:
auto``) and travels in every upload. Everything else — the LoRA adapters, local training, block-wise FedAvg,
the simulated devices and channel — is FeDiSyn's fine-tuning stage, so the comparison changes only
what the paper changes.

Memory: a device that cannot hold all L blocks (at batch 32 the testbed's Orin NX boards hold 20 of ViT-L's 24)
trains as many as it holds; ``summary.json`` lists it in ``over_memory_clients`` with its
``requested_depths`` and ``memory_limits``, and ``metrics.csv`` counts ``over_memory_devices`` per round.

Config: the ``sflf:`` section holds the keys of its two stages (``pretrain_model``,
``pretrain_checkpoint`` = the local ImageNet weights, ``pretrain_overrides``, ``finetune_lr``,
``train_head``, ``lora.*``, ``systems.*``); a synthesis key (``--sflf.rho``) is an unknown key.
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

__all__ = ["SFLF", "SFLFConfig", "SFLFSystemsConfig"]


@dataclass
class SFLFSystemsConfig(BaselineSystemsConfig):
    """``sflf.systems``: FeDiSyn's system model with this baseline's defaults (equal bandwidth)."""

    depth_policy: Literal["clc", "capacity", "full", "fixed"] = "full"


@dataclass
class SFLFConfig(ImageNetInitConfig, LoRAFineTuningConfig):
    systems: SFLFSystemsConfig = field(default_factory=SFLFSystemsConfig)


@register("sflf")
class SFLF(FeDiSynFamily):
    """FeDiSyn's fine-tuning from ImageNet weights, all blocks on every device (see the module docstring)."""

    config_class = SFLFConfig

    privacy_gap = never_covered(LORA_UPLOADS_GAP)

    stages = (ImageNetInit, LoRAFineTuning)
