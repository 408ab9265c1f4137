"""A shared round 0 (fl_lightning/algorithms/synthetic_family/shared_round0.py) is reused only when it holds what its
record says, for this key: an edited, missing or foreign part, a record without hashes or a checkpoint that does not
load (a poisoned one never runs) is removed with one warning and made again, never reused and never blocking."""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest
import torch

from fl_lightning.algorithms.synthetic_family.shared_round0 import SharedRound0


def _images(folder, n=3):
    for i in range(n):
        path = folder / f"c{i % 2}" / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i]) * (100 + i))
    (folder / "manifest.jsonl").write_text("{}\n")
    return folder


def _published(tmp_path, key="k1"):
    shared = SharedRound0(tmp_path / "round0", key)
    shared.publish_images(_images(tmp_path / "run_a" / "synthetic"), host_s=1.5)
    return shared


def test_published_images_are_linked_into_the_next_run_with_their_hashes_recorded(tmp_path):
    shared = _published(tmp_path)
    record = shared.recorded("generation")
    assert record["key"] == "k1" and set(record["files"]) == {
        "images/c0/00000.png",
        "images/c1/00001.png",
        "images/c0/00002.png",
        "images/manifest.jsonl",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert shared.images_into(tmp_path / "run_b" / "synthetic")
    a, b = (tmp_path / r / "synthetic" / "c0" / "00000.png" for r in ("run_a", "run_b"))
    assert a.stat().st_ino == b.stat().st_ino


def _edit(part):
    (part / "images" / "c1" / "00001.png").write_bytes(b"other pixels")


def _drop(part):
    (part / "images" / "c0" / "00002.png").unlink()


def _old_record(part):
    record = json.loads((part / "record.json").read_text())
    del record["files"]
    (part / "record.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (_edit, "'images/c1/00001.png' is not the file it published"),
        (_drop, "'images/c0/00002.png' is missing"),
        (_old_record, "names no file hashes"),
    ],
)
def test_a_damaged_part_is_removed_with_one_warning_and_published_again(tmp_path, damage, why):
    shared = _published(tmp_path)
    damage(shared.folder / "generation")
    with pytest.warns(UserWarning, match="is not reused and is made again") as seen:
        assert not shared.images_into(tmp_path / "run_b" / "synthetic")
    assert len(seen) == 1 and why in str(seen[0].message) and "\n" not in str(seen[0].message)
    assert not (shared.folder / "generation").exists() and not (tmp_path / "run_b").exists()
    shared.publish_images(_images(tmp_path / "run_b" / "synthetic"), host_s=2.0)  # the run made its own
    assert shared.images_into(tmp_path / "run_c" / "synthetic")


def test_another_keys_round0_moved_under_this_key_is_not_reused(tmp_path):
    other = _published(tmp_path, key="k2")
    shutil.copytree(other.folder, tmp_path / "round0" / "k1")
    with pytest.warns(UserWarning, match="names the key 'k2': another configuration's round 0"):
        assert not SharedRound0(tmp_path / "round0", "k1").images_into(tmp_path / "run_b" / "synthetic")


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['FL_PWNED']}",))


def test_a_checkpoint_that_does_not_load_is_remade_and_a_poisoned_one_never_runs(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("FL_PWNED", str(marker))
    best = tmp_path / "run_a" / "pretrain" / "checkpoints" / "best-epoch=1.ckpt"
    best.parent.mkdir(parents=True)
    torch.save({"state_dict": _Payload()}, best)  # a pickle that would run a command if unpickled in full
    shared = SharedRound0(tmp_path / "round0", "k1")
    shared.publish_pretraining(best, pretraining_s=3.0, host_s=1.0)
    with pytest.warns(UserWarning, match=r"'.*pretraining' is not reused .*: its checkpoint does not load"):
        assert shared.pretrained_into(tmp_path / "run_b" / "pretrain") is None
    assert not marker.exists() and not (shared.folder / "pretraining").exists()


def test_a_checkpoint_that_loads_is_reused_with_its_recorded_times(tmp_path, monkeypatch):
    import fl_lightning.modules.pretraining as pretraining

    best = tmp_path / "run_a" / "pretrain" / "checkpoints" / "best-epoch=1.ckpt"
    best.parent.mkdir(parents=True)
    best.write_bytes(b"weights")
    monkeypatch.setattr(pretraining, "load_pretrained_vit", lambda path, map_location: ("vit", path.read_bytes()))
    shared = SharedRound0(tmp_path / "round0", "k1")
    shared.publish_pretraining(best, pretraining_s=3.0, host_s=1.0)
    model, pretraining_s, linked, host_s = shared.pretrained_into(tmp_path / "run_b" / "pretrain")
    assert model == ("vit", b"weights") and (pretraining_s, host_s) == (3.0, 1.0)
    assert linked.stat().st_ino == best.stat().st_ino
