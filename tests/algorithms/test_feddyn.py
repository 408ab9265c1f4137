"""FedDyn (Acar et al. 2021, as the authors' code runs it): on heterogeneous least squares the cloud model reaches the
global optimum where FedAvg with several local steps stops at a biased point; in the engine the server's drift sum
is the sum of the clients' kept drifts, the traffic is FedAvg's, a run killed after the clients' state was written
resumes to the uninterrupted result, 1 process = 2, and what it cannot run is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.feddyn import server_step
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.client_state import ClientStateStore
from tests.algorithms.client_drift_helpers import (
    StopAtRoundEnd,
    assert_same_on_one_and_two_processes,
    drift_config,
    least_squares,
)
from tests.run_records import server_state
from tests.tiny_runs import assert_refused_in_one_line


def _feddyn(problems, *, alpha, rounds, steps=10, lr=0.01, sample=None, seed=0):
    """FedDyn on the least-squares clients with the module's server step: local GD on the regularised objective."""
    rng = np.random.default_rng(seed)
    n, d = len(problems), problems[0][0].shape[1]
    cloud, total = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
    drift = [torch.zeros(d, dtype=torch.float64) for _ in range(n)]
    for _ in range(rounds):
        chosen = sorted(rng.choice(n, size=sample, replace=False)) if sample else range(n)
        thetas = []
        for k in chosen:
            A, b = problems[k]
            theta = cloud.clone()
            for _ in range(steps):
                theta -= lr * (A.T @ (A @ theta - b) / A.shape[0] + alpha * (theta - cloud + drift[k]))
            thetas.append(theta)
        for k, theta in zip(chosen, thetas):
            drift[k] = drift[k] + theta - cloud
        _, total, cloud = server_step(cloud, total, thetas, n)
    return cloud


def test_feddyn_reaches_the_global_optimum_with_and_without_client_sampling():
    problems, optimum = least_squares()
    for sample, rounds in ((None, 800), (2, 1500)):
        cloud = _feddyn(problems, alpha=1.0, rounds=rounds, sample=sample)
        assert float((cloud - optimum).norm()) < 1e-8 * float(optimum.norm()), sample
    assert float((_feddyn(problems, alpha=1e-9, rounds=300) - optimum).norm()) > 1e-2 * float(optimum.norm())  # ≈ FedAvg


def test_the_server_step_is_the_authors_update():
    cloud, total = torch.tensor([1.0, 1.0]), torch.tensor([0.5, -0.5])
    thetas = [torch.tensor([2.0, 0.0]), torch.tensor([4.0, 2.0])]
    avg, new_total, new_cloud = server_step(cloud, total, thetas, num_clients=4)
    assert torch.equal(avg, torch.tensor([3.0, 1.0])) and torch.equal(new_total, torch.tensor([4.5, -0.5]))
    assert torch.allclose(new_cloud, avg + new_total / 4)


def _cfg(tmp_path, algorithm="feddyn", *extra):
    alpha = ["--feddyn.alpha", "0.1"] if algorithm == "feddyn" else []
    return drift_config(tmp_path, algorithm, *alpha, *extra)


def test_the_drift_sum_is_the_clients_kept_drifts_and_the_traffic_is_fedavgs(tmp_path):
    cfg = _cfg(tmp_path / "d", "feddyn", "--federation.client_fraction", "0.5")
    summary = Simulation(cfg=cfg, loggers=[]).run()
    state = server_state(cfg)
    total = torch.cat([state["drift_sum.head.weight"].reshape(-1), state["drift_sum.head.bias"]])
    store = ClientStateStore(cfg.run_dir / "checkpoints" / "client_state" / "feddyn", 4, total.numel())
    kept = np.sum([store.read(i, 3) for i in range(4)], axis=0)
    assert total.abs().max() > 0 and np.allclose(total.numpy(), kept, atol=1e-5)
    cloud = torch.cat([state["cloud.head.weight"].reshape(-1), state["cloud.head.bias"]])
    avg = torch.cat([state["head.weight"].reshape(-1), state["head.bias"]])
    assert torch.allclose(cloud, avg + total / 4, atol=1e-6)
    fedavg = Simulation(cfg=_cfg(tmp_path / "f", "fedavg", "--federation.client_fraction", "0.5"), loggers=[]).run()
    assert (summary["bytes_up"], summary["bytes_down"]) == (fedavg["bytes_up"], fedavg["bytes_down"])


@pytest.mark.slow  # processes or several runs: in CI's every-file pass, not the plain suite
def test_a_run_killed_after_the_clients_state_was_written_resumes_to_the_uninterrupted_result(tmp_path):
    full = _cfg(tmp_path / "full", "feddyn", "--federation.rounds", "4", "--federation.client_fraction", "0.5")
    Simulation(cfg=full, loggers=[]).run()
    cut = _cfg(tmp_path / "cut", "feddyn", "--federation.rounds", "4", "--federation.client_fraction", "0.5")
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cut, loggers=[], callbacks=[StopAtRoundEnd(2)]).run()
    Simulation(cfg=cut, loggers=[], resume=True).run()
    a, b = server_state(full), server_state(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--federation.aggregator.name", "median"], "federation.aggregator.name=median needs a method"),
        (["--federation.privacy.mechanism", "dp_fedavg", "--federation.privacy.epsilon", "4"], "accumulated drift"),
        (["--feddyn.alpha", "0"], "feddyn.alpha"),
    ],
)
def test_what_feddyn_cannot_run_is_one_line(tmp_path, extra, words):
    assert_refused_in_one_line(lambda: _cfg(tmp_path, "feddyn", *extra), words, run=True)


@pytest.mark.slow  # processes or several runs: in CI's every-file pass, not the plain suite
def test_feddyn_is_the_same_on_one_and_two_processes(tmp_path):
    assert_same_on_one_and_two_processes(tmp_path, "feddyn", "--feddyn.alpha", "0.1")
