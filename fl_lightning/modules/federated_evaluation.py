"""Federated evaluation of a global model on the clients' own test rows (Flower's ``evaluate`` round).

Each client k evaluates the global model on its n_k test rows and reports (loss_k, acc_k, n_k); the server's
``aggregate_evaluate`` weights them by n_k (Flower's ``weighted_loss_avg`` and the tutorials'
``weighted_average`` metric aggregation):

    fed_test_acc  = Σ_k n_k · acc_k / Σ_k n_k        fed_test_loss = Σ_k n_k · loss_k / Σ_k n_k

with loss_k the mean cross-entropy of client k's rows. Beside the mean, the spread over clients that
personalised/fair FL papers report: ``fed_test_acc_min`` (the worst client) and ``fed_test_acc_worst10`` (the mean
accuracy of the ⌈K/10⌉ clients of lowest accuracy: "worst 10%" of Li et al. 2020, "Fair Resource Allocation in
Federated Learning", Table 2). Every client is evaluated (Flower's ``fraction_evaluate=1``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["row_outcomes", "federated_scores"]


@torch.inference_mode()
def row_outcomes(
    logits_fn: Callable[[Tensor], Tensor], batches: Iterable[tuple[Tensor, Tensor]], *, device: torch.device
) -> tuple[np.ndarray, np.ndarray]:
    """Every row's top-1 hit (bool) and cross-entropy (float64) of ``logits_fn`` over ``batches``, in row order."""
    hits, losses = [], []
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        logits = logits_fn(images).float()
        hits.append((logits.argmax(dim=1) == labels).cpu())
        losses.append(F.cross_entropy(logits, labels, reduction="none").double().cpu())
    if not hits:
        return np.zeros(0, dtype=bool), np.zeros(0)
    return torch.cat(hits).numpy(), torch.cat(losses).numpy()


def federated_scores(hits: np.ndarray, losses: np.ndarray, sizes: Sequence[int]) -> dict[str, float]:
    """``fed_test_acc`` / ``fed_test_loss`` (n_k-weighted means), ``fed_test_acc_min`` and ``fed_test_acc_worst10``.

    Args:
        hits: (N,) bool, the rows of client 0, then client 1, … (``sizes`` rows each).
        losses: (N,) cross-entropy of the same rows.
        sizes: (K,) n_k, each >= 1.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(sizes) == 0 or sizes.min() < 1 or sizes.sum() != len(hits) or len(hits) != len(losses):
        raise ValueError(f"{len(hits)} rows do not split into clients of sizes {sizes.tolist()} (each >= 1)")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    acc = np.add.reduceat(hits.astype(np.float64), starts) / sizes  # acc_k
    loss = np.add.reduceat(np.asarray(losses, dtype=np.float64), starts) / sizes  # loss_k
    worst = np.sort(acc)[: math.ceil(len(sizes) / 10)]
    return {
        "fed_test_acc": float(np.dot(sizes, acc) / sizes.sum()),
        "fed_test_loss": float(np.dot(sizes, loss) / sizes.sum()),
        "fed_test_acc_min": float(acc.min()),
        "fed_test_acc_worst10": float(worst.mean()),
    }
