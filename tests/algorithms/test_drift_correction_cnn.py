"""SCAFFOLD and FedDyn of the whole CNN (scaffold_cnn, feddyn_cnn): with zero control variates and η_g = 1
SCAFFOLD's first round is fedavg_cnn's; one client's update is a hand-written loop of K corrected SGD steps on the
tiny ResNet; the server step is the head versions' pure functions on the trainable parameters, with BatchNorm's
buffers averaged as FedAvg; a run killed after the clients' state was written resumes to the uninterrupted result;
what they cannot run is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.algorithms import feddyn, scaffold
from fl_lightning.algorithms.fedavg_cnn import build_timm_classifier
from fl_lightning.config.loading import load_config
from fl_lightning.federation.algorithm import RoundPlan
from fl_lightning.federation.ranks.placement import client_seed
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.federation.storage.client_state import ClientStateStore
from fl_lightning.federation.transport import Download, Upload
from tests.algorithms.client_drift_helpers import StopAtRoundEnd
from tests.conftest import CONF
from tests.run_records import server_state
from tests.tiny_runs import assert_refused_in_one_line, comparison_runs


def _cfg(tmp_path, algorithm, *extra):
    return load_config(
        CONF / "fedavg_cnn_digits_tiny.yaml",
        [
            "--output_dir",
            str(tmp_path),
            "--algorithm",
            algorithm,
            "--logging.progress",
            "false",
            "--partition.num_clients",
            "3",
            "--data.num_samples",
            "240",
            "--train.momentum",
            "0",
            "--federation.rounds",
            "1",
            *extra,
        ],
    )


def _algorithm(cfg):
    sim = Simulation(cfg=cfg, loggers=[])
    sim.fabric.launch()
    return sim._setup()


def _params(model):
    return [k for k, p in model.named_parameters()]


# ------------------------------------------------------------------ round 0 with c = c_i = 0 is FedAvg's


def test_scaffold_cnn_with_zero_control_variates_and_unit_server_lr_is_fedavg_cnn(tmp_path):
    s = _cfg(tmp_path / "s", "scaffold_cnn", "--scaffold_cnn.weighted", "false", "--scaffold_cnn.server_lr", "1")
    f = _cfg(tmp_path / "f", "fedavg_cnn", "--fedavg_cnn.weighted", "false")  # the paper's plain means over S
    Simulation(cfg=s, loggers=[]).run()
    Simulation(cfg=f, loggers=[]).run()
    a, b = server_state(s), server_state(f)
    assert set(a) - set(b) == {"control." + k for k in b if "running" not in k and "num_batches" not in k}
    for k, v in b.items():
        if "running" in k or "num_batches" in k:  # the buffers: FedAvg's fold on the same uploads, bit for bit
            assert torch.equal(a[k], v), k
        else:  # the same clients' weights (c − c_i = 0 adds exact zeros); the server's mean is another float64 sum
            torch.testing.assert_close(a[k], v, rtol=1e-6, atol=1e-8, msg=k)
    params = [k for k in b if "control." + k in a]
    c = torch.cat([a["control." + k].reshape(-1) for k in params])
    store = ClientStateStore(s.run_dir / "checkpoints" / "client_state" / "scaffold_cnn", 3, c.numel())
    mean = np.mean([store.read(i, 1) for i in range(3)], axis=0)  # full participation: c = (1/N) Σ c_i
    assert c.abs().max() > 0 and np.allclose(c.numpy(), mean, atol=1e-6)


# ------------------------------------------------------------------ one client: a hand-written loop


def _reference_fit(cfg, env, weights, correction, round_idx=1, client=0):
    """Plain SGD by hand on the client's batches: θ ← θ − η (∇L(θ) + correction(θ)); returns (state, K)."""
    model = build_timm_classifier(cfg, env.num_classes, seed=cfg.seed)
    model.load_state_dict(weights)
    model.train()
    loader = env.loader(
        env.client(client).dataset, shuffle=True, batch_size=cfg.train.batch_size, seed=client_seed(cfg.seed, round_idx, client)
    )
    steps = 0
    for _ in range(cfg.train.epochs):
        for images, labels in loader:
            params = dict(model.named_parameters())
            grads = torch.autograd.grad(F.cross_entropy(model(images), labels), list(params.values()))
            with torch.no_grad():
                for (name, p), g in zip(params.items(), grads):
                    p -= cfg.train.lr * (g + correction(name, p))
            steps += 1
    return {k: v.detach() for k, v in model.state_dict().items()}, steps


def _random_like(tensors, keys, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(tensors[k].shape, generator=g) * scale for k in keys}


def test_a_scaffold_cnn_client_is_k_corrected_sgd_steps(tmp_path):
    cfg = _cfg(tmp_path, "scaffold_cnn", "--train.epochs", "2")
    algorithm, env = _algorithm(cfg)
    x = algorithm.initial_state()
    params = _params(algorithm.module.model)
    c, c_i = _random_like(x, params, 0.5, 1), _random_like(x, params, 0.5, 2)
    algorithm.client_state.write({0: torch.cat([c_i[k].reshape(-1) for k in params]).numpy()}, 0)  # c_i as of round 1
    download = {**x, **{"control." + k: c[k] for k in params}}
    upload = algorithm.client_update(1, env.client(0), Download(download))

    weights = {k: x[k] for k in algorithm._initial}
    y, steps = _reference_fit(cfg, env, weights, lambda name, p: c[name] - c_i[name])
    assert upload.meta["local_steps"] == steps > 0
    for k, v in y.items():  # parameters and BatchNorm buffers
        torch.testing.assert_close(upload.tensors[k], v, rtol=1e-4, atol=5e-5, msg=k)
    for k in params:  # option II by hand: Δc_i = c_i⁺ − c_i = −c + (x − y)/(K η_l)
        delta = -c[k] + (x[k] - y[k]) / (steps * cfg.train.lr)
        torch.testing.assert_close(upload.tensors["delta_control." + k], delta, rtol=1e-4, atol=1e-4, msg=k)
    assert not any(k.startswith("delta_control.") and "running" in k for k in upload.tensors)  # no buffer variates


def test_a_feddyn_cnn_client_is_k_regularised_sgd_steps(tmp_path):
    cfg = _cfg(tmp_path, "feddyn_cnn", "--feddyn_cnn.alpha", "0.5")
    algorithm, env = _algorithm(cfg)
    state = algorithm.initial_state()
    params = _params(algorithm.module.model)
    cloud = {k: state[k] + v for k, v in _random_like(state, params, 0.05, 1).items()}
    h = _random_like(state, params, 0.5, 2)
    algorithm.client_state.write({0: torch.cat([h[k].reshape(-1) for k in params]).numpy()}, 0)
    download = {k: cloud.get(k, state[k]) for k in algorithm._initial}
    upload = algorithm.client_update(1, env.client(0), Download(download))

    sizes = np.array([len(p) for p in env.partition], dtype=np.float64)
    alpha = 0.5 / (sizes[0] / sizes.mean())  # the authors' adaptive α_k
    y, steps = _reference_fit(cfg, env, download, lambda name, p: alpha * (p - cloud[name] + h[name]))
    assert steps > 0
    for k, v in y.items():
        torch.testing.assert_close(upload.tensors[k], v, rtol=1e-4, atol=5e-5, msg=k)
    assert set(upload.tensors) == set(algorithm._initial)  # FedAvg's upload


# ------------------------------------------------------------------ the server: the pure functions, FedAvg's buffers


def _uploads(algorithm, state, prefixes, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, n in ((0, 30), (2, 50)):
        tensors = {}
        for k, v in algorithm._initial.items():
            tensors[k] = (v + torch.randn(v.shape, generator=g)) if v.is_floating_point() else v + 3 * (i + 1)
        for p in prefixes:
            tensors.update({p + k: torch.randn(state[k].shape, generator=g) for k in algorithm._params})
        out[i] = Upload(tensors, {"num_samples": n})
    return out


def _flat(tensors, keys, prefix=""):
    return torch.cat([tensors[prefix + k].reshape(-1) for k in keys])


def _fedavg_buffers(algorithm, uploads, weighted):
    w = {i: (u.meta["num_samples"] if weighted else 1.0) for i, u in uploads.items()}
    out = {}
    for k in algorithm._buffers:
        mean = sum(w[i] * u.tensors[k].double() for i, u in uploads.items()) / sum(w.values())
        dtype = algorithm._initial[k].dtype
        out[k] = mean.to(dtype) if dtype.is_floating_point else mean.round().to(dtype)
    return out


@pytest.mark.parametrize("weighted", [False, True])
def test_the_scaffold_cnn_server_step_is_the_pure_function_and_buffers_are_fedavgs(tmp_path, weighted):
    cfg = _cfg(tmp_path, "scaffold_cnn", "--scaffold_cnn.server_lr", "0.7", "--scaffold_cnn.weighted", str(weighted).lower())
    algorithm, env = _algorithm(cfg)
    state = algorithm.initial_state()
    keys = algorithm._params
    state.update({"control." + k: v for k, v in _random_like(state, keys, 1.0, 5).items()})
    uploads = _uploads(algorithm, state, ("delta_control.",))
    new = algorithm.aggregate(0, state, uploads, {}, RoundPlan({}))
    x, c = scaffold.server_step(
        _flat(state, keys),
        _flat(state, keys, "control."),
        [_flat(u.tensors, keys) for u in uploads.values()],
        [_flat(u.tensors, keys, "delta_control.") for u in uploads.values()],
        3,
        0.7,
        [30.0, 50.0] if weighted else None,
    )
    assert torch.equal(_flat(new, keys), x) and torch.equal(_flat(new, keys, "control."), c)
    for k, v in _fedavg_buffers(algorithm, uploads, weighted).items():
        torch.testing.assert_close(new[k], v, rtol=1e-6, atol=0, msg=k)
    assert list(new)[: len(algorithm._initial)] == list(algorithm._initial)  # the model's key order
    for i, u in uploads.items():  # c_i⁺ = c_i + Δc_i kept for each client of the round
        kept = algorithm.client_state.read(i, 1)
        assert np.allclose(kept, _flat(u.tensors, keys, "delta_control.").numpy())
    assert not algorithm.client_state.read(1, 1).any()


def test_the_feddyn_cnn_server_step_is_the_pure_function_and_buffers_are_fedavgs(tmp_path):
    cfg = _cfg(tmp_path, "feddyn_cnn")
    algorithm, env = _algorithm(cfg)
    state = algorithm.initial_state()
    keys = algorithm._params
    state.update({"drift_sum." + k: v for k, v in _random_like(state, keys, 1.0, 5).items()})
    state.update({"cloud." + k: v for k, v in _random_like(state, keys, 1.0, 6).items()})
    uploads = _uploads(algorithm, state, ())
    new = algorithm.aggregate(0, state, uploads, {}, RoundPlan({}))
    cloud = _flat(state, keys, "cloud.")
    avg, total, new_cloud = feddyn.server_step(
        cloud, _flat(state, keys, "drift_sum."), [_flat(u.tensors, keys) for u in uploads.values()], 3
    )
    assert torch.equal(_flat(new, keys), avg) and torch.equal(_flat(new, keys, "drift_sum."), total)
    assert torch.equal(_flat(new, keys, "cloud."), new_cloud)
    for k, v in _fedavg_buffers(algorithm, uploads, weighted=True).items():
        torch.testing.assert_close(new[k], v, rtol=1e-6, atol=0, msg=k)
    for i, u in uploads.items():  # h_k ← h_k + θ_k − θ_cloud
        assert np.allclose(algorithm.client_state.read(i, 1), (_flat(u.tensors, keys) - cloud).numpy(), atol=1e-6)
    plan = algorithm.plan(1, [0], new, None)  # the download: θ_cloud's parameters and the averaged buffers
    assert torch.equal(_flat(plan.downloads[0].tensors, keys), new_cloud)
    assert all(torch.equal(plan.downloads[0].tensors[k], new[k]) for k in algorithm._buffers)


# ------------------------------------------------------------------ resume, refusals


@pytest.mark.slow  # processes or several runs: in CI's every-file pass, not the plain suite
@pytest.mark.parametrize("algorithm", ["scaffold_cnn", "feddyn_cnn"])
def test_a_run_killed_after_the_clients_state_was_written_resumes_to_the_uninterrupted_result(tmp_path, algorithm):
    extra = ("--federation.rounds", "4", "--federation.client_fraction", "0.5", "--partition.num_clients", "4")
    full = _cfg(tmp_path / "full", algorithm, *extra)
    Simulation(cfg=full, loggers=[]).run()
    cut = _cfg(tmp_path / "cut", algorithm, *extra)
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cut, loggers=[], callbacks=[StopAtRoundEnd(2)]).run()
    assert safe_load(cut.run_dir / "checkpoints" / "server.pt")["round"] == 1  # round 2 wrote the clients' state only
    Simulation(cfg=cut, loggers=[], resume=True).run()
    a, b = server_state(full), server_state(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("algorithm", "extra", "words"),
    [
        ("scaffold_cnn", ["--train.optimizer", "adamw"], "scaffold_cnn needs train.optimizer: sgd"),
        ("scaffold_cnn", ["--federation.server_optimizer.name", "fedadam"], "needs a method whose state is the mean"),
        ("feddyn_cnn", ["--federation.privacy.mechanism", "dp_fedavg", "--federation.privacy.epsilon", "4"], "accumulated drift"),
    ],
)
def test_what_they_cannot_run_is_one_line(tmp_path, algorithm, extra, words):
    assert_refused_in_one_line(lambda: _cfg(tmp_path, algorithm, *extra), words, run=True)


@pytest.mark.slow  # processes or several runs: in CI's every-file pass, not the plain suite
def test_the_tiny_whole_model_comparison_runs_each_method(tmp_path, capsys):
    runs = comparison_runs(tmp_path, capsys, "client_drift_cnn_tiny.yaml", "--train.epochs", "1", rounds=2, samples=200)
    states = {name: saved["state"] for name, saved in runs.items()}
    assert set(states) == {"fedavg_cnn", "scaffold_cnn", "feddyn_cnn"}
    assert "control.conv1.weight" in states["scaffold_cnn"] and "control.bn1.running_mean" not in states["scaffold_cnn"]
    assert {"cloud.fc.weight", "drift_sum.fc.weight"} <= set(states["feddyn_cnn"])
    for name in ("scaffold_cnn", "feddyn_cnn"):
        assert (tmp_path / name / "checkpoints" / "client_state" / name / "values.npy").is_file()
