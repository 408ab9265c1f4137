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
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.federation.storage.round_store import RoundStore
from fl_lightning.federation.storage.run_folder import read_metrics_csv
from fl_lightning.federation.transport import SCALAR_BYTES, Upload
from tests.conftest import CONF, run_cli

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


def _fine_tuned(state: dict) -> dict:
    """The model's tensors (not the measured host times the system model keeps)."""
    return {k: v for k, v in state.items() if k.startswith(("backbone.", "head.", "lora."))}


def test_whole_models_folded_where_they_are_trained_are_the_servers_fold_bit_for_bit(tmp_path, monkeypatch, one_thread):
    """Full-parameter FedAvg rounds fold each upload as its client ends (summed_uploads.py): no client record reaches
    the disk even where the store would write every one, and the model is the one the server folds from the records
    (``record_after_s: 0``) bit for bit."""
    written: list[tuple[str, int]] = []
    write = RoundStore._write_client
    monkeypatch.setattr(
        RoundStore, "_write_client", lambda self, c, *a: (written.append((self.folder.name, c)), write(self, c, *a))[1]
    )
    states = {}
    for name, after in (("folded", "1e-9"), ("stored", "0")):
        cfg = load_config(
            TINY, ["--output_dir", str(tmp_path / name), "--federation.rounds", "2", "--federation.record_after_s", after]
        )
        written.clear()
        Simulation(cfg=cfg, loggers=[]).run()
        states[name] = _fine_tuned(safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"])
        rounds = {r for r, _ in written}
        assert rounds == ({"round0000"} if name == "folded" else {"round0000", "round0001", "round0002"}), written
    assert states["folded"].keys() == states["stored"].keys()
    for k, v in states["folded"].items():
        assert torch.equal(v, states["stored"][k]), k


@pytest.mark.slow  # four CLI runs of GPT-FL on 2 processes
def test_two_ranks_fold_whole_models_as_the_server_alone_does(tmp_path):
    """On 2 processes the ranks carry the fold (rank 1's block after rank 0's) and the model is the one rank 0 folds
    from every record (``record_after_s: 0``) bit for bit; the same for a run whose clients all sit on one rank."""
    states = {}
    for name, extra in (
        ("folded", []),
        ("stored", ["--federation.record_after_s", "0"]),
        ("one_block", ["--partition.num_clients", "1"]),
        ("one_block_stored", ["--partition.num_clients", "1", "--federation.record_after_s", "0"]),
    ):
        args = [
            "--config",
            str(TINY),
            "--output_dir",
            str(tmp_path / name),
            "--federation.rounds",
            "1",
            "--federation.devices",
            "2",
        ]
        done = run_cli(*args, *extra, env={"OMP_NUM_THREADS": "1"}, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        (server,) = (tmp_path / name).glob("*/checkpoints/server.pt")
        states[name] = _fine_tuned(safe_load(server)["state"])
    for a, b in (("folded", "stored"), ("one_block", "one_block_stored")):
        for k, v in states[a].items():
            assert torch.equal(v, states[b][k]), (a, k)


class _StopInRound1:
    """Ends the run after round 1's second client (its record, under ``record_after_s: 0``, is on disk)."""

    def on_client_end(self, round_idx: int, client: int, **_) -> None:
        if round_idx == 1 and client == 1:
            raise RuntimeError("stopped by the test")


def test_a_round_resumed_from_records_on_disk_folds_them_with_the_clients_it_runs(tmp_path, one_thread):
    """A run stopped mid-round while it wrote every record (``record_after_s: 0``), resumed with the default (the
    fold): the records on disk are folded in client order with the clients that run again — the uninterrupted model."""
    args = ["--federation.rounds", "2"]
    whole = load_config(TINY, ["--output_dir", str(tmp_path / "whole"), *args])
    Simulation(cfg=whole, loggers=[]).run()
    cut = load_config(TINY, ["--output_dir", str(tmp_path / "cut"), *args, "--federation.record_after_s", "0"])
    with pytest.raises(RuntimeError, match="stopped by the test"):
        Simulation(cfg=cut, loggers=[], callbacks=[_StopInRound1()]).run()
    assert sorted(p.name for p in (cut.run_dir / "checkpoints" / "round0001").glob("client*.pt")) == [
        "client000000.pt",
        "client000001.pt",
    ]
    resumed = load_config(TINY, ["--output_dir", str(tmp_path / "cut"), *args])
    Simulation(cfg=resumed, loggers=[], resume=True).run()
    expected = _fine_tuned(safe_load(whole.run_dir / "checkpoints" / "server.pt")["state"])
    got = _fine_tuned(safe_load(resumed.run_dir / "checkpoints" / "server.pt")["state"])
    for k, v in expected.items():
        assert torch.equal(v, got[k]), k
