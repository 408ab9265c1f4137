"""A method declares which keys of its state it averages (``Algorithm.averaged_keys``): the update policies that read
or replace a mean — an attack on weights, a robust rule, a server optimizer — touch those keys and no other, and a
method that declares ``averages_weights`` without them is refused in one line."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.config.loading import load_config
from fl_lightning.errors import UsageError
from fl_lightning.federation.algorithm import Algorithm, register
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.conftest import CONF


@register("fedavg_weight_averaged")
class FedAvgWeightAveraged(FedAvg):
    """FedAvg whose update policies may change only the head's weight: its bias is the clients' plain mean whatever
    policy runs (the method's own aggregate is FedAvg's)."""

    averages_weights = True
    uploads: ClassVar[list[dict[str, torch.Tensor]]] = []

    def averaged_keys(self, state):
        return frozenset({"head.weight"})

    def client_update(self, round_idx, client, download):
        upload = super().client_update(round_idx, client, download)
        FedAvgWeightAveraged.uploads.append({k: v.detach().cpu().clone() for k, v in upload.tensors.items()})
        return upload


@register("fedavg_no_averaged_keys")
class FedAvgWithoutAveragedKeys(FedAvg):
    """Says it averages but not what: a policy that reads a mean cannot know which keys it may touch."""

    averages_weights = True
    averaged_keys = Algorithm.averaged_keys


def _final_state(tmp_path, algorithm: str, policy: str) -> dict[str, torch.Tensor]:
    args = f"--output_dir {tmp_path} --algorithm {algorithm} --federation.rounds 1 --partition.num_clients 5"
    args += f" --data.num_samples 300 --logging.progress false {policy}"
    cfg = load_config(CONF / "fedavg_digits_tiny.yaml", args.split())
    Simulation(cfg=cfg, loggers=[]).run()
    return safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]


@pytest.mark.parametrize(
    "policy",
    [
        "--federation.aggregator.name krum --federation.aggregator.num_malicious 1",
        "--federation.server_optimizer.name fedadam --federation.server_optimizer.lr 0.5",
        "--federation.attack.kind scale --federation.attack.fraction 0.6",
    ],
    ids=["krum", "fedadam", "scale_attack"],
)
def test_a_policy_changes_the_averaged_keys_and_leaves_the_others_as_the_method_made_them(tmp_path, policy):
    plain = _final_state(tmp_path / "plain", "fedavg_weight_averaged", "")
    FedAvgWeightAveraged.uploads.clear()
    with_policy = _final_state(tmp_path / "policy", "fedavg_weight_averaged", policy)
    assert len(FedAvgWeightAveraged.uploads) == 5
    assert torch.equal(with_policy["head.bias"], plain["head.bias"])  # the method's mean, untouched
    assert not torch.equal(with_policy["head.weight"], plain["head.weight"])  # the policy's work
    if "krum" in policy:  # Krum keeps one client's weight: the new weight is one of the uploads'
        assert any(torch.equal(with_policy["head.weight"], u["head.weight"]) for u in FedAvgWeightAveraged.uploads)


def test_a_method_that_averages_without_saying_which_keys_is_refused_in_one_line(tmp_path):
    with pytest.raises(UsageError) as err:
        _final_state(tmp_path, "fedavg_no_averaged_keys", "--federation.aggregator.name median")
    message = str(err.value)
    assert "federation.aggregator.name=median" in message and "averaged_keys" in message and "\n" not in message
