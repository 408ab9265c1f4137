"""Tests for fl_lightning.modules.lora_classifier: one model, many clients, different depths."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.models.lora import lora_layer_index
from fl_lightning.modules.lora_classifier import LoRAClassifier
from tests.modules.tiny_vit import lora_classifier, nonzero_lora
from tests.outcomes import expect, outcome_seed

DEPTH = 3


def make(seed: int = 0, **kwargs) -> LoRAClassifier:
    return lora_classifier(4, depth=DEPTH, seed=seed, **kwargs)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 3])


def test_all_blocks_have_lora_and_everything_trains_by_default():
    module = make()
    assert module.num_blocks == DEPTH and module.trained_blocks == [0, 1, 2]
    assert {lora_layer_index(k) for k in module.lora_state()} == {0, 1, 2}
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert all(".lora_" in n or ".head." in n for n in trainable)
    assert any(n.endswith("head.weight") for n in trainable)


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_gradients_only_for_trained_depth_and_head(depth):
    module = make()
    nonzero_lora(module)
    module.set_depth(DEPTH)
    module.training_step(batch(), 0).backward()  # stale gradients everywhere, as a previous client leaves them
    trained = module.set_depth(depth)
    assert trained == list(range(DEPTH - depth, DEPTH)) == module.trained_blocks
    optimizer = module.configure_optimizers()
    optimizer.zero_grad(set_to_none=True)
    module.training_step(batch(1), 0).backward()
    for name, param in module.named_parameters():
        should = ".head." in name or (".lora_" in name and lora_layer_index(name) in trained)
        assert (param.grad is not None) == should, name
        if should:
            assert param.grad.abs().sum() > 0, name
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.parameters() if p.requires_grad}


def test_one_step_changes_only_trained_blocks_and_head():
    module = make()
    nonzero_lora(module)
    module.set_depth(1)
    before_lora, before_head = module.lora_state(), module.head_state()
    backbone_before = module.model.base_model.model.blocks[2].attn.qkv.base_layer.weight.clone()
    optimizer = module.configure_optimizers()
    module.training_step(batch(), 0).backward()
    optimizer.step()
    after = module.lora_state()
    for key in after:
        assert torch.equal(after[key], before_lora[key]) == (lora_layer_index(key) != 2), key
    assert not torch.equal(module.head_state()["head.weight"], before_head["head.weight"])
    assert torch.equal(module.model.base_model.model.blocks[2].attn.qkv.base_layer.weight, backbone_before)


def test_upload_keys_match_global_keys_across_depths():
    module = make()
    global_keys = set(module.lora_state())
    for depth in range(1, DEPTH + 1):
        module.set_depth(depth)
        upload = module.lora_state(trained_only=True)
        assert set(upload) <= global_keys
        assert {lora_layer_index(k) for k in upload} == set(range(DEPTH - depth, DEPTH))


def test_state_swap_between_clients_reproduces_outputs():
    a, b = make(seed=0), make(seed=0)
    nonzero_lora(a, seed=5)
    b.load_lora_state(a.lora_state())
    b.load_head_state(a.head_state())
    a.eval(), b.eval()
    x, _ = batch(2)
    torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)


def test_head_state_round_trip_and_bad_keys():
    module = make()
    state = {k: torch.full_like(v, 0.5) for k, v in module.head_state().items()}
    assert set(state) == {"head.weight", "head.bias"}
    module.load_head_state(state)
    assert torch.all(module.head.weight == 0.5)
    with pytest.raises(ValueError, match="does not start"):
        module.load_head_state({"fc.weight": state["head.weight"]})


@pytest.mark.parametrize(("kwargs", "key"), [(dict(lr=0.0), "lr"), (dict(head_name="fc"), "head_name")])
def test_bad_arguments(kwargs, key):
    with pytest.raises(ValueError, match=key):
        make(**kwargs)


def test_bad_depth():
    with pytest.raises(ValueError, match="depth"):
        make().set_depth(DEPTH + 1)


@pytest.mark.outcome
def test_lora_adapters_alone_fit_a_small_task():
    """With the head and the backbone frozen, the LoRA adapters alone must learn: 40 AdamW steps on 32
    images whose class shifts their mean take the training loss well below where it started, and the
    training accuracy well above chance (0.25). A LoRA that stopped learning (no gradient reaching the
    adapters, B stuck at zero, the optimizer missing them) leaves both where they were.

    Measured (seeds 0-3, AVX-512, 1 thread): loss ratio 0.63-0.73, accuracy 1.0 from 0.09-0.31 before; the
    frozen random head caps how far the loss falls. Bounds: ratio < 0.85, accuracy > 0.6."""
    module = make(seed=outcome_seed(), lr=1e-2)
    module.head.requires_grad_(False)
    g = torch.Generator().manual_seed(outcome_seed())
    y = torch.arange(32) % 4
    x = torch.randn(32, 3, 16, 16, generator=g) + (y.float() - 1.5).view(-1, 1, 1, 1)
    optimizer = module.configure_optimizers()
    assert {id(p) for group in optimizer.param_groups for p in group["params"]} == {
        id(p) for n, p in module.named_parameters() if ".lora_" in n
    }
    with torch.no_grad():
        first = float(module.training_step((x, y), 0))
    for step in range(40):
        optimizer.zero_grad()
        module.training_step((x, y), step).backward()
        optimizer.step()
    with torch.no_grad():
        logits = module(x)
    expect("training loss after 40 LoRA-only steps / first", float(F.cross_entropy(logits, y)) / first, "<", 0.85)
    expect("training accuracy after 40 LoRA-only steps", float((logits.argmax(1) == y).float().mean()), ">", 0.6)
