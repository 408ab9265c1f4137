"""CAFF: ImageNet-style init (no synthesis), depth ∝ compute capability by hand, memory reported, B/N split."""

import math

import pytest

from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError
from fl_lightning.federation.simulation import Simulation
from fl_lightning.systems.backbones import backbone
from fl_lightning.systems.devices import PAPER_TESTBED, board_profiles
from tests.conftest import CONF

TINY = CONF / "caff_tiny.yaml"


def test_caff_depths_are_capacity_proportional_by_hand(tmp_path, one_thread):
    cfg = load_config(TINY, ["--output_dir", str(tmp_path), "--federation.rounds", "1"])
    summary = Simulation(cfg=cfg, loggers=[]).run()
    L = summary["num_blocks"]
    table = board_profiles(backbone(cfg.method.pretrain_model), cfg.train.batch_size)  # priced for the named ViT
    boards = [table[PAPER_TESTBED[i % len(PAPER_TESTBED)]] for i in range(4)]
    cap = [1 / (b.forward_time_s + L * b.backward_time_per_layer_s) for b in boards]
    requested = [max(1, math.floor(L * c / max(cap) + 0.5)) for c in cap]  # round half up, at least 1
    memory = [
        (2.5, 1.5, 5.5) if b.name == "jetson_orin_nx" else (b.fixed_memory_gb, b.memory_per_layer_gb, b.memory_budget_gb)
        for b in boards
    ]  # the config's override
    limits = [min(L, math.floor((M - m_bar) / m + 1e-9)) for m_bar, m, M in memory]
    assert summary["requested_depths"] == requested and summary["memory_limits"] == limits
    assert summary["final_depths"] == [min(r, m) for r, m in zip(requested, limits)]
    assert summary["over_memory_clients"] == [i for i, (r, m) in enumerate(zip(requested, limits)) if r > m]
    assert summary["depth_policy"] == "capacity" and summary["bandwidth_allocation"] == "equal"
    assert summary["train_head"] is True  # CAFF's head is newly drawn for the task: train_head auto trains it
    assert summary["synthetic_images"] == 0 and not (cfg.run_dir / "synthetic").exists()
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["simulated_time_s"] > 0


def test_caff_section_defaults_and_checks():
    cfg = load_config(TINY)
    assert cfg.method.systems.depth_policy == "capacity" and cfg.method.systems.bandwidth_allocation == "equal"
    assert cfg.method.train_head == "auto"  # CAFF's head is newly drawn for the task: auto trains it
    assert load_config(TINY, ["--caff.train_head", "false"]).method.train_head is False
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["--caff.systems.bandwidth_allocation", "fair"])
    assert err.value.key == "caff.systems.bandwidth_allocation"
