"""Tests for fl_lightning.callbacks.contribution: G_i from LoRA gradients (estimates: tests/systems/test_contributions.py)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from fl_lightning.callbacks.contribution import GradientContribution
from fl_lightning.modules.lora_classifier import LoRAClassifier
from tests.modules.tiny_vit import lora_classifier, nonzero_lora


def make() -> LoRAClassifier:
    module = lora_classifier(3, depth=3, lr=1e-2)
    nonzero_lora(module, seed=1)
    return module


def test_matches_manual_squared_gradient_norms():
    module = make()
    module.set_depth(2)
    optimizer = module.configure_optimizers()
    callback = GradientContribution()
    callback.reset()
    manual: dict[int, list[float]] = {1: [], 2: []}
    for step in range(3):
        g = torch.Generator().manual_seed(10 + step)
        x, y = torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 0])
        optimizer.zero_grad(set_to_none=True)
        module.training_step((x, y), step).backward()
        callback.on_after_backward(module=module)
        # Independent reference: walk the modules, not the parameter names.
        for block in (1, 2):
            attn = module.model.base_model.model.blocks[block].attn
            total = 0.0
            for layer in (attn.qkv, attn.proj):
                for p in (layer.lora_A["default"].weight, layer.lora_B["default"].weight):
                    total += float(np.sum(p.grad.double().numpy() ** 2))
            manual[block].append(total)
        optimizer.step()
    per_layer = callback.per_layer()
    assert sorted(per_layer) == [1, 2]  # block 0 is frozen: no measurement
    for block, values in manual.items():
        assert per_layer[block] == pytest.approx(np.mean(values), rel=1e-12)
    assert callback.total() == pytest.approx(sum(np.mean(v) for v in manual.values()), rel=1e-12)
    assert callback.total() > 0


def test_reset_and_state_dict():
    module = make()
    callback = GradientContribution()
    assert callback.per_layer() == {} and callback.total() == 0.0
    module.training_step((torch.randn(2, 3, 16, 16), torch.tensor([0, 1])), 0).backward()
    callback.on_after_backward(module=module)
    restored = GradientContribution()
    restored.load_state_dict(callback.state_dict())
    assert restored.per_layer() == callback.per_layer() and len(callback.per_layer()) == 3
    callback.reset()
    assert callback.per_layer() == {} and callback.total() == 0.0


class _PerStepSyncReference:
    """The measurement as it was: a regex scan of every parameter name and one host sync per layer, every step."""

    def __init__(self) -> None:
        self.sums: dict[int, float] = {}
        self.steps = 0

    def on_after_backward(self, *, module) -> None:
        from fl_lightning.models.lora import is_lora_param, lora_layer_index

        step: dict[int, torch.Tensor] = {}
        for name, param in module.named_parameters():
            if param.grad is None or not is_lora_param(name):
                continue
            layer = lora_layer_index(name)
            sq = param.grad.detach().double().pow(2).sum()
            step[layer] = step[layer] + sq if layer in step else sq
        for layer, value in step.items():
            self.sums[layer] = self.sums.get(layer, 0.0) + float(value)
        self.steps += 1


def test_same_numbers_bit_for_bit_as_per_step_syncs_and_no_sync_while_training(monkeypatch):
    """Groups found once, sums kept on the device: per_layer is the per-step-sync reference exactly, across depths
    (a layer without gradients skipped) and a state_dict round trip mid-way; no tensor is read back in the hook."""
    module = make()
    optimizer = module.configure_optimizers()
    callback, reference = GradientContribution(), _PerStepSyncReference()
    for step, depth in enumerate([3, 3, 2, 1, 2, 3]):
        module.set_depth(depth)
        g = torch.Generator().manual_seed(20 + step)
        optimizer.zero_grad(set_to_none=True)
        module.training_step((torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 0])), step).backward()
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "__float__", lambda t: pytest.fail("a host sync in the hook"))
            m.setattr(torch.Tensor, "item", lambda t: pytest.fail("a host sync in the hook"))
            callback.on_after_backward(module=module)
        reference.on_after_backward(module=module)
        optimizer.step()
        if step == 3:  # a checkpoint's round trip mid-way continues the same sums
            restored = GradientContribution()
            restored.load_state_dict(callback.state_dict())
            callback = restored
    expected = {layer: total / reference.steps for layer, total in sorted(reference.sums.items())}
    assert callback.per_layer() == expected and sorted(expected) == [0, 1, 2]  # floats compared exactly
    assert callback.total() == float(sum(expected.values()))
