"""Tests for fl_lightning.federation.stages: round t goes to the stage that owns it; sections are composed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from fl_lightning.config import RunConfig
from fl_lightning.errors import check
from fl_lightning.federation.stages import Stage, StageConfig, StagedAlgorithm
from fl_lightning.federation.transport import Download, Upload


@dataclass
class _AConfig(StageConfig):
    a: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.a >= 0, "a", self.a, "an int >= 0")


@dataclass
class _BConfig(StageConfig):
    b: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.b >= 0, "b", self.b, "an int >= 0")


class _Stage(Stage):
    tag = ""
    length = 1

    def rounds(self) -> int:
        return self.length

    def initial_state(self):
        return {f"{self.tag}.init": torch.tensor(self.first_round)}

    def client_update(self, round_idx, client, download):
        return Upload({"who": torch.tensor(ord(self.tag))})

    def aggregate(self, round_idx, state, uploads, failures, plan):
        return {**state, "last": torch.tensor(ord(self.tag) * 100 + round_idx)}

    def summary_extras(self, state):
        return {self.tag: self.first_round}


class _Init(_Stage):
    config_class, tag, length = _AConfig, "i", 0


class _First(_Stage):
    config_class, tag, length = _AConfig, "f", 2


class _Second(_Stage):
    config_class, tag, length = _BConfig, "s", 3


@dataclass
class _Composed(_AConfig, _BConfig):
    pass


class _Method(StagedAlgorithm):
    config_class = _Composed
    stages = (_Init, _First, _Second)

    def evaluate(self, state):
        return {"accuracy": 0.0}


def _method(**section) -> _Method:
    cfg = RunConfig()
    cfg.method = _Composed(**section)
    return _Method(cfg=cfg)


def test_each_round_goes_to_the_stage_that_owns_it():
    m = _method()
    assert m.num_rounds == 5 and [s.first_round for s in m.parts] == [0, 0, 2]
    owners = [type(m.stage_of(t)).__name__ for t in range(5)]
    assert owners == ["_First", "_First", "_Second", "_Second", "_Second"]  # the 0-round stage owns none
    state = m.initial_state()
    assert sorted(state) == ["f.init", "i.init", "s.init"]
    for t in range(5):
        assert int(m.client_update(t, None, Download()).tensors["who"]) == ord("fs"[t >= 2])
        state = m.aggregate(t, state, {}, {}, m.plan(t, [0], state, None))
        assert int(state["last"]) == ord("fs"[t >= 2]) * 100 + t
    assert m.summary_extras(state) == {"i": 0, "f": 0, "s": 2}
    with pytest.raises(IndexError, match="beyond"):
        m.stage_of(5)


def test_a_composed_section_runs_every_stage_check():
    from fl_lightning.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        _Composed(a=1, b=-1)
    assert err.value.key == "b"
    with pytest.raises(ConfigError) as err:
        _Composed(a=-1, b=1)
    assert err.value.key == "a"


def test_a_section_that_lacks_a_stage_config_is_refused():
    class _Broken(_Method):
        config_class = _AConfig

    cfg = RunConfig()
    cfg.method = _AConfig()
    with pytest.raises(TypeError, match="must extend _Second's _BConfig"):
        _Broken(cfg=cfg)
