"""FeDiSyn step 1: client latent centroids, prompt expansion, and server-side image synthesis.

* :mod:`.latents` — client side: VAE latents → per-class k-means centroids → noised uploads.
* :mod:`.prompts` — server side: labels → text prompts (local LLM, or a template fallback).
* :mod:`.generate` — server side: volumes λ·D^k, generation plan, PNDM denoising, image folder.
"""

from fl_lightning.synthesis.generate import (
    GenerationRequest,
    class_totals,
    decode_latents,
    denoise_latents,
    encode_prompts,
    generate_images,
    mix_latents,
    plan_generation,
    plms_chain,
    synthetic_volume,
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
    "plan_generation",
    "encode_prompts",
    "plms_chain",
    "denoise_latents",
    "decode_latents",
    "generate_images",
]
