"""FeDiSyn step 1: client latent centroids, prompt expansion, and server-side image synthesis.

* :mod:`.latents` — client side: VAE latents → per-class k-means centroids → noised uploads.
* :mod:`.prompts` — server side: labels → text prompts (local LLM, or a template fallback).
* :mod:`.generate` — server side: volumes λ·D^k, generation plan, per-image noise top-up, PNDM
  denoising, image folder.
"""

from fl_lightning.synthesis.generate import (
    GenerationRequest,
    class_totals,
    decode_latents,
    denoise_latents,
    diffuse_forward,
    encode_prompts,
    fresh_timestep,
    generate_images,
    mix_latents,
    mix_noise_fraction,
    plan_generation,
    plms_chain,
    start_latent,
    synthetic_volume,
    top_up_latent,
    top_up_std,
)
from fl_lightning.synthesis.latents import (
    ClassLatentUpload,
    class_centroids,
    client_latent_uploads,
    encode_images,
    from_upload,
    noise_latents,
    to_upload,
)
from fl_lightning.synthesis.prompts import (
    QUESTION,
    LLMPromptExpander,
    TemplatePromptExpander,
    expand_with_cache,
)

__all__ = [
    "ClassLatentUpload",
    "encode_images",
    "class_centroids",
    "noise_latents",
    "client_latent_uploads",
    "to_upload",
    "from_upload",
    "QUESTION",
    "TemplatePromptExpander",
    "LLMPromptExpander",
    "expand_with_cache",
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
]
