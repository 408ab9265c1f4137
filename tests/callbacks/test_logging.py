"""W&B (offline, no network) and TensorBoard receive the run; metrics.csv is always written."""

import json

import pytest

from fl_lightning.config.loading import load_config
from fl_lightning.federation.simulation import Simulation
from tests.conftest import CONF
from tests.tiny_runs import tiny_config


def test_wandb_offline_and_tensorboard(tmp_path, monkeypatch):
    """Read back as W&B and TensorBoard record them: one W&B run (its id, name, job type and tags), the resolved
    config, a history row per round with its accuracy, the partition image as pixels, the final summary and a
    clean exit; TensorBoard: one event file with the rounds' scalars, the config as HParams and the image.
    Run alone in a fresh process this is what a user's first run meets (no pyplot imported by anyone)."""
    import numpy as np

    from fl_lightning.data.report import partition_image
    from tests.logger_records import tensorboard_run, wandb_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = tiny_config(tmp_path, "--logging.wandb", "true", "--logging.tensorboard", "true", clients=3)
    summary = Simulation(cfg=cfg).run()
    import wandb

    wandb.teardown()  # the service process writes the last records: wait for it
    files = list((cfg.run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    rec = wandb_run(files[0])
    assert len(rec["runs"]) == 1 and rec["exit"]
    run = rec["runs"][0]
    assert files[0].name == f"run-{run.run_id}.wandb"  # (the CLI's run.json fixes the id: see the next tests)
    assert (run.display_name, run.job_type, run.run_group) == (cfg.resolved_run_name, "fedavg", "")
    assert {"fedavg", "alpha=0.5", "seed=0"} <= set(run.tags)
    assert rec["config"]["algorithm"] == "fedavg" and rec["config"]["federation"]["rounds"] == 2
    assert rec["config"]["partition"]["num_clients"] == 3

    metrics = [line.split(",") for line in (cfg.run_dir / "metrics.csv").read_text().splitlines()]
    csv_acc = [float(row[metrics[0].index("accuracy")]) for row in metrics[1:]]
    rounds = [row for row in rec["history"] if "accuracy" in row]
    assert [row["round"] for row in rounds] == [0, 1]
    assert [row["accuracy"] for row in rounds] == pytest.approx(csv_acc, rel=1e-6)
    image = [row for row in rec["history"] if "partition/width" in row]
    assert len(image) == 1
    pixels = partition_image(np.zeros((3, 10), dtype=np.int64), [str(c) for c in range(10)])
    assert (image[0]["partition/height"], image[0]["partition/width"]) == pixels.shape[:2]
    assert len(list(files[0].parent.glob("files/media/images/partition_*.png"))) == 1
    assert rec["summary"]["accuracy"] == pytest.approx(summary["accuracy"], rel=1e-6)
    assert rec["summary"]["bytes_up"] == summary["bytes_up"] and rec["summary"]["rounds"] == 2

    tb = tensorboard_run(cfg.run_dir / "tensorboard")
    assert tb["files"] == 1
    assert [step for step, _ in tb["scalars"]["accuracy"]] == [0, 1]
    assert [v for _, v in tb["scalars"]["accuracy"]] == pytest.approx(csv_acc, rel=1e-6)
    assert tb["hparams"]["algorithm"] == "fedavg" and tb["hparams"]["federation/rounds"] == 2
    assert tb["images"]["partition"] == [(0, pixels.shape[1], pixels.shape[0])]
    assert len(metrics) == 3


def test_the_partition_reaches_wandb_as_pixels_in_a_process_that_never_imported_pyplot(tmp_path):
    """The failure a fresh install met (wandb 0.31 compares a Figure with ``matplotlib.pyplot``), checked in a
    process of its own, whatever this test process imported before."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, wandb\n"
        "from fl_lightning.data.report import partition_image\n"
        "img = wandb.Image(partition_image(np.array([[1, 2], [3, 0]]), ['a', 'b']))\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
        "print(img.image.size)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(CONF.parent)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("(")


def _wandb_files(folder):
    return sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))


def test_a_comparison_leaves_one_wandb_run_per_run_each_with_its_own_data(tmp_path, monkeypatch, capsys):
    """Two variants: two W&B runs (each run's metrics, partition image and tables in its own, finished when the
    run ends, grouped by the comparison and tagged), plus one for the comparison's table and plot."""
    from fl_lightning import train
    from tests.logger_records import wandb_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    rc = train.main(
        [
            "--config",
            str(CONF / "fedopal_table2_tiny.yaml"),
            "--variants",
            "[{algorithm: afl, label: AFL}, {algorithm: fedcgs, label: FedCGS, fedcgs: {shrinkage: 1.0e-6}}]",
            "--sweep",
            '{partition.alpha: [0.1], "seed,partition.seed": [[0, 0]]}',
            "--logging.wandb",
            "true",
            "--output_dir",
            str(tmp_path / "cmp"),
        ]
    )
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
    for method, name in names.items():  # as W&B records them
        rec = wandb_run(_wandb_files(out / name)[0])
        assert len(rec["runs"]) == 1 and rec["exit"]
        run = rec["runs"][0]
        assert (run.run_id, run.run_group, run.job_type, run.display_name) == (ids[method].decode(), "cmp", method, name)
        assert rec["config"]["algorithm"] == method and rec["config"]["label"] == ("AFL" if method == "afl" else "FedCGS")
        assert len([row for row in rec["history"] if "accuracy" in row]) == 1  # one round
        assert {"accuracy", "bytes_up_per_client", "rounds"} <= set(rec["summary"])
    table = _wandb_files(out)  # the comparison's own W&B run
    comparison = wandb_run(table[0])["runs"]
    assert [(r.run_group, r.job_type) for r in comparison] == [("cmp", "comparison")]
    assert len(table) == 1 and b"comparison" in table[0].read_bytes()
    assert list(table[0].parent.glob("files/media/table/comparison_*.table.json"))
    assert list(table[0].parent.glob("files/media/images/comparison_plot_*.png"))


def test_wandb_mode_from_the_environment_wins_and_resume_keeps_the_id(tmp_path, monkeypatch):
    from fl_lightning.callbacks.wandb_logging import wandb_init_args
    from fl_lightning.config.loading import config_to_dict
    from fl_lightning.federation.storage.run_folder import write_record

    cfg = load_config(
        CONF / "fedavg_digits_tiny.yaml", ["--output_dir", str(tmp_path), "--logging.wandb", "true", "--logging.mode", "online"]
    )
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
