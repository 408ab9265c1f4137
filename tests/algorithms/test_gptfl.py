"""GPT-FL: class counts only in round 0, text-only generation from T−1, full-parameter FedAvg (traffic counted)."""

import json
import math

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.gptfl import FullFedAvg
from fl_lightning.config.loading import load_config
from fl_lightning.data.registry import build_dataset
from fl_lightning.errors import ConfigError
from fl_lightning.federation.run_folder import read_metrics_csv
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.transport import SCALAR_BYTES, Upload
from tests.conftest import CONF

TINY = CONF / "gptfl_tiny.yaml"


def test_gptfl_tiny_one_round(tmp_path, one_thread):
    cfg = load_config(TINY, ["--output_dir", str(tmp_path), "--federation.rounds", "1"])
    summary = Simulation(cfg=cfg, loggers=[]).run()
    run = cfg.run_dir
    rows = read_metrics_csv(run / "metrics.csv")
    # round 0: each client sends its C class counts (int64) — no latent, no per-image information
    assert int(rows[0]["bytes_up_round"]) == 4 * 10 * 8
    # text-only: every image starts from pure noise at T − 1, from its own seed; λ·D^k per class
    manifest = [json.loads(line) for line in (run / "synthetic" / "manifest.jsonl").read_text().splitlines()]
    assert {m["start_timestep"] for m in manifest} == {999} and {m["client"] for m in manifest} == {-1}
    assert len({m["seed"] for m in manifest}) == len(manifest)
    D = np.bincount(
        build_dataset("digits", root="data", seed=cfg.seed, num_samples=cfg.data.num_samples).train_targets, minlength=10
    )
    per_class = np.bincount([m["label"] for m in manifest], minlength=10)
    assert per_class.tolist() == [math.floor(cfg.method.synthetic_lambda * d + 0.5) for d in D]
    # full-parameter FedAvg: every client uploads every weight of the ViT (float32) + its sample count
    state = torch.load(run / "checkpoints" / "server.pt", weights_only=False)["state"]
    params = sum(v.numel() for k, v in state.items() if k.startswith(("backbone.", "head.")))
    assert int(rows[1]["bytes_up_round"]) == 4 * (4 * params + SCALAR_BYTES)
    assert int(rows[1]["bytes_down_round"]) >= 4 * 4 * params  # the whole model goes out every round
    assert summary["train_head"] is True and summary["depth_policy"].startswith("full")
    assert summary["final_depths"] == [summary["num_blocks"]] * 4  # all weights train, reported vs memory
    assert summary["over_memory_clients"] == [1, 2, 3]


def test_full_parameter_fedavg_is_the_data_weighted_mean():
    stage = FullFedAvg.__new__(FullFedAvg)  # the aggregation needs no model
    g = torch.Generator().manual_seed(0)
    state = {"backbone.w": torch.zeros(3, 2), "head.b": torch.zeros(2), "lora.x": torch.ones(1)}
    ups = {
        c: Upload({"backbone.w": torch.randn(3, 2, generator=g), "head.b": torch.randn(2, generator=g)}, {"num_samples": n})
        for c, n in ((0, 5), (2, 1), (3, 14))
    }
    new = stage.fold(1, state, ups)
    n = np.array([5.0, 1.0, 14.0])
    for key in ("backbone.w", "head.b"):
        expected = sum(w * ups[c].tensors[key].double().numpy() for w, c in zip(n, (0, 2, 3))) / n.sum()
        np.testing.assert_allclose(new[key].numpy(), expected, rtol=1e-6)
    assert "lora.x" not in new and stage.fold(1, state, {}) == {}


def test_gptfl_generation_must_be_text_only():
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["--gptfl.generation", "feature_guided"])
    assert err.value.key == "gptfl.generation"
