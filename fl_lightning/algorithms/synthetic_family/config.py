"""The config pieces shared by the FeDiSyn family's stages: the ViT, the LoRA adapters and the system model.

Each stage declares the keys it reads (``synthesis.py``: generation and pre-training; ``finetune.py``:
fine-tuning); a method's section is composed from its stages' dataclasses (``federation/stages.py``),
so a key that none of its stages reads is an unknown-key error.

Which core keys the FeDiSyn family uses (the rest are documented here, not silently read):

* ``data.*``, ``partition.*``, ``federation.*`` (``rounds`` = T fine-tuning rounds after the synthesis
  round, when there is one), ``logging.*``;
* ``train.epochs`` and ``train.batch_size`` for local fine-tuning;
* NOT ``train.optimizer``, ``train.lr``, ``train.momentum``, ``train.weight_decay``: fine-tuning uses
  AdamW at ``<method>.finetune_lr`` (the paper's choice); pre-training has its own ``pretrain_*`` keys;
* NOT the ``model`` section: the ViT is ``<method>.pretrain_model`` (timm), initialised from
  ``pretrain_checkpoint`` or at random (and pre-trained on synthetic images where a synthesis stage runs).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Literal

from fl_lightning.errors import check
from fl_lightning.federation.stages import StageConfig
from fl_lightning.systems.channel import REFERENCE_LOSS_DB

__all__ = ["ViTConfig", "LoraConfig", "SystemsConfig", "BaselineSystemsConfig"]


@dataclass
class LoraConfig:
    rank: int = 8  # r: the paper's adapters (same rank for every method compared)
    alpha: float = 16.0  # update scale alpha / r = 2, peft's common default ratio
    dropout: float = 0.0  # none: local data are small and the rounds few
    # dotted names: a bare "proj" would also catch timm's patch_embed.proj
    target_modules: list = field(default_factory=lambda: ["attn.qkv", "attn.proj"])

    def __post_init__(self) -> None:
        check(self.rank >= 1, "rank", self.rank, "an int >= 1")
        check(self.alpha > 0, "alpha", self.alpha, "a float > 0")
        check(0 <= self.dropout < 1, "dropout", self.dropout, "a float in [0, 1)")
        check(
            len(self.target_modules) > 0 and all(isinstance(m, str) for m in self.target_modules),
            "target_modules",
            self.target_modules,
            "a non-empty list of dotted module names",
        )


_PROFILE_FIELDS = (
    "forward_time_s",
    "backward_time_per_layer_s",
    "fixed_memory_gb",
    "memory_per_layer_gb",
    "memory_budget_gb",
    "transmit_power_w",
)


@dataclass
class SystemsConfig:
    boards: str | list = "paper_testbed"  # the paper's 10 boards, cycled over the clients; or a list of profile names
    devices: str | list | None = None  # the former name of `boards` (still accepted, with a hint); null
    profiles: dict = field(default_factory=dict)  # {profile name: {field: value}} overrides of the calibrated boards
    # the ViT the boards are priced for (systems/backbones.py); null: <method>.pretrain_model (a tiny test model
    # built with pretrain_overrides is priced as the backbone it is named after)
    backbone: str | None = None
    timing: Literal["profiles", "measured"] = "profiles"  # measured: h̄, h fitted to this host's client compute times
    # clc = FeDiSyn; capacity = CAFF; full = SFLF; fixed. A device whose memory holds fewer blocks than the
    # policy asks for trains what it can hold and is reported (metrics.csv over_memory_devices, summary.json)
    depth_policy: Literal["clc", "capacity", "full", "fixed"] = "clc"
    fixed_depth: int = 1  # x of the `fixed` policy
    bandwidth_allocation: Literal["wfba", "equal"] = "wfba"  # equal = B/N, the "w/o WFBA" ablation
    radius_m: float = 50.0  # radius of the disc the devices are dropped in, uniformly (m; paper: 50)
    center_x_m: float = 300.0  # distance from the server to that disc's centre (m; paper: 300)
    path_loss_exponent: float = 3.5  # (d / d0)^-3.5 large-scale fading
    d0_m: float = 10.0  # d0, the path-loss model's reference distance (m)
    noise_power_w: float = 1e-11  # sigma^2
    total_bandwidth_hz: float = 10e6  # B = 10 MHz shared by FDMA
    reference_loss_db: float = REFERENCE_LOSS_DB  # PL0 at d0, calibrated on the paper's CAFF time (systems/channel.py)
    placement_seed: int = 0  # its own seed: the same device positions whatever the training seed

    def __post_init__(self) -> None:
        from fl_lightning.systems.devices import PROFILES

        if self.devices is not None:  # `devices` means ranks in `federation`; here the boards are `boards`
            check(
                self.boards == "paper_testbed",
                "devices",
                self.devices,
                "null when `boards` is given (`devices` is the former name of `boards`)",
            )
            warnings.warn(
                "fedisyn.systems.devices is now called fedisyn.systems.boards; the former name still works",
                FutureWarning,
                stacklevel=2,
            )
            self.boards, self.devices = self.devices, None
        if isinstance(self.boards, str):
            check(self.boards == "paper_testbed", "boards", self.boards, "'paper_testbed' or a list of profile names")
        else:
            names = sorted(PROFILES) + sorted(set(self.profiles) - set(PROFILES))
            bad = [d for d in self.boards if d not in names]
            check(len(self.boards) > 0 and not bad, "boards", self.boards, f"a non-empty list of profile names from {names}")
        for name, fields in self.profiles.items():
            check(
                isinstance(fields, dict) and set(fields) <= set(_PROFILE_FIELDS),
                f"profiles.{name}",
                fields,
                f"a mapping with keys among {list(_PROFILE_FIELDS)}",
            )
            check(
                name in PROFILES or set(fields) == set(_PROFILE_FIELDS),
                f"profiles.{name}",
                fields,
                f"all of {list(_PROFILE_FIELDS)} for a new profile (known: {sorted(PROFILES)})",
            )
            for key, value in fields.items():
                floor = 0.0 if key == "fixed_memory_gb" else math.ulp(0.0)  # m̄ may be 0; the others are > 0
                check(
                    _is_number(value) and math.isfinite(value) and value >= floor,
                    f"profiles.{name}.{key}",
                    value,
                    "a finite float >= 0" if key == "fixed_memory_gb" else "a finite float > 0",
                )
            board = replace(PROFILES[name], **fields) if name in PROFILES else None
            if board is not None or set(fields) == set(_PROFILE_FIELDS):
                m_bar = board.fixed_memory_gb if board else fields["fixed_memory_gb"]
                m = board.memory_per_layer_gb if board else fields["memory_per_layer_gb"]
                budget = board.memory_budget_gb if board else fields["memory_budget_gb"]
                check(
                    m_bar + m <= budget,
                    f"profiles.{name}.memory_budget_gb",
                    budget,
                    f"a budget that holds one LoRA block: >= fixed_memory_gb + memory_per_layer_gb = {m_bar + m:g}",
                )
        if self.backbone is not None:
            from fl_lightning.systems.backbones import BACKBONES

            check(self.backbone.split(".")[0] in BACKBONES, "backbone", self.backbone, f"null or one of {sorted(BACKBONES)}")
        check(self.fixed_depth >= 1, "fixed_depth", self.fixed_depth, "an int >= 1")
        check(self.radius_m > 0, "radius_m", self.radius_m, "a float > 0")
        check(self.center_x_m > self.radius_m, "center_x_m", self.center_x_m, "a float > radius_m (server outside the disc)")
        check(self.path_loss_exponent > 0, "path_loss_exponent", self.path_loss_exponent, "a float > 0")
        check(self.d0_m > 0, "d0_m", self.d0_m, "a float > 0")
        check(self.noise_power_w > 0, "noise_power_w", self.noise_power_w, "a float > 0")
        check(self.total_bandwidth_hz > 0, "total_bandwidth_hz", self.total_bandwidth_hz, "a float > 0")
        check(
            _is_number(self.reference_loss_db) and math.isfinite(self.reference_loss_db),
            "reference_loss_db",
            self.reference_loss_db,
            "a finite float (dB of path loss at d0_m)",
        )


@dataclass
class BaselineSystemsConfig(SystemsConfig):
    """The system model of a LoRA baseline with no bandwidth allocation of its own (SFLF, CAFF): equal shares B/N;
    each baseline sets its ``depth_policy``."""

    bandwidth_allocation: Literal["wfba", "equal"] = "equal"  # the baselines have no allocation of their own


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class ViTConfig(StageConfig):
    """The timm ViT every stage of the FeDiSyn family trains (pre-training and fine-tuning)."""

    pretrain_model: str = "vit_base_patch16_224"  # the timm ViT that is pre-trained and fine-tuned
    pretrain_checkpoint: str | None = None  # local ImageNet weights file; null: random init
    pretrain_overrides: dict = field(default_factory=dict)  # timm.create_model kwargs (tiny test models)
