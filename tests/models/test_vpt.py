"""PromptedViT (VPT-shallow, FedOPAL Eq. (4)-(5)): where the prompts go, what trains, P_init."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fl_lightning.models.backbones import LIBRARIES, build_tiny_backbone
from fl_lightning.models.vpt import PromptedViT, init_prompts, prompt_init_bound

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("library", LIBRARIES)
def test_zero_prompts_give_exactly_the_backbone_features(library):
    backbone = build_tiny_backbone(library).freeze()
    model = PromptedViT(backbone, num_prompts=0)
    with torch.no_grad():
        assert torch.equal(model(IMAGES), backbone(IMAGES))


@pytest.mark.parametrize(
    "library,overrides",
    [("open_clip", None), ("timm", None), ("timm", {"reg_tokens": 2})],
    ids=["open_clip", "timm", "timm-registers"],
)
def test_prompts_sit_right_after_the_prefix_tokens(library, overrides):
    backbone = build_tiny_backbone(library, overrides=overrides)
    model = PromptedViT(backbone, num_prompts=3, seed=2)
    seen = {}
    original_encode = backbone.encode

    def spy(tokens):
        seen["tokens"] = tokens.detach().clone()
        return original_encode(tokens)

    backbone.encode = spy  # instance attribute shadows the method: records encode's input
    with torch.no_grad():
        model(IMAGES)
        embedded = backbone.embed(IMAGES)  # (B, n + L, D)
    tokens, n, M = seen["tokens"], backbone.num_prefix_tokens, 3
    assert tokens.shape == (2, n + M + 16, 64)  # (B, n + M + L, D)
    assert torch.equal(tokens[:, :n], embedded[:, :n])
    for b in range(2):
        assert torch.equal(tokens[b, n : n + M], model.prompts.detach())
    assert torch.equal(tokens[:, n + M :], embedded[:, n:])


@pytest.mark.parametrize("library", LIBRARIES)
def test_gradients_reach_only_the_prompts(library):
    model = PromptedViT(build_tiny_backbone(library), num_prompts=4)
    model.train()
    model(IMAGES).square().sum().backward()
    assert model.prompts.grad is not None and model.prompts.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in model.backbone.parameters())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["prompts"]


@pytest.mark.parametrize("library", LIBRARIES)
def test_prompts_change_the_features(library):
    backbone = build_tiny_backbone(library)
    with torch.no_grad():
        assert not torch.allclose(PromptedViT(backbone, num_prompts=2)(IMAGES), backbone(IMAGES))


def test_prompt_init_is_the_vpt_xavier_uniform_and_seeded():
    backbone = build_tiny_backbone("timm")
    a = PromptedViT(backbone, num_prompts=10, seed=0).get_prompts()
    b = PromptedViT(build_tiny_backbone("timm", seed=9), num_prompts=10, seed=0).get_prompts()
    c = PromptedViT(backbone, num_prompts=10, seed=1).get_prompts()
    assert a.shape == (10, 64)
    assert torch.equal(a, b) and not torch.equal(a, c)  # same seed → same P_init on every client
    v = math.sqrt(6.0 / (3 * 8 * 8 + 64))  # VPT: 6 / (3 · prod(patch) + D)
    assert prompt_init_bound(patch_size=8, width=64) == pytest.approx(v)
    assert a.abs().max() <= v and a.abs().max() > 0.8 * v
    # uniform(−v, v): mean 0, variance v²/3 (loose bounds for 4000 draws)
    big = init_prompts(num_prompts=100, patch_size=8, width=40, seed=3).double().numpy()
    vb = prompt_init_bound(patch_size=8, width=40)
    assert abs(big.mean()) < 0.05 * vb
    assert np.var(big) == pytest.approx(vb**2 / 3, rel=0.1)


def test_set_and_get_prompts():
    model = PromptedViT(build_tiny_backbone("open_clip"), num_prompts=3)
    parameter = model.prompts
    new = torch.randn(3, 64)
    model.set_prompts(new)
    assert model.prompts is parameter and torch.equal(model.get_prompts(), new)
    copy = model.get_prompts()
    copy.zero_()
    assert torch.equal(model.prompts.detach(), new)  # get_prompts returns a copy
    with pytest.raises(ValueError):
        model.set_prompts(torch.zeros(4, 64))
