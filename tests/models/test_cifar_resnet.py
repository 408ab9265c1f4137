"""The CIFAR-style ResNet of DENSE's and Co-Boosting's official code, registered in timm."""

import pytest
import timm
import torch
from torch import nn

import fl_lightning.models.cifar_resnet  # noqa: F401 — registers the models with timm


def test_resnet18_has_the_official_parameter_count_and_shapes():
    """kuangliu/pytorch-cifar's ResNet18 (which both official codes use) has 11,173,962 parameters at 10
    classes; the 3×3 stride-1 stem without max-pool keeps a 32-px image at 32, 16, 8, 4 px over the stages."""
    model = timm.create_model("cifar_resnet18", num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 11_173_962
    assert (model.conv1.kernel_size, model.conv1.stride) == ((3, 3), (1, 1))
    assert isinstance(model.maxpool, nn.Identity)
    x = torch.zeros(2, 3, 32, 32)
    sizes = []
    model.eval()
    hooks = [getattr(model, f"layer{i}").register_forward_hook(lambda m, i, o: sizes.append(o.shape[-1])) for i in range(1, 5)]
    with torch.no_grad():
        assert model(x).shape == (2, 10)
    for h in hooks:
        h.remove()
    assert sizes == [32, 16, 8, 4]
    assert timm.create_model("cifar_resnet18", num_classes=0).num_features == 512


def test_overrides_shrink_it_as_any_timm_resnet():
    model = timm.create_model("cifar_resnet18", num_classes=10, channels=[16, 32, 64, 128], stem_width=16)
    assert sum(p.numel() for p in model.parameters()) == 710_826
    assert model.eval()(torch.zeros(1, 3, 8, 8)).shape == (1, 10)


def test_no_pretrained_weights():
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("cifar_resnet18", pretrained=True)
