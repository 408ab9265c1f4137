"""Fixtures shared by the synthesis tests: one tiny random Stable Diffusion per session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from fl_lightning.models.diffusion import DiffusionComponents, tiny_diffusion_components


@pytest.fixture(scope="session")
def tiny_sd() -> DiffusionComponents:
    """Tiny random SD: 32×32 images ↔ (4, 16, 16) latents, SD v1-5's PNDM scheduler."""
    return tiny_diffusion_components(seed=0, image_size=32)
