"""federation.server_optimizer: FedAvgM and FedAdagrad are torch's SGD-with-momentum and Adagrad on the
pseudo-gradient x_t − x̄_t (independent references); fedavg leaves the aggregate as it is; the moments are
checkpointed so a resumed run takes the same steps; methods whose state is not a mean are refused in one line.
Flower's own outputs: tests/federation/test_server_optimizer_flower.py."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.config import ServerOptimizerConfig
from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError, UsageError
from fl_lightning.federation.policies.server_optimizer import FedAdagrad, FedAvgM, ServerOptimizer
from fl_lightning.federation.run_state import RunState
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.conftest import CONF, StopAfterClients
from tests.tiny_runs import assert_parts_equal, comparison_runs, one_and_two_processes, tiny_config

ROUNDS = 5


def _aggregates(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """A sequence of round aggregates near a drifting point (what clients' means look like)."""
    g = torch.Generator().manual_seed(seed)
    return [
        {"w": torch.randn(3, 4, generator=g) * 0.3 + t * 0.1, "b": torch.randn(4, generator=g), "count": torch.tensor(t)}
        for t in range(ROUNDS)
    ]


def _replay(optimizer: ServerOptimizer, start: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    state, moments, states = dict(start), {}, []
    for t, mean in enumerate(_aggregates()):
        state, moments = optimizer.step(state, mean, moments, t)
        states.append(state)
    return states


def _with_torch(make, start: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """torch.optim on the same state, each round's gradient the pseudo-gradient x_t − x̄_t."""
    params = {k: torch.nn.Parameter(start[k].clone()) for k in ("w", "b")}
    optimizer, states = make(list(params.values())), []
    for mean in _aggregates():
        for k, p in params.items():
            p.grad = p.detach() - mean[k]
        optimizer.step()
        states.append({k: p.detach().clone() for k, p in params.items()})
    return states


def _start() -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(3, 4), "b": torch.ones(4), "count": torch.tensor(0)}


@pytest.mark.parametrize("lr, momentum", [(1.0, 0.0), (0.5, 0.9), (2.0, 0.3)])
def test_fedavgm_is_sgd_with_momentum_on_the_pseudo_gradient(lr, momentum):
    ours = _replay(FedAvgM(lr=lr, momentum=momentum), _start())
    reference = _with_torch(lambda p: torch.optim.SGD(p, lr=lr, momentum=momentum), _start())
    for a, b in zip(ours, reference):
        for k in b:
            torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-6)


def test_fedadagrad_without_first_moment_is_adagrad_on_the_pseudo_gradient():
    ours = _replay(FedAdagrad(lr=0.1, beta_1=0.0, tau=1e-9), _start())
    reference = _with_torch(lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-9), _start())
    for a, b in zip(ours, reference):
        for k in b:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_fedavg_is_the_aggregate_itself_and_non_float_tensors_are_the_aggregates():
    mean = _aggregates()[1]
    state, moments = ServerOptimizer().step(_start(), mean, {}, 0)
    assert all(state[k] is mean[k] for k in mean) and moments == {}
    state, moments = ServerOptimizer.of(ServerOptimizerConfig(name="fedadam")).step(_start(), mean, {}, 0)
    assert state["count"] is mean["count"] and set(moments) == {"m/w", "v/w", "m/b", "v/b"}


def test_fedavgm_with_lr_one_and_no_momentum_is_the_aggregate():
    mean = _aggregates()[2]
    state, _ = FedAvgM(lr=1.0, momentum=0.0).step(_start(), mean, {}, 0)
    for k in ("w", "b"):
        torch.testing.assert_close(state[k], mean[k], rtol=0, atol=1e-6)


def test_unset_values_take_flowers_defaults_and_values_an_optimizer_lacks_are_refused():
    adam = ServerOptimizer.of(ServerOptimizerConfig(name="fedadam"))
    assert (adam.lr, adam.beta_1, adam.beta_2, adam.tau) == (0.1, 0.9, 0.99, 1e-9)
    yogi = ServerOptimizer.of(ServerOptimizerConfig(name="fedyogi", lr=0.05))
    assert (yogi.lr, yogi.beta_1, yogi.beta_2, yogi.tau) == (0.05, 0.9, 0.99, 1e-3)
    with pytest.raises(UsageError, match="fedavgm has no beta_2") as unused:  # each optimizer states its keys
        ServerOptimizer.of(ServerOptimizerConfig(name="fedavgm", beta_2=0.9))
    assert "federation.server_optimizer.beta_2=0.9" in str(unused.value) and "\n" not in str(unused.value)
    with pytest.raises(UsageError, match="did you mean 'fedadam'"):
        ServerOptimizer.of(ServerOptimizerConfig(name="fedadamm"))
    with pytest.raises(ConfigError) as err:
        ServerOptimizerConfig(name="fedadam", beta_1=1.0)
    assert err.value.key == "beta_1"


def test_the_moments_travel_with_the_run_state():
    _, moments = ServerOptimizer.of(ServerOptimizerConfig(name="fedyogi")).step(_start(), _aggregates()[0], {}, 0)
    run = RunState(state=_start(), completed_rounds=1, policies={"server_optimizer": moments})
    back = RunState.from_state_dict(run.state_dict())
    assert back.policies["server_optimizer"].keys() == moments.keys()
    assert all(torch.equal(back.policies["server_optimizer"][k], moments[k]) for k in moments)
    assert "server_optimizer" not in RunState(state=_start()).state_dict()  # fedavg's checkpoints as before


def _cfg(tmp_path, *extra: str):
    fedadam = ("--federation.server_optimizer.name", "fedadam", "--federation.server_optimizer.lr", "0.05")
    return tiny_config(tmp_path, *fedadam, *extra, rounds=3)


def test_fedadam_on_fedavg_resumes_mid_round_to_the_uninterrupted_result(tmp_path):
    full = Simulation(cfg=_cfg(tmp_path / "full"), loggers=[]).run()
    plain = tiny_config(tmp_path / "plain", rounds=3)
    Simulation(cfg=plain, loggers=[]).run()
    cfg = _cfg(tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        Simulation(cfg=cfg, loggers=[], callbacks=[StopAfterClients(10)]).run()  # round 2, 2 of 4 clients done
    saved = safe_load(cfg.run_dir / "checkpoints" / "server.pt")
    assert saved["round"] == 1 and {"m/head.weight", "v/head.weight"} <= set(saved["server_optimizer"])
    resumed = Simulation(cfg=cfg, loggers=[], resume=True).run()
    drop = ("wall_time_s", "world_size")
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    ours, reference = (safe_load(c.run_dir / "checkpoints" / "server.pt") for c in (cfg, _cfg(tmp_path / "full")))
    for k in reference["state"]:
        assert torch.equal(ours["state"][k], reference["state"][k]), k
    for k in reference["server_optimizer"]:
        assert torch.equal(ours["server_optimizer"][k], reference["server_optimizer"][k]), k
    plain_state = safe_load(plain.run_dir / "checkpoints" / "server.pt")["state"]
    assert not torch.equal(plain_state["head.weight"], reference["state"]["head.weight"])  # the step did something


def test_a_method_whose_state_is_not_a_mean_is_refused_in_one_line(tmp_path):
    cfg = load_config(
        CONF / "fedcgs_digits_tiny.yaml", ["--output_dir", str(tmp_path), "--federation.server_optimizer.name", "fedyogi"]
    )
    with pytest.raises(UsageError) as err:
        Simulation(cfg=cfg, loggers=[])
    message = str(err.value)
    assert "federation.server_optimizer.name=fedyogi" in message and "fedcgs" in message and "\n" not in message


def test_fedyogi_with_dp_fedavg_and_client_sampling_is_the_same_on_one_and_two_processes(tmp_path):
    pytest.importorskip("dp_accounting")
    sampling = ("--federation.client_fraction", "0.5")
    fedyogi = ("--federation.server_optimizer.name", "fedyogi", "--federation.server_optimizer.lr", "0.05")
    dp = (
        "--federation.privacy.mechanism",
        "dp_fedavg",
        "--federation.privacy.delta",
        "0.1",
        "--federation.privacy.clip_norm",
        "0.5",
    )
    seeded_noise = ("--federation.privacy.noise_multiplier", "0.5", "--federation.privacy.reproducible_noise", "true")
    one, two = one_and_two_processes(tmp_path, *sampling, *fedyogi, *dp, *seeded_noise, rounds=3, clients=4, samples=400)
    assert_parts_equal(one, two, ("state", "server_optimizer"))


def test_the_tiny_comparison_runs_every_optimizer(tmp_path, capsys):
    states = comparison_runs(tmp_path, capsys, "server_optimizers_tiny.yaml", rounds=2, samples=300)
    assert set(states) == {"fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"}
    assert "server_optimizer" not in states["fedavg"]
    for name in ("fedavgm", "fedadagrad", "fedadam", "fedyogi"):
        assert states[name]["server_optimizer"] and not torch.equal(
            states[name]["state"]["head.weight"], states["fedavg"]["state"]["head.weight"]
        ), name
