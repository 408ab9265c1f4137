"""One privacy path for every rank count: each mechanism on 1 and 2 processes (gloo) gives the same noised state,
bit for bit (``privacy.reproducible_noise``: the same seeded noise), so the server's step runs wherever the
aggregate runs. Before, on 2 ranks a method that evaluates on every rank skipped the server's clipping and noise
and still reported an ε."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("dp_accounting")  # the 'privacy' extra
import torch

from fl_lightning.federation.storage.checkpoint import safe_load
from tests.conftest import CONF, run_cli

_CASES = {
    "statistics_central": (
        CONF / "fedcgs_digits_tiny.yaml",
        "fedcgs",
        ["--federation.privacy.noise_multiplier", "3", "--federation.privacy.delta", "1e-4"],
    ),
    "statistics_local": (
        CONF / "fedcgs_digits_tiny.yaml",
        "fedcgs",
        ["--federation.privacy.noise_multiplier", "3", "--federation.privacy.delta", "1e-4"],
    ),
    "dp_fedavg": (
        CONF / "fedavg_digits_tiny.yaml",
        "fedavg",
        [
            "--federation.privacy.noise_multiplier",
            "1",
            "--federation.privacy.delta",
            "0.1",
            "--federation.privacy.clip_norm",
            "0.1",
        ],
    ),
}


def _run(tmp_path, label: str, mechanism: str, *extra: str) -> tuple[dict, dict]:
    config, algorithm, settings = _CASES[mechanism]
    out = tmp_path / label
    done = run_cli(
        "--config",
        str(config),
        "--output_dir",
        str(out),
        "--run_name",
        "run",
        "--logging.progress",
        "false",
        "--federation.rounds",
        "2",
        "--partition.num_clients",
        "4",
        "--data.num_samples",
        "400",
        "--federation.privacy.mechanism",
        mechanism,
        "--federation.privacy.reproducible_noise",
        "true",
        *settings,
        *extra,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "run" / "summary.json").read_text())
    return summary, safe_load(out / "run" / "checkpoints" / "server.pt")["state"]


@pytest.mark.parametrize(
    "mechanism",
    [
        "dp_fedavg",
        "statistics_central",
        # local noise is drawn on the client, wherever it runs: the server's path is the central case's
        pytest.param("statistics_local", marks=pytest.mark.slow),
    ],
)
def test_each_mechanism_noises_the_same_state_on_one_and_two_processes(tmp_path, mechanism):
    one, state1 = _run(tmp_path, "one", mechanism)
    two, state2 = _run(tmp_path, "two", mechanism, "--federation.devices", "2")
    assert two["world_size"] == 2 and one["epsilon"] == two["epsilon"] < float("inf")
    assert state1.keys() == state2.keys()
    for key in state1:
        assert torch.equal(state1[key], state2[key]), key
    assert "warning" in two["privacy"] and two["privacy"]["noise_source"].startswith("reproducible")
