"""Stable Diffusion parts for FeDiSyn step 1: VAE, UNet, CLIP text encoder, tokenizer, PNDM scheduler.

FeDiSyn ("Scaling Synthetic-Image Pre-Training for Federated Fine-Tuning of Large Vision Models")
uses Stable Diffusion v1-5: clients need only its VAE (to encode images into latents), the server
needs all of it (text encoder for the prompts, UNet + PNDM scheduler to denoise, VAE to decode).

* :func:`load_diffusion` reads a diffusers folder (``vae/ unet/ text_encoder/ tokenizer/
  scheduler/``) with ``local_files_only=True``: a local path, or a hub id's snapshot in the Hugging Face
  cache (fetched into it only with ``download``).
* :func:`tiny_diffusion_components` builds a random, few-hundred-kilobyte stand-in with the same
  interfaces (for tests and offline demos). Its tokenizer is SD v1's CLIP BPE, built from the
  vocabulary that ships inside open_clip, so it gives the same token ids as the real one.
* :func:`sd15_scheduler` is the PNDM scheduler with SD v1-5's settings.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # imported where used: importing diffusers/transformers costs seconds a non-diffusion run never needs
    from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

from fl_lightning.errors import MissingResourceError

__all__ = [
    "DiffusionComponents",
    "load_diffusion",
    "save_diffusion",
    "tiny_diffusion_components",
    "sd15_scheduler",
    "clip_bpe_tokenizer",
    "SUBFOLDERS",
]

#: The subfolders of a diffusers Stable Diffusion folder that FeDiSyn reads.
SUBFOLDERS: tuple[str, ...] = ("vae", "unet", "text_encoder", "tokenizer", "scheduler")

_DOWNLOAD_HINT = (
    "set fedisyn.diffusion_path to a diffusers Stable Diffusion folder (subfolders "
    + ", ".join(f"{s}/" for s in SUBFOLDERS)
    + ") or its hub id, e.g. stable-diffusion-v1-5/stable-diffusion-v1-5 fetched into the Hugging Face cache "
    "with `hf download stable-diffusion-v1-5/stable-diffusion-v1-5` (or model.download: true)"
)


@dataclass
class DiffusionComponents:
    """The five parts of a Stable Diffusion model that FeDiSyn uses.

    Args:
        vae: ``AutoencoderKL``; latents are ``encode(x).latent_dist`` × ``vae.config.scaling_factor``.
        unet: ``UNet2DConditionModel`` predicting the noise ε (cross-attention on text embeddings).
        text_encoder: ``CLIPTextModel``; its last hidden state conditions the UNet.
        tokenizer: the CLIP BPE tokenizer matching ``text_encoder``.
        scheduler: ``PNDMScheduler`` (PLMS, ``skip_prk_steps``) as in SD v1-5.
    """

    vae: AutoencoderKL
    unet: UNet2DConditionModel
    text_encoder: CLIPTextModel
    tokenizer: CLIPTokenizer
    scheduler: PNDMScheduler

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> DiffusionComponents:
        """Move the three networks to ``device`` and/or cast them to ``dtype`` (in place); returns self."""
        for module in (self.vae, self.unet, self.text_encoder):
            if device is not None:
                module.to(device=device)
            if dtype is not None and module.dtype != dtype:  # skip no-op casts (diffusers warns on every cast)
                module.to(dtype=dtype)
        return self

    @property
    def device(self) -> torch.device:
        """Device of the UNet (all three networks are moved together by :meth:`to`)."""
        return self.unet.device

    @property
    def dtype(self) -> torch.dtype:
        """Parameter dtype of the UNet."""
        return self.unet.dtype


def sd15_scheduler(*, num_train_timesteps: int = 1000) -> PNDMScheduler:
    """PNDM with Stable Diffusion v1-5's settings (``scheduler/scheduler_config.json`` of the release).

    scaled_linear betas 0.00085 → 0.012, PLMS only (``skip_prk_steps``), ``steps_offset=1`` and
    ``set_alpha_to_one=False`` (the last step lands on ᾱ_0, not on 1).
    """
    from diffusers import PNDMScheduler

    return PNDMScheduler(
        num_train_timesteps=num_train_timesteps,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        skip_prk_steps=True,
        set_alpha_to_one=False,
        steps_offset=1,
    )


def _require_folder(path: Path) -> None:
    if not path.is_dir():
        raise MissingResourceError(f"Stable Diffusion weights not found: {path} is not a folder; {_DOWNLOAD_HINT}")
    missing = [s for s in SUBFOLDERS if not (path / s).is_dir()]
    if missing:
        raise MissingResourceError(
            f"Stable Diffusion folder {path} lacks {', '.join(m + '/' for m in missing)}; {_DOWNLOAD_HINT}"
        )


def load_diffusion(
    path: str | Path, *, dtype: torch.dtype = torch.float32, download: bool = False, key: str = "fedisyn.diffusion_path"
) -> DiffusionComponents:
    """Load a diffusers Stable Diffusion folder: a local path, or a hub id's snapshot in the HF cache.

    Args:
        path: folder holding ``vae/ unet/ text_encoder/ tokenizer/ scheduler/`` (e.g. SD v1-5), or a hub id
            (``stable-diffusion-v1-5/stable-diffusion-v1-5``) read from the Hugging Face cache
            (:mod:`fl_lightning.models.hub`).
        dtype: parameter dtype of the three networks (``torch.float16``/``bfloat16`` on a GPU).
        download: fetch a hub id missing from the cache (``model.download``); otherwise no request is made.
        key: the config key that named it (for the messages).

    Returns:
        The components in eval mode with gradients off (FeDiSyn never trains them).

    Raises:
        MissingResourceError: the folder, a subfolder or a weight file is missing (one line saying
            where it looked and how to get the weights).
    """
    from fl_lightning.models.hub import looks_like_hub_id, resolve_local_or_hub

    if not Path(path).expanduser().exists() and looks_like_hub_id(str(path)):
        path = resolve_local_or_hub(
            str(path), download=download, key=key, download_key="model.download", what="a diffusers Stable Diffusion folder"
        )
    path = Path(path).expanduser()
    _require_folder(path)
    from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    try:
        vae = AutoencoderKL.from_pretrained(path, subfolder="vae", local_files_only=True, torch_dtype=dtype)
        unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet", local_files_only=True, torch_dtype=dtype)
        text_encoder = CLIPTextModel.from_pretrained(path / "text_encoder", local_files_only=True, dtype=dtype)
        tokenizer = CLIPTokenizer.from_pretrained(path / "tokenizer", local_files_only=True)
        # Always PNDM (the paper's sampler), configured from the folder's scheduler_config.json.
        scheduler = PNDMScheduler.from_pretrained(path, subfolder="scheduler", local_files_only=True)
    except OSError as err:  # diffusers/transformers raise OSError for absent configs or weights
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MissingResourceError(f"could not load Stable Diffusion from {path} ({first}); {_DOWNLOAD_HINT}") from err
    for module in (vae, unet, text_encoder):
        module.eval().requires_grad_(False)
    return DiffusionComponents(vae=vae, unet=unet, text_encoder=text_encoder, tokenizer=tokenizer, scheduler=scheduler)


def save_diffusion(components: DiffusionComponents, path: str | Path) -> Path:
    """Write ``components`` as a diffusers folder that :func:`load_diffusion` reads back.

    Args:
        components: the parts to save.
        path: target folder (created; existing files are overwritten).

    Returns:
        The folder path.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    components.vae.save_pretrained(path / "vae")
    components.unet.save_pretrained(path / "unet")
    components.text_encoder.save_pretrained(path / "text_encoder")
    components.tokenizer.save_pretrained(path / "tokenizer")
    components.scheduler.save_pretrained(path / "scheduler")
    return path


def clip_bpe_tokenizer(*, model_max_length: int = 77) -> CLIPTokenizer:
    """SD v1's CLIP tokenizer, built offline from the BPE merges bundled with open_clip.

    The vocabulary is the one of OpenAI CLIP (and of SD v1's ``tokenizer/``): the 256 byte symbols,
    the same with an end-of-word mark ``</w>``, one token per merge, then ``<|startoftext|>`` and
    ``<|endoftext|>`` (ids 49406, 49407). transformers 5 ignores ``vocab_file=``/``merges_file=``,
    so the vocabulary and merges are passed as objects.
    """
    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from transformers import CLIPTokenizer

    with gzip.open(default_bpe(), "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    # CLIP keeps the first 49152 - 256 - 2 merges (line 0 is a version header).
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)


def tiny_diffusion_components(*, seed: int = 0, image_size: int = 32) -> DiffusionComponents:
    """A tiny random Stable Diffusion with SD's interfaces (for tests and offline demos).

    The VAE downsamples ×2 to 4 latent channels (``image_size/2`` latents), the UNet has two
    levels with cross-attention to a 32-wide, 2-layer CLIP text encoder; the tokenizer is SD v1's
    real BPE (:func:`clip_bpe_tokenizer`) and the scheduler SD v1-5's PNDM. Builds in well under a
    second and does not touch the global RNG.

    Args:
        seed: seed of the random initialisation.
        image_size: pixel side length (a multiple of 4).
    """
    if image_size % 4:
        raise ValueError(f"image_size must be a multiple of 4, got {image_size}")
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    text_dim = 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            block_out_channels=(8, 16),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=4,
            sample_size=image_size,
            scaling_factor=0.18215,
        )
        unet = UNet2DConditionModel(
            sample_size=image_size // 2,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=(16, 32),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=text_dim,
            attention_head_dim=4,
            norm_num_groups=8,
        )
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                hidden_size=text_dim,
                intermediate_size=64,
                num_attention_heads=4,
                num_hidden_layers=2,
                vocab_size=49408,
                max_position_embeddings=77,
                bos_token_id=49406,
                eos_token_id=49407,
                pad_token_id=49407,
            )
        )
    for module in (vae, unet, text_encoder):
        module.eval().requires_grad_(False)
    return DiffusionComponents(
        vae=vae, unet=unet, text_encoder=text_encoder, tokenizer=clip_bpe_tokenizer(), scheduler=sd15_scheduler()
    )
