"""The library-independent face of a Vision Transformer: :class:`ViTBackbone`.

FedOPAL (Eq. (4)-(5)) inserts prompt tokens between the embedding stage of a ViT and its
transformer trunk, and reads the CLS state at the end. Each library keeps those seams private in
its own places, so every library gets one adapter subclass
(:class:`~fl_lightning.models.open_clip_backbone.OpenCLIPBackbone`,
:class:`~fl_lightning.models.timm_backbone.TimmBackbone`) that exposes three public steps with one
meaning:

    images ─► embed ─► (B, P + L, D) tokens ─► encode ─► (B, P + L, D) ─► pool ─► h (B, feature_dim)

``embed`` stops exactly where VPT inserts prompts (after the positional embedding and patch
dropout, before ``ln_pre``/``norm_pre``); ``pool`` always takes the CLS token (never an average,
which would mix the prompts into the feature).

This module imports neither open_clip nor timm; each adapter imports its own library when it
builds a model, so a timm run never pays for open_clip and vice versa.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from torch import Tensor, nn

from fl_lightning.models.frozen_trunk import FrozenTrunk

__all__ = ["BackboneArgumentError", "FEATURES", "ViTBackbone", "normalization_name"]

FEATURES = ("proj", "pre_proj", "cls")

# Normalisation names for the data transforms; the exact values are on ViTBackbone.mean/std.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INCEPTION_MEAN = (0.5, 0.5, 0.5)


class BackboneArgumentError(ValueError):
    """An argument of :func:`~fl_lightning.models.backbones.build_backbone` has a value the library
    cannot use. A ``ValueError`` that also carries the argument, so the config layer can name its
    key (``model.<argument>``) without parsing the message.

    Args:
        argument: the keyword of ``build_backbone`` (``"name"``, ``"pretrained"``, ``"library"``…).
        value: the offending value.
        allowed: what is allowed, in words.
    """

    def __init__(self, argument: str, value: object, allowed: str) -> None:
        self.argument, self.value, self.allowed = argument, value, allowed
        super().__init__(f"{argument}={value!r} is not allowed; expected {allowed}")


def normalization_name(mean: tuple[float, ...]) -> str:
    """``'clip'``, ``'imagenet'``, ``'inception'`` or ``'custom'``: the name of an input normalisation."""

    def close(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
        return all(abs(x - y) < 1e-4 for x, y in zip(a, b))

    if close(mean, OPENAI_CLIP_MEAN):
        return "clip"
    if close(mean, IMAGENET_MEAN):
        return "imagenet"
    if close(mean, INCEPTION_MEAN):
        return "inception"
    return "custom"


def first_size(size: Any) -> int:
    """open_clip and timm store sizes as ints or (h, w) tuples; we use square inputs."""
    return int(size[0]) if isinstance(size, (tuple, list)) else int(size)


class ViTBackbone(FrozenTrunk, ABC):
    """A ViT trunk with ``embed``/``encode``/``pool`` seams; one subclass per library.

    Args:
        model: the library's vision model, kept as the submodule ``model`` so parameter paths keep
            the library's names (``model.transformer.resblocks.3...`` / ``model.blocks.3...``),
            which peft's ``layers_to_transform`` relies on.
        feature: ``'proj'`` (the CLIP image embedding, ``ln_post(CLS) @ proj``), ``'pre_proj'``
            (the width-D state after the final LayerNorm, before any projection) or ``'cls'`` (the
            class token's state as the last block outputs it: no final LayerNorm, no projection —
            FedOPAL's words, "the class token state at the last layer", read literally). Models
            without a projection give the same feature for ``'proj'`` and ``'pre_proj'``.
        mean, std: the input normalisation the weights expect.

    Attributes:
        library (class attribute), normalization (``'clip'``, ``'imagenet'``, ``'inception'`` or
        ``'custom'``), mean, std, image_size, patch_size, width (token dim D), feature_dim (dim of
        h), num_blocks, num_prefix_tokens (CLS + register tokens in front of the patches).

    Raises:
        BackboneArgumentError: ``feature`` unknown, or a model of a layout the adapter does not
            support (e.g. attentional pooling instead of a CLS token).

    Example:
        >>> from fl_lightning.models.backbones import build_tiny_backbone
        >>> backbone = build_tiny_backbone("timm")
        >>> backbone(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 64])
    """

    library: ClassVar[str]
    default_mean: ClassVar[tuple[float, ...]]
    default_std: ClassVar[tuple[float, ...]]
    preprocess_attr: ClassVar[str]  # the model attribute holding the weights' own mean/std, if any

    # geometry, set by each adapter's _read_geometry
    image_size: int
    patch_size: int
    width: int
    feature_dim: int
    num_prefix_tokens: int

    def __init__(self, *, model: nn.Module, feature: str = "proj", mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        if feature not in FEATURES:
            raise BackboneArgumentError("feature", feature, " or ".join(repr(f) for f in FEATURES))
        self._check_model(model)
        self.model = model
        self.feature = feature
        self.mean, self.std = tuple(mean), tuple(std)
        self.normalization = normalization_name(self.mean)
        self._frozen = False
        self._read_geometry()
        self.num_blocks = len(self.blocks)

    @classmethod
    def build(cls, *, feature: str, **weights: Any) -> ViTBackbone:
        """Build the library's model with its own factory and loaders (see ``build_backbone``), with the
        normalisation its weights were trained with (the library's default when they do not say).
        ``weights``: :meth:`build_model`'s keywords."""
        model = cls.build_model(**weights)
        cfg = getattr(model, cls.preprocess_attr, None) or {}
        return cls(
            model=model,
            feature=feature,
            mean=tuple(cfg.get("mean", cls.default_mean)),
            std=tuple(cfg.get("std", cls.default_std)),
        )

    # -- what each library adapter provides --------------------------------------------------------
    @staticmethod
    @abstractmethod
    def build_model(**weights: Any) -> nn.Module:
        """The library's own model, built by its factory, weights loaded by its loaders. ``weights``, all
        keywords: ``name`` (str), ``pretrained`` (a tag or None), ``checkpoint`` (a local file or None),
        ``image_size`` (int or None), ``overrides`` (dict), ``cache_dir`` (str or None), ``download`` (bool)
        — as :func:`~fl_lightning.models.backbones.build_backbone` passes them."""

    @classmethod
    @abstractmethod
    def tiny_config(cls, image_size: int, *, width: int, depth: int) -> tuple[str, dict]:
        """``(name, overrides)`` of a tiny random model of this library for tests."""

    @staticmethod
    @abstractmethod
    def _check_model(model: nn.Module) -> None:
        """Raise :class:`BackboneArgumentError` unless ``model`` has the plain CLS-token ViT layout."""

    @abstractmethod
    def _read_geometry(self) -> None:
        """Set image_size, patch_size, width, feature_dim and num_prefix_tokens from ``self.model``."""

    @property
    @abstractmethod
    def blocks(self) -> nn.ModuleList | nn.Sequential:
        """The transformer blocks, under the library's own module path."""

    @abstractmethod
    def embed(self, images: Tensor) -> Tensor:
        """Patch embedding, prefix tokens and positional embedding: (B, 3, H, W) → (B, P + L, D).

        Stops where VPT inserts prompts (after patch dropout, before the pre-norm);
        ``P = num_prefix_tokens`` (CLS, then any register tokens).
        """

    @abstractmethod
    def encode(self, tokens: Tensor) -> Tensor:
        """The rest of the trunk: (B, T, D) → (B, T, D)."""

    @abstractmethod
    def pool(self, tokens: Tensor) -> Tensor:
        """The CLS token state h: (B, T, D) → (B, feature_dim) (never an average over tokens)."""

    # -- shared behaviour ---------------------------------------------------------------------------
    def forward(self, images: Tensor) -> Tensor:
        """h = pool(encode(embed(images))), shape (B, feature_dim)."""
        return self.pool(self.encode(self.embed(images)))
