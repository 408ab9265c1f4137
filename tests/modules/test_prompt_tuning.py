"""PromptTuningModule: cross-entropy of the temporary head; only prompts and head are optimised."""

from __future__ import annotations

import lightning
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.callbacks.proximal import ProximalCallback
from fl_lightning.models.backbones import LIBRARIES, build_tiny_backbone
from fl_lightning.models.vpt import PromptedViT
from fl_lightning.modules.prompt_tuning import PromptTuningModule
from tests.outcomes import expect, outcome_seed

_gen = torch.Generator().manual_seed(0)
IMAGES = torch.randn(8, 3, 32, 32, generator=_gen)
LABELS = torch.randint(0, 4, (8,), generator=_gen)


def _module(library: str = "timm", **kwargs) -> PromptTuningModule:
    kwargs.setdefault("lr", 0.05)
    return PromptTuningModule(model=PromptedViT(build_tiny_backbone(library), num_prompts=4), num_classes=4, **kwargs)


@pytest.mark.parametrize("library", LIBRARIES)
def test_training_step_is_the_head_cross_entropy(library):
    module = _module(library)
    loss = module.training_step((IMAGES, LABELS), 0)
    with torch.no_grad():
        h = module.model.backbone.pool(
            module.model.backbone.encode(module.model.insert_prompts(module.model.backbone.embed(IMAGES)))
        )
        z = h.double() @ module.head.weight.double().T + module.head.bias.double()
        expected = -(z.log_softmax(dim=1)[torch.arange(8), LABELS]).mean()
    assert loss.ndim == 0 and loss.requires_grad
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,cls", [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)])
def test_optimizer_holds_exactly_prompts_and_head(name, cls):
    module = _module(optimizer=name, lr=0.1, weight_decay=1e-4, momentum=0.5)
    optimizer = module.configure_optimizers()
    assert isinstance(optimizer, cls)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    expected = [module.model.prompts, module.head.weight, module.head.bias]
    assert len(params) == 3 and all(a is b for a, b in zip(params, expected))
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.1 and group["weight_decay"] == 1e-4
    if name == "sgd":
        assert group["momentum"] == 0.5
    named = dict(module.named_parameters())
    assert named[PromptTuningModule.prompt_parameter_name] is module.model.prompts


def test_trainer_fit_moves_prompts_and_head_but_not_the_backbone():
    module = _module("open_clip", lr=0.5)
    backbone_before = {k: v.clone() for k, v in module.model.backbone.state_dict().items()}
    prompts_before = module.model.get_prompts()
    head_before = module.head.weight.detach().clone()
    trainer = lightning.Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(TensorDataset(IMAGES, LABELS), batch_size=4))
    after = module.model.backbone.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in backbone_before.items())
    assert not torch.equal(module.model.get_prompts(), prompts_before)
    assert not torch.equal(module.head.weight.detach(), head_before)
    assert not module.model.backbone.model.training  # frozen trunk stays in eval mode


@pytest.mark.outcome
def test_manual_loop_with_proximal_callback_reduces_loss_and_pulls_to_reference():
    gen = torch.Generator().manual_seed(outcome_seed())
    images, labels = torch.randn(8, 3, 32, 32, generator=gen), torch.randint(0, 4, (8,), generator=gen)
    module = PromptTuningModule(
        model=PromptedViT(build_tiny_backbone("timm", seed=outcome_seed()), num_prompts=4, seed=outcome_seed()),
        num_classes=4,
        lr=0.05,
        momentum=0.0,
        head_seed=outcome_seed(),
    )
    optimizer = module.configure_optimizers()
    p_init = module.model.get_prompts()
    callback = ProximalCallback(mu=1.0, reference={PromptTuningModule.prompt_parameter_name: p_init})
    first = None
    for step in range(15):
        optimizer.zero_grad()
        loss = module.training_step((images, labels), step)
        loss.backward()
        grad_ce = module.model.prompts.grad.clone()
        callback.on_after_backward(module=module)
        # the callback adds exactly mu·(P − P_init) to the task gradient
        torch.testing.assert_close(module.model.prompts.grad, grad_ce + (module.model.prompts.detach() - p_init))
        optimizer.step()
        first = loss.item() if first is None else first
    # lr 0.05: the loss ratio is 0.64-0.75 over seeds 0-5 (FL_TEST_SEED); at the former lr 0.2 it rose
    # above the first loss at 3 of those 6 seeds (to 1.3-2.4) and the test passed only by its seed
    expect("training loss after 15 steps / first", loss.item() / first, "<", 0.9)


def test_head_init_is_seeded_and_leaves_global_rng():
    state = torch.random.get_rng_state()
    a, b = _module(head_seed=1), _module(head_seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a.head.weight, b.head.weight)
    assert not torch.equal(a.head.weight, _module(head_seed=2).head.weight)


@pytest.mark.parametrize(
    "kwargs,key",
    [
        (dict(optimizer="adam"), "optimizer"),
        (dict(lr=0.0), "lr"),
        (dict(weight_decay=-1.0), "weight_decay"),
        (dict(momentum=1.0), "momentum"),
    ],
)
def test_bad_arguments_are_value_errors_naming_the_argument(kwargs, key):
    with pytest.raises(ValueError, match=key):
        _module(**kwargs)


def test_forward_gives_logits_and_features():
    module = _module()
    with torch.no_grad():
        assert module(IMAGES).shape == (8, 4)
        assert module.features(IMAGES).shape == (8, module.model.feature_dim)
        torch.testing.assert_close(module(IMAGES), F.linear(module.features(IMAGES), module.head.weight, module.head.bias))
