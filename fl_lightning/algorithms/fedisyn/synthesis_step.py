"""FeDiSyn's server round 0: latents → prompts → synthetic images → pre-trained ViT (orchestration only).

The math lives in ``fl_lightning.synthesis`` (plan, sampling) and ``fl_lightning.modules.pretraining``
(pre-training); this file wires them to the run folder:

    <run_dir>/prompts.json            the label → prompts cache (the LLM runs once per label)
    <run_dir>/synthetic/<class>/*.png  the generated images + manifest.jsonl (re-running skips existing ones)
    <run_dir>/pretrain/               the pre-training checkpoints and CSV logs

and measures the server's wall times ĥ (per generated image) and h̃ (per image and epoch of
pre-training), which the simulated clock and the scaling law use unless the config fixes them.

Two ways to start an image (``generation``):

* ``feature_guided`` (FeDiSyn): from a client's noised latent centroid mixed with its class average
  (``synthesis.generate.plan_generation``), denoised from the upload's timestep s;
* ``text_only`` (GPT-FL, FGL and FeDiSyn w/o FG): from pure noise at the last training timestep
  T − 1, conditioned on the prompt only — x_{T−1} = sqrt(1 − ᾱ_{T−1}) ξ, the ``noise_fraction = 0``
  case of ``synthesis.generate.top_up_latent`` on a zero latent (SD's text-to-image start N(0, I)
  up to 1 − ᾱ_{T−1} ≈ 0.995). The volumes are the same λ·D^k per class as FeDiSyn's, so an
  ablation changes the generation only.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from fl_lightning.data.transforms import build_transform
from fl_lightning.errors import ConfigError
from fl_lightning.federation.algorithm import InputSpec
from fl_lightning.federation.placement import derive_seed
from fl_lightning.models.diffusion import DiffusionComponents
from fl_lightning.modules.pretraining import load_pretrained_vit, pretrain_classifier, split_holdout
from fl_lightning.synthesis.generate import (
    MANIFEST_NAME,
    GenerationRequest,
    generate_images,
    plan_generation,
    synthetic_volume,
)
from fl_lightning.synthesis.latents import ClassLatentUpload
from fl_lightning.synthesis.prompts import LLMPromptExpander, TemplatePromptExpander, expand_with_cache
from fl_lightning.systems.scaling_law import ScalingLawParams, optimal_lambda, synthesis_cost_per_unit_lambda

__all__ = ["SynthesisResult", "SyntheticFolder", "choose_lambda", "text_only_requests", "synthesise_and_pretrain",
           "pretrain_on_synthetic"]


@dataclass
class SynthesisResult:
    """What round 0 produced on the server."""

    model: nn.Module  # the pre-trained timm ViT (with its head)
    lam: float
    images_per_class: dict[int, int]
    generation_s: float  # H_gene (measured, or ĥ · images from the config)
    pretraining_s: float  # H_pre
    pretrain_checkpoint: Path


class SyntheticFolder(Dataset):
    """The generated images with the REAL label indices from the manifest (not the folder order)."""

    def __init__(self, root: Path, transform=None) -> None:
        rows = [json.loads(line) for line in (root / MANIFEST_NAME).read_text(encoding="utf-8").splitlines() if line]
        self.root, self.transform = root, transform
        self.items = [(row["path"], int(row["label"])) for row in rows]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        path, label = self.items[index]
        with Image.open(self.root / path) as img:
            image = img.convert("RGB")
        return (self.transform(image) if self.transform else image), label


def choose_lambda(cfg: Any, *, gen_time_per_image: float, pretrain_time_per_image_epoch: float,
                  num_real_samples: int, section: str = "fedisyn") -> float:
    """λ from the config, or λ* of the scaling law with h0 = (ĥ + h̃ T̂) D.

    Raises:
        ConfigError: λ* is not a finite number > 0 (e.g. e^{κ3 Acc} overflows, or h0 is 0 because ĥ and
            h̃ are both 0): named ``<section>.scaling_kappa``.
    """
    if cfg.synthetic_lambda is not None:
        return float(cfg.synthetic_lambda)
    h0 = synthesis_cost_per_unit_lambda(gen_time_per_image, pretrain_time_per_image_epoch, cfg.pretrain_epochs,
                                        num_real_samples)
    k1, k2, k3, k4 = (float(k) for k in cfg.scaling_kappa or ())
    try:
        lam = optimal_lambda(cfg.target_accuracy, h0=h0,
                             params=ScalingLawParams(kappa1=k1, kappa2=k2, kappa3=k3, kappa4=k4))
    except (ValueError, OverflowError) as err:
        raise ConfigError(f"{section}.scaling_kappa", cfg.scaling_kappa,
                          f"κ that give a finite λ* > 0 at target_accuracy {cfg.target_accuracy} with h0 = {h0:g} s "
                          f"({err})") from None
    if not (math.isfinite(lam) and lam > 0):
        raise ConfigError(f"{section}.scaling_kappa", cfg.scaling_kappa,
                          f"κ that give a finite λ* > 0 (got λ* = {lam!r} with h0 = {h0:g} s)")
    return lam


def text_only_requests(class_names: Sequence[str], prompts_by_class: Mapping[str, Sequence[str]], *,
                       volume_per_class: Mapping[int, int], latent_shape: tuple[int, ...], timestep: int,
                       seed: int) -> list[GenerationRequest]:
    """Requests that start from pure noise at ``timestep`` (T − 1), conditioned on prompts only.

    Each request carries a zero latent with ``noise_fraction = 0``: ``start_latent`` then draws the
    whole noise σ_s ξ from the image's own seed (derived from (seed, label, index)). Class k's images
    take its prompts in turn (FGL: the clients' captions; GPT-FL: the LLM's prompts).
    """
    zero = torch.zeros(latent_shape)
    requests = []
    for label in sorted(volume_per_class):
        prompts = list(prompts_by_class.get(class_names[label], []))
        if volume_per_class[label] > 0 and not prompts:
            raise ValueError(f"no prompts for class {class_names[label]!r}")
        for index in range(int(volume_per_class[label])):
            image_seed = derive_seed(seed, label, index, 1)
            requests.append(GenerationRequest(class_name=class_names[label], label=int(label), client=-1,
                                              centroid_index=-1, latent=zero, timestep=int(timestep),
                                              prompt=prompts[index % len(prompts)], seed=image_seed, index=index,
                                              noise_fraction=0.0))
    return requests


def _expander(cfg: Any, *, seed: int, device: torch.device):
    if cfg.llm_path is None:
        return TemplatePromptExpander(seed=seed)
    return LLMPromptExpander(cfg.llm_path, device=device, seed=seed,
                             dtype=torch.float16 if device.type == "cuda" else torch.float32)


def _dtype(cfg: Any, device: torch.device) -> torch.dtype:
    if cfg.diffusion_precision == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.diffusion_precision)


def _probe_generation(cfg: Any, components: DiffusionComponents, requests, folder: Path,
                      device: torch.device) -> float:
    """ĥ on this host: time one batch of real requests into a scratch folder (discarded)."""
    batch = list(requests[: cfg.generation_batch_size])
    start = time.monotonic()
    generate_images(components, batch, folder, batch_size=cfg.generation_batch_size,
                    num_inference_steps=cfg.num_inference_steps, guidance_scale=cfg.guidance_scale,
                    device=device, dtype=_dtype(cfg, device), progress=False,
                    min_fresh_fraction=cfg.min_fresh_fraction)
    shutil.rmtree(folder, ignore_errors=True)
    return (time.monotonic() - start) / max(len(batch), 1)


def _latent_shape(components: DiffusionComponents, image_size: int) -> tuple[int, int, int]:
    """(C, h, w) of the VAE's latents for ``image_size`` images (SD: 4 channels, ÷8)."""
    config = components.vae.config
    factor = 2 ** (len(config.block_out_channels) - 1)
    return (int(config.latent_channels), image_size // factor, image_size // factor)


def synthesise_and_pretrain(
    cfg: Any, *, components: DiffusionComponents,
    uploads_by_client: Mapping[int, Sequence[ClassLatentUpload]] | None, class_counts: Mapping[int, int],
    class_names: Sequence[str], spec: InputSpec, run_dir: Path, seed: int, device: torch.device,
    precision: str, progress: bool, prompts_by_class: Mapping[str, Sequence[str]] | None = None,
    section: str = "fedisyn", text_only: bool = False,
) -> SynthesisResult:
    """Steps 1 (server side) and 2 of FeDiSyn; resumable (prompts cached, images skipped when present).

    Args:
        cfg: the method's section (the keys of ``synthesis.DiffusionConfig``, and of the prompt and
            feature-guided configs where those are used).
        uploads_by_client: the clients' noised latents (``feature_guided``; None for ``text_only``).
        class_counts: D^k per label, summed over the clients.
        prompts_by_class: prompts to use instead of the label expansion (FGL: the clients' captions).
        section: the method's config section, for error keys.
        text_only: images start from pure noise and the prompts (``uploads_by_client`` is None).
    """
    totals = {int(k): int(v) for k, v in class_counts.items() if v > 0}
    D = sum(totals.values())
    if prompts_by_class is None:
        prompts_by_class = expand_with_cache(_expander(cfg, seed=seed, device=device), list(class_names),
                                             cfg.prompts_per_label, run_dir / "prompts.json")
    if not text_only and uploads_by_client is None:
        raise ValueError("feature-guided generation needs the clients' latent uploads")
    last_t = int(components.scheduler.config.num_train_timesteps) - 1

    def requests_for(volume: Mapping[int, int]) -> list[GenerationRequest]:
        if text_only:
            return text_only_requests(class_names, prompts_by_class, volume_per_class=volume, seed=seed,
                                      latent_shape=_latent_shape(components, cfg.vae_image_size), timestep=last_t)
        return plan_generation(uploads_by_client, class_names, prompts_by_class, volume_per_class=volume,
                               rho=cfg.rho, seed=seed)

    folder = run_dir / "synthetic"
    h_gen, h_pre = cfg.generation_time_per_image_s, cfg.pretrain_time_per_image_epoch_s
    if cfg.synthetic_lambda is None and (h_gen is None or h_pre is None):
        if h_gen is None:
            h_gen = _probe_generation(cfg, components, requests_for(totals), run_dir / "probe", device)
        if h_pre is None:
            # a first-order stand-in until pre-training is measured: ViT training costs ~ a generation step
            h_pre = h_gen / max(cfg.num_inference_steps, 1)
    lam = choose_lambda(cfg, gen_time_per_image=h_gen or 0.0, pretrain_time_per_image_epoch=h_pre or 0.0,
                        num_real_samples=D, section=section)
    volume = synthetic_volume(totals, lam)
    if sum(volume.values()) < 2:
        raise ConfigError(f"{section}.synthetic_lambda", lam,
                          f"a λ that gives at least 2 synthetic images (D = {D} real samples)")
    requests = requests_for(volume)
    start = time.monotonic()
    generate_images(components, requests, folder, batch_size=cfg.generation_batch_size,
                    num_inference_steps=cfg.num_inference_steps, guidance_scale=cfg.guidance_scale,
                    device=device, dtype=_dtype(cfg, device), progress=progress,
                    min_fresh_fraction=cfg.min_fresh_fraction)
    generation_s = time.monotonic() - start
    components.to(device="cpu")  # free the accelerator for pre-training and fine-tuning
    n_images = len(requests)
    if cfg.generation_time_per_image_s is not None:
        generation_s = cfg.generation_time_per_image_s * n_images
    model, pretraining_s, best = pretrain_on_synthetic(cfg, folder, num_classes=len(class_names), spec=spec,
                                                       run_dir=run_dir, seed=seed, device=device, precision=precision)
    per_class = {label: int(v) for label, v in volume.items()}
    return SynthesisResult(model, lam, per_class, generation_s, pretraining_s, best)


def pretrain_on_synthetic(cfg: Any, folder: Path, *, num_classes: int, spec: InputSpec, run_dir: Path, seed: int,
                          device: torch.device, precision: str) -> tuple[nn.Module, float, Path]:
    """Step 2: pre-train the timm ViT on the images of ``folder`` (a :class:`SyntheticFolder`, whatever made it).

    Returns:
        the best model (by held-out loss), H_pre (measured, or h̃ · images · epochs from the config) and
        its checkpoint.
    """
    transform = dict(normalization=spec.normalization, image_size=spec.image_size, mean=spec.mean, std=spec.std)
    train_set, _ = split_holdout(SyntheticFolder(folder, build_transform(**transform, train=True)),
                                 cfg.pretrain_holdout, seed)
    _, val_set = split_holdout(SyntheticFolder(folder, build_transform(**transform, train=False)),
                               cfg.pretrain_holdout, seed)
    out = run_dir / "pretrain"
    shutil.rmtree(out, ignore_errors=True)  # an interrupted pre-training starts over (no stale "best")
    start = time.monotonic()
    best, epochs_run = pretrain_classifier(
        model_name=cfg.pretrain_model, overrides=cfg.pretrain_overrides, checkpoint=cfg.pretrain_checkpoint,
        num_classes=num_classes, train_dataset=train_set, val_dataset=val_set, out_dir=out,
        max_epochs=cfg.pretrain_epochs, batch_size=cfg.pretrain_batch_size, lr=cfg.pretrain_lr,
        accelerator=device.type, devices=1, precision=precision, seed=seed, patience=cfg.pretrain_patience)
    pretraining_s = time.monotonic() - start
    if cfg.pretrain_time_per_image_epoch_s is not None:
        pretraining_s = cfg.pretrain_time_per_image_epoch_s * len(train_set) * epochs_run
    return load_pretrained_vit(best, map_location="cpu"), pretraining_s, best
