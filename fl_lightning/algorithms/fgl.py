"""FGL (Federated Generative Learning, Zhang et al. 2023) as FeDiSyn's Benchmarks paragraph defines it.

    FGL = synthesis (captions) → full-parameter FedAvg
    devices caption their images with BLIP → upload the captions → text-only generation →
    server pre-training → full-parameter FedAvg

Round 0: each device captions every image it holds with BLIP (``models/captioning.py``,
``captioner_path`` a local ``BlipForConditionalGeneration`` folder; null: a tiny random BLIP for
tests) and uploads, per class, its captions as UTF-8 bytes (one uint8 tensor per class, so the
traffic counts every byte) plus its class counts. The server makes class k's prompts
"<class name>, <caption>" from the captions of all devices (in client order; the class name keeps a
caption that does not name the object tied to its label — an empty caption leaves the class name),
generates round(λ·D^k) images per class from pure noise and those prompts (captions taken in turn),
and pre-trains the ViT as FeDiSyn does. Rounds 1..T: full-parameter FedAvg, as GPT-FL
(:mod:`fl_lightning.algorithms.gptfl`).

Privacy: unlike FeDiSyn's noised latents, captions describe individual images in words; that is the
method's own trade-off, reproduced as is.

Config: the ``fgl:`` section holds the keys of its two stages — Stable Diffusion and pre-training
(``synthesis.DiffusionConfig``) plus the captioner's, and GPT-FL's fine-tuning; there is no
``llm_path`` or ``prompts_per_label`` (the captions are the prompts: such a key is an unknown key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lightning.fabric import Fabric

from fl_lightning.algorithms.gptfl import FullFedAvg, FullFedAvgConfig
from fl_lightning.algorithms.synthetic_family.family import FeDiSynFamily
from fl_lightning.algorithms.synthetic_family.synthesis import DiffusionConfig, DiffusionSynthesis, GenerationInputs
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import Client, register
from fl_lightning.federation.policies.privacy_coverage import never_covered
from fl_lightning.federation.transport import Download, Upload

__all__ = ["FGL", "FGLConfig", "CaptionConfig", "CaptionSynthesis", "pack_captions", "unpack_captions"]

_CAPTIONS = "captions."  # upload key prefix: captions.<label> = UTF-8 bytes of the captions, newline-separated


@dataclass
class CaptionConfig(DiffusionConfig):
    captioner_path: str | None = None  # a local BLIP captioning folder; null: tiny random BLIP (tests)
    caption_max_tokens: int = 20  # BLIP's greedy caption length cap
    caption_batch_size: int = 16  # images per BLIP call on a device
    caption_image_size: int = 32  # the tiny BLIP's input size (a real BLIP uses its processor's own)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.caption_max_tokens >= 1, "caption_max_tokens", self.caption_max_tokens, "an int >= 1")
        check(self.caption_batch_size >= 1, "caption_batch_size", self.caption_batch_size, "an int >= 1")
        check(self.caption_image_size >= 8, "caption_image_size", self.caption_image_size, "an int >= 8")


def pack_captions(captions: list[str]) -> torch.Tensor:
    """Captions → one uint8 tensor of their UTF-8 bytes joined by newlines (newlines inside become spaces)."""
    data = "\n".join(c.replace("\n", " ") for c in captions).encode("utf-8")
    return torch.tensor(list(data), dtype=torch.uint8)  # (bytes,); empty for one empty caption


def unpack_captions(tensor: torch.Tensor, count: int) -> list[str]:
    """The inverse of :func:`pack_captions` for ``count`` captions."""
    text = bytes(tensor.to(torch.uint8).tolist()).decode("utf-8")
    captions = text.split("\n")
    if len(captions) != count:
        raise ValueError(f"expected {count} captions, the upload holds {len(captions)}")
    return captions


class CaptionSynthesis(DiffusionSynthesis):
    """Round 0: devices caption their images; the server generates from "<class name>, <caption>" prompts."""

    config_class = CaptionConfig

    @classmethod
    def missing_resources(cls, config: Any, section: str, *, download: bool = False) -> list[str]:
        from fl_lightning.models.hub import missing_weights_phrase

        missing = super().missing_resources(config, section, download=download)
        path = config.captioner_path
        phrase = (
            None
            if path is None
            else missing_weights_phrase(
                path,
                key=f"{section}.captioner_path",
                download=download,
                what="BLIP captioning folder or hub id, e.g. Salesforce/blip-image-captioning-base",
            )
        )
        return missing + ([phrase] if phrase else [])

    def build(self, fabric: Fabric) -> None:
        from fl_lightning.models.captioning import Captioner, tiny_blip

        super().build(fabric)
        f = self.method.config
        if f.captioner_path is None:
            self.captioner = tiny_blip(
                seed=self.method.cfg.seed, image_size=f.caption_image_size, max_new_tokens=f.caption_max_tokens
            )
            self.captioner.model.to(fabric.device)
            self.captioner.device = fabric.device
        else:
            self.captioner = Captioner.from_path(
                f.captioner_path,
                max_new_tokens=f.caption_max_tokens,
                device=fabric.device,
                download=self.method.cfg.model.download,
                key=f"{self.method.name}.captioner_path",
            )

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        """A caption per image, grouped by class, as bytes; plus the class counts."""
        by_label: dict[int, list[str]] = {}
        for images, labels in self.method.client_images(client, batch_size=self.method.config.caption_batch_size):
            for caption, label in zip(self.captioner.caption(images), labels.tolist()):
                by_label.setdefault(int(label), []).append(caption)
        tensors = {f"{_CAPTIONS}{label}": pack_captions(captions) for label, captions in sorted(by_label.items())}
        tensors["class_counts"] = torch.as_tensor(client.class_counts, dtype=torch.int64)
        return Upload(tensors)

    def generation_inputs(self, uploads: Mapping[int, Upload]) -> GenerationInputs:
        names = self.method.env.splits.classes
        counts = np.zeros(len(names), dtype=np.int64)
        prompts: dict[str, list[str]] = {name: [] for name in names}
        for _, upload in uploads.items():
            client_counts = upload.tensors["class_counts"].numpy()
            counts += client_counts
            for key, tensor in upload.tensors.items():
                if key.startswith(_CAPTIONS):
                    label = int(key[len(_CAPTIONS) :])
                    for caption in unpack_captions(tensor, int(client_counts[label])):
                        prompts[names[label]].append(f"{names[label]}, {caption}" if caption else names[label])
        return GenerationInputs({k: int(v) for k, v in enumerate(counts)}, prompts_by_class=prompts)


@dataclass
class FGLConfig(CaptionConfig, FullFedAvgConfig):
    """The ``fgl:`` section: caption-prompted synthesis + full-parameter FedAvg."""


@register("fgl")
class FGL(FeDiSynFamily):
    """Caption-prompted text-only synthesis, then full-parameter FedAvg (see the module docstring)."""

    config_class = FGLConfig

    privacy_gap = never_covered("its synthesis round uploads captions of each client's images in the clear")

    stages = (CaptionSynthesis, FullFedAvg)
