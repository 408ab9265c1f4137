"""Pieces several algorithms share: the frozen backbone from the config and test evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.utils.data import DataLoader

from fl_lightning.errors import ConfigError
from fl_lightning.models.backbones import BackboneArgumentError, ViTBackbone, build_feature_backbone
from fl_lightning.models.cnn_backbone import CNNBackbone
from fl_lightning.modules.evaluation import evaluate_classifier

if TYPE_CHECKING:
    from collections.abc import Callable

    from fl_lightning.config import RunConfig
    from fl_lightning.federation.algorithm import Environment

__all__ = ["frozen_backbone", "evaluate_on_test", "require_vit"]


def frozen_backbone(cfg: RunConfig) -> ViTBackbone | CNNBackbone:
    """The config's backbone, frozen and in eval mode (built once per rank): a ViT, or for a timm CNN
    (``model.name: resnet18``) its pooled pre-logit features (:class:`CNNBackbone`)."""
    m = cfg.model
    try:
        backbone = build_feature_backbone(library=m.library, name=m.name, pretrained=m.pretrained, checkpoint=m.checkpoint,
                                  feature=m.feature, image_size=cfg.data.image_size, overrides=m.overrides,
                                  cache_dir=m.cache_dir, download=m.download)
    except BackboneArgumentError as err:  # the library cannot use a value: name the model.* key
        raise ConfigError(f"model.{err.argument}", err.value, err.allowed) from None
    return backbone.freeze()


def require_vit(cfg: RunConfig, backbone: ViTBackbone | CNNBackbone) -> ViTBackbone:
    """``backbone`` if it is a ViT; else a ConfigError on ``model.name`` (prompts need a ViT's tokens)."""
    if not isinstance(backbone, ViTBackbone):
        raise ConfigError("model.name", cfg.model.name, f"a ViT for {cfg.algorithm} (its prompts go between a "
                          "ViT's embedding and its blocks); a CNN's pooled features serve afl, fedcgs, fedpft, fedavg")
    return backbone


def evaluate_on_test(env: Environment, logits_fn: Callable[[Tensor], Tensor]) -> dict[str, Any]:
    loader: DataLoader = env.loader(env.splits.test, shuffle=False)
    return evaluate_classifier(logits_fn, loader, num_classes=env.num_classes, device=env.fabric.device)
