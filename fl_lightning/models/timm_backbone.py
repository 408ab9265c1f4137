"""The timm adapter: ``timm.models.vision_transformer.VisionTransformer`` as a
:class:`~fl_lightning.models.vit_backbone.ViTBackbone`.

The model runs patch_embed → ``_pos_embed`` (prepends CLS and register tokens, adds pos_embed) →
patch_drop → norm_pre → blocks → norm → fc_norm(CLS) → head_drop; prompts go in after
patch_drop, before norm_pre. It is built with ``num_classes=0`` (no classifier), and pooled on the
CLS token even where the model's own ``global_pool`` averages (which would mix prompts in).

Weights: a tag (``'augreg2_in21k_ft_in1k'``) is looked up in the local caches unless downloading is
allowed; a local ``checkpoint`` is checked first
(:func:`~fl_lightning.models.weights.open_state_dict`) and loaded through timm's pretrained loader
(so its checkpoint filter runs and a classifier head in the file is dropped). That loader is not
strict once the head is dropped, so the keys are compared with the model's here: a file of another
model stops with one line instead of leaving the trunk silently random. timm is imported only
when a model is built.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fl_lightning.errors import MissingResourceError
from fl_lightning.models.vit_backbone import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    BackboneArgumentError,
    ViTBackbone,
    first_size,
)
from fl_lightning.models.weights import (
    NO_WEIGHTS_HINT,
    describe_load_error,
    find_cached_weights,
    key_mismatch_message,
    open_state_dict,
)

__all__ = ["TimmBackbone", "build_timm_model", "is_timm_vit", "tiny_timm_overrides"]


class TimmBackbone(ViTBackbone):
    """A timm ViT built with ``num_classes=0``; it has no projection, so ``feature`` ``'proj'`` and
    ``'pre_proj'`` both give the pre-logits CLS feature (after the final norm); ``'cls'`` the last
    block's CLS state before it."""

    library: ClassVar[str] = "timm"
    default_mean: ClassVar[tuple[float, ...]] = IMAGENET_MEAN
    default_std: ClassVar[tuple[float, ...]] = IMAGENET_STD
    preprocess_attr = "pretrained_cfg"

    @staticmethod
    def _check_model(model: nn.Module) -> None:
        if not hasattr(model, "patch_embed") or not hasattr(model, "blocks"):
            raise BackboneArgumentError("name", type(model).__name__, "a timm VisionTransformer")
        if getattr(model, "cls_token", None) is None:
            raise BackboneArgumentError("name", type(model).__name__, "a timm ViT with a class token")
        if getattr(model, "attn_pool", None) is not None:
            raise BackboneArgumentError("name", type(model).__name__, "a timm ViT without attentional pooling")

    def _read_geometry(self) -> None:
        m = self.model
        self.image_size = first_size(m.patch_embed.img_size)
        self.patch_size = first_size(m.patch_embed.patch_size)
        self.width = int(m.embed_dim)
        self.feature_dim = int(m.num_features)
        self.num_prefix_tokens = int(m.num_prefix_tokens)

    # -- the three seams ---------------------------------------------------------------------------
    @property
    def blocks(self) -> nn.ModuleList | nn.Sequential:
        return self.model.blocks

    def embed(self, images: Tensor) -> Tensor:
        m = self.model
        x = m.patch_embed(images)  # (B, L, D)
        x = m._pos_embed(x)  # adds CLS/register tokens (num_prefix_tokens) and pos_embed: (B, P + L, D)
        return m.patch_drop(x)

    def encode(self, tokens: Tensor) -> Tensor:
        """norm_pre → blocks → norm: (B, T, D) → (B, T, D) (``feature='cls'``: without the final norm)."""
        m = self.model
        x = m.norm_pre(tokens)
        for block in m.blocks:
            x = block(x)
        return x if self.feature == "cls" else m.norm(x)

    def pool(self, tokens: Tensor) -> Tensor:
        m = self.model
        if self.feature == "cls":  # the last block's CLS state itself
            return tokens[:, 0]
        # as timm's forward_head(pre_logits=True), with the pooling fixed to the CLS token
        return m.head_drop(m.fc_norm(tokens[:, 0]))

    # -- factories ---------------------------------------------------------------------------------
    @classmethod
    def tiny_config(cls, image_size: int, *, width: int, depth: int) -> tuple[str, dict]:
        return "vit_base_patch16_224", tiny_timm_overrides(image_size, width=width, depth=depth)

    @staticmethod
    def build_model(**kwargs: Any) -> nn.Module:  # noqa: D102 — see ViTBackbone.build_model
        return build_timm_model(**kwargs)


# ------------------------------------------------------------------------------------------------
# Building with timm's factory (no network unless download=True)
# ------------------------------------------------------------------------------------------------
def _pretrained_cfg(name: str, full_name: str, tag: str) -> Any:
    """timm's config of a pretrained tag, or BackboneArgumentError listing the tags of ``name``."""
    import timm

    try:
        cfg = timm.models.get_pretrained_cfg(full_name)
    except RuntimeError:  # timm: "Invalid pretrained tag (...) for ..."
        cfg = None
    if cfg is None:
        arch = name.split(".", 1)[0]
        tags = [n.split(".", 1)[1] for n in timm.list_pretrained(arch + ".*")]
        allowed = f"one of {tags} for {arch}, 'default', or null" if tags else f"null ({arch} has no pretrained weights)"
        raise BackboneArgumentError("pretrained", tag, allowed)
    return cfg


def _cached_tag_weights(full_name: str, cfg: Any, cache_dir: str | None) -> str:
    """The file of a timm pretrained tag already on disk, or MissingResourceError."""
    names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["model.safetensors", "pytorch_model.bin"]
    return find_cached_weights(
        what=f"timm weights {full_name}",
        file=cfg.file or None,
        hf_hub_id=cfg.hf_hub_id or None,
        hf_filenames=names,
        url=cfg.url or None,
        url_dir=cache_dir or os.path.join(torch.hub.get_dir(), "checkpoints"),
        cache_dir=cache_dir,
    )


def _file_keys_as_timm_sees_them(state: dict[str, Tensor], model: nn.Module) -> set[str]:
    """The keys timm's pretrained loader would hand to ``load_state_dict`` for this file.

    Mirrors that loader at the level of key names: drop a DataParallel ``module.`` prefix, run the
    model family's ``checkpoint_filter_fn`` (which converts other layouts, e.g. OpenAI CLIP, to
    timm's) and drop the classifier that ``num_classes=0`` discards. The tensors may be ``meta``
    tensors: only names are used. The weights themselves are loaded by timm, not from here.
    """
    state = {(k[7:] if k.startswith("module.") else k): v for k, v in state.items()}
    filter_fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if filter_fn is not None:
        try:
            state = filter_fn(state, model)
        except Exception:  # noqa: BLE001 — a filter that needs real data: fall back to the names as stored
            pass
    cfg = getattr(model, "pretrained_cfg", None) or {}
    classifiers = cfg.get("classifier") or ()
    classifiers = (classifiers,) if isinstance(classifiers, str) else tuple(classifiers)
    if cfg.get("num_classes", 0) != 0:
        state = {k: v for k, v in state.items() if not any(k in (f"{c}.weight", f"{c}.bias") for c in classifiers)}
    return set(state)


def _build_from_file(full_name: str, path: str, *, label: str, check_keys: bool, kwargs: dict) -> nn.Module:
    import timm

    state = open_state_dict(path, label=label, meta=True)  # readable, a state dict: one line otherwise
    try:
        # Through timm's pretrained loader (not checkpoint_path) so that its checkpoint filter runs and a
        # classifier head in the file is dropped for num_classes=0.
        vit = timm.create_model(full_name, pretrained=True, num_classes=0, pretrained_cfg_overlay=dict(file=path), **kwargs)
    except (RuntimeError, KeyError, ValueError) as err:
        raise MissingResourceError(
            f"{label} {path} does not fit timm {full_name}: {describe_load_error(err)}; expected a state dict of this model"
        ) from None
    if check_keys:
        expected = set(vit.state_dict())
        got = _file_keys_as_timm_sees_them(state, vit)
        missing, unexpected = sorted(expected - got), sorted(got - expected)
        if missing or unexpected:
            raise MissingResourceError(
                key_mismatch_message(label=label, path=path, model=f"timm {full_name}", missing=missing, unexpected=unexpected)
            )
    return vit


def is_timm_vit(name: str, overrides: dict | None = None) -> bool:
    """Whether timm's ``name`` (with ``overrides``) is a ViT with patch embedding and blocks, decided by
    building it on the ``meta`` device (no memory, no weights: ~0.1–0.3 s) once per process for each
    ``(name, overrides)``: a comparison's runs in one process ask again and again. An unknown name counts
    as a ViT, so that the ViT path reports it."""
    try:
        key = repr(sorted(dict(overrides or {}).items()))
    except TypeError:  # unorderable override keys: no memo
        return _probe_timm_vit(name, overrides)
    if (name, key) not in _VIT_PROBES:
        _VIT_PROBES[(name, key)] = _probe_timm_vit(name, overrides)
    return _VIT_PROBES[(name, key)]


_VIT_PROBES: dict[tuple[str, str], bool] = {}  # is_timm_vit's answers, per process


def _probe_timm_vit(name: str, overrides: dict | None) -> bool:
    import timm

    if name.startswith(HF_HUB):  # the architecture its cached config.json names (uncached: the ViT path reports it)
        hub = _cached_hub_config(name)
        if hub is None:
            return True
        name, overrides = hub[0], {**hub[2], **dict(overrides or {})}
    if not timm.is_model(name.split(".", 1)[0]) and not timm.is_model(name):
        return True
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, num_classes=0, **dict(overrides or {}))
    except Exception:  # noqa: BLE001 — bad overrides etc.: let the real build report them
        return True
    return hasattr(model, "patch_embed") and hasattr(model, "blocks")


def build_timm_model(
    *,
    name: str,
    pretrained: str | None,
    checkpoint: str | None,
    image_size: int | None,
    overrides: dict,
    cache_dir: str | None,
    download: bool,
    vit: bool = True,
) -> nn.Module:
    """A timm model without classifier (``num_classes=0``), weights from a local file, the caches or
    (``download``) the hub, with the one-line errors of this module. ``vit``: pass ``image_size`` as
    ``img_size`` (a CNN takes any input size and has no such argument)."""
    import timm

    if name.startswith(HF_HUB):
        return _build_from_hub(
            name,
            checkpoint=checkpoint,
            image_size=image_size,
            overrides=overrides,
            cache_dir=cache_dir,
            download=download,
            vit=vit,
        )
    if not timm.is_model(name):
        raise BackboneArgumentError("name", name, "a timm model name (see timm.list_models('vit_*')), or 'hf-hub:org/repo'")
    kwargs: dict[str, Any] = dict(overrides)
    if image_size is not None and vit:
        kwargs.setdefault("img_size", image_size)
    # `pretrained` is a timm tag ('augreg2_in21k_ft_in1k'), or 'default' for the name's default tag.
    full_name = name if not pretrained or pretrained == "default" or "." in name else f"{name}.{pretrained}"
    cfg = _pretrained_cfg(name, full_name, pretrained) if pretrained else None
    if checkpoint is not None:
        if not os.path.isfile(checkpoint):
            raise MissingResourceError(
                f"model.checkpoint={checkpoint!r} is not a file; give the path of a "
                f"local timm weights file (.pth, .bin or .safetensors)"
            )
        return _build_from_file(full_name, checkpoint, label="model.checkpoint", check_keys=True, kwargs=kwargs)
    if not pretrained:
        return timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    if not download:
        file = _cached_tag_weights(full_name, cfg, cache_dir)
        if file.endswith((".npz", ".npy")):  # big_vision weights: timm's custom loader reads them
            return timm.create_model(full_name, pretrained=True, num_classes=0, pretrained_cfg_overlay=dict(file=file), **kwargs)
        # the published file of this very tag: its keys are the model's, only readability is in doubt
        return _build_from_file(full_name, file, label=f"cached timm weights {full_name}:", check_keys=False, kwargs=kwargs)
    try:
        return timm.create_model(full_name, pretrained=True, num_classes=0, cache_dir=cache_dir, **kwargs)
    except (OSError, RuntimeError) as err:
        raise MissingResourceError(
            f"timm could not load {full_name} (cache_dir={cache_dir!r}): {describe_load_error(err)}; {NO_WEIGHTS_HINT}"
        ) from err


HF_HUB = "hf-hub:"  # timm's prefix of a model published on the Hugging Face hub (config.json + weights)
_HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # the files timm's hub loader looks for, in its order


def _hub_config(folder: str, name: str) -> tuple[str, dict, dict]:
    """(architecture, pretrained_cfg, model_args) of a timm hub snapshot's ``config.json`` (timm's
    ``load_model_config_from_hf``), or one line naming what is wrong."""
    import timm

    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        arch = config.get("architecture") or config["model_cfg"]["architecture"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise MissingResourceError(
            f"model.name={name!r}: {path} is missing or holds no timm 'architecture'; the hub repository is not a timm model"
        ) from None
    if not timm.is_model(arch):
        raise MissingResourceError(
            f"model.name={name!r}: its config.json names architecture {arch!r}, which this "
            f"timm ({timm.__version__}) does not have"
        )
    pretrained_cfg = dict(config.get("pretrained_cfg") or {})
    pretrained_cfg.setdefault("hf_hub_id", name[len(HF_HUB) :])
    return arch, pretrained_cfg, dict(config.get("model_args") or {})


def _cached_hub_config(name: str) -> tuple[str, dict, dict] | None:
    """:func:`_hub_config` of the cached snapshot of ``name``, or None when it is not in the cache (or unreadable)."""
    from fl_lightning.models.hub import hub_snapshot

    try:
        folder = hub_snapshot(name[len(HF_HUB) :], download=False, key="model.name", download_key="model.download")
        return _hub_config(folder, name)
    except (MissingResourceError, BackboneArgumentError):
        return None


def _build_from_hub(
    name: str,
    *,
    checkpoint: str | None,
    image_size: int | None,
    overrides: dict,
    cache_dir: str | None,
    download: bool,
    vit: bool,
) -> nn.Module:
    """``model.name: hf-hub:org/repo`` as timm's ``create_model('hf-hub:...')`` builds it — the architecture,
    ``model_args`` and ``pretrained_cfg`` (mean, std, input size) of the snapshot's ``config.json``, its weights
    through timm's pretrained loader (``num_classes=0`` drops the classifier) — but from the hub cache
    (fetched first only with ``model.download``) and with this module's one-line errors. ``model.checkpoint``
    replaces the snapshot's weights; ``model.pretrained`` is not used (the repository is one set of weights)."""
    import timm

    from fl_lightning.models.hub import hub_snapshot

    folder = hub_snapshot(
        name[len(HF_HUB) :], download=download, key="model.name", download_key="model.download", cache_dir=cache_dir
    )
    arch, pretrained_cfg, model_args = _hub_config(folder, name)
    kwargs: dict[str, Any] = {**model_args, **dict(overrides)}
    if image_size is not None and vit:
        kwargs.setdefault("img_size", image_size)
    if checkpoint is not None:
        if not os.path.isfile(checkpoint):
            raise MissingResourceError(
                f"model.checkpoint={checkpoint!r} is not a file; give the path of a "
                f"local timm weights file (.pth, .bin or .safetensors)"
            )
        file, label = checkpoint, "model.checkpoint"
    else:
        found = [Path(folder) / f for f in _HUB_WEIGHTS if (Path(folder) / f).is_file()]
        if not found:
            raise MissingResourceError(
                f"model.name={name!r}: its snapshot {folder} holds none of {', '.join(_HUB_WEIGHTS)}; {NO_WEIGHTS_HINT}"
            )
        file, label = str(found[0]), f"timm weights {name}:"
    open_state_dict(file, label=label, meta=True)  # readable, a state dict: one line otherwise
    try:
        return timm.create_model(
            arch, pretrained=True, num_classes=0, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=dict(file=file), **kwargs
        )
    except (RuntimeError, KeyError, ValueError) as err:
        raise MissingResourceError(
            f"{label} {file} does not fit timm {arch} ({name}): {describe_load_error(err)}; expected a state dict of this model"
        ) from None


# ------------------------------------------------------------------------------------------------
# Tiny random model for tests and offline demos
# ------------------------------------------------------------------------------------------------
def tiny_timm_overrides(
    image_size: int = 32, *, patch_size: int = 8, width: int = 64, depth: int = 2, num_heads: int = 2
) -> dict:
    """``timm.create_model('vit_base_patch16_224', **overrides)`` kwargs for a tiny random ViT."""
    return dict(img_size=image_size, patch_size=patch_size, embed_dim=width, depth=depth, num_heads=num_heads)
