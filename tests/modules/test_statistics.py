"""collect_statistics: streaming R, C (Eq. (7)) equal the centralised ones; nothing is kept."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from fl_lightning.models.backbones import LIBRARIES, build_tiny_backbone
from fl_lightning.models.vpt import PromptedViT
from fl_lightning.modules.statistics import collect_statistics

_gen = torch.Generator().manual_seed(0)
IMAGES = torch.randn(22, 3, 32, 32, generator=_gen)
LABELS = torch.randint(0, 5, (22,), generator=_gen)


def _batches(images: torch.Tensor, labels: torch.Tensor, size: int):
    for start in range(0, len(images), size):  # a one-pass generator, like a DataLoader iterator
        yield images[start : start + size], labels[start : start + size]


@pytest.mark.parametrize("library", LIBRARIES)
def test_equals_centralised_statistics_on_a_tiny_backbone(library):
    model = PromptedViT(build_tiny_backbone(library), num_prompts=2)
    stats = collect_statistics(model, _batches(IMAGES, LABELS, 5), num_classes=5, device="cpu")
    with torch.no_grad():
        H = model(IMAGES).double().numpy()  # all samples at once
    Y = np.eye(5)[LABELS.numpy()]
    assert stats.N == 22 and stats.R.dtype == torch.float64
    # float32 features of one image can differ in the last bits between batch sizes
    np.testing.assert_allclose(stats.R.numpy(), H.T @ H, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.C.numpy(), H.T @ Y, rtol=1e-5, atol=1e-5)


def test_exact_with_a_float64_feature_map_and_one_hot_labels():
    W = torch.randn(3 * 32 * 32, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    feature_fn = lambda x: x.flatten(1).double() @ W  # noqa: E731
    one_hot = torch.eye(5)[LABELS]
    stats = collect_statistics(feature_fn, _batches(IMAGES, one_hot, 4), num_classes=5, device="cpu")
    H = (IMAGES.flatten(1).double() @ W).numpy()
    np.testing.assert_allclose(stats.R.numpy(), H.T @ H, rtol=1e-10)
    np.testing.assert_allclose(stats.C.numpy(), H.T @ one_hot.double().numpy(), rtol=1e-10)


def test_no_feature_tensor_is_kept():
    refs: list[weakref.ref] = []
    modes: list[bool] = []

    def feature_fn(x: torch.Tensor) -> torch.Tensor:
        modes.append(torch.is_inference_mode_enabled())
        h = x.flatten(1)[:, :8].clone()
        refs.append(weakref.ref(h))
        return h

    stats = collect_statistics(feature_fn, _batches(IMAGES, LABELS, 3), num_classes=5, device="cpu")
    gc.collect()
    assert len(refs) == 8 and stats.N == 22
    assert all(r() is None for r in refs)  # every batch's features were dropped after accumulation
    assert all(modes)  # computed under torch.inference_mode
    assert not stats.R.is_inference()  # the result is an ordinary tensor the caller may update


def test_autocast_factory_wraps_the_forward():
    calls: list[bool] = []

    def feature_fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(torch.is_autocast_enabled("cpu"))
        return torch.nn.functional.linear(x.flatten(1)[:, :8], torch.eye(8))

    stats = collect_statistics(
        feature_fn,
        _batches(IMAGES, LABELS, 11),
        num_classes=5,
        device="cpu",
        autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    )
    assert calls == [True, True]
    assert stats.R.dtype == torch.float64  # bf16 features are accumulated in float64


def test_empty_client():
    stats = collect_statistics(lambda x: x, iter(()), num_classes=3, device="cpu", feature_dim=4)
    assert stats.N == 0 and stats.R.shape == (4, 4) and not stats.R.any()
    with pytest.raises(ValueError, match="feature_dim"):
        collect_statistics(lambda x: x, iter(()), num_classes=3, device="cpu")
