"""Image captioning with BLIP (Li et al. 2022) through transformers, for the FGL baseline.

FGL's devices caption their own images and upload the captions; the server turns them into prompts
for text-to-image generation. :class:`Captioner` wraps ``BlipForConditionalGeneration`` and
``BlipProcessor`` loaded from a LOCAL folder (``save_pretrained`` layout, e.g. a copy of
``Salesforce/blip-image-captioning-base``); nothing is downloaded. :func:`tiny_blip` builds a random
BLIP from a config with a 20-word vocabulary, so every code path runs in the tests offline (its
captions are random words).

Decoding is greedy (``do_sample=False``): a device's captions depend on its images only.

Example::

    captioner = Captioner.from_path("weights/blip-image-captioning-base", device="cuda")
    captions = captioner.caption(images)  # images: (B, 3, H, W) in [0, 1]
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fl_lightning.errors import MissingResourceError

__all__ = ["Captioner", "tiny_blip", "TINY_VOCAB"]

# the tiny test model's vocabulary: BERT's special tokens + a few words, so random captions decode to text
TINY_VOCAB: tuple[str, ...] = (
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "a",
    "photo",
    "of",
    "the",
    "small",
    "dark",
    "white",
    "image",
    "with",
    "on",
    "digit",
    "round",
    "line",
    "bright",
    "blurry",
)


class Captioner:
    """BLIP image → text, batched, greedy.

    Args:
        model: a ``BlipForConditionalGeneration``.
        processor: its ``BlipProcessor`` (image resizing/normalisation + BERT tokenizer).
        max_new_tokens: caption length cap in tokens.
        device: where the model runs.
    """

    def __init__(self, *, model: nn.Module, processor, max_new_tokens: int = 20, device: torch.device | str = "cpu") -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        self.model = model.eval().to(device)
        self.processor = processor
        self.max_new_tokens = int(max_new_tokens)
        self.device = torch.device(device)

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        max_new_tokens: int = 20,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        download: bool = False,
        key: str = "fgl.captioner_path",
    ) -> Captioner:
        """BLIP from a ``save_pretrained`` folder (model + processor files): a local path, or a hub id's
        snapshot in the Hugging Face cache (``Salesforce/blip-image-captioning-base``; fetched only with
        ``download``).

        Raises:
            MissingResourceError: the folder does not exist (one line saying what to put there).
        """
        from transformers import BlipForConditionalGeneration, BlipProcessor

        from fl_lightning.models.hub import looks_like_hub_id, resolve_local_or_hub

        folder = Path(path).expanduser()
        if not folder.exists() and looks_like_hub_id(str(path)):
            folder = resolve_local_or_hub(
                str(path), download=download, key=key, download_key="model.download", what="a BLIP captioning folder"
            )
        if not folder.is_dir():
            raise MissingResourceError(
                f"BLIP captioning model not found at {folder}: copy a "
                "BlipForConditionalGeneration folder (config.json, weights, processor files) "
                "there, or give a hub id (Salesforce/blip-image-captioning-base) in the Hugging "
                "Face cache"
            )
        model = BlipForConditionalGeneration.from_pretrained(folder, dtype=dtype, local_files_only=True)
        processor = BlipProcessor.from_pretrained(folder, local_files_only=True)
        return cls(model=model, processor=processor, max_new_tokens=max_new_tokens, device=device)

    @torch.no_grad()
    def caption(self, images: torch.Tensor) -> list[str]:
        """Captions of a batch.

        Args:
            images: (B, 3, H, W) float in [0, 1] (any size: the processor resizes to BLIP's input).

        Returns:
            B strings, stripped (may be empty for a random test model).
        """
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be a (B, 3, H, W) tensor, got shape {tuple(images.shape)}")
        if images.shape[0] == 0:
            return []
        inputs = self.processor(images=list(images.float().cpu().clamp(0, 1)), return_tensors="pt", do_rescale=False)
        pixels = inputs["pixel_values"].to(self.device, dtype=next(self.model.parameters()).dtype)
        tokens = self.model.generate(pixel_values=pixels, max_new_tokens=self.max_new_tokens, do_sample=False)
        return [text.strip() for text in self.processor.batch_decode(tokens, skip_special_tokens=True)]


def tiny_blip(*, seed: int = 0, image_size: int = 32, max_new_tokens: int = 8) -> Captioner:
    """A random BLIP (1 vision + 1 text layer, width 32) with :data:`TINY_VOCAB`, for tests (~0.1 M params).

    Its decoder never emits a special token (their output bias is −1e4), so every caption is
    ``max_new_tokens`` words of the vocabulary: random, but text that a test can follow to the prompts.
    """
    from transformers import BertTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    vocab = {word: i for i, word in enumerate(TINY_VOCAB)}
    # transformers 5: BertTokenizer(vocab_file=...) is ignored; the vocabulary must be passed as an object
    tokenizer = BertTokenizer(vocab=vocab)
    text = dict(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
        bos_token_id=vocab["[CLS]"],
        sep_token_id=vocab["[SEP]"],
        eos_token_id=vocab["[SEP]"],
        pad_token_id=vocab["[PAD]"],
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=max(image_size // 4, 1),
        projection_dim=32,
    )
    config = BlipConfig(text_config=text, vision_config=vision, projection_dim=32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BlipForConditionalGeneration(config)
    with torch.no_grad():  # a random decoder mostly emits special tokens (empty captions): make it say words
        model.text_decoder.cls.predictions.bias[: TINY_VOCAB.index("a")] = -1e4
    processor = BlipProcessor(
        image_processor=BlipImageProcessor(size={"height": image_size, "width": image_size}), tokenizer=tokenizer
    )
    return Captioner(model=model, processor=processor, max_new_tokens=max_new_tokens)
