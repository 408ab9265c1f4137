"""Tests for fl_lightning.models.diffusion: tiny components, SD settings, save/load, clear errors."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import shutil

import pytest
import torch

from fl_lightning.errors import MissingResourceError
from fl_lightning.models.diffusion import (
    SUBFOLDERS,
    clip_bpe_tokenizer,
    load_diffusion,
    save_diffusion,
    sd15_scheduler,
    tiny_diffusion_components,
)


@pytest.fixture(scope="module")
def tiny():
    return tiny_diffusion_components(seed=0, image_size=32)


def _forward_all(c, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(2, 3, 32, 32, generator=g) * 2 - 1
    ids = c.tokenizer(["a photo of a cat", "a dog"], padding="max_length", max_length=77, return_tensors="pt").input_ids
    with torch.no_grad():
        z = c.vae.encode(images).latent_dist.mean
        recon = c.vae.decode(z).sample
        text = c.text_encoder(ids)[0]
        eps = c.unet(z, torch.tensor(500), encoder_hidden_states=text).sample
    return z, recon, text, eps


def test_tiny_components_have_sd_interfaces_and_shapes(tiny):
    z, recon, text, eps = _forward_all(tiny)
    assert z.shape == (2, 4, 16, 16)  # VAE downsamples ×2 to 4 latent channels
    assert recon.shape == (2, 3, 32, 32)
    assert text.shape == (2, 77, tiny.unet.config.cross_attention_dim)
    assert eps.shape == z.shape
    assert tiny.vae.config.scaling_factor == pytest.approx(0.18215)
    assert not any(p.requires_grad for p in tiny.unet.parameters())


def test_scheduler_has_sd15_settings():
    cfg = sd15_scheduler().config
    assert cfg.beta_schedule == "scaled_linear"
    assert (cfg.beta_start, cfg.beta_end) == (0.00085, 0.012)
    assert cfg.skip_prk_steps and not cfg.set_alpha_to_one and cfg.steps_offset == 1
    assert cfg.num_train_timesteps == 1000
    # scaled_linear: betas are a linear ramp in sqrt space (independent float64 reference)
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    ref = torch.cumprod(1 - betas, 0)
    assert torch.allclose(sd15_scheduler().alphas_cumprod.double(), ref, atol=1e-6)


def test_tokenizer_matches_open_clip_ids():
    import open_clip

    tok = clip_bpe_tokenizer()
    for text in ["A photo of a Golden retriever, running!", "pizza margherita on a wooden table"]:
        ids = tok(text).input_ids
        ref = open_clip.tokenize([text])[0]
        assert ids == ref[: len(ids)].tolist()
        assert ref[len(ids) :].eq(0).all()  # open_clip pads with 0 after <|endoftext|>
    assert tok.model_max_length == 77 and len(tok) == 49408


def test_tiny_components_are_seeded_and_leave_global_rng_alone():
    state = torch.get_rng_state()
    a = tiny_diffusion_components(seed=3)
    b = tiny_diffusion_components(seed=3)
    c = tiny_diffusion_components(seed=4)
    assert torch.equal(torch.get_rng_state(), state)
    pa, pb, pc = (next(x.unet.parameters()) for x in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_save_load_round_trip(tiny, tmp_path):
    path = save_diffusion(tiny, tmp_path / "sd")
    assert all((path / s).is_dir() for s in SUBFOLDERS)
    loaded = load_diffusion(path)
    for x, y in zip(_forward_all(tiny), _forward_all(loaded)):
        assert torch.equal(x, y)
    public = lambda cfg: {k: v for k, v in cfg.items() if not k.startswith("_")}  # noqa: E731
    assert public(loaded.scheduler.config) == public(tiny.scheduler.config)
    assert loaded.tokenizer("a zebra").input_ids == tiny.tokenizer("a zebra").input_ids
    half = load_diffusion(path, dtype=torch.bfloat16)
    assert half.unet.dtype == half.vae.dtype == half.text_encoder.dtype == torch.bfloat16


def test_to_casts_all_networks(tmp_path):
    c = tiny_diffusion_components(seed=1).to("cpu", torch.bfloat16)
    assert c.unet.dtype == c.vae.dtype == c.text_encoder.dtype == c.dtype == torch.bfloat16


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_missing_folder_is_one_clear_line(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(MissingResourceError) as err:
        load_diffusion(missing)
    msg = _one_line(err)
    assert str(missing) in msg and "fedisyn.diffusion_path" in msg
    assert "`hf download stable-diffusion-v1-5/stable-diffusion-v1-5`" in msg


def test_missing_subfolder_and_missing_weights(tiny, tmp_path):
    path = save_diffusion(tiny, tmp_path / "sd")
    shutil.rmtree(path / "unet")
    with pytest.raises(MissingResourceError) as err:
        load_diffusion(path)
    assert "unet/" in _one_line(err)
    (path / "unet").mkdir()  # folder present, weights and config absent
    with pytest.raises(MissingResourceError) as err:
        load_diffusion(path)
    assert str(path) in _one_line(err)
