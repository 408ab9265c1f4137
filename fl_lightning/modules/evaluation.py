"""Test-split evaluation of a global model: top-1 accuracy, loss and per-class accuracy (torchmetrics)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

__all__ = ["evaluate_classifier"]


@torch.inference_mode()
def evaluate_classifier(logits_fn: Callable[[Tensor], Tensor], batches: Iterable[tuple[Tensor, Tensor]], *,
                        num_classes: int, device: torch.device) -> dict[str, Any]:
    """Run ``logits_fn`` over the test batches.

    Returns:
        ``accuracy`` (micro top-1 in [0, 1]), ``loss`` (mean cross-entropy) and ``per_class_accuracy``
        (a list, NaN-free: classes absent from the test split get 0).
    """
    # the server evaluates alone (rank 0): no cross-rank sync, which would wait for the other ranks
    top1 = MulticlassAccuracy(num_classes=num_classes, average="micro", sync_on_compute=False).to(device)
    per_class = MulticlassAccuracy(num_classes=num_classes, average=None, sync_on_compute=False).to(device)
    loss_sum, count = 0.0, 0
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        logits = logits_fn(images).float()
        loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
        count += labels.numel()
        top1.update(logits, labels)
        per_class.update(logits, labels)
    return {"accuracy": float(top1.compute()), "loss": loss_sum / max(count, 1),
            "per_class_accuracy": [round(float(a), 6) for a in per_class.compute().nan_to_num(0.0)]}
