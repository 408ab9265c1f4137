"""The tiny timm ViT the modules' tests train (16-px inputs, 2 blocks of width 32): ``pretrain_classifier`` on it, and a
LoRA classifier on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
import torch
from torch.utils.data import Dataset

from fl_lightning.models.lora import LoraSpec
from fl_lightning.modules.lora_classifier import LoRAClassifier
from fl_lightning.modules.pretraining import pretrain_classifier

NAME = "vit_tiny_patch16_224"
TINY = dict(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2)


def pretrain_tiny(train_dataset: Dataset, val_dataset: Dataset, out_dir: Path, **kw: Any) -> Any:
    """``pretrain_classifier`` of the tiny ViT on 3 classes on the CPU; ``kw``: the run's other arguments
    (``overrides``, ``num_classes`` or ``accelerator`` replace these defaults)."""
    run: dict[str, Any] = dict(model_name=NAME, overrides=TINY, num_classes=3, accelerator="cpu")
    return pretrain_classifier(**{**run, **kw}, train_dataset=train_dataset, val_dataset=val_dataset, out_dir=out_dir)


def lora_classifier(num_classes: int, *, depth: int, seed: int = 0, **kw: Any) -> LoRAClassifier:
    """A rank-2 (α 4) :class:`LoRAClassifier` on the tiny ViT with ``depth`` blocks, initialised under ``seed``;
    ``kw``: the classifier's other arguments."""
    torch.manual_seed(seed)
    vit = timm.create_model(NAME, pretrained=False, num_classes=num_classes, **{**TINY, "depth": depth})
    return LoRAClassifier(backbone=vit, spec=LoraSpec(rank=2, alpha=4), **kw)


def nonzero_lora(module: LoRAClassifier, seed: int = 0) -> None:
    """Seeded values (std 0.1) for every adapter: peft starts lora_B at zero, so lora_A would get no gradient."""
    g = torch.Generator().manual_seed(seed)
    module.load_lora_state({k: torch.randn(v.shape, generator=g) * 0.1 for k, v in module.lora_state().items()})
