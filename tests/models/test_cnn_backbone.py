"""A frozen timm CNN's pooled pre-logit features as the statistical methods' backbone."""

import pytest
import torch
import torchvision

from fl_lightning.errors import ConfigError, MissingResourceError
from fl_lightning.models.backbones import build_feature_backbone, build_tiny_backbone
from fl_lightning.models.cnn_backbone import CNNBackbone
from fl_lightning.models.timm_backbone import is_timm_vit

TINY = {"layers": [1, 1, 1, 1]}


def _cnn(**kw) -> CNNBackbone:
    torch.manual_seed(0)
    return build_feature_backbone(library="timm", name="resnet18", pretrained=None, overrides=TINY, **kw)


def test_features_are_the_global_average_of_the_last_stage():
    cnn = _cnn(image_size=32).freeze()
    assert isinstance(cnn, CNNBackbone) and cnn.feature_dim == 512 and cnn.image_size == 32
    assert cnn.normalization == "imagenet" and cnn.library == "timm"
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        reference = cnn.model.forward_features(x).mean(dim=(2, 3))  # (B, 512), as torchvision's avgpool
        torch.testing.assert_close(cnn(x), reference)


def test_freeze_keeps_batchnorm_running_statistics_and_no_gradients():
    cnn = _cnn().freeze()
    cnn.train()  # a module around it switching to training
    assert not cnn.model.training and cnn.frozen
    assert not any(p.requires_grad for p in cnn.parameters())


def test_vit_or_cnn_is_decided_by_the_model_not_a_name_list():
    assert is_timm_vit("vit_small_patch14_dinov2") and is_timm_vit("vit_base_patch16_224")
    assert not is_timm_vit("resnet18") and not is_timm_vit("convnext_tiny")
    vit = build_feature_backbone(
        library="timm",
        name="vit_base_patch16_224",
        pretrained=None,
        overrides={"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 1, "num_heads": 2},
    )
    assert not isinstance(vit, CNNBackbone)


def test_torchvision_resnet_file_loads_as_imagenet_weights(tmp_path):
    """A torchvision ResNet state dict (with its 1000-class fc) has timm's keys: the trunk loads, fc is dropped."""
    torch.manual_seed(1)
    tv = torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1])
    path = tmp_path / "resnet_tv.pth"
    torch.save(tv.state_dict(), path)
    cnn = build_feature_backbone(library="timm", name="resnet18", pretrained=None, overrides=TINY, checkpoint=str(path))
    torch.testing.assert_close(cnn.model.layer3[0].conv1.weight, tv.layer3[0].conv1.weight)
    tv.fc = torch.nn.Identity()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(cnn.freeze()(x), tv.eval()(x))


def test_missing_or_foreign_checkpoint_fails_with_one_line(tmp_path):
    with pytest.raises(MissingResourceError, match="is not a file"):
        _cnn(checkpoint=str(tmp_path / "resnet18.safetensors"))
    vit = build_tiny_backbone("timm")
    path = tmp_path / "vit.pth"
    torch.save(vit.model.state_dict(), path)
    with pytest.raises(MissingResourceError) as info:
        _cnn(checkpoint=str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_prompt_methods_refuse_a_cnn():
    from types import SimpleNamespace

    from fl_lightning.algorithms.common import require_vit

    cfg = SimpleNamespace(algorithm="fedopal", model=SimpleNamespace(name="resnet18"))
    with pytest.raises(ConfigError, match="a ViT for fedopal"):
        require_vit(cfg, _cnn())
