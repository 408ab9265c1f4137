"""Weights by hub id or local path, one rule (fl_lightning.models.hub): a tiny timm ViT and a tiny diffusers
Stable Diffusion saved into a temporary Hugging Face cache layout and found by id, offline; the one-line
missing-weight messages; the preflight's phrases."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from fl_lightning.errors import MissingResourceError
from fl_lightning.models.backbones import build_backbone, build_tiny_backbone
from fl_lightning.models.hub import (
    hub_cache_dir,
    hub_snapshot,
    looks_like_hub_id,
    missing_weights_phrase,
    resolve_local_or_hub,
    resolve_weights_file,
)
from fl_lightning.models.timm_backbone import tiny_timm_overrides

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _snapshot(cache: Path, repo_id: str, repo_type: str = "model", commit: str = COMMIT, ref: str = "main") -> Path:
    """An empty snapshot folder of ``repo_id`` in the hub cache layout (refs/<ref> → the snapshot)."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """HF_HOME and HF_HUB_CACHE of this test only."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "hub").mkdir()
    return tmp_path / "hub"


def test_the_cache_follows_the_environment_per_call(cache, monkeypatch, tmp_path):
    assert hub_cache_dir() == str(cache)
    monkeypatch.delenv("HF_HUB_CACHE")
    assert hub_cache_dir() == str(tmp_path / "home" / "hub")
    assert hub_cache_dir("~/x").endswith("/x") and not hub_cache_dir("~/x").startswith("~")


@pytest.mark.parametrize(
    "value, hub",
    [
        ("org/name", True),
        ("name", True),
        ("/abs/dir", False),
        ("./rel", False),
        ("~/w.pt", False),
        ("w.safetensors", False),
        ("a/b/c", False),
        ("org/name@v2", True),
        (f"org/name@{COMMIT}", True),
        ("org/name@", True),
        ("/abs/dir@v2", False),
    ],
)
def test_what_counts_as_a_hub_id(value, hub):
    assert looks_like_hub_id(value) is hub


def test_tiny_timm_vit_found_by_hub_id(cache):
    vit = build_tiny_backbone("timm", seed=3)
    from safetensors.torch import save_file

    save_file(vit.model.state_dict(), str(_snapshot(cache, "lab/tiny-vit") / "model.safetensors"))
    by_id = build_backbone(
        library="timm", name="vit_base_patch16_224", pretrained=None, checkpoint="lab/tiny-vit", overrides=tiny_timm_overrides(32)
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(by_id.eval()(x), vit.eval()(x))
    folder = cache / "models--lab--tiny-vit" / "snapshots" / COMMIT
    assert resolve_weights_file(str(folder), download=False) == str(folder / "model.safetensors")


def test_tiny_stable_diffusion_found_by_hub_id(cache):
    from fl_lightning.models.diffusion import load_diffusion, save_diffusion, tiny_diffusion_components

    tiny = tiny_diffusion_components(seed=0, image_size=16)
    snapshot = _snapshot(cache, "lab/tiny-sd")
    save_diffusion(tiny, snapshot / "tmp")
    for part in (snapshot / "tmp").iterdir():
        shutil.move(str(part), snapshot / part.name)
    for value in ("lab/tiny-sd", f"lab/tiny-sd@{COMMIT}"):  # main, and the same snapshot by its commit
        loaded = load_diffusion(value)
        for ours, theirs in zip(loaded.unet.parameters(), tiny.unet.parameters()):
            torch.testing.assert_close(ours, theirs)
    with pytest.raises(MissingResourceError, match=r"diffusion_path='lab/tiny-sd@v2' at revision 'v2' is not in"):
        load_diffusion("lab/tiny-sd@v2")


def test_missing_weight_is_one_line_naming_id_place_and_command(cache):
    with pytest.raises(MissingResourceError) as info:
        resolve_weights_file("lab/absent", download=False)
    text = str(info.value)
    assert "\n" not in text and text.startswith("model.checkpoint='lab/absent' is not in the Hugging Face cache")
    assert f"looked in {cache / 'models--lab--absent'}" in text
    assert "`hf download lab/absent`" in text and "model.download: true" in text
    with pytest.raises(MissingResourceError, match=r"fedisyn.diffusion_path='lab/sd' is not in the Hugging Face"):
        from fl_lightning.models.diffusion import load_diffusion

        load_diffusion("lab/sd")


def test_a_folder_without_weights_and_a_missing_path(cache, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingResourceError, match=r"holds no weights file \(looked for model.safetensors"):
        resolve_weights_file(str(tmp_path / "empty"), download=False)
    assert resolve_weights_file(str(tmp_path / "none.pt"), download=False) == str(tmp_path / "none.pt")
    with pytest.raises(MissingResourceError, match=r"llm_path='/no/where' does not exist; give a causal-LM folder"):
        resolve_local_or_hub(
            "/no/where", download=False, key="llm_path", download_key="model.download", what="a causal-LM folder"
        )


def test_preflight_phrases(cache, tmp_path):
    _snapshot(cache, "lab/cached")
    assert missing_weights_phrase("lab/cached", key="k", what="w", download=False) is None
    assert missing_weights_phrase(str(tmp_path), key="k", what="w", download=False) is None
    phrase = missing_weights_phrase("lab/other", key="fedisyn.llm_path", what="causal LM", download=False)
    assert phrase.startswith("fedisyn.llm_path=lab/other (causal LM; not in the Hugging Face cache")
    assert "`hf download lab/other`" in phrase
    (tmp_path / "f.txt").write_text("x")
    assert "it is a file, not a folder" in missing_weights_phrase(str(tmp_path / "f.txt"), key="k", what="w", download=False)


def test_download_without_a_network_is_one_line(cache, monkeypatch):
    """download: true on a machine that cannot reach the hub (HF_HUB_OFFLINE here): our line, not a traceback."""
    with pytest.raises(MissingResourceError) as info:
        hub_snapshot("lab/absent", download=True, key="model.checkpoint", download_key="model.download")
    text = str(info.value)
    assert "\n" not in text and "model.checkpoint='lab/absent'" in text and "`hf download lab/absent`" in text


def test_paper_configs_name_the_hub_ids_the_papers_used():
    from fl_lightning.config.loading import load_config
    from tests.conftest import CONF

    assert not [p.name for p in CONF.glob("*.yaml") if "weights/" in p.read_text()]
    fedisyn = load_config(str(CONF / "fedisyn_food101.yaml")).method
    assert (fedisyn.diffusion_path, fedisyn.llm_path, fedisyn.pretrain_checkpoint) == (
        "stable-diffusion-v1-5/stable-diffusion-v1-5",
        "huggyllama/llama-7b",
        "timm/vit_large_patch16_224.augreg_in21k_ft_in1k",
    )


def test_a_revision_in_the_id_picks_that_snapshot(cache):
    """``org/name@<branch or commit>``: the snapshot of that revision, for every weight key (main without it)."""
    from safetensors.torch import save_file

    other = "fedcba9876543210fedcba9876543210fedcba98"
    models = {seed: build_tiny_backbone("timm", seed=seed) for seed in (3, 4)}
    save_file(models[3].model.state_dict(), str(_snapshot(cache, "lab/tiny-vit") / "model.safetensors"))
    save_file(models[4].model.state_dict(), str(_snapshot(cache, "lab/tiny-vit", commit=other, ref="v2") / "model.safetensors"))
    x = torch.randn(2, 3, 32, 32)
    for value, seed in [
        ("lab/tiny-vit", 3),
        ("lab/tiny-vit@main", 3),
        ("lab/tiny-vit@v2", 4),
        (f"lab/tiny-vit@{other}", 4),
        (f"lab/tiny-vit@{COMMIT}", 3),
    ]:
        by_id = build_backbone(
            library="timm", name="vit_base_patch16_224", pretrained=None, checkpoint=value, overrides=tiny_timm_overrides(32)
        )
        with torch.no_grad():
            torch.testing.assert_close(by_id.eval()(x), models[seed].eval()(x), msg=value)
    assert resolve_weights_file("lab/tiny-vit@v2", download=False).endswith(f"snapshots/{other}/model.safetensors")
    assert missing_weights_phrase("lab/tiny-vit@v2", key="k", what="w", download=False) is None
    assert "(w; not in the Hugging Face cache" in missing_weights_phrase("lab/tiny-vit@v3", key="k", what="w", download=False)
    with pytest.raises(MissingResourceError) as info:
        resolve_weights_file("lab/tiny-vit@v3", download=False)
    text = str(info.value)
    assert "\n" not in text and text.startswith("model.checkpoint='lab/tiny-vit@v3' at revision 'v3' is not in the")
    assert f"looked in {cache / 'models--lab--tiny-vit'}" in text and "`hf download lab/tiny-vit --revision v3`" in text


def test_a_tiny_timm_cnn_found_by_hub_id(cache):
    """The paper configs' CNN ids (``timm/resnet18.tv_in1k``): a tiny resnet's weights in a snapshot, by id."""
    from safetensors.torch import save_file

    from fl_lightning.models.backbones import build_feature_backbone

    tiny = {"layers": [1, 1, 1, 1], "channels": [4, 8, 8, 8], "stem_width": 4}
    torch.manual_seed(0)
    reference = build_feature_backbone(library="timm", name="resnet18", pretrained=None, overrides=tiny)
    save_file(reference.model.state_dict(), str(_snapshot(cache, "timm/resnet18.tv_in1k") / "model.safetensors"))
    torch.manual_seed(1)
    by_id = build_feature_backbone(
        library="timm", name="resnet18", pretrained=None, checkpoint="timm/resnet18.tv_in1k", overrides=tiny
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(by_id.eval()(x), reference.eval()(x))
