"""The open_clip adapter: CLIP's visual tower (``open_clip.transformer.VisionTransformer``) as a
:class:`~fl_lightning.models.vit_backbone.ViTBackbone`.

The tower runs conv1 → add class_embedding → add positional_embedding → patch_dropout → ln_pre →
transformer → ln_post(CLS) → ``@ proj``; prompts go in after patch_dropout, before ln_pre.

Weights: a tag (``'openai'``) is looked up in the local caches unless downloading is allowed; a
local file (``checkpoint``, or a path given as ``pretrained``) is checked first
(:func:`~fl_lightning.models.weights.open_state_dict`), then loaded by open_clip's own
``load_checkpoint`` and its keys compared with the model's, so a wrong file stops with one line.
open_clip is imported only when a model is built.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fl_lightning.errors import MissingResourceError
from fl_lightning.models.vit_backbone import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    BackboneArgumentError,
    ViTBackbone,
    first_size,
)
from fl_lightning.models.weights import (
    NO_WEIGHTS_HINT,
    describe_load_error,
    find_cached_weights,
    hf_cache_dir,
    hf_cached_file,
    key_mismatch_message,
    open_state_dict,
)

__all__ = ["OpenCLIPBackbone", "tiny_clip_overrides"]


class OpenCLIPBackbone(ViTBackbone):
    """CLIP's visual tower from open_clip. ``feature='proj'`` gives the CLIP image embedding
    (``ln_post(CLS) @ proj``), ``'pre_proj'`` the width-D state ``ln_post(CLS)``, ``'cls'`` the last
    resblock's CLS state before ``ln_post``."""

    library: ClassVar[str] = "open_clip"
    default_mean: ClassVar[tuple[float, ...]] = OPENAI_CLIP_MEAN
    default_std: ClassVar[tuple[float, ...]] = OPENAI_CLIP_STD
    preprocess_attr = "preprocess_cfg"

    @staticmethod
    def _check_model(model: nn.Module) -> None:
        if not hasattr(model, "conv1") or not hasattr(model, "transformer"):
            raise BackboneArgumentError("name", type(model).__name__, "an open_clip ViT (VisionTransformer visual tower)")
        if getattr(model, "attn_pool", None) is not None:
            raise BackboneArgumentError("name", type(model).__name__, "an open_clip ViT without attentional pooling")

    def _read_geometry(self) -> None:
        m = self.model
        self.image_size = first_size(m.image_size)
        self.patch_size = first_size(m.patch_size)
        self.width = int(m.class_embedding.shape[-1])
        has_proj = m.proj is not None
        self.feature_dim = int(m.proj.shape[1]) if self.feature == "proj" and has_proj else self.width
        self.num_prefix_tokens = 1

    # -- the three seams ---------------------------------------------------------------------------
    @property
    def blocks(self) -> nn.ModuleList | nn.Sequential:
        return self.model.transformer.resblocks

    def embed(self, images: Tensor) -> Tensor:
        m = self.model
        x = m.conv1(images)  # (B, D, g, g)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)  # (B, L, D)
        cls = m.class_embedding.to(x.dtype).view(1, 1, -1).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1)  # (B, 1 + L, D)
        x = x + m.positional_embedding.to(x.dtype)
        return m.patch_dropout(x)

    def encode(self, tokens: Tensor) -> Tensor:
        """ln_pre → transformer: (B, T, D) → (B, T, D)."""
        m = self.model
        return m.transformer(m.ln_pre(tokens))

    def pool(self, tokens: Tensor) -> Tensor:
        m = self.model
        if self.feature == "cls":  # the last block's CLS state itself, (B, D)
            return tokens[:, 0]
        h = m.ln_post(tokens[:, 0])  # CLS, (B, D)
        if self.feature == "proj" and m.proj is not None:
            h = h @ m.proj
        return h

    # -- factories ---------------------------------------------------------------------------------
    @classmethod
    def tiny_config(cls, image_size: int, *, width: int, depth: int) -> tuple[str, dict]:
        return "ViT-B-16", tiny_clip_overrides(image_size, width=width, depth=depth)

    @staticmethod
    def build_model(**kwargs: Any) -> nn.Module:  # noqa: D102 — see ViTBackbone.build_model
        return _build_visual(**kwargs)


# ------------------------------------------------------------------------------------------------
# Building with open_clip's factory (no network unless download=True)
# ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """Silence open_clip's root-logger warning "initialized randomly" where weights come later or not at all."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _cached_tag_weights(name: str, tag: str, cfg: dict, cache_dir: str | None) -> str:
    """The file of an open_clip pretrained tag already on disk, or MissingResourceError."""
    hub = cfg.get("hf_hub", "")
    repo_id = filename = ""
    candidates: list[str] = []
    if hub:
        repo_id, filename = os.path.split(hub)
        filename = filename or "open_clip_pytorch_model.bin"
        candidates = [filename]
        if filename == "open_clip_pytorch_model.bin":
            candidates.insert(0, "open_clip_model.safetensors")
        elif filename.endswith((".bin", ".pth")):
            candidates.insert(0, filename[:-4] + ".safetensors")
    return find_cached_weights(
        what=f"open_clip weights {name} pretrained={tag!r}",
        file=cfg.get("file") or None,
        hf_hub_id=repo_id or None,
        hf_filenames=candidates,
        url=cfg.get("url") or None,
        url_dir=cache_dir or os.path.expanduser("~/.cache/clip"),
        cache_dir=cache_dir,
    )


def _load_weights_file(clip: nn.Module, path: str, *, label: str, name: str) -> None:
    """Load a full CLIP state dict with open_clip's own loader; any key the model and the file do
    not share stops the run with one line (strict, as ``create_model(pretrained=file)`` loads)."""
    import open_clip

    open_state_dict(path, label=label, meta=True)  # readable, a state dict: one line otherwise
    try:
        result = open_clip.load_checkpoint(clip, path, strict=False, weights_only=True)
    except (RuntimeError, KeyError, ValueError) as err:
        raise MissingResourceError(
            f"{label} {path} does not fit open_clip {name}: {describe_load_error(err)}; "
            f"expected a full CLIP state dict of this model"
        ) from None
    if result.missing_keys or result.unexpected_keys:
        raise MissingResourceError(
            key_mismatch_message(
                label=label, path=path, model=f"open_clip {name}", missing=result.missing_keys, unexpected=result.unexpected_keys
            )
        )


def _resolve_name(
    name: str, pretrained: str | None, checkpoint: str | None, cache_dir: str | None, download: bool
) -> tuple[str, str | None, dict]:
    """The model's name as open_clip is to read it, its schema (``local-dir``, ``hf-hub`` or None for a registry
    name) and the pretrained tag's config ({} for none, or a weights file): a registry name and its tag checked
    against open_clip's lists; an ``hf-hub:`` name without downloading, its cached snapshot as a local folder."""
    import open_clip

    schema = name.split(":", 1)[0] if ":" in name else None
    tag_cfg: dict = {}
    if schema is None:
        if open_clip.get_model_config(name) is None:
            raise BackboneArgumentError(
                "name", name, "an open_clip model name (see open_clip.list_models()), 'local-dir:/path' or 'hf-hub:org/repo'"
            )
        if pretrained:
            tag_cfg = open_clip.get_pretrained_cfg(name, pretrained) or {}
            if not tag_cfg and checkpoint is None and not os.path.isfile(pretrained):
                tags = open_clip.list_pretrained_tags_by_model(name)
                raise BackboneArgumentError("pretrained", pretrained, f"one of {tags} for {name}, a weights file, or null")
    if schema == "hf-hub" and not download:
        # Read the cached snapshot as a local folder: open_clip would otherwise ask the hub.
        repo_id = name.split(":", 1)[1]
        found = hf_cached_file(repo_id, ["open_clip_config.json"], cache_dir)
        if found is None:
            raise MissingResourceError(
                f"open_clip model {name} is not in the local cache "
                f"({hf_cache_dir(cache_dir)}; downloading is off); {NO_WEIGHTS_HINT}"
            )
        name = "local-dir:" + os.path.dirname(found)
    return name, schema, tag_cfg


def _weights_source(
    name: str,
    pretrained: str | None,
    checkpoint: str | None,
    *,
    schema: str | None,
    tag_cfg: dict,
    cache_dir: str | None,
    download: bool,
) -> tuple[str | None, str, str | None]:
    """Where the weights come from: a local file we check and load ourselves (its path and the label its errors
    name), or open_clip's own resolution (a local-dir/hf-hub folder, or a tag to download): (file, label, tag)."""
    if checkpoint is not None:
        if not os.path.isfile(checkpoint):
            raise MissingResourceError(
                f"model.checkpoint={checkpoint!r} is not a file; give the path of a "
                f"local open_clip weights file (.pt, .bin or .safetensors)"
            )
        return checkpoint, "model.checkpoint", None
    if pretrained and not tag_cfg and schema is None:
        return pretrained, "model.pretrained", None  # a file path (checked by _resolve_name)
    if pretrained and tag_cfg and not download:
        return (
            _cached_tag_weights(name, pretrained, tag_cfg, cache_dir),
            f"cached open_clip weights {name} pretrained={pretrained!r}:",
            None,
        )
    # a tag to download into cache_dir, or a folder's own weights (None: random initialisation)
    return None, "model.checkpoint", pretrained or None


def _build_visual(
    *,
    name: str,
    pretrained: str | None,
    checkpoint: str | None,
    image_size: int | None,
    overrides: dict,
    cache_dir: str | None,
    download: bool,
) -> nn.Module:
    import open_clip

    kwargs: dict[str, Any] = dict(overrides)
    name, schema, tag_cfg = _resolve_name(name, pretrained, checkpoint, cache_dir, download)
    local_file, label, library_weights = _weights_source(
        name, pretrained, checkpoint, schema=schema, tag_cfg=tag_cfg, cache_dir=cache_dir, download=download
    )
    # Weights trained with QuickGELU (the 'openai' ViT-B/16) give wrong activations with plain GELU.
    if tag_cfg.get("quick_gelu", False):
        kwargs.setdefault("force_quick_gelu", True)
    if image_size is not None:
        kwargs.setdefault("force_image_size", image_size)
    # random initialisation first (weights come next, or were not asked for): the warning is noise
    quiet = _quiet_root_logger() if library_weights is None else contextlib.nullcontext()
    try:
        with quiet:
            clip = open_clip.create_model(name, pretrained=library_weights, cache_dir=cache_dir, **kwargs)
    except (OSError, RuntimeError) as err:
        if schema is not None or (download and tag_cfg and checkpoint is None):
            raise MissingResourceError(
                f"open_clip could not load {name} pretrained={pretrained!r} "
                f"(cache_dir={cache_dir!r}): {describe_load_error(err)}; "
                f"{NO_WEIGHTS_HINT}"
            ) from err
        raise
    if local_file is not None:
        _load_weights_file(clip, local_file, label=label, name=name)
    return clip.visual  # the text tower is not needed: drop it to save memory


# ------------------------------------------------------------------------------------------------
# Tiny random model for tests and offline demos
# ------------------------------------------------------------------------------------------------
def tiny_clip_overrides(
    image_size: int = 32, *, patch_size: int = 8, width: int = 64, depth: int = 2, embed_dim: int = 32
) -> dict:
    """``open_clip.create_model('ViT-B-16', **overrides)`` kwargs for a tiny random CLIP.

    The keyword overrides replace whole sub-configs; the text tower is made tiny too because
    CLIP builds it before the adapter drops it.
    """
    vision = dict(image_size=image_size, patch_size=patch_size, width=width, layers=depth, head_width=32)
    text = dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)
    return dict(embed_dim=embed_dim, vision_cfg=vision, text_cfg=text)
