"""models/weights.py: cache lookups without the network, the cheap checkpoint check and the one-line
account of a load failure."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from fl_lightning.errors import MissingResourceError
from fl_lightning.models.weights import (
    check_checkpoint,
    describe_load_error,
    find_cached_weights,
    key_mismatch_message,
    open_state_dict,
)

STATE = {"a.weight": torch.arange(6.0).reshape(2, 3), "a.bias": torch.ones(2, dtype=torch.float16)}


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_open_state_dict_round_trip_and_meta(tmp_path, suffix):
    path = tmp_path / f"w{suffix}"
    save_file(STATE, str(path)) if suffix == ".safetensors" else torch.save(STATE, path)
    got = open_state_dict(path)
    assert got.keys() == STATE.keys() and all(torch.equal(got[k], STATE[k]) for k in STATE)
    meta = open_state_dict(path, meta=True)
    assert {k: (v.shape, v.dtype, v.device.type) for k, v in meta.items()} == {
        k: (v.shape, v.dtype, "meta") for k, v in STATE.items()
    }


@pytest.mark.parametrize("wrapper", ["state_dict", "model", "state_dict_ema"])
def test_training_checkpoints_are_unwrapped(tmp_path, wrapper):
    path = tmp_path / "ckpt.pth"
    torch.save({wrapper: STATE, "epoch": 4, "optimizer": {"lr": torch.tensor(0.1)}}, path)
    assert set(open_state_dict(path)) == set(STATE)


@pytest.mark.parametrize(
    "content,problem",
    [
        (b"", "is empty"),
        (b"model: vit\n", "neither a torch archive nor a safetensors file"),
        (b"PK\x03\x04garbage", "truncated or corrupt"),
    ],
)
def test_check_checkpoint_problems(tmp_path, content, problem):
    path = tmp_path / "w.bin"
    path.write_bytes(content)
    with pytest.raises(MissingResourceError, match=re.escape(problem)) as info:
        check_checkpoint(path, label="fedisyn.pretrain_checkpoint")
    assert str(info.value).startswith(f"fedisyn.pretrain_checkpoint {path} ")


def test_check_checkpoint_on_a_directory_and_a_missing_path(tmp_path):
    with pytest.raises(MissingResourceError, match="is a directory"):
        check_checkpoint(tmp_path)
    with pytest.raises(MissingResourceError, match="does not exist"):
        check_checkpoint(tmp_path / "nope.pt")


def test_check_checkpoint_reads_no_weights(tmp_path):
    # the archive is memory-mapped and only shapes are kept: no tensor data is materialised
    path = tmp_path / "big.pt"
    torch.save({"w": torch.zeros(1024, 1024)}, path)
    check_checkpoint(path)
    assert open_state_dict(path, meta=True)["w"].device.type == "meta"


def test_find_cached_weights_order_and_message(tmp_path):
    url_dir = tmp_path / "urls"
    url_dir.mkdir()
    assert find_cached_weights(what="w", file="/given/file.pt", url_dir=str(url_dir)) == "/given/file.pt"
    (url_dir / "vit.pth").write_bytes(b"x")
    assert find_cached_weights(what="w", url="https://host/x/vit.pth", url_dir=str(url_dir)) == str(url_dir / "vit.pth")
    with pytest.raises(MissingResourceError) as info:
        find_cached_weights(
            what="timm weights vit_x",
            hf_hub_id="timm/vit_x",
            hf_filenames=["model.safetensors"],
            url="https://host/other.pth",
            url_dir=str(url_dir),
            cache_dir=str(tmp_path / "hf"),
        )
    message = str(info.value)
    assert "\n" not in message and message.startswith("timm weights vit_x are not on disk")
    assert "hf://timm/vit_x/model.safetensors in " + str(tmp_path / "hf") in message
    assert os.path.join(str(url_dir), "other.pth") in message and "model.download: true" in message


def test_find_cached_weights_reads_the_hf_cache_layout(tmp_path):
    snapshot = tmp_path / "models--org--repo" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "models--org--repo" / "refs").mkdir()
    (tmp_path / "models--org--repo" / "refs" / "main").write_text("0" * 40)
    (snapshot / "b.bin").write_bytes(b"x")
    found = find_cached_weights(
        what="w", hf_hub_id="org/repo", hf_filenames=["a.safetensors", "b.bin"], url_dir=str(tmp_path), cache_dir=str(tmp_path)
    )
    assert Path(found) == snapshot / "b.bin"


def test_describe_load_error_counts_shape_mismatches_and_hides_weights_only_advice():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    bad = {k: torch.zeros(5) for k in model.state_dict()}
    with pytest.raises(RuntimeError) as info:
        model.load_state_dict(bad)
    text = describe_load_error(info.value)
    assert text.startswith("6 tensors have the wrong shape (e.g. '0.weight' file [5] vs model [2, 3]")
    advice = RuntimeError("Weights only load failed. ... \n(1) pass weights_only=False ...")
    assert "weights_only" not in describe_load_error(advice).lower()


def test_key_mismatch_message_counts_and_examples():
    message = key_mismatch_message(
        label="model.checkpoint",
        path="/w.pt",
        model="timm vit",
        missing=[f"blocks.{i}.w" for i in range(5)],
        unexpected=["head.x"],
    )
    assert "\n" not in message and "/w.pt" in message
    assert "5 missing (e.g. 'blocks.0.w', 'blocks.1.w', 'blocks.2.w', …)" in message
    assert "1 unexpected (e.g. 'head.x')" in message


def test_a_home_relative_path_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    save_file({"w": torch.ones(2)}, str(tmp_path / "w.safetensors"))
    check_checkpoint("~/w.safetensors")  # as the shipped configs write it
    assert torch.equal(open_state_dict("~/w.safetensors")["w"], torch.ones(2))
