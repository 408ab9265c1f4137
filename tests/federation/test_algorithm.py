"""The registry (federation/algorithm.py): names, former names, and the config layer's view of them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import yaml

from fl_lightning.algorithms import available_algorithms
from fl_lightning.config.history import _hint_renamed
from fl_lightning.config.loading import build_config, load_config
from fl_lightning.federation.algorithm import ALGORITHMS, RENAMED, NoConfig, register
from fl_lightning.federation.simulation import Simulation
from tests.conftest import CONF


@dataclass
class _Section:
    pass


class _Named:
    config_class = _Section


def test_a_former_name_is_unique_and_never_a_current_one(monkeypatch):
    available_algorithms()  # the package's methods are registered
    with pytest.raises(ValueError, match="'fedavg_clip' cannot be a former name of 'another': it names 'fedavg_prompts'"):
        register("another", renamed_from=("fedavg_clip",))(type("Another", (_Named,), {}))
    with pytest.raises(ValueError, match="'fedavg' cannot be a former name of 'another': it names 'fedavg'"):
        register("another", renamed_from=("fedavg",))(type("Another", (_Named,), {}))
    with pytest.raises(ValueError, match="it is the former name of 'fedavg_cnn'"):
        register("fedavg_resnet")(type("Another", (_Named,), {}))
    with pytest.raises(ValueError, match="a method name is an identifier"):
        register("ok", renamed_from=("not-a-name",))
    assert RENAMED["fedavg_clip"] == "fedavg_prompts" and RENAMED["fedavg_resnet"] == "fedavg_cnn"
    assert "another" not in ALGORITHMS and "another" not in RENAMED.values()


def test_a_method_named_like_a_core_key_is_refused_by_the_config_layer(monkeypatch):
    """The registry does not import the config, so the core keys are checked where they are known."""
    cls = type("Data", (_Named,), {"config_class": NoConfig})
    monkeypatch.setitem(ALGORITHMS, "data", cls)
    with pytest.raises(ValueError, match="cannot register a method named 'data'"):
        load_config(None)
    monkeypatch.delitem(ALGORITHMS, "data")
    monkeypatch.setitem(RENAMED, "seed", "fedavg")
    with pytest.raises(ValueError, match="cannot register a method named 'seed'"):
        load_config(None)


def test_a_config_written_under_the_former_name_runs(tmp_path, capsys):
    """conf/fedavg_cnn_digits_tiny.yaml as it was before the rename (algorithm: fedavg_resnet, its section under
    that name): the run is the new method's, and the user is told which name to use."""
    values = yaml.safe_load((CONF / "fedavg_cnn_digits_tiny.yaml").read_text())
    values.update(algorithm="fedavg_resnet", fedavg_resnet={"weighted": False}, output_dir=str(tmp_path))
    values["federation"]["rounds"] = 1
    values["logging"] = {"progress": False}
    _hint_renamed.cache_clear()
    cfg = build_config(values)
    assert "method 'fedavg_resnet' is now called 'fedavg_cnn'" in capsys.readouterr().err
    assert cfg.algorithm == "fedavg_cnn" and cfg.method.weighted is False
    summary = Simulation(cfg=cfg, loggers=[]).run()
    assert summary["algorithm"] == "fedavg_cnn" and summary["rounds"] == 1 and 0 <= summary["accuracy"] <= 1
    assert (tmp_path / "fedavg_cnn_digits_a0.5_s0" / "summary.json").is_file()
