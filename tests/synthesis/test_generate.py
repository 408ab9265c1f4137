"""Tests for fl_lightning.synthesis.generate: PNDM mid-chain sampling, the plan, the image folder."""

import json
import math

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, PNDMScheduler
from PIL import Image

from fl_lightning.errors import ConfigError
from fl_lightning.models.diffusion import sd15_scheduler
from fl_lightning.synthesis.generate import (
    MANIFEST_NAME,
    _largest_remainder,
    class_totals,
    denoise_latents,
    generate_images,
    mix_latents,
    plan_generation,
    plms_chain,
    synthetic_volume,
)
from fl_lightning.synthesis.latents import ClassLatentUpload, client_latent_uploads
from fl_lightning.synthesis.prompts import TemplatePromptExpander

# ------------------------------------------------------------------------------------------------
# sampling with an oracle UNet


def _abar64():
    """Independent float64 ᾱ table of SD v1-5 (scaled_linear 0.00085 → 0.012)."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, 0)


class OracleUNet(torch.nn.Module):
    """Returns the exact noise for a known x0: ε = (x_t − sqrt(ᾱ_t) x0) / sqrt(1 − ᾱ_t)."""

    def __init__(self, x0, bias=0.0):
        super().__init__()
        self.x0, self.bias, self.abar = x0, bias, _abar64()

    def forward(self, x, t, encoder_hidden_states=None, return_dict=False):
        a = self.abar[int(t)]
        x0 = self.x0.repeat(x.shape[0] // self.x0.shape[0], 1, 1, 1)
        eps = (x - a.sqrt() * x0) / (1 - a).sqrt()
        # conditioning shifts ε by bias · mean(context), to check the guidance arithmetic
        shift = self.bias * encoder_hidden_states.mean(dim=(1, 2)).view(-1, 1, 1, 1)
        return (eps + shift,)


def _noised(x0, s, seed):
    eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    a = _abar64()[s]
    return a.sqrt() * x0 + (1 - a).sqrt() * eps, eps


X0 = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
TEXT = torch.zeros(2, 3, 8, dtype=torch.float64)
STARTS = [0, 1, 7, 137, 500, 510, 981, 999]


def _naive_slice(sched, x, s, n):
    """img2img-style start: keep the scheduler's timesteps ≤ s (wrong for PLMS)."""
    sched.set_timesteps(n)
    unet = OracleUNet(X0)
    for t in sched.timesteps[sched.timesteps <= s]:
        x = sched.step(unet(x, t, TEXT)[0], t, x).prev_sample
    return x


@pytest.mark.parametrize("n", [10, 50])
def test_plms_chain_equals_set_timesteps_on_the_full_chain(n):
    sched = sd15_scheduler()
    sched.set_timesteps(n)
    first = int(sched.timesteps[0])
    kw = dict(num_train_timesteps=1000, final_is_t0=True)
    assert plms_chain(first, num_inference_steps=n, **kw) == sched.timesteps.tolist()
    assert plms_chain(510, num_inference_steps=50, **kw)[:4] == [510, 490, 490, 470]
    assert plms_chain(510, num_inference_steps=50, **kw)[-1] == 10
    assert plms_chain(20, num_inference_steps=50, **kw) == [20]
    assert plms_chain(0, num_inference_steps=50, **kw) == []
    assert plms_chain(40, num_inference_steps=50, num_train_timesteps=1000, final_is_t0=False) == [40, 20, 20, 0]


@pytest.mark.parametrize("s", STARTS)
def test_oracle_chain_lands_on_the_ddim_path(s):
    """SD's PNDM ends at ᾱ_0: the chain output must be sqrt(ᾱ_0) x0 + sqrt(1 − ᾱ_0) ε exactly."""
    sched = sd15_scheduler()
    x_s, eps = _noised(X0, s, seed=s)
    out = denoise_latents(
        OracleUNet(X0), sched, x_s, timestep=s, num_inference_steps=50, text_embeddings=TEXT, predict_x0=False
    )
    a0 = _abar64()[0]
    assert (out - (a0.sqrt() * X0 + (1 - a0).sqrt() * eps)).abs().max() < 1e-5
    recovered = denoise_latents(OracleUNet(X0), sched, x_s, timestep=s, num_inference_steps=50, text_embeddings=TEXT)
    assert (recovered - X0).abs().max() < 1e-5


def test_naive_slicing_fails_the_same_check():
    """The check above has teeth: slicing the timesteps as img2img does misses by far more."""
    sched, a0 = sd15_scheduler(), _abar64()[0]
    errors = []
    for s in STARTS:
        x_s, eps = _noised(X0, s, seed=s)
        out = _naive_slice(sched, x_s, s, 50)
        errors.append(float((out - (a0.sqrt() * X0 + (1 - a0).sqrt() * eps)).abs().max()))
    assert max(errors) > 1e-2


@pytest.mark.parametrize("s", [3, 137, 500, 999])
def test_oracle_chain_recovers_x0_when_final_alpha_is_one(s):
    sched = PNDMScheduler.from_config(sd15_scheduler().config, set_alpha_to_one=True)
    x_s, _ = _noised(X0, s, seed=s)
    out = denoise_latents(
        OracleUNet(X0), sched, x_s, timestep=s, num_inference_steps=20, text_embeddings=TEXT, predict_x0=False
    )
    assert (out - X0).abs().max() < 1e-5


def test_classifier_free_guidance_combines_eps():
    """ε̂ = ε(∅) + g(ε(c) − ε(∅)): with ε shifted by b·mean(c) the guided run equals an unguided
    run whose conditioning carries g·mean(c)."""
    g, s = 3.0, 300
    x_s, _ = _noised(X0, s, seed=1)
    text = torch.full((2, 3, 8), 0.2, dtype=torch.float64)
    uncond = torch.zeros(1, 3, 8, dtype=torch.float64)
    unet = OracleUNet(X0, bias=1.0)
    kw = dict(timestep=s, num_inference_steps=25, predict_x0=False)
    guided = denoise_latents(
        unet, sd15_scheduler(), x_s, text_embeddings=text, uncond_embeddings=uncond, guidance_scale=g, **kw
    )
    ref = denoise_latents(unet, sd15_scheduler(), x_s, text_embeddings=g * text, **kw)
    assert torch.allclose(guided, ref, atol=1e-9)
    plain = denoise_latents(unet, sd15_scheduler(), x_s, text_embeddings=text, **kw)
    assert not torch.allclose(guided, plain, atol=1e-3)


def test_denoise_rejects_other_schedulers_and_bad_timesteps():
    with pytest.raises(ConfigError):
        denoise_latents(OracleUNet(X0), DDIMScheduler(), X0, timestep=10, num_inference_steps=10, text_embeddings=TEXT)
    with pytest.raises(ConfigError):
        denoise_latents(
            OracleUNet(X0), sd15_scheduler(), X0, timestep=1000, num_inference_steps=10, text_embeddings=TEXT
        )


# ------------------------------------------------------------------------------------------------
# volumes and plan


def test_mix_latents():
    c, m = torch.randn(4, 2, 2), torch.randn(4, 2, 2)
    assert torch.allclose(mix_latents(c, m, 0.3).double(), 0.3 * c.double() + 0.7 * m.double(), atol=1e-6)
    assert torch.equal(mix_latents(c, m, 1.0), c)
    with pytest.raises(ConfigError):
        mix_latents(c, m, 1.5)


@pytest.mark.parametrize(
    "total,weights", [(7, [5, 2]), (10, [1, 1, 1]), (0, [3, 4]), (13, [9, 0, 4, 4]), (100, [1, 2, 3])]
)
def test_largest_remainder_is_proportional(total, weights):
    shares = _largest_remainder(total, weights)
    assert sum(shares) == total
    quotas = [total * w / sum(weights) for w in weights]
    assert all(math.floor(q) <= s <= math.ceil(q) for s, q in zip(shares, quotas))


def _up(label, count, z, t, seed):
    g = torch.Generator().manual_seed(seed)
    centroids, mean = torch.randn(z, 4, 2, 2, generator=g), torch.randn(4, 2, 2, generator=g)
    return ClassLatentUpload(label=label, count=count, timestep=t, centroids=centroids, mean=mean)


def test_volumes_and_plan():
    uploads = {0: [_up(0, 6, 3, 100, 0), _up(1, 1, 1, 100, 1)], 1: [_up(0, 2, 2, 50, 2)], 2: [_up(1, 3, 2, 70, 3)]}
    totals = class_totals(uploads)
    assert totals == {0: 8, 1: 4}
    volume = synthetic_volume(totals, 1.3)
    assert volume == {0: round(1.3 * 8), 1: round(1.3 * 4)} == {0: 10, 1: 5}
    prompts = {"cat": ["p0", "p1", "p2"], "dog": ["q0", "q1"]}
    reqs = plan_generation(uploads, ["cat", "dog"], prompts, volume_per_class=volume, rho=0.25, seed=4)
    for label, name in enumerate(["cat", "dog"]):
        mine = [r for r in reqs if r.label == label]
        assert len(mine) == volume[label] and [r.index for r in mine] == list(range(volume[label]))
        assert all(r.class_name == name for r in mine)
        # prompts cycle: consecutive images take consecutive prompts
        ps = prompts[name]
        start = ps.index(mine[0].prompt)
        assert [r.prompt for r in mine] == [ps[(start + j) % len(ps)] for j in range(len(mine))]
    cat = [r for r in reqs if r.label == 0]
    assert [sum(r.client == c for r in cat) for c in (0, 1)] == _largest_remainder(10, [6, 2])  # ∝ D_i^k
    for r in reqs:
        up = next(u for u in uploads[r.client] if u.label == r.label)
        assert r.timestep == up.timestep
        ref = 0.25 * up.centroids[r.centroid_index].double() + 0.75 * up.mean.double()
        assert torch.allclose(r.latent.double(), ref, atol=1e-6)
    from_client0 = [r.centroid_index for r in cat if r.client == 0]
    assert from_client0 == [0, 1, 2, 0, 1, 2, 0, 1][: len(from_client0)]  # round-robin over centroids
    assert len({r.seed for r in reqs}) == len(reqs)
    again = plan_generation(uploads, ["cat", "dog"], prompts, volume_per_class=volume, rho=0.25, seed=4)
    assert [(r.seed, r.prompt) for r in again] == [(r.seed, r.prompt) for r in reqs]
    with pytest.raises(ValueError):
        plan_generation(uploads, ["cat", "dog"], prompts, volume_per_class={5: 1}, rho=0.25, seed=4)


# ------------------------------------------------------------------------------------------------
# the whole chain with tiny components


def _clients():
    def imgs(n, seed):
        return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))

    return {0: {0: imgs(5, 0), 1: imgs(3, 1)}, 1: {0: imgs(2, 2), 1: imgs(6, 3)}}


def _pixels(path):
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


def test_whole_chain_writes_an_imagefolder_resumably(tiny_sd, tmp_path):
    from torchvision.datasets import ImageFolder

    names = ["apple_pie", "dog"]
    uploads = {
        c: client_latent_uploads(
            tiny_sd.vae, tiny_sd.scheduler, data, num_centroids=2, timestep=None, max_timestep=600, seed=10 + c
        )
        for c, data in _clients().items()
    }
    volume = synthetic_volume(class_totals(uploads), 0.7)
    assert volume == {0: round(0.7 * 7), 1: round(0.7 * 9)} == {0: 5, 1: 6}
    prompts = TemplatePromptExpander(seed=0).expand(names, 3)
    reqs = plan_generation(uploads, names, prompts, volume_per_class=volume, rho=0.8, seed=1)
    kw = dict(batch_size=3, num_inference_steps=8, guidance_scale=2.0, device="cpu", progress=True)
    manifest = generate_images(tiny_sd, reqs, tmp_path / "a", **kw)

    folder = ImageFolder(str(tmp_path / "a"))
    assert folder.classes == names
    counts = np.bincount([y for _, y in folder.samples], minlength=2)
    assert counts.tolist() == [volume[0], volume[1]]
    image, _ = folder[0]
    assert image.size == (32, 32)
    pixels = np.stack([_pixels(path) for path, _ in folder.samples])
    assert len({p.tobytes() for p in pixels}) == len(pixels)  # distinct starting latents → distinct images
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert manifest.name == MANIFEST_NAME and len(rows) == len(reqs)
    for row, req in zip(rows, reqs):
        assert (tmp_path / "a" / row["path"]).is_file()
        assert row == {
            "path": req.relpath, "class": req.class_name, "label": req.label, "client": req.client,
            "centroid_index": req.centroid_index, "prompt": req.prompt, "timestep": req.timestep, "seed": req.seed,
        }
    assert {row["client"] for row in rows} == {0, 1}

    # re-running regenerates nothing
    files = sorted((tmp_path / "a").rglob("*.png"))
    mtimes = [f.stat().st_mtime_ns for f in files]
    generate_images(tiny_sd, reqs, tmp_path / "a", **kw)
    assert [f.stat().st_mtime_ns for f in files] == mtimes

    # a lost image is remade, with other batching, to the same pixels; same seed → same images
    lost = tmp_path / "a" / reqs[4].relpath
    before = _pixels(lost)
    lost.unlink()
    generate_images(tiny_sd, reqs, tmp_path / "a", **{**kw, "batch_size": 1})
    assert np.abs(_pixels(lost) - before).max() <= 1  # batch size may move a value across a rounding edge
    assert [f.stat().st_mtime_ns for f in files if f != lost] == [m for f, m in zip(files, mtimes) if f != lost]
    again = plan_generation(uploads, names, prompts, volume_per_class=volume, rho=0.8, seed=1)
    generate_images(tiny_sd, again, tmp_path / "b", **kw)
    for f in files:
        assert np.array_equal(_pixels(tmp_path / "b" / f.relative_to(tmp_path / "a")), _pixels(f))
    assert (tmp_path / "b" / MANIFEST_NAME).read_text() == manifest.read_text()


def test_bfloat16_networks_give_close_images(tmp_path):
    from fl_lightning.models.diffusion import tiny_diffusion_components

    ups = {0: [_up(0, 3, 2, 300, 0)]}
    reqs = plan_generation(ups, ["cat"], {"cat": ["a cat."]}, volume_per_class={0: 2}, rho=0.5, seed=0)
    kw = dict(num_inference_steps=10, batch_size=2, progress=False)
    generate_images(tiny_diffusion_components(), reqs, tmp_path / "f32", **kw)
    half = tiny_diffusion_components()
    generate_images(half, reqs, tmp_path / "bf16", dtype=torch.bfloat16, **kw)
    assert half.unet.dtype == torch.bfloat16
    for r in reqs:
        a, b = _pixels(tmp_path / "f32" / r.relpath), _pixels(tmp_path / "bf16" / r.relpath)
        assert np.abs(a - b).mean() < 0.2 * a.std()  # bf16 round-off, not a different image
