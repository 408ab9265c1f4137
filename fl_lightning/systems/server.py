"""The server of the FeDiSyn system model: generation and pre-training time per image (the paper: an RTX 4090).

Generation and pre-training run on the server, not on the simulating host: the simulated clock charges

    H_gene = Σ_images ĥ(s),     ĥ(s) = n(s) · t_step + t_decode,   n(s) = ceil(K · (s + 1) / T)
    H_pre  = h̃ · images · epochs,   h̃ = 3 · MACs · 2 / F_eff

with K = ``num_inference_steps`` PNDM steps over the T = 1000 training timesteps (a chain started at
s runs about K·s/T of them, as ``synthesis/generate.py`` slices the schedule; a text-only image starts
at T − 1 and runs all K), t_step one classifier-free-guided UNet step of SD v1-5 at 512 px (a batch of
2 through the UNet), t_decode the VAE decode, MACs the backbone's forward (``backbones.py``), the
factor 3 forward + backward, 2 FLOP per MAC, and F_eff the card's effective training throughput. The
host's own wall times are reported beside these (``summary.json``), never mixed into the clock.

==============================  ==========  ====================================================
RTX 4090 (default)              value       source / derivation
==============================  ==========  ====================================================
t_step, SD v1-5 512 px, fp16    33 ms       ~30 it/s: an RTX 3090 runs SD 1.5 at 512 px at
                                            16.5 it/s with diffusers + xformers (HF forum
                                            report); the 4090 has 2.3× its FP16 tensor
                                            throughput (165 vs 71 TFLOP/s), discounted to 1.8×
t_decode                        40 ms       VAE decode of one 64×64 latent (~1.2 UNet steps)
F_eff                           66 TFLOP/s  40 % of the 4090's 165 TFLOP/s dense BF16 tensor
                                            peak (NVIDIA Ada whitepaper)
h̃, ViT-B/16 / ViT-L/16         1.6 / 5.6   3 · 17.6 G (61.6 G) MAC · 2 / 66 TFLOP/s
                                ms
ĥ, feature-guided, s ~ U[0,     0.54 s      15 of 50 steps on average (s ≤ S = 600) + decode
600]
ĥ, text-only                    1.69 s      50 steps + decode (~0.6 images/s: the 3 s per image
                                            of an A10, Deci's SD v1-5 table, / 1.8)
==============================  ==========  ====================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fl_lightning.systems.backbones import Backbone

__all__ = ["ServerProfile", "RTX_4090", "SERVERS", "generation_steps", "generation_time", "pretrain_time_per_image_epoch"]

_TRAIN_TIMESTEPS = 1000  # SD v1-5's T


@dataclass(frozen=True)
class ServerProfile:
    """The server GPU's cost model (see the module docstring).

    Args:
        name: profile name.
        unet_step_s: t_step, one guided UNet step of one 512 px image (s).
        decode_s: t_decode, one VAE decode (s).
        train_flops_per_s: F_eff, effective training throughput (FLOP/s).
    """

    name: str
    unet_step_s: float
    decode_s: float
    train_flops_per_s: float

    def __post_init__(self) -> None:
        for key in ("unet_step_s", "decode_s", "train_flops_per_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"ServerProfile {self.name!r}: {key} must be a finite float > 0, got {value!r}")


RTX_4090 = ServerProfile("rtx_4090", unet_step_s=0.033, decode_s=0.040, train_flops_per_s=66e12)
"""The paper's server (module docstring)."""

SERVERS: dict[str, ServerProfile] = {"rtx_4090": RTX_4090}


def generation_steps(timestep: int, num_inference_steps: int) -> int:
    """n(s): PNDM steps a chain started at timestep s runs, ceil(K (s + 1) / T), at least 1."""
    if not 0 <= timestep < _TRAIN_TIMESTEPS:
        raise ValueError(f"generation_steps: timestep must be an int in [0, {_TRAIN_TIMESTEPS - 1}], got {timestep!r}")
    if num_inference_steps < 1:
        raise ValueError(f"generation_steps: num_inference_steps must be >= 1, got {num_inference_steps!r}")
    return max(1, math.ceil(num_inference_steps * (timestep + 1) / _TRAIN_TIMESTEPS))


def generation_time(server: ServerProfile, timesteps: list[int] | tuple[int, ...], num_inference_steps: int) -> float:
    """H_gene = Σ_images (n(s) t_step + t_decode) for images started at the given timesteps (s)."""
    steps = sum(generation_steps(int(s), num_inference_steps) for s in timesteps)
    return float(steps * server.unet_step_s + len(timesteps) * server.decode_s)


def pretrain_time_per_image_epoch(server: ServerProfile, backbone: Backbone) -> float:
    """h̃ = 3 · MACs · 2 / F_eff: one image's forward and backward through the whole ViT (s)."""
    return float(3.0 * backbone.forward_macs * 2.0 / server.train_flops_per_s)
