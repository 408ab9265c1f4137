"""BLIP captioning (FGL): a tiny random BLIP captions offline, deterministically; a local folder round-trips."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from fl_lightning.errors import MissingResourceError
from fl_lightning.models.captioning import TINY_VOCAB, Captioner, tiny_blip


@pytest.fixture(scope="module")
def captioner() -> Captioner:
    return tiny_blip(seed=0, image_size=16, max_new_tokens=6)


def test_captions_are_words_of_the_vocabulary_and_deterministic(captioner):
    images = torch.rand(3, 3, 20, 24, generator=torch.Generator().manual_seed(0))  # any size: resized to 16
    first, again = captioner.caption(images), captioner.caption(images)
    assert len(first) == 3 and first == again  # greedy decoding: the same images give the same captions
    words = set(TINY_VOCAB[5:])
    assert all(set(c.split()) <= words for c in first)
    assert all(len(c.split()) == 6 for c in first)  # no special token: exactly max_new_tokens words
    assert captioner.caption(torch.empty(0, 3, 8, 8)) == []
    with pytest.raises(ValueError, match="B, 3, H, W"):
        captioner.caption(torch.rand(3, 8, 8))


def test_a_saved_blip_folder_loads_from_its_path_and_captions_the_same(captioner, tmp_path):
    captioner.model.save_pretrained(tmp_path)
    captioner.processor.save_pretrained(tmp_path)
    loaded = Captioner.from_path(tmp_path, max_new_tokens=6)
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    assert loaded.caption(images) == captioner.caption(images)


def test_missing_folder_is_one_line(tmp_path):
    with pytest.raises(MissingResourceError, match="BLIP captioning model not found at .*or give a hub id"):
        Captioner.from_path(tmp_path / "absent")
