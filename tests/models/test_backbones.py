"""ViTBackbone: the embed/encode/pool seams reproduce each library's own image features; weights
load from local files and caches only; missing weights fail at once with one clear line."""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import open_clip  # noqa: E402
import pytest  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from fl_lightning.errors import MissingResourceError  # noqa: E402
from fl_lightning.models.backbones import (  # noqa: E402
    BACKBONES,
    LIBRARIES,
    BackboneArgumentError,
    OpenCLIPBackbone,
    TimmBackbone,
    ViTBackbone,
    build_backbone,
    build_tiny_backbone,
    check_checkpoint,
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
    backbone = OpenCLIPBackbone(model=clip.visual, mean=(0.5,) * 3, std=(0.5,) * 3).eval()
    with torch.no_grad():
        expected = clip.encode_image(IMAGES)
        got = backbone(IMAGES)
    assert got.shape == (3, 32) and backbone.feature_dim == 32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_open_clip_pre_proj_equals_visual_without_projection():
    clip = _tiny_clip()
    backbone = OpenCLIPBackbone(model=clip.visual, feature="pre_proj", mean=(0.5,) * 3, std=(0.5,) * 3).eval()
    reference = copy.deepcopy(clip.visual)
    reference.proj = None  # open_clip then returns ln_post(CLS)
    with torch.no_grad():
        torch.testing.assert_close(backbone(IMAGES), reference(IMAGES), rtol=0, atol=1e-6)
    assert backbone.feature_dim == backbone.width == 64


@pytest.mark.parametrize(
    "kwargs", [{}, {"global_pool": "avg"}, {"reg_tokens": 2}], ids=["token", "avg-with-fc_norm", "registers"]
)
def test_timm_forward_equals_forward_head_with_token_pool(kwargs):
    vit = _tiny_timm(num_classes=0, **kwargs)
    backbone = TimmBackbone(model=vit, mean=(0.5,) * 3, std=(0.5,) * 3).eval()
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
        library,
        32,
        8,
        64,
        2,
    )
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
    backbone = build_backbone(
        library="open_clip", name="ViT-B-16", checkpoint=str(path), overrides=tiny_clip_overrides(32)
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(backbone(IMAGES), clip.encode_image(IMAGES), rtol=0, atol=1e-6)


def test_timm_checkpoint_with_classifier_head_loads_without_it(tmp_path):
    vit = _tiny_timm(seed=7, num_classes=5)
    path = tmp_path / "tiny_vit.safetensors"
    save_file(vit.state_dict(), str(path))
    backbone = build_backbone(
        library="timm", name="vit_base_patch16_224", checkpoint=str(path), overrides=tiny_timm_overrides(32)
    ).eval()
    with torch.no_grad():
        expected = vit.forward_head(vit.forward_features(IMAGES), pre_logits=True)
        torch.testing.assert_close(backbone(IMAGES), expected, rtol=0, atol=1e-6)


def test_open_clip_openai_tag_from_local_cache_uses_quick_gelu(tmp_path):
    clip = _tiny_clip(seed=5, force_quick_gelu=True)
    _fake_hf_cache(tmp_path, "timm/vit_base_patch16_clip_224.openai", "open_clip_model.safetensors", clip.state_dict())
    backbone = build_backbone(
        library="open_clip", name="ViT-B-16", pretrained="openai", cache_dir=str(tmp_path), overrides=tiny_clip_overrides(32)
    ).eval()
    assert any(type(m).__name__ == "QuickGELU" for m in backbone.modules())
    with torch.no_grad():
        torch.testing.assert_close(backbone(IMAGES), clip.encode_image(IMAGES), rtol=0, atol=1e-6)


def test_timm_tag_from_local_cache(tmp_path):
    vit = _tiny_timm(seed=5, num_classes=1000)
    _fake_hf_cache(tmp_path, "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "model.safetensors", vit.state_dict())
    backbone = build_backbone(
        library="timm",
        name="vit_base_patch16_224",
        pretrained="augreg2_in21k_ft_in1k",
        cache_dir=str(tmp_path),
        overrides=tiny_timm_overrides(32),
    ).eval()
    with torch.no_grad():
        expected = vit.forward_head(vit.forward_features(IMAGES), pre_logits=True)
        torch.testing.assert_close(backbone(IMAGES), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "library,name,tag",
    [
        ("open_clip", "ViT-B-16", "openai"),
        ("timm", "vit_base_patch16_224", "augreg2_in21k_ft_in1k"),
    ],
)
def test_missing_weights_fail_fast_with_one_clear_line(tmp_path, library, name, tag, monkeypatch):
    import open_clip
    import timm

    def never(*args, **kwargs):
        raise AssertionError("a model was built or its weights requested before the cache was checked")

    # Fast by construction, not by a clock: the cache is checked before anything is built or requested.
    monkeypatch.setattr(open_clip, "create_model", never)
    monkeypatch.setattr(timm, "create_model", never)
    with pytest.raises(MissingResourceError) as info:
        build_backbone(library=library, name=name, pretrained=tag, cache_dir=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert name in message and str(tmp_path) in message
    assert "model.checkpoint" in message and "model.download: true" in message


def test_missing_checkpoint_file(tmp_path):
    with pytest.raises(MissingResourceError, match="model.checkpoint"):
        build_backbone(library="timm", name="vit_base_patch16_224", checkpoint=str(tmp_path / "nope.pth"))


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        (dict(library="jax", name="ViT-B-16"), "library"),
        (dict(library="open_clip", name="ViT-Z-99"), "name"),
        (dict(library="timm", name="not_a_model"), "name"),
        (dict(library="open_clip", name="ViT-B-16", pretrained="no-such-tag"), "pretrained"),
        (dict(library="timm", name="vit_base_patch16_224", pretrained="no-such-tag"), "pretrained"),
        (dict(library="open_clip", name="ViT-B-16", feature="mean"), "feature"),
        (dict(library="timm", name="vit_base_patch16_224", feature="mean"), "feature"),
    ],
)
def test_bad_arguments_are_value_errors_naming_the_argument(kwargs, argument):
    # models/ is pure: a ValueError carrying the argument; the config layer names its key (model.<argument>)
    if kwargs.get("feature"):
        kwargs["overrides"] = tiny_clip_overrides(32) if kwargs["library"] == "open_clip" else tiny_timm_overrides(32)
    with pytest.raises(BackboneArgumentError) as info:
        build_backbone(**kwargs)
    assert isinstance(info.value, ValueError)
    assert info.value.argument == argument and info.value.value == kwargs[argument]
    assert f"{argument}=" in str(info.value) and "\n" not in str(info.value)


def test_unsupported_layout_is_a_value_error():
    vit = _tiny_timm(num_classes=0, class_token=False, global_pool="avg")
    with pytest.raises(BackboneArgumentError, match="class token"):
        TimmBackbone(model=vit, mean=(0.5,) * 3, std=(0.5,) * 3)


def test_registry_maps_each_library_to_its_adapter():
    assert LIBRARIES == ("open_clip", "timm")
    assert BACKBONES == {"open_clip": OpenCLIPBackbone, "timm": TimmBackbone}
    for library, adapter in BACKBONES.items():
        assert issubclass(adapter, ViTBackbone) and adapter.library == library
        assert type(build_tiny_backbone(library)) is adapter
    with pytest.raises(TypeError):
        ViTBackbone(model=torch.nn.Identity(), mean=(0.5,) * 3, std=(0.5,) * 3)  # abstract


# -- a bad model.checkpoint stops with one line naming the file (both libraries) --------------------
def _model_state(library: str, **kwargs) -> dict:
    model = _tiny_clip(seed=1, **kwargs) if library == "open_clip" else _tiny_timm(seed=1, num_classes=5, **kwargs)
    return {k: v.contiguous() for k, v in model.state_dict().items()}


def _truncated(path: Path, data: bytes) -> None:
    path.write_bytes(data[: len(data) // 2])


def _write_case(case: str, library: str, tmp_path: Path) -> Path:
    """A bad weights file of the kind ``case`` for a tiny model of ``library``."""
    state = _model_state(library)
    if case == "text":
        path = tmp_path / "weights.pt"
        path.write_text("these are not weights\n")
    elif case == "text.safetensors":
        path = tmp_path / "weights.safetensors"
        path.write_text("these are not weights either\n")
    elif case in ("empty", "empty.safetensors"):
        path = tmp_path / ("weights.safetensors" if case.endswith("safetensors") else "weights.pt")
        path.touch()
    elif case == "truncated.pt":
        path = tmp_path / "weights.pt"
        torch.save(state, path)
        _truncated(path, path.read_bytes())
    elif case == "truncated.safetensors":
        path = tmp_path / "weights.safetensors"
        save_file(state, str(path))
        _truncated(path, path.read_bytes())
    elif case == "list":
        path = tmp_path / "weights.pt"
        torch.save(list(state.values()), path)
    elif case == "python-objects":
        path = tmp_path / "weights.pt"
        torch.save({**state, "args": argparse.Namespace(lr=0.1)}, path)
    elif case == "safetensors-named-pt":
        path = tmp_path / "weights.pt"
        save_file(state, str(path))
    elif case == "wrong-keys":
        path = tmp_path / "weights.safetensors"
        save_file({f"encoder.layer{i}.weight": torch.zeros(2, 2) for i in range(5)}, str(path))
    elif case == "missing-keys":
        path = tmp_path / "weights.pt"
        dropped = [k for k in state if "blocks.1." in k or "resblocks.1." in k]
        torch.save({k: v for k, v in state.items() if k not in dropped}, path)
    elif case == "wrong-shapes":
        path = tmp_path / "weights.safetensors"
        biases = [k for k in state if k.endswith(".bias") and "blocks.0." in k][:3]
        save_file({**state, **{k: torch.zeros(3) for k in biases}}, str(path))
    else:
        raise AssertionError(case)
    return path


_FORMAT_CASES = [
    "text",
    "text.safetensors",
    "empty",
    "empty.safetensors",
    "truncated.pt",
    "truncated.safetensors",
    "list",
    "python-objects",
    "safetensors-named-pt",
]
_FIT_CASES = ["wrong-keys", "missing-keys", "wrong-shapes"]


@pytest.mark.parametrize("case", _FORMAT_CASES + _FIT_CASES)
@pytest.mark.parametrize("library", LIBRARIES)
def test_bad_checkpoint_is_one_line_naming_the_file(tmp_path, library, case):
    path = _write_case(case, library, tmp_path)
    name = "ViT-B-16" if library == "open_clip" else "vit_base_patch16_224"
    overrides = tiny_clip_overrides(32) if library == "open_clip" else tiny_timm_overrides(32)
    with pytest.raises(MissingResourceError) as info:
        build_backbone(library=library, name=name, checkpoint=str(path), overrides=overrides)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "model.checkpoint" in message
    assert "weights_only=False" not in message
    cause = info.value.__cause__
    assert cause is None or "weights_only=False" not in str(cause)
    if case in ("wrong-keys", "missing-keys"):
        assert "missing (e.g." in message and "expected a state dict of this very model" in message
    if case == "missing-keys":
        assert "blocks.1." in message and "unexpected" not in message
    if case == "wrong-shapes":
        assert "wrong shape" in message


@pytest.mark.parametrize("case", _FORMAT_CASES)
def test_check_checkpoint_catches_format_problems_before_any_model(tmp_path, case):
    path = _write_case(case, "timm", tmp_path)
    with pytest.raises(MissingResourceError) as info:
        check_checkpoint(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("case", _FIT_CASES)
def test_check_checkpoint_leaves_key_matching_to_the_build(tmp_path, case):
    check_checkpoint(_write_case(case, "open_clip", tmp_path))  # readable state dicts: no error yet


@pytest.mark.parametrize("library", LIBRARIES)
def test_checkpoint_in_a_training_checkpoint_wrapper_loads(tmp_path, library):
    state = _model_state(library)
    path = tmp_path / "trained.pt"
    torch.save({"state_dict": state, "epoch": 3}, path)
    name = "ViT-B-16" if library == "open_clip" else "vit_base_patch16_224"
    overrides = tiny_clip_overrides(32) if library == "open_clip" else tiny_timm_overrides(32)
    backbone = build_backbone(library=library, name=name, checkpoint=str(path), overrides=overrides)
    key = "model.conv1.weight" if library == "open_clip" else "model.patch_embed.proj.weight"
    source = "visual.conv1.weight" if library == "open_clip" else "patch_embed.proj.weight"
    assert torch.equal(backbone.state_dict()[key], state[source])


# -- imports: a run pays only for the library it uses -----------------------------------------------
def test_a_timm_backbone_never_imports_open_clip():
    # one subprocess (imports cost seconds): importing backbones imports no library, a timm build no open_clip.
    # (The other direction cannot hold: open_clip itself imports timm at import time, open_clip/timm_model.py.)
    code = (
        "import sys; from fl_lightning.models.backbones import build_tiny_backbone; "
        "assert not {'open_clip', 'timm'} & set(sys.modules), 'a library was imported with backbones'; "
        "build_tiny_backbone('timm'); assert 'open_clip' not in sys.modules, 'open_clip imported'"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def _timm_hub_repo(cache: Path, repo_id: str, model: torch.nn.Module, config: dict | None) -> Path:
    """A timm model as it is published on the hub: config.json (architecture, model_args, pretrained_cfg) and
    model.safetensors, in the cache layout."""
    import json

    _fake_hf_cache(cache, repo_id, "model.safetensors", model.state_dict())
    snapshot = cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / ("0" * 40)
    if config is not None:
        (snapshot / "config.json").write_text(json.dumps(config))
    return snapshot


def test_timm_hf_hub_name_builds_the_published_model_from_the_cache(tmp_path, monkeypatch):
    """``model.name: hf-hub:org/repo``: the architecture, model_args and pretrained_cfg of its config.json, its
    weights (the classifier dropped), read from the hub cache as timm's create_model('hf-hub:...') would."""
    from fl_lightning.errors import MissingResourceError
    from fl_lightning.models.timm_backbone import is_timm_vit

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    vit = _tiny_timm(seed=3, num_classes=5)
    cfg = {
        "architecture": "vit_base_patch16_224",
        "num_classes": 5,
        "model_args": tiny_timm_overrides(32),
        "pretrained_cfg": {
            "mean": [0.5, 0.5, 0.5],
            "std": [0.25, 0.25, 0.25],
            "input_size": [3, 32, 32],
            "num_classes": 5,
            "classifier": "head",
        },
    }
    _timm_hub_repo(tmp_path, "lab/tiny-vit", vit, cfg)
    backbone = build_backbone(library="timm", name="hf-hub:lab/tiny-vit", cache_dir=str(tmp_path)).eval()
    with torch.no_grad():
        expected = vit.forward_head(vit.forward_features(IMAGES), pre_logits=True)
        torch.testing.assert_close(backbone(IMAGES), expected, rtol=0, atol=1e-6)
    assert tuple(backbone.mean) == (0.5, 0.5, 0.5) and tuple(backbone.std) == (0.25, 0.25, 0.25)
    assert is_timm_vit("hf-hub:lab/tiny-vit")

    resnet = timm.create_model("resnet18", pretrained=False, num_classes=3).eval()  # a CNN: the CNN path
    _timm_hub_repo(
        tmp_path,
        "lab/tiny-resnet",
        resnet,
        {"architecture": "resnet18", "num_classes": 3, "pretrained_cfg": {"num_classes": 3, "classifier": "fc"}},
    )
    assert not is_timm_vit("hf-hub:lab/tiny-resnet")
    from fl_lightning.models.backbones import build_feature_backbone

    cnn = build_feature_backbone(library="timm", name="hf-hub:lab/tiny-resnet", cache_dir=str(tmp_path)).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            cnn(IMAGES), resnet.forward_head(resnet.forward_features(IMAGES), pre_logits=True), rtol=0, atol=1e-6
        )

    with pytest.raises(MissingResourceError) as missing:  # not in the cache, downloading off
        build_backbone(library="timm", name="hf-hub:lab/absent", cache_dir=str(tmp_path))
    assert "\n" not in str(missing.value) and "lab/absent" in str(missing.value)
    _timm_hub_repo(tmp_path, "lab/not-timm", vit, {"model_type": "bert"})
    with pytest.raises(MissingResourceError, match=r"config.json is missing or holds no timm 'architecture'"):
        build_backbone(library="timm", name="hf-hub:lab/not-timm", cache_dir=str(tmp_path))
