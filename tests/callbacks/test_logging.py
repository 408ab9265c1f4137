"""W&B (offline, no network) and TensorBoard receive the run; metrics.csv is always written."""

from fl_lightning.config import load_config
from fl_lightning.federation.simulation import Simulation
from tests.conftest import CONF


def test_wandb_offline_and_tensorboard(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = load_config(CONF / "fedavg_digits_tiny.yaml",
                      ["--output_dir", str(tmp_path), "--federation.rounds", "2", "--partition.num_clients", "3",
                       "--logging.wandb", "true", "--logging.tensorboard", "true", "--logging.progress", "false"])
    Simulation(cfg=cfg).run()
    runs = list((cfg.run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert list((cfg.run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert len((cfg.run_dir / "metrics.csv").read_text().splitlines()) == 3
