"""Tests for fl_lightning.models.lora: where adapters go, what trains, the wire format."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import timm
import torch

from fl_lightning.models.lora import (
    LoraSpec,
    apply_lora,
    get_lora_state,
    last_blocks,
    lora_bits_per_layer,
    lora_layer_index,
    lora_layer_indices,
    lora_state_by_layer,
    set_lora_state,
    set_trainable_depth,
)

DEPTH, DIM, RANK = 4, 32, 2
SPEC = LoraSpec(rank=RANK, alpha=4)


def tiny_vit(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        num_classes=3,
        img_size=16,
        patch_size=8,
        embed_dim=DIM,
        depth=DEPTH,
        num_heads=2,
    )


def lora_names(model: torch.nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters() if ".lora_" in n]


def backward_once(model: torch.nn.Module, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 16, 16, generator=g)
    model(x).square().sum().backward()


def randomize_lora(model: torch.nn.Module, seed: int) -> None:
    # peft initialises lora_B to zero, which would make gradients of lora_A vanish; perturb all.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g))


@pytest.mark.parametrize(("num", "depth", "expected"), [(0, 4, []), (1, 4, [3]), (3, 12, [9, 10, 11]), (4, 4, [0, 1, 2, 3])])
def test_last_blocks(num, depth, expected):
    assert last_blocks(num, depth) == expected


@pytest.mark.parametrize("num", [-1, 5])
def test_last_blocks_rejects_out_of_range(num):
    with pytest.raises(ValueError, match="depth"):
        last_blocks(num, 4)


@pytest.mark.parametrize("bad", [dict(rank=0), dict(alpha=0), dict(dropout=1.0), dict(target_modules=())])
def test_spec_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        LoraSpec(**bad)


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("base_model.model.blocks.7.attn.qkv.lora_A.default.weight", 7),
        ("model.base_model.model.blocks.12.mlp.fc1.lora_B.default.weight", 12),
        ("transformer.resblocks.3.attn.lora_A.default.weight", 3),
        ("blocks.0.attn.proj.lora_A.weight", 0),
    ],
)
def test_lora_layer_index(name, index):
    assert lora_layer_index(name) == index


def test_lora_layer_index_rejects_name_without_block():
    with pytest.raises(ValueError, match="no block index"):
        lora_layer_index("head.weight")


@pytest.mark.parametrize("layers", [[3], [1, 3], [0, 1, 2, 3]])
def test_adapters_only_in_chosen_blocks(layers):
    model = apply_lora(tiny_vit(), spec=SPEC, layers=layers)
    names = lora_names(model)
    assert lora_layer_indices(model) == layers
    # qkv and proj in each chosen block, A and B each, and nothing in patch_embed.proj or the head.
    assert len(names) == 4 * len(layers)
    assert not any("patch_embed" in n or "head" in n for n in names)
    assert {n.split(".lora_")[0].split(".", 4)[-1] for n in names} == {"attn.qkv", "attn.proj"}


def test_apply_lora_refuses_empty_layers():
    with pytest.raises(ValueError, match="layers"):
        apply_lora(tiny_vit(), spec=SPEC, layers=[])


def test_layers_to_transform_variant_trains_only_its_blocks():
    model = apply_lora(tiny_vit(), spec=SPEC, layers=[2, 3])
    randomize_lora(model, seed=0)
    backward_once(model)
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == set(lora_names(model))
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in with_grad)


@pytest.mark.parametrize("depth", [0, 1, 3, 4])
def test_set_trainable_depth_gradients_only_in_last_blocks(depth):
    model = apply_lora(tiny_vit(), spec=SPEC, layers=None)
    randomize_lora(model, seed=0)
    assert set_trainable_depth(model, DEPTH) == [0, 1, 2, 3]
    backward_once(model)  # a stale gradient in every block, as a previous client would leave it
    trained = set_trainable_depth(model, depth)
    assert trained == list(range(DEPTH - depth, DEPTH))
    for name, param in model.named_parameters():
        assert param.requires_grad == (".lora_" in name and lora_layer_index(name) in trained), name
    if depth > 0:  # with depth 0 nothing in this bare model trains, so there is no backward pass
        backward_once(model, seed=2)
    for name, param in model.named_parameters():
        if ".lora_" in name and lora_layer_index(name) in trained:
            assert param.requires_grad and param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert param.grad is None, name  # frozen adapters and the backbone: no gradient at all


def test_state_round_trip_and_partial_load():
    source = apply_lora(tiny_vit(), spec=SPEC, layers=None)
    randomize_lora(source, seed=3)
    state = get_lora_state(source)
    assert all(k.startswith("blocks.") and ".lora_" in k and ".default." not in k for k in state)

    target = apply_lora(tiny_vit(), spec=SPEC, layers=None)
    randomize_lora(target, seed=4)
    before = get_lora_state(target)
    partial = get_lora_state(source, layers=[1, 3])
    assert {lora_layer_index(k) for k in partial} == {1, 3}
    set_lora_state(target, partial)
    after = get_lora_state(target)
    for key in state:
        expected = state[key] if lora_layer_index(key) in (1, 3) else before[key]
        torch.testing.assert_close(after[key], expected, rtol=0, atol=0)

    set_lora_state(target, state)
    x = torch.randn(2, 3, 16, 16)
    source.eval(), target.eval()
    torch.testing.assert_close(target(x), source(x))  # same backbone seed + same LoRA = same function


def test_state_is_a_copy():
    model = apply_lora(tiny_vit(), spec=SPEC, layers=None)
    state = get_lora_state(model)
    key = next(iter(state))
    state[key].add_(1.0)
    assert not torch.equal(get_lora_state(model)[key], state[key])


def test_wire_keys_identical_across_depths():
    full = get_lora_state(apply_lora(tiny_vit(), spec=SPEC, layers=None))
    for num in range(1, DEPTH + 1):
        layers = last_blocks(num, DEPTH)
        by_transform = get_lora_state(apply_lora(tiny_vit(), spec=SPEC, layers=layers))
        assert set(by_transform) == {k for k in full if lora_layer_index(k) in layers}
        model = apply_lora(tiny_vit(), spec=SPEC, layers=None)
        set_trainable_depth(model, num)
        assert set(get_lora_state(model, layers=layers)) == set(by_transform)


def test_set_lora_state_rejects_blocks_the_model_lacks():
    full = get_lora_state(apply_lora(tiny_vit(), spec=SPEC, layers=None))
    shallow = apply_lora(tiny_vit(), spec=SPEC, layers=[3])
    with pytest.raises(ValueError, match="lacks"):
        set_lora_state(shallow, full)


def test_state_by_layer_and_bits():
    state = get_lora_state(apply_lora(tiny_vit(), spec=SPEC, layers=[1, 2]))
    grouped = lora_state_by_layer(state)
    assert list(grouped) == [1, 2]
    assert all(len(v) == 4 for v in grouped.values())
    # qkv: A (r, D) + B (3D, r); proj: A (r, D) + B (D, r)
    params = RANK * DIM + 3 * DIM * RANK + RANK * DIM + DIM * RANK
    assert lora_bits_per_layer(state) == 32 * params
    assert lora_bits_per_layer(state, bits_per_param=16) == 16 * params


def test_bits_rejects_uneven_or_empty_state():
    with pytest.raises(ValueError, match="empty"):
        lora_bits_per_layer({})
    uneven = {"blocks.0.attn.qkv.lora_A.weight": torch.zeros(2, 3), "blocks.1.attn.qkv.lora_A.weight": torch.zeros(2, 4)}
    with pytest.raises(ValueError, match="differ"):
        lora_bits_per_layer(uneven)
