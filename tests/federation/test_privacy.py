"""federation.privacy through the engine: σ=0 with no clipping is FedAvg (FedCGS) exactly, ε lands in metrics.csv
and summary.json, FedOPAL composes DP-SGD with its statistics, and bad settings stop with one line (exit 2)."""

from __future__ import annotations

import csv
import json
import math

import pytest

pytest.importorskip("dp_accounting")  # the 'privacy' extra
import torch

from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.conftest import CONF, run_cli

FEDAVG = CONF / "fedavg_digits_tiny.yaml"
FEDCGS = CONF / "fedcgs_digits_tiny.yaml"
FEDOPAL = CONF / "fedopal_digits_tiny.yaml"
_FAST = ["--logging.progress", "false", "--federation.rounds", "2", "--partition.num_clients", "4"]


def _run(config, tmp_path, name, *extra) -> tuple[dict, dict]:
    cfg = load_config(config, ["--output_dir", str(tmp_path), "--run_name", name, *_FAST, *extra])
    summary = Simulation(cfg=cfg, loggers=[]).run()
    return summary, safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]


def test_dp_fedavg_without_noise_or_clipping_is_unweighted_fedavg_bit_for_bit(tmp_path):
    plain, off = _run(FEDAVG, tmp_path, "plain", "--fedavg.weighted", "false")
    summary, dp = _run(
        FEDAVG,
        tmp_path,
        "dp",
        "--federation.privacy.mechanism",
        "dp_fedavg",
        "--federation.privacy.noise_multiplier",
        "0",
        "--federation.privacy.clip_norm",
        ".inf",
        "--federation.privacy.delta",
        "0.01",
    )
    assert off.keys() == dp.keys() and all(torch.equal(off[k], dp[k]) for k in off)
    assert summary["privacy"]["epsilon"] == float("inf") and "privacy" not in plain and "epsilon" not in plain


def test_dp_fedavg_reaches_the_target_and_reports_epsilon_per_round(tmp_path):
    summary, _ = _run(
        FEDAVG,
        tmp_path,
        "eps",
        "--federation.privacy.mechanism",
        "dp_fedavg",
        "--federation.privacy.epsilon",
        "8",
        "--federation.privacy.delta",
        "0.01",
        "--federation.privacy.clip_norm",
        "0.5",
    )
    p = summary["privacy"]
    assert 8 * 0.99 <= p["epsilon"] <= 8 and p["noise_multiplier"] > 0 and p["unit"] == "user"
    saved = json.loads((tmp_path / "eps" / "summary.json").read_text())
    assert saved["epsilon"] == p["epsilon"] and saved["delta"] == 0.01
    rows = list(csv.DictReader((tmp_path / "eps" / "metrics.csv").open()))
    spent = [float(r["epsilon"]) for r in rows]
    assert len(spent) == 2 and 0 < spent[0] < spent[1] == pytest.approx(p["epsilon"])


def test_statistics_without_noise_and_a_loose_clip_are_the_statistics_themselves(tmp_path):
    _, off = _run(FEDCGS, tmp_path, "plain")
    summary, dp = _run(
        FEDCGS,
        tmp_path,
        "central",
        "--federation.privacy.mechanism",
        "statistics_central",
        "--federation.privacy.noise_multiplier",
        "0",
        "--federation.privacy.clip_norm",
        "1e6",
        "--federation.privacy.delta",
        "1e-6",
    )
    assert all(torch.equal(off[k], dp[k]) for k in off)
    assert summary["privacy"]["unit"] == "record"
    noisy, state = _run(
        FEDCGS,
        tmp_path,
        "local",
        "--federation.privacy.mechanism",
        "statistics_local",
        "--federation.privacy.epsilon",
        "4",
        "--federation.privacy.delta",
        "1e-6",
    )
    assert not torch.equal(state["W"], off["W"]) and 0 <= noisy["accuracy"] <= 1
    assert noisy["epsilon"] == pytest.approx(4, rel=0.01)


@pytest.mark.parametrize(
    "override, key",
    [
        (["--federation.privacy.epsilon", "0"], "federation.privacy.epsilon"),
        (["--federation.privacy.epsilon", "1", "--federation.privacy.clip_norm", "0"], "federation.privacy.clip_norm"),
        (["--federation.privacy.epsilon", "1", "--federation.privacy.delta", "0.25"], "federation.privacy.delta"),
        (["--federation.privacy.mechanism", "dp_fedavg"], "federation.privacy.epsilon"),
        (["--federation.privacy.epsilon", "1", "--federation.privacy.sampling_rate", "1.5"], "federation.privacy.sampling_rate"),
    ],
)
def test_bad_settings_name_their_key(override, key):
    args = ["--federation.privacy.mechanism", "dp_fedavg", "--partition.num_clients", "4", *override]
    with pytest.raises(ConfigError) as err:
        load_config(FEDAVG, args)
    assert err.value.key == key and "\n" not in str(err.value)


def test_a_target_no_noise_reaches_is_one_line(tmp_path):
    cfg = load_config(
        FEDAVG,
        [
            "--output_dir",
            str(tmp_path),
            *_FAST,
            "--federation.privacy.mechanism",
            "dp_fedavg",
            "--federation.privacy.epsilon",
            "1e-6",
            "--federation.privacy.delta",
            "1e-5",
        ],
    )
    with pytest.raises(ConfigError) as err:
        Simulation(cfg=cfg, loggers=[]).run()
    assert err.value.key == "federation.privacy.epsilon" and "no noise multiplier" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_bad_delta_is_one_line_and_exit_2(tmp_path):
    proc = run_cli(
        "--config",
        str(FEDAVG),
        "--output_dir",
        str(tmp_path),
        *_FAST,
        "--federation.privacy.mechanism",
        "dp_fedavg",
        "--federation.privacy.epsilon",
        "1",
        "--federation.privacy.delta",
        "0.3",
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "federation.privacy.delta=0.3" in lines[0] and "1/num_clients" in lines[0]


def test_fedopal_composes_dp_sgd_of_its_prompts_with_its_statistics(tmp_path):
    summary, state = _run(
        FEDOPAL,
        tmp_path,
        "fedopal",
        "--train.epochs",
        "1",
        "--data.num_samples",
        "120",
        "--federation.privacy.mechanism",
        "statistics_central",
        "--federation.privacy.epsilon",
        "8",
        "--federation.privacy.delta",
        "1e-3",
        "--federation.privacy.dp_sgd",
        "true",
    )
    p = summary["privacy"]
    assert 8 * 0.99 <= p["epsilon"] <= 8
    from fl_lightning.privacy.accountant import epsilon

    alone = epsilon(p["noise_multiplier"], q=1.0, steps=1, delta=1e-3)  # the statistics' release by itself
    assert alone < p["epsilon"]  # the prompts' DP-SGD steps cost ε too
    # every client's DP-SGD: Poisson lots at the public q = B·K/N for ⌈1/q⌉ steps an epoch, divided by q·N/K
    sizes = json.loads((tmp_path / "fedopal" / "partition.json").read_text())
    sizes = [len(c) for c in (sizes["clients"] if isinstance(sizes, dict) else sizes)]
    N, K, B = sum(sizes), len(sizes), 64  # B: the config's data.batch_size (train.batch_size unset)
    q = min(1.0, B * K / N)
    assert p["dp_sgd"]["sampling_rate"] == q and p["dp_sgd"]["steps_per_round"] == math.ceil(1 / q)
    assert p["dp_sgd"]["lot_size"] == pytest.approx(q * N / K) and "Poisson" in p["dp_sgd"]["sampling"]
    assert epsilon(p["noise_multiplier"], delta=1e-3, parts=[(1.0, 1), (q, math.ceil(1 / q))]) == pytest.approx(
        p["epsilon"], rel=1e-9
    )
    assert torch.isfinite(state["W"]).all() and 0 <= summary["accuracy"] <= 1


# local statistics noise at ε = 4, δ = 1e-4, the prompts trained by DP-SGD
LOCAL_DP_SGD = (
    "--federation.privacy.mechanism",
    "statistics_local",
    "--federation.privacy.epsilon",
    "4",
    "--federation.privacy.delta",
    "1e-4",
    "--federation.privacy.dp_sgd",
    "true",
)


def test_dp_sgd_is_calibrated_from_public_quantities_only():
    """σ, q, the steps and the lot size depend on N, K, B and the epochs, never on how the records are split."""
    from fl_lightning.federation.policies.privacy import FederationPrivacy

    cfg = load_config(FEDOPAL, [*LOCAL_DP_SGD, "--train.epochs", "2", "--partition.num_clients", "3"])
    even, skewed = (FederationPrivacy.of(cfg, 1, sizes) for sizes in ([110, 110, 110], [1, 64, 265]))
    assert (even.noise_multiplier, even.sgd, even.lot_size) == (skewed.noise_multiplier, skewed.sgd, skewed.lot_size)
    assert even.epsilon(1) == skewed.epsilon(1) <= 4
    q = min(1.0, cfg.data.batch_size * 3 / 330)
    assert even.sgd == [(q, 2 * math.ceil(1 / q))] and even.lot_size == pytest.approx(q * 110)
    dp = even.dp_sgd(0, 2)
    assert (dp.sampling_rate, dp.steps_per_epoch, dp.denominator) == (q, math.ceil(1 / q), even.lot_size)
    fixed = load_config(FEDOPAL, [*LOCAL_DP_SGD, "--federation.privacy.sampling_rate", "0.05"])
    assert FederationPrivacy.of(fixed, 1, [110, 110, 110]).sgd == [(0.05, fixed.train.epochs * 20)]


def _one_round_dp_fedavg(reproducible: bool, **extra):
    """DP-FedAvg's policy for one round of every client (σ 1, δ 0.01, seed 0), its noise reproducible or not."""
    from fl_lightning.config import PrivacyConfig
    from fl_lightning.federation.policies.privacy import FederationPrivacy

    config = PrivacyConfig(mechanism="dp_fedavg", noise_multiplier=1.0, delta=0.01, reproducible_noise=reproducible)
    return FederationPrivacy(config, seed=0, rounds=1, parts=[(1.0, 1)], noise_multiplier=1.0, **extra)


def test_dp_fedavg_divides_by_the_planned_clients_and_refuses_what_it_does_not_cover():
    from fl_lightning.federation.policies.privacy import PrivacyLeak
    from fl_lightning.federation.transport import Upload

    dp = _one_round_dp_fedavg(reproducible=True, denominator=3)
    zeros = torch.zeros(4000)
    state = {"a": zeros, "b": zeros, "steps": torch.tensor(4)}
    uploads = {
        0: Upload({"a": zeros + 1e-3, "b": zeros + 1e-3, "steps": torch.tensor(9)}, {"num_samples": 5}),
        1: Upload({"a": zeros + 2e-3}, {"num_samples": 9, "secret": 3}),
    }
    view = dp.server_uploads(uploads, state, round_idx=0)
    assert view[0].meta == {"num_samples": 1} and view[1].meta == {"num_samples": 1}  # no client's number
    assert uploads[0].meta["num_samples"] == 5 and int(view[0].tensors["steps"]) == 4  # the server's own buffer
    for _ in range(2):  # a method may read the uploads twice: each client counts once
        list(view.values())
    out = dp.noised_state({"a": zeros, "b": zeros}, round_idx=0)
    for key in ("a", "b"):  # σS/D with D = 3 planned clients, however many held the key
        assert out[key].std().item() == pytest.approx(1.0 / 3, rel=0.05)
    leaky = dp.server_uploads({2: Upload({"a": zeros, "latents": torch.ones(3)}, {"num_samples": 7})}, state, 0)
    with pytest.raises(PrivacyLeak, match="client 2's upload holds 'latents'"):
        leaky[2]


def test_the_noise_comes_from_os_entropy_unless_asked_to_be_reproducible():
    def draw(reproducible: bool) -> torch.Tensor:
        dp = _one_round_dp_fedavg(reproducible=reproducible)
        return torch.randn(8, generator=dp._generator(0, 0))

    assert torch.equal(draw(True), draw(True)) and not torch.equal(draw(False), draw(False))
