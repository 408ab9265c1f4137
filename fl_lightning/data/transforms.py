"""Image preprocessing for the backbones: CLIP-style or ImageNet-style, built on transforms.v2.

Every pipeline accepts a PIL image, a uint8 tensor (C, H, W) in [0, 255] or a float tensor in
[0, 1], with 1 or 3 channels, and returns a float32 tensor (3, S, S), normalised with the
backbone's statistics (or left in [0, 1] for ``normalization='none'``).
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2

__all__ = [
    "AUGMENTATIONS",
    "CLIP_MEAN",
    "CLIP_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "NORMALIZATIONS",
    "build_transform",
]

# OpenAI CLIP's preprocessing statistics (same values as open_clip.constants.OPENAI_DATASET_*).
CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
# torchvision / timm ImageNet statistics.
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]] | None] = {
    "clip": (CLIP_MEAN, CLIP_STD),
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
    "none": None,
}

# The training augmentations (for 'imagenet' / 'none' normalisation, with train=True):
# * random_resized_crop — torchvision's RandomResizedCrop (scale 0.08–1) + horizontal flip (ImageNet's recipe);
# * crop_flip — CIFAR's: zero-pad by S/8 (4 px at 32 px), random S×S crop, horizontal flip (He et al. 2016;
#   the clients of DENSE, loop_df_fl.py / helpers/datasets.py, and of Co-Boosting, registry.py).
AUGMENTATIONS = ("random_resized_crop", "crop_flip")

# Random-resized crops of images smaller than this destroy most of their content (and the tiny
# generated test images), so augmentation is only used from this size up.
_MIN_AUGMENT_SIZE = 32


def _clamp_unit(x: torch.Tensor) -> torch.Tensor:
    # A module-level function (not a lambda) so that the pipeline pickles into DataLoader workers.
    return x.clamp(0.0, 1.0)


def build_transform(
    *,
    normalization: str,
    image_size: int,
    train: bool,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    augmentation: str = "random_resized_crop",
) -> v2.Compose:
    """Preprocessing pipeline for one split.

    * ``'clip'``: resize the shorter side to ``image_size`` (bicubic) and center-crop — the CLIP
      preprocessing; no augmentation in training either, since FedOPAL's statistics and prompts
      are computed on the deterministic view.
    * ``'imagenet'`` / ``'none'``: resize the shorter side (bilinear) and center-crop; when
      ``train``, the ``augmentation``: ``'random_resized_crop'`` (only for ``image_size >= 32``: a
      RandomResizedCrop and a horizontal flip instead of the resize) or ``'crop_flip'`` (CIFAR's: after
      the resize, zero-pad by ``image_size // 8``, at least 1 px — 4 px at 32 — random crop back to
      ``image_size`` and a horizontal flip; any size).

    Resizing runs on the uint8 image (cheap, stays in range); the result is then scaled to
    float32 in [0, 1] and normalised.

    Args:
        normalization: ``'clip'``, ``'imagenet'`` or ``'none'``.
        image_size: S, the side of the square output.
        train: whether this is the training split's pipeline.
        mean, std: the statistics the backbone's weights expect (e.g. timm's 0.5 "inception"
            ones); they replace the named normalisation's statistics when given.
        augmentation: one of :data:`AUGMENTATIONS`, used when ``train`` (not for ``'clip'``).

    Returns:
        A ``transforms.v2.Compose`` mapping an image to a (3, S, S) float32 tensor.

    Raises:
        ValueError: an unknown ``normalization`` or ``augmentation``, or an ``image_size`` < 1 (the
            message names the argument; the config layer owns the keys these come from).
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={normalization!r} is not allowed; expected one of {sorted(NORMALIZATIONS)}")
    if augmentation not in AUGMENTATIONS:
        raise ValueError(f"augmentation={augmentation!r} is not allowed; expected one of {list(AUGMENTATIONS)}")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size={image_size!r} is not allowed; expected an integer >= 1")

    # ToImage: PIL / ndarray / tensor -> tv_tensors.Image (C, H, W); RGB: 1 channel -> 3.
    steps: list[v2.Transform] = [v2.ToImage(), v2.RGB()]
    if normalization == "clip":
        steps += [
            v2.Resize(image_size, interpolation=v2.InterpolationMode.BICUBIC, antialias=True),
            v2.CenterCrop(image_size),
        ]
    elif train and augmentation == "crop_flip":
        steps += [
            v2.Resize(image_size, antialias=True),
            v2.CenterCrop(image_size),
            v2.RandomCrop(image_size, padding=max(1, image_size // 8)),  # zero padding, as CIFAR's recipe
            v2.RandomHorizontalFlip(),
        ]
    elif train and image_size >= _MIN_AUGMENT_SIZE:
        steps += [
            v2.RandomResizedCrop(image_size, antialias=True),
            v2.RandomHorizontalFlip(),
        ]
    else:
        steps += [v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)]
    # uint8 -> float32 / 255; float input is assumed to be in [0, 1] already and kept as is.
    steps.append(v2.ToDtype(torch.float32, scale=True))
    # Bicubic resizing of a float input can overshoot [0, 1] slightly.
    steps.append(v2.Lambda(_clamp_unit, torch.Tensor))
    stats = NORMALIZATIONS[normalization] if mean is None or std is None else (mean, std)
    if stats is not None:
        steps.append(v2.Normalize(mean=list(stats[0]), std=list(stats[1])))
    # Plain tensors out: downstream code should not see tv_tensors subclasses.
    steps.append(v2.ToPureTensor())
    return v2.Compose(steps)
