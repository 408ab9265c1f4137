"""GPT-FL (Zhang et al. 2023) as FeDiSyn's Benchmarks paragraph defines it.

    GPT-FL = synthesis (text-only) → full-parameter FedAvg
           labels → LLM prompts → text-only generation → server pre-training → full-parameter FedAvg

Round 0 (:class:`~fl_lightning.algorithms.synthetic_family.synthesis.TextOnlySynthesis`): each client uploads its
class counts D_i^k (C int64 scalars, counted in the traffic); the server expands the label names into
prompts (``llm_path``: a local causal LM, the paper's LLaMA-7B; null: templates), generates round(λ·D^k)
images per class from pure noise and the prompts only and pre-trains the ViT on them, as FeDiSyn does.
Rounds 1..T (:class:`FullFedAvg`): every device trains ALL weights of the ViT (backbone and head) for
E epochs and uploads them; the server averages them weighted by data size, and the next download is
the whole model again. The ranks fold the uploads where they are trained, in client order (the server's
fold, bit for bit: federation/ranks/summed_uploads.py), so no upload is written to the run folder. Its traffic
counts in ``bytes_up``/``bytes_down``, and the channel model times each device's upload of the whole
model (32 bits per parameter) under the equal split B/N — the baselines have no allocation of their own
(``systems/calibration.py``). Round 0's counts are charged on the channel clock like any upload, and
generation and pre-training on the server profile.

Departures (said here, not hidden): the volume per class is FeDiSyn's λ·D^k, so that the comparison
changes the generation and the fine-tuning only (GPT-FL fixes a number of images per class; knowing
D^k costs C scalars per client). Memory: the device model prices LoRA blocks, not full-parameter
training, so every device trains the whole model and ``over_memory_clients`` only says which devices
could not even hold all LoRA blocks. The family's ViT carries LoRA adapters (``lora.*``) at peft's
zero-effect init; they are frozen here but travel in the downloads.

Config: the ``gptfl:`` section holds the keys of its two stages only — text-only synthesis
(``synthesis.TextOnlyConfig``) and fine-tuning (``finetune_lr``, ``systems``, ``lora``, the ViT keys);
``generation`` is ``text_only``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from fl_lightning.algorithms.synthetic_family.config import SystemsConfig
from fl_lightning.algorithms.synthetic_family.family import FeDiSynFamily
from fl_lightning.algorithms.synthetic_family.finetune import FineTuningConfig, FineTuningStage
from fl_lightning.algorithms.synthetic_family.model import (
    BACKBONE,
    HEAD,
    LORA,
    backbone_state,
    bits,
    strip,
    with_prefix,
)
from fl_lightning.algorithms.synthetic_family.synthesis import TextOnlyConfig, TextOnlySynthesis
from fl_lightning.federation.algorithm import Client, State, register
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.policies.privacy_coverage import never_covered
from fl_lightning.federation.ranks.summed_uploads import UploadSum, summed_mean
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.models.lora import is_lora_param, lora_bits_per_layer

__all__ = ["GPTFL", "GPTFLConfig", "FullFedAvg", "FullFedAvgConfig", "FullFedAvgSystemsConfig"]


@dataclass
class FullFedAvgSystemsConfig(SystemsConfig):
    """The system model of a full-parameter FedAvg baseline: every device trains all blocks, B/N split."""

    depth_policy: Literal["full"] = "full"
    bandwidth_allocation: Literal["wfba", "equal"] = "equal"


@dataclass
class FullFedAvgConfig(FineTuningConfig):
    finetune_lr: float = 1e-4  # AdamW on ALL weights: a smaller step than LoRA's
    systems: FullFedAvgSystemsConfig = field(default_factory=FullFedAvgSystemsConfig)


class FullFedAvg(FineTuningStage):
    """Full-parameter FedAvg: Σ n_k w_k / Σ n_k per backbone and head tensor, the whole model every round."""

    config_class = FullFedAvgConfig

    def ensure_backbone(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.method.load_backbone(tensors)  # it changes every round

    def payload_bits(self, state: State) -> dict[str, float]:
        return {
            "layer_bits": float(lora_bits_per_layer(strip(LORA, state))),
            "full_model_bits": bits(strip(BACKBONE, state)) + bits(strip(HEAD, state)),
        }

    def sends(self, key: str, round_idx: int) -> bool:
        return key.startswith((LORA, HEAD, BACKBONE))

    def train(self, client: Client, download: Download, loader) -> dict[str, torch.Tensor]:
        m = self.method
        for name, param in m.module.model.named_parameters():
            param.requires_grad_(not is_lora_param(name))  # every weight but the (zero-effect) adapters
        fit_local(m.fabric, m.module, loader, epochs=m.cfg.train.epochs)
        return {**with_prefix(BACKBONE, backbone_state(m.module)), **with_prefix(HEAD, strip(HEAD, m.module.head_state()))}

    def summed_uploads(self, round_idx: int) -> UploadSum:
        """The whole model, weighted by n_k: the ranks fold it where it is trained (federation/ranks/summed_uploads.py)."""
        return UploadSum((BACKBONE, HEAD))

    def fold(self, round_idx: int, state: State, uploads: Mapping[int, Upload]) -> State:
        """Folded in client order (memory: one model's running sum, flat in K), on the host."""
        mean = summed_mean(uploads, self.summed_uploads(round_idx))
        return {k: v.cpu() for k, v in mean.result().items()} if mean.total_weight > 0 else {}

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {**super().summary_extras(state), "depth_policy": "full (full-parameter FedAvg)", "train_head": True}


@dataclass
class GPTFLConfig(TextOnlyConfig, FullFedAvgConfig):
    """The ``gptfl:`` section: text-only synthesis + full-parameter FedAvg."""


@register("gptfl")
class GPTFL(FeDiSynFamily):
    """Text-only synthetic pre-training, then full-parameter FedAvg (see the module docstring)."""

    config_class = GPTFLConfig

    privacy_gap = never_covered("its synthesis round uploads each client's class counts D_i^k in the clear")

    stages = (TextOnlySynthesis, FullFedAvg)
