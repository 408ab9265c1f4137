"""Tests for fl_lightning.synthesis.generate: PNDM mid-chain sampling, the noise top-up, the plan, the image folder."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, PNDMScheduler
from PIL import Image

from fl_lightning.models.diffusion import sd15_scheduler
from fl_lightning.synthesis.generate import (
    MANIFEST_NAME,
    GenerationRequest,
    _largest_remainder,
    class_totals,
    decode_latents,
    denoise_latents,
    diffuse_forward,
    fresh_timestep,
    generate_images,
    mix_latents,
    mix_noise_fraction,
    plan_generation,
    plms_chain,
    start_latent,
    synthetic_volume,
    top_up_latent,
    top_up_std,
)
from fl_lightning.synthesis.latents import ClassLatentUpload
from fl_lightning.synthesis.prompts import TemplatePromptExpander
from tests.synthesis.chain import client_uploads, random_images, two_clients

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
    out = denoise_latents(OracleUNet(X0), sched, x_s, timestep=s, num_inference_steps=50, text_embeddings=TEXT, predict_x0=False)
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
    out = denoise_latents(OracleUNet(X0), sched, x_s, timestep=s, num_inference_steps=20, text_embeddings=TEXT, predict_x0=False)
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
    guided = denoise_latents(unet, sd15_scheduler(), x_s, text_embeddings=text, uncond_embeddings=uncond, guidance_scale=g, **kw)
    ref = denoise_latents(unet, sd15_scheduler(), x_s, text_embeddings=g * text, **kw)
    assert torch.allclose(guided, ref, atol=1e-9)
    plain = denoise_latents(unet, sd15_scheduler(), x_s, text_embeddings=text, **kw)
    assert not torch.allclose(guided, plain, atol=1e-3)


def test_denoise_rejects_other_schedulers_and_bad_timesteps():
    with pytest.raises(TypeError):
        denoise_latents(OracleUNet(X0), DDIMScheduler(), X0, timestep=10, num_inference_steps=10, text_embeddings=TEXT)
    prk = PNDMScheduler.from_config(sd15_scheduler().config, skip_prk_steps=False)
    with pytest.raises(ValueError):
        denoise_latents(OracleUNet(X0), prk, X0, timestep=10, num_inference_steps=10, text_embeddings=TEXT)
    with pytest.raises(ValueError):
        denoise_latents(OracleUNet(X0), sd15_scheduler(), X0, timestep=1000, num_inference_steps=10, text_embeddings=TEXT)


# ------------------------------------------------------------------------------------------------
# volumes and plan


def test_mix_latents():
    c, m = torch.randn(4, 2, 2), torch.randn(4, 2, 2)
    assert torch.allclose(mix_latents(c, m, 0.3).double(), 0.3 * c.double() + 0.7 * m.double(), atol=1e-6)
    assert torch.equal(mix_latents(c, m, 1.0), c)
    with pytest.raises(ValueError):
        mix_latents(c, m, 1.5)
    with pytest.raises(ValueError):
        synthetic_volume({0: 3}, float("nan"))
    with pytest.raises(ValueError):
        generate_images(None, [], "unused", batch_size=0)


# ------------------------------------------------------------------------------------------------
# the noise top-up: Monte-Carlo against the forward process, in float64


@pytest.mark.parametrize("rho,s", [(0.7, 400), (0.5, 50), (0.9, 900), (0.2, 700)])
def test_topped_up_mix_has_the_schedules_noise_and_keeps_the_signal(rho, s):
    """Mix two independently noised latents, top up with fresh noise: the result must be distributed
    as q(x_s | x̄_0) = N(sqrt(ᾱ_s) x̄_0, (1 − ᾱ_s) I) with x̄_0 = ρ c + (1 − ρ) m."""
    rng = np.random.default_rng(s)
    n, d = 40_000, 16  # 640k noise values: the variance is known to ±0.35% (one sd)
    abar = float(_abar64()[s])
    sigma2 = 1.0 - abar
    c, m = rng.normal(size=d), rng.normal(size=d)
    e_z = np.sqrt(abar) * c + np.sqrt(sigma2) * rng.normal(size=(n, d))  # client-side forward process
    e_avg = np.sqrt(abar) * m + np.sqrt(sigma2) * rng.normal(size=(n, d))
    mixed = torch.from_numpy(rho * e_z + (1 - rho) * e_avg)
    q = mix_noise_fraction(rho)
    assert q == pytest.approx(rho**2 + (1 - rho) ** 2)
    assert top_up_std(abar, q) ** 2 == pytest.approx(sigma2 * 2 * rho * (1 - rho))
    xi = torch.from_numpy(rng.normal(size=(n, d)))
    x = top_up_latent(mixed, xi, alpha_bar=abar, noise_fraction=q).numpy()
    signal = np.sqrt(abar) * (rho * c + (1 - rho) * m)
    resid = x - signal
    tol = 4 * np.sqrt(2.0 / resid.size)  # 4 sd of a variance estimate, relative
    assert abs(resid.var() / sigma2 - 1.0) < tol  # the schedule's σ_s², not q σ_s²
    assert abs((mixed.numpy() - signal).var() / sigma2 - q) < tol  # before the top-up: the bug being fixed
    assert np.abs(resid.mean(0)).max() < 5 * np.sqrt(sigma2 / n)  # signal kept: E[x] = sqrt(ᾱ_s) x̄_0
    assert np.abs(np.corrcoef(resid.reshape(n, d).T) - np.eye(d)).max() < 0.03  # noise stays white


def test_start_latent_draws_fresh_noise_from_the_request_seed():
    """Through the real path: requests that share one mixed latent get their own noise from their
    seed, together distributed with the schedule's variance at s; same seed → same tensor."""
    sched = sd15_scheduler()
    s, rho = 300, 0.7
    abar = float(_abar64()[s])
    g = torch.Generator().manual_seed(0)
    c = torch.randn(4, 4, 4, generator=g, dtype=torch.float64)
    m = torch.randn(4, 4, 4, generator=g, dtype=torch.float64)
    e_z = abar**0.5 * c + (1 - abar) ** 0.5 * torch.randn(4, 4, 4, generator=g, dtype=torch.float64)
    e_avg = abar**0.5 * m + (1 - abar) ** 0.5 * torch.randn(4, 4, 4, generator=g, dtype=torch.float64)
    mixed = mix_latents(e_z, e_avg, rho).float()
    q = mix_noise_fraction(rho)

    def req(seed):
        return GenerationRequest("cat", 0, 0, 0, mixed, s, "a cat.", seed, 0, noise_fraction=q)

    starts = [start_latent(req(seed), sched.alphas_cumprod, min_fresh_fraction=0.25) for seed in range(4000)]
    assert {t for _, t in starts} == {s}  # 2ρ(1 − ρ) = 0.42 ≥ 0.25: no forward step
    x = torch.stack([x for x, _ in starts]).double()
    fresh = x - mixed.double()  # what start_latent added
    tol = 4 * np.sqrt(2.0 / fresh.numel())
    assert abs(fresh.var().item() / ((1 - abar) * (1 - q)) - 1) < tol
    assert abs(fresh.mean().item()) < 4 * ((1 - abar) * (1 - q) / fresh.numel()) ** 0.5
    a, t_a = start_latent(req(7), sched.alphas_cumprod, min_fresh_fraction=0.25)
    b, _ = start_latent(req(7), sched.alphas_cumprod, min_fresh_fraction=0.25)
    assert torch.equal(a, b) and a.dtype == torch.float32 and t_a == s


def _fresh_reference(abar, s, q, floor):
    """Brute force: track the shared-noise coefficient through x_t = sqrt(ᾱ_t/ᾱ_s) x_s + ..., step by step."""
    abar = abar.numpy()
    shared_var_s = q * (1 - abar[s])
    for t in range(s, len(abar)):
        coef2 = (abar[t] / abar[s]) * shared_var_s  # (sqrt(ᾱ_t/ᾱ_s))² × shared variance at s
        if 1 - coef2 / (1 - abar[t]) >= floor - 1e-12:
            return t
    return len(abar) - 1


@pytest.mark.parametrize(
    "s,q,floor",
    [(400, 1.0, 0.25), (0, 1.0, 0.25), (400, 0.58, 0.25), (700, 0.82, 0.3), (50, 1.0, 0.9), (999, 1.0, 0.25), (400, 1.0, 0.0)],
)
def test_fresh_timestep_matches_brute_force(s, q, floor):
    abar = _abar64()
    t = fresh_timestep(abar, s, q, floor)
    assert t == _fresh_reference(abar, s, q, floor)
    if 1 - q >= floor:
        assert t == s


def test_diffuse_forward_lands_on_the_schedule_at_t():
    """Monte-Carlo: x_s ~ q(x_s | x_0) pushed to t is q(x_t | x_0) (signal sqrt(ᾱ_t) x_0, variance 1 − ᾱ_t)."""
    rng = np.random.default_rng(1)
    abar = _abar64().numpy()
    s, t, n, d = 200, 450, 50_000, 8
    x0 = rng.normal(size=d)
    x_s = np.sqrt(abar[s]) * x0 + np.sqrt(1 - abar[s]) * rng.normal(size=(n, d))
    x_t = diffuse_forward(
        torch.from_numpy(x_s), torch.from_numpy(rng.normal(size=(n, d))), alpha_bar_s=abar[s], alpha_bar_t=abar[t]
    ).numpy()
    resid = x_t - np.sqrt(abar[t]) * x0
    assert abs(resid.var() / (1 - abar[t]) - 1) < 4 * np.sqrt(2.0 / resid.size)
    assert np.abs(resid.mean(0)).max() < 5 * np.sqrt((1 - abar[t]) / n)
    with pytest.raises(ValueError):
        diffuse_forward(torch.zeros(2), torch.zeros(2), alpha_bar_s=0.5, alpha_bar_t=0.6)  # t < s
    with pytest.raises(ValueError):
        top_up_latent(torch.zeros(2), torch.zeros(3), alpha_bar=0.5, noise_fraction=0.5)
    with pytest.raises(ValueError):
        fresh_timestep(_abar64(), 10, 1.0, 1.0)


def test_mean_only_start_is_diffused_to_a_fresh_timestep():
    """A mean-only upload (q = 1) has no mix to top up: each image is pushed forward to
    t = fresh_timestep(...), where its own noise is ≥ the floor and the variance is the schedule's."""
    sched, s, floor = sd15_scheduler(), 400, 0.25
    abar = _abar64()
    t_ref = _fresh_reference(abar, s, 1.0, floor)
    assert t_ref > s
    mean = torch.zeros(4, 4, 4)  # x_0 = 0 and no client noise: what remains is the image's own noise
    reqs = [GenerationRequest("cat", 0, 0, -1, mean, s, "a cat.", seed, 0, noise_fraction=1.0) for seed in range(3000)]
    outs = [start_latent(r, sched.alphas_cumprod, min_fresh_fraction=floor) for r in reqs]
    assert {t for _, t in outs} == {t_ref}
    own = torch.stack([x for x, _ in outs]).double()
    expected = 1 - float(abar[t_ref]) / float(abar[s])  # own variance added by the forward step
    assert abs(own.var().item() / expected - 1) < 4 * np.sqrt(2.0 / own.numel())
    assert expected / (1 - float(abar[t_ref])) >= floor


@pytest.mark.parametrize("total,weights", [(7, [5, 2]), (10, [1, 1, 1]), (0, [3, 4]), (13, [9, 0, 4, 4]), (100, [1, 2, 3])])
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
    mean_only = ClassLatentUpload(
        label=1,
        count=1,
        timestep=100,
        centroids=torch.empty(0, 4, 2, 2),
        mean=torch.randn(4, 2, 2, generator=torch.Generator().manual_seed(9)),
    )
    uploads = {0: [_up(0, 6, 3, 100, 0), mean_only], 1: [_up(0, 2, 2, 50, 2)], 2: [_up(1, 3, 2, 70, 3)]}
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
        if up.mean_only:  # starts from the noised class average, a single noised latent: q = 1
            assert r.centroid_index == -1 and torch.equal(r.latent, up.mean) and r.noise_fraction == 1.0
            continue
        ref = 0.25 * up.centroids[r.centroid_index].double() + 0.75 * up.mean.double()
        assert torch.allclose(r.latent.double(), ref, atol=1e-6)
        assert r.noise_fraction == pytest.approx(0.25**2 + 0.75**2)
    assert sum(r.centroid_index == -1 for r in reqs) == _largest_remainder(5, [1, 3])[0] == 1
    from_client0 = [r.centroid_index for r in cat if r.client == 0]
    assert from_client0 == [0, 1, 2, 0, 1, 2, 0, 1][: len(from_client0)]  # round-robin over centroids
    assert len({r.seed for r in reqs}) == len(reqs)
    again = plan_generation(uploads, ["cat", "dog"], prompts, volume_per_class=volume, rho=0.25, seed=4)
    assert [(r.seed, r.prompt) for r in again] == [(r.seed, r.prompt) for r in reqs]
    with pytest.raises(ValueError):
        plan_generation(uploads, ["cat", "dog"], prompts, volume_per_class={5: 1}, rho=0.25, seed=4)


# ------------------------------------------------------------------------------------------------
# the whole chain with tiny components


def _pixels(path):
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


def test_whole_chain_writes_an_imagefolder_resumably(tiny_sd, tmp_path):
    from torchvision.datasets import ImageFolder

    names = ["apple_pie", "dog"]
    uploads = client_uploads(tiny_sd, two_clients(), timestep=None, max_timestep=600, seed=10)
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
            "path": req.relpath,
            "class": req.class_name,
            "label": req.label,
            "client": req.client,
            "centroid_index": req.centroid_index,
            "prompt": req.prompt,
            "timestep": req.timestep,
            "start_timestep": row["start_timestep"],
            "seed": req.seed,
        }
        assert row["start_timestep"] >= req.timestep
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


def _torch_bf16_attention_broken() -> str | None:
    """torch 2.14's CPU bfloat16 attention over 77 tokens (the text encoder's) raises "pack_vnni2 is only
    supported when avx512 is supported" when ``ATEN_CPU_CAPABILITY`` forces AVX2 or no vector kernels on an
    AVX-512 CPU: its flash kernel picks VNNI packing from the hardware, the dispatched kernel from the
    switch. A bug of torch's emulation switch (a real AVX2 CPU takes the other path), shown here on torch
    alone; returns torch's message when it happens."""
    q = torch.zeros(1, 1, 77, 32, dtype=torch.bfloat16)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    except RuntimeError as err:
        return str(err)
    return None


def test_bfloat16_networks_give_close_images(tmp_path):
    from fl_lightning.models.diffusion import tiny_diffusion_components

    broken = _torch_bf16_attention_broken()
    if broken:
        pytest.skip(f"torch's own bf16 attention fails on this kernel switch: {broken}")

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


# ------------------------------------------------------------------------------------------------
# distinct samples: tiny SD at λ = 1


def _mad_matrix(folder):
    """Mean absolute pixel difference between every two PNGs under ``folder``, in 0..255 units."""
    files = sorted(p for p in folder.rglob("*.png"))
    px = np.stack([_pixels(f).astype(np.float64).ravel() for f in files])
    mad = np.abs(px[:, None, :] - px[None, :, :]).mean(-1)
    np.fill_diagonal(mad, np.inf)
    return files, mad


def test_every_image_is_its_own_sample_and_reproducible(tiny_sd, tmp_path):
    """λ = 1 with Z = 2 centroids and 2 prompts per class: far more images per (client, class) than
    distinct (centroid, prompt) inputs, and small classes that upload their mean only. ≥ 95% of the
    images have no near-duplicate (mean |Δpixel| < 2/255) among all others; the same seed gives
    bit-identical files; another seed gives other images from the same uploads."""

    data = {0: {0: random_images(9, 0), 1: random_images(2, 1)}, 1: {0: random_images(3, 2), 1: random_images(8, 3)}}
    uploads = client_uploads(tiny_sd, data, timestep=400, max_timestep=999, seed=20)
    assert [u.mean_only for u in uploads[0]] == [False, True]  # client 0, class 1: 2 ≤ Z samples
    names = ["cat", "dog"]
    volume = synthetic_volume(class_totals(uploads), 1.0)
    assert sum(volume.values()) == 22
    prompts = TemplatePromptExpander(seed=0).expand(names, 2)
    kw = dict(batch_size=8, num_inference_steps=10, guidance_scale=2.0, progress=False)

    def run(folder, seed):
        reqs = plan_generation(uploads, names, prompts, volume_per_class=volume, rho=0.7, seed=seed)
        generate_images(tiny_sd, reqs, folder, **kw)
        return reqs

    reqs = run(tmp_path / "a", 0)
    inputs = {(r.client, r.label, r.centroid_index, r.prompt) for r in reqs}
    assert len(inputs) < 0.6 * len(reqs)  # without per-image noise most images would be copies
    files, mad = _mad_matrix(tmp_path / "a")
    assert len(files) == len(reqs)
    distinct = (mad.min(1) >= 2.0).mean()
    assert distinct >= 0.95, f"only {distinct:.0%} of images are near-distinct (closest pair {mad.min():.2f}/255)"

    run(tmp_path / "b", 0)
    for f in files:
        assert (tmp_path / "b" / f.relative_to(tmp_path / "a")).read_bytes() == f.read_bytes()
    run(tmp_path / "c", 1)
    moved = [np.abs(_pixels(tmp_path / "c" / f.relative_to(tmp_path / "a")) - _pixels(f)).mean() for f in files]
    assert np.mean(np.array(moved) >= 2.0) >= 0.95


def test_ranks_dealt_the_batches_write_the_images_of_one_process(tiny_sd, tmp_path):
    """Three ranks (run here one after the other) write the very files one process writes, and one manifest."""
    names = ["apple_pie", "dog"]
    uploads = client_uploads(tiny_sd, two_clients(), timestep=None, max_timestep=600, seed=10)
    prompts = TemplatePromptExpander(seed=0).expand(names, 3)
    reqs = plan_generation(uploads, names, prompts, volume_per_class={0: 4, 1: 5}, rho=0.8, seed=1)
    kw = dict(batch_size=2, num_inference_steps=4, guidance_scale=2.0, device="cpu", progress=False)
    generate_images(tiny_sd, reqs, tmp_path / "one", **kw)
    generate_images(tiny_sd, reqs, tmp_path / "three", rank=1, world=3, **kw)
    assert not (tmp_path / "three" / MANIFEST_NAME).exists()  # rank 0 writes it
    for rank in (2, 0):
        generate_images(tiny_sd, reqs, tmp_path / "three", rank=rank, world=3, **kw)
    one = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.png"))
    assert one == sorted(p.relative_to(tmp_path / "three") for p in (tmp_path / "three").rglob("*.png"))
    assert len(one) == 9
    for rel in one:
        assert (tmp_path / "one" / rel).read_bytes() == (tmp_path / "three" / rel).read_bytes(), rel
    assert (tmp_path / "one" / MANIFEST_NAME).read_text() == (tmp_path / "three" / MANIFEST_NAME).read_text()


class _HalfOverflowVAE(torch.nn.Module):
    """A VAE whose float16 decode overflows on latents with a large first value (as SD's can)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.config = SimpleNamespace(scaling_factor=1.0)
        self.calls = []

    @property
    def dtype(self):
        return self.w.dtype

    def decode(self, z, return_dict=False):
        self.calls.append((z.dtype, z.shape[0]))
        x = (z[:, :3].float() * self.w.float()).tanh()
        if z.dtype == torch.float16:
            x[z[:, 0, 0, 0] > 10] = float("inf")
        return (x.to(z.dtype),)


def test_a_non_finite_half_decode_is_decoded_again_in_float32_that_image_alone():
    vae = _HalfOverflowVAE().to(torch.float16)
    z = torch.zeros(3, 4, 2, 2)
    z[1, 0, 0, 0] = 20.0
    z[2] = 0.5
    images = decode_latents(vae, z)
    assert torch.isfinite(images).all() and vae.dtype == torch.float16
    assert vae.calls == [(torch.float16, 3), (torch.float32, 1)]
    expected_half = ((torch.full((3, 2, 2), 0.5).half().float().tanh().half().float() + 1) / 2).clamp(0, 1)
    assert torch.equal(images[2], expected_half)  # a finite image keeps its half-precision decode


def test_a_failed_image_write_is_raised_after_the_loop(tmp_path):
    from fl_lightning.synthesis.generate import _Writer

    writer = _Writer(depth=1)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the class folder should be")
    writer.put(torch.zeros(3, 2, 2), blocked / "0.png")
    with pytest.raises(OSError):
        writer.put(torch.zeros(3, 2, 2), tmp_path / "ok" / "1.png")
        writer.close()
