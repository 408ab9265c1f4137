"""A uniform view of a Vision Transformer from open_clip or timm.

FedOPAL (Eq. (4)-(5)) inserts prompt tokens between the embedding stage of a ViT and its
transformer trunk, and reads the CLS state at the end. Both libraries keep those seams private in
different places, so :class:`ViTBackbone` exposes three public steps with one meaning for both:

    images ─► embed ─► (B, 1 + L, D) tokens ─► encode ─► (B, 1 + L, D) ─► pool ─► h (B, feature_dim)

``embed`` stops exactly where VPT inserts prompts (after the positional embedding and patch
dropout, before ``ln_pre``/``norm_pre``); ``pool`` always takes the CLS token (never an average,
which would mix the prompts into the feature).

Weights are loaded with the libraries' own loaders from local files or caches. Downloading is
opt-in (``download=True``); otherwise the cache is checked *before* anything is built, so a missing
file stops the run at once with one line saying what was looked for and how to provide it (instead
of huggingface_hub's ~46 s of retries).

Order of this file (timm style): the wrapper → weight resolution → factories → tiny test configs.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.errors import ConfigError, MissingResourceError

__all__ = [
    "LIBRARIES",
    "ViTBackbone",
    "build_backbone",
    "build_tiny_backbone",
    "tiny_clip_overrides",
    "tiny_timm_overrides",
]

LIBRARIES = ("open_clip", "timm")

# Normalisation names for the data transforms; the exact values are on ViTBackbone.mean/std.
_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_INCEPTION_MEAN = (0.5, 0.5, 0.5)


def _normalization_name(mean: tuple[float, ...]) -> str:
    close = lambda a, b: all(abs(x - y) < 1e-4 for x, y in zip(a, b))  # noqa: E731
    if close(mean, _OPENAI_CLIP_MEAN):
        return "clip"
    if close(mean, _IMAGENET_MEAN):
        return "imagenet"
    if close(mean, _INCEPTION_MEAN):
        return "inception"
    return "custom"


def _first(size: Any) -> int:
    """open_clip and timm store sizes as ints or (h, w) tuples; we use square inputs."""
    return int(size[0]) if isinstance(size, (tuple, list)) else int(size)


class ViTBackbone(nn.Module):
    """A ViT trunk from open_clip (``clip.visual``) or timm with ``embed``/``encode``/``pool`` seams.

    Args:
        model: the library's vision model (``open_clip.transformer.VisionTransformer`` or
            ``timm.models.vision_transformer.VisionTransformer``), kept as the submodule ``model``
            so parameter paths keep the library's names (``model.transformer.resblocks.3...`` /
            ``model.blocks.3...``), which peft's ``layers_to_transform`` relies on.
        library: ``'open_clip'`` or ``'timm'``.
        feature: open_clip only: ``'proj'`` (the CLIP image embedding, ``ln_post(CLS) @ proj``)
            or ``'pre_proj'`` (``ln_post(CLS)``, width D). timm ViTs built with ``num_classes=0``
            have no projection, so both names give the pre-logits CLS feature there.
        mean, std: the input normalisation the weights expect.

    Attributes:
        library, normalization (``'clip'``, ``'imagenet'``, ``'inception'`` or ``'custom'``),
        mean, std, image_size, patch_size, width (token dim D), feature_dim (dim of h),
        num_blocks, num_prefix_tokens (CLS + register tokens in front of the patches).

    Example:
        >>> backbone = build_tiny_backbone("timm")
        >>> backbone(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 64])
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        library: str,
        feature: str = "proj",
        mean: tuple[float, ...],
        std: tuple[float, ...],
    ) -> None:
        super().__init__()
        if library not in LIBRARIES:
            raise ConfigError("model.library", library, "'open_clip' or 'timm'")
        if feature not in ("proj", "pre_proj"):
            raise ConfigError("model.feature", feature, "'proj' or 'pre_proj'")
        self.model = model
        self.library = library
        self.feature = feature
        self.mean, self.std = tuple(mean), tuple(std)
        self.normalization = _normalization_name(self.mean)
        self._frozen = False
        if library == "open_clip":
            self._check_open_clip(model)
            self.image_size = _first(model.image_size)
            self.patch_size = _first(model.patch_size)
            self.width = int(model.class_embedding.shape[-1])
            has_proj = model.proj is not None
            self.feature_dim = int(model.proj.shape[1]) if feature == "proj" and has_proj else self.width
            self.num_prefix_tokens = 1
        else:
            self._check_timm(model)
            self.image_size = _first(model.patch_embed.img_size)
            self.patch_size = _first(model.patch_embed.patch_size)
            self.width = int(model.embed_dim)
            self.feature_dim = int(model.num_features)
            self.num_prefix_tokens = int(model.num_prefix_tokens)
        self.num_blocks = len(self.blocks)

    # -- checks: only the plain CLS-token ViT layout is supported ---------------------------------
    @staticmethod
    def _check_open_clip(model: nn.Module) -> None:
        if not hasattr(model, "conv1") or not hasattr(model, "transformer"):
            raise ConfigError("model.name", type(model).__name__, "an open_clip ViT (VisionTransformer visual tower)")
        if getattr(model, "attn_pool", None) is not None:
            raise ConfigError("model.name", type(model).__name__, "an open_clip ViT without attentional pooling")

    @staticmethod
    def _check_timm(model: nn.Module) -> None:
        if not hasattr(model, "patch_embed") or not hasattr(model, "blocks"):
            raise ConfigError("model.name", type(model).__name__, "a timm VisionTransformer")
        if getattr(model, "cls_token", None) is None:
            raise ConfigError("model.name", type(model).__name__, "a timm ViT with a class token")
        if getattr(model, "attn_pool", None) is not None:
            raise ConfigError("model.name", type(model).__name__, "a timm ViT without attentional pooling")

    # -- the three seams ---------------------------------------------------------------------------
    @property
    def blocks(self) -> nn.ModuleList | nn.Sequential:
        """The transformer blocks, under the library's own module path."""
        return self.model.transformer.resblocks if self.library == "open_clip" else self.model.blocks

    def embed(self, images: Tensor) -> Tensor:
        """Patch embedding, prefix tokens and positional embedding: (B, 3, H, W) → (B, P + L, D).

        Stops where VPT inserts prompts (after patch dropout, before ``ln_pre``/``norm_pre``);
        ``P = num_prefix_tokens`` (CLS, then timm register tokens).
        """
        m = self.model
        if self.library == "open_clip":
            x = m.conv1(images)  # (B, D, g, g)
            x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)  # (B, L, D)
            cls = m.class_embedding.to(x.dtype).view(1, 1, -1).expand(x.shape[0], -1, -1)
            x = torch.cat([cls, x], dim=1)  # (B, 1 + L, D)
            x = x + m.positional_embedding.to(x.dtype)
            return m.patch_dropout(x)
        x = m.patch_embed(images)
        x = m._pos_embed(x)  # adds CLS/register tokens (num_prefix_tokens) and pos_embed
        return m.patch_drop(x)

    def encode(self, tokens: Tensor) -> Tensor:
        """The rest of the trunk: (B, T, D) → (B, T, D) (open_clip: ln_pre → transformer;
        timm: norm_pre → blocks → norm)."""
        m = self.model
        if self.library == "open_clip":
            return m.transformer(m.ln_pre(tokens))
        x = m.norm_pre(tokens)
        for block in m.blocks:
            x = block(x)
        return m.norm(x)

    def pool(self, tokens: Tensor) -> Tensor:
        """The CLS token state h: (B, T, D) → (B, feature_dim) (never an average over tokens)."""
        m = self.model
        cls = tokens[:, 0]  # (B, D)
        if self.library == "open_clip":
            h = m.ln_post(cls)
            if self.feature == "proj" and m.proj is not None:
                h = h @ m.proj
            return h
        # as timm's forward_head(pre_logits=True), with the pooling fixed to the CLS token
        return m.head_drop(m.fc_norm(cls))

    def forward(self, images: Tensor) -> Tensor:
        """h = pool(encode(embed(images))), shape (B, feature_dim)."""
        return self.pool(self.encode(self.embed(images)))

    # -- freezing ------------------------------------------------------------------------------------
    def freeze(self) -> ViTBackbone:
        """Stop gradients to every trunk parameter and keep the trunk in eval mode from now on."""
        self._frozen = True
        self.model.requires_grad_(False)
        self.model.eval()
        return self

    @property
    def frozen(self) -> bool:
        return self._frozen

    def train(self, mode: bool = True) -> ViTBackbone:
        # A frozen trunk stays in eval mode (no dropout / patch dropout) even when a
        # LightningModule around it switches to training.
        super().train(mode)
        if self._frozen:
            self.model.eval()
        return self


# ------------------------------------------------------------------------------------------------
# Weight resolution (no network unless download=True)
# ------------------------------------------------------------------------------------------------
_FIX = "set model.checkpoint: /path/to/weights.(pt|bin|safetensors), or model.download: true on a machine with internet"


def _hf_cached_file(repo_id: str, filenames: list[str], cache_dir: str | None) -> str | None:
    """Path of the first of ``filenames`` in the local Hugging Face cache, without any request."""
    from huggingface_hub import try_to_load_from_cache

    for filename in filenames:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir)
        if isinstance(found, str) and os.path.isfile(found):
            return found
    return None


def _hf_cache_dir(cache_dir: str | None) -> str:
    from huggingface_hub import constants

    return cache_dir or constants.HF_HUB_CACHE


def _open_clip_local_weights(name: str, tag: str, cfg: dict, cache_dir: str | None) -> str:
    """Resolve an open_clip pretrained tag to a file already on disk, or raise MissingResourceError."""
    if cfg.get("file"):
        return cfg["file"]
    looked: list[str] = []
    hub = cfg.get("hf_hub", "")
    if hub:
        repo_id, filename = os.path.split(hub)
        filename = filename or "open_clip_pytorch_model.bin"
        candidates = [filename]
        if filename == "open_clip_pytorch_model.bin":
            candidates.insert(0, "open_clip_model.safetensors")
        elif filename.endswith((".bin", ".pth")):
            candidates.insert(0, filename[:-4] + ".safetensors")
        found = _hf_cached_file(repo_id, candidates, cache_dir)
        if found:
            return found
        looked.append(f"hf://{repo_id}/{candidates[0]} in {_hf_cache_dir(cache_dir)}")
    url = cfg.get("url", "")
    if url:
        target = os.path.join(cache_dir or os.path.expanduser("~/.cache/clip"), os.path.basename(url))
        if os.path.isfile(target):
            return target
        looked.append(target)
    raise MissingResourceError(
        f"open_clip weights {name} pretrained={tag!r} are not on disk (looked for {' and '.join(looked)}; "
        f"downloading is off); {_FIX}"
    )


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """Silence open_clip's root-logger warning "initialized randomly" when random weights were asked for."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _build_open_clip(
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
    schema = name.split(":", 1)[0] if ":" in name else None
    weights: str | None = None
    tag_cfg: dict = {}
    if schema is None:
        if open_clip.get_model_config(name) is None:
            raise ConfigError("model.name", name, "an open_clip model name (see open_clip.list_models()), "
                              "'local-dir:/path' or 'hf-hub:org/repo'")
        if pretrained:
            tag_cfg = open_clip.get_pretrained_cfg(name, pretrained) or {}
            if not tag_cfg and checkpoint is None and not os.path.isfile(pretrained):
                tags = open_clip.list_pretrained_tags_by_model(name)
                raise ConfigError("model.pretrained", pretrained, f"one of {tags} for {name}, a weights file, or null")
    if schema == "hf-hub" and not download:
        # Read the cached snapshot as a local folder: open_clip would otherwise ask the hub.
        repo_id = name.split(":", 1)[1]
        found = _hf_cached_file(repo_id, ["open_clip_config.json"], cache_dir)
        if found is None:
            raise MissingResourceError(f"open_clip model {name} is not in the local cache "
                                       f"({_hf_cache_dir(cache_dir)}; downloading is off); {_FIX}")
        name = "local-dir:" + os.path.dirname(found)
    if checkpoint is not None:
        if not os.path.isfile(checkpoint):
            raise MissingResourceError(f"model.checkpoint={checkpoint!r} is not a file; give the path of a "
                                       f"local open_clip weights file (.pt, .bin or .safetensors)")
        weights = checkpoint
    elif pretrained and not tag_cfg:
        weights = pretrained  # a file path (checked above)
    elif pretrained and not download:
        weights = _open_clip_local_weights(name, pretrained, tag_cfg, cache_dir)
    elif pretrained:
        weights = pretrained  # a tag: open_clip downloads it into cache_dir
    # Weights trained with QuickGELU (the 'openai' ViT-B/16) give wrong activations with plain GELU.
    if tag_cfg.get("quick_gelu", False):
        kwargs.setdefault("force_quick_gelu", True)
    if image_size is not None:
        kwargs.setdefault("force_image_size", image_size)
    # random initialisation was asked for: open_clip's "No pretrained weights loaded" warning is noise
    quiet = _quiet_root_logger() if weights is None else contextlib.nullcontext()
    try:
        with quiet:
            clip = open_clip.create_model(name, pretrained=weights, cache_dir=cache_dir, **kwargs)
    except (OSError, RuntimeError) as err:
        if schema is not None or (download and tag_cfg and checkpoint is None):
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise MissingResourceError(f"open_clip could not load {name} pretrained={pretrained!r} "
                                       f"(cache_dir={cache_dir!r}): {first}; {_FIX}") from err
        raise
    return clip.visual  # the text tower is not needed: drop it to save memory


def _timm_local_weights(full_name: str, cache_dir: str | None) -> str:
    """Resolve a timm pretrained tag to a file already on disk, or raise MissingResourceError."""
    import timm

    cfg = timm.models.get_pretrained_cfg(full_name)
    if cfg is None:
        raise ConfigError("model.pretrained", full_name, "a timm model with pretrained weights (timm.list_pretrained())")
    if cfg.file:
        return cfg.file
    looked: list[str] = []
    if cfg.hf_hub_id:
        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]
        found = _hf_cached_file(cfg.hf_hub_id, names, cache_dir)
        if found:
            return found
        looked.append(f"hf://{cfg.hf_hub_id}/{names[0]} in {_hf_cache_dir(cache_dir)}")
    if cfg.url:
        target = os.path.join(cache_dir or os.path.join(torch.hub.get_dir(), "checkpoints"), os.path.basename(cfg.url))
        if os.path.isfile(target):
            return target
        looked.append(target)
    raise MissingResourceError(
        f"timm weights {full_name} are not on disk (looked for {' and '.join(looked) or 'a weights source'}; "
        f"downloading is off); {_FIX}"
    )


def _build_timm(
    *,
    name: str,
    pretrained: str | None,
    checkpoint: str | None,
    image_size: int | None,
    overrides: dict,
    cache_dir: str | None,
    download: bool,
) -> nn.Module:
    import timm

    if not timm.is_model(name):
        raise ConfigError("model.name", name, "a timm model name (see timm.list_models('vit_*'))")
    kwargs: dict[str, Any] = dict(overrides)
    if image_size is not None:
        kwargs.setdefault("img_size", image_size)
    # `pretrained` is a timm tag ('augreg2_in21k_ft_in1k'), or 'default' for the name's default tag.
    full_name = name if not pretrained or pretrained == "default" or "." in name else f"{name}.{pretrained}"
    if checkpoint is not None:
        if not os.path.isfile(checkpoint):
            raise MissingResourceError(f"model.checkpoint={checkpoint!r} is not a file; give the path of a "
                                       f"local timm weights file (.pth, .bin or .safetensors)")
        # Through timm's pretrained loader (not checkpoint_path) so that its checkpoint filter runs and a
        # classifier head in the file is dropped for num_classes=0.
        return timm.create_model(full_name, pretrained=True, num_classes=0,
                                 pretrained_cfg_overlay=dict(file=checkpoint), **kwargs)
    if not pretrained:
        return timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    if not download:
        file = _timm_local_weights(full_name, cache_dir)
        return timm.create_model(full_name, pretrained=True, num_classes=0,
                                 pretrained_cfg_overlay=dict(file=file), **kwargs)
    try:
        return timm.create_model(full_name, pretrained=True, num_classes=0, cache_dir=cache_dir, **kwargs)
    except (OSError, RuntimeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise MissingResourceError(f"timm could not load {full_name} (cache_dir={cache_dir!r}): {first}; {_FIX}") from err


def build_backbone(
    *,
    library: str,
    name: str,
    pretrained: str | None = None,
    checkpoint: str | None = None,
    feature: str = "proj",
    image_size: int | None = None,
    overrides: dict | None = None,
    cache_dir: str | None = None,
    download: bool = False,
) -> ViTBackbone:
    """Build a :class:`ViTBackbone` with the library's own factory and loaders.

    Args:
        library: ``'open_clip'`` or ``'timm'``.
        name: the library's model name (``'ViT-B-16'``; ``'vit_base_patch16_224'``); open_clip also
            takes ``'local-dir:/dir'`` (``open_clip_config.json`` beside the weights).
        pretrained: open_clip: a tag (``'openai'``) or a weights file; timm: a tag
            (``'augreg2_in21k_ft_in1k'``) or ``'default'``. ``None``: random initialisation.
            Tags whose weights were trained with QuickGELU (open_clip ``'openai'``) get
            ``force_quick_gelu=True``.
        checkpoint: a local weights file (.pt/.pth/.bin/.safetensors). open_clip: a full CLIP
            state dict as open_clip saves it (for a visual-only file use
            ``overrides={'pretrained_image_path': file}``); timm: a ViT state dict (a classifier
            head in it is dropped).
        feature: see :class:`ViTBackbone`.
        image_size: input resolution (open_clip ``force_image_size``, timm ``img_size``; the
            position embedding of loaded weights is resampled by the library).
        overrides: extra keyword arguments of ``open_clip.create_model`` / ``timm.create_model``
            (e.g. :func:`tiny_clip_overrides`, :func:`tiny_timm_overrides`).
        cache_dir: where the libraries keep downloaded weights (default: their own).
        download: allow fetching missing weights from the hubs. When False the local cache is
            checked first and nothing is requested from the network.

    Raises:
        ConfigError: unknown library, model name or tag.
        MissingResourceError: weights not on disk (and downloading off or failing).
    """
    overrides = dict(overrides or {})
    common = dict(name=name, pretrained=pretrained, checkpoint=checkpoint, image_size=image_size,
                  overrides=overrides, cache_dir=cache_dir, download=download)
    if library == "open_clip":
        visual = _build_open_clip(**common)
        cfg = getattr(visual, "preprocess_cfg", None) or {}
        mean = tuple(cfg.get("mean", _OPENAI_CLIP_MEAN))
        std = tuple(cfg.get("std", _OPENAI_CLIP_STD))
    elif library == "timm":
        visual = _build_timm(**common)
        cfg = getattr(visual, "pretrained_cfg", None) or {}
        mean = tuple(cfg.get("mean", _IMAGENET_MEAN))
        std = tuple(cfg.get("std", _IMAGENET_STD))
    else:
        raise ConfigError("model.library", library, "'open_clip' or 'timm'")
    return ViTBackbone(model=visual, library=library, feature=feature, mean=mean, std=std)


# ------------------------------------------------------------------------------------------------
# Tiny random models for tests and offline demos
# ------------------------------------------------------------------------------------------------
def tiny_clip_overrides(image_size: int = 32, *, patch_size: int = 8, width: int = 64, depth: int = 2,
                        embed_dim: int = 32) -> dict:
    """``open_clip.create_model('ViT-B-16', **overrides)`` kwargs for a tiny random CLIP.

    The keyword overrides replace whole sub-configs; the text tower is made tiny too because
    CLIP builds it before :func:`build_backbone` drops it.
    """
    vision = dict(image_size=image_size, patch_size=patch_size, width=width, layers=depth, head_width=32)
    text = dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)
    return dict(embed_dim=embed_dim, vision_cfg=vision, text_cfg=text)


def tiny_timm_overrides(image_size: int = 32, *, patch_size: int = 8, width: int = 64, depth: int = 2,
                        num_heads: int = 2) -> dict:
    """``timm.create_model('vit_base_patch16_224', **overrides)`` kwargs for a tiny random ViT."""
    return dict(img_size=image_size, patch_size=patch_size, embed_dim=width, depth=depth, num_heads=num_heads)


def build_tiny_backbone(library: str, *, image_size: int = 32, seed: int = 0, depth: int = 2,
                        width: int = 64, overrides: dict | None = None) -> ViTBackbone:
    """A tiny random ViT (~0.1 M parameters) for tests; the same ``seed`` gives the same weights.

    ``overrides`` are merged on top of the tiny config (e.g. ``{'reg_tokens': 2}`` for timm).
    """
    if library == "open_clip":
        name, tiny = "ViT-B-16", tiny_clip_overrides(image_size, width=width, depth=depth)
    elif library == "timm":
        name, tiny = "vit_base_patch16_224", tiny_timm_overrides(image_size, width=width, depth=depth)
    else:
        raise ConfigError("model.library", library, "'open_clip' or 'timm'")
    tiny.update(overrides or {})
    # Seed a private copy of the global RNG: the libraries initialise from it, and callers'
    # random streams must not depend on whether a tiny model was built.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_backbone(library=library, name=name, pretrained=None, overrides=tiny)

