"""Building blocks of the FedOPAL study (notebooks/fedopal_beyond.md): the real DINOv2 ViT-S/14 on the bundled digits.

Everything runs on frozen *embedded tokens*: VPT-shallow prompts enter after the patch embedding
and the position embedding (Eq. (4)), so the embedding stage is computed once per image and cached;
prompt training and every statistics pass then run only the transformer trunk. Images use the
deterministic (test) transform for training and statistics alike, so the cache is exact.

Pieces of the package used as they are: build_backbone, PromptedViT (insert_prompts, init_prompts),
AnalyticStatistics / solve_classifier, build_dataset, dirichlet_partition / iid_partition.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fl_lightning.analytic import AnalyticStatistics, solve_classifier
from fl_lightning.data.partition import dirichlet_partition, iid_partition
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.models.backbones import build_backbone
from fl_lightning.models.vpt import PromptedViT

CHECKPOINT = os.path.expanduser("~/.cache/fl_lightning/vits14_dinov2.safetensors")
CACHE = Path(os.path.expanduser("~/.cache/fl_lightning/fedopal_study"))
NUM_CLASSES = 10
LAM = 1e-6  # λ of the study's runs (added once, Eq. (9))


@dataclass
class Bench:
    """The frozen model and the cached tokens of the digits' train and test splits."""

    model: PromptedViT
    train_tokens: Tensor  # (N_train, 1 + L, D)
    train_labels: Tensor  # (N_train,)
    test_tokens: Tensor
    test_labels: Tensor
    p_init: Tensor  # (M, D)
    _feat_cache: dict = field(default_factory=dict)


def load_bench(*, image_size: int = 56, num_prompts: int = 10, prompt_seed: int = 0, data_seed: int = 0) -> Bench:
    backbone = build_backbone(library="timm", name="vit_small_patch14_dinov2", pretrained=None,
                              checkpoint=CHECKPOINT, image_size=image_size).freeze()
    model = PromptedViT(backbone, num_prompts=num_prompts, seed=prompt_seed).eval()
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"tokens_{image_size}_seed{data_seed}.pt"
    if path.exists():
        d = torch.load(path)
    else:
        tf = build_transform(normalization="imagenet", image_size=image_size, train=False,
                             mean=backbone.mean, std=backbone.std)
        splits = build_dataset("digits", root="data", train_transform=tf, test_transform=tf, seed=data_seed)
        d = {}
        for name, ds in (("train", splits.train), ("test", splits.test)):
            x = torch.stack([ds[i][0] for i in range(len(ds))])
            with torch.no_grad():
                d[f"{name}_tokens"] = torch.cat([backbone.embed(b) for b in x.split(256)])
            d[f"{name}_labels"] = torch.as_tensor([int(ds[i][1]) for i in range(len(ds))])
        torch.save(d, path)
    return Bench(model, d["train_tokens"], d["train_labels"], d["test_tokens"], d["test_labels"],
                 model.get_prompts())


def features(bench: Bench, tokens: Tensor, prompts: Tensor | None, batch: int = 256) -> Tensor:
    """h = pool(encode([cls, P, E])) for cached tokens; ``prompts=None``: no prompts (AFL)."""
    bb = bench.model.backbone
    out = []
    with torch.no_grad():
        for t in tokens.split(batch):
            if prompts is not None and prompts.shape[0] > 0:
                p = prompts.unsqueeze(0).expand(t.shape[0], -1, -1)
                t = torch.cat([t[:, :1], p, t[:, 1:]], dim=1)
            out.append(bb.pool(bb.encode(t)))
    return torch.cat(out).double()


def _forward(bench: Bench, tokens: Tensor, prompts: Tensor) -> Tensor:
    bb = bench.model.backbone
    p = prompts.unsqueeze(0).expand(tokens.shape[0], -1, -1)
    return bb.pool(bb.encode(torch.cat([tokens[:, :1], p, tokens[:, 1:]], dim=1)))


@dataclass
class TrainConfig:
    epochs: int = 1
    lr: float = 1e-3
    optimizer: str = "adamw"
    mu: float = 0.1
    head: str = "linear"  # 'linear' (temporary head, CE) | 'ridge' (kernel-ridge head in the loop, split batch)
    batch_size: int = 64
    balanced: bool = False  # class-balanced CE (inverse local class frequency)


def train_prompts(bench: Bench, tokens: Tensor, labels: Tensor, p_init: Tensor, cfg: TrainConfig, *,
                  seed: int) -> Tensor:
    """Eq. (6): prompts (+ a temporary head) with task loss + mu/2·||P − P_init||²; returns P_k."""
    if cfg.epochs == 0 or tokens.shape[0] == 0:
        return p_init.clone()
    g = torch.Generator().manual_seed(seed)
    P = torch.nn.Parameter(p_init.clone())
    params = [P]
    head = None
    if cfg.head == "linear":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = torch.nn.Linear(bench.model.feature_dim, NUM_CLASSES)
        params += list(head.parameters())
    opt = (torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0) if cfg.optimizer == "adamw"
           else torch.optim.SGD(params, lr=cfg.lr, momentum=0.9))
    weight = None
    if cfg.balanced:
        counts = torch.bincount(labels, minlength=NUM_CLASSES).float()
        weight = torch.where(counts > 0, counts.sum() / (counts.clamp(min=1) * (counts > 0).sum()), 0.0)
    n = tokens.shape[0]
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=g)
        for idx in perm.split(cfg.batch_size):
            h = _forward(bench, tokens[idx], P)
            y = labels[idx]
            if cfg.head == "linear":
                loss = F.cross_entropy(head(h), y, weight=weight)
            else:  # kernel-ridge head fitted on one half of the batch, scored on the other (both ways)
                if h.shape[0] < 4:
                    continue
                half = h.shape[0] // 2
                Y = F.one_hot(y, NUM_CLASSES).float()
                loss = 0.0
                for a, b in ((slice(0, half), slice(half, None)), (slice(half, None), slice(0, half))):
                    Ha, Hb = h[a], h[b]
                    K = Ha @ Ha.T + 1.0 * torch.eye(Ha.shape[0])
                    W = Ha.T @ torch.linalg.solve(K, Y[a])  # (d, c)
                    loss = loss + F.cross_entropy(10.0 * (Hb @ W), y[b])
            loss = loss + 0.5 * cfg.mu * (P - p_init).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return P.detach().clone()


def stats(h: Tensor, y: Tensor) -> AnalyticStatistics:
    s = AnalyticStatistics.zeros(h.shape[1], NUM_CLASSES)
    if h.shape[0]:
        s.update(h, y)
    return s


def accuracy(stat: AnalyticStatistics, h_test: Tensor, y_test: Tensor, lam: float = LAM) -> float:
    W = solve_classifier(stat.R, stat.C, lam=lam)
    return float(((h_test @ W).argmax(1) == y_test).double().mean()) * 100


def partition(labels: Tensor, alpha: float, seed: int, num_clients: int = 10) -> list[np.ndarray]:
    y = labels.numpy()
    if math.isinf(alpha):
        return iid_partition(len(y), num_clients, seed=seed)
    return dirichlet_partition(y, num_clients, alpha, seed=seed, min_samples=1)


class Timer:
    def __init__(self) -> None:
        self.t = time.monotonic()

    def __call__(self) -> float:
        now = time.monotonic()
        dt, self.t = now - self.t, now
        return dt
