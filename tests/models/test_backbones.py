"""ViTBackbone: the embed/encode/pool seams reproduce each library's own image features; weights
load from local files and caches only; missing weights fail at once with one clear line."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import open_clip  # noqa: E402
import pytest  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from fl_lightning.errors import ConfigError, MissingResourceError  # noqa: E402
from fl_lightning.models.backbones import (  # noqa: E402
    LIBRARIES,
    ViTBackbone,
    build_backbone,
    build_tiny_backbone,
    tiny_clip_overrides,
    tiny_timm_overrides,
)

IMAGES = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _tiny_clip(seed: int = 0, **kwargs) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return open_clip.create_model("ViT-B-16", pretrained=None, **tiny_clip_overrides(32), **kwargs).eval()


def _tiny_timm(seed: int = 0, **kwargs) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return timm.create_model("vit_base_patch16_224", pretrained=False, **tiny_timm_overrides(32), **kwargs).eval()


def _fake_hf_cache(cache: Path, repo_id: str, filename: str, state: dict) -> None:
    """Lay out a file as huggingface_hub's cache does (refs/main → snapshots/<rev>/file)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(snapshot / filename))


# -- features equal the libraries' own ------------------------------------------------------------
def test_open_clip_forward_equals_encode_image():
    clip = _tiny_clip()
    backbone = ViTBackbone(model=clip.visual, library="open_clip", mean=(0.5,) * 3, std=(0.5,) * 3).eval()
    with torch.no_grad():
        expected = clip.encode_image(IMAGES)
        got = backbone(IMAGES)
    assert got.shape == (3, 32) and backbone.feature_dim == 32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_open_clip_pre_proj_equals_visual_without_projection():
    clip = _tiny_clip()
    backbone = ViTBackbone(model=clip.visual, library="open_clip", feature="pre_proj", mean=(0.5,) * 3,
                           std=(0.5,) * 3).eval()
    reference = copy.deepcopy(clip.visual)
    reference.proj = None  # open_clip then returns ln_post(CLS)
    with torch.no_grad():
        torch.testing.assert_close(backbone(IMAGES), reference(IMAGES), rtol=0, atol=1e-6)
    assert backbone.feature_dim == backbone.width == 64


@pytest.mark.parametrize("kwargs", [{}, {"global_pool": "avg"}, {"reg_tokens": 2}],
                         ids=["token", "avg-with-fc_norm", "registers"])
def test_timm_forward_equals_forward_head_with_token_pool(kwargs):
    vit = _tiny_timm(num_classes=0, **kwargs)
    backbone = ViTBackbone(model=vit, library="timm", mean=(0.5,) * 3, std=(0.5,) * 3).eval()
    reference = copy.deepcopy(vit)
    reference.global_pool = "token"  # always the CLS token, even where the model averages
    with torch.no_grad():
        expected = reference.forward_head(reference.forward_features(IMAGES), pre_logits=True)
        torch.testing.assert_close(backbone(IMAGES), expected, rtol=0, atol=1e-6)
    assert backbone.num_prefix_tokens == 1 + kwargs.get("reg_tokens", 0)


@pytest.mark.parametrize("library", LIBRARIES)
def test_attributes_and_shapes(library):
    backbone = build_tiny_backbone(library)
    tokens = backbone.embed(IMAGES)
    assert tokens.shape == (3, backbone.num_prefix_tokens + (32 // 8) ** 2, 64)  # (B, 1 + L, D)
    assert backbone.encode(tokens).shape == tokens.shape
    assert (backbone.library, backbone.image_size, backbone.patch_size, backbone.width, backbone.num_blocks) == (
        library, 32, 8, 64, 2)
    assert backbone.normalization == ("clip" if library == "open_clip" else "inception")
    assert len(backbone.mean) == len(backbone.std) == 3


@pytest.mark.parametrize("library,path", [("open_clip", "model.transformer.resblocks.1"), ("timm", "model.blocks.1")])
def test_blocks_keep_the_library_module_paths(library, path):
    backbone = build_tiny_backbone(library)
    modules = dict(backbone.named_modules())
    assert modules[path] is backbone.blocks[1]
    assert len(backbone.blocks) == backbone.num_blocks


@pytest.mark.parametrize("library", LIBRARIES)
def test_tiny_backbone_is_reproducible_and_leaves_global_rng_alone(library):
    state = torch.random.get_rng_state()
    a, b = build_tiny_backbone(library, seed=3), build_tiny_backbone(library, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    c = build_tiny_backbone(library, seed=4)
    sa, sc = a.state_dict(), c.state_dict()
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in sa.items())
    assert any(not torch.equal(v, sc[k]) for k, v in sa.items())


def test_open_clip_keeps_only_the_visual_tower():
    backbone = build_tiny_backbone("open_clip")
    assert isinstance(backbone.model, open_clip.transformer.VisionTransformer)
    assert not any("token_embedding" in name for name, _ in backbone.named_parameters())


@pytest.mark.parametrize("library", LIBRARIES)
def test_freeze_keeps_trunk_in_eval(library):
    backbone = build_tiny_backbone(library).freeze()
    assert all(not p.requires_grad for p in backbone.parameters())
    backbone.train()
    assert backbone.training and not backbone.model.training
    assert all(not m.training for m in backbone.model.modules())


# -- weights ----------------------------------------------------------------------------------------
def test_open_clip_checkpoint_file_round_trip(tmp_path):
    clip = _tiny_clip(seed=7)
    path = tmp_path / "tiny_clip.pt"
    torch.save(clip.state_dict(), path)
    backbone = build_backbone(library="open_clip", name="ViT-B-16", checkpoint=str(path),
                              overrides=tiny_clip_overrides(32)).eval()
    with torch.no_grad():
        torch.testing.assert_close(backbone(IMAGES), clip.encode_image(IMAGES), rtol=0, atol=1e-6)


def test_timm_checkpoint_with_classifier_head_loads_without_it(tmp_path):
    vit = _tiny_timm(seed=7, num_classes=5)
    path = tmp_path / "tiny_vit.safetensors"
    save_file(vit.state_dict(), str(path))
    backbone = build_backbone(library="timm", name="vit_base_patch16_224", checkpoint=str(path),
                              overrides=tiny_timm_overrides(32)).eval()
    with torch.no_grad():
        expected = vit.forward_head(vit.forward_features(IMAGES), pre_logits=True)
        torch.testing.assert_close(backbone(IMAGES), expected, rtol=0, atol=1e-6)


def test_open_clip_openai_tag_from_local_cache_uses_quick_gelu(tmp_path):
    clip = _tiny_clip(seed=5, force_quick_gelu=True)
    _fake_hf_cache(tmp_path, "timm/vit_base_patch16_clip_224.openai", "open_clip_model.safetensors",
                   clip.state_dict())
    backbone = build_backbone(library="open_clip", name="ViT-B-16", pretrained="openai", cache_dir=str(tmp_path),
                              overrides=tiny_clip_overrides(32)).eval()
    assert any(type(m).__name__ == "QuickGELU" for m in backbone.modules())
    with torch.no_grad():
        torch.testing.assert_close(backbone(IMAGES), clip.encode_image(IMAGES), rtol=0, atol=1e-6)


def test_timm_tag_from_local_cache(tmp_path):
    vit = _tiny_timm(seed=5, num_classes=1000)
    _fake_hf_cache(tmp_path, "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "model.safetensors", vit.state_dict())
    backbone = build_backbone(library="timm", name="vit_base_patch16_224", pretrained="augreg2_in21k_ft_in1k",
                              cache_dir=str(tmp_path), overrides=tiny_timm_overrides(32)).eval()
    with torch.no_grad():
        expected = vit.forward_head(vit.forward_features(IMAGES), pre_logits=True)
        torch.testing.assert_close(backbone(IMAGES), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("library,name,tag", [
    ("open_clip", "ViT-B-16", "openai"),
    ("timm", "vit_base_patch16_224", "augreg2_in21k_ft_in1k"),
])
def test_missing_weights_fail_fast_with_one_clear_line(tmp_path, library, name, tag):
    start = time.monotonic()
    with pytest.raises(MissingResourceError) as info:
        build_backbone(library=library, name=name, pretrained=tag, cache_dir=str(tmp_path))
    assert time.monotonic() - start < 2.0  # the cache is checked before anything is built or requested
    message = str(info.value)
    assert "\n" not in message
    assert name in message and str(tmp_path) in message
    assert "model.checkpoint" in message and "model.download: true" in message


def test_missing_checkpoint_file(tmp_path):
    with pytest.raises(MissingResourceError, match="model.checkpoint"):
        build_backbone(library="timm", name="vit_base_patch16_224", checkpoint=str(tmp_path / "nope.pth"))


@pytest.mark.parametrize("kwargs,key", [
    (dict(library="jax", name="ViT-B-16"), "model.library"),
    (dict(library="open_clip", name="ViT-Z-99"), "model.name"),
    (dict(library="timm", name="not_a_model"), "model.name"),
    (dict(library="open_clip", name="ViT-B-16", pretrained="no-such-tag"), "model.pretrained"),
    (dict(library="open_clip", name="ViT-B-16", feature="mean"), "model.feature"),
])
def test_config_errors(kwargs, key):
    if kwargs.get("feature"):
        kwargs["overrides"] = tiny_clip_overrides(32)
    with pytest.raises(ConfigError) as info:
        build_backbone(**kwargs)
    assert info.value.key == key
