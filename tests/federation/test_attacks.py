"""federation.attack: a seeded fraction of the clients send a poisoned upload — the update reversed or boosted, or
Gaussian weights around the global ones — before anything else sees it; the count per round is in metrics.csv."""

from __future__ import annotations

import csv

import pytest
import torch

from fl_lightning.config import AttackConfig
from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.policies.attacks import ClientAttack, choose_attackers, poison
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.federation.transport import Upload
from tests.conftest import CONF
from tests.tiny_runs import tiny_config


def _pair() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = {"w": torch.randn(5, 3, generator=g), "steps": torch.tensor(7)}
    u = {"w": x["w"] + torch.randn(5, 3, generator=g) * 0.1, "steps": torch.tensor(9)}
    return x, u


@pytest.mark.parametrize(
    "kind, scale, expected",
    [
        ("sign_flip", 1.0, lambda x, u: 2 * x - u),
        ("sign_flip", 3.0, lambda x, u: x - 3 * (u - x)),
        ("scale", 10.0, lambda x, u: x + 10 * (u - x)),
    ],
)
def test_the_update_is_reversed_or_boosted_and_other_tensors_pass(kind, scale, expected):
    x, u = _pair()
    sent = poison(kind, u, x, scale=scale, std=1.0)
    torch.testing.assert_close(sent["w"], expected(x["w"], u["w"]))
    assert sent["steps"] is u["steps"]


def test_gaussian_weights_centre_on_the_global_ones_with_std_sigma():
    x = {"w": torch.full((200, 100), 3.0)}
    sent = poison("gaussian", {"w": torch.zeros(200, 100)}, x, scale=1.0, std=0.5, generator=torch.Generator().manual_seed(1))[
        "w"
    ]
    assert abs(float(sent.mean()) - 3.0) < 0.01 and abs(float(sent.std()) - 0.5) < 0.01


def test_attackers_are_a_seeded_fraction_drawn_once():
    chosen = choose_attackers(10, 0.3, seed=4)
    assert len(chosen) == 3 and chosen <= set(range(10)) and chosen == choose_attackers(10, 0.3, seed=4)
    assert len(choose_attackers(10, 0.25, seed=0)) == 3 and len(choose_attackers(10, 0.24, seed=0)) == 2
    attack = ClientAttack.of(AttackConfig(kind="scale", fraction=0.3, seed=4), 10)
    assert attack.attackers == chosen and attack.scale == 10.0 and ClientAttack.of(AttackConfig(), 10) is None
    x, u = _pair()
    honest = next(c for c in range(10) if c not in chosen)
    assert attack.apply(Upload(u, {"num_samples": 3}), x, 0, honest).tensors is u
    assert attack.row(0, list(range(10))) == {"attackers": 3}


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"kind": "scale", "fraction": -0.1}, "fraction"),
        ({"fraction": 1.0}, "fraction"),
        ({"kind": "gaussian", "fraction": 0.2, "scale": 2.0}, "scale"),
    ],
)
def test_bad_attack_settings_name_their_key(settings, key):
    with pytest.raises(ConfigError) as err:
        AttackConfig(**settings)
    assert err.value.key == key


def _cfg(tmp_path, *extra: str):
    return tiny_config(tmp_path, *extra)


def test_sign_flipping_clients_move_fedavg_and_are_counted_each_round(tmp_path):
    clean = _cfg(tmp_path / "clean")
    Simulation(cfg=clean, loggers=[]).run()
    attacked = _cfg(
        tmp_path / "attacked",
        "--federation.attack.kind",
        "sign_flip",
        "--federation.attack.fraction",
        "0.5",
        "--federation.attack.scale",
        "4",
    )
    Simulation(cfg=attacked, loggers=[]).run()
    with (attacked.run_dir / "metrics.csv").open() as f:
        assert [row["attackers"] for row in csv.DictReader(f)] == ["2", "2"]
    a, b = (safe_load(c.run_dir / "checkpoints" / "server.pt")["state"] for c in (clean, attacked))
    assert not torch.equal(a["head.weight"], b["head.weight"])


def test_an_attack_on_a_method_that_does_not_average_weights_is_refused_in_one_line(tmp_path):
    cfg = load_config(
        CONF / "fedcgs_digits_tiny.yaml",
        ["--output_dir", str(tmp_path), "--federation.attack.kind", "gaussian", "--federation.attack.fraction", "0.2"],
    )
    with pytest.raises(UsageError) as err:
        Simulation(cfg=cfg, loggers=[])
    assert "federation.attack.kind=gaussian" in str(err.value) and "\n" not in str(err.value)


def _client_upload(sim: Simulation, algorithm, env, client):
    """``client``'s round-0 upload from the initial state, seeded as the engine seeds it."""
    from fl_lightning.federation.ranks.placement import client_seed, seed_torch
    from fl_lightning.federation.transport import Download

    seed_torch(client_seed(sim.cfg.seed, 0, client.index), sim.fabric.device)
    return algorithm.client_update(0, client, Download(algorithm.initial_state()).to(sim.fabric.device))


@pytest.mark.parametrize("config", ["fedavg_digits_tiny.yaml", "fedavg_cnn_digits_tiny.yaml"])
def test_a_label_flipper_uploads_what_its_data_with_reversed_labels_trains(tmp_path, config):
    """label_flip poisons the data, not the upload: an attacker's upload is, bit for bit, the honest upload of the
    same rows with every label l stored as C − 1 − l — through the feature table (fedavg's head) and through the
    client's images (fedavg_cnn)."""
    import numpy as np

    from fl_lightning.federation.algorithm import Client

    cfg = load_config(
        CONF / config,
        [
            "--output_dir",
            str(tmp_path),
            "--partition.num_clients",
            "4",
            "--data.num_samples",
            "300",
            "--federation.attack.kind",
            "label_flip",
            "--federation.attack.fraction",
            "0.5",
            "--logging.progress",
            "false",
        ],
    )
    sim = Simulation(cfg=cfg, loggers=[])
    sim.fabric.launch()
    algorithm, env = sim._setup()
    attacker = min(sim._policies.get("attack").attackers)
    assert (
        sorted(env.label_maps) == sorted(sim._policies.get("attack").attackers)
        and sim._policies.get("attack")
        .apply(Upload({"w": torch.ones(1)}, {}), {"w": torch.zeros(1)}, 0, attacker)
        .tensors["w"]
        .item()
        == 1.0
    )
    flipper = env.client(attacker)
    rows, classes = env.partition[attacker], env.num_classes
    true = env.splits.train_targets[rows]
    assert flipper.class_counts.tolist() == np.bincount(classes - 1 - true, minlength=classes).tolist()
    assert [int(y) for _, y in (flipper.dataset[i] for i in range(3))] == (classes - 1 - true[:3]).tolist()
    sent = _client_upload(sim, algorithm, env, flipper)

    # the reference: the same client, honest, on a copy of its rows whose labels were rewritten
    env.splits.train_targets = env.splits.train_targets.copy()
    env.splits.train_targets[rows] = classes - 1 - true
    images = [(x, int(classes - 1 - y)) for x, y in (env.splits.train[int(r)] for r in rows)]
    reference = Client(attacker, images, len(rows), flipper.class_counts)
    if hasattr(algorithm, "_train_on_device"):
        algorithm._train_on_device = None  # the head's table of labels, read again
    honest = _client_upload(sim, algorithm, env, reference)
    assert sent.tensors.keys() == honest.tensors.keys()
    for key in sent.tensors:
        assert torch.equal(sent.tensors[key], honest.tensors[key]), key
    assert sent.meta == {"num_samples": len(rows)}


def test_label_flippers_lower_the_accuracy_and_are_counted_each_round(tmp_path):
    """Half the clients of a small CNN's FedAvg training on reversed labels: 0.87 top-1 clean, 0.40 attacked."""
    runs = [
        load_config(
            CONF / "fedavg_cnn_digits_tiny.yaml",
            [
                "--output_dir",
                str(tmp_path / kind),
                "--federation.rounds",
                "3",
                "--train.epochs",
                "2",
                "--partition.num_clients",
                "4",
                "--logging.progress",
                "false",
                "--federation.attack.kind",
                kind,
                "--federation.attack.fraction",
                "0.5",
            ],
        )
        for kind in ("none", "label_flip")
    ]
    accuracy = [Simulation(cfg=c, loggers=[]).run()["accuracy"] for c in runs]
    with (runs[1].run_dir / "metrics.csv").open() as f:
        assert [row["attackers"] for row in csv.DictReader(f)] == ["2", "2", "2"]
    assert accuracy[0] > 0.7 and accuracy[1] < accuracy[0] - 0.2, accuracy
