"""The client's VAE encoding in half precision: the fp32 redo of non-finite images, the device-side resize."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from fl_lightning.federation.precision import compute_dtype
from fl_lightning.synthesis.latents import client_latent_uploads, encode_images, vae_inputs


class _HalfOverflowVAE(nn.Module):
    """A stub encoder: a 1×1 convolution whose posterior mean is +inf, in any dtype but float32, for every image
    whose mean value passes 0.5 (as SD's encoder overflows in fp16 on some images)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.config = SimpleNamespace(scaling_factor=0.5)
        self.calls: list[tuple[torch.dtype, int]] = []

    @property
    def device(self) -> torch.device:
        return self.conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.conv.weight.dtype

    def encode(self, x: torch.Tensor) -> SimpleNamespace:
        h = self.conv(x)
        self.calls.append((h.dtype, x.shape[0]))
        if h.dtype != torch.float32:
            bright = x.float().flatten(1).mean(dim=1) > 0.0  # x in [-1, 1]: image mean above 0.5
            h = torch.where(bright.view(-1, 1, 1, 1), torch.full_like(h, float("inf")), h)
        return SimpleNamespace(latent_dist=SimpleNamespace(mean=h))


def _images() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 8, 8, generator=g) * 0.4  # dark: mean < 0.5
    x[[1, 4]] += 0.55  # bright: these overflow in half precision
    return x


def test_half_encode_redoes_non_finite_images_alone_in_float32():
    vae = _HalfOverflowVAE()
    weights = {k: v.clone() for k, v in vae.state_dict().items()}
    x = _images()
    z = encode_images(vae, x, batch_size=6, dtype=torch.bfloat16)
    assert torch.isfinite(z).all() and z.dtype == torch.float32
    assert vae.calls == [(torch.bfloat16, 6), (torch.float32, 2)]  # one half call, then the two bad images in fp32
    with torch.no_grad():
        full = vae.conv(x * 2 - 1) * 0.5
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = vae.conv(x * 2 - 1).float() * 0.5
    good = [0, 2, 3, 5]
    assert torch.equal(z[[1, 4]], full[[1, 4]])  # redone in float32
    assert torch.equal(z[good], half[good])  # the others keep their half-precision values
    assert not torch.equal(z[good], full[good])  # (they are half precision: not the float32 values)
    assert vae.dtype == torch.float32 and all(torch.equal(v, vae.state_dict()[k]) for k, v in weights.items())


def test_a_half_vae_is_cast_to_float32_for_the_redo_and_back():
    vae = _HalfOverflowVAE().to(torch.bfloat16)
    weights = {k: v.clone() for k, v in vae.state_dict().items()}
    z = encode_images(vae, _images(), batch_size=3)  # dtype None: the VAE's own (bf16)
    assert torch.isfinite(z).all()
    assert vae.calls == [(torch.bfloat16, 3), (torch.float32, 1), (torch.bfloat16, 3), (torch.float32, 1)]
    assert vae.dtype == torch.bfloat16 and all(torch.equal(v, vae.state_dict()[k]) for k, v in weights.items())


def test_float32_encode_is_never_redone_and_unchanged():
    vae = _HalfOverflowVAE()
    x = _images()
    z = encode_images(vae, x, batch_size=4, dtype=torch.float32)
    assert vae.calls == [(torch.float32, 4), (torch.float32, 2)]
    assert torch.equal(z, encode_images(vae, x, batch_size=4))  # dtype None on a float32 VAE: the same path


def test_uploads_carry_the_dtype_through(tiny_sd):
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    kw = dict(num_centroids=2, timestep=300, max_timestep=600, seed=3)
    a = client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, {0: images}, **kw)
    b = client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, {0: images}, dtype=torch.float32, **kw)
    # the math attention kernel: the CPU flash kernel's bf16 path needs AVX-512 at run time, and refuses to run
    # on an AVX-512 CPU held to AVX2 (ATEN_CPU_CAPABILITY=avx2); a GPU uses its own kernels
    with sdpa_kernel(SDPBackend.MATH):
        c = client_latent_uploads(tiny_sd.vae, tiny_sd.scheduler, {0: images}, dtype=torch.bfloat16, **kw)
    assert torch.equal(a[0].mean, b[0].mean) and torch.equal(a[0].centroids, b[0].centroids)
    assert torch.isfinite(c[0].mean).all() and not torch.equal(a[0].mean, c[0].mean)
    assert torch.allclose(a[0].mean, c[0].mean, atol=0.1)
    assert tiny_sd.vae.dtype == torch.float32


def test_vae_inputs_are_the_cpu_path_of_before_bit_for_bit():
    g = torch.Generator().manual_seed(2)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    images = torch.randn(5, 3, 12, 12, generator=g)
    # the CPU path this replaced (FeDiSynFamily.client_images)
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    old = (images * s + m).clamp(0, 1)
    assert torch.equal(vae_inputs(images, mean=mean, std=std), old)
    old = F.interpolate(old, size=(16, 16), mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)
    assert torch.equal(vae_inputs(images, mean=mean, std=std, size=16, device="cpu"), old)


@pytest.mark.parametrize(
    ("precision", "device", "dtype"),
    [
        ("32-true", "cpu", torch.float32),
        ("bf16-mixed", "cpu", torch.float32),
        ("16-mixed", "cpu", torch.float32),
        ("32-true", "cuda", torch.float32),
        ("bf16-mixed", "cuda", torch.bfloat16),
        ("16-mixed", "cuda", torch.float16),
        ("bf16-true", "cuda", torch.bfloat16),
        ("64-true", "cuda", torch.float32),
    ],
)
def test_compute_dtype(precision, device, dtype):
    assert compute_dtype(precision, device) == dtype
