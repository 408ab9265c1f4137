"""FedOPAL through the engine, against centralized references in float64 (AFL, its no-prompt special case, has
tests/algorithms/test_afl.py)."""

import json

import numpy as np
import pytest
import torch
from lightning.fabric import seed_everything

from fl_lightning.algorithms.common import frozen_backbone
from fl_lightning.config.loading import load_config
from fl_lightning.data.registry import build_dataset
from fl_lightning.data.transforms import build_transform
from fl_lightning.federation.algorithm import InputSpec
from fl_lightning.federation.run_data import partition_for
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.models.vpt import PromptedViT
from tests.algorithms.client_test_helpers import check_head_on_images, clients_rows, features, read_splits
from tests.conftest import CONF, run_cli
from tests.outcomes import expect, outcome_seed
from tests.tiny_runs import FEDOPAL_TINY, fedopal_overrides


def _cfg(tmp_path, *extra):
    return load_config(FEDOPAL_TINY, fedopal_overrides(tmp_path, *extra))


def _centralized_features(cfg, prompts=None):
    """Features of the whole training split, with the backbone the simulation builds (same seed)."""
    seed_everything(cfg.seed, verbose=False)
    backbone = frozen_backbone(cfg)
    spec = InputSpec.of_backbone(backbone, cfg.data.image_size)
    t = build_transform(normalization=spec.normalization, image_size=spec.image_size, train=False, mean=spec.mean, std=spec.std)
    splits = build_dataset(cfg.data.name, root=cfg.data.root, train_transform=t, test_transform=t, seed=cfg.seed)
    model = PromptedViT(backbone, num_prompts=0 if prompts is None else prompts.shape[0])
    if prompts is not None:
        model.set_prompts(prompts)
    # the batches the run uses (a float32 forward may depend on the batch it runs in): FedOPAL's clients
    # stream their own; AFL reads the split's feature table, computed once in the split's batches
    n = len(splits.train_targets)
    parts = partition_for(cfg, splits.train_targets) if prompts is not None else [np.arange(n)]
    hs, ys = [], []
    for part in parts:
        for start in range(0, len(part), cfg.data.batch_size):
            idx = part[start : start + cfg.data.batch_size]
            x = torch.stack([splits.train[int(i)][0] for i in idx])
            with torch.inference_mode():
                hs.append(model(x).double().numpy())
            ys.append(np.eye(len(splits.classes))[splits.train_targets[idx]])
    return np.concatenate(hs), np.concatenate(ys)


def _ridge(h, y, lam):
    return np.linalg.solve(h.T @ h + lam * np.eye(h.shape[1]), h.T @ y)


def test_no_training_fedopal_statistics_equal_afl_with_p_init(tmp_path):
    """mu → ∞ keeps the prompts at P_init; its exact limit is no prompt training at all."""
    cfg = _cfg(tmp_path, "--train.epochs", "0")
    Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    h, y = _centralized_features(cfg, prompts=state["prompts"])
    np.testing.assert_allclose(state["W"].numpy(), _ridge(h, y, cfg.method.lam), rtol=1e-6, atol=1e-8)


@pytest.mark.outcome
def test_growing_mu_pulls_prompts_to_p_init(tmp_path):
    drift, s = [], str(outcome_seed())
    for mu in ("0", "10", "90"):  # lr·mu < 1 keeps plain SGD stable
        cfg = _cfg(
            tmp_path / mu,
            "--fedopal.mu",
            mu,
            "--train.momentum",
            "0",
            "--train.lr",
            "0.01",
            "--train.epochs",
            "2",
            "--seed",
            s,
            "--partition.seed",
            s,
            "--fedopal.prompt_seed",
            s,
        )
        Simulation(cfg=cfg, loggers=[]).run()
        state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
        p_init = PromptedViT(frozen_backbone(cfg), num_prompts=10, seed=cfg.method.prompt_seed).get_prompts()
        drift.append(float((state["prompts"] - p_init).norm()))
    expect("prompt drift at mu 10 / at mu 0", drift[1] / drift[0], "<", 1.0)
    expect("prompt drift at mu 90 / at mu 10", drift[2] / drift[1], "<", 1.0)
    assert drift[2] > 0


def test_restat_global_solves_on_the_inference_features(tmp_path):
    cfg = _cfg(tmp_path, "--fedopal.restat", "global")
    summary = Simulation(cfg=cfg, loggers=[]).run()
    assert summary["rounds"] == 2
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    h, y = _centralized_features(cfg, prompts=state["prompts"])
    np.testing.assert_allclose(state["W"].numpy(), _ridge(h, y, cfg.method.lam), rtol=1e-6, atol=1e-8)
    rows = (cfg.run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3  # round 0 = the faithful FedOPAL result, round 1 = restat


def test_fedopal_one_vs_two_processes_same_w(tmp_path):
    base = [
        "--config",
        str(CONF / "fedopal_digits_tiny.yaml"),
        "--partition.num_clients",
        "5",
        "--train.epochs",
        "1",
        "--logging.progress",
        "false",
    ]
    env = {"OMP_NUM_THREADS": "1"}
    one = run_cli(*base, "--output_dir", str(tmp_path / "one"), env=env)
    two = run_cli(*base, "--output_dir", str(tmp_path / "two"), "--federation.devices", "2", env=env)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-1500:], two.stderr[-1500:])
    name = "fedopal_digits_a0.1_s0"
    w1 = safe_load(tmp_path / "one" / name / "checkpoints" / "server.pt")["state"]
    w2 = safe_load(tmp_path / "two" / name / "checkpoints" / "server.pt")["state"]
    assert torch.equal(w1["W"], w2["W"]) and torch.equal(w1["prompts"], w2["prompts"])
    s1 = json.loads((tmp_path / "one" / name / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / name / "summary.json").read_text())
    assert s1["accuracy"] == s2["accuracy"] and s1["bytes_up"] == s2["bytes_up"] and s2["world_size"] == 2


@pytest.mark.parametrize("library, last_block", [("timm", "model.blocks"), ("open_clip", "model.transformer.resblocks")])
def test_cls_feature_is_the_last_blocks_class_token(library, last_block):
    """model.feature: cls — the class token as the last block outputs it (no final LayerNorm, no projection)."""
    from fl_lightning.models.backbones import build_tiny_backbone

    tiny = build_tiny_backbone(library)
    cls = type(tiny)(model=tiny.model, feature="cls", mean=tiny.mean, std=tiny.std)
    assert cls.feature_dim == tiny.width
    seen = []
    block = cls.get_submodule(last_block)[-1]
    handle = block.register_forward_hook(lambda m, i, o: seen.append(o[:, 0]))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        h = cls.eval()(x)
    handle.remove()
    torch.testing.assert_close(h, seen[0])
    pre_proj = type(tiny)(model=tiny.model, feature="pre_proj", mean=tiny.mean, std=tiny.std).eval()
    with torch.no_grad():
        assert not torch.allclose(h, pre_proj(x))  # the final LayerNorm is not applied


def test_no_config_or_readme_names_the_former_analytic_section():
    """The method section is ``afl:`` (``--afl.*``); ``--analytic.*`` keys no longer exist."""
    import re

    pattern = re.compile(r"analytic\.(lam|regularization|remove_regularization|dtype)\b")
    files = [*sorted(CONF.glob("*.yaml")), CONF.parent / "README.md"]
    assert not [f.name for f in files if pattern.search(f.read_text())]


class _FakeTrainer:
    """A prompt trainer that records what the stage asks of it: P tuned from, and a P_k to return."""

    def __init__(self, trained: torch.Tensor):
        from types import SimpleNamespace

        self.calls, self.trained = [], trained
        self.cfg, self.env = SimpleNamespace(seed=0), None  # the fit share's seed; no data set (val_fraction: 0)

    def tune(self, round_idx, client, prompts, *, train=True):
        self.calls.append(("tune", round_idx, client.index, train))
        self.prompts = prompts
        return self.trained if train else prompts


def test_a_prompt_stage_works_only_with_the_collaborators_it_is_given():
    """FedOPAL+'s covering round, handed a trainer and no head (no method, no model, no data): each covering client
    tunes from the downloaded P and uploads its P_k, a client of one label keeps P and does not vote; the server's
    weighted Eq. (8) is Σ N_k P_k / Σ N_k over the voters."""
    from fl_lightning.algorithms.fedopal_plus import CoveringPrompts, FedOPALPlusConfig
    from fl_lightning.federation.algorithm import Client
    from fl_lightning.federation.transport import Download

    p_global = torch.zeros(2, 3)
    config = FedOPALPlusConfig(prompt_aggregation="weighted", val_fraction=0.0)
    uploads = {}
    for k, (n, p_k, counts) in enumerate(
        [(1, torch.ones(2, 3), [1, 0]), (3, torch.full((2, 3), 5.0), [1, 2]), (2, torch.full((2, 3), 9.0), [1, 1])]
    ):
        trainer = _FakeTrainer(p_k)
        stage = CoveringPrompts(0, config=config, trainer=trainer, head=None)
        uploads[k] = stage.client_update(0, Client(k, None, n, np.array(counts)), Download({"prompts": p_global}))
        trains = k > 0
        assert trainer.calls == [("tune", 0, k, trains)] and trainer.prompts is p_global
        assert torch.equal(uploads[k].tensors["prompts"], p_k if trains else p_global)
        assert uploads[k].meta == {"num_samples": n, "trained": int(trains)}
    state = stage.aggregate(0, {"prompts": p_global}, uploads, {}, None)
    assert torch.equal(state["prompts"], torch.full((2, 3), (3 * 5.0 + 2 * 9.0) / 5)) and int(state["prompt_voters"]) == 2
    assert "W" not in state


def test_fedopal_evaluates_the_clients_test_rows_through_the_global_prompts(tmp_path):
    """partition.client_test_fraction 0.25 (restat global: W* of the clients' training rows under P_global): the
    clients' test rows are in no R_k, C_k, and fed_test_acc & co. are W*'s on their features under P_global (the
    rows read through the training split's transform, in the run's batches), weighted as Flower's server."""
    cfg = _cfg(tmp_path, "--fedopal.restat", "global", "--partition.client_test_fraction", "0.25")
    summary = Simulation(cfg=cfg, loggers=[]).run()
    state = safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]
    model, splits = read_splits(cfg, prompts=state["prompts"])
    targets = np.asarray(splits.train_targets)
    fit, held = clients_rows(cfg, targets)
    b = cfg.data.batch_size
    h = torch.cat([features(model, splits.train, part, b) for part in fit]).double().numpy()  # each client's batches
    y = np.eye(len(splits.classes))[targets[np.concatenate(fit)]]
    np.testing.assert_allclose(state["W"].numpy(), _ridge(h, y, cfg.method.lam), rtol=1e-6, atol=1e-8)
    check_head_on_images(summary, state["W"], model, splits, held, cfg.data.batch_size)
