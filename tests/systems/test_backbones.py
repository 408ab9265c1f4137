"""Tests for fl_lightning.systems.backbones: the arithmetic against timm's own models and published figures."""

from __future__ import annotations

import pytest

from fl_lightning.systems.backbones import BACKBONES, backbone, head_params, lora_params_per_block


@pytest.mark.parametrize("name,gmacs", [("vit_base_patch16_224", 17.6), ("vit_large_patch16_224", 61.6)])
def test_forward_macs_match_timms_published_table(name: str, gmacs: float) -> None:
    assert backbone(name).forward_macs / 1e9 == pytest.approx(gmacs, abs=0.06)


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_small_patch16_224"])
def test_parameter_count_is_timms(name: str) -> None:
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=101)
    assert backbone(name).params(101) == sum(p.numel() for p in model.parameters())


def test_lora_and_head_sizes_are_the_adapters_peft_builds() -> None:
    import timm
    from peft import LoraConfig, get_peft_model

    tiny = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7, depth=1)
    lora = get_peft_model(tiny, LoraConfig(r=8, target_modules=["attn.qkv", "attn.proj"]))
    n = sum(p.numel() for k, p in lora.named_parameters() if "lora_" in k)
    assert n == lora_params_per_block(192, 8) == 6 * 8 * 192
    assert head_params(192, 7) == 192 * 7 + 7


def test_unknown_backbone_is_one_clear_error_and_tags_are_ignored() -> None:
    assert backbone("vit_large_patch16_224.augreg_in21k_ft_in1k") is BACKBONES["vit_large_patch16_224"]
    with pytest.raises(ValueError, match="no system-model constants for 'resnet50'"):
        backbone("resnet50")
