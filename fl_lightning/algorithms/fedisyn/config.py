"""FeDiSyn's configuration: the ``fedisyn:`` section, with the LoRA adapters and the system model nested.

Which core keys FeDiSyn uses (the rest are documented, never silently ignored):

* ``data.*``, ``partition.*``, ``federation.*`` (``rounds`` = T LoRA rounds after round 0), ``logging.*``;
* ``train.epochs`` and ``train.batch_size`` for local LoRA fine-tuning;
* NOT ``train.optimizer``, ``train.lr``, ``train.momentum``, ``train.weight_decay``: LoRA fine-tuning
  uses AdamW at ``fedisyn.finetune_lr`` (the paper's choice); pre-training has its own
  ``fedisyn.pretrain_*`` keys;
* NOT the ``model`` section: the ViT is ``fedisyn.pretrain_model`` (timm), initialised from
  ``fedisyn.pretrain_checkpoint`` or at random and pre-trained on synthetic images.

:data:`UNUSED_CORE_KEYS` lists the ignored keys; the run records them in ``summary.json``
(``ignored_core_keys``).

The paper's ablations are switches of this section (``conf/fedisyn_ablations_tiny.yaml``):

* w/o FG — ``generation: text_only``: images from pure noise and the same prompts, then the same
  LoRA fine-tuning (clients upload class counts only);
* w/o CLC — ``systems.depth_policy: capacity`` (or ``fixed``): depths that ignore the contributions;
* w/o WFBA — ``systems.bandwidth_allocation: equal``: B/N instead of water-filling.

w/o DM (a class-conditional GAN trained on the server from the uploads) is NOT implemented. The
server holds Z + 1 noised latents per (client, class) — about 50 per class on the paper's testbed,
noised to timestep s — which is far too little, and too noisy, to train a conditional GAN that
stands in for Stable Diffusion at 224 px; the paper does not give the GAN's architecture or
training budget, so any choice would be ours, not the ablation it reports, and the tiny offline
models could not show whether it is right. Adding it means a ``generation: gan`` branch with its
own generator/discriminator module and a GPU budget to validate it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from fl_lightning.config import check
from fl_lightning.systems.channel import REFERENCE_LOSS_DB

__all__ = ["FeDiSynConfig", "LoraConfig", "SystemsConfig", "UNUSED_CORE_KEYS", "SYNTHESIS_KEYS"]

# core keys FeDiSyn does not read (see the module docstring)
UNUSED_CORE_KEYS = ("train.optimizer", "train.lr", "train.momentum", "train.weight_decay", "model")


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
        check(len(self.target_modules) > 0 and all(isinstance(m, str) for m in self.target_modules),
               "target_modules", self.target_modules, "a non-empty list of dotted module names")


_PROFILE_FIELDS = ("forward_time_s", "backward_time_per_layer_s", "fixed_memory_gb", "memory_per_layer_gb",
                   "memory_budget_gb", "transmit_power_w")


@dataclass
class SystemsConfig:
    devices: str | list = "paper_testbed"  # the paper's 10 boards, cycled over the clients; or a list of profile names
    profiles: dict = field(default_factory=dict)  # {profile name: {field: value}} overrides of the calibrated boards
    timing: Literal["profiles", "measured"] = "profiles"  # measured: h̄, h fitted to this host's client compute times
    # clc = FeDiSyn; capacity = CAFF; full = SFLF; fixed. A device whose memory holds fewer blocks than the
    # policy asks for trains what it can hold and is reported (metrics.csv over_memory_devices, summary.json)
    depth_policy: Literal["clc", "capacity", "full", "fixed"] = "clc"
    fixed_depth: int = 1  # x of the `fixed` policy
    bandwidth_allocation: Literal["wfba", "equal"] = "wfba"  # equal = B/N, the "w/o WFBA" ablation
    radius_m: float = 50.0  # devices dropped uniformly in a 50 m disc ...
    center_x_m: float = 300.0  # ... centred 300 m from the server (paper setting)
    path_loss_exponent: float = 3.5  # (d / d0)^-3.5 large-scale fading
    d0_m: float = 10.0
    noise_power_w: float = 1e-11  # sigma^2
    total_bandwidth_hz: float = 10e6  # B = 10 MHz shared by FDMA
    reference_loss_db: float = REFERENCE_LOSS_DB  # PL0 at d0, calibrated on the paper's CAFF time (systems/channel.py)
    placement_seed: int = 0  # its own seed: the same device positions whatever the training seed

    def __post_init__(self) -> None:
        from fl_lightning.systems.devices import PROFILES

        if isinstance(self.devices, str):
            check(self.devices == "paper_testbed", "devices", self.devices,
                   "'paper_testbed' or a list of profile names")
        else:
            names = sorted(PROFILES) + sorted(set(self.profiles) - set(PROFILES))
            bad = [d for d in self.devices if d not in names]
            check(len(self.devices) > 0 and not bad, "devices", self.devices,
                   f"a non-empty list of profile names from {names}")
        for name, fields in self.profiles.items():
            check(isinstance(fields, dict) and set(fields) <= set(_PROFILE_FIELDS), f"profiles.{name}", fields,
                   f"a mapping with keys among {list(_PROFILE_FIELDS)}")
            check(name in PROFILES or set(fields) == set(_PROFILE_FIELDS), f"profiles.{name}", fields,
                   f"all of {list(_PROFILE_FIELDS)} for a new profile (known: {sorted(PROFILES)})")
            for key, value in fields.items():
                floor = 0.0 if key == "fixed_memory_gb" else math.ulp(0.0)  # m̄ may be 0; the others are > 0
                check(_is_number(value) and math.isfinite(value) and value >= floor, f"profiles.{name}.{key}", value,
                       "a finite float >= 0" if key == "fixed_memory_gb" else "a finite float > 0")
            board = replace(PROFILES[name], **fields) if name in PROFILES else None
            if board is not None or set(fields) == set(_PROFILE_FIELDS):
                m_bar = board.fixed_memory_gb if board else fields["fixed_memory_gb"]
                m = board.memory_per_layer_gb if board else fields["memory_per_layer_gb"]
                budget = board.memory_budget_gb if board else fields["memory_budget_gb"]
                check(m_bar + m <= budget, f"profiles.{name}.memory_budget_gb", budget,
                       f"a budget that holds one LoRA block: >= fixed_memory_gb + memory_per_layer_gb = {m_bar + m:g}")
        check(self.fixed_depth >= 1, "fixed_depth", self.fixed_depth, "an int >= 1")
        check(self.radius_m > 0, "radius_m", self.radius_m, "a float > 0")
        check(self.center_x_m > self.radius_m, "center_x_m", self.center_x_m, "a float > radius_m (server outside the disc)")
        check(self.path_loss_exponent > 0, "path_loss_exponent", self.path_loss_exponent, "a float > 0")
        check(self.d0_m > 0, "d0_m", self.d0_m, "a float > 0")
        check(self.noise_power_w > 0, "noise_power_w", self.noise_power_w, "a float > 0")
        check(self.total_bandwidth_hz > 0, "total_bandwidth_hz", self.total_bandwidth_hz, "a float > 0")
        check(_is_number(self.reference_loss_db) and math.isfinite(self.reference_loss_db), "reference_loss_db",
               self.reference_loss_db, "a finite float (dB of path loss at d0_m)")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class FeDiSynConfig:
    # --- resources (weights are read from local paths only) ---
    diffusion_path: str | None = None  # a diffusers SD v1-5 folder; null: tiny random components (tests)
    llm_path: str | None = None  # a causal LM folder for prompt expansion (paper: LLaMA-7B); null: templates
    # --- step 1: client latents ---
    vae_image_size: int = 512  # SD v1-5's native resolution: clients resize their images to it before encoding
    encode_batch_size: int = 16  # images per VAE call on a client
    num_centroids: int = 4  # Z k-means centroids per class per client
    timestep: int | None = None  # s; null: random in [0, max_timestep] per class
    max_timestep: int = 600  # S: above ~600 of 1000 the class content is mostly noise
    # --- step 1: server generation ---
    prompts_per_label: int = 8
    rho: float = 0.7  # Ē = ρ·e_z + (1−ρ)·e_avg
    guidance_scale: float = 7.5  # SD's usual classifier-free guidance
    num_inference_steps: int = 50  # PNDM steps of the full 0..T chain (a start at s runs ≈ 50·s/T)
    generation_batch_size: int = 16
    min_fresh_fraction: float = 0.25  # floor on each image's own share of its start noise (synthesis/generate.py)
    # feature_guided = FeDiSyn (denoise the clients' noised latents); text_only = pure noise + prompts (w/o FG)
    generation: Literal["feature_guided", "text_only"] = "feature_guided"
    diffusion_precision: Literal["auto", "float32", "float16", "bfloat16"] = "auto"  # auto: fp16 on GPU, fp32 on CPU
    synthetic_lambda: float | None = 1.0  # λ: synthetic images per real image; null → λ* of the scaling law
    scaling_kappa: list | None = None  # κ1..κ4 fitted on pilot runs (notebooks/fedisyn_scaling_law.ipynb)
    target_accuracy: float = 0.8  # Acc of λ* = (κ2 e^{κ3 Acc} / (h0 κ1))^{1/(κ2+1)}
    # ĥ and h̃ (s): null → measured on this host (wall time); numbers make the simulated clock reproducible
    generation_time_per_image_s: float | None = None
    pretrain_time_per_image_epoch_s: float | None = None
    # --- step 2: server pre-training ---
    pretrain_model: str = "vit_base_patch16_224"
    pretrain_checkpoint: str | None = None  # local ImageNet weights file; null: random init
    pretrain_overrides: dict = field(default_factory=dict)  # timm.create_model kwargs (tiny test models)
    pretrain_epochs: int = 10  # T̂
    pretrain_lr: float = 3e-4  # AdamW peak, cosine decay (ViT fine-tuning order)
    pretrain_batch_size: int = 64
    pretrain_holdout: float = 0.1  # held-out synthetic fraction for early stopping
    pretrain_patience: int = 3  # epochs without held-out improvement before stopping
    # --- step 3: LoRA fine-tuning (local epochs and batch size: the `train` section) ---
    finetune_lr: float = 1e-3  # AdamW on the LoRA adapters (and the head when train_head)
    # the paper fine-tunes LoRA only; true: the head trains too, is uploaded and averaged, and its bytes
    # count in the traffic and in the channel time of every device
    train_head: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)  # the adapters (fedisyn.lora.*)
    systems: SystemsConfig = field(default_factory=SystemsConfig)  # devices, channel, depth policy (fedisyn.systems.*)

    def __post_init__(self) -> None:
        check(self.vae_image_size >= 8 and self.vae_image_size % 8 == 0, "vae_image_size", self.vae_image_size, "a multiple of 8 (>= 8)")
        check(self.encode_batch_size >= 1, "encode_batch_size", self.encode_batch_size, "an int >= 1")
        check(self.num_centroids >= 1, "num_centroids", self.num_centroids, "an int >= 1")
        check(0 <= self.max_timestep < 1000, "max_timestep", self.max_timestep, "an int in [0, 999]")
        check(self.timestep is None or 0 <= self.timestep < 1000, "timestep", self.timestep,
               "null or an int in [0, 999]")
        check(self.prompts_per_label >= 1, "prompts_per_label", self.prompts_per_label, "an int >= 1")
        check(0 <= self.rho <= 1, "rho", self.rho, "a float in [0, 1]")
        check(self.guidance_scale >= 0, "guidance_scale", self.guidance_scale, "a float >= 0")
        check(1 <= self.num_inference_steps <= 1000, "num_inference_steps", self.num_inference_steps,
               "an int in [1, 1000]")
        check(self.generation_batch_size >= 1, "generation_batch_size", self.generation_batch_size, "an int >= 1")
        check(0 <= self.min_fresh_fraction < 1, "min_fresh_fraction", self.min_fresh_fraction, "a float in [0, 1)")
        check(self.synthetic_lambda is None or self.synthetic_lambda > 0, "synthetic_lambda",
               self.synthetic_lambda, "a float > 0 or null")
        check(self.scaling_kappa is None or len(self.scaling_kappa) == 4 and all(
            isinstance(k, (int, float)) and not isinstance(k, bool) for k in self.scaling_kappa),
               "scaling_kappa", self.scaling_kappa, "null or a list of 4 numbers [κ1, κ2, κ3, κ4]")
        check(self.scaling_kappa is None or all(math.isfinite(k) for k in self.scaling_kappa)
               and self.scaling_kappa[0] > 0 and self.scaling_kappa[1] > 0, "scaling_kappa", self.scaling_kappa,
               "finite [κ1, κ2, κ3, κ4] with κ1 > 0 and κ2 > 0 (otherwise H(λ) has no minimum: no λ*)")
        check(self.synthetic_lambda is not None or self.scaling_kappa is not None, "scaling_kappa",
               self.scaling_kappa, "[κ1, κ2, κ3, κ4] when synthetic_lambda is null (λ* needs the fitted law)")
        check(0 < self.target_accuracy <= 1, "target_accuracy", self.target_accuracy, "a float in (0, 1]")
        for key in ("generation_time_per_image_s", "pretrain_time_per_image_epoch_s"):
            value = getattr(self, key)
            check(value is None or value >= 0, key, value, "null or a float >= 0")
        check(self.pretrain_epochs >= 1, "pretrain_epochs", self.pretrain_epochs, "an int >= 1")
        check(self.pretrain_lr > 0, "pretrain_lr", self.pretrain_lr, "a float > 0")
        check(self.pretrain_batch_size >= 1, "pretrain_batch_size", self.pretrain_batch_size, "an int >= 1")
        check(0 < self.pretrain_holdout < 1, "pretrain_holdout", self.pretrain_holdout, "a float in (0, 1)")
        check(self.pretrain_patience >= 1, "pretrain_patience", self.pretrain_patience, "an int >= 1")
        check(self.finetune_lr > 0, "finetune_lr", self.finetune_lr, "a float > 0")




# keys of round 0's synthesis and pre-training: a baseline without them (SFLF, CAFF) does not read them (its
# summary.json lists them under ignored_method_keys; a comparison carries them over from the fedisyn section)
SYNTHESIS_KEYS = ("diffusion_path", "llm_path", "vae_image_size", "encode_batch_size", "num_centroids", "timestep",
                  "max_timestep", "prompts_per_label", "rho", "guidance_scale", "num_inference_steps",
                  "generation_batch_size", "min_fresh_fraction", "generation", "diffusion_precision",
                  "synthetic_lambda", "scaling_kappa", "target_accuracy", "generation_time_per_image_s",
                  "pretrain_time_per_image_epoch_s", "pretrain_epochs", "pretrain_lr", "pretrain_batch_size",
                  "pretrain_holdout", "pretrain_patience")

