"""The system model against the paper's own Food-101 numbers (§6): one pure function, no training.

The paper reports, for Food-101 with ViT-L/16 on the 10-device testbed, each method's time to 80 %
(IID) and its uploaded traffic (non-IID), and FeDiSyn's generation time at λ* on its RTX 4090 server:

=========  ==============  ==============  ================================================
method     time to 80 %    traffic         what the model charges (:func:`paper_consistency`)
=========  ==============  ==============  ================================================
FeDiSyn    17,584 s        7.4 MB          generation 10,100 s (the paper's) + pre-training
                                           of the λ*·D images it implies + the latent
                                           upload (WFBA) + R rounds of CLC + WFBA
CAFF       31,905 s        262.1 MB        R rounds: capacity depths + the trained head, B/N
SFLF       41,885 s        399.5 MB        R rounds: all blocks memory allows + head, B/N
FGL        44,783 s        12,002.8 MB     captioning + caption upload + generation (text-
                                           only, same λ*·D) + pre-training + R rounds of
                                           full-parameter FedAvg, B/N
GPT-FL     45,383 s        13,676.3 MB     generation (text-only) + pre-training + R rounds
                                           of full-parameter FedAvg, B/N
=========  ==============  ==============  ================================================

R = the reported traffic over the traffic of one round at the method's depths, at least 1 (the paper's traffic is
the fine-tuning uploads: FeDiSyn's 7.4 MB cannot hold its 0.3 GB of fp32 latents, so the synthesis
upload is charged on the clock but not counted in R). Assumptions, all pessimistic for the check
(they make the model's time longer): IID needs as many rounds as the non-IID traffic implies; one
local epoch over 75,750 / 10 = 7,575 images per device at batch 32; every client holds all 101
classes (IID: the most latents); CLC's contributions are D_i / ΣD · w_l with w rising geometrically
from 0.2 to 1 over the blocks; captions 64 B each; captioning costs twice a ViT-B/16 forward at 384 px.

Every ratio model / paper must be ≤ 1 (``paper_consistency_worst``): the model may not make a method
slower than the paper measured it. The channel's PL0 (the one constant the paper does not give) is
:func:`fit_reference_loss`: the largest loss, on a 0.5 dB grid, for which all ratios hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fl_lightning.systems.backbones import Backbone, backbone, head_params, lora_params_per_block
from fl_lightning.systems.channel import ChannelConfig, device_spectral_efficiency
from fl_lightning.systems.clc import policy_depths
from fl_lightning.systems.devices import board_profiles, paper_testbed, profile_arrays
from fl_lightning.systems.server import (
    RTX_4090,
    ServerProfile,
    generation_steps,
    pretrain_time_per_image_epoch,
)
from fl_lightning.systems.wfba import allocate_bandwidth, equal_bandwidth

__all__ = ["PaperFigures", "FOOD101", "MethodCheck", "paper_consistency", "fit_reference_loss", "latent_upload_bytes"]

_MB = 1e6


@dataclass(frozen=True)
class PaperFigures:
    """What the paper reports for one data set (§6) and the setting it ran."""

    backbone: str = "vit_large_patch16_224"
    num_classes: int = 101
    train_images: int = 75_750
    num_devices: int = 10
    batch_size: int = 32
    lora_rank: int = 8
    time_to_target_s: tuple[tuple[str, float], ...] = (
        ("fedisyn", 17_584.0),
        ("caff", 31_905.0),
        ("sflf", 41_885.0),
        ("fgl", 44_783.0),
        ("gptfl", 45_383.0),
    )
    traffic_mb: tuple[tuple[str, float], ...] = (
        ("fedisyn", 7.4),
        ("caff", 262.1),
        ("sflf", 399.5),
        ("fgl", 12_002.8),
        ("gptfl", 13_676.3),
    )
    fedisyn_generation_s: float = 10_100.0  # at λ*, on the RTX 4090
    # the config defaults the model charges
    num_centroids: int = 4  # Z
    max_timestep: int = 600  # S
    num_inference_steps: int = 50
    latent_shape: tuple[int, int, int] = (4, 64, 64)  # SD v1-5 at 512 px
    pretrain_epochs: int = 10
    caption_bytes: int = 64
    max_lambda: float = 1.0  # the λ range of the paper's scaling-law study


FOOD101 = PaperFigures()


@dataclass(frozen=True)
class MethodCheck:
    """One method's model time next to the paper's."""

    method: str
    model_time_s: float
    paper_time_s: float
    rounds: float
    round_time_s: float
    server_s: float
    synthesis_upload_s: float
    depths: list[int]

    @property
    def ratio(self) -> float:
        return self.model_time_s / self.paper_time_s


def latent_upload_bytes(num_centroids: int, latent_shape: tuple[int, ...]) -> int:
    """One client-class upload: Z noised centroids + the noised mean (fp32) + label, count, timestep, Z' (64-bit),
    as ``synthesis.latents.ClassLatentUpload.num_bytes`` counts it."""
    return int((num_centroids + 1) * math.prod(latent_shape) * 4 + 4 * 8)


def _feature_guided_image_s(server: ServerProfile, p: PaperFigures) -> float:
    """Mean ĥ over s uniform in [0, S] (FeDiSyn's random per-class timestep)."""
    steps = np.mean([generation_steps(s, p.num_inference_steps) for s in range(p.max_timestep + 1)])
    return float(steps * server.unet_step_s + server.decode_s)


def _text_only_image_s(server: ServerProfile, p: PaperFigures) -> float:
    return float(generation_steps(999, p.num_inference_steps) * server.unet_step_s + server.decode_s)


def paper_consistency(
    *,
    reference_loss_db: float,
    paper: PaperFigures = FOOD101,
    server: ServerProfile = RTX_4090,
    channel: ChannelConfig | None = None,
) -> dict[str, Any]:
    """Each method's model time to the paper's target against the paper's, and the worst ratio.

    Args:
        reference_loss_db: PL0 of the channel (dB at d0).
        paper: the reported figures and setting.
        server: the server's cost model.
        channel: the other channel constants (default: the paper's, ``ChannelConfig()``).

    Returns:
        ``{"checks": {method: MethodCheck}, "worst": max ratio, "worst_method": ..., "lambda_star": the λ*
        the paper's generation time implies, "lambda_ratio": λ* / max_lambda, "spectral_efficiency": [...]}``.
    """
    vit: Backbone = backbone(paper.backbone)
    L, N = vit.depth, paper.num_devices
    channel = replace(channel or ChannelConfig(), reference_loss_db=reference_loss_db)
    arrays = profile_arrays(paper_testbed(board_profiles(vit, paper.batch_size, lora_rank=paper.lora_rank)))
    _, e = device_spectral_efficiency(arrays["transmit_power_w"], config=channel, seed=0)
    B = channel.total_bandwidth_hz
    D = np.full(N, paper.train_images / N)  # one local epoch
    tau = 32.0 * lora_params_per_block(vit.embed_dim, paper.lora_rank)  # bits per LoRA block
    head_bits = 32.0 * head_params(vit.embed_dim, paper.num_classes)
    model_bits = 32.0 * vit.params(paper.num_classes)
    timing = dict(forward_time_s=arrays["forward_time_s"], backward_time_per_layer_s=arrays["backward_time_per_layer_s"])
    memory = {k: arrays[k] for k in ("fixed_memory_gb", "memory_per_layer_gb", "memory_budget_gb")}
    w = np.geomspace(0.2, 1.0, L)
    contributions = (D / D.sum())[:, None] * w[None, :]

    # the server: the λ*·D images FeDiSyn's 10,100 s imply, pre-trained for T̂ epochs
    images = paper.fedisyn_generation_s / _feature_guided_image_s(server, paper)
    pretrain_s = images * paper.pretrain_epochs * pretrain_time_per_image_epoch(server, vit)
    lam_star = images / paper.train_images

    def rounds_of(policy: str, allocation: str, extra_bits: float, full: bool) -> tuple[np.ndarray, float, float]:
        x = policy_depths(
            policy,
            num_layers=L,
            **timing,
            **memory,
            contributions=contributions,
            num_samples=D,
            layer_bits=tau,
            spectral_efficiency=e,
            total_bandwidth_hz=B,
            allocation=allocation,
        ).depths
        x = np.full(N, L) if full else np.asarray(x)
        payload = np.full(N, model_bits) if full else tau * x + extra_bits
        compute = D * (arrays["forward_time_s"] + x * arrays["backward_time_per_layer_s"])
        allocate = allocate_bandwidth if allocation == "wfba" else equal_bandwidth
        _, T = allocate(compute, payload, e, B)
        return x, float(payload.sum()) / 8.0, float(T)

    def upload_s(bits_per_device: float, allocation: str) -> float:
        allocate = allocate_bandwidth if allocation == "wfba" else equal_bandwidth
        return float(allocate(np.zeros(N), np.full(N, bits_per_device), e, B)[1])

    latents = paper.num_classes * latent_upload_bytes(paper.num_centroids, paper.latent_shape) * 8.0
    counts = paper.num_classes * 8 * 8.0
    captions = (paper.train_images / N) * paper.caption_bytes * 8.0 + counts
    macs_per_s = vit.forward_macs / arrays["forward_time_s"]  # each board's effective MAC/s
    blip_macs = 2 * replace(backbone("vit_base_patch16_224"), image_size=384).forward_macs  # encoder + decoder
    caption_compute = float(np.max(D * blip_macs / macs_per_s))  # FGL: every device captions its images
    text_gen = images * _text_only_image_s(server, paper)
    setting = {  # method: (policy, allocation, head bits, full-parameter, server s, synthesis upload s)
        "fedisyn": ("clc", "wfba", 0.0, False, paper.fedisyn_generation_s + pretrain_s, upload_s(latents, "wfba")),
        "caff": ("capacity", "equal", head_bits, False, 0.0, 0.0),
        "sflf": ("full", "equal", head_bits, False, 0.0, 0.0),
        "fgl": ("full", "equal", 0.0, True, text_gen + pretrain_s, caption_compute + upload_s(captions, "equal")),
        "gptfl": ("full", "equal", 0.0, True, text_gen + pretrain_s, upload_s(counts, "equal")),
    }
    paper_time, traffic = dict(paper.time_to_target_s), dict(paper.traffic_mb)
    checks = {}
    for method, (policy, allocation, extra, full, server_s, synth_s) in setting.items():
        x, round_bytes, T = rounds_of(policy, allocation, extra, full)
        R = max(traffic[method] * _MB / round_bytes, 1.0)  # at least the one round that sends anything
        checks[method] = MethodCheck(
            method, server_s + synth_s + R * T, paper_time[method], R, T, server_s, synth_s, [int(v) for v in x]
        )
    worst = max(checks.values(), key=lambda c: c.ratio)
    return {
        "checks": checks,
        "worst": max(worst.ratio, lam_star / paper.max_lambda),
        "worst_method": worst.method,
        "lambda_star": lam_star,
        "lambda_ratio": lam_star / paper.max_lambda,
        "synthetic_images": images,
        "pretraining_s": pretrain_s,
        "spectral_efficiency": e.tolist(),
    }


def fit_reference_loss(
    *,
    paper: PaperFigures = FOOD101,
    server: ServerProfile = RTX_4090,
    low_db: float = 0.0,
    high_db: float = 100.0,
    step_db: float = 0.5,
) -> float:
    """PL0: the largest loss on a ``step_db`` grid in [low, high] at which every ratio is ≤ 1.

    A larger loss only slows every upload, so the worst ratio rises with PL0 and the grid is bisected.

    Raises:
        ValueError: not even ``low_db`` satisfies the checks (the devices or the server alone are too slow).
    """

    def ok(k: int) -> bool:
        loss = low_db + k * step_db
        return paper_consistency(reference_loss_db=loss, paper=paper, server=server)["worst"] <= 1.0

    lo, hi = 0, int(round((high_db - low_db) / step_db))
    if not ok(lo):
        raise ValueError(
            "no reference loss in range makes the model as fast as the paper: the compute or server "
            "model alone exceeds a reported time"
        )
    if ok(hi):
        return float(high_db)
    while hi - lo > 1:  # invariant: ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return float(low_db + lo * step_db)
