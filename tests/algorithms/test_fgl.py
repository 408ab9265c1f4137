"""FGL: BLIP captions on the devices, uploaded as UTF-8 bytes (counted), then "<class>, <caption>" prompts."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.fgl import CaptionSynthesis, pack_captions, unpack_captions
from fl_lightning.config.loading import load_config
from fl_lightning.errors import UsageError
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.transport import Download
from fl_lightning.models.captioning import TINY_VOCAB
from tests.conftest import CONF

TINY = CONF / "fgl_tiny.yaml"


@pytest.mark.parametrize("captions", [["a dog", "two cats\non grass", ""], [""], ["café ünïcode", "x"]])
def test_captions_round_trip_through_bytes(captions):
    packed = pack_captions(captions)
    assert packed.dtype == torch.uint8
    assert packed.numel() == len("\n".join(c.replace("\n", " ") for c in captions).encode("utf-8"))
    assert unpack_captions(packed, len(captions)) == [c.replace("\n", " ") for c in captions]
    with pytest.raises(ValueError, match="captions"):
        unpack_captions(packed, len(captions) + 1)


class _Captioner:
    def caption(self, images):
        return [f"caption {int(v * 1000)}" for v in images[:, 0, 0, 0]]


def test_a_device_uploads_its_captions_by_class_and_the_server_prompts_with_them():
    stage = CaptionSynthesis.__new__(CaptionSynthesis)
    stage.captioner = _Captioner()
    images = torch.rand(5, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([2, 0, 2, 2, 1])
    stage.method = SimpleNamespace(
        config=SimpleNamespace(caption_batch_size=2),
        client_images=lambda client, batch_size: iter([(images[:2], labels[:2]), (images[2:], labels[2:])]),
    )
    client = SimpleNamespace(class_counts=np.bincount(labels.numpy(), minlength=3))
    upload = stage.client_update(0, client, Download())
    captions = _Captioner().caption(images)
    by_class = {k: [c for c, l in zip(captions, labels.tolist()) if l == k] for k in range(3)}
    expected = sum(len("\n".join(v).encode()) for v in by_class.values()) + 3 * 8  # + the int64 counts
    assert upload.num_bytes == expected
    stage.method.env = SimpleNamespace(splits=SimpleNamespace(classes=["cat", "dog", "eel"]))
    inputs = stage.generation_inputs({0: upload, 1: upload})
    assert inputs.latents_by_client is None and inputs.class_counts == {0: 2, 1: 2, 2: 6}
    assert inputs.prompts_by_class["eel"] == [f"eel, {c}" for c in by_class[2]] * 2


def test_fgl_tiny_one_round(tmp_path, one_thread):
    cfg = load_config(TINY, ["--output_dir", str(tmp_path), "--federation.rounds", "1"])
    summary = Simulation(cfg=cfg, loggers=[]).run()
    manifest = [json.loads(line) for line in (cfg.run_dir / "synthetic" / "manifest.jsonl").read_text().splitlines()]
    words = set(TINY_VOCAB)
    for m in manifest:  # every prompt is "<class>, <caption of one of the class's images>"
        name, caption = m["prompt"].split(", ", 1)
        assert name == m["class"] and set(caption.split()) <= words and len(caption.split()) == 6
    assert summary["bytes_up"] > 0 and summary["synthetic_images"] == len(manifest)
    assert summary["stages"] == ["CaptionSynthesis", "FullFedAvg"]


@pytest.mark.parametrize("key", ["llm_path", "prompts_per_label", "rho", "train_head"])
def test_keys_no_stage_of_fgl_reads_are_unknown(key):
    """The captions are the prompts (no LLM), the start is pure noise (no latents), all weights train."""
    with pytest.raises(UsageError, match=f"unknown key 'fgl.{key}'"):
        load_config(TINY, [f"--fgl.{key}", "1"])
