"""W&B (offline, no network) and TensorBoard receive the run; metrics.csv is always written."""

import json

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


def _wandb_files(folder):
    return sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))


def test_a_comparison_leaves_one_wandb_run_per_run_each_with_its_own_data(tmp_path, monkeypatch, capsys):
    """Two variants: two W&B runs (each run's metrics, partition image and tables in its own, finished when the
    run ends, grouped by the comparison and tagged), plus one for the comparison's table and plot."""
    from fl_lightning import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    rc = train.main(["--config", str(CONF / "fedopal_table2_tiny.yaml"), "--variants",
                     "[{algorithm: afl, label: AFL}, {algorithm: fedcgs, label: FedCGS, fedcgs: {shrinkage: 1.0e-6}}]",
                     "--sweep", '{partition.alpha: [0.1], "seed,partition.seed": [[0, 0]]}',
                     "--logging.wandb", "true", "--output_dir", str(tmp_path / "cmp")])
    assert rc == 0, capsys.readouterr().err[-3000:]
    import wandb

    # finish() hands the last records to wandb's own service process, which writes the .wandb files; wait
    # for it (a loaded machine read the comparison's file with its header only)
    wandb.teardown()
    out = tmp_path / "cmp"
    names = {"afl": "afl_digits_a0.1_s0", "fedcgs": "fedcgs_digits_a0.1_s0"}
    data = {}
    for method, name in names.items():
        files = _wandb_files(out / name)
        assert len(files) == 1, (name, files)
        data[method] = files[0].read_bytes()
        media = files[0].parent / "files" / "media"
        assert len(list(media.glob("images/partition_*.png"))) == 1
        assert list(media.glob("table/clients_*.table.json")) and list(media.glob("table/per_class_accuracy_*"))
    for method, other in (("afl", "fedcgs"), ("fedcgs", "afl")):
        own = data[method]
        assert names[method].encode() in own and names[other].encode() not in own
        assert f"label={'AFL' if method == 'afl' else 'FedCGS'}".encode() in own and b"alpha=0.1" in own
        assert b"cmp" in own and b"bytes_up_per_client" in own  # the group; the final numbers in the summary
    ids = {m: json.loads((out / n / "run.json").read_text())["run_id"].encode() for m, n in names.items()}
    assert ids["afl"] != ids["fedcgs"]  # the W&B run id is the run's id in run.json
    assert ids["afl"] in data["afl"] and ids["fedcgs"] in data["fedcgs"] and ids["afl"] not in data["fedcgs"]
    table = _wandb_files(out)  # the comparison's own W&B run
    assert len(table) == 1 and b"comparison" in table[0].read_bytes()
    assert list(table[0].parent.glob("files/media/table/comparison_*.table.json"))
    assert list(table[0].parent.glob("files/media/images/comparison_plot_*.png"))


def test_wandb_mode_from_the_environment_wins_and_resume_keeps_the_id(tmp_path, monkeypatch):
    from fl_lightning.callbacks.wandb_logging import wandb_init_args
    from fl_lightning.config import config_to_dict
    from fl_lightning.federation.run_folder import write_record

    cfg = load_config(CONF / "fedavg_digits_tiny.yaml", ["--output_dir", str(tmp_path), "--logging.wandb", "true",
                                                           "--logging.mode", "online"])
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_init_args(cfg)["mode"] == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert "mode" not in wandb_init_args(cfg)  # W&B reads the user's WANDB_MODE

    cfg.run_dir.mkdir(parents=True)
    write_record(cfg.run_dir, config_to_dict(cfg), resumed=False)
    first = wandb_init_args(cfg)["id"]
    write_record(cfg.run_dir, config_to_dict(cfg), resumed=True)
    assert wandb_init_args(cfg)["id"] == first  # --resume continues the same W&B run
    write_record(cfg.run_dir, config_to_dict(cfg), resumed=False)
    assert wandb_init_args(cfg)["id"] != first  # a fresh start (--overwrite) is a new one
    assert wandb_init_args(cfg)["group"] is None and "fedavg" in wandb_init_args(cfg)["tags"]
