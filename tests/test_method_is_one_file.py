"""The one rule of extension (docs/architecture.md): a new method is one file, with its own config section.

The throwaway method below lives entirely in this test file — its config dataclass, its class, its
registration — and runs through the real command-line entry (``fl_lightning.train.main``), with
``--toy_prior.<key>`` overrides, a did-you-mean on a typo and ``--print-config``. No package file
knows it. It is a real (if weak) method: clients upload their label counts, the server predicts the
smoothed global label prior; its accuracy is therefore the test share of the training majority class.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from fl_lightning import train
from fl_lightning.algorithms import available_algorithms, import_errors
from fl_lightning.algorithms.common import evaluate_on_test
from fl_lightning.config.loading import load_config, schema_keys
from fl_lightning.data.registry import build_dataset
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import Algorithm, Client, RoundPlan, State, register
from fl_lightning.federation.transport import Download, Upload
from tests.conftest import REPO


@dataclass
class ToyPriorConfig:
    smoothing: float = 1.0  # Laplace smoothing of the label counts

    def __post_init__(self) -> None:
        check(self.smoothing >= 0, "smoothing", self.smoothing, "a float >= 0")


@register("toy_prior")
class ToyPrior(Algorithm):
    """Clients upload label counts; the server's classifier is the smoothed global prior (one round)."""

    config_class = ToyPriorConfig

    @property
    def num_rounds(self) -> int:
        return 1

    def initial_state(self) -> State:
        return {"counts": torch.zeros(self.env.num_classes if self.env else 0, dtype=torch.float64)}

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        return Upload({"counts": torch.as_tensor(client.class_counts, dtype=torch.float64)}, {"num_samples": client.num_samples})

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        total = sum(u.tensors["counts"] for u in uploads.values())
        return {"counts": total + self.config.smoothing}

    def evaluate(self, state: State) -> dict:
        log_prior = torch.log(state["counts"] / state["counts"].sum()).float()
        return evaluate_on_test(self.env, lambda images: log_prior.expand(images.shape[0], -1))


TINY = [
    "--config",
    str(REPO / "conf" / "fedavg_digits_tiny.yaml"),
    "--algorithm",
    "toy_prior",
    "--logging.progress",
    "false",
    "--partition.num_clients",
    "3",
]


def test_a_method_defined_in_a_test_file_runs_through_the_cli(tmp_path, capsys):
    assert train.main([*TINY, "--toy_prior.smoothing", "0.5", "--output_dir", str(tmp_path)]) == 0
    run = tmp_path / "toy_prior_digits_a0.5_s0"
    summary = json.loads((run / "summary.json").read_text())
    splits = build_dataset("digits", root="data", seed=0)
    majority = np.bincount(splits.train_targets).argmax()
    test_targets = np.array([int(y) for _, y in splits.test])
    assert summary["accuracy"] == pytest.approx(float(np.mean(test_targets == majority)), abs=1e-6)
    # its section is in the resolved config, and the other methods' sections are not
    resolved = load_config(run / "config.yaml")
    assert resolved.algorithm == "toy_prior" and resolved.method == ToyPriorConfig(smoothing=0.5)
    assert "fedopal" not in (run / "config.yaml").read_text()


def test_its_section_is_strict_and_printed(capsys):
    assert train.main([*TINY, "--toy_prior.smothing", "2"]) == 2
    assert "did you mean 'toy_prior.smoothing'" in capsys.readouterr().err
    assert train.main([*TINY, "--toy_prior.smoothing", "-1"]) == 2
    assert "toy_prior.smoothing=-1.0 is not allowed; expected a float >= 0" in capsys.readouterr().err
    assert train.main([*TINY, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith("toy_prior:\n  smoothing: 1.0")


def test_every_method_module_imports_and_declares_a_dataclass_section():
    assert import_errors() == {}
    for name, cls in available_algorithms().items():
        assert cls.name == name
        cls.config_class()  # defaults are valid


# ----------------------------------------------------------------- ConfigError keys are real keys


def _config_error_keys() -> list[tuple[str, str, str | None]]:
    """Every literal key the package passes to ``ConfigError(...)`` or ``check(...)``: (file:line, key, class).

    ``check``/``_check`` inside a config dataclass's ``__post_init__`` name a field of that dataclass (the
    loader adds the section); ``ConfigError(...)`` anywhere must name a full dotted key.
    """
    found = []
    for path in sorted((REPO / "fl_lightning").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node) == "ConfigError" and _literal(node, 0):
                found.append((f"{path.name}:{node.lineno}", node.args[0].value, None))
            if isinstance(node, ast.ClassDef):
                for call in ast.walk(node):
                    if isinstance(call, ast.Call) and _name(call) in ("check", "_check") and _literal(call, 1):
                        found.append((f"{path.name}:{call.lineno}", call.args[1].value, node.name))
    return found


def _literal(call: ast.Call, i: int) -> bool:
    return len(call.args) > i and isinstance(call.args[i], ast.Constant) and isinstance(call.args[i].value, str)


def _name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _fields_by_class() -> dict[str, set[str]]:
    import dataclasses
    import typing

    from fl_lightning.config import RunConfig

    out: dict[str, set[str]] = {}

    def visit(cls: type) -> None:
        out[cls.__name__] = {f.name for f in dataclasses.fields(cls)}
        for tp in typing.get_type_hints(cls).values():
            if dataclasses.is_dataclass(tp):
                visit(tp)
        for base in cls.__mro__[1:]:  # a section composed of its stages' configs (federation/stages.py)
            if dataclasses.is_dataclass(base):
                visit(base)

    visit(RunConfig)
    for algorithm in available_algorithms().values():
        visit(algorithm.config_class)
    return out


def test_every_config_error_names_a_real_key():
    keys = set(schema_keys())
    fields = _fields_by_class()
    bad = []
    for where, key, cls in _config_error_keys():
        if cls is None:
            real = key in keys or any(k.startswith(key + ".") for k in keys)
        else:
            real = cls in fields and key.split(".")[0] in fields[cls]
        if not real:
            bad.append(f"{where}: {key!r}" + (f" (in {cls})" if cls else ""))
    assert not bad, "ConfigError keys that no config has: " + ", ".join(bad)
    assert len(_config_error_keys()) > 40  # the walk sees the package's checks


def test_pure_layers_never_raise_config_errors():
    pure = ["analytic.py", "systems", "synthesis", "models", "data/partition.py", "modules"]
    offenders = []
    for part in pure:
        base = REPO / "fl_lightning" / part
        for path in [base] if base.is_file() else sorted(base.rglob("*.py")):
            if "ConfigError" in path.read_text():
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"pure code raises ConfigError: {offenders}"
