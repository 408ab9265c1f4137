"""FeDiSyn step 1, server side: from noised client latents to a folder of synthetic images.

1. Volumes (:func:`class_totals`, :func:`synthetic_volume`): the server sums the clients' counts
   into D^k = Σ_i D_i^k per class and synthesises round(λ · D^k) images of class k.
2. Plan (:func:`plan_generation`): class k's images are shared among the clients that hold k in
   proportion to their counts D_i^k (largest remainder), and within a client round-robin over its
   centroids. Each image starts from the latent mix Ē = ρ·e_z + (1 − ρ)·e_avg (:func:`mix_latents`)
   of one noised centroid e_z and the client's noised class average e_avg (or from e_avg alone when
   the client uploaded its mean only, see :mod:`.latents`), and takes the class's prompts in turn.
3. Fresh noise per image (:func:`start_latent`): e_z and e_avg carry independent noise, so Ē holds
   only (ρ² + (1 − ρ)²)·σ_s² of noise where the sampler at s assumes σ_s² = 1 − ᾱ_s. Noise drawn
   from the image's own seed tops Ē up to exactly σ_s² (:func:`top_up_latent`, derivation there).
   That fresh part also makes every image a different sample. Where it would be smaller than
   ``min_fresh_fraction`` of the noise (a mean-only upload, ρ near 0 or 1), the latent is diffused
   further forward, from s to the first t whose noise is that fresh (:func:`fresh_timestep`,
   :func:`diffuse_forward`), and denoising starts at t.
4. Denoise (:func:`denoise_latents`): the server runs the PNDM (PLMS) sampler from the start
   timestep down to 0 with the UNet conditioned on the CLIP text embeddings of the prompt, with
   classifier-free guidance ε̂ = ε(x, ∅) + g · (ε(x, c) − ε(x, ∅)) (Ho & Salimans 2022, Eq. 6).
5. Decode and write (:func:`generate_images`): ``<out>/<class>/<index>.png`` (a torchvision
   ``ImageFolder``) plus ``manifest.jsonl``; re-running skips images that already exist.

Why our own sampling loop: diffusers' img2img pipeline treats a 4-channel ``image`` as *clean*
latents and noises them again. And PLMS cannot start mid-chain by slicing the scheduler's
timesteps: its first two calls are an Euler step and a Heun-style correction at the *same*
timestep (the scheduler's ``set_timesteps`` writes the second timestep twice). :func:`plms_chain`
builds that pattern starting exactly at s.

Reproducibility: PNDM sampling has no randomness of its own; the only randomness on the server is
the fresh noise of step 3, drawn on the CPU from the image's seed, itself derived from (run seed,
label, index). So an image depends only on its request: batching, resuming or the device cannot
change it beyond float round-off, and the same seed gives the same images.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from fl_lightning.dealing import Deal
from fl_lightning.durable_write import atomic_path
from fl_lightning.federation.ranks.placement import derive_seed
from fl_lightning.models.diffusion import DiffusionComponents
from fl_lightning.phase_times import note
from fl_lightning.synthesis.latents import ClassLatentUpload

if TYPE_CHECKING:
    from diffusers import PNDMScheduler

__all__ = [
    "GenerationRequest",
    "class_totals",
    "synthetic_volume",
    "mix_latents",
    "mix_noise_fraction",
    "top_up_std",
    "top_up_latent",
    "fresh_timestep",
    "diffuse_forward",
    "plan_generation",
    "start_latent",
    "encode_prompts",
    "plms_chain",
    "denoise_latents",
    "decode_latents",
    "generate_images",
    "MANIFEST_NAME",
]

MANIFEST_NAME = "manifest.jsonl"


# ------------------------------------------------------------------------------------------------
# volumes and plan (pure)


def class_totals(uploads_by_client: Mapping[int, Sequence[ClassLatentUpload]]) -> dict[int, int]:
    """D^k = Σ_i D_i^k: the total sample count of each class over all clients."""
    totals: dict[int, int] = defaultdict(int)
    for uploads in uploads_by_client.values():
        for up in uploads:
            totals[up.label] += up.count
    return dict(sorted(totals.items()))


def synthetic_volume(totals: Mapping[int, int], lam: float) -> dict[int, int]:
    """Images to synthesise per class: round(λ · D^k), halves rounded up.

    Args:
        totals: D^k per class (from :func:`class_totals`).
        lam: λ, synthetic images per real image (from the fitted scaling law).
    """
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam (λ, synthetic images per real image) must be a finite float >= 0, got {lam!r}")
    return {label: int(math.floor(lam * count + 0.5)) for label, count in totals.items()}


def mix_latents(centroid: torch.Tensor, mean: torch.Tensor, rho: float) -> torch.Tensor:
    """Ē = ρ · e_z + (1 − ρ) · e_avg: a noised centroid pulled towards the client's class average.

    Args:
        centroid: e_z, (C, h, w) (or a batch of them).
        mean: e_avg, broadcastable to ``centroid``.
        rho: ρ in [0, 1]; 1 keeps the centroid, 0 the average.
    """
    _check_rho(rho)
    return rho * centroid + (1.0 - rho) * mean


def _check_rho(rho: float) -> None:
    if not (isinstance(rho, (int, float)) and 0.0 <= float(rho) <= 1.0):
        raise ValueError(f"rho (ρ of Ē = ρ·e_z + (1 − ρ)·e_avg) must be a float in [0, 1], got {rho!r}")


def _check_fraction(name: str, value: float, *, upper_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and 0.0 <= float(value) and (float(value) < 1.0 if upper_open else float(value) <= 1.0)
    if not ok:
        raise ValueError(f"{name} must be a float in [0, {'1)' if upper_open else '1]'}, got {value!r}")


def mix_noise_fraction(rho: float) -> float:
    """q = ρ² + (1 − ρ)²: the share of σ_s² that the ρ-mix of two independently noised latents keeps.

    Ē = ρ·e_z + (1 − ρ)·e_avg with e = sqrt(ᾱ_s) x_0 + σ_s ε and ε_z, ε_avg independent has noise
    σ_s (ρ ε_z + (1 − ρ) ε_avg), of variance (ρ² + (1 − ρ)²) σ_s² (0.58 σ_s² at ρ = 0.7).
    """
    _check_rho(rho)
    return float(rho) ** 2 + (1.0 - float(rho)) ** 2


def top_up_std(alpha_bar: float, noise_fraction: float) -> float:
    """σ_top = sqrt((1 − ᾱ_s)(1 − q)): the fresh noise that brings a mix's noise variance to σ_s².

    For the ρ-mix, 1 − q = 2ρ(1 − ρ) (see :func:`top_up_latent`).

    Args:
        alpha_bar: ᾱ_s of the timestep the latents were noised at, in (0, 1].
        noise_fraction: q, the mix's noise variance over σ_s² = 1 − ᾱ_s, in [0, 1].
    """
    if not 0.0 < float(alpha_bar) <= 1.0:
        raise ValueError(f"alpha_bar (ᾱ_s) must be in (0, 1], got {alpha_bar!r}")
    _check_fraction("noise_fraction", noise_fraction)
    return math.sqrt((1.0 - float(alpha_bar)) * (1.0 - float(noise_fraction)))


def top_up_latent(mixed: torch.Tensor, noise: torch.Tensor, *, alpha_bar: float, noise_fraction: float) -> torch.Tensor:
    """x_s = Ē + sqrt((1 − ᾱ_s)(1 − q)) ξ: a mix of noised latents, topped up to the schedule's noise.

    Derivation. The client noises its centroid c_z and class average m at timestep s with the
    forward process (Ho et al. 2020, Eq. 4), independently:
    e_z = sqrt(ᾱ_s) c_z + σ_s ε_z and e_avg = sqrt(ᾱ_s) m + σ_s ε_avg, σ_s² = 1 − ᾱ_s. The mix is

        Ē = ρ e_z + (1 − ρ) e_avg = sqrt(ᾱ_s) x̄_0 + σ_s (ρ ε_z + (1 − ρ) ε_avg),  x̄_0 = ρ c_z + (1 − ρ) m.

    The signal part is linear in the latents, so it is exactly the forward process's signal of the
    mixed clean latent x̄_0; the noise part is Gaussian with variance q σ_s², q = ρ² + (1 − ρ)² < 1.
    Adding fresh noise ξ ~ N(0, I) independent of both,

        x_s = Ē + σ_s sqrt(1 − q) ξ = sqrt(ᾱ_s) x̄_0 + σ_s (ρ ε_z + (1 − ρ) ε_avg + sqrt(1 − q) ξ),

    gives noise of variance σ_s² (q + 1 − q) = σ_s² and leaves the signal untouched: x_s is distributed
    as q(x_s | x̄_0) = N(sqrt(ᾱ_s) x̄_0, (1 − ᾱ_s) I), exactly what the sampler assumes at s. For the
    ρ-mix 1 − q = 2ρ(1 − ρ) (0.42 at ρ = 0.7; none at ρ ∈ {0, 1} or for a single noised latent, q = 1).

    Args:
        mixed: Ē, any shape.
        noise: ξ ~ N(0, I), same shape (drawn from the image's own seed).
        alpha_bar: ᾱ_s.
        noise_fraction: q (:func:`mix_noise_fraction`; 1 for a single noised latent).

    Returns:
        x_s, same shape and dtype as ``mixed``.
    """
    if noise.shape != mixed.shape:
        raise ValueError(f"noise {tuple(noise.shape)} must have the shape of the mixed latent {tuple(mixed.shape)}")
    return mixed + top_up_std(alpha_bar, noise_fraction) * noise.to(mixed.dtype)


def fresh_timestep(alphas_cumprod: torch.Tensor, timestep: int, noise_fraction: float, min_fresh_fraction: float) -> int:
    """The first t ≥ s at which at least ``min_fresh_fraction`` of a latent's noise is its own.

    After :func:`top_up_latent` a latent at s holds shared noise (variance q σ_s², the same for
    every image started from the same centroid) and its own noise ((1 − q) σ_s²). Diffusing it
    forward to t ≥ s (:func:`diffuse_forward`) scales the shared part by ᾱ_t/ᾱ_s and adds own noise,
    so the own fraction of the noise at t is

        f_t = 1 − q (ᾱ_t / ᾱ_s) (1 − ᾱ_s) / (1 − ᾱ_t),

    which grows with t (f_s = 1 − q). Returns s when 1 − q already reaches the floor, else the
    smallest t with f_t ≥ the floor (T − 1 if none does).

    Args:
        alphas_cumprod: ᾱ_0 … ᾱ_{T−1} of the scheduler.
        timestep: s.
        noise_fraction: q of the latent at s.
        min_fresh_fraction: the floor, in [0, 1).
    """
    _check_fraction("noise_fraction", noise_fraction)
    _check_fraction("min_fresh_fraction", min_fresh_fraction, upper_open=True)
    abar = alphas_cumprod.detach().to("cpu", torch.float64)
    total = abar.numel()
    if not 0 <= int(timestep) < total:
        raise ValueError(f"timestep must be an int in [0, {total - 1}], got {timestep!r}")
    s, q = int(timestep), float(noise_fraction)
    if 1.0 - q >= min_fresh_fraction:
        return s
    a_s = abar[s]
    a_t = abar[s:]
    fresh = 1.0 - q * (a_t / a_s) * (1.0 - a_s) / (1.0 - a_t)
    ok = torch.nonzero(fresh >= min_fresh_fraction)
    return s + int(ok[0]) if ok.numel() else total - 1


def diffuse_forward(x_s: torch.Tensor, noise: torch.Tensor, *, alpha_bar_s: float, alpha_bar_t: float) -> torch.Tensor:
    """x_t = sqrt(ᾱ_t/ᾱ_s) x_s + sqrt(1 − ᾱ_t/ᾱ_s) ξ: the forward process from s to t ≥ s.

    q(x_t | x_s) = N(sqrt(ᾱ_t/ᾱ_s) x_s, (1 − ᾱ_t/ᾱ_s) I) is the product of the one-step kernels of
    Ho et al. 2020, Eq. 2; applied to x_s ~ q(x_s | x_0) it gives exactly q(x_t | x_0) (Eq. 4).

    Args:
        x_s: latent at s.
        noise: ξ ~ N(0, I), same shape.
        alpha_bar_s: ᾱ_s.
        alpha_bar_t: ᾱ_t ≤ ᾱ_s.
    """
    a_s, a_t = float(alpha_bar_s), float(alpha_bar_t)
    if not 0.0 < a_t <= a_s <= 1.0:
        raise ValueError(f"need 0 < ᾱ_t <= ᾱ_s <= 1 (t >= s), got ᾱ_s={a_s!r}, ᾱ_t={a_t!r}")
    if noise.shape != x_s.shape:
        raise ValueError(f"noise {tuple(noise.shape)} must have the shape of x_s {tuple(x_s.shape)}")
    ratio = a_t / a_s
    return math.sqrt(ratio) * x_s + math.sqrt(1.0 - ratio) * noise.to(x_s.dtype)


@dataclass(frozen=True)
class GenerationRequest:
    """One synthetic image to make.

    Args:
        class_name: folder name of the class.
        label: class index.
        client: the client whose centroid the image starts from.
        centroid_index: which of that client's centroids of the class; -1 for the class average
            (a client that uploaded its mean only).
        latent: Ē, (C, h, w), noised at ``timestep``, before the per-image top-up (shared by the
            requests of one centroid).
        timestep: s, the noise level of ``latent``.
        prompt: the text prompt.
        seed: per-image seed derived from (seed, label, index): the source of the image's fresh noise.
        index: position of the image within its class (its file name).
        noise_fraction: q, the noise variance of ``latent`` over σ_s² (ρ² + (1 − ρ)² for the ρ-mix,
            1 for a single noised latent); :func:`start_latent` tops it up to σ_s².
    """

    class_name: str
    label: int
    client: int
    centroid_index: int
    latent: torch.Tensor
    timestep: int
    prompt: str
    seed: int
    index: int
    noise_fraction: float = 1.0

    @property
    def relpath(self) -> str:
        """``<class_name>/<index>.png`` (path separators in the class name become ``_``)."""
        folder = self.class_name.replace("/", "_").replace(os.sep, "_")
        return f"{folder}/{self.index:06d}.png"


def _largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (Hamilton's method; ties → lower index)."""
    weight_sum = sum(weights)
    quotas = [total * w / weight_sum for w in weights]
    shares = [int(math.floor(q)) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    return shares


def plan_generation(
    uploads_by_client: Mapping[int, Sequence[ClassLatentUpload]],
    class_names: Sequence[str],
    prompts_by_class: Mapping[str, Sequence[str]],
    *,
    volume_per_class: Mapping[int, int],
    rho: float,
    seed: int,
) -> list[GenerationRequest]:
    """Every image to synthesise, with its starting latent, timestep, prompt and seed.

    Class k's ``volume_per_class[k]`` images are dealt to the clients holding k in proportion to
    their counts D_i^k (largest remainder, ties to the lower client id); a client's share goes
    round-robin over its centroids, each mixed as Ē = ρ·e_z + (1 − ρ)·e_avg (q = ρ² + (1 − ρ)²). A
    client that uploaded its class average only (≤ Z samples, see :mod:`.latents`) starts all its
    images from e_avg (q = 1). Prompts of the class are used in turn, starting at an offset drawn
    from (seed, label). Requests that share a centroid share one mixed latent tensor; what makes
    each image its own sample is the fresh noise drawn from its ``seed`` (:func:`start_latent`).

    Args:
        uploads_by_client: ``{client: [ClassLatentUpload, ...]}``.
        class_names: name of each label (``class_names[label]``).
        prompts_by_class: ``{class_name: [prompt, ...]}`` (e.g. from :func:`expand_with_cache`).
        volume_per_class: images per label (from :func:`synthetic_volume`).
        rho: ρ of :func:`mix_latents`.
        seed: seed of the per-image seeds and the prompt offsets.

    Returns:
        Requests ordered by label, then index.
    """
    q_mix = mix_noise_fraction(rho)  # validates rho once, before any work
    by_label: dict[int, list[tuple[int, ClassLatentUpload]]] = defaultdict(list)
    for client in sorted(uploads_by_client):
        for up in uploads_by_client[client]:
            by_label[up.label].append((client, up))
    requests: list[GenerationRequest] = []
    for label in sorted(volume_per_class):
        volume = int(volume_per_class[label])
        if volume <= 0:
            continue
        holders = [(c, up) for c, up in by_label.get(label, []) if up.count > 0]
        if not holders:
            raise ValueError(f"class {label} asks for {volume} images but no client uploaded latents for it")
        if not 0 <= label < len(class_names):
            raise ValueError(f"label {label} has no entry in class_names (length {len(class_names)})")
        name = class_names[label]
        prompts = list(prompts_by_class.get(name, []))
        if not prompts:
            raise ValueError(f"no prompts for class {name!r}; expand its label first")
        offset = int(np.random.default_rng([int(seed), int(label)]).integers(len(prompts)))
        shares = _largest_remainder(volume, [up.count for _, up in holders])
        index = 0
        for (client, up), share in zip(holders, shares):
            num_z = up.centroids.shape[0]
            if num_z == 0:  # mean-only upload: every image starts from the noised class average
                starts, q = [(-1, up.mean)], 1.0
            else:
                starts = [(z, mix_latents(up.centroids[z], up.mean, rho)) for z in range(min(share, num_z))]
                q = q_mix
            for j in range(share):
                z, latent = starts[j % len(starts)]
                requests.append(
                    GenerationRequest(
                        class_name=name,
                        label=int(label),
                        client=int(client),
                        centroid_index=z,
                        latent=latent,
                        timestep=int(up.timestep),
                        prompt=prompts[(offset + index) % len(prompts)],
                        seed=derive_seed(seed, label, index),
                        index=index,
                        noise_fraction=q,
                    )
                )
                index += 1
    return requests


def start_latent(
    request: GenerationRequest, alphas_cumprod: torch.Tensor, *, min_fresh_fraction: float
) -> tuple[torch.Tensor, int]:
    """The latent an image's sampling chain starts from, and the timestep it starts at.

    Two standard normals are drawn on the CPU from ``request.seed`` (so the result does not depend on
    batching or device): ξ₁ tops Ē up to the schedule's noise at s (:func:`top_up_latent`); if the
    image's own share of the noise is still below ``min_fresh_fraction``, ξ₂ diffuses it forward to
    t = :func:`fresh_timestep` (:func:`diffuse_forward`).

    Args:
        request: one planned image.
        alphas_cumprod: the scheduler's ᾱ table.
        min_fresh_fraction: floor on the image's own share of the start noise, in [0, 1).

    Returns:
        ``(x, t)``: (C, h, w) float32 latent distributed as q(x_t | x̄_0), and t ≥ s.
    """
    abar = alphas_cumprod.detach().to("cpu", torch.float64)
    s = int(request.timestep)
    t = fresh_timestep(abar, s, request.noise_fraction, min_fresh_fraction)
    gen = torch.Generator().manual_seed(int(request.seed))
    shape = tuple(request.latent.shape)
    xi_top = torch.randn(shape, generator=gen, dtype=torch.float64)
    xi_fwd = torch.randn(shape, generator=gen, dtype=torch.float64)
    x = top_up_latent(
        request.latent.detach().to("cpu", torch.float64),
        xi_top,
        alpha_bar=float(abar[s]),
        noise_fraction=request.noise_fraction,
    )
    if t != s:
        x = diffuse_forward(x, xi_fwd, alpha_bar_s=float(abar[s]), alpha_bar_t=float(abar[t]))
    return x.to(torch.float32), t


# ------------------------------------------------------------------------------------------------
# text conditioning and sampling


@torch.no_grad()
def encode_prompts(components: DiffusionComponents, prompts: Sequence[str]) -> torch.Tensor:
    """CLIP text embeddings (last hidden state) that condition SD's UNet: (B, L, D), L = 77 for SD."""
    tok = components.tokenizer(
        list(prompts),
        padding="max_length",
        max_length=components.tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    )
    encoder = components.text_encoder
    return encoder(tok.input_ids.to(encoder.device), return_dict=False)[0]


def plms_chain(timestep: int, *, num_train_timesteps: int, num_inference_steps: int, final_is_t0: bool) -> list[int]:
    """PLMS timesteps from s down to 0, with the repeat that PNDM's ``set_timesteps`` writes.

    With step r = T // n the chain visits s, s − r, s − 2r, … ≥ 0 and repeats the second entry:
    ``[s, s−r, s−r, s−2r, …]``, exactly as ``PNDMScheduler.set_timesteps`` does for the full chain
    (so for s equal to its first timestep the two agree). A last entry 0 is dropped when the
    scheduler's final ᾱ is ᾱ_0 (``set_alpha_to_one=False``): that step would go from ᾱ_0 to ᾱ_0.

    Args:
        timestep: s, the noise level of the input latents.
        num_train_timesteps: T.
        num_inference_steps: n of the full 0…T chain (as in img2img, a start at s runs ≈ n·s/T steps).
        final_is_t0: whether the sampler ends at ᾱ_0 rather than at 1.
    """
    r = num_train_timesteps // num_inference_steps
    unique = list(range(int(timestep), -1, -r))
    if final_is_t0 and unique and unique[-1] == 0:
        unique.pop()
    if len(unique) < 2:
        return unique
    return [unique[0], unique[1], *unique[1:]]


def _check_pndm(scheduler) -> None:
    from diffusers import PNDMScheduler  # here, not at import: a run that never samples never loads diffusers

    if not isinstance(scheduler, PNDMScheduler):
        raise TypeError(f"the sampler needs SD v1-5's PNDMScheduler, got {type(scheduler).__name__}")
    if not scheduler.config.skip_prk_steps:
        raise ValueError("the sampler needs a PNDMScheduler with skip_prk_steps=True (PLMS only, as SD v1-5)")


@torch.no_grad()
def denoise_latents(
    unet: torch.nn.Module,
    scheduler: PNDMScheduler,
    latents: torch.Tensor,
    *,
    timestep: int,
    num_inference_steps: int,
    text_embeddings: torch.Tensor,
    uncond_embeddings: torch.Tensor | None = None,
    guidance_scale: float = 7.5,
    predict_x0: bool = True,
) -> torch.Tensor:
    """Run PNDM (PLMS) from latents noised at timestep s down to clean latents x_0.

    Each step evaluates ε̂ = ε(x, ∅) + g·(ε(x, c) − ε(x, ∅)) (classifier-free guidance; off when
    g ≤ 1 or no ``uncond_embeddings``) and lets the scheduler take the PLMS step along
    :func:`plms_chain`. SD's sampler stops at ᾱ_0 < 1 (``set_alpha_to_one=False``), which still
    holds sqrt(1 − ᾱ_0) ≈ 0.03 of noise; with ``predict_x0`` one more UNet call at t = 0 removes
    it: x_0 = (x − sqrt(1 − ᾱ_0) ε̂) / sqrt(ᾱ_0) (Ho et al. 2020, Eq. 15) — one extra evaluation
    per chain.

    Args:
        unet: ε-predicting ``UNet2DConditionModel`` (called as ``unet(x, t, encoder_hidden_states=e)``).
        scheduler: SD's ``PNDMScheduler``; ``set_timesteps`` is called here (it resets its state).
        latents: (B, C, h, w) noised at ``timestep``; the sampler computes in this dtype.
        timestep: s in [0, T − 1].
        num_inference_steps: n of the full chain (step r = T // n).
        text_embeddings: (B, L, D) prompt embeddings.
        uncond_embeddings: (1 or B, L, D) empty-prompt embeddings for guidance.
        guidance_scale: g.
        predict_x0: finish with the t = 0 projection above.

    Returns:
        (B, C, h, w) denoised latents, dtype of ``latents``.
    """
    _check_pndm(scheduler)
    total = int(scheduler.config.num_train_timesteps)
    if not 0 <= int(timestep) < total:
        raise ValueError(f"timestep must be an int in [0, {total - 1}], got {timestep!r}")
    if not 1 <= int(num_inference_steps) <= total:
        raise ValueError(f"num_inference_steps must be an int in [1, {total}], got {num_inference_steps!r}")
    batch = latents.shape[0]
    if text_embeddings.shape[0] != batch:
        raise ValueError(f"{text_embeddings.shape[0]} text embeddings for {batch} latents")
    guided = uncond_embeddings is not None and guidance_scale > 1.0
    unet_dtype = getattr(unet, "dtype", latents.dtype)
    if guided:
        uncond = uncond_embeddings.expand(batch, *uncond_embeddings.shape[1:])
        context = torch.cat([uncond, text_embeddings]).to(unet_dtype)
    else:
        context = text_embeddings.to(unet_dtype)

    def eps(x: torch.Tensor, t: int) -> torch.Tensor:
        x_in = torch.cat([x, x]) if guided else x
        x_in = scheduler.scale_model_input(x_in, t).to(unet_dtype)
        t_in = torch.tensor(t, device=x.device)
        out = unet(x_in, t_in, encoder_hidden_states=context, return_dict=False)[0].to(x.dtype)
        if not guided:
            return out
        e_uncond, e_text = out.chunk(2)
        return e_uncond + guidance_scale * (e_text - e_uncond)

    final_alpha = float(scheduler.final_alpha_cumprod)
    scheduler.set_timesteps(int(num_inference_steps), device=latents.device)  # also resets the PLMS history
    chain = plms_chain(
        int(timestep),
        num_train_timesteps=total,
        num_inference_steps=int(num_inference_steps),
        final_is_t0=final_alpha < 1.0,
    )
    scheduler.timesteps = torch.tensor(chain, dtype=torch.long, device=latents.device)
    x = latents
    for t in chain:
        x = scheduler.step(eps(x, t), t, x, return_dict=False)[0]
    if predict_x0 and final_alpha < 1.0:
        x = (x - math.sqrt(1.0 - final_alpha) * eps(x, 0)) / math.sqrt(final_alpha)
    return x


@torch.no_grad()
def decode_latents(vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """VAE-decode scaled latents into images in [0, 1], (B, 3, H, W) float32.

    SD's VAE overflows in float16 on some latents (its decoder's activations pass 65504): an image with a
    non-finite value is decoded again in float32, that image alone (the others keep their half-precision
    bytes), and the VAE goes back to its dtype. A float32 or bfloat16 decode is never redone.
    """
    scale = float(vae.config.scaling_factor)
    images = vae.decode(latents.to(vae.dtype) / scale, return_dict=False)[0].float()
    if vae.dtype == torch.float16:
        bad = ~torch.isfinite(images).flatten(1).all(dim=1)  # (B,)
        if bool(bad.any()):
            vae.to(torch.float32)
            try:
                images[bad] = vae.decode(latents[bad].float() / scale, return_dict=False)[0].float()
            finally:
                vae.to(torch.float16)
    return ((images + 1.0) / 2.0).clamp(0.0, 1.0)


# ------------------------------------------------------------------------------------------------
# orchestration: batches → PNG files + manifest


def _to_uint8(image: torch.Tensor) -> np.ndarray:
    """(3, H, W) in [0, 1] → (H, W, 3) uint8 on the CPU, as the PNG holds it."""
    return (image.permute(1, 2, 0) * 255.0).round().to(torch.uint8).cpu().numpy()


def _save_png(image: torch.Tensor | np.ndarray, path: Path) -> None:
    array = _to_uint8(image) if isinstance(image, torch.Tensor) else image
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:  # an interrupted run never leaves a truncated image to be skipped
        Image.fromarray(array).save(tmp, format="PNG")


def _manifest_row(req: GenerationRequest, start_timestep: int) -> dict[str, object]:
    return {
        "path": req.relpath,
        "class": req.class_name,
        "label": req.label,
        "client": req.client,
        "centroid_index": req.centroid_index,
        "prompt": req.prompt,
        "timestep": req.timestep,
        "start_timestep": start_timestep,
        "seed": req.seed,
    }


def _batches(requests: Sequence[GenerationRequest], starts: Sequence[int], batch_size: int) -> list[list[GenerationRequest]]:
    """Batches of requests that share a start timestep (one sampling chain per batch)."""
    by_t: dict[int, list[GenerationRequest]] = defaultdict(list)
    for req, t in zip(requests, starts):
        by_t[t].append(req)
    return [by_t[t][i : i + batch_size] for t in sorted(by_t) for i in range(0, len(by_t[t]), batch_size)]


class _Writer:
    """PNG encoding off the sampling loop: one thread encodes and renames each image while the UNet samples the
    next batch (PIL's zlib releases the GIL). At most ``depth`` images wait (memory stays bounded); the first
    error of a write is raised at the next :meth:`put` or at :meth:`close`."""

    def __init__(self, depth: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="png-writer")
        self._pending: deque[Future] = deque()
        self._depth = max(int(depth), 1)

    def put(self, image: torch.Tensor, path: Path) -> None:
        array = _to_uint8(image)  # the device → host copy here, in the loop; the encoding in the thread
        while len(self._pending) >= self._depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(_save_png, array, path))

    def close(self, *, check: bool = True) -> None:
        """Wait for every write; raise the first one's error (``check``; False: the loop failed, its error is
        the report — the files written so far stay whole, each renamed into place)."""
        try:
            while self._pending:
                future = self._pending.popleft()
                if check:
                    future.result()
                else:
                    future.exception()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("synthesising"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not (enabled and console.is_terminal),
    )


def generate_images(
    components: DiffusionComponents,
    requests: Sequence[GenerationRequest],
    out_dir: str | Path,
    *,
    batch_size: int = 8,
    num_inference_steps: int = 50,
    guidance_scale: float = 7.5,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
    min_fresh_fraction: float = 0.25,
    rank: int = 0,
    world: int = 1,
) -> Path:
    """Denoise, decode and write every request as ``<out_dir>/<class>/<index>.png``; resumable.

    Each image starts from :func:`start_latent` (its ρ-mix topped up to the schedule's noise with
    fresh noise from its own seed); requests are sampled in batches of equal start timestep. Resuming:
    every image file is written whole then renamed, so one that exists is complete; a batch whose images
    all exist is skipped, one with any missing is sampled whole again (the same batch as an uninterrupted
    run, so the missing files come out byte-identical to that run's) and only its missing files are
    written. ``manifest.jsonl`` (one JSON object per
    image: path, class, label, client, centroid_index, prompt, timestep s, start_timestep t, seed)
    is rewritten at the end for all requests.

    Args:
        components: Stable Diffusion parts; moved to ``device``/``dtype`` in place.
        requests: from :func:`plan_generation`.
        out_dir: image folder root (a torchvision ``ImageFolder``).
        batch_size: images per sampling chain.
        num_inference_steps: n of the full PNDM chain.
        guidance_scale: classifier-free guidance g.
        device: where to run.
        dtype: network dtype (``torch.float16``/``bfloat16`` on a GPU; latents stay float32).
        progress: show a rich progress bar (only when stderr is a terminal).
        min_fresh_fraction: floor on each image's own share of its start noise (:func:`fresh_timestep`).
            The ρ-mix at the default ρ = 0.7 gives 0.42 at s already; the floor acts on mean-only
            uploads and on ρ near 0 or 1, which start a little above s. 0 never moves the start.
        rank: this process's share when ``world`` processes generate together: it samples and writes the batches
            dealt to it in turn (:meth:`~fl_lightning.dealing.Deal.strided`: batch b to rank b mod ``world``;
            batches are sorted by start timestep, so a turn gives each rank about as many long chains as short
            ones), batches formed over all requests, as one process forms them (so each image is the one
            process's, byte for byte on the same device); rank 0 writes the one manifest (it depends on the
            requests alone). The caller lets every rank finish before reading the folder.
        world: how many processes share the requests (1: this one does all).

    Returns:
        Path of the manifest.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    _check_fraction("min_fresh_fraction", min_fresh_fraction, upper_open=True)
    out_dir = Path(out_dir)
    paths = [req.relpath for req in requests]
    if len(set(paths)) != len(paths):
        raise ValueError("requests must have distinct (class_name, index) pairs")
    abar = components.scheduler.alphas_cumprod.detach().to("cpu", torch.float64)
    start_t = _start_timesteps(requests, abar, min_fresh_fraction)
    pending = _pending_batches(requests, start_t, out_dir, batch_size=batch_size, rank=rank, world=world)
    out_dir.mkdir(parents=True, exist_ok=True)
    if pending:
        _sample_pending(
            components,
            pending,
            out_dir,
            abar,
            batch_size=batch_size,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            device=device,
            dtype=dtype,
            progress=progress,
            min_fresh_fraction=min_fresh_fraction,
        )
    manifest = out_dir / MANIFEST_NAME
    if rank != 0:
        return manifest
    with atomic_path(manifest) as tmp, tmp.open("w", encoding="utf-8") as f:
        for req, t in zip(requests, start_t):
            f.write(json.dumps(_manifest_row(req, t), ensure_ascii=False) + "\n")
    return manifest


def _start_timesteps(requests: Sequence[GenerationRequest], abar: torch.Tensor, min_fresh_fraction: float) -> list[int]:
    """Each request's start timestep t (:func:`fresh_timestep` of its s and noise fraction, computed once per pair)."""
    memo: dict[tuple[int, float], int] = {}
    for req in requests:
        key = (int(req.timestep), float(req.noise_fraction))
        if key not in memo:
            memo[key] = fresh_timestep(abar, key[0], key[1], min_fresh_fraction)
    return [memo[(int(req.timestep), float(req.noise_fraction))] for req in requests]


def _pending_batches(
    requests: Sequence[GenerationRequest], start_t: Sequence[int], out_dir: Path, *, batch_size: int, rank: int, world: int
) -> list[tuple[list[GenerationRequest], list[bool]]]:
    """This rank's batches with any image missing under ``out_dir``, each with which of its images are missing."""
    # Batches are formed over ALL requests, as an uninterrupted run forms them, and a batch with any image
    # missing is sampled whole: a batch's arithmetic (its UNet and VAE calls) depends on what else is in it at
    # float round-off, so regrouping the missing images would change their bytes. Only missing files are written.
    batches = _batches(requests, start_t, batch_size)
    note("generation batches", len(batches), within="generation")  # what the ranks deal (benchmarks/rank_model.py)
    batches = [batches[b] for b in Deal(rank, world).strided(len(batches))]
    missing = [[not (out_dir / req.relpath).is_file() for req in batch] for batch in batches]
    return [(batch, todo) for batch, todo in zip(batches, missing) if any(todo)]


def _sample_pending(
    components: DiffusionComponents,
    pending: Sequence[tuple[list[GenerationRequest], list[bool]]],
    out_dir: Path,
    abar: torch.Tensor,
    *,
    batch_size: int,
    num_inference_steps: int,
    guidance_scale: float,
    device: torch.device | str,
    dtype: torch.dtype,
    progress: bool,
    min_fresh_fraction: float,
) -> None:
    """Sample every batch of ``pending`` whole and write its missing images (``components`` moved to ``device`` /
    ``dtype``); returns once every file is renamed into place, or raises the sampling's or the first write's error."""
    components.to(device, dtype)
    device = components.device
    uncond = encode_prompts(components, [""])  # (1, L, D), shared by every batch
    writer = _Writer(depth=2 * batch_size)
    try:
        with _progress(progress) as bar:
            task = bar.add_task("synthesising", total=sum(sum(todo) for _, todo in pending))
            for batch, todo in pending:
                images = _sample_batch(
                    components,
                    batch,
                    abar,
                    uncond,
                    num_inference_steps=num_inference_steps,
                    guidance_scale=guidance_scale,
                    device=device,
                    min_fresh_fraction=min_fresh_fraction,
                )
                for req, image, write in zip(batch, images, todo):
                    if write:
                        writer.put(image, out_dir / req.relpath)
                bar.advance(task, sum(todo))
    except BaseException:
        writer.close(check=False)
        raise
    writer.close()  # every file renamed into place (or the first write's error) before the manifest


def _sample_batch(
    components: DiffusionComponents,
    batch: Sequence[GenerationRequest],
    abar: torch.Tensor,
    uncond: torch.Tensor,
    *,
    num_inference_steps: int,
    guidance_scale: float,
    device: torch.device,
    min_fresh_fraction: float,
) -> torch.Tensor:
    """One sampling chain: the batch's start latents denoised from their shared start timestep and decoded,
    (B, 3, H, W) in [0, 1]."""
    starts = [start_latent(req, abar, min_fresh_fraction=min_fresh_fraction) for req in batch]
    latents = torch.stack([x for x, _ in starts]).to(device=device, dtype=torch.float32)
    x0 = denoise_latents(
        components.unet,
        components.scheduler,
        latents,
        timestep=starts[0][1],
        num_inference_steps=num_inference_steps,
        text_embeddings=encode_prompts(components, [req.prompt for req in batch]),
        uncond_embeddings=uncond,
        guidance_scale=guidance_scale,
    )
    return decode_latents(components.vae, x0)
