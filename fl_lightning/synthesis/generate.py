"""FeDiSyn step 1, server side: from noised client latents to a folder of synthetic images.

1. Volumes (:func:`class_totals`, :func:`synthetic_volume`): the server sums the clients' counts
   into D^k = Σ_i D_i^k per class and synthesises round(λ · D^k) images of class k.
2. Plan (:func:`plan_generation`): class k's images are shared among the clients that hold k in
   proportion to their counts D_i^k (largest remainder), and within a client round-robin over its
   centroids. Each image starts from the latent mix Ē = ρ·e_z + (1 − ρ)·e_avg (:func:`mix_latents`)
   of one noised centroid e_z and the client's noised class average e_avg, and takes the class's
   prompts in turn.
3. Denoise (:func:`denoise_latents`): the latents are already noised at the client's timestep s,
   so the server runs the PNDM (PLMS) sampler from s down to 0 with the UNet conditioned on the
   CLIP text embeddings of the prompt, with classifier-free guidance
   ε̂ = ε(x, ∅) + g · (ε(x, c) − ε(x, ∅)) (Ho & Salimans 2022, Eq. 6).
4. Decode and write (:func:`generate_images`): ``<out>/<class>/<index>.png`` (a torchvision
   ``ImageFolder``) plus ``manifest.jsonl``; re-running skips images that already exist.

Why our own sampling loop: diffusers' img2img pipeline treats a 4-channel ``image`` as *clean*
latents and noises them again. And PLMS cannot start mid-chain by slicing the scheduler's
timesteps: its first two calls are an Euler step and a Heun-style correction at the *same*
timestep (the scheduler's ``set_timesteps`` writes the second timestep twice). :func:`plms_chain`
builds that pattern starting exactly at s.

Reproducibility: PNDM sampling has no randomness, so an image depends only on its request
(latent, timestep, prompt); batching or resuming cannot change it beyond float round-off. Each
request still carries a per-image seed derived from (seed, label, index), recorded in the
manifest, which also fixes where the prompt cycle of a class starts.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers import PNDMScheduler
from PIL import Image

from fl_lightning.errors import ConfigError
from fl_lightning.models.diffusion import DiffusionComponents
from fl_lightning.synthesis.latents import ClassLatentUpload

__all__ = [
    "GenerationRequest",
    "class_totals",
    "synthetic_volume",
    "mix_latents",
    "plan_generation",
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
        raise ConfigError("fedisyn.synthetic_lambda", lam, "a finite float >= 0")
    return {label: int(math.floor(lam * count + 0.5)) for label, count in totals.items()}


def mix_latents(centroid: torch.Tensor, mean: torch.Tensor, rho: float) -> torch.Tensor:
    """Ē = ρ · e_z + (1 − ρ) · e_avg: a noised centroid pulled towards the client's class average.

    Args:
        centroid: e_z, (C, h, w) (or a batch of them).
        mean: e_avg, broadcastable to ``centroid``.
        rho: ρ in [0, 1]; 1 keeps the centroid, 0 the average.
    """
    if not 0.0 <= float(rho) <= 1.0:
        raise ConfigError("fedisyn.rho", rho, "a float in [0, 1]")
    return rho * centroid + (1.0 - rho) * mean


@dataclass(frozen=True)
class GenerationRequest:
    """One synthetic image to make.

    Args:
        class_name: folder name of the class.
        label: class index.
        client: the client whose centroid the image starts from.
        centroid_index: which of that client's centroids of the class.
        latent: Ē, (C, h, w), noised at ``timestep``.
        timestep: s, where denoising starts.
        prompt: the text prompt.
        seed: per-image seed derived from (seed, label, index).
        index: position of the image within its class (its file name).
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


def _image_seed(seed: int, label: int, index: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(label), int(index)]).generate_state(1)[0])


def plan_generation(
    uploads_by_client: Mapping[int, Sequence[ClassLatentUpload]],
    class_names: Sequence[str],
    prompts_by_class: Mapping[str, Sequence[str]],
    *,
    volume_per_class: Mapping[int, int],
    rho: float,
    seed: int,
) -> list[GenerationRequest]:
    """Every image to synthesise, with its starting latent, timestep and prompt.

    Class k's ``volume_per_class[k]`` images are dealt to the clients holding k in proportion to
    their counts D_i^k (largest remainder, ties to the lower client id); a client's share goes
    round-robin over its centroids. Prompts of the class are used in turn, starting at an offset
    drawn from (seed, label). Requests that share a centroid share one mixed latent tensor.

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
    mix_latents(torch.zeros(()), torch.zeros(()), rho)  # validate rho once, before any work
    by_label: dict[int, list[tuple[int, ClassLatentUpload]]] = defaultdict(list)
    for client in sorted(uploads_by_client):
        for up in uploads_by_client[client]:
            by_label[up.label].append((client, up))
    requests: list[GenerationRequest] = []
    for label in sorted(volume_per_class):
        volume = int(volume_per_class[label])
        if volume <= 0:
            continue
        holders = [(c, up) for c, up in by_label.get(label, []) if up.count > 0 and up.centroids.shape[0] > 0]
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
            mixed = [mix_latents(up.centroids[z], up.mean, rho) for z in range(min(share, up.centroids.shape[0]))]
            for j in range(share):
                z = j % up.centroids.shape[0]
                requests.append(
                    GenerationRequest(
                        class_name=name,
                        label=int(label),
                        client=int(client),
                        centroid_index=z,
                        latent=mixed[z],
                        timestep=int(up.timestep),
                        prompt=prompts[(offset + index) % len(prompts)],
                        seed=_image_seed(seed, label, index),
                        index=index,
                    )
                )
                index += 1
    return requests


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
    if not isinstance(scheduler, PNDMScheduler) or not scheduler.config.skip_prk_steps:
        raise ConfigError(
            "fedisyn.scheduler", type(scheduler).__name__, "PNDMScheduler with skip_prk_steps=True (SD v1-5's)"
        )


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
        raise ConfigError("fedisyn.timestep", timestep, f"an int in [0, {total - 1}]")
    if not 1 <= int(num_inference_steps) <= total:
        raise ConfigError("fedisyn.num_inference_steps", num_inference_steps, f"an int in [1, {total}]")
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
    """VAE-decode scaled latents into images in [0, 1], (B, 3, H, W) float32."""
    scale = float(vae.config.scaling_factor)
    images = vae.decode(latents.to(vae.dtype) / scale, return_dict=False)[0]
    return ((images.float() + 1.0) / 2.0).clamp(0.0, 1.0)


# ------------------------------------------------------------------------------------------------
# orchestration: batches → PNG files + manifest


def _save_png(image: torch.Tensor, path: Path) -> None:
    array = (image.permute(1, 2, 0) * 255.0).round().to(torch.uint8).cpu().numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    Image.fromarray(array).save(tmp, format="PNG")
    os.replace(tmp, path)  # atomic: an interrupted run never leaves a truncated image to be skipped


def _manifest_row(req: GenerationRequest) -> dict[str, object]:
    return {
        "path": req.relpath,
        "class": req.class_name,
        "label": req.label,
        "client": req.client,
        "centroid_index": req.centroid_index,
        "prompt": req.prompt,
        "timestep": req.timestep,
        "seed": req.seed,
    }


def _batches(requests: Sequence[GenerationRequest], batch_size: int) -> list[list[GenerationRequest]]:
    """Batches of requests that share a timestep (one sampling chain per batch)."""
    by_t: dict[int, list[GenerationRequest]] = defaultdict(list)
    for req in requests:
        by_t[req.timestep].append(req)
    return [
        by_t[t][i : i + batch_size] for t in sorted(by_t) for i in range(0, len(by_t[t]), batch_size)
    ]


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
) -> Path:
    """Denoise, decode and write every request as ``<out_dir>/<class>/<index>.png``; resumable.

    Requests whose image file already exists are skipped; the others are sampled in batches of
    equal timestep. ``manifest.jsonl`` (one JSON object per image: path, class, label, client,
    centroid_index, prompt, timestep, seed) is rewritten at the end for all requests.

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

    Returns:
        Path of the manifest.
    """
    if batch_size < 1:
        raise ConfigError("fedisyn.batch_size", batch_size, "an int >= 1")
    out_dir = Path(out_dir)
    paths = [req.relpath for req in requests]
    if len(set(paths)) != len(paths):
        raise ValueError("requests must have distinct (class_name, index) pairs")
    pending = [req for req in requests if not (out_dir / req.relpath).is_file()]
    out_dir.mkdir(parents=True, exist_ok=True)
    if pending:
        components.to(device, dtype)
        device = components.device
        uncond = encode_prompts(components, [""])  # (1, L, D), shared by every batch
        with _progress(progress) as bar:
            task = bar.add_task("synthesising", total=len(pending))
            for batch in _batches(pending, batch_size):
                latents = torch.stack([req.latent for req in batch]).to(device=device, dtype=torch.float32)
                x0 = denoise_latents(
                    components.unet,
                    components.scheduler,
                    latents,
                    timestep=batch[0].timestep,
                    num_inference_steps=num_inference_steps,
                    text_embeddings=encode_prompts(components, [req.prompt for req in batch]),
                    uncond_embeddings=uncond,
                    guidance_scale=guidance_scale,
                )
                for req, image in zip(batch, decode_latents(components.vae, x0)):
                    _save_png(image, out_dir / req.relpath)
                bar.advance(task, len(batch))
    manifest = out_dir / MANIFEST_NAME
    tmp = manifest.with_name(manifest.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for req in requests:
            f.write(json.dumps(_manifest_row(req), ensure_ascii=False) + "\n")
    os.replace(tmp, manifest)
    return manifest
