"""The tiny timm ViT the pre-training tests train (16-px inputs, 2 blocks of width 32), and ``pretrain_classifier`` on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from fl_lightning.modules.pretraining import pretrain_classifier

NAME = "vit_tiny_patch16_224"
TINY = dict(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2)


def pretrain_tiny(train_dataset: Dataset, val_dataset: Dataset, out_dir: Path, **kw: Any) -> Any:
    """``pretrain_classifier`` of the tiny ViT on 3 classes on the CPU; ``kw``: the run's other arguments
    (``overrides``, ``num_classes`` or ``accelerator`` replace these defaults)."""
    run: dict[str, Any] = dict(model_name=NAME, overrides=TINY, num_classes=3, accelerator="cpu")
    return pretrain_classifier(**{**run, **kw}, train_dataset=train_dataset, val_dataset=val_dataset, out_dir=out_dir)
