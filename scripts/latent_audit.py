"""An empirical audit of FeDiSyn's noised uploads: how close does what the server receives bring it to a client's
images, against the timestep s?  ``python scripts/latent_audit.py [--clients 5] [--centroids 10]``

A pixel-space proxy, small enough for a laptop: the bundled 8×8 digits (scikit-learn), scaled to [-1, 1], stand
in for the VAE latents (an identity encoder/decoder: what the noise alone hides, without the VAE's own loss).
Each client (Dirichlet α = 0.5) uploads, per class, FeDiSyn's k-means centroids and class average
(``fl_lightning.synthesis.latents.class_centroids``) noised by SD v1-5's forward process at s (diffusers'
``DDPMScheduler.add_noise``). The server reconstructs each upload

* ``rescaled``: x_s / sqrt(ᾱ_s) (unbiased), clipped to [-1, 1];
* ``wiener``: the MMSE estimate under a Gaussian prior fitted on public data (the test split) —
  μ + Σ (Σ + (1 − ᾱ_s)/ᾱ_s I)⁻¹ (x_s / sqrt(ᾱ_s) − μ), a stand-in for a denoiser trained on public images;

and the audit reports the PSNR of each reconstruction to its nearest real training image of that client, next
to two references: the clean upload itself (s = 0: what k-means alone gives away) and a random public image
(the floor: no information about the client). The ε column is ``fl_lightning.privacy.latents.latent_epsilon``
for the class average (B: the largest image norm, n ≥ the smallest class count uploaded, δ = 1e-5).
Prints a markdown table (docs/privacy.md).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

TIMESTEPS = (100, 300, 500, 700, 900, 999)


def _psnr_to_nearest(x: torch.Tensor, images: torch.Tensor) -> float:
    """PSNR (dB, peak-to-peak 2 on [-1, 1]) of x (D,) to its nearest image among images (N, D)."""
    mse = float(((images - x) ** 2).mean(dim=1).min())
    return 10 * math.log10(4.0 / max(mse, 1e-12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--centroids", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from diffusers import DDPMScheduler
    from sklearn.datasets import load_digits

    from fl_lightning.data.partition import dirichlet_partition
    from fl_lightning.privacy.latents import latent_epsilon
    from fl_lightning.synthesis.latents import class_centroids

    digits = load_digits()
    x = torch.tensor(digits.images / 8.0 - 1.0, dtype=torch.float64)[:, None]  # (N, 1, 8, 8) in [-1, 1]
    y = digits.target
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(y))
    train, test = order[: int(0.8 * len(y))], order[int(0.8 * len(y)) :]
    public = x[test].reshape(len(test), -1)
    mu, cov = public.mean(0), torch.cov(public.T)
    parts = dirichlet_partition(y[train], args.clients, 0.5, seed=args.seed)
    scheduler = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, num_train_timesteps=1000)
    alpha_bar = scheduler.alphas_cumprod.double()
    B = float(x.reshape(len(y), -1).norm(dim=1).max())

    uploads = []  # (clean upload (D,), the client's images (n, D))
    n_min = None
    for k, idx in enumerate(parts):
        own = x[train[idx]]
        for label in np.unique(y[train[idx]]):
            members = own[torch.as_tensor(y[train[idx]] == label)]
            centroids, mean = class_centroids(members, num_centroids=args.centroids, seed=args.seed + k)
            n_min = len(members) if n_min is None else min(n_min, len(members))
            for c in [*centroids, mean]:
                uploads.append((c.reshape(-1), own.reshape(len(own), -1)))
    clean = np.mean([_psnr_to_nearest(c, imgs) for c, imgs in uploads])
    g = torch.Generator().manual_seed(args.seed)
    floor = np.mean([_psnr_to_nearest(public[int(torch.randint(len(public), (1,), generator=g))], imgs) for _, imgs in uploads])
    print(
        f"{len(uploads)} uploads from {args.clients} clients; clean upload {clean:.1f} dB, "
        f"random public image {floor:.1f} dB (PSNR to the nearest real image of the client)\n"
    )
    print("| s | ᾱ_s | PSNR rescaled (dB) | PSNR wiener (dB) | ε (class mean) |")
    print("| --- | --- | --- | --- | --- |")
    eye = torch.eye(len(mu), dtype=torch.float64)
    for s in TIMESTEPS:
        a = float(alpha_bar[s])
        gain = cov @ torch.linalg.inv(cov + (1 - a) / a * eye)  # (D, D), once per s
        naive, wiener = [], []
        for c, imgs in uploads:
            noise = torch.randn(c.shape, generator=g, dtype=torch.float64)
            xs = scheduler.add_noise(c[None], noise[None], torch.tensor([s]))[0]
            rescaled = xs / math.sqrt(a)
            naive.append(_psnr_to_nearest(rescaled.clamp(-1, 1), imgs))
            wiener.append(_psnr_to_nearest((mu + gain @ (rescaled - mu)).clamp(-1, 1), imgs))
        eps = latent_epsilon(a, clip_norm=B, delta=1e-5, min_count=max(n_min, 1))
        print(f"| {s} | {a:.4f} | {np.mean(naive):.1f} | {np.mean(wiener):.1f} | {eps:.3g} |")


if __name__ == "__main__":
    main()
