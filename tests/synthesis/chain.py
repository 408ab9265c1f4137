"""The synthesis chain tests' clients: seeded random 32×32 images per (client, class) and their latent uploads."""

from __future__ import annotations

import torch

from fl_lightning.models.diffusion import DiffusionComponents
from fl_lightning.synthesis.latents import ClassLatentUpload, client_latent_uploads


def random_images(n: int, seed: int) -> torch.Tensor:
    """``n`` seeded uniform images (n, 3, 32, 32)."""
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def two_clients() -> dict[int, dict[int, torch.Tensor]]:
    """Two clients' images of classes 0 and 1: 5 and 3 images, then 2 and 6."""
    return {0: {0: random_images(5, 0), 1: random_images(3, 1)}, 1: {0: random_images(2, 2), 1: random_images(6, 3)}}


def client_uploads(
    sd: DiffusionComponents, data: dict[int, dict[int, torch.Tensor]], *, timestep: int | None, max_timestep: int, seed: int
) -> dict[int, list[ClassLatentUpload]]:
    """Each client's uploads of 2 centroids per class, client ``c`` seeded ``seed + c``."""
    return {
        c: client_latent_uploads(
            sd.vae, sd.scheduler, d, num_centroids=2, timestep=timestep, max_timestep=max_timestep, seed=seed + c
        )
        for c, d in data.items()
    }
