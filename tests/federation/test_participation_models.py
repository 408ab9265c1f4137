"""Who takes part is one registered class per model (federation/policies/availability.py, dropout.py): a model
defined here is picked by its config key and decides who the server samples and who drops out; a name nobody
registered is one line; the package's own models are the draws the engine made before they were classes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from fl_lightning.config import ClientBehaviourConfig
from fl_lightning.config.loading import load_config
from fl_lightning.errors import UsageError
from fl_lightning.federation.client_behaviour import ClientBehaviour
from fl_lightning.federation.policies.availability import Availability, BernoulliAvailability
from fl_lightning.federation.policies.dropout import BernoulliDropout, Dropout
from fl_lightning.federation.policies.order import policy_names
from fl_lightning.federation.policies.policy import register_policy
from fl_lightning.federation.ranks.placement import derive_seed
from fl_lightning.federation.simulation import Simulation
from tests.conftest import CONF
from tests.run_records import metrics_rows


@register_policy("availability", "alternating")
@dataclass(frozen=True)
class Alternating(Availability):
    """Even clients online in even rounds, odd clients in odd rounds."""

    @classmethod
    def of_clients(cls, config, num_clients):
        return cls()

    def online(self, num_clients, round_idx):
        return [c for c in range(num_clients) if c % 2 == round_idx % 2]


@register_policy("dropout", "first_client")
@dataclass(frozen=True)
class FirstClientDrops(Dropout):
    """The lowest-numbered client online drops out of every round: the round's first client, as sampled."""

    def drops(self, round_idx, client):
        return client == round_idx % 2


def _run(tmp_path, *policy: str) -> list[dict[str, str]]:
    args = f"--output_dir {tmp_path} --federation.rounds 3 --partition.num_clients 6 --data.num_samples 300"
    cfg = load_config(CONF / "fedavg_digits_tiny.yaml", [*args.split(), "--logging.progress", "false", *policy])
    Simulation(cfg=cfg, loggers=[]).run()
    return metrics_rows(cfg)


def test_models_defined_here_decide_who_is_sampled_and_who_drops_out(tmp_path):
    rows = _run(
        tmp_path,
        "--federation.clients.availability_model",
        "alternating",
        "--federation.clients.dropout_model",
        "first_client",
    )
    assert [int(r["clients"]) for r in rows] == [3, 3, 3]  # half of the 6 online, all of them sampled
    assert [int(r["dropped"]) for r in rows] == [1, 1, 1] and [int(r["failed"]) for r in rows] == [1, 1, 1]
    assert {"alternating", "always", "bernoulli", "trace"} <= set(policy_names("availability"))


def test_a_model_nobody_registered_is_one_line(tmp_path):
    with pytest.raises(UsageError) as err:
        _run(tmp_path, "--federation.clients.availability_model", "alternatng")
    message = str(err.value)
    assert "federation.clients.availability_model='alternatng'" in message and "did you mean 'alternating'" in message
    assert "\n" not in message


def _coin(seed: int, round_idx: int, client: int, tag: int) -> float:
    """The engine's draw before the models were classes: numpy's default_rng from (seed, round, client, tag)."""
    return float(np.random.default_rng(np.random.SeedSequence([seed, round_idx, client, tag]).generate_state(1)[0]).random())


def test_the_package_models_are_the_seeded_coins_and_the_defaults_draw_nothing():
    b = ClientBehaviour.of(ClientBehaviourConfig(availability=0.4, dropout=0.3, seed=7), 200)
    assert isinstance(b.availability, BernoulliAvailability) and isinstance(b.dropout, BernoulliDropout)
    assert b.online(200, 5) == [c for c in range(200) if _coin(7, 5, c, 0xA7A1) < 0.4]
    assert [b.drops(5, c) for c in range(200)] == [_coin(7, 5, c, 0xD209) < 0.3 for c in range(200)]
    assert derive_seed(7, 5, 0, 0xA7A1) == np.random.SeedSequence([7, 5, 0, 0xA7A1]).generate_state(1)[0]
    assert ClientBehaviour.of(ClientBehaviourConfig(), 200) is None  # always online, nobody drops: nothing drawn
