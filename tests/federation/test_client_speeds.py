"""federation.clients' speeds and round deadline (fl_lightning/federation/client_behaviour.py): the log-normal speeds
seeded per client and fixed for the run; a client's simulated time t_k = ceil(n_k / B) · E_k · step_s / s_k and the
late set t_k > D, against a hand computation; in the engine a late client is dropped as a dropout is (download
counted, no upload, no error, the ``late`` column), the aggregate being that of a run without the late clients; a
deadline no one misses is the run without one; bad values and deadlines beside privacy are one line."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch

from fl_lightning.config import ClientBehaviourConfig
from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.checkpoint import safe_load
from fl_lightning.federation.client_behaviour import LATE, ClientBehaviour, client_speeds, late_mask, round_times
from fl_lightning.federation.simulation import Simulation
from tests.conftest import CONF


def test_speeds_are_log_normal_seeded_per_client_and_fixed_for_the_run():
    s = client_speeds(3, 20_000, 0.5)
    z = np.log(s) / 0.5  # z_k ~ N(0, 1)
    assert abs(z.mean()) < 4 / math.sqrt(20_000) and abs(z.std() - 1) < 0.03
    assert np.array_equal(s, client_speeds(3, 20_000, 0.5)) and not np.array_equal(s, client_speeds(4, 20_000, 0.5))
    assert np.array_equal(client_speeds(3, 7, 0.5), s[:7])  # client k's speed does not depend on K
    assert np.allclose(client_speeds(3, 7, 1.0), s[:7] ** 2)  # the same z_k, scaled by σ
    assert np.array_equal(client_speeds(3, 5, 0.0), np.ones(5))  # σ = 0: every client as fast
    b = ClientBehaviour.of(ClientBehaviourConfig(speed_spread=0.5, deadline_s=3.0, seed=3)).with_clients([100] * 6, 32)
    times = [[b.round_time(r, c, epochs=2) for c in range(6)] for r in range(5)]
    assert all(row == times[0] for row in times)  # no straggler: the same time every round
    assert times[0] == pytest.approx([4 * 2 * 1.0 / v for v in s[:6]], rel=1e-15)


def test_times_and_the_late_set_are_those_computed_by_hand():
    t = round_times([3, 1, 8, 0], [2, 2, 1, 5], [0.5, 1.0, 2.0, 0.3], 1.5)
    assert t.dtype == np.float64 and t.tolist() == [18.0, 3.0, 6.0, 0.0]
    assert late_mask(t, 6.0).tolist() == [True, False, False, False]  # t_k = D is on time
    assert late_mask(t, 2.9).tolist() == [True, True, True, False]
    assert not late_mask(t, None).any()  # no deadline: no one is late
    # the engine's view: n_k = (70, 64, 1, 300), B = 64, E = 3, step_s = 0.25, partial stragglers run their share
    cfg = ClientBehaviourConfig(speed_spread=0.8, step_s=0.25, deadline_s=1.2, stragglers=0.5, seed=9)
    b = ClientBehaviour.of(cfg).with_clients([70, 64, 1, 300], 64)
    s = np.exp(0.8 * np.log(client_speeds(9, 4, 1.0)))
    for r in range(6):
        passes = [max(1, round(b.local_work(r, c, 3) * 3)) if b.straggles(r, c) else 3 for c in range(4)]
        by_hand = [nb * e * 0.25 / s_k for nb, e, s_k in zip((2, 1, 1, 5), passes, s)]
        assert [b.round_time(r, c, 3) for c in range(4)] == pytest.approx(by_hand, rel=1e-15)
        late = [c for c in range(4) if by_hand[c] > 1.2]
        assert [c for c in range(4) if b.missed_deadline(r, c, 3) == LATE] == late
    assert ClientBehaviour.of(ClientBehaviourConfig(speed_spread=0.0, step_s=2.0)) is None  # no deadline: nothing


def _cfg(tmp_path, *extra):
    return load_config(CONF / "fedavg_digits_tiny.yaml",
                       ["--output_dir", str(tmp_path), "--federation.rounds", "2", "--partition.num_clients", "8",
                        "--logging.progress", "false", *extra])


def _rows(cfg):
    with open(cfg.run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _state(cfg):
    return safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"]


class _Sizes:
    def on_run_start(self, env, **_):
        self.sizes = [len(p) for p in env.partition]


def test_late_clients_are_dropped_and_the_aggregate_is_that_of_the_others(tmp_path):
    """A deadline drops the late clients (on_client_error: raise, yet the run goes on), and the server's state is
    bit for bit that of a run whose round has only the clients on time (an availability trace of them)."""
    slow = _cfg(tmp_path / "deadline", "--federation.clients.speed_spread", "0.5", "--federation.clients.deadline_s",
                "4", "--federation.clients.seed", "0")
    seen = _Sizes()
    summary = Simulation(cfg=slow, loggers=[], callbacks=[seen]).run()
    t = [math.ceil(n / 64) * 1 * 1.0 / v for n, v in zip(seen.sizes, client_speeds(0, 8, 0.5))]  # E = 1, step 1 s
    late = [c for c in range(8) if t[c] > 4]
    assert 0 < len(late) < 8
    rows = _rows(slow)
    per_download = int(rows[0]["bytes_down_round"]) // 8
    for row in rows:
        assert int(row["late"]) == int(row["failed"]) == int(row["dropped"]) == len(late)
        assert int(row["bytes_down_round"]) == 8 * per_download  # the late clients' downloads count
    assert all(reason.endswith(LATE) for reason in summary["failed_clients"].values())
    trace = tmp_path / "on_time.csv"
    trace.write_text(",".join("0" if c in late else "1" for c in range(8)) + "\n")
    on_time = _cfg(tmp_path / "on_time", "--federation.clients.availability_trace", str(trace))
    Simulation(cfg=on_time, loggers=[]).run()
    a, b = _state(slow), _state(on_time)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["bytes_up_round"] for r in rows] == [r["bytes_up_round"] for r in _rows(on_time)]


def test_a_deadline_no_one_misses_is_the_run_without_one(tmp_path):
    loose = _cfg(tmp_path / "loose", "--federation.clients.speed_spread", "2", "--federation.clients.deadline_s", "1e9")
    plain = _cfg(tmp_path / "plain")
    for cfg in (loose, plain):
        Simulation(cfg=cfg, loggers=[]).run()
    a, b = _state(loose), _state(plain)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["late"] for r in _rows(loose)] == ["0", "0"] and "late" not in _rows(plain)[0]


@pytest.mark.parametrize(("key", "value", "words"), [
    ("speed_spread", "-0.1", "a finite float >= 0"),
    ("speed_spread", "0.5", "> 0 only with federation.clients.deadline_s"),
    ("deadline_s", "-1", "a finite number of seconds > 0, or null"),
    ("deadline_s", "0", "a finite number of seconds > 0, or null"),
    ("deadline_s", "inf", "a finite number of seconds > 0, or null"),
    ("step_s", "0", "a finite number of seconds > 0"),
])
def test_bad_values_are_one_line_naming_the_key(tmp_path, key, value, words):
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, f"--federation.clients.{key}", value)
    assert err.value.key == f"federation.clients.{key}" and words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("extra", "words"), [
    (["--federation.privacy.mechanism", "dp_fedavg", "--federation.privacy.epsilon", "4"], "accountant's sampling"),
    (["--federation.aggregator.name", "median"], "assumes n uploads a round"),
])
def test_a_deadline_beside_privacy_or_a_robust_aggregator_is_refused_in_one_line(tmp_path, extra, words):
    with pytest.raises(UsageError) as err:
        Simulation(cfg=_cfg(tmp_path, "--federation.clients.deadline_s", "5", *extra), loggers=[])
    assert words in str(err.value) and "federation.clients.deadline_s=5.0" in str(err.value)
    assert "\n" not in str(err.value)
