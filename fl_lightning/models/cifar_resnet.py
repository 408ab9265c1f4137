"""The CIFAR-style ResNet that DENSE's and Co-Boosting's official code train on their clients, as timm models.

He et al.'s ResNet-18 adapted to 32-px inputs the way the one-shot FL codes use it (zj-jayzhang/DENSE
``models/resnet.py``, rong-dai/Co-Boosting ``datafree/models/classifiers/resnet.py``, both after
kuangliu/pytorch-cifar): the stem is one 3×3 convolution with stride 1 and no max-pool, so a 32-px
image keeps its resolution into ``layer1`` (32 → 32, 16, 8, 4 px over the four stages), then global
average pooling and one linear layer. At 10 classes ResNet-18 has 11,173,962 parameters (the
ImageNet stem's 7×7 convolution alone would add 7,680 and its stride-2 conv + max-pool would shrink
a 32-px image to 8 px before ``layer1``).

Neither timm nor torchvision ships this stem, so the model is timm's own :class:`timm.models.ResNet`
(``BasicBlock``, the same blocks and 1×1-conv + BN shortcuts as the official code) with the stem
swapped, registered in timm's registry: ``timm.create_model("cifar_resnet18", num_classes=10)``
works once this module is imported (:func:`fl_lightning.algorithms.fedavg_cnn.build_timm_classifier`
does), and ``model.overrides`` (``layers``, ``channels``, ``stem_width``) shrink it for tests as for
any timm ResNet. Parameters start from PyTorch's default initialisation of each layer, as in the
official code (timm's ResNet would draw Kaiming-normal convolutions and zero the last BN of each block).
There are no pretrained weights: both papers train it from scratch.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["cifar_resnet18", "cifar_resnet34", "cifar_stem"]


def cifar_stem(model: nn.Module, *, in_chans: int = 3) -> nn.Module:
    """Replace a timm ResNet's ImageNet stem (7×7 stride-2 conv + 3×3 stride-2 max-pool) by the
    CIFAR one (3×3 stride-1 conv, no pooling), in place; returns ``model``."""
    width = model.conv1.out_channels
    model.conv1 = nn.Conv2d(in_chans, width, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    # the stages now run at the input resolution: every reduction of feature_info halves
    for info in model.feature_info:
        info["reduction"] = max(1, info["reduction"] // 4)
    return model


def _pytorch_default_init(model: nn.Module) -> nn.Module:
    """Re-draw every layer with its own ``reset_parameters`` (PyTorch's defaults), as the official code's
    plain ``nn.Conv2d`` / ``nn.BatchNorm2d`` / ``nn.Linear`` layers start."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear, nn.BatchNorm2d)):
            m.reset_parameters()
    return model


_FACTORY_KEYS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def _cifar_resnet(default_layers: tuple[int, ...], *, in_chans: int = 3, **kwargs: Any) -> nn.Module:
    from timm.models.resnet import BasicBlock, ResNet

    for key in _FACTORY_KEYS:  # timm's create_model passes these; there are no pretrained weights to use them
        kwargs.pop(key, None)
    kwargs.setdefault("layers", default_layers)
    model = ResNet(block=BasicBlock, in_chans=in_chans, **kwargs)
    return _pytorch_default_init(cifar_stem(model, in_chans=in_chans))


def _register(fn: Any) -> Any:
    from timm.models import register_model

    return register_model(fn)


@_register
def cifar_resnet18(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """CIFAR-style ResNet-18 (DENSE / Co-Boosting): BasicBlock ×[2, 2, 2, 2], 3×3 stride-1 stem, no max-pool."""
    if pretrained:
        raise ValueError("cifar_resnet18 has no pretrained weights (DENSE and Co-Boosting train it from scratch)")
    return _cifar_resnet((2, 2, 2, 2), **kwargs)


@_register
def cifar_resnet34(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """CIFAR-style ResNet-34: BasicBlock ×[3, 4, 6, 3], 3×3 stride-1 stem, no max-pool."""
    if pretrained:
        raise ValueError("cifar_resnet34 has no pretrained weights")
    return _cifar_resnet((3, 4, 6, 3), **kwargs)
