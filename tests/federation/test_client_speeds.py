"""federation.clients' speeds and round deadline (fl_lightning/federation/client_behaviour.py): the log-normal speeds
seeded per client and fixed for the run; a client's simulated time t_k = ceil(n_k / B) · E_k · step_s / s_k and the
late set t_k > D, against a hand computation; in the engine a late client is dropped as a dropout is (download
counted, no upload, no error, the ``late`` column), the aggregate being that of a run without the late clients; a
deadline no one misses is the run without one; bad values and deadlines beside privacy are one line. ``late:
stale`` (fl_lightning/federation/policies/stale_updates.py): τ and w(τ) by hand, a late update aggregated in the round it
arrives bit for bit at its staleness weight, its client busy until then, a resumed run (interrupted or SIGKILLed)
the uninterrupted one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fl_lightning.config import ClientBehaviourConfig
from fl_lightning.errors import ConfigError
from fl_lightning.federation.client_behaviour import (
    LATE,
    LATE_STALE,
    ClientBehaviour,
    client_speeds,
    late_mask,
    round_times,
)
from fl_lightning.federation.policies.stale_updates import ArrivedUploads, PendingUpdate, arrival_delay, staleness_weight
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.round_store import RoundStore
from fl_lightning.federation.transport import Upload
from tests.conftest import StopAfterClients
from tests.run_records import kill_after_round_0, metrics_rows, server_state
from tests.tiny_runs import assert_refused_in_one_line, start_train, tiny_config, tiny_overrides


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
    return tiny_config(tmp_path, *extra, clients=8)


class _Sizes:
    def on_run_start(self, env, **_):
        self.sizes = [len(p) for p in env.partition]


def test_late_clients_are_dropped_and_the_aggregate_is_that_of_the_others(tmp_path):
    """A deadline drops the late clients (on_client_error: raise, yet the run goes on), and the server's state is
    bit for bit that of a run whose round has only the clients on time (an availability trace of them)."""
    slow = _cfg(
        tmp_path / "deadline",
        "--federation.clients.speed_spread",
        "0.5",
        "--federation.clients.deadline_s",
        "4",
        "--federation.clients.seed",
        "0",
    )
    seen = _Sizes()
    summary = Simulation(cfg=slow, loggers=[], callbacks=[seen]).run()
    t = [math.ceil(n / 64) * 1 * 1.0 / v for n, v in zip(seen.sizes, client_speeds(0, 8, 0.5))]  # E = 1, step 1 s
    late = [c for c in range(8) if t[c] > 4]
    assert 0 < len(late) < 8
    rows = metrics_rows(slow)
    per_download = int(rows[0]["bytes_down_round"]) // 8
    for row in rows:
        assert int(row["late"]) == int(row["failed"]) == int(row["dropped"]) == len(late)
        assert int(row["bytes_down_round"]) == 8 * per_download  # the late clients' downloads count
    assert all(reason.endswith(LATE) for reason in summary["failed_clients"].values())
    trace = tmp_path / "on_time.csv"
    trace.write_text(",".join("0" if c in late else "1" for c in range(8)) + "\n")
    on_time = _cfg(tmp_path / "on_time", "--federation.clients.availability_trace", str(trace))
    Simulation(cfg=on_time, loggers=[]).run()
    a, b = server_state(slow), server_state(on_time)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["bytes_up_round"] for r in rows] == [r["bytes_up_round"] for r in metrics_rows(on_time)]


def test_a_deadline_no_one_misses_is_the_run_without_one(tmp_path):
    loose = _cfg(tmp_path / "loose", "--federation.clients.speed_spread", "2", "--federation.clients.deadline_s", "1e9")
    plain = _cfg(tmp_path / "plain")
    for cfg in (loose, plain):
        Simulation(cfg=cfg, loggers=[]).run()
    a, b = server_state(loose), server_state(plain)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["late"] for r in metrics_rows(loose)] == ["0", "0"] and "late" not in metrics_rows(plain)[0]


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("speed_spread", "-0.1", "a finite float >= 0"),
        ("speed_spread", "0.5", "> 0 only with federation.clients.deadline_s"),
        ("deadline_s", "-1", "a finite number of seconds > 0, or null"),
        ("deadline_s", "0", "a finite number of seconds > 0, or null"),
        ("deadline_s", "inf", "a finite number of seconds > 0, or null"),
        ("step_s", "0", "a finite number of seconds > 0"),
        ("staleness_exponent", "-1", "a finite float >= 0"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(tmp_path, key, value, words):
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, f"--federation.clients.{key}", value)
    assert err.value.key == f"federation.clients.{key}" and words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--federation.privacy.mechanism", "dp_fedavg", "--federation.privacy.epsilon", "4"], "accountant's sampling"),
        (["--federation.aggregator.name", "median"], "assumes n uploads a round"),
    ],
)
def test_a_deadline_beside_privacy_or_a_robust_aggregator_is_refused_in_one_line(tmp_path, extra, words):
    assert_refused_in_one_line(
        lambda: _cfg(tmp_path, "--federation.clients.deadline_s", "5", *extra), words, "federation.clients.deadline_s=5.0"
    )


# ------------------------------------------------------------------------------------------- late: stale
def test_the_delay_and_the_staleness_weight_by_hand():
    assert [arrival_delay(t, 2.0) for t in (0.0, 1.9, 2.0, 2.0000001, 4.0, 4.1, 9.0)] == [0, 0, 0, 1, 1, 2, 4]
    assert arrival_delay(1.0 + 2**-52, 1.0) == 1  # late (t > D) is at least one round late
    assert staleness_weight(0, 0.5) == 1.0 and staleness_weight(3, 0.5) == 0.5 and staleness_weight(1, 0.0) == 1.0
    assert staleness_weight(2, 1.5) == pytest.approx(3**-1.5, rel=1e-15)
    fresh = {1: Upload({"w": torch.ones(2)}, {"num_samples": 10}), 4: Upload({"w": torch.zeros(2)}, {"num_samples": 3})}
    late = PendingUpdate(2, 5, 8, Upload({"w": torch.full((2,), 7.0)}, {"num_samples": 6}))
    both = ArrivedUploads(fresh, [late], 0.5)
    assert list(both) == [1, 2, 4] and both[1] is fresh[1] and both[2].meta["num_samples"] == 6 * 4**-0.5
    assert torch.equal(both[2].tensors["w"], late.upload.tensors["w"])
    with pytest.raises(RuntimeError, match="client 1 has a fresh upload and one in flight"):
        ArrivedUploads(fresh, [PendingUpdate(1, 0, 1, late.upload)], 0.5)


# late clients (a deadline of 2.5 s against speeds spread by 0.5) kept, their uploads entering a later round
STALE = (
    "--federation.clients.speed_spread",
    "0.5",
    "--federation.clients.deadline_s",
    "2.5",
    "--federation.clients.late",
    "stale",
)


def _stale(tmp_path, *extra):
    return _cfg(tmp_path, *STALE, *extra)


def test_a_stale_update_is_its_weighted_share_of_the_round_it_arrives_in(tmp_path, monkeypatch):
    """Round 0's late clients train on round 0's state, are not sampled in round 1, and their uploads enter round 1's
    mean at weight (1 + τ)^−a · n_k: the server's state is, bit for bit, that float64 mean computed here."""
    uploads, save = {}, RoundStore.save_client

    def spy(store, client, record, upload):
        if upload is not None:
            uploads[(int(store.folder.name[5:]), client)] = Upload(
                {k: v.detach().clone() for k, v in upload.tensors.items()}, dict(upload.meta)
            )
        save(store, client, record, upload)

    monkeypatch.setattr(RoundStore, "save_client", spy)
    cfg, seen = _stale(tmp_path, "--federation.clients.staleness_exponent", "0.7"), _Sizes()
    summary = Simulation(cfg=cfg, loggers=[], callbacks=[seen]).run()
    t = [math.ceil(n / 64) / v for n, v in zip(seen.sizes, client_speeds(0, 8, 0.5))]
    late = [c for c in range(8) if t[c] > 2.5]
    assert 0 < len(late) < 8 and all(2.5 < t[c] <= 5.0 for c in late)  # τ = 1 for each: they arrive in round 1
    rows = metrics_rows(cfg)
    assert [(int(r["late"]), int(r["arrived"]), int(r["clients"]), int(r["dropped"])) for r in rows] == [
        (len(late), 0, 8, 0),
        (0, len(late), 8 - len(late), 0),
    ]  # round 1: only the clients not busy
    assert all(reason.endswith(LATE_STALE) for reason in summary["failed_clients"].values())
    weights = {c: (float(uploads[(1, c)].meta["num_samples"]), uploads[(1, c)]) for c in range(8) if c not in late}
    weights.update({c: (float(uploads[(0, c)].meta["num_samples"]) * 2**-0.7, uploads[(0, c)]) for c in late})
    state = server_state(cfg)
    for key, value in state.items():
        acc, total = None, 0.0
        for c in sorted(weights):
            w, upload = weights[c]
            term = upload.tensors[key].to(torch.float64) * w
            acc, total = term if acc is None else acc + term, total + w
        assert torch.equal(value, (acc / total).to(value.dtype)), key


def test_a_resumed_run_carries_its_late_updates_as_the_uninterrupted_one(tmp_path):
    full = _stale(tmp_path / "full", "--federation.rounds", "4")
    Simulation(cfg=full, loggers=[]).run()
    cut = _stale(tmp_path / "cut", "--federation.rounds", "4")
    with pytest.raises(KeyboardInterrupt):  # in round 1, after the server.pt that holds round 0's late updates
        Simulation(cfg=cut, loggers=[], callbacks=[StopAfterClients(9)]).run()
    Simulation(cfg=cut, loggers=[], resume=True).run()
    a, b = server_state(full), server_state(cut)
    assert all(torch.equal(a[k], b[k]) for k in a)
    arrived = [r["arrived"] for r in metrics_rows(full)]
    assert arrived == [r["arrived"] for r in metrics_rows(cut)] and int(arrived[1])


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--algorithm", "afl"], "federation.clients.late=stale needs a method whose state is the mean"),
        (["--fedavg.weighted", "false"], "fedavg.weighted is false (an unweighted mean)"),
    ],
)
def test_stale_updates_where_no_weighted_mean_is_are_refused_in_one_line(tmp_path, extra, words):
    assert_refused_in_one_line(lambda: _stale(tmp_path, *extra), words)
    with pytest.raises(ConfigError, match="stale only with federation.clients.deadline_s"):
        _cfg(tmp_path, "--federation.clients.late", "stale")


@pytest.mark.slow  # a process killed: in CI's every-file pass, not the plain suite
def test_a_sigkilled_run_resumes_its_late_updates_to_the_uninterrupted_result(tmp_path):
    """SIGKILL once server.pt (holding the late updates in flight) exists: the resumed run aggregates them as the
    uninterrupted run does."""
    extra = ("--federation.rounds", "6", *STALE)
    full = _cfg(tmp_path / "full", *extra)
    Simulation(cfg=full, loggers=[]).run()
    cut = _cfg(tmp_path / "cut", *extra)
    proc = start_train(*tiny_overrides(tmp_path / "cut", *extra, clients=8))
    kill_after_round_0(proc, cut)  # round 0 is done, its late updates in server.pt: the kill lands in a later round
    assert not (cut.run_dir / "summary.json").exists()  # killed before the end
    Simulation(cfg=cut, loggers=[], resume=True).run()
    a, b = server_state(full), server_state(cut)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["arrived"] for r in metrics_rows(full)] == [r["arrived"] for r in metrics_rows(cut)]
    assert sum(int(r["arrived"]) for r in metrics_rows(full)) > 0
