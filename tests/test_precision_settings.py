"""Precision through Fabric outside local training, and the CLI's process-wide torch settings.

* Test evaluation (``algorithms/common.py``: ``evaluate_on_test``) runs its forward under the run's autocast:
  under ``32-true`` (a null context) the numbers are the plain call's bit for bit; under ``bf16-mixed`` on the CPU
  the forward sees autocast (bf16 logits) and the accuracy stays near the ``32-true`` one.
* The CLI (``train.py``) applies ``federation.matmul_precision`` on CUDA accelerators only, and
  ``federation.deterministic`` through ``torch.use_deterministic_algorithms``; both are restored after the run,
  and bad values of both keys are one-line config errors.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning import train
from fl_lightning.algorithms.common import evaluate_on_test
from fl_lightning.config import FederationConfig
from fl_lightning.config.loading import load_config
from fl_lightning.errors import ConfigError
from fl_lightning.federation.numerics import torch_numerics
from fl_lightning.modules.evaluation import evaluate_classifier
from tests.conftest import CONF
from tests.tiny_runs import cpu_precision_config

# bf16 keeps 8 mantissa bits: on 100 test images of a random model a handful of arg-maxes near a tie may flip
_BF16_ACCURACY_TOL = 0.05


class _Env:
    """What ``evaluate_on_test`` reads of an Environment: the Fabric, the test split, its loader, the classes."""

    def __init__(self, fabric: Fabric) -> None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(100, 3, 8, 8, generator=g)  # (N, C, H, W)
        y = torch.arange(100) % 5  # every class has test images: no NaN in per_class_accuracy
        self.fabric, self.num_classes = fabric, 5
        self.shared = False  # the engine's flag for a phase every rank is in; one process here
        self.client_test = None  # no clients' own test rows (partition.client_test_fraction 0)
        self.splits = SimpleNamespace(test=TensorDataset(x, y))

    def loader(self, dataset, *, shuffle: bool, seed: int = 0, batch_size: int | None = None) -> DataLoader:
        return DataLoader(dataset, batch_size=batch_size or 32, shuffle=shuffle)


class _Spy(nn.Module):
    """A tiny conv net that records, per forward, whether CPU autocast was on and its logits' dtype."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 5))
        self.seen: list[tuple[bool, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        self.seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
        return out


def _fabric(precision: str) -> Fabric:
    return Fabric(accelerator="cpu", devices=1, precision=precision)


def test_evaluation_under_32_true_is_the_plain_call_bit_for_bit():
    env, model = _Env(_fabric("32-true")), _Spy().eval()
    wrapped = evaluate_on_test(env, model)
    plain = evaluate_classifier(model, env.loader(env.splits.test, shuffle=False), num_classes=5, device=torch.device("cpu"))
    assert wrapped == plain  # floats compared exactly
    assert set(model.seen) == {(False, torch.float32)}


def test_evaluation_under_bf16_mixed_runs_the_forward_in_autocast():
    model = _Spy().eval()
    reference = evaluate_on_test(_Env(_fabric("32-true")), model)
    model.seen.clear()
    mixed = evaluate_on_test(_Env(_fabric("bf16-mixed")), model)
    assert set(model.seen) == {(True, torch.bfloat16)}
    assert abs(mixed["accuracy"] - reference["accuracy"]) <= _BF16_ACCURACY_TOL
    assert math.isclose(mixed["loss"], reference["loss"], rel_tol=2e-2)
    model.seen.clear()  # a caller that places the precision itself
    assert evaluate_on_test(_Env(_fabric("bf16-mixed")), model, autocast=False) == reference
    assert set(model.seen) == {(False, torch.float32)}


def _tiny_config(tmp_path, precision: str, *extra: str, config: str = "fedavg_cnn_digits_tiny.yaml"):
    """By default FedAvg of a whole tiny timm CNN on the digits: its evaluation goes through ``evaluate_on_test`` (the
    head-only ``fedavg`` of fedavg_digits_tiny.yaml evaluates a feature table, ``evaluate_on_test_features``)."""
    return cpu_precision_config(tmp_path, config, precision, "--run_name", precision, *extra)


def _record_autocast(model: nn.Module) -> list[tuple[bool, torch.dtype]]:
    seen: list[tuple[bool, torch.dtype]] = []
    model.register_forward_hook(lambda m, i, out: seen.append((torch.is_autocast_enabled("cpu"), out.dtype)))
    return seen


def test_a_trained_tiny_model_evaluates_under_bf16_mixed_near_its_32_true_accuracy(tmp_path, monkeypatch):
    """The run's own evaluation (32-true, 3 rounds, IID) is the plain call bit for bit; the same final model
    evaluated under bf16-mixed runs its forward in autocast and stays within the tolerance."""
    import dataclasses

    import fl_lightning.algorithms.fedavg_cnn as fedavg_cnn
    from fl_lightning.federation.simulation import Simulation

    calls = []

    def spy(env, logits_fn, **kw):
        calls.append((env, logits_fn))
        return evaluate_on_test(env, logits_fn, **kw)

    monkeypatch.setattr(fedavg_cnn, "evaluate_on_test", spy)
    cfg = _tiny_config(tmp_path, "32-true", "--federation.rounds", "3", "--partition.alpha", "inf")
    summary = Simulation(cfg=cfg, loggers=[]).run()
    env, model = calls[-1]  # the last round's evaluation: the final global model
    plain = evaluate_classifier(
        model, env.loader(env.splits.test, shuffle=False), num_classes=env.num_classes, device=env.fabric.device
    )
    assert summary["accuracy"] == plain["accuracy"] and summary["per_class_accuracy"] == plain["per_class_accuracy"]
    assert plain["accuracy"] > 0.3  # chance: 0.1; a model whose arg-maxes mean something

    seen = _record_autocast(model)
    mixed = evaluate_on_test(dataclasses.replace(env, fabric=_fabric("bf16-mixed")), model)
    assert seen and set(seen) == {(True, torch.bfloat16)}
    print(f"32-true {plain['accuracy']:.4f}, bf16-mixed {mixed['accuracy']:.4f}")
    assert abs(mixed["accuracy"] - plain["accuracy"]) <= _BF16_ACCURACY_TOL, (mixed["accuracy"], plain["accuracy"])


@pytest.mark.parametrize("algorithm", ["fedavg_cnn", "fedavg_prompts"])  # a timm CNN; a prompted open_clip ViT
def test_a_bf16_mixed_run_evaluates_under_autocast(algorithm, tmp_path, monkeypatch):
    """In a real run the environment's Fabric is the run's: under bf16-mixed the evaluation forward sees autocast."""
    import importlib

    from fl_lightning.federation.simulation import Simulation

    seen: list[tuple[bool, torch.dtype]] = []

    def spy(env, model, **kw):
        handle = model.register_forward_hook(lambda m, i, out: seen.append((torch.is_autocast_enabled("cpu"), out.dtype)))
        try:
            return evaluate_on_test(env, model, **kw)
        finally:
            handle.remove()

    monkeypatch.setattr(importlib.import_module(f"fl_lightning.algorithms.{algorithm}"), "evaluate_on_test", spy)
    # no local training (train.epochs 0): only the evaluation's precision is looked at here (bf16 local training
    # of this tiny CNN at lr 0.05 sometimes ends with non-finite weights on the CPU)
    cfg = _tiny_config(
        tmp_path, "bf16-mixed", "--federation.rounds", "1", "--train.epochs", "0", config=f"{algorithm}_digits_tiny.yaml"
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()
    assert seen and set(seen) == {(True, torch.bfloat16)}
    assert 0.0 <= summary["accuracy"] <= 1.0


# ------------------------------------------------------------------------------------------ the CLI's settings
@pytest.fixture
def torch_settings():
    """The process's matmul precision, determinism flags and CUBLAS_WORKSPACE_CONFIG, put back after the test."""
    matmul = torch.get_float32_matmul_precision()
    flags = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
    if workspace is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


def _spy_on(monkeypatch, name: str) -> list[tuple]:
    calls: list[tuple] = []
    real = getattr(torch, name)

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, name, spy)
    return calls


@pytest.mark.parametrize(
    ("accelerator", "cuda", "applied"),
    [
        ("cpu", False, False),
        ("cpu", True, False),
        ("auto", False, False),
        ("auto", True, True),
        ("gpu", True, True),
        ("cuda", True, True),
        ("gpu", False, False),  # "gpu" without CUDA: MPS
        ("mps", True, False),
    ],
)
def test_matmul_precision_is_applied_for_cuda_accelerators_only(accelerator, cuda, applied, monkeypatch, torch_settings):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    calls = _spy_on(monkeypatch, "set_float32_matmul_precision")
    before = torch.get_float32_matmul_precision()
    assert before != "medium"
    with torch_numerics(FederationConfig(accelerator=accelerator, matmul_precision="medium")):
        assert torch.get_float32_matmul_precision() == ("medium" if applied else before)
    assert torch.get_float32_matmul_precision() == before  # restored after the run
    assert calls[:1] == ([(("medium",), {})] if applied else [])
    assert len(calls) == (2 if applied else 0)  # set, then put back; on the CPU never touched


@pytest.mark.parametrize(("matmul", "conv_tf32"), [("high", True), ("medium", True), ("highest", False)])
@pytest.mark.parametrize("cuda", [True, False])
def test_tf32_of_convolutions_follows_matmul_precision_on_cuda_and_is_restored(
    matmul, conv_tf32, cuda, monkeypatch, torch_settings
):
    """TF32 by default on CUDA: float32 matmuls ("high", the default) and cuDNN's convolutions with them; on the CPU
    cuDNN's switch is left as it was."""
    assert FederationConfig().matmul_precision == "high"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = not conv_tf32  # the opposite, to see it change
    try:
        with torch_numerics(FederationConfig(accelerator="auto", matmul_precision=matmul)):
            assert torch.backends.cudnn.allow_tf32 is (conv_tf32 if cuda else not conv_tf32)
        assert torch.backends.cudnn.allow_tf32 is (not conv_tf32)  # restored after the run
    finally:
        torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("deterministic", [True, False])
def test_deterministic_calls_use_deterministic_algorithms(deterministic, monkeypatch, torch_settings):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    calls = _spy_on(monkeypatch, "use_deterministic_algorithms")
    assert not torch.are_deterministic_algorithms_enabled()
    with torch_numerics(FederationConfig(accelerator="cpu", deterministic=deterministic)):
        assert torch.are_deterministic_algorithms_enabled() is deterministic
        assert torch.is_deterministic_algorithms_warn_only_enabled() is False
        assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == (":4096:8" if deterministic else None)
    assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert calls[:1] == ([((True,), {"warn_only": False})] if deterministic else [])


def test_a_workspace_config_of_the_user_is_kept(monkeypatch, torch_settings):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    with torch_numerics(FederationConfig(accelerator="cpu", deterministic=True)):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


class _Stop(Exception):
    pass


def test_the_cli_sets_both_before_the_simulation_is_built_and_restores_them(tmp_path, monkeypatch, torch_settings):
    import fl_lightning.federation.simulation as simulation

    seen = {}

    class FakeSimulation:
        def __init__(self, **kwargs) -> None:
            seen.update(
                matmul=torch.get_float32_matmul_precision(),
                deterministic=torch.are_deterministic_algorithms_enabled(),
                workspace=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            )
            raise _Stop

    monkeypatch.setattr(simulation, "Simulation", FakeSimulation)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # accelerator auto on a "CUDA" machine
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.get_float32_matmul_precision()
    with pytest.raises(_Stop):
        train.main(
            [
                "--config",
                str(CONF / "fedavg_digits_tiny.yaml"),
                "--output_dir",
                str(tmp_path),
                "--logging.progress",
                "false",
                "--federation.matmul_precision",
                "medium",
                "--federation.deterministic",
                "true",
            ]
        )
    assert seen == {"matmul": "medium", "deterministic": True, "workspace": ":4096:8"}
    assert torch.get_float32_matmul_precision() == before and not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_on_the_cpu_a_deterministic_run_is_the_same_run_bit_for_bit(tmp_path, torch_settings):
    """The real CLI, in this process: deterministic true raises nothing on the CPU, gives the same server state
    and leaves the process's flags as they were."""
    from fl_lightning.federation.storage.checkpoint import safe_load

    states = {}
    for deterministic in ("false", "true"):
        assert (
            train.main(
                [
                    "--config",
                    str(CONF / "fedavg_cnn_digits_tiny.yaml"),
                    "--output_dir",
                    str(tmp_path),
                    "--run_name",
                    f"det_{deterministic}",
                    "--logging.progress",
                    "false",
                    "--federation.rounds",
                    "1",
                    "--federation.accelerator",
                    "cpu",
                    "--federation.deterministic",
                    deterministic,
                ]
            )
            == 0
        )
        states[deterministic] = safe_load(tmp_path / f"det_{deterministic}" / "checkpoints" / "server.pt")["state"]
        assert not torch.are_deterministic_algorithms_enabled()
    assert states["true"].keys() == states["false"].keys()
    assert all(torch.equal(states["true"][k], states["false"][k]) for k in states["true"])


def test_a_notebooks_simulation_run_applies_the_keys_too_and_restores_them(tmp_path, monkeypatch, torch_settings):
    """The library applies every key of its config whoever calls it: ``Simulation(cfg).run()`` without the CLI runs
    under ``federation.deterministic`` (and, on CUDA, ``matmul_precision``) and leaves the process as it was."""
    from fl_lightning.federation.simulation import Simulation

    seen = []

    class _Watch:
        def on_round_start(self, **_):
            seen.append((torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")))

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    cfg = load_config(
        CONF / "fedavg_digits_tiny.yaml",
        [
            "--output_dir",
            str(tmp_path),
            "--logging.progress",
            "false",
            "--federation.rounds",
            "1",
            "--federation.deterministic",
            "true",
        ],
    )
    Simulation(cfg=cfg, loggers=[], callbacks=[_Watch()]).run()
    assert seen == [(True, ":4096:8")]
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


@pytest.mark.parametrize(
    ("key", "value"),
    [("matmul_precision", "low"), ("matmul_precision", "HIGH"), ("deterministic", "maybe"), ("deterministic", "1")],
)
def test_bad_values_are_one_line_config_errors(key, value):
    with pytest.raises(ConfigError) as err:
        load_config(CONF / "fedavg_digits_tiny.yaml", [f"--federation.{key}", value])
    message = str(err.value)
    assert f"federation.{key}" in message and "\n" not in message


@pytest.mark.parametrize(("key", "value"), [("matmul_precision", "low"), ("deterministic", "yes")])
def test_the_dataclass_checks_them_too(key, value):
    with pytest.raises(ConfigError, match=key):
        FederationConfig(**{key: value})


def test_bad_values_from_the_cli_are_one_line_exit_2(tmp_path, capsys):
    rc = train.main(
        ["--config", str(CONF / "fedavg_digits_tiny.yaml"), "--output_dir", str(tmp_path), "--federation.matmul_precision", "low"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "federation.matmul_precision='low'" in err, err
