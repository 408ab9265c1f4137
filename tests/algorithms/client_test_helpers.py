"""What the federated-evaluation tests of the frozen-feature methods share (partition.client_test_fraction): the
features a run's backbone gives rows of a split, read again here, and the check of a run's ``fed_test_*`` and
``accuracy`` against its global head applied to them (Flower's weighted mean over the clients' own test rows)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from lightning.fabric import seed_everything

from fl_lightning.algorithms.common import frozen_backbone
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.federation.algorithm import InputSpec
from fl_lightning.federation.run_data import client_test_split, partition_for
from fl_lightning.models.vpt import PromptedViT


def read_splits(cfg, prompts: torch.Tensor | None = None):
    """The run's backbone (same seed; prompted by ``prompts``) and its splits read through the evaluation transform."""
    seed_everything(cfg.seed, verbose=False)
    backbone = frozen_backbone(cfg)
    spec = InputSpec.of_backbone(backbone, cfg.data.image_size)
    t = build_transform(normalization=spec.normalization, image_size=spec.image_size, train=False, mean=spec.mean, std=spec.std)
    splits = build_dataset(
        cfg.data.name,
        root=cfg.data.root,
        train_transform=t,
        test_transform=t,
        seed=cfg.data_seed,
        num_samples=cfg.data.num_samples,
    )
    model = backbone
    if prompts is not None:
        model = PromptedViT(backbone, num_prompts=prompts.shape[0])
        model.set_prompts(prompts)
    return model.eval(), splits


def features(model, dataset, rows: np.ndarray, batch_size: int) -> torch.Tensor:
    """``model``'s features of ``dataset``'s ``rows`` read in that order, in the run's batches (float32)."""
    out = []
    for start in range(0, len(rows), batch_size):
        x = torch.stack([dataset[int(i)][0] for i in rows[start : start + batch_size]])
        with torch.inference_mode():
            out.append(model(x).float())
    return torch.cat(out)


def clients_rows(cfg, targets: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The clients' training rows and their own test rows (disjoint, together the whole partition)."""
    whole = partition_for(cfg, targets)
    fit, held = client_test_split(cfg, whole, targets)
    for a, b, p in zip(fit, held, whole):
        assert np.intersect1d(a, b).size == 0 and np.array_equal(np.union1d(a, b), p)
    return fit, held


def check_scores(summary: dict, head: Callable[[torch.Tensor], torch.Tensor], h_held, y_held, sizes, h_test, y_test) -> None:
    """The run's ``fed_test_*`` are ``head``'s on the clients' test rows (each client's accuracy weighted by its
    test rows, as Flower's server); its ``accuracy`` and ``loss`` are the test split's, as without them."""
    logits = head(h_held).float().double()
    hits = (logits.argmax(1) == y_held).double()
    losses = torch.nn.functional.cross_entropy(logits, y_held, reduction="none")
    ends = np.cumsum(sizes)
    acc = [float(hits[e - n : e].mean()) for n, e in zip(sizes, ends)]
    assert summary["fed_test_acc"] == pytest.approx(sum(n * a for n, a in zip(sizes, acc)) / sum(sizes), abs=1e-12)
    assert summary["fed_test_loss"] == pytest.approx(float(losses.mean()), rel=1e-5)
    assert summary["fed_test_acc_min"] == pytest.approx(min(acc), abs=1e-12)
    worst = sorted(acc)[: -(-len(acc) // 10)]  # the ⌈K/10⌉ lowest
    assert summary["fed_test_acc_worst10"] == pytest.approx(float(np.mean(worst)), abs=1e-12)
    test_logits = head(h_test).float().double()
    test_loss = torch.nn.functional.cross_entropy(test_logits, y_test)
    assert summary["accuracy"] == pytest.approx(float((test_logits.argmax(1) == y_test).double().mean()), abs=1e-6)  # float32
    assert summary["loss"] == pytest.approx(float(test_loss), rel=1e-5)


def check_head_on_images(summary: dict, W: torch.Tensor, model, splits, held: list[np.ndarray], batch_size: int) -> None:
    """:func:`check_scores` of the analytic head ``W`` on ``model``'s features of the clients' test rows (of the
    training split) and of the test split, read in the run's batches."""
    targets, rows = np.asarray(splits.train_targets), np.concatenate(held)
    check_scores(
        summary,
        lambda v: v.to(W.dtype) @ W,
        features(model, splits.train, rows, batch_size),
        torch.as_tensor(targets[rows]),
        [len(r) for r in held],
        features(model, splits.test, np.arange(len(splits.test_targets)), batch_size),
        torch.as_tensor(np.asarray(splits.test_targets)),
    )
