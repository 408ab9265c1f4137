"""Preprocessing pipelines: shapes, dtypes, [0, 1] scaling and normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fl_lightning.data.transforms import (
    CLIP_MEAN,
    CLIP_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    build_transform,
)
from fl_lightning.errors import ConfigError


def _inputs() -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "pil_rgb": Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)),
        "pil_gray": Image.fromarray(rng.integers(0, 256, (40, 30), dtype=np.uint8)),
        "uint8": torch.from_numpy(rng.integers(0, 256, (3, 8, 8), dtype=np.uint8)),
        "float": torch.from_numpy(rng.random((1, 20, 24), dtype=np.float32)),
    }


@pytest.mark.parametrize("normalization", ["clip", "imagenet", "none"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("size", [16, 32])
def test_output_is_a_3_by_s_by_s_float_tensor(normalization: str, train: bool, size: int) -> None:
    transform = build_transform(normalization=normalization, image_size=size, train=train)
    for name, image in _inputs().items():
        out = transform(image)
        assert type(out) is torch.Tensor, name
        assert out.shape == (3, size, size) and out.dtype == torch.float32, name
        if normalization == "none":
            assert 0.0 <= out.min() and out.max() <= 1.0, name


@pytest.mark.parametrize(
    "normalization, mean, std",
    [("clip", CLIP_MEAN, CLIP_STD), ("imagenet", IMAGENET_MEAN, IMAGENET_STD), ("none", (0.0,) * 3, (1.0,) * 3)],
)
def test_constant_image_is_normalised_per_channel(normalization, mean, std) -> None:
    value = np.array([200, 100, 30], dtype=np.uint8)
    image = torch.from_numpy(np.broadcast_to(value[:, None, None], (3, 12, 12)).copy())
    out = build_transform(normalization=normalization, image_size=24, train=False)(image)
    expected = (value.astype(np.float64) / 255.0 - np.array(mean)) / np.array(std)  # float64
    np.testing.assert_allclose(out.double().mean(dim=(1, 2)).numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(out.double().std(dim=(1, 2)).numpy(), 0.0, atol=1e-5)


def test_grayscale_becomes_three_equal_channels() -> None:
    out = build_transform(normalization="none", image_size=16, train=False)(_inputs()["pil_gray"])
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])


def test_float_input_is_kept_in_unit_range_not_rescaled() -> None:
    image = torch.full((3, 10, 10), 0.5)
    out = build_transform(normalization="none", image_size=10, train=False)(image)
    torch.testing.assert_close(out, image)


def test_augmentation_only_for_training_at_32_or_more() -> None:
    image = _inputs()["pil_rgb"]
    torch.manual_seed(0)
    augmented = build_transform(normalization="imagenet", image_size=32, train=True)
    outs = [augmented(image) for _ in range(4)]
    assert any(not torch.equal(outs[0], o) for o in outs[1:])
    for normalization, size in [("imagenet", 16), ("clip", 32)]:
        fixed = build_transform(normalization=normalization, image_size=size, train=True)
        assert torch.equal(fixed(image), fixed(image))


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(normalization="zca", image_size=32), "normalization='zca'"),
        (dict(normalization="clip", image_size=0), "image_size=0"),
        (dict(normalization="clip", image_size=True), "image_size=True"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict, argument: str) -> None:
    """A pure function: ValueError naming the argument, never the config layer's ConfigError."""
    with pytest.raises(ValueError) as info:
        build_transform(train=False, **kwargs)
    assert not isinstance(info.value, ConfigError)
    assert str(info.value).startswith(argument)


def test_crop_flip_is_cifars_pad_crop_and_flip() -> None:
    """augmentation='crop_flip': each training view is an S×S crop of the image zero-padded by S/8 (4 px at
    32 px; normalised, the padding is the normalised black), or its mirror; off in evaluation."""
    torch.manual_seed(0)
    image = torch.rand(3, 32, 32)
    plain = build_transform(normalization="none", image_size=32, train=False)(image)
    augment = build_transform(normalization="none", image_size=32, train=True, augmentation="crop_flip")
    padded = torch.nn.functional.pad(plain, (4, 4, 4, 4))
    crops = [padded[:, a : a + 32, b : b + 32] for a in range(9) for b in range(9)]
    crops += [c.flip(-1) for c in crops]
    views = [augment(image) for _ in range(8)]
    assert all(any(torch.equal(v, c) for c in crops) for v in views)
    assert any(not torch.equal(v, plain) for v in views)  # on: the batches differ from the plain image
    fixed = build_transform(normalization="none", image_size=32, train=False, augmentation="crop_flip")
    assert torch.equal(fixed(image), plain)  # off: the deterministic view


def test_unknown_augmentation_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="^augmentation='mixup'"):
        build_transform(normalization="imagenet", image_size=32, train=True, augmentation="mixup")
