"""FeDiSyn step 1, client side: per-class latent centroids, noised before they leave the client.

Each client k (FeDiSyn, Sec. "Synthetic data generation"):

1. encodes its images with the Stable Diffusion VAE, z = scaling_factor · E(2x − 1)
   (:func:`encode_images`);
2. clusters the latents of every class i into Z centroids e_z with k-means and takes the class's
   average latent e_avg (:func:`class_centroids`);
3. noises centroids and average at a diffusion timestep s with the forward process
   x_s = sqrt(ᾱ_s) x_0 + sqrt(1 − ᾱ_s) ε (:func:`noise_latents`, the scheduler's own ``add_noise``);
4. uploads, per class, only the noised centroids, the noised average, the label, the sample
   count D_i^k and the number of centroids Z' (:class:`ClassLatentUpload`). Images and clean
   latents stay on the client.

Privacy departure (small classes). k-means with Z centroids over N ≤ Z samples returns the samples
themselves, so a literal implementation would upload per-sample latents of every small class. Here
a class with N ≤ Z samples uploads its average only (Z' = 0, an empty centroid tensor, recorded as
``num_centroids = 0`` in the upload); the server then starts all of that client's images of the
class from e_avg (:func:`fl_lightning.synthesis.generate.plan_generation`). We chose the mean over
"fewer centroids of groups of samples" because it is the one statistic the method uploads for
every class anyway, so a small class reveals nothing beyond what a large one does. With N > Z,
k-means may still leave a cluster of one sample, whose centroid *is* that sample: such a cluster is
never uploaded — only the centroids of clusters of at least two samples are (Z' ≤ Z; a class whose
clusters are all singletons uploads its average only). Caveat: with N = 1 the class average is the
sample (noised at s) — any per-class upload reveals that much.

Noise floor: s ≥ ``min_timestep`` ≥ 1 (the paper draws s from 1..S): at s = 0 the forward process
adds almost no noise (1 − ᾱ_0 ≈ 8.5e-4 for SD v1-5) and the upload would be a clean latent.

Randomness (k-means initialisation, the timestep when it is drawn, the noise ε) comes from the
``seed`` argument and the class label only, so a class's upload does not depend on which other
classes the client holds or on the order it visits them. Give each client its own seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fl_lightning.federation.transport import SCALAR_BYTES, Upload

_MIN_CLUSTER = 2  # samples a k-means cluster needs before its centroid may leave the client

__all__ = [
    "ClassLatentUpload",
    "vae_inputs",
    "encode_images",
    "class_centroids",
    "noise_latents",
    "client_latent_uploads",
    "to_upload",
    "from_upload",
]


@dataclass(frozen=True)
class ClassLatentUpload:
    """What one client sends the server for one class — and nothing else.

    Args:
        label: class index i.
        count: D_i^k, the number of the client's samples of class i.
        timestep: diffusion timestep s at which ``centroids`` and ``mean`` were noised.
        centroids: noised k-means centroids, (Z', C, h, w): Z' = Z when count > Z, else Z' = 0
            (a small class sends its average only, see the module docstring).
        mean: noised class-average latent, (C, h, w).
    """

    label: int
    count: int
    timestep: int
    centroids: torch.Tensor
    mean: torch.Tensor

    @property
    def num_centroids(self) -> int:
        """Z', the number of uploaded centroids (0: the class average only)."""
        return int(self.centroids.shape[0])

    @property
    def mean_only(self) -> bool:
        """Whether the class was too small (count ≤ Z) to upload centroids."""
        return self.num_centroids == 0

    @property
    def num_bytes(self) -> int:
        """Size on the wire: the two tensors' bytes plus four scalars (label, count, timestep, Z')."""
        tensors = self.centroids.numel() * self.centroids.element_size() + self.mean.numel() * self.mean.element_size()
        return tensors + 4 * SCALAR_BYTES


def vae_inputs(
    images: torch.Tensor,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    size: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A batch of normalised ViT inputs back in [0, 1] on ``device``, resized to ``size`` × ``size``.

    The batch is moved first (on a GPU the de-normalisation and the resize then run there), then
    de-normalised (x · std + mean) and clamped, resized (bilinear, antialiased) and clamped again. On the
    CPU these are the ops, in the order, of the CPU path before (bit-identical).

    Args:
        images: (B, 3, H, W) float, normalised with ``mean``/``std``.
        mean, std: the per-channel statistics the images were normalised with.
        size: the side of the square output (the VAE's resolution); None keeps H × W.
        device: where the result lives (None: where ``images`` are).
    """
    x = images if device is None else images.to(device, non_blocking=True)
    m = torch.tensor(list(mean), device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(list(std), device=x.device).view(1, 3, 1, 1)
    x = (x * s + m).clamp(0, 1)
    if size is not None:
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)
    return x


def _autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """Autocast to ``dtype`` on ``device`` (None: autocast off, whatever an outer context set)."""
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None)


def _posterior_mean(vae: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """mean(E(x)) as float32 for x in [-1, 1], computed in ``dtype``.

    A VAE already in ``dtype`` (or asked for a half dtype while it is in another half dtype) runs as it
    is, on inputs in its dtype; a float32 VAE asked for float16/bfloat16 runs under autocast (its float32
    weights are not cast, so nothing is lost for the server's later use of it); a half VAE asked for
    float32 is cast to float32 for the call and back (exact: half → float32 → half).
    """
    held = vae.dtype
    if held == dtype or (held != torch.float32 and dtype != torch.float32):
        with _autocast(x.device, None):
            return vae.encode(x.to(held)).latent_dist.mean.float()
    if held == torch.float32:
        with _autocast(x.device, dtype):
            return vae.encode(x).latent_dist.mean.float()
    vae.to(torch.float32)
    try:
        with _autocast(x.device, None):
            return vae.encode(x.float()).latent_dist.mean.float()
    finally:
        vae.to(held)


@torch.no_grad()
def encode_images(
    vae: torch.nn.Module, images: torch.Tensor, *, batch_size: int = 16, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """VAE-encode images in [0, 1] into scaled latents z = scaling_factor · mean(E(2x − 1)).

    The posterior mean (not a sample) is used so a client's latents are deterministic; the noise
    that protects them is added later, at timestep s.

    Half precision: with ``dtype`` float16/bfloat16 the encoder's matmuls and convolutions run in it (autocast
    on a float32 VAE); an image whose latent holds a non-finite value (an fp16 overflow) is encoded again in
    float32, that image alone — the others keep their half-precision values (as
    :func:`fl_lightning.synthesis.generate.decode_latents` does for the decode).

    Args:
        vae: a diffusers ``AutoencoderKL`` (its ``config.scaling_factor`` is used, 0.18215 for SD v1).
        images: (B, 3, H, W) in [0, 1], any device/dtype (moved to the VAE's device).
        batch_size: images per encoder call.
        dtype: the compute dtype (:func:`fl_lightning.federation.precision.compute_dtype`); None: the VAE's own
            dtype, as before (float32 on the CPU: bit-identical).

    Returns:
        (B, C, H/f, W/f) float32 latents on the VAE's device.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    device = vae.device
    dtype = vae.dtype if dtype is None else dtype
    scale = float(vae.config.scaling_factor)
    out = []
    for start in range(0, images.shape[0], batch_size):
        chunk = images[start : start + batch_size].to(device=device)
        if dtype == vae.dtype:
            x = chunk.to(dtype) * 2.0 - 1.0  # [0,1] → [-1,1], in the VAE's dtype as before
        else:
            x = chunk.float() * 2.0 - 1.0
        z = _posterior_mean(vae, x, dtype)
        if dtype != torch.float32:
            bad = ~torch.isfinite(z).flatten(1).all(dim=1)  # (B,)
            if bool(bad.any()):
                z[bad] = _posterior_mean(vae, chunk[bad].float() * 2.0 - 1.0, torch.float32)
        out.append(z * scale)
    if not out:
        raise ValueError("encode_images got no images")
    return torch.cat(out)


def class_centroids(
    latents: torch.Tensor, *, num_centroids: int, seed: int, n_init: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    """k-means centroids e_z and the average e_avg of one class's latents.

    Args:
        latents: (N, C, h, w) latents of one class (N ≥ 1).
        num_centroids: Z. With N ≤ Z, k-means would return the samples themselves: no centroids
            are returned then (privacy; see the module docstring), only the average.
        seed: k-means ``random_state``.
        n_init: k-means restarts (scikit-learn ``n_init``).

    Returns:
        ``(centroids, mean)``: (Z', C, h, w) — the centroids of the clusters of at least two samples, in
        k-means order (Z' = 0 when N ≤ Z) — and (C, h, w), dtype and device of ``latents``.
    """
    if not isinstance(num_centroids, int) or isinstance(num_centroids, bool):
        raise TypeError(f"num_centroids must be an int, got {type(num_centroids).__name__}")
    if num_centroids < 1:
        raise ValueError(f"num_centroids (Z) must be an int >= 1, got {num_centroids!r}")
    if latents.ndim != 4 or latents.shape[0] == 0:
        raise ValueError(f"latents must be (N>=1, C, h, w), got {tuple(latents.shape)}")
    n = latents.shape[0]
    mean = latents.mean(dim=0)
    if n <= num_centroids:
        return latents.new_empty((0, *latents.shape[1:])), mean
    # k-means in float64 on the flattened latents; the centroids are cluster means of these.
    flat = latents.detach().reshape(n, -1).to("cpu", torch.float64).numpy()
    from sklearn.cluster import KMeans  # here: scikit-learn costs import time to runs that never cluster

    km = KMeans(n_clusters=num_centroids, n_init=n_init, random_state=seed).fit(flat)
    sizes = np.bincount(km.labels_, minlength=num_centroids)
    kept = km.cluster_centers_[sizes >= _MIN_CLUSTER]  # a singleton's centroid is its sample: never uploaded
    centroids = torch.from_numpy(kept).reshape(kept.shape[0], *latents.shape[1:])
    return centroids.to(device=latents.device, dtype=latents.dtype), mean


def noise_latents(scheduler, latents: torch.Tensor, timestep: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Forward-diffuse latents to timestep s: x_s = sqrt(ᾱ_s) x_0 + sqrt(1 − ᾱ_s) ε, ε ~ N(0, I).

    Uses the scheduler's own ``add_noise`` (DDPM forward process, Ho et al. 2020, Eq. 4), so the
    server's sampler and the client's noise share one ᾱ table.

    Args:
        scheduler: a diffusers scheduler with ``add_noise`` and ``config.num_train_timesteps``.
        latents: clean latents, any shape with a leading batch dimension.
        timestep: s in [0, num_train_timesteps − 1].
        generator: source of ε (on the latents' device).
    """
    total = int(scheduler.config.num_train_timesteps)
    if not 0 <= int(timestep) < total:
        raise ValueError(f"timestep must be an int in [0, {total - 1}], got {timestep!r}")
    noise = torch.randn(latents.shape, generator=generator, device=latents.device, dtype=latents.dtype)
    t = torch.full((latents.shape[0],), int(timestep), dtype=torch.long, device=latents.device)
    return scheduler.add_noise(latents, noise, t)


def _class_rng_seed(seed: int, label: int) -> list[int]:
    return [int(seed), int(label)]


def _group_by_class(
    vae: torch.nn.Module,
    images_by_class: Mapping[int, torch.Tensor] | Iterable[tuple[torch.Tensor, torch.Tensor]],
    batch_size: int,
    dtype: torch.dtype | None = None,
) -> dict[int, torch.Tensor]:
    if isinstance(images_by_class, Mapping):
        return {
            int(label): encode_images(vae, imgs, batch_size=batch_size, dtype=dtype)
            for label, imgs in images_by_class.items()
            if len(imgs) > 0
        }
    parts: dict[int, list[torch.Tensor]] = {}
    for images, labels in images_by_class:
        z = encode_images(vae, images, batch_size=batch_size, dtype=dtype)
        labels = torch.as_tensor(labels).to(z.device)
        for label in labels.unique().tolist():
            parts.setdefault(int(label), []).append(z[labels == label])
    return {label: torch.cat(chunks) for label, chunks in parts.items()}


def client_latent_uploads(
    vae: torch.nn.Module,
    scheduler,
    images_by_class: Mapping[int, torch.Tensor] | Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    num_centroids: int,
    timestep: int | None,
    max_timestep: int,
    seed: int,
    batch_size: int = 16,
    n_init: int = 10,
    min_timestep: int = 1,
    dtype: torch.dtype | None = None,
) -> list[ClassLatentUpload]:
    """Everything one client sends the server in FeDiSyn step 1, one upload per class it holds.

    Args:
        vae: the SD ``AutoencoderKL`` (the client needs nothing else of Stable Diffusion).
        scheduler: the diffusion scheduler whose ``add_noise`` defines the forward process.
        images_by_class: ``{label: (N, 3, H, W) images in [0, 1]}``, or an iterable of
            ``(images, labels)`` batches (e.g. a DataLoader over the client's data).
        num_centroids: Z, centroids per class.
        timestep: the noise timestep s; ``None`` draws s uniformly in [``min_timestep``, ``max_timestep``] per class.
        max_timestep: S, the upper end of the random timestep.
        min_timestep: the floor of s (>= 1: s = 0 would upload an almost clean latent).
        seed: the client's seed (k-means, timestep draw, noise).
        batch_size: images per VAE call.
        n_init: k-means restarts.
        dtype: the encoder's compute dtype (:func:`encode_images`); None: the VAE's own.

    Returns:
        Uploads sorted by label, tensors on the CPU.
    """
    total = int(scheduler.config.num_train_timesteps)
    if not 1 <= int(min_timestep) <= int(max_timestep) < total:
        raise ValueError(
            f"need 1 <= min_timestep <= max_timestep < {total} (s = 0 uploads an almost clean latent), "
            f"got min_timestep={min_timestep!r}, max_timestep={max_timestep!r}"
        )
    if timestep is not None and not int(min_timestep) <= int(timestep) < total:
        raise ValueError(
            f"timestep must be None or an int in [{int(min_timestep)}, {total - 1}] (s >= min_timestep), got {timestep!r}"
        )
    latents_by_class = _group_by_class(vae, images_by_class, batch_size, dtype)
    uploads = []
    for label in sorted(latents_by_class):
        z = latents_by_class[label]  # (D_i^k, C, h, w), clean: never leaves this function
        centroids, mean = class_centroids(z, num_centroids=num_centroids, seed=seed, n_init=n_init)
        rng = np.random.default_rng(_class_rng_seed(seed, label))
        s = int(rng.integers(int(min_timestep), int(max_timestep) + 1)) if timestep is None else int(timestep)
        gen = torch.Generator(device=z.device).manual_seed(int(rng.integers(0, 2**63 - 1)))
        noised = noise_latents(scheduler, torch.cat([centroids, mean[None]]), s, gen)
        uploads.append(
            ClassLatentUpload(
                label=int(label),
                count=int(z.shape[0]),
                timestep=s,
                centroids=noised[:-1].cpu(),
                mean=noised[-1].cpu(),
            )
        )
    return uploads


def to_upload(uploads: Iterable[ClassLatentUpload]) -> Upload:
    """Pack a client's per-class uploads into one transport :class:`~fl_lightning.federation.transport.Upload`.

    Keys are ``class<label>.centroids`` / ``.mean`` (tensors) and ``.label`` / ``.count`` /
    ``.timestep`` / ``.num_centroids`` (scalars; ``num_centroids`` 0 marks a mean-only class), so
    ``Upload.num_bytes`` equals the sum of the parts' ``num_bytes``.
    """
    out = Upload()
    for up in uploads:
        key = f"class{up.label}"
        out.tensors[f"{key}.centroids"] = up.centroids
        out.tensors[f"{key}.mean"] = up.mean
        out.meta.update(
            {
                f"{key}.label": up.label,
                f"{key}.count": up.count,
                f"{key}.timestep": up.timestep,
                f"{key}.num_centroids": up.num_centroids,
            }
        )
    return out


def from_upload(upload: Upload) -> list[ClassLatentUpload]:
    """Unpack :func:`to_upload`'s payload on the server (sorted by label).

    Raises:
        ValueError: the recorded ``num_centroids`` disagrees with the centroid tensor.
    """
    labels = sorted(int(v) for k, v in upload.meta.items() if k.endswith(".label"))
    out = []
    for label in labels:
        up = ClassLatentUpload(
            label=label,
            count=int(upload.meta[f"class{label}.count"]),
            timestep=int(upload.meta[f"class{label}.timestep"]),
            centroids=upload.tensors[f"class{label}.centroids"],
            mean=upload.tensors[f"class{label}.mean"],
        )
        recorded = upload.meta.get(f"class{label}.num_centroids", up.num_centroids)
        if int(recorded) != up.num_centroids:
            raise ValueError(f"class {label}: the upload records {int(recorded)} centroids but carries {up.num_centroids}")
        out.append(up)
    return out
