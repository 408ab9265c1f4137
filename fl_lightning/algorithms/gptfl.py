"""GPT-FL (Zhang et al. 2023) as FeDiSyn's Benchmarks paragraph defines it.

    labels → LLM prompts → text-only generation → server pre-training → full-parameter FedAvg

Round 0: each client uploads its class counts D_i^k (C int64 scalars, counted in the traffic); the
server expands the label names into prompts (``llm_path``: a local causal LM, the paper's LLaMA-7B;
null: templates), generates round(λ·D^k) images per class from pure noise and the prompts only
(``synthesis_step.text_only_requests``) and pre-trains the ViT on them, exactly as FeDiSyn does.
Rounds 1..T: full-parameter FedAvg — every device trains ALL weights of the ViT (backbone and head)
for E epochs and uploads them; the server averages them weighted by data size, and the next download
is the whole model again. Its traffic (uploads and downloads) counts in ``bytes_up``/``bytes_down``,
and the channel model times each device's upload of the whole model (32 bits per parameter) under the
equal split B/N — the baselines have no allocation of their own (``systems/channel.py``).

Departures (said here, not hidden): the volume per class is FeDiSyn's λ·D^k, so that the comparison
changes the generation and the fine-tuning only (GPT-FL fixes a number of images per class; knowing
D^k costs C scalars per client). Memory: the device model prices LoRA blocks, not full-parameter
training, so every device trains the whole model and ``over_memory_clients`` only says which devices
could not even hold all LoRA blocks.

Config: the ``gptfl:`` section takes FeDiSyn's keys; the latent-upload keys (``num_centroids``,
``timestep``, ``max_timestep``, ``rho``, ``encode_batch_size``), the LoRA section and ``train_head``
are not read (``summary.json``: ``ignored_method_keys``). ``generation`` must be ``text_only`` — set it
in a comparison variant, which carries the fedisyn section's keys over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fl_lightning.algorithms.fedisyn import FeDiSyn, FeDiSynConfig, SystemsConfig
from fl_lightning.algorithms.fedisyn.config import check
from fl_lightning.federation.algorithm import register

__all__ = ["GPTFL", "GPTFLConfig", "FullFedAvgSystemsConfig", "FULL_FEDAVG_UNUSED_KEYS"]

# FeDiSyn keys a full-parameter FedAvg method with text-only generation does not read
FULL_FEDAVG_UNUSED_KEYS = ("num_centroids", "timestep", "max_timestep", "rho", "encode_batch_size", "train_head",
                           "lora")


@dataclass
class FullFedAvgSystemsConfig(SystemsConfig):
    """The system model of a full-parameter FedAvg baseline: every device trains all blocks, B/N split."""

    depth_policy: Literal["full"] = "full"
    bandwidth_allocation: Literal["wfba", "equal"] = "equal"


@dataclass
class GPTFLConfig(FeDiSynConfig):
    generation: Literal["text_only"] = "text_only"  # labels → prompts → images, no client features
    finetune_lr: float = 1e-4  # AdamW on ALL weights: a smaller step than LoRA's
    systems: FullFedAvgSystemsConfig = field(default_factory=FullFedAvgSystemsConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.generation == "text_only", "generation", self.generation, "'text_only'")


@register("gptfl")
class GPTFL(FeDiSyn):
    """Text-only synthetic pre-training, then full-parameter FedAvg (see the module docstring)."""

    config_class = GPTFLConfig
    full_parameter = True
    ignored_keys = FULL_FEDAVG_UNUSED_KEYS
