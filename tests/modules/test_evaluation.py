"""Test-split evaluation against a float64 numpy reference; classes without test images are NaN."""

from __future__ import annotations

import math

import numpy as np
import torch
from torchmetrics.classification import MulticlassAccuracy

from fl_lightning.modules.evaluation import evaluate_classifier, per_class_accuracy


def _batches(logits: torch.Tensor, labels: torch.Tensor, size: int):
    # The "images" are the logits themselves; logits_fn is the identity.
    return [(logits[i : i + size], labels[i : i + size]) for i in range(0, len(labels), size)]


def test_matches_a_numpy_reference_and_absent_classes_are_nan() -> None:
    gen = torch.Generator().manual_seed(0)
    num_classes, n = 6, 101
    labels = torch.randint(0, 4, (n,), generator=gen)  # classes 4 and 5 have no test images
    logits = torch.randn(n, num_classes, generator=gen)
    logits[torch.arange(n)[:60], labels[:60]] += 3.0  # most right, some wrong; class 5 is predicted
    logits[60:70, 5] += 10.0

    out = evaluate_classifier(lambda x: x, _batches(logits, labels, 16), num_classes=num_classes, device=torch.device("cpu"))

    z, y = logits.double().numpy(), labels.numpy()
    pred = z.argmax(axis=1)
    log_p = z - z.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    assert math.isclose(out["accuracy"], (pred == y).mean(), rel_tol=1e-6)
    assert math.isclose(out["loss"], -log_p[np.arange(n), y].mean(), rel_tol=1e-5)
    per_class = out["per_class_accuracy"]
    assert len(per_class) == num_classes
    for c in range(num_classes):
        if (y == c).any():
            assert per_class[c] == round(float((pred[y == c] == c).mean()), 6)
        else:
            assert math.isnan(per_class[c])  # no test images: no accuracy, not 0.0
    # Present classes are exactly what torchmetrics reported before (same float32 division).
    reference = MulticlassAccuracy(num_classes=num_classes, average=None)
    reference.update(logits, labels)
    for c in range(4):
        assert per_class[c] == round(float(reference.compute()[c]), 6)
    # The mean over classes that have test images ignores the NaNs.
    present = [(pred[y == c] == c).mean() for c in range(4)]
    assert math.isclose(float(np.nanmean(per_class)), float(np.mean(present)), abs_tol=1e-6)


def test_per_class_accuracy_division() -> None:
    acc = per_class_accuracy(torch.tensor([3, 0, 0, 5]), torch.tensor([4, 2, 0, 5]))
    assert acc.dtype == torch.float32
    np.testing.assert_array_equal(acc[[0, 1, 3]].numpy(), np.float32([0.75, 0.0, 1.0]))
    assert torch.isnan(acc[2])


def test_accuracy_is_torchmetrics_micro_accuracy_to_the_bit() -> None:
    gen = torch.Generator().manual_seed(1)
    for n, num_classes in ((101, 6), (360, 10), (7, 3)):
        labels = torch.randint(0, num_classes, (n,), generator=gen)
        logits = torch.randn(n, num_classes, generator=gen)
        logits[torch.arange(n)[: n // 3], labels[: n // 3]] += 2.0
        out = evaluate_classifier(lambda x: x, _batches(logits, labels, 32), num_classes=num_classes, device=torch.device("cpu"))
        reference = MulticlassAccuracy(num_classes=num_classes, average="micro")
        reference.update(logits, labels)
        assert out["accuracy"] == float(reference.compute())
