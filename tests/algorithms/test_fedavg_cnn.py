"""FedAvg (ResNet) through the engine: one client with all data is centralized training; bytes; weights file."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.algorithms.fedavg_cnn import build_timm_classifier
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.federation.ranks.placement import client_seed
from fl_lightning.federation.simulation import Simulation
from tests.outcomes import expect, outcome_seed
from tests.tiny_runs import one_client_one_round, quiet_config


def _cfg(tmp_path, *extra):
    return quiet_config(tmp_path, "fedavg_cnn_digits_tiny.yaml", *extra)


def test_one_client_one_round_is_centralized_training(tmp_path):
    cfg, summary, state = one_client_one_round(tmp_path, "fedavg_cnn_digits_tiny.yaml", 256)

    # the reference: plain torch SGD on the whole training split, same initial model and batch order
    t = build_transform(normalization="imagenet", image_size=cfg.data.image_size, train=False)
    splits = build_dataset("digits", root="data", train_transform=t, test_transform=t, seed=cfg.seed, num_samples=256)
    model = build_timm_classifier(cfg, len(splits.classes), seed=cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum)
    loader = torch.utils.data.DataLoader(
        splits.train,
        batch_size=cfg.data.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(client_seed(cfg.seed, 0, 0)),
    )
    model.train()
    for images, labels in loader:
        opt.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        opt.step()
    ref = model.state_dict()
    assert set(state) == set(ref)
    for k, v in ref.items():  # BN buffers included
        torch.testing.assert_close(state[k], v, rtol=1e-6, atol=1e-7, msg=k)
    n_bytes = sum(v.numel() * v.element_size() for v in ref.values())
    assert summary["bytes_up"] == n_bytes + 8 and summary["bytes_down"] == n_bytes


@pytest.mark.outcome
def test_weighted_average_of_three_clients_and_accuracy_improves(tmp_path):
    s = str(outcome_seed())
    cfg = _cfg(
        tmp_path,
        "--federation.rounds",
        "3",
        "--partition.alpha",
        "inf",
        "--seed",
        s,
        "--partition.seed",
        s,
        "--federation.sampling_seed",
        s,
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()
    rows = (cfg.run_dir / "metrics.csv").read_text().splitlines()[1:]
    acc = [float(r.split(",")[1]) for r in rows]
    assert len(acc) == 3
    expect("accuracy gain from round 1 to round 3", acc[-1] - acc[0], ">", 0.0)
    expect("accuracy after 3 rounds", acc[-1], ">", 0.3)  # chance: 0.1
    assert summary["backbone"] == "timm resnet18" and summary["imagenet_init"] is False
    assert summary["bytes_up"] == 3 * 3 * (summary["bytes_down"] // 9 + 8)


def test_imagenet_weights_from_a_local_file(tmp_path):
    """A 1000-class file (as ImageNet weights are saved): every tensor but the classifier comes from it."""
    cfg = _cfg(tmp_path)
    imagenet = build_timm_classifier(cfg, 1000, seed=123)
    path = tmp_path / "resnet18_imagenet.pth"
    torch.save(imagenet.state_dict(), path)
    cfg = _cfg(tmp_path, "--model.checkpoint", str(path))
    model = build_timm_classifier(cfg, 10, seed=0)
    for k, v in model.state_dict().items():
        if k.startswith("fc."):
            assert v.shape[0] == 10
        else:
            assert torch.equal(v, imagenet.state_dict()[k]), k
    random = build_timm_classifier(_cfg(tmp_path), 10, seed=0)
    assert not torch.equal(random.conv1.weight, model.conv1.weight)
    np.testing.assert_equal(model.fc.weight.shape, (10, 64))


@pytest.mark.parametrize("augment", [True, False])
def test_crop_flip_is_visible_in_the_clients_batches(tmp_path, augment):
    """fedavg_cnn.augment: the training split the clients read is CIFAR's pad + crop + flip (two reads of the
    same images differ), or the deterministic view; the test split never changes."""
    cfg = _cfg(tmp_path, "--fedavg_cnn.augment", str(augment).lower())
    sim = Simulation(cfg=cfg, loggers=[])
    sim.fabric.launch()
    algorithm, env = sim._setup()
    assert algorithm.input_spec().augmentation == "crop_flip"
    first, again = (next(iter(env.loader(env.splits.train, shuffle=False)))[0] for _ in range(2))
    assert torch.equal(first, again) is not augment
    test_a, test_b = (next(iter(env.loader(env.splits.test, shuffle=False)))[0] for _ in range(2))
    assert torch.equal(test_a, test_b)
