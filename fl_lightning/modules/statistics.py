"""Streaming accumulation of the analytic statistics R_k, C_k on a client (FedOPAL Eq. (7), AFL).

Features are computed batch by batch and folded into R = Σ h hᵀ and C = Σ h yᵀ at once, so memory
stays O(d² + d·c) whatever the number of samples: no list of features is ever kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import ContextManager

import torch
from torch import Tensor

from fl_lightning.analytic import AnalyticStatistics
from fl_lightning.privacy.statistics import clip_features

__all__ = ["collect_statistics"]


def collect_statistics(
    feature_fn: Callable[[Tensor], Tensor],
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    num_classes: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float64,
    autocast: Callable[[], ContextManager] | None = None,
    feature_dim: int | None = None,
    clip_norm: float | None = None,
) -> AnalyticStatistics:
    """Eq. (7): R_k = Σ h hᵀ, C_k = Σ h yᵀ over a client's data, one batch at a time.

    Args:
        feature_fn: images (B, 3, H, W) → features (B, d), e.g. a frozen :class:`PromptedViT`.
        batches: ``(images, labels)`` pairs; labels are class indices (B,) or one-hot (B, c).
        num_classes: c.
        device: where the images go and where the statistics are accumulated.
        dtype: accumulation dtype (float64: sums of many outer products lose accuracy in float32).
        autocast: a factory of the context to run ``feature_fn`` under (``fabric.autocast``,
            ``lambda: torch.autocast('cuda', torch.bfloat16)``); the features are cast to ``dtype``
            before they are accumulated.
        feature_dim: d, needed only to return empty statistics when there are no batches
            (a client with no samples); otherwise taken from the first batch.
        clip_norm: c, each feature clipped to L2 norm ≤ c before it is accumulated (record-level DP of the
            statistics, :func:`fl_lightning.privacy.statistics.clip_features`); None: as they are.

    Returns:
        The client's :class:`AnalyticStatistics` (R, C on ``device`` in ``dtype``, N samples).
    """
    stats = AnalyticStatistics.zeros(feature_dim, num_classes, dtype, device) if feature_dim is not None else None
    context = autocast or contextlib.nullcontext
    with torch.inference_mode():
        for images, labels in batches:
            with context():
                h = feature_fn(images.to(device))  # (B, d)
            h = h.to(dtype)
            if clip_norm is not None:
                h = clip_features(h, clip_norm)
            if stats is None:
                # normal (not inference) tensors, so the caller may update them in place later
                with torch.inference_mode(False):
                    stats = AnalyticStatistics.zeros(int(h.shape[1]), num_classes, dtype, device)
            stats.update(h, labels.to(device))
    if stats is None:
        raise ValueError("no batches to collect statistics from; pass feature_dim to allow an empty client")
    return stats
