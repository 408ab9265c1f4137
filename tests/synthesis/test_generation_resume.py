"""Generation resumes where it stopped: a run interrupted in the middle of a batch — one image of that batch
written, the next one half-written — and run again yields files byte-identical to an uninterrupted run's, and
writes only what is missing (a batch is re-sampled whole, as the uninterrupted run grouped it)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import pytest

from fl_lightning.synthesis import generate
from fl_lightning.synthesis.generate import (
    MANIFEST_NAME,
    class_totals,
    generate_images,
    plan_generation,
    synthetic_volume,
)
from fl_lightning.synthesis.prompts import TemplatePromptExpander
from tests.synthesis.chain import client_uploads, two_clients

KW = dict(batch_size=3, num_inference_steps=8, guidance_scale=2.0, device="cpu", progress=False)


class Crash(RuntimeError):
    pass


@pytest.fixture
def requests(tiny_sd):
    uploads = client_uploads(tiny_sd, two_clients(), timestep=300, max_timestep=600, seed=10)
    volume = synthetic_volume(class_totals(uploads), 0.7)  # {0: 5, 1: 6}: 11 images, batches of 3
    prompts = TemplatePromptExpander(seed=0).expand(["apple_pie", "dog"], 3)
    return plan_generation(uploads, ["apple_pie", "dog"], prompts, volume_per_class=volume, rho=0.8, seed=1)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.png"))}


def test_interrupted_generation_resumes_to_the_same_bytes(tiny_sd, requests, tmp_path, monkeypatch, one_thread):
    generate_images(tiny_sd, requests, tmp_path / "straight", **KW)
    straight = _files(tmp_path / "straight")
    assert len(straight) == len(requests) == 11

    save = generate._save_png
    written: list[Path] = []

    def crashing_save(image, path):
        if len(written) == 4:  # batch 2 holds images 4, 5, 6: the 5th file is cut off mid-write
            tmp = path.with_name(path.name + ".tmp")
            save(image, tmp)
            tmp.write_bytes(tmp.read_bytes()[:40])
            raise Crash("killed while writing")
        save(image, path)
        written.append(path)

    monkeypatch.setattr(generate, "_save_png", crashing_save)
    out = tmp_path / "resumed"
    with pytest.raises(Crash):
        generate_images(tiny_sd, requests, out, **KW)
    assert len(_files(out)) == 4 and not (out / MANIFEST_NAME).exists()
    assert any(p.name.endswith(".png.tmp") for p in out.rglob("*"))  # the half-written image is not counted

    remade: list[Path] = []
    monkeypatch.setattr(generate, "_save_png", lambda image, path: (remade.append(path), save(image, path)))
    mtimes = {p: p.stat().st_mtime_ns for p in written}
    generate_images(tiny_sd, requests, out, **KW)
    assert _files(out) == straight  # byte for byte
    assert len(remade) == len(requests) - 4 and not set(remade) & set(written)  # only the missing ones
    assert {p: p.stat().st_mtime_ns for p in written} == mtimes
    assert (out / MANIFEST_NAME).read_text() == (tmp_path / "straight" / MANIFEST_NAME).read_text()


def test_a_lost_image_is_remade_inside_its_whole_batch(tiny_sd, requests, tmp_path, monkeypatch, one_thread):
    """Sampled alone, an image can differ from the one its batch made (here, CPU float32: images 1 and 2 of
    the first batch of 3 differ in some pixel at batch size 1); remade inside its own batch, it is identical."""
    out = tmp_path / "a"
    generate_images(tiny_sd, requests, out, **KW)
    straight = _files(out)
    (out / requests[1].relpath).unlink()
    save, remade = generate._save_png, []
    monkeypatch.setattr(generate, "_save_png", lambda image, path: (remade.append(path), save(image, path)))
    generate_images(tiny_sd, requests, out, **KW)
    assert remade == [out / requests[1].relpath]
    assert _files(out) == straight
