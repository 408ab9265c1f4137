"""Tests for fl_lightning.synthesis.latents: encoding, k-means centroids, noising, the upload."""

import dataclasses

import numpy as np
import pytest
import torch

from fl_lightning.synthesis.latents import (
    ClassLatentUpload,
    class_centroids,
    client_latent_uploads,
    encode_images,
    from_upload,
    noise_latents,
    to_upload,
)


def _images(n, seed):
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_encode_images_maps_to_minus_one_one_and_scales(tiny_sd):
    x = _images(5, 0)
    z = encode_images(tiny_sd.vae, x, batch_size=2)
    with torch.no_grad():
        ref = tiny_sd.vae.encode(x * 2 - 1).latent_dist.mean * 0.18215
    assert z.shape == (5, 4, 16, 16) and z.dtype == torch.float32
    assert torch.allclose(z, ref, atol=1e-5)
    assert torch.allclose(encode_images(tiny_sd.vae, x, batch_size=5), z, atol=1e-5)  # batching-invariant


def test_centroids_are_cluster_means_of_separated_clusters():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 2, 2, 2)) * 50.0
    members = [centres[c] + rng.normal(size=(10, 2, 2, 2)) * 0.1 for c in range(3)]
    latents = torch.from_numpy(np.concatenate(members)).float()
    centroids, mean = class_centroids(latents, num_centroids=3, seed=0)
    assert centroids.shape == (3, 2, 2, 2) and mean.shape == (2, 2, 2)
    # independent float64 reference: each true cluster's mean is matched by exactly one centroid
    ref = np.stack([m.mean(0) for m in members]).reshape(3, -1)
    got = centroids.double().reshape(3, -1).numpy()
    dist = ((ref[:, None] - got[None]) ** 2).sum(-1)
    assert sorted(dist.argmin(1).tolist()) == [0, 1, 2]
    assert dist.min(1).max() < 1e-6
    assert np.allclose(mean.double().numpy(), np.concatenate(members).mean(0), atol=1e-4)
    again, _ = class_centroids(latents, num_centroids=3, seed=0)
    assert torch.equal(again, centroids)


@pytest.mark.parametrize("n,num_centroids", [(4, 4), (4, 5), (4, 9), (1, 1), (2, 3)])
def test_small_class_sends_its_mean_only(n, num_centroids):
    """Privacy: with N ≤ Z, k-means' centroids would be the samples themselves; none are returned."""
    latents = torch.randn(n, 4, 3, 3, generator=torch.Generator().manual_seed(1))
    centroids, mean = class_centroids(latents, num_centroids=num_centroids, seed=0)
    assert centroids.shape == (0, 4, 3, 3) and centroids.dtype == latents.dtype
    assert torch.allclose(mean.double(), latents.double().mean(0), atol=1e-6)


def test_a_cluster_of_one_sample_is_never_uploaded_as_a_centroid():
    """Privacy: k-means over N > Z samples with an outlier leaves a singleton cluster, whose centroid is the
    sample itself; only the clusters of >= 2 samples leave the client (Z' < Z)."""
    rng = np.random.default_rng(0)
    tight = [rng.normal(size=(2, 2, 2)) * 50.0 + rng.normal(size=(6, 2, 2, 2)) * 0.1 for _ in range(2)]
    outlier = np.full((1, 2, 2, 2), 1e4)  # far from everything: k-means gives it its own cluster
    latents = torch.from_numpy(np.concatenate([*tight, outlier])).float()  # N = 13 > Z = 3
    centroids, mean = class_centroids(latents, num_centroids=3, seed=0)
    assert centroids.shape == (2, 2, 2, 2)  # the singleton's centroid is dropped
    got = centroids.double().reshape(2, -1).numpy()
    ref = np.stack([t.mean(0) for t in tight]).reshape(2, -1)
    assert ((ref[:, None] - got[None]) ** 2).sum(-1).min(1).max() < 1e-6  # the two real clusters' means
    assert (np.abs(got - outlier.reshape(1, -1)).max(1) > 1.0).all()  # no centroid is the lone sample
    assert torch.allclose(mean.double(), latents.double().mean(0), atol=1e-3)


def test_timestep_zero_is_refused_s_is_at_least_one(tiny_sd):
    """Privacy: s = 0 would upload an almost clean latent; the floor is s >= 1 (and >= min_timestep)."""
    imgs = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for kw in (dict(timestep=0), dict(timestep=None, min_timestep=0), dict(timestep=5, min_timestep=10)):
        with pytest.raises(ValueError, match="min_timestep|timestep"):
            client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, {0: imgs}, num_centroids=2, max_timestep=600, seed=0, **kw)
    ups = client_latent_uploads(
        tiny_sd.vae, tiny_sd.scheduler, {c: imgs for c in range(20)}, num_centroids=2, timestep=None, max_timestep=3, seed=0
    )
    assert {u.timestep for u in ups} <= {1, 2, 3}


def test_class_centroids_rejects_bad_z():
    x = torch.randn(3, 4, 2, 2)
    with pytest.raises(ValueError):
        class_centroids(x, num_centroids=0, seed=0)
    with pytest.raises(TypeError):
        class_centroids(x, num_centroids=2.0, seed=0)


def test_noise_latents_matches_forward_process(tiny_sd):
    sched = tiny_sd.scheduler
    x = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    # independent float64 reference: alphā from the scaled_linear betas
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
    abar = torch.cumprod(1 - betas, 0)
    for t in (0, 250, 999):
        noised = noise_latents(sched, x, t, torch.Generator().manual_seed(7))
        eps = torch.randn(x.shape, generator=torch.Generator().manual_seed(7))
        ref = abar[t].sqrt() * x.double() + (1 - abar[t]).sqrt() * eps.double()
        assert torch.allclose(noised.double(), ref, atol=1e-5)
    # timestep 0 is almost the identity: relative change ≈ sqrt(1 − ᾱ_0) ≈ 0.03
    near = noise_latents(sched, x, 0, torch.Generator().manual_seed(7))
    assert (near - x).norm() / x.norm() < 0.05
    far = noise_latents(sched, x, 999, torch.Generator().manual_seed(7))
    assert (far - x).norm() / x.norm() > 1.0
    with pytest.raises(ValueError):
        noise_latents(sched, x, 1000, None)


def _client_data():
    return {0: _images(5, 10), 1: _images(2, 11)}  # class 1 has 2 ≤ Z = 3 samples: mean only


def test_upload_holds_only_noised_summaries(tiny_sd):
    data = _client_data()
    uploads = client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, data, num_centroids=3, timestep=400, max_timestep=999, seed=5)
    names = {f.name for f in dataclasses.fields(ClassLatentUpload)}
    assert names == {"label", "count", "timestep", "centroids", "mean"}
    abar = float(tiny_sd.scheduler.alphas_cumprod[400])
    assert [u.label for u in uploads] == [0, 1]
    for up in uploads:
        imgs = data[up.label]
        clean = encode_images(tiny_sd.vae, imgs)
        c_clean, m_clean = class_centroids(clean, num_centroids=3, seed=5)
        assert up.count == len(imgs) and up.timestep == 400
        z_sent = c_clean.shape[0]  # the clusters of >= 2 samples (0 for a class of <= Z samples)
        assert up.centroids.shape == (z_sent, 4, 16, 16) and up.mean.shape == (4, 16, 16)
        assert up.num_centroids == z_sent and up.mean_only == (z_sent == 0)
        assert up.centroids.device.type == "cpu"
        # every tensor sent is a noised latent-space summary, never an image or a clean latent
        for tensor in (up.centroids, up.mean):
            assert tensor.shape[-3:] != imgs.shape[-3:]
        sent = torch.cat([up.centroids, up.mean[None]])
        clean_sum = torch.cat([c_clean, m_clean[None]])
        implied_eps = (sent - abar**0.5 * clean_sum) / (1 - abar) ** 0.5
        assert abs(implied_eps.mean().item()) < 0.1 and abs(implied_eps.std().item() - 1) < 0.1
        for z in clean:
            assert (sent - z).flatten(1).norm(dim=1).min() > 1.0
        assert up.num_bytes == sent.numel() * 4 + 4 * 8
    # packed for the transport layer: same bytes, nothing added, lossless
    packed = to_upload(uploads)
    assert packed.num_bytes == sum(u.num_bytes for u in uploads)
    assert set(packed.tensors) == {f"class{u.label}.{n}" for u in uploads for n in ("centroids", "mean")}
    assert 0 < packed.meta["class0.num_centroids"] == uploads[0].num_centroids <= 3  # singleton clusters dropped
    assert packed.meta["class1.num_centroids"] == 0
    for a, b in zip(from_upload(packed), uploads, strict=True):
        assert (a.label, a.count, a.timestep) == (b.label, b.count, b.timestep)
        assert torch.equal(a.centroids, b.centroids) and torch.equal(a.mean, b.mean)


def test_small_class_upload_never_holds_a_per_sample_latent(tiny_sd):
    """A class with ≤ Z samples sends one tensor, the noised mean: no sent tensor is closer to a
    sample's noised latent than noise allows, and the packed upload says it is mean-only."""
    imgs = torch.stack([torch.full((3, 32, 32), v) for v in (0.0, 0.5, 1.0)])  # far-apart samples
    ups = client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, {4: imgs}, num_centroids=3, timestep=1, max_timestep=999, seed=1)
    (up,) = ups
    assert up.mean_only and up.count == 3 and up.centroids.numel() == 0
    clean = encode_images(tiny_sd.vae, imgs)
    # at s = 1 (the floor) the noise is small (σ ≈ 0.04): the sent tensor is the noised mean, not a noised sample
    abar = float(tiny_sd.scheduler.alphas_cumprod[1])
    implied = lambda x0: (up.mean - abar**0.5 * x0) / (1 - abar) ** 0.5  # noqa: E731
    assert abs(implied(clean.mean(0)).std().item() - 1) < 0.05  # sampling error of a std over 1024 values ≈ 0.02
    assert min(implied(z).std().item() for z in clean) > 1.05  # ~1.08 at s = 1
    packed = to_upload(ups)
    assert packed.meta["class4.num_centroids"] == 0
    assert packed.num_bytes == up.mean.numel() * 4 + 4 * 8
    (back,) = from_upload(packed)
    assert back.mean_only and torch.equal(back.mean, up.mean)
    packed.meta["class4.num_centroids"] = 2  # a record that disagrees with the tensors is refused
    with pytest.raises(ValueError):
        from_upload(packed)


def test_batches_input_equals_dict_input(tiny_sd):
    data = _client_data()
    images = torch.cat([data[0], data[1]])
    labels = torch.tensor([0] * 5 + [1] * 2)
    perm = torch.tensor([0, 5, 1, 2, 6, 3, 4])  # interleave classes across batches, keep per-class order
    order = torch.cat([torch.nonzero(labels[perm] == c).flatten() for c in (0, 1)])
    assert torch.equal(perm[order], torch.arange(7))
    batches = [(images[perm[i : i + 3]], labels[perm[i : i + 3]]) for i in range(0, 7, 3)]
    kw = dict(num_centroids=2, timestep=None, max_timestep=300, seed=9)
    a = client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, data, **kw)
    b = client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, batches, **kw)
    for ua, ub in zip(a, b, strict=True):
        assert (ua.label, ua.count, ua.timestep) == (ub.label, ub.count, ub.timestep)
        assert torch.allclose(ua.centroids, ub.centroids, atol=1e-4)
        assert torch.allclose(ua.mean, ub.mean, atol=1e-4)


def test_random_timestep_is_seeded_and_in_range(tiny_sd):
    data = {0: _images(2, 1), 1: _images(2, 2), 2: _images(2, 3)}
    draws = []
    for seed in range(4):
        ups = client_latent_uploads(
            tiny_sd.vae, tiny_sd.scheduler, data, num_centroids=2, timestep=None, max_timestep=50, seed=seed
        )
        again = client_latent_uploads(
            tiny_sd.vae, tiny_sd.scheduler, data, num_centroids=2, timestep=None, max_timestep=50, seed=seed
        )
        assert [u.timestep for u in ups] == [u.timestep for u in again]
        assert all(torch.equal(u.centroids, v.centroids) for u, v in zip(ups, again))
        draws += [u.timestep for u in ups]
    assert all(0 <= t <= 50 for t in draws) and len(set(draws)) > 3
    with pytest.raises(ValueError):
        client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, data, num_centroids=2, timestep=None, max_timestep=1000, seed=0)
