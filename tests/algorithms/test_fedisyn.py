"""FeDiSyn on the engine: the tiny config end to end, LoRA aggregation by hand, resume, offline failure."""

import json
import math

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.fedisyn import FeDiSyn
from fl_lightning.algorithms.synthetic_family.planning import SystemPlan
from fl_lightning.config.loading import load_config
from fl_lightning.data.registry import build_dataset
from fl_lightning.errors import ConfigError
from fl_lightning.federation.algorithm import RoundPlan
from fl_lightning.federation.run_data import partition_for
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.run_folder import read_metrics_csv
from fl_lightning.federation.transport import SCALAR_BYTES, Download, Upload
from tests.conftest import CONF, StopAfterClients, run_cli

TINY = CONF / "fedisyn_tiny.yaml"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # tiny models: thread sync costs more than it gives


def _rows(run_dir):
    return read_metrics_csv(run_dir / "metrics.csv")


@pytest.mark.slow  # ~40 s on 2 cores: every FeDiSyn stage through the CLI
def test_tiny_config_end_to_end_through_the_cli(tmp_path):
    proc = run_cli("--config", str(TINY), "--output_dir", str(tmp_path), env=ONE_THREAD, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = load_config(TINY, ["--output_dir", str(tmp_path)])
    run = cfg.run_dir
    for name in (
        "config.yaml",
        "summary.json",
        "metrics.csv",
        "checkpoints/server.pt",
        "prompts.json",
        "synthetic/manifest.jsonl",
    ):
        assert (run / name).exists(), name
    assert list((run / "pretrain" / "checkpoints").glob("best-*.ckpt"))
    summary = json.loads((run / "summary.json").read_text())

    # synthetic volume: round(λ · D^k) images per class, D^k over all clients' real samples
    splits = build_dataset("digits", root="data", seed=cfg.seed, num_samples=cfg.data.num_samples)
    D = np.bincount(splits.train_targets, minlength=10)
    lam = cfg.method.synthetic_lambda
    expected = [math.floor(lam * d + 0.5) for d in D]
    got = [len(list((run / "synthetic" / str(k)).glob("*.png"))) for k in range(10)]
    assert got == expected and summary["synthetic_images"] == sum(expected) and summary["lambda"] == lam

    rows = _rows(run)
    assert [int(r["round"]) for r in rows] == list(range(1 + cfg.federation.rounds))
    sim = [float(r["simulated_time_s"]) for r in rows]
    assert sim[0] > 0 and all(b > a for a, b in zip(sim, sim[1:]))
    assert summary["simulated_time_s"] == pytest.approx(sim[-1])
    # H_gene + H_pre from the config's ĥ, h̃: ĥ · images + h̃ · train images · epochs run (≤ T̂)
    assert summary["simulated_generation_s"] == pytest.approx(cfg.method.generation_time_per_image_s * sum(expected))
    assert (
        0
        < summary["simulated_pretraining_s"]
        <= (cfg.method.pretrain_time_per_image_epoch_s * sum(expected) * cfg.method.pretrain_epochs)
    )

    # round 0 uploads = the noised latents: per class Z' <= Z centroids (clusters of >= 2 samples) + the mean of
    # (4, 8, 8) float32 — the mean only for a class with <= Z samples (privacy) — + 4 scalars (label, count, timestep, Z')
    partition = partition_for(cfg, splits.train_targets)
    latent_bytes = 4 * 8 * 8 * 4
    Z = cfg.method.num_centroids
    counts = [int(n) for idx in partition for n in np.bincount(splits.train_targets[idx], minlength=10) if n > 0]
    most = sum(((Z + 1) if n > Z else 1) * latent_bytes + 4 * SCALAR_BYTES for n in counts)
    least = sum(latent_bytes + 4 * SCALAR_BYTES for n in counts)
    up0 = int(rows[0]["bytes_up_round"])
    assert least <= up0 <= most and (up0 - least) % latent_bytes == 0 and int(rows[0]["bytes_down_round"]) == 0
    # the synthesis upload and the fine-tuning traffic are reported apart; the curves count the latter (the paper's)
    assert summary["bytes_up_synthesis"] == up0 == float(rows[0]["bytes_up_synthesis"])
    assert summary["bytes_up_finetune"] == summary["bytes_up"] - up0 > 0 and float(rows[0]["bytes_up_finetune"]) == 0
    # ... and the latents are on the channel clock: the synthesis round's time includes their upload
    assert summary["simulated_synthesis_upload_s"] > 0
    assert sim[0] == pytest.approx(
        summary["simulated_generation_s"] + summary["simulated_pretraining_s"] + summary["simulated_synthesis_upload_s"]
    )
    # the pre-trained model travels once (round 1); later downloads carry LoRA + head only
    assert int(rows[1]["bytes_down_round"]) > 5 * int(rows[2]["bytes_down_round"]) > 0

    # depths: clients cycle xavier, orin_nx, orin_nx, orin_nx; orin_nx memory allows (5.5 - 2.5) / 1.5 = 2
    depths = summary["final_depths"]
    assert all(1 <= d <= 2 for d in depths[1:]) and 1 <= depths[0] <= summary["num_blocks"] == 4
    assert summary["depth_policy"] == "clc" and 0.0 <= summary["accuracy"] <= 1.0

    # two CPU processes (ddp over gloo): the same images bitwise; the server pre-training is data-parallel over both
    # (modules/pretraining_ranks.py: the same global batches, not the same floats), so what follows it is one
    # rank's within round-off: measured on this config, the same accuracies, the test loss 2.3189 vs 2.3163
    two = run_cli(
        "--config", str(TINY), "--output_dir", str(tmp_path / "two"), "--federation.devices", "2", env=ONE_THREAD, timeout=240
    )
    assert two.returncode == 0, two.stderr[-2000:]
    run2 = tmp_path / "two" / run.name
    summary2 = json.loads((run2 / "summary.json").read_text())
    assert summary2["world_size"] == 2
    assert all(
        (run2 / "synthetic" / str(k) / p.name).read_bytes() == p.read_bytes()
        for k in range(10)
        for p in (run / "synthetic" / str(k)).glob("*.png")
    )
    held_out = [
        [
            float(r["val_acc"])
            for r in read_metrics_csv(folder / "pretrain" / "pretrain" / "version_0" / "metrics.csv")
            if r.get("val_acc")
        ]
        for folder in (run, run2)
    ]
    assert len(held_out[0]) == len(held_out[1]) == cfg.method.pretrain_epochs
    assert max(abs(a - b) for a, b in zip(*held_out)) <= 1 / 12 + 1e-6, held_out  # 12 held-out images: one
    assert summary2["accuracy"] == pytest.approx(summary["accuracy"], abs=0.02)
    assert summary2["loss"] == pytest.approx(summary["loss"], rel=0.01)
    skip = (
        "wall_time_s",
        "world_size",
        "host_generation_s",
        "host_pretraining_s",  # wall clocks
        "loss",
        "accuracy",
    )
    assert {k: v for k, v in summary2.items() if k not in skip} == {k: v for k, v in summary.items() if k not in skip}


def _hand_state():
    g = torch.Generator().manual_seed(0)
    state = {f"lora.blocks.{l}.attn.qkv.lora_A.weight": torch.randn(2, 3, generator=g) for l in range(3)}
    state.update({"head.weight": torch.randn(2, 2, generator=g), "head.bias": torch.randn(2, generator=g)})
    state.update(
        {
            "sys.clock": torch.tensor([1.0, 2.0, 0.0, 0.0], dtype=torch.float64),
            "sys.bytes_up": torch.zeros(2, dtype=torch.float64),
            "sys.contrib": torch.zeros(3, 3, dtype=torch.float64),
            "sys.contrib_round": torch.full((3, 3), -1, dtype=torch.int64),
            "sys.depths": torch.zeros(3, dtype=torch.int64),
            "sys.requested": torch.zeros(3, dtype=torch.int64),
            "sys.limits": torch.zeros(3, dtype=torch.int64),
            "sys.over_memory_rounds": torch.zeros(3, dtype=torch.int64),
            "sys.round_time": torch.tensor(0.0, dtype=torch.float64),
        }
    )
    return state


def _client_upload(state, depth, n, seed):
    g = torch.Generator().manual_seed(seed)
    tensors = {
        k: torch.randn(v.shape, generator=g)
        for k, v in state.items()
        if k.startswith("head.") or k.startswith("lora.") and int(k.split(".")[2]) >= 3 - depth
    }
    tensors["contribution"] = torch.arange(1, depth + 1, dtype=torch.float32) * seed
    return Upload(tensors, {"num_samples": n})


def _algorithm():
    algo = FeDiSyn(cfg=load_config(TINY))
    algo.num_blocks = 3
    return algo


def _plan(plan_clients, depths):
    system = SystemPlan(plan_clients, np.array(depths), np.ones(len(depths)), 2.5, np.ones(len(depths)))
    return RoundPlan({c: Download() for c in plan_clients}, system.as_decisions())


def test_lora_aggregation_is_per_block_over_the_devices_that_trained_it():
    state = _hand_state()
    ups = {0: _client_upload(state, 1, 1, 1), 1: _client_upload(state, 3, 2, 2), 2: _client_upload(state, 2, 3, 3)}
    new = _algorithm().aggregate(1, state, ups, {}, _plan([0, 1, 2], [1, 3, 2]))
    f64 = {c: {k: v.double().numpy() for k, v in u.tensors.items()} for c, u in ups.items()}
    key = "lora.blocks.{}.attn.qkv.lora_A.weight".format
    # block 0: only client 1 (depth 3); block 1: clients 1, 2; block 2: all three — data-size weights
    np.testing.assert_allclose(new[key(0)].numpy(), f64[1][key(0)], rtol=1e-6)
    np.testing.assert_allclose(new[key(1)].numpy(), (2 * f64[1][key(1)] + 3 * f64[2][key(1)]) / 5, rtol=1e-6)
    np.testing.assert_allclose(new[key(2)].numpy(), (f64[0][key(2)] + 2 * f64[1][key(2)] + 3 * f64[2][key(2)]) / 6, rtol=1e-6)
    np.testing.assert_allclose(
        new["head.weight"].numpy(), (f64[0]["head.weight"] + 2 * f64[1]["head.weight"] + 3 * f64[2]["head.weight"]) / 6, rtol=1e-6
    )
    # contributions land in each device's last blocks, stamped with the round; clock and depths advance
    assert new["sys.contrib"][1].tolist() == [2.0, 4.0, 6.0] and new["sys.contrib"][0].tolist() == [0.0, 0.0, 1.0]
    assert new["sys.contrib_round"][2].tolist() == [-1, 1, 1]
    assert new["sys.clock"].tolist() == [1.0, 2.0, 2.5, 0.0] and new["sys.depths"].tolist() == [1, 3, 2]
    assert new["sys.bytes_up"].tolist() == [0.0, float(sum(u.num_bytes for u in ups.values()))]  # fine-tuning traffic


def test_blocks_nobody_trained_keep_their_global_value():
    state = _hand_state()
    new = _algorithm().aggregate(1, state, {0: _client_upload(state, 1, 4, 1)}, {1: "crashed"}, _plan([0, 1], [1, 3]))
    for block in (0, 1):
        key = f"lora.blocks.{block}.attn.qkv.lora_A.weight"
        assert torch.equal(new[key], state[key])
    assert torch.allclose(
        new["lora.blocks.2.attn.qkv.lora_A.weight"],
        _client_upload(state, 1, 4, 1).tensors["lora.blocks.2.attn.qkv.lora_A.weight"],
    )


def test_resume_in_a_lora_round_gives_the_same_summary(tmp_path, one_thread):
    def cfg(name):
        return load_config(TINY, ["--output_dir", str(tmp_path / name), "--federation.rounds", "2"])

    full = Simulation(cfg=cfg("full"), loggers=[]).run()
    cut = cfg("cut")
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cut, loggers=[], callbacks=[StopAfterClients(6)]).run()  # round 1, 2 of 4 clients done
    assert list((cut.run_dir / "checkpoints").glob("round0001*"))  # the interrupted round's records
    resumed = Simulation(cfg=cut, loggers=[], resume=True).run()
    drop = ("wall_time_s", "world_size", "host_generation_s", "host_pretraining_s")  # wall clocks
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}


def test_resume_in_round_0_pretraining_continues_and_gives_the_same_summary(tmp_path, one_thread, monkeypatch):
    """Interrupted in epoch 2 of 2 of the server's pre-training, --resume keeps every synthetic image, continues
    pre-training from the end of epoch 1 and ends with the uninterrupted run's summary and server state."""
    import lightning

    from fl_lightning.algorithms.synthetic_family import synthesis_step
    from fl_lightning.federation.storage.checkpoint import safe_load
    from fl_lightning.modules.pretraining import EPOCH_STATE

    class StopInEpoch2(lightning.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.current_epoch == 1:
                raise KeyboardInterrupt

    def cfg(name):
        return load_config(TINY, ["--output_dir", str(tmp_path / name), "--federation.rounds", "1"])

    full = Simulation(cfg=cfg("full"), loggers=[]).run()
    real, resumed_from = synthesis_step.pretrain_classifier, []
    monkeypatch.setattr(synthesis_step, "pretrain_classifier", lambda **kw: real(**kw, callbacks=[StopInEpoch2()]))
    cut = cfg("cut")
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cut, loggers=[]).run()
    assert (cut.run_dir / "pretrain" / EPOCH_STATE).is_file()
    images = {p: p.stat().st_mtime_ns for p in (cut.run_dir / "synthetic").rglob("*.png")}
    assert images

    def spy(**kw):
        resumed_from.append((kw["out_dir"] / EPOCH_STATE).is_file())
        return real(**kw)

    monkeypatch.setattr(synthesis_step, "pretrain_classifier", spy)
    resumed = Simulation(cfg=cut, loggers=[], resume=True).run()
    assert resumed_from == [True] and not (cut.run_dir / "pretrain" / EPOCH_STATE).exists()
    assert {p: p.stat().st_mtime_ns for p in (cut.run_dir / "synthetic").rglob("*.png")} == images  # none redone
    drop = ("wall_time_s", "world_size", "host_generation_s", "host_pretraining_s")  # wall clocks
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    a = safe_load(tmp_path / "full" / cut.run_dir.name / "checkpoints" / "server.pt")["state"]
    b = safe_load(cut.run_dir / "checkpoints" / "server.pt")["state"]
    assert a.keys() == b.keys()
    for k in a.keys() - {"sys.host_times"}:  # (this host's wall times)
        assert torch.equal(a[k], b[k]), k


def test_food101_config_fails_offline_with_one_line(tmp_path):
    proc = run_cli("--config", str(CONF / "fedisyn_food101.yaml"), "--output_dir", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fl_lightning:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "fedisyn.diffusion_path" in errors[0] and "fedisyn.pretrain_checkpoint" in errors[0]
    assert not (tmp_path / "fedisyn_food101_a0.3_s0" / "synthetic").exists()


@pytest.mark.parametrize(
    "override, key",
    [
        (["--fedisyn.synthetic_lambda", "null"], "fedisyn.scaling_kappa"),
        (["--fedisyn.scaling_kappa", "[1, 2]"], "fedisyn.scaling_kappa"),
        (["--fedisyn.systems.boards", "[jetson_nano]"], "fedisyn.systems.boards"),
        (["--fedisyn.systems.profiles", "{jetson_orin_nx: {speed: 2}}"], "fedisyn.systems.profiles.jetson_orin_nx"),
        (["--fedisyn.lora.alpha", "0"], "fedisyn.lora.alpha"),
        (
            ["--fedisyn.systems.profiles", "{jetson_orin_nx: {forward_time_s: -1}}"],
            "fedisyn.systems.profiles.jetson_orin_nx.forward_time_s",
        ),
        (
            ["--fedisyn.systems.profiles", "{jetson_orin_nx: {memory_budget_gb: 2.0}}"],  # 2.19 + 0.33 > 2: not one block
            "fedisyn.systems.profiles.jetson_orin_nx.memory_budget_gb",
        ),
        (["--fedisyn.systems.reference_loss_db", ".nan"], "fedisyn.systems.reference_loss_db"),
        (["--fedisyn.systems.bandwidth_allocation", "fair"], "fedisyn.systems.bandwidth_allocation"),
        (["--fedisyn.synthetic_lambda", "null", "--fedisyn.scaling_kappa", "[1, -0.5, 2, 0]"], "fedisyn.scaling_kappa"),
        (["--fedisyn.scaling_kappa", "[1, .inf, 2, 0]"], "fedisyn.scaling_kappa"),
        (["--fedisyn.min_fresh_fraction", "1.0"], "fedisyn.min_fresh_fraction"),
        (["--fedisyn.min_timestep", "0"], "fedisyn.min_timestep"),  # privacy: s >= 1
        (["--fedisyn.timestep", "0"], "fedisyn.timestep"),
        (["--fedisyn.systems.backbone", "resnet50"], "fedisyn.systems.backbone"),
    ],
)
def test_bad_fedisyn_settings_name_their_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, override)
    assert err.value.key == key


def test_lambda_from_the_scaling_law(tmp_path, one_thread):
    """synthetic_lambda: null → λ* = (κ2 e^{κ3 Acc} / (h0 κ1))^{1/(κ2+1)}, h0 = (ĥ + h̃ T̂) D."""
    kappa = [0.5, 0.8, 2.0, 1.0]
    cfg = load_config(
        TINY,
        [
            "--output_dir",
            str(tmp_path),
            "--federation.rounds",
            "1",
            "--fedisyn.synthetic_lambda",
            "null",
            "--fedisyn.scaling_kappa",
            str(kappa),
        ],
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()
    f = cfg.method
    h0 = (f.generation_time_per_image_s + f.pretrain_time_per_image_epoch_s * f.pretrain_epochs) * summary["real_samples"]
    k1, k2, k3, _ = kappa
    expected = (k2 * math.exp(k3 * f.target_accuracy) / (h0 * k1)) ** (1 / (k2 + 1))
    assert summary["lambda"] == pytest.approx(expected, rel=1e-9)
    assert summary["synthetic_images"] > 0


def test_a_lambda_star_that_overflows_names_the_kappas(tmp_path):
    """κ3·Acc so large that e^{κ3 Acc} overflows: a ConfigError on fedisyn.scaling_kappa, before any image."""
    from fl_lightning.algorithms.synthetic_family.synthesis_step import choose_lambda

    cfg = load_config(TINY, ["--fedisyn.synthetic_lambda", "null", "--fedisyn.scaling_kappa", "[1.0, 1.0, 1000000.0, 0]"])
    with pytest.raises(ConfigError) as err:
        choose_lambda(cfg.method, gen_time_per_image=0.5, pretrain_time_per_image_epoch=0.01, num_real_samples=240)
    assert err.value.key == "fedisyn.scaling_kappa"


def test_without_feature_guidance_clients_upload_counts_and_images_start_from_noise(tmp_path, one_thread):
    """w/o FG (generation: text_only): round 0 carries C int64 counts per client, no latent; then FeDiSyn's LoRA."""
    cfg = load_config(TINY, ["--output_dir", str(tmp_path), "--federation.rounds", "1", "--fedisyn.generation", "text_only"])
    summary = Simulation(cfg=cfg, loggers=[]).run()
    rows = _rows(cfg.run_dir)
    assert int(rows[0]["bytes_up_round"]) == cfg.partition.num_clients * 10 * 8
    manifest = [json.loads(line) for line in (cfg.run_dir / "synthetic" / "manifest.jsonl").read_text().splitlines()]
    assert {m["start_timestep"] for m in manifest} == {999} and len(manifest) == summary["synthetic_images"]
    assert summary["generation"] == "text_only" and summary["depth_policy"] == "clc"
    assert summary["train_head"] is False and summary["over_memory_clients"] == []  # CLC searches within memory


def test_former_key_systems_devices_still_names_the_boards():
    """`devices` means ranks in `federation`; the boards are `fedisyn.systems.boards`. The former key works,
    with a hint, and cannot be given beside the new one."""
    from fl_lightning.algorithms.synthetic_family.config import SystemsConfig

    with pytest.warns(FutureWarning, match="fedisyn.systems.devices is now called fedisyn.systems.boards"):
        old = SystemsConfig(devices=["jetson_orin_nx"])
    assert old.boards == ["jetson_orin_nx"] and old.devices is None
    assert SystemsConfig(boards=["jetson_orin_nx"]) == old
    with pytest.raises(ConfigError, match="devices"):
        SystemsConfig(boards=["jetson_orin_nx"], devices=["jetson_agx_xavier"])


@pytest.mark.slow  # three tiny FeDiSyn runs (~1 min on 2 cores)
def test_variants_that_differ_in_fine_tuning_share_one_round_0(tmp_path, one_thread):
    """w/o CLC differs from FeDiSyn after round 0 only: in one output folder it reuses FeDiSyn's images and
    pre-trained ViT (hard links, the content key under round0/), with the numbers of a run that made its own."""

    def cfg(folder, name, *extra):
        return load_config(TINY, ["--output_dir", str(tmp_path / folder), "--run_name", name, "--federation.rounds", "1", *extra])

    wo_clc = ("--fedisyn.systems.depth_policy", "capacity")
    Simulation(cfg=cfg("cmp", "fedisyn"), loggers=[]).run()
    shared = Simulation(cfg=cfg("cmp", "wo_clc", *wo_clc), loggers=[]).run()
    alone = Simulation(cfg=cfg("alone", "wo_clc", *wo_clc), loggers=[]).run()
    keys = list((tmp_path / "cmp" / "round0").iterdir())
    assert len(keys) == 1  # one content key: both runs' round 0 is the same
    first, second = (tmp_path / "cmp" / name / "pretrain" / "checkpoints" for name in ("fedisyn", "wo_clc"))
    (a,), (b,) = list(first.glob("best-*.ckpt")), list(second.glob("best-*.ckpt"))
    assert a.stat().st_ino == b.stat().st_ino  # the second run pre-trained nothing
    images = sorted(p.relative_to(second.parents[1]) for p in (second.parents[1] / "synthetic").rglob("*.png"))
    alone_dir = tmp_path / "alone" / "wo_clc"
    assert images and all((second.parents[1] / p).read_bytes() == (alone_dir / p).read_bytes() for p in images)
    drop = ("wall_time_s", "world_size", "host_generation_s", "host_pretraining_s")  # wall clocks
    assert {k: v for k, v in shared.items() if k not in drop} == {k: v for k, v in alone.items() if k not in drop}
