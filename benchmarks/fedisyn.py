"""FeDiSyn performance figures, each against a baseline measured in the same run.

1. ``generation_images_per_s`` / ``generation_batched_speedup`` — server-side synthesis with the
   framework's sampler (:func:`~fl_lightning.synthesis.generate.denoise_latents` from a mid
   timestep s with PNDM, classifier-free guidance, then
   :func:`~fl_lightning.synthesis.generate.decode_latents`) on tiny random SD components
   (:func:`~fl_lightning.models.diffusion.tiny_diffusion_components`): images per second at a
   batch size, the per-image time ĥ, and the speedup of one batched chain over the same images
   generated one at a time.
2. ``upload_vs_raw_sd15`` / ``upload_vs_raw_tiny_vae`` — bytes a client uploads for one class
   (Z noised centroids + 1 noised mean + label, count, timestep) over the class's raw uint8 images.
   SD v1-5 (VAE ×8: 4×28×28 latents at 224 px, 4×64×64 at 512 px) is computed with the
   framework's own accounting (``ClassLatentUpload.num_bytes``); the tiny VAE (×2 only, so its
   latents are LARGER than the image) is measured end to end with ``client_latent_uploads``.
3. ``round_overhead`` — the server's per-round work (CLC depths + WFBA bandwidths for the paper's
   10-device testbed, 12 blocks; layer-wise averaging of 10 clients' LoRA states) as a percentage
   of the round's client compute (10 clients × local LoRA steps): ≤ 1 %.
   Assumption, stated in the output: each client runs one local epoch over 500 samples at the
   measured batch size (63 steps at batch 8) — fewer than any of the papers' data sets gives per
   client, so the percentage is an upper bound. A client's step time at its CLC depth is
   interpolated linearly between the depths measured in 4. (the system model's H = D(h̄ + x h)).
4. ``lora_step_vs_full`` / ``lora_memory_vs_depth`` — a LoRA local step (rank 8 on ``attn.qkv`` and
   ``attn.proj``, all 12 blocks training, through :class:`LoRAClassifier`) over a step of the same
   ViT with every weight trainable; and memory at depths 1, 4, 12. On CUDA memory is
   ``torch.cuda.max_memory_allocated`` over a step; on the CPU (no allocator counter) it is the
   sum of weights, activations saved for backward (``saved_tensors_hooks``, parameters not
   counted twice), gradients and AdamW state — the terms that make up a step's peak.

5. ``wfba_vs_equal`` / ``clc_vs_capacity`` / ``paper_<method>_time`` / ``paper_consistency_worst`` — the
   system model under the paper's settings (10-device testbed priced per backbone at batch 32: ViT-B/16 for
   CIFAR-10, ViT-L/16 for Food-101; rank-8 LoRA on qkv + proj; B = 10 MHz FDMA; the channel calibrated in
   ``systems/calibration.py``), pure arithmetic, identical in ``quick``: the round time of the equal split
   B/N over WFBA's for FeDiSyn's CLC depths on CIFAR-10 (the paper's "w/o WFBA" ablation; its reported gap
   is +41.7 % time to 74 %), the CLC depths next to CAFF's capacity depths with the utility U = Σ c_i / T
   of each, and per method (FeDiSyn, CAFF, SFLF, FGL, GPT-FL) the model's time to 80 % on Food-101 over the
   paper's, with ``paper_consistency_worst`` the largest of these ratios (and of the implied λ* over 1),
   which must be ≤ 1. CLC needs contributions; as no run is made here they are C[i, l] = D_i / Σ D · w_l
   with w rising geometrically from 0.2 (first block) to 1 (last): later blocks weigh more, devices by data.

Sizes: the default uses timm ``vit_base_patch16_224`` (random weights, 101 classes, batch 8) and
224 px images; ``quick`` a 12-block ViT of width 32 on 32 px images (same depth, so CLC and the
depth sweep are the real ones) and smaller generation/upload sets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from benchmarks._timing import (
    CudaPeak,
    SavedTensorBytes,
    Timing,
    autocast_factory,
    figure,
    pick_device,
    tensor_bytes,
    time_call,
    time_interleaved,
)
from fl_lightning.federation.aggregate import layerwise_average
from fl_lightning.models.diffusion import tiny_diffusion_components
from fl_lightning.models.lora import LoraSpec, last_blocks, lora_bits_per_layer, lora_layer_index
from fl_lightning.modules.lora_classifier import LoRAClassifier
from fl_lightning.synthesis.generate import decode_latents, denoise_latents, encode_prompts
from fl_lightning.synthesis.latents import ClassLatentUpload, client_latent_uploads, to_upload
from fl_lightning.systems.backbones import backbone, lora_params_per_block
from fl_lightning.systems.calibration import FOOD101, paper_consistency
from fl_lightning.systems.channel import REFERENCE_LOSS_DB, ChannelConfig, device_spectral_efficiency
from fl_lightning.systems.clc import contribution_aware_depths, depth_contribution, depth_round_time, policy_depths
from fl_lightning.systems.devices import board_profiles, paper_testbed, profile_arrays

__all__ = ["FeDiSynSizes", "sizes_for", "run"]

_SEED = 0
# Round-overhead assumption (see the module docstring): per client, one local epoch over 500 samples.
_SAMPLES_PER_CLIENT = 500
_LOCAL_EPOCHS = 1


@dataclass(frozen=True)
class FeDiSynSizes:
    """What each FeDiSyn figure runs on (see :func:`sizes_for`)."""

    vit_overrides: dict[str, int] = field(default_factory=dict)  # timm kwargs over vit_base_patch16_224
    image_size: int = 224
    num_classes: int = 101
    step_batch: int = 8
    depths: tuple[int, ...] = (1, 4, 12)
    lora_rank: int = 8
    num_clients: int = 10
    gen_image_size: int = 32  # tiny components: 16x16 latents (their self-attention grows with side**4)
    gen_batch: int = 8
    gen_steps: int = 50  # n of the full PNDM chain; from s = 500 that is ~n/2 UNet calls
    gen_timestep: int = 500
    guidance_scale: float = 7.5
    upload_images: int = 100  # D, images of the class
    upload_image_size: int = 224
    num_centroids: int = 4  # Z (the config's default)
    warmup: int = 1
    repeats: int = 2


def sizes_for(*, quick: bool, device: torch.device) -> FeDiSynSizes:
    """Sizes for ``quick`` (tiny, seconds) or the real ViT-B/16 on ``device``.

    A ViT-B/16 training step at batch 8 takes several seconds on two CPU cores, so the CPU default
    times 2 repeats after 1 warm-up (a few minutes for all figures); a GPU gets more repeats.
    """
    if quick:
        tiny = dict(img_size=32, patch_size=8, embed_dim=32, depth=12, num_heads=2)
        # 5-step chain from s = 500: UNet at 500, 300, 300, 100 and the x0 projection
        return FeDiSynSizes(
            vit_overrides=tiny,
            image_size=32,
            num_classes=10,
            gen_image_size=16,
            gen_batch=2,
            gen_steps=5,
            upload_images=20,
            upload_image_size=32,
            warmup=1,
            repeats=2,
        )
    if device.type == "cuda":
        return FeDiSynSizes(warmup=2, repeats=7)
    return FeDiSynSizes()


# -- 1. generation --------------------------------------------------------------------------------
def _generation(sizes: FeDiSynSizes, device: torch.device) -> tuple[dict[str, Any], dict[str, Any]]:
    autocast = autocast_factory(device)
    parts = tiny_diffusion_components(seed=_SEED, image_size=sizes.gen_image_size).to(device)
    factor = 2 ** (len(parts.vae.config.block_out_channels) - 1)  # VAE downsampling
    side, channels, b = sizes.gen_image_size // factor, parts.vae.config.latent_channels, sizes.gen_batch
    g = torch.Generator().manual_seed(_SEED)
    latents = torch.randn(b, channels, side, side, generator=g).to(device)  # as if noised at s
    prompts = [f"a photo of a class {i} object" for i in range(b)]
    with autocast():
        uncond = encode_prompts(parts, [""])  # (1, L, D), once per run as in generate_images

    def generate(x: torch.Tensor, texts: list[str]) -> torch.Tensor:
        with autocast():
            x0 = denoise_latents(
                parts.unet,
                parts.scheduler,
                x,
                timestep=sizes.gen_timestep,
                num_inference_steps=sizes.gen_steps,
                text_embeddings=encode_prompts(parts, texts),
                uncond_embeddings=uncond,
                guidance_scale=sizes.guidance_scale,
            )
            return decode_latents(parts.vae, x0)

    def batched() -> None:
        generate(latents, prompts)

    def one_at_a_time() -> None:
        for i in range(b):
            generate(latents[i : i + 1], prompts[i : i + 1])

    t = time_interleaved(
        {"batched": batched, "one_at_a_time": one_at_a_time}, warmup=sizes.warmup, repeats=sizes.repeats, device=device
    )
    t_batch, t_single = t["batched"].median_s, t["one_at_a_time"].median_s
    details = {
        "batch_size": b,
        "image_size": sizes.gen_image_size,
        "latent_shape": [channels, side, side],
        "num_inference_steps": sizes.gen_steps,
        "timestep": sizes.gen_timestep,
        "guidance_scale": sizes.guidance_scale,
        "per_image_s_batched": t_batch / b,
        "per_image_s_one_at_a_time": t_single / b,
        "batched": t["batched"].to_dict(),
        "one_at_a_time": t["one_at_a_time"].to_dict(),
        "components": "tiny_diffusion_components (random)",
    }
    rate = figure(b / t_batch, "img/s", note=f"batch {b}; per-image time h = {1e3 * t_batch / b:.1f} ms", details=details)
    speedup = figure(t_single / t_batch, "x", note=f"batch of {b} vs {b} single-image chains", details=details)
    return rate, speedup


# -- 2. upload size ----------------------------------------------------------------------------------
def _class_upload_bytes(*, images: int, centroids: int, latent_shape: tuple[int, int, int]) -> int:
    """Bytes of one class's upload with float32 latents, by the framework's own accounting (a class with
    <= Z images uploads its mean only, see ``synthesis/latents.py``)."""
    z = centroids if images > centroids else 0
    up = ClassLatentUpload(
        label=0, count=images, timestep=0, centroids=torch.empty(z, *latent_shape), mean=torch.empty(*latent_shape)
    )
    return up.num_bytes


def _upload_size(sizes: FeDiSynSizes) -> tuple[dict[str, Any], dict[str, Any]]:
    D, Z = sizes.upload_images, sizes.num_centroids
    sd = {}
    for px in (224, 512):
        side = px // 8  # SD v1-5's VAE downsamples by 8 into 4 channels
        up, raw = _class_upload_bytes(images=D, centroids=Z, latent_shape=(4, side, side)), D * 3 * px * px
        sd[f"{px}px"] = {"latent_shape": [4, side, side], "upload_bytes": up, "raw_bytes": raw, "ratio": up / raw}
    sd_fig = figure(
        sd["224px"]["ratio"],
        "x",
        note=f"SD v1-5, {D} images 224 px, Z={Z}: {sd['224px']['upload_bytes']:,} B vs {sd['224px']['raw_bytes']:,} B",
        details={"images": D, "num_centroids": Z, **sd},
    )

    parts = tiny_diffusion_components(seed=_SEED, image_size=sizes.upload_image_size)
    S = sizes.upload_image_size
    images = torch.rand(D, 3, S, S, generator=torch.Generator().manual_seed(_SEED))
    uploads = client_latent_uploads(
        parts.vae,
        parts.scheduler,
        {0: images},
        num_centroids=Z,
        timestep=sizes.gen_timestep,
        max_timestep=sizes.gen_timestep,
        seed=_SEED,
    )
    up, raw = to_upload(uploads).num_bytes, D * 3 * S * S
    tiny_fig = figure(
        up / raw,
        "x",
        note=f"tiny VAE (x2, latents larger than pixels), {D} images {S} px, measured",
        details={
            "images": D,
            "image_size": S,
            "num_centroids": Z,
            "upload_bytes": up,
            "raw_bytes": raw,
            "latent_shape": list(uploads[0].mean.shape),
        },
    )
    return sd_fig, tiny_fig


# -- 4. LoRA step and memory ------------------------------------------------------------------------
def _build_vit(sizes: FeDiSynSizes) -> nn.Module:
    import timm

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        return timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=sizes.num_classes, **sizes.vit_overrides)


def _train_step(loss_fn: Callable[[], torch.Tensor], optimizer: torch.optim.Optimizer, autocast: Callable) -> Callable[[], None]:
    """One local step as ``fit_local`` takes it: forward under autocast, backward, optimiser step."""

    def step() -> None:
        with autocast():
            loss = loss_fn()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _step_memory(
    model: nn.Module,
    loss_fn: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    autocast: Callable,
    device: torch.device,
) -> dict[str, Any]:
    """Run one step and account its memory (also serves as the step's warm-up).

    The CPU estimate is weights + saved activations + gradients + optimiser state; on CUDA a second
    step (the first one creates the AdamW state) is measured by the allocator.
    """
    params = list(model.parameters())
    held = params + list(model.buffers())
    with SavedTensorBytes(exclude=held) as saved:
        with autocast():
            loss = loss_fn()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grads = tensor_bytes(p.grad for p in params if p.grad is not None)
    optimizer.step()
    state = tensor_bytes(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    out = {
        "weights_bytes": tensor_bytes(held),
        "activations_bytes": saved.bytes,
        "gradient_bytes": grads,
        "optimizer_bytes": state,
    }
    out["estimate_bytes"] = sum(out.values())
    out["trainable_params"] = sum(p.numel() for p in params if p.requires_grad)
    if device.type == "cuda":
        step = _train_step(loss_fn, optimizer, autocast)
        with CudaPeak(device) as peak:
            step()
        out["cuda_peak_bytes"] = peak.bytes
    return out


def _lora_figures(sizes: FeDiSynSizes, device: torch.device) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """LoRA step vs full fine-tuning, memory vs depth; also returns what the round-overhead figure needs."""
    autocast = autocast_factory(device)
    full = _build_vit(sizes).to(device).train()
    spec = LoraSpec(rank=sizes.lora_rank, alpha=2 * sizes.lora_rank)
    lora = LoRAClassifier(backbone=_build_vit(sizes), spec=spec, lr=1e-4).to(device).train()
    g = torch.Generator().manual_seed(_SEED)
    x = torch.randn(sizes.step_batch, 3, sizes.image_size, sizes.image_size, generator=g).to(device)
    y = torch.randint(sizes.num_classes, (sizes.step_batch,), generator=g).to(device)

    def lora_loss() -> torch.Tensor:
        return lora.training_step((x, y), 0)

    def full_loss() -> torch.Tensor:
        return F.cross_entropy(full(x), y)

    memory: dict[str, Any] = {}
    times: dict[str, Timing] = {}
    for depth in sizes.depths:
        lora.set_depth(depth)
        optimizer = lora.configure_optimizers()  # after set_depth, as the framework does
        memory[str(depth)] = _step_memory(lora, lora_loss, optimizer, autocast, device)
        step = _train_step(lora_loss, optimizer, autocast)
        if depth != max(sizes.depths):
            times[str(depth)] = time_call(
                step, warmup=sizes.warmup - 1 if sizes.warmup else 0, repeats=sizes.repeats, device=device
            )
            continue
        full_opt = torch.optim.AdamW(full.parameters(), lr=1e-4)
        memory["full"] = _step_memory(full, full_loss, full_opt, autocast, device)
        both = time_interleaved(
            {"lora": step, "full": _train_step(full_loss, full_opt, autocast)},
            warmup=max(sizes.warmup - 1, 0),
            repeats=sizes.repeats,
            device=device,
        )
        times[str(depth)], times["full"] = both["lora"], both["full"]

    key = "cuda_peak_bytes" if device.type == "cuda" else "estimate_bytes"
    deepest, shallowest = str(max(sizes.depths)), str(min(sizes.depths))
    step_fig = figure(
        times[deepest].median_s / times["full"].median_s,
        "x",
        note=f"LoRA r={sizes.lora_rank} step (all {deepest} blocks) / full fine-tuning step, batch {sizes.step_batch}",
        details={
            "lora_step_s": times[deepest].median_s,
            "full_step_s": times["full"].median_s,
            "lora": times[deepest].to_dict(),
            "full": times["full"].to_dict(),
            "lora_trainable_params": memory[deepest]["trainable_params"],
            "full_trainable_params": memory["full"]["trainable_params"],
        },
    )
    per_depth = {d: {**memory[d], "step_s": times[d].median_s} for d in memory if d != "full"}
    mem_fig = figure(
        memory[deepest][key] / memory[shallowest][key],
        "x",
        note=f"memory at depth {deepest} / depth {shallowest} ({key}); full FT: "
        f"{memory['full'][key] / memory[shallowest][key]:.2f}x",
        details={
            "measure": key,
            "per_depth": per_depth,
            "full_finetuning": memory["full"],
            "method": (
                "torch.cuda.max_memory_allocated over a step"
                if device.type == "cuda"
                else "weights + saved_tensors_hooks activations + gradients + AdamW state"
            ),
        },
    )
    step_time = {int(d): times[d].median_s for d in memory if d != "full"}
    return step_fig, mem_fig, {"step_time_by_depth": step_time, "lora_state": lora.lora_state(), "num_blocks": lora.num_blocks}


# -- 3. round overhead -------------------------------------------------------------------------------
def _round_overhead(
    sizes: FeDiSynSizes, step_time_by_depth: dict[int, float], lora_state: dict[str, torch.Tensor], num_blocks: int
) -> dict[str, Any]:
    cpu = torch.device("cpu")  # the server's planning and averaging run on the host
    channel = ChannelConfig()
    profiles = profile_arrays(paper_testbed())  # ViT-B/16 at batch 32 (the model benchmarked here)
    n_dev = len(profiles["forward_time_s"])
    _, efficiency = device_spectral_efficiency(profiles["transmit_power_w"], config=channel, seed=_SEED)
    rng = np.random.default_rng(_SEED)
    contributions = np.sort(rng.random((n_dev, num_blocks)), axis=1)  # later blocks weigh more
    num_samples = np.full(n_dev, float(_SAMPLES_PER_CLIENT * _LOCAL_EPOCHS))
    layer_bits = lora_bits_per_layer(lora_state)
    timing_kw = dict(
        num_samples=num_samples,
        forward_time_s=profiles["forward_time_s"],
        backward_time_per_layer_s=profiles["backward_time_per_layer_s"],
        layer_bits=layer_bits,
        spectral_efficiency=efficiency,
        total_bandwidth_hz=channel.total_bandwidth_hz,
    )
    memory_kw = {k: profiles[k] for k in ("fixed_memory_gb", "memory_per_layer_gb", "memory_budget_gb")}

    def plan() -> np.ndarray:
        depths = contribution_aware_depths(contributions=contributions, **memory_kw, **timing_kw)  # CLC, Alg. 1
        depth_round_time(depths, **timing_kw)  # the WFBA bandwidths handed to the devices, Alg. 2
        return depths

    depths = plan()
    g = torch.Generator().manual_seed(_SEED)
    client_states = []
    for x_i in depths[: sizes.num_clients]:
        keep = set(last_blocks(int(x_i), num_blocks))
        client_states.append(
            {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in lora_state.items() if lora_layer_index(k) in keep}
        )
    weights = num_samples[: sizes.num_clients].tolist()

    def aggregate() -> None:
        layerwise_average(lora_state, client_states, weights, layer_of=lora_layer_index)

    repeats = max(5, sizes.repeats)
    t_plan = time_call(plan, warmup=1, repeats=repeats, device=cpu)
    t_agg = time_call(aggregate, warmup=1, repeats=repeats, device=cpu)
    steps = math.ceil(_SAMPLES_PER_CLIENT / sizes.step_batch) * _LOCAL_EPOCHS
    measured = sorted(step_time_by_depth)
    step_s = np.interp(depths[: sizes.num_clients].astype(float), measured, [step_time_by_depth[d] for d in measured])
    compute_s = float(steps * step_s.sum())
    overhead_s = t_plan.median_s + t_agg.median_s
    return figure(
        100.0 * overhead_s / compute_s,
        "%",
        op="<=",
        bound=1.0,
        note=f"(CLC+WFBA {1e3 * t_plan.median_s:.1f} ms + aggregation {1e3 * t_agg.median_s:.1f} ms) / "
        f"{sizes.num_clients} clients x {steps} steps",
        details={
            "plan_s": t_plan.median_s,
            "aggregate_s": t_agg.median_s,
            "client_compute_s": compute_s,
            "depths": depths.tolist(),
            "steps_per_client": steps,
            "step_s_by_client": step_s.tolist(),
            "lora_layer_bits": layer_bits,
            "lora_keys": len(lora_state),
            "assumption": (
                f"{_LOCAL_EPOCHS} local epoch over {_SAMPLES_PER_CLIENT} samples per client at "
                f"batch {sizes.step_batch}; step time interpolated between measured depths "
                f"{measured}"
            ),
        },
    )


# -- 5. the system model under the paper's settings -----------------------------------------------------
# per data set: (backbone, images per device for 1 local epoch); the paper's CIFAR-10 / Food-101 settings
_DATASETS = {"cifar10": ("vit_base_patch16_224", 50_000 / 10), "food101": ("vit_large_patch16_224", 75_750 / 10)}
_BATCH, _RANK = 32, 8  # the configs' train.batch_size and LoRA rank
_PAPER_WFBA_GAP_CIFAR10 = 0.417  # w/o WFBA needs 41.7 % more time to 74 %


def _layer_bits(model: str) -> float:
    """τ: float32 bits of one block's rank-8 LoRA on qkv + proj (ViT-B/16: 36,864 params, ViT-L/16: 49,152)."""
    return 32.0 * lora_params_per_block(backbone(model).embed_dim, _RANK)


def _system_setting(dataset: str) -> dict[str, Any]:
    model, samples = _DATASETS[dataset]
    vit = backbone(model)
    profiles = profile_arrays(paper_testbed(board_profiles(vit, _BATCH, lora_rank=_RANK)))
    channel = ChannelConfig()  # the calibrated channel (PL0 fitted by systems/calibration.py)
    _, efficiency = device_spectral_efficiency(profiles["transmit_power_w"], config=channel, seed=0)  # placement_seed 0
    n = len(efficiency)
    D = np.full(n, samples)
    w = np.geomspace(0.2, 1.0, vit.depth)  # later blocks weigh more
    return dict(
        num_blocks=vit.depth,
        profiles=profiles,
        efficiency=efficiency,
        bandwidth=channel.total_bandwidth_hz,
        contributions=(D / D.sum())[:, None] * w[None, :],
        timing=dict(
            num_samples=D,
            forward_time_s=profiles["forward_time_s"],
            backward_time_per_layer_s=profiles["backward_time_per_layer_s"],
            layer_bits=_layer_bits(model),
            spectral_efficiency=efficiency,
            total_bandwidth_hz=channel.total_bandwidth_hz,
        ),
        memory={k: profiles[k] for k in ("fixed_memory_gb", "memory_per_layer_gb", "memory_budget_gb")},
    )


def _depths(setting: dict[str, Any], policy: str, allocation: str = "wfba") -> np.ndarray:
    t = setting["timing"]
    return policy_depths(
        policy,
        num_layers=setting["num_blocks"],
        contributions=setting["contributions"],
        allocation=allocation,
        **setting["memory"],
        **t,
    ).depths


def _round(setting: dict[str, Any], depths: np.ndarray, allocation: str) -> dict[str, Any]:
    bandwidth, T = depth_round_time(depths, **setting["timing"], allocation=allocation)
    t = setting["timing"]
    compute = t["num_samples"] * (t["forward_time_s"] + depths * t["backward_time_per_layer_s"])
    return {"round_time_s": T, "max_compute_s": float(compute.max()), "bandwidth_hz": bandwidth.tolist()}


def _system_model() -> dict[str, dict[str, Any]]:
    """WFBA vs B/N and CLC vs capacity under the calibration, and the calibration against the paper's figures."""
    per_dataset: dict[str, Any] = {}
    for dataset in _DATASETS:
        setting = _system_setting(dataset)
        rows = {}
        for policy in ("clc", "capacity", "full"):
            x = _depths(setting, policy)
            wfba, equal = _round(setting, x, "wfba"), _round(setting, x, "equal")
            rows[policy] = {
                "depths": x.tolist(),
                "wfba": wfba,
                "equal": equal,
                "equal_over_wfba": equal["round_time_s"] / wfba["round_time_s"],
            }
        # The ablation as a whole: CLC optimising against B/N, run with B/N.
        x_eq = _depths(setting, "clc", allocation="equal")
        rows["clc_planned_for_equal"] = {"depths": x_eq.tolist(), "equal": _round(setting, x_eq, "equal")}
        per_dataset[dataset] = {
            "backbone": _DATASETS[dataset][0],
            "spectral_efficiency": setting["efficiency"].tolist(),
            "policies": rows,
        }

    cifar = per_dataset["cifar10"]["policies"]
    figures = {
        "wfba_vs_equal": figure(
            cifar["clc"]["equal_over_wfba"],
            "x",
            note=(
                f"CIFAR-10 (ViT-B/16), CLC depths: round {cifar['clc']['equal']['round_time_s']:.0f} s at B/N vs "
                f"{cifar['clc']['wfba']['round_time_s']:.0f} s with WFBA (paper: w/o WFBA +41.7 % time to 74 %)"
            ),
            details={
                "per_dataset": per_dataset,
                "paper_wfba_gap": _PAPER_WFBA_GAP_CIFAR10,
                "lora_bits_per_block": {d: _layer_bits(m) for d, (m, _) in _DATASETS.items()},
                "setting": "paper testbed (1 Xavier, 5 Orin NX, 3 AGX Orin, 1 Thor) priced per backbone at batch 32, "
                "1 local epoch, ChannelConfig() defaults, placement seed 0, contributions "
                "D_i/ΣD · geomspace(0.2, 1, L)",
            },
        )
    }

    setting = _system_setting("cifar10")
    clc, cap = _depths(setting, "clc"), _depths(setting, "capacity")
    utility = {}
    for name, x in (("clc", clc), ("capacity", cap)):
        _, T = depth_round_time(x, **setting["timing"])
        utility[name] = {
            "depths": x.tolist(),
            "round_time_s": T,
            "contribution": float(depth_contribution(setting["contributions"], x).sum()),
            "utility": float(depth_contribution(setting["contributions"], x).sum()) / T,
        }
    figures["clc_vs_capacity"] = figure(
        utility["clc"]["utility"] / utility["capacity"]["utility"],
        "x",
        note=f"U(CLC) / U(capacity), CIFAR-10, WFBA: CLC {clc.tolist()} vs capacity {cap.tolist()}",
        details={**utility, "devices_differing": int((clc != cap).sum()), "depths_differ": bool((clc != cap).any())},
    )

    # The calibration: every method's model time to 80 % on Food-101 (ViT-L/16) over the paper's (systems/calibration.py)
    result = paper_consistency(reference_loss_db=REFERENCE_LOSS_DB)
    checks = result["checks"]
    for method, c in checks.items():
        figures[f"paper_{method}_time"] = figure(
            c.ratio,
            "x",
            op="<=",
            bound=1.0,
            note=(
                f"model {c.model_time_s:,.0f} s / paper {c.paper_time_s:,.0f} s ({c.rounds:.1f} rounds of "
                f"{c.round_time_s:,.0f} s + server {c.server_s:,.0f} s + synthesis upload {c.synthesis_upload_s:,.0f} s)"
            ),
            details={**asdict(c), "ratio": c.ratio},
        )
    worst = result["worst"]
    figures["paper_consistency_worst"] = figure(
        worst,
        "x",
        op="<=",
        bound=1.0,
        note=f"max model/paper over the Food-101 checks (worst: {result['worst_method']}); PL0 = {REFERENCE_LOSS_DB:g} dB, "
        f"implied λ* = {result['lambda_star']:.3f}",
        details={
            "reference_loss_db": REFERENCE_LOSS_DB,
            "lambda_star_implied": result["lambda_star"],
            "lambda_ratio": result["lambda_ratio"],
            "synthetic_images": result["synthetic_images"],
            "pretraining_s": result["pretraining_s"],
            "spectral_efficiency": result["spectral_efficiency"],
            "ratios": {m: c.ratio for m, c in checks.items()},
            "paper": {
                "time_to_80pct_s": dict(FOOD101.time_to_target_s),
                "traffic_mb": dict(FOOD101.traffic_mb),
                "fedisyn_generation_s": FOOD101.fedisyn_generation_s,
            },
        },
    )
    return figures


def run(*, quick: bool = False, device: torch.device | None = None) -> dict[str, Any]:
    """All FeDiSyn figures: ``{name: figure}`` plus ``"sizes"``."""
    device = device or pick_device()
    sizes = sizes_for(quick=quick, device=device)
    results: dict[str, Any] = {"sizes": asdict(sizes)}
    results["generation_images_per_s"], results["generation_batched_speedup"] = _generation(sizes, device)
    results["upload_vs_raw_sd15"], results["upload_vs_raw_tiny_vae"] = _upload_size(sizes)
    step_fig, mem_fig, extra = _lora_figures(sizes, device)
    results["round_overhead"] = _round_overhead(
        sizes, extra["step_time_by_depth"], {k: v.detach().cpu() for k, v in extra["lora_state"].items()}, extra["num_blocks"]
    )
    results["lora_step_vs_full"], results["lora_memory_vs_depth"] = step_fig, mem_fig
    results.update(_system_model())
    return results
