"""SCAFFOLD (Karimireddy et al. 2020, option II): on heterogeneous least squares it reaches the global optimum where
FedAvg with several local steps stops at a biased point; in the engine, round 0 is FedAvg's unweighted mean, the
server's c stays the mean of the clients' c_i under full participation, a run killed after the clients' state was
written resumes to the uninterrupted result, 1 process = 2, and what it cannot run is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.scaffold import client_control, server_step
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.federation.storage.client_state import ClientStateStore
from tests.algorithms.client_drift_helpers import (
    StopAtRoundEnd,
    assert_same_on_one_and_two_processes,
    drift_config,
    least_squares,
)
from tests.run_records import server_state
from tests.tiny_runs import assert_refused_in_one_line, comparison_runs

# ------------------------------------------------------------------ the method on tensors: least squares


def _rounds(problems, *, corrected: bool, rounds=300, steps=10, lr=0.01, sample=None, seed=0):
    rng = np.random.default_rng(seed)
    n, d = len(problems), problems[0][0].shape[1]
    x, c = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
    c_i = [torch.zeros(d, dtype=torch.float64) for _ in range(n)]
    for _ in range(rounds):
        chosen = sorted(rng.choice(n, size=sample, replace=False)) if sample else range(n)
        ys, dcs = [], []
        for i in chosen:
            A, b = problems[i]
            y = x.clone()
            for _ in range(steps):
                grad = A.T @ (A @ y - b) / A.shape[0]
                y -= lr * (grad + (c - c_i[i] if corrected else 0))
            new = client_control(c_i[i], c, x, y, steps, lr)
            ys.append(y)
            dcs.append(new - c_i[i])
            c_i[i] = new if corrected else c_i[i]
        x, c = server_step(x, c, ys, dcs if corrected else [torch.zeros(d, dtype=torch.float64)] * len(ys), n)
    return x


def test_scaffold_reaches_the_global_optimum_where_fedavg_stops_short():
    problems, optimum = least_squares()
    scaffold = _rounds(problems, corrected=True)
    fedavg = _rounds(problems, corrected=False)
    assert float((scaffold - optimum).norm()) < 1e-8 * float(optimum.norm())
    assert float((fedavg - optimum).norm()) > 1e-2 * float(optimum.norm())  # client drift: a biased fixed point


def test_scaffold_with_client_sampling_still_reaches_the_optimum():
    problems, optimum = least_squares()
    x = _rounds(problems, corrected=True, rounds=1500, sample=2)
    assert float((x - optimum).norm()) < 1e-6 * float(optimum.norm())


def test_the_server_step_is_algorithm_1():
    x, c = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.0])
    ys, dcs = [torch.tensor([3.0, 2.0]), torch.tensor([1.0, 6.0])], [torch.tensor([1.0, 1.0]), torch.tensor([3.0, 1.0])]
    x1, c1 = server_step(x, c, ys, dcs, num_clients=4, server_lr=0.5)
    assert torch.allclose(x1, x + 0.5 * (torch.tensor([2.0, 4.0]) - x)) and torch.allclose(c1, c + torch.tensor([1.0, 0.5]))
    n = [10.0, 30.0]  # weighted: Flower's niid_bench rule, x + Σ n_i Δy_i / Σ n_i and c + |S|/N · Σ n_i Δc_i / Σ n_i
    x2, c2 = server_step(x, c, ys, dcs, num_clients=4, weights=n)
    flower_x = x.numpy() + sum(ni * (y.numpy() - x.numpy()) for ni, y in zip(n, ys)) / sum(n)
    flower_c = c.numpy() + 2 / 4 * sum(ni * d.numpy() for ni, d in zip(n, dcs)) / sum(n)
    assert np.allclose(x2.numpy(), flower_x) and np.allclose(c2.numpy(), flower_c)
    assert torch.equal(client_control(c, c, x, x, 0, 0.1), c)  # no step: nothing learnt
    assert torch.allclose(client_control(c, c, x, x - 0.2, 2, 0.1), torch.ones(2))  # (x − y)/(Kη)


# ------------------------------------------------------------------ in the engine


def _cfg(tmp_path, algorithm="scaffold", *extra):
    return drift_config(tmp_path, algorithm, *extra)


def test_round_zero_is_fedavgs_unweighted_mean_and_c_stays_the_mean_of_the_clients(tmp_path):
    scaffold = _cfg(tmp_path / "s", "scaffold", "--federation.rounds", "1")
    fedavg = _cfg(tmp_path / "f", "fedavg", "--federation.rounds", "1", "--fedavg.weighted", "false")
    Simulation(cfg=scaffold, loggers=[]).run()
    Simulation(cfg=fedavg, loggers=[]).run()
    s, f = server_state(scaffold), server_state(fedavg)
    for k in ("head.weight", "head.bias"):  # c = c_i = 0 in round 0: no correction, the same clients' heads
        assert torch.allclose(s[k], f[k], atol=1e-6), k
    for rounds in (1, 3):  # full participation: c = (1/N) Σ c_i after every round (Algorithm 1 by induction)
        cfg = _cfg(tmp_path / f"r{rounds}", "scaffold", "--federation.rounds", str(rounds))
        Simulation(cfg=cfg, loggers=[]).run()
        state = server_state(cfg)
        c = torch.cat([state["control.head.weight"].reshape(-1), state["control.head.bias"]])
        store = ClientStateStore(cfg.run_dir / "checkpoints" / "client_state" / "scaffold", 4, c.numel())
        mean = np.mean([store.read(i, rounds) for i in range(4)], axis=0)
        assert c.abs().max() > 0 and np.allclose(c.numpy(), mean, atol=1e-6)


@pytest.mark.slow  # processes or several runs: in CI's every-file pass, not the plain suite
def test_a_run_killed_after_the_clients_state_was_written_resumes_to_the_uninterrupted_result(tmp_path):
    full = _cfg(tmp_path / "full", "scaffold", "--federation.rounds", "4", "--federation.client_fraction", "0.5")
    Simulation(cfg=full, loggers=[]).run()
    cut = _cfg(tmp_path / "cut", "scaffold", "--federation.rounds", "4", "--federation.client_fraction", "0.5")
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cut, loggers=[], callbacks=[StopAtRoundEnd(2)]).run()
    assert safe_load(cut.run_dir / "checkpoints" / "server.pt")["round"] == 1  # round 2 wrote c_i, not server.pt
    Simulation(cfg=cut, loggers=[], resume=True).run()
    a, b = server_state(full), server_state(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fresh = _cfg(tmp_path / "cut", "scaffold", "--federation.rounds", "2")  # a fresh start in the same folder
    Simulation(cfg=fresh, loggers=[]).run()
    new = _cfg(tmp_path / "new", "scaffold", "--federation.rounds", "2")
    Simulation(cfg=new, loggers=[]).run()
    a, b = server_state(fresh), server_state(new)
    assert all(torch.equal(a[k], b[k]) for k in b)  # no client state carried over


def test_scaffold_uploads_twice_fedavgs_bytes(tmp_path):
    s = Simulation(cfg=_cfg(tmp_path / "s", "scaffold", "--federation.rounds", "1"), loggers=[]).run()
    f = Simulation(cfg=_cfg(tmp_path / "f", "fedavg", "--federation.rounds", "1"), loggers=[]).run()
    assert s["bytes_up"] == 2 * f["bytes_up"] and s["bytes_down"] == 2 * f["bytes_down"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--train.optimizer", "adamw"], "scaffold needs train.optimizer: sgd"),
        (["--federation.server_optimizer.name", "fedadam"], "federation.server_optimizer.name=fedadam needs a method"),
        (["--federation.privacy.mechanism", "dp_fedavg", "--federation.privacy.epsilon", "4"], "control-variate"),
    ],
)
def test_what_scaffold_cannot_run_is_one_line(tmp_path, extra, words):
    assert_refused_in_one_line(lambda: _cfg(tmp_path, "scaffold", *extra), words, run=True)


@pytest.mark.slow  # processes or several runs: in CI's every-file pass, not the plain suite
def test_scaffold_is_the_same_on_one_and_two_processes(tmp_path):
    assert_same_on_one_and_two_processes(tmp_path, "scaffold", "--train.momentum", "0")


@pytest.mark.slow  # processes or several runs: in CI's every-file pass, not the plain suite
def test_the_tiny_client_drift_comparison_runs_each_method(tmp_path, capsys):
    states = comparison_runs(tmp_path, capsys, "client_drift_tiny.yaml", rounds=2, samples=300)
    assert set(states) == {"fedavg", "fedprox", "scaffold", "feddyn"}
    assert {"control.head.weight", "control.head.bias"} <= set(states["scaffold"]["state"])
    assert {"cloud.head.weight", "drift_sum.head.weight"} <= set(states["feddyn"]["state"])
    for name in ("scaffold", "feddyn"):
        assert (tmp_path / name / "checkpoints" / "client_state" / name / "values.npy").is_file()
