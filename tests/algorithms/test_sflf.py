"""SFLF: ImageNet-initialised (a local weights file), every device asks for all blocks, B/N channel time."""

import numpy as np
import pytest
import torch

from fl_lightning.config.loading import load_config
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.run_folder import read_metrics_csv
from fl_lightning.federation.transport import SCALAR_BYTES
from fl_lightning.systems.backbones import backbone
from fl_lightning.systems.channel import place_devices
from fl_lightning.systems.devices import PAPER_TESTBED, board_profiles
from tests.conftest import CONF
from tests.outcomes import expect, outcome_seed

TINY = CONF / "sflf_tiny.yaml"


def _rows(run_dir):
    return read_metrics_csv(run_dir / "metrics.csv")


def test_sflf_starts_from_the_weights_file_reports_memory_and_times_the_upload_by_hand(tmp_path, one_thread):
    import timm
    from safetensors.torch import save_file

    cfg0 = load_config(TINY)
    f = cfg0.method
    torch.manual_seed(123)  # stands in for ImageNet weights: any file of the architecture
    source = timm.create_model(f.pretrain_model, pretrained=False, num_classes=1000, **f.pretrain_overrides)
    weights = tmp_path / "imagenet.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(weights))
    cfg = load_config(
        TINY, ["--output_dir", str(tmp_path), "--federation.rounds", "1", "--sflf.pretrain_checkpoint", str(weights)]
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()
    run = cfg.run_dir
    assert not (run / "synthetic").exists() and summary["synthetic_images"] == 0
    assert summary["simulated_generation_s"] == 0 and summary["simulated_pretraining_s"] == 0

    # the backbone is the file's (LoRA leaves it untouched); the 1000-class head was replaced by a 10-class one
    state = torch.load(run / "checkpoints" / "server.pt", weights_only=False)["state"]
    for key in ("blocks.0.attn.qkv.weight", "blocks.3.mlp.fc2.bias", "patch_embed.proj.weight", "pos_embed"):
        torch.testing.assert_close(state[f"backbone.{key}"], source.state_dict()[key], rtol=0, atol=0)
    assert state["head.weight"].shape == (10, f.pretrain_overrides["embed_dim"])

    # all 4 blocks asked of every device; the Orin NX boards (clients 1-3) hold 2 and are reported
    assert summary["requested_depths"] == [4, 4, 4, 4] and summary["memory_limits"] == [4, 2, 2, 2]
    assert summary["final_depths"] == [4, 2, 2, 2] and summary["over_memory_clients"] == [1, 2, 3]
    assert summary["depth_policy"] == "full" and summary["bandwidth_allocation"] == "equal"
    row = _rows(run)[0]
    assert float(row["over_memory_devices"]) == 3 and float(row["mean_requested_depth"]) == 4

    # uploads: the trained blocks' LoRA + the head (train_head: auto → a fresh head trains) + the per-block contributions + n
    lora_per_block = sum(v.numel() for k, v in state.items() if k.startswith("lora.blocks.0."))
    head = sum(v.numel() for k, v in state.items() if k.startswith("head."))
    depths = np.array(summary["final_depths"])
    per_client = 4 * (lora_per_block * depths + head + depths) + SCALAR_BYTES
    assert int(row["bytes_up_round"]) == per_client.sum()

    # channel time by hand: B/N each, e_i = log2(1 + p g / σ²), payload τ x_i + head bits (float32)
    s = f.systems
    names = [PAPER_TESTBED[i % len(PAPER_TESTBED)] for i in range(4)]
    table = board_profiles(backbone(f.pretrain_model), cfg.train.batch_size)  # priced for the named ViT
    boards = [table[n] for n in names]
    boards = [
        b
        if n != "jetson_orin_nx"
        else type(b)(**{**b.__dict__, "fixed_memory_gb": 2.5, "memory_per_layer_gb": 1.5, "memory_budget_gb": 5.5})
        for b, n in zip(boards, names)
    ]
    pos = place_devices(4, radius_m=s.radius_m, center_m=(s.center_x_m, 0.0), seed=s.placement_seed)
    g = 10 ** (-s.reference_loss_db / 10) * (np.hypot(*pos.T) / s.d0_m) ** (-s.path_loss_exponent)
    e = np.log2(1 + np.array([b.transmit_power_w for b in boards]) * g / s.noise_power_w)
    sizes = np.array([len(p) for p in _partition(cfg)])
    H = sizes * cfg.train.epochs * np.array([b.forward_time_s + x * b.backward_time_per_layer_s for b, x in zip(boards, depths)])
    bits = 32 * (lora_per_block * depths + head)
    T = np.max(H + bits / (s.total_bandwidth_hz / 4 * e))
    assert summary["simulated_time_s"] == pytest.approx(T, rel=1e-9)


def _partition(cfg):
    from fl_lightning.data.registry import build_dataset
    from fl_lightning.federation.run_data import partition_for

    splits = build_dataset(cfg.data.name, root=cfg.data.root, seed=cfg.seed, num_samples=cfg.data.num_samples)
    return partition_for(cfg, splits.train_targets)


def test_sflfs_fresh_head_receives_gradients_under_train_head_auto(tmp_path, one_thread):
    """train_head: auto (the default): SFLF's head is newly drawn for the task, so it trains with LoRA — the global
    head moves away from its seeded start, and it is in every upload (the one reading for all LoRA methods)."""
    cfg = load_config(TINY, ["--output_dir", str(tmp_path), "--federation.rounds", "1"])
    assert cfg.method.train_head == "auto"
    summary = Simulation(cfg=cfg, loggers=[]).run()
    state = torch.load(cfg.run_dir / "checkpoints" / "server.pt", weights_only=False)["state"]
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)  # the initial model is seeded by the run seed: rebuild its head
        import timm

        f = cfg.method
        start = timm.create_model(f.pretrain_model, pretrained=False, num_classes=10, **f.pretrain_overrides)
    assert not torch.equal(state["head.weight"], start.head.weight)  # it received gradients and was averaged
    assert torch.isfinite(state["head.weight"]).all()
    lora_per_block = sum(v.numel() for k, v in state.items() if k.startswith("lora.blocks.0."))
    head = sum(v.numel() for k, v in state.items() if k.startswith("head."))
    depths = np.array(summary["final_depths"])
    assert summary["bytes_up"] == (4 * (lora_per_block * depths + head + depths) + SCALAR_BYTES).sum()
    assert summary["train_head"] is True and summary["train_head_setting"] == "auto"


@pytest.mark.parametrize(
    "key, hint",
    [
        ("rho", "did you mean 'sflf.lora'?"),
        ("vae_image_size", "allowed here"),
        ("pretrain_epochs", "did you mean 'sflf.pretrain_model'?"),
    ],
)
def test_a_key_no_stage_of_sflf_reads_is_an_unknown_key(key, hint):
    """SFLF = ImageNet init → LoRA: its section is composed of those stages' keys, so a synthesis or
    pre-training key is refused with a did-you-mean, on the command line and in the YAML."""
    from fl_lightning.errors import UsageError

    with pytest.raises(UsageError, match=f"unknown key 'sflf.{key}'") as err:
        load_config(TINY, [f"--sflf.{key}", "1"])
    assert hint in str(err.value)


def test_a_comparison_carries_over_only_the_keys_sflf_reads():
    """A variant switching from fedisyn keeps the shared fine-tuning keys (lora, finetune_lr, the ViT) and
    drops the synthesis ones, rather than accepting and ignoring them."""
    from fl_lightning.config.variants import expand_variants

    runs = {r.run_name: r for r in expand_variants(load_config(CONF / "fedisyn_compare_tiny.yaml"))}
    sflf, fedisyn = runs["sflf"].method, runs["fedisyn"].method
    assert (sflf.lora, sflf.finetune_lr, sflf.pretrain_overrides) == (
        fedisyn.lora,
        fedisyn.finetune_lr,
        fedisyn.pretrain_overrides,
    )
    assert not hasattr(sflf, "rho") and not hasattr(sflf, "vae_image_size")
    assert sflf.systems.depth_policy == "full" and sflf.systems.profiles == fedisyn.systems.profiles


@pytest.mark.outcome
def test_sflf_learns_above_chance_once_its_fresh_head_trains(tmp_path, one_thread):
    """A FeDiSyn-family run that learns: SFLF on IID digits (10 classes, chance 0.1) with its fresh head training
    (train_head: auto). Seeds 0, 1 and 1000 reach 0.19-0.23 on this CPU; the bound sits well below."""
    seed = outcome_seed(0)
    cfg = load_config(
        TINY,
        [
            "--output_dir",
            str(tmp_path),
            "--seed",
            str(seed),
            "--partition.seed",
            str(seed),
            "--data.num_samples",
            "400",
            "--federation.rounds",
            "3",
            "--sflf.finetune_lr",
            "3e-3",
            "--partition.alpha",
            "inf",
        ],
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()
    assert summary["train_head"] is True
    expect("SFLF tiny accuracy (chance 0.1)", summary["accuracy"], ">", 0.14)
