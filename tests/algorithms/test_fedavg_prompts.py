"""FedAvg (CLIP) through the engine: one client with all data is centralized prompt + head training."""

import torch
import torch.nn.functional as F

from fl_lightning.algorithms.common import frozen_backbone
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.federation.algorithm import InputSpec
from fl_lightning.federation.ranks.placement import client_seed
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.models.vpt import PromptedViT
from tests.tiny_runs import one_client_one_round, quiet_config


def _cfg(tmp_path, *extra):
    return quiet_config(tmp_path, "fedavg_prompts_digits_tiny.yaml", *extra)


def test_one_client_one_round_is_centralized_prompt_tuning(tmp_path):
    cfg, summary, state = one_client_one_round(tmp_path, "fedavg_prompts_digits_tiny.yaml", 192)

    # reference in plain torch: same frozen backbone, same P_init and head, same batch order
    torch.manual_seed(cfg.seed)
    backbone = frozen_backbone(cfg)
    spec = InputSpec.of_backbone(backbone, cfg.data.image_size)
    t = build_transform(normalization=spec.normalization, image_size=spec.image_size, train=False, mean=spec.mean, std=spec.std)
    splits = build_dataset("digits", root="data", train_transform=t, test_transform=t, seed=cfg.seed, num_samples=192)
    model = PromptedViT(backbone, num_prompts=4, seed=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        head = torch.nn.Linear(model.feature_dim, 10)
    opt = torch.optim.SGD([model.prompts, *head.parameters()], lr=cfg.train.lr, momentum=cfg.train.momentum)
    loader = torch.utils.data.DataLoader(
        splits.train,
        batch_size=cfg.data.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(client_seed(cfg.seed, 0, 0)),
    )
    for images, labels in loader:
        opt.zero_grad()
        F.cross_entropy(head(model(images)), labels).backward()
        opt.step()
    torch.testing.assert_close(state["prompts"], model.prompts.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state["head.weight"], head.weight.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state["head.bias"], head.bias.detach(), rtol=1e-5, atol=1e-6)
    n_bytes = 4 * (4 * 64 + 10 * 32 + 10)  # prompts (M, D) + head (C, d) + bias, float32
    assert summary["bytes_up"] == n_bytes + 8 and summary["bytes_down"] == n_bytes


def test_prompts_move_and_the_average_is_weighted(tmp_path):
    cfg = _cfg(tmp_path)
    summary = Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    p_init = PromptedViT(frozen_backbone(cfg), num_prompts=4, seed=0).get_prompts()
    assert float((state["prompts"] - p_init).norm()) > 0
    assert summary["rounds"] == 2 and summary["backbone"] == "open_clip ViT-B-16"
