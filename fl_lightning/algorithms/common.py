"""Pieces several algorithms share: the frozen backbone from the config and test evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.utils.data import DataLoader

from fl_lightning.errors import ConfigError
from fl_lightning.models.backbones import BackboneArgumentError, ViTBackbone, build_backbone
from fl_lightning.modules.evaluation import evaluate_classifier

if TYPE_CHECKING:
    from collections.abc import Callable

    from fl_lightning.config import RunConfig
    from fl_lightning.federation.algorithm import Environment

__all__ = ["frozen_backbone", "evaluate_on_test"]


def frozen_backbone(cfg: RunConfig) -> ViTBackbone:
    """The config's backbone, frozen and in eval mode (built once per rank)."""
    m = cfg.model
    try:
        backbone = build_backbone(library=m.library, name=m.name, pretrained=m.pretrained, checkpoint=m.checkpoint,
                                  feature=m.feature, image_size=cfg.data.image_size, overrides=m.overrides,
                                  cache_dir=m.cache_dir, download=m.download)
    except BackboneArgumentError as err:  # the library cannot use a value: name the model.* key
        raise ConfigError(f"model.{err.argument}", err.value, err.allowed) from None
    return backbone.freeze()


def evaluate_on_test(env: Environment, logits_fn: Callable[[Tensor], Tensor]) -> dict[str, Any]:
    loader: DataLoader = env.loader(env.splits.test, shuffle=False)
    return evaluate_classifier(logits_fn, loader, num_classes=env.num_classes, device=env.fabric.device)
