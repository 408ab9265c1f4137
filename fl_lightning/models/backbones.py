"""Backbones by library name: ``build_backbone(library='timm', ...)`` → a :class:`ViTBackbone`.

Each library has one adapter class (:class:`OpenCLIPBackbone`, :class:`TimmBackbone`) that owns
everything library-specific: the embed/encode/pool seams, the layout checks, the default input
normalisation, how its factory is called and how its weights are found and loaded. This module
only maps a library name to its adapter (:data:`BACKBONES`) and keeps the public factories.

Importing this module imports neither open_clip nor timm; building a timm backbone never imports
open_clip, and the other way round (each adapter imports its library when it builds).

Weights are loaded with the libraries' own loaders from local files or caches. Downloading is
opt-in (``download=True``); otherwise the cache is checked *before* anything is built, so a missing
file stops the run at once with one line saying what was looked for and how to provide it. A
weights file is checked before it is loaded (:func:`check_checkpoint` does the cheap part of that
check on its own, for a preflight).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from fl_lightning.models.hub import resolve_weights_file
from fl_lightning.models.open_clip_backbone import OpenCLIPBackbone, tiny_clip_overrides
from fl_lightning.models.timm_backbone import TimmBackbone, tiny_timm_overrides
from fl_lightning.models.vit_backbone import BackboneArgumentError, ViTBackbone
from fl_lightning.models.weights import check_checkpoint

if TYPE_CHECKING:
    from fl_lightning.models.cnn_backbone import CNNBackbone

__all__ = [
    "BACKBONES",
    "BackboneArgumentError",
    "LIBRARIES",
    "OpenCLIPBackbone",
    "TimmBackbone",
    "ViTBackbone",
    "backbone_class",
    "build_backbone",
    "build_feature_backbone",
    "build_tiny_backbone",
    "check_checkpoint",
    "tiny_clip_overrides",
    "tiny_timm_overrides",
]

# library name → adapter class. A new library is one adapter module and one entry here.
BACKBONES: dict[str, type[ViTBackbone]] = {cls.library: cls for cls in (OpenCLIPBackbone, TimmBackbone)}
LIBRARIES = tuple(BACKBONES)


def backbone_class(library: str) -> type[ViTBackbone]:
    """The adapter class of ``library``.

    Raises:
        BackboneArgumentError: (a ``ValueError``) unknown library.
    """
    try:
        return BACKBONES[library]
    except (KeyError, TypeError):
        raise BackboneArgumentError("library", library, " or ".join(repr(name) for name in LIBRARIES)) from None


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
        library: ``'open_clip'`` or ``'timm'`` (a key of :data:`BACKBONES`).
        name: the library's model name (``'ViT-B-16'``; ``'vit_base_patch16_224'``); open_clip also
            takes ``'local-dir:/dir'`` (``open_clip_config.json`` beside the weights) and
            ``'hf-hub:org/repo'`` (read from the local cache unless ``download``).
        pretrained: open_clip: a tag (``'openai'``) or a weights file; timm: a tag
            (``'augreg2_in21k_ft_in1k'``) or ``'default'``. ``None``: random initialisation.
            Tags whose weights were trained with QuickGELU (open_clip ``'openai'``) get
            ``force_quick_gelu=True``.
        checkpoint: a local weights file (.pt/.pth/.bin/.safetensors; ``~`` is expanded), a folder holding
            one, or a hub id (``org/name``: its snapshot in the HF cache, fetched only with ``download``), loaded with
            ``weights_only=True`` or safetensors. open_clip: a full CLIP state dict as open_clip
            saves it (for a visual-only file use ``overrides={'pretrained_image_path': file}``);
            timm: a ViT state dict (a classifier head in it is dropped). Its keys must be the
            model's.
        feature: ``'proj'`` or ``'pre_proj'``, see :class:`ViTBackbone`.
        image_size: input resolution (open_clip ``force_image_size``, timm ``img_size``; the
            position embedding of loaded weights is resampled by the library).
        overrides: extra keyword arguments of ``open_clip.create_model`` / ``timm.create_model``
            (e.g. :func:`tiny_clip_overrides`, :func:`tiny_timm_overrides`).
        cache_dir: where the libraries keep downloaded weights (default: their own).
        download: allow fetching missing weights from the hubs. When False the local cache is
            checked first and nothing is requested from the network.

    Raises:
        BackboneArgumentError: (a ``ValueError``; ``.argument`` names the keyword) unknown library,
            model name, tag or feature, or a model layout the adapter does not support.
        MissingResourceError: weights not on disk (and downloading off or failing), or a weights
            file that is unreadable, not a state dict, or whose keys do not fit the model (one line
            naming the file).
    """
    adapter = backbone_class(library)
    if cache_dir is not None:
        cache_dir = os.path.expanduser(cache_dir)
    if checkpoint is not None:  # a file, a folder holding one, or a hub id (its cached snapshot: models/hub.py)
        checkpoint = resolve_weights_file(checkpoint, download=download, cache_dir=cache_dir)
    return adapter.build(
        name=name,
        pretrained=pretrained,
        checkpoint=checkpoint,
        feature=feature,
        image_size=image_size,
        overrides=dict(overrides or {}),
        cache_dir=cache_dir,
        download=download,
    )


def build_feature_backbone(
    *, library: str, name: str, image_size: int | None = None, overrides: dict | None = None, **kwargs: Any
) -> ViTBackbone | CNNBackbone:
    """The frozen-feature backbone of the statistical methods (AFL, FedCGS, FedPFT, FedAvg of a head):
    :func:`build_backbone`'s ViT, or for a timm model without a ViT layout (``resnet18``, ``resnet50``,
    ``convnext_tiny``…) a :class:`~fl_lightning.models.cnn_backbone.CNNBackbone` of its pooled
    pre-logit features. ``kwargs``: those of :func:`build_backbone` (``model.feature`` applies to ViTs).

    Raises:
        as :func:`build_backbone`.
    """
    from fl_lightning.models.timm_backbone import is_timm_vit

    if library == "timm" and not is_timm_vit(name, overrides):
        from fl_lightning.models.cnn_backbone import CNNBackbone

        kwargs.pop("feature", None)
        for key in ("checkpoint", "cache_dir"):
            if kwargs.get(key) is not None:
                kwargs[key] = os.path.expanduser(kwargs[key])
        if kwargs.get("checkpoint") is not None:
            kwargs["checkpoint"] = resolve_weights_file(
                kwargs["checkpoint"], download=bool(kwargs.get("download")), cache_dir=kwargs.get("cache_dir")
            )
        return CNNBackbone.build(
            name=name,
            image_size=image_size,
            overrides=dict(overrides or {}),
            pretrained=kwargs.get("pretrained"),
            checkpoint=kwargs.get("checkpoint"),
            cache_dir=kwargs.get("cache_dir"),
            download=bool(kwargs.get("download", False)),
        )
    return build_backbone(library=library, name=name, image_size=image_size, overrides=overrides, **kwargs)


def build_tiny_backbone(
    library: str, *, image_size: int = 32, seed: int = 0, depth: int = 2, width: int = 64, overrides: dict | None = None
) -> ViTBackbone:
    """A tiny random ViT (~0.1 M parameters) for tests; the same ``seed`` gives the same weights.

    ``overrides`` are merged on top of the tiny config (e.g. ``{'reg_tokens': 2}`` for timm).
    """
    name, tiny = backbone_class(library).tiny_config(image_size, width=width, depth=depth)
    tiny.update(overrides or {})
    # Seed a private copy of the global RNG: the libraries initialise from it, and callers'
    # random streams must not depend on whether a tiny model was built.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_backbone(library=library, name=name, pretrained=None, overrides=tiny)
