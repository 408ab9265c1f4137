"""FeDiSyn step 1: client latent centroids, prompt expansion, and server-side image synthesis.

* :mod:`.latents` — client side: VAE latents → per-class k-means centroids → noised uploads.
* :mod:`.prompts` — server side: labels → text prompts (local LLM, or a template fallback).
* :mod:`.generate` — server side: volumes λ·D^k, generation plan, per-image noise top-up, PNDM
  denoising, image folder.
"""

# Each submodule's ``__all__`` names its public API; the package re-exports the union, so the lists are written once.
from fl_lightning.synthesis import generate, latents, prompts
from fl_lightning.synthesis.generate import *  # noqa: F403
from fl_lightning.synthesis.latents import *  # noqa: F403
from fl_lightning.synthesis.prompts import *  # noqa: F403

__all__ = [*latents.__all__, *prompts.__all__, *generate.__all__]
